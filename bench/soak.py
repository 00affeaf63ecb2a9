"""Soak: invented tool names and trajectories through the engine-side path and the service; RSS must stay flat.

What runs (public APIs, one process)::

    ServicePolicy(local=breakeven(ToolWaitPredictor))   decide + observe per name
      └─ its client: an in-process stand-in answering at once (the bound under test is
         ServicePolicy's own queue and cache, not HTTP)
    LifecycleController(real TieredStore, ForecastSchedule(policy))
                                                        hint, plan_for, pause, resume, tick
    ServiceState(data_dir)                              observe, pause, resume per name

Every name is new (``tool-<i>``), every trajectory too (``traj-<i>``): the
worst case for anything keyed by what a client sends.  RSS (``/proc/self/status``
VmRSS) is read after a warm-up and at the end.

    python -m kvtier.bench.soak --tools 1000000 --trajectories 100000 --json
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


class _InstantClient:
    """The service client stand-in: answers decide/observe at once."""

    def __init__(self, decision) -> None:
        self._ans = type("Ans", (), {"decision": decision})()
        self.observed = 0

    def decide(self, tool, tokens, model):
        return self._ans

    def observe(self, tool, wait_s, features=None):
        self.observed += 1


def run(tools: int, trajectories: int, root: Path, warmup: int = 20_000) -> dict:
    from kvtier.store import StoreConfig, TieredStore
    from kvtier.tiering import make_policy
    from kvtier.tiering.model.decision import Action, Decision, PauseContext
    from kvtier.tiering.lifecycle import ForecastSchedule, LifecycleController, ManualClock
    from kvtier.tiering.lifecycle.pruning import Pruner
    from kvtier.tiering.lifecycle.service_policy import ServicePolicy
    from kvtier.tiering.forecasting.predictor import ToolWaitPredictor
    from kvtier.tiering.model.presets import DEFAULT_NODE, get_node, get_preset
    from kvtier.tiering.service.state import ServiceError, ServiceState, StateConfig

    geo, hw = get_preset("qwen3-0.6b"), get_node(DEFAULT_NODE)
    predictor = ToolWaitPredictor()
    local = make_policy("breakeven", geometry=geo, hardware=hw, predictor=predictor)
    policy = ServicePolicy("http://127.0.0.1:9", "qwen3-0.6b", local=local,
                           client=_InstantClient(Decision(Action.RETAIN)))
    block = 4096
    store = TieredStore.open(StoreConfig(root=root / "store", host_bytes=64 * block, nvme_bytes=256 * block,
                                         block_bytes=block, io_engine="threads", pin_host="off"))
    clock = ManualClock()
    ctl = LifecycleController(store, ForecastSchedule(policy), clock=clock, block_bytes=block,
                              pruner=Pruner(forget_after_s=30.0, max_trajectories=2_000, every_s=1.0))
    (root / "svc").mkdir(parents=True, exist_ok=True)
    svc = ServiceState(StateConfig(data_dir=root / "svc"))
    refused = 0
    rss_start = rss_mib()              # everything built and imported, nothing sent yet
    t0 = time.monotonic()
    rss0 = None
    try:
        n = max(tools, trajectories)
        for i in range(n):
            if i == warmup:
                rss0 = rss_mib()
            tool = f"tool-{i}"
            if i < tools:
                ctx = PauseContext(tool=tool, context_tokens=512 + i % 4096, kv_bytes=(512 + i % 4096) * 114688)
                policy.decide(ctx)
                policy.observe(tool, 0.05 + (i % 97) / 10)
                try:
                    svc.observe(tool, 0.05 + (i % 89) / 10)
                except ServiceError:
                    refused += 1               # the service's own cap on distinct tools
            if i < trajectories:
                tid = f"traj-{i}"
                ctl.hint(tid, tool)
                ctl.plan_for(tid, context_tokens=256)
                ctl.pause(tid, [], tier=None)
                clock.advance(0.01)
                ctl.resume(tid, wait_s=0.01)
                try:
                    svc.pause(tid, tool)
                    svc.resume(tid, wait_s=0.5)
                except ServiceError:
                    refused += 1
                if i % 256 == 0:
                    ctl.tick()
        if rss0 is None:
            rss0 = rss_mib()
        rss1 = rss_mib()
        return {"tools": tools, "trajectories": trajectories, "rss_start_mib": round(rss_start, 1),
                "rss_warm_mib": round(rss0, 1),
                "rss_end_mib": round(rss1, 1), "rss_growth_mib": round(rss1 - rss0, 1),
                "seconds": round(time.monotonic() - t0, 1),
                "predictor_nodes": len(predictor), "predictor_folded": predictor.folded,
                "lifecycle_trajectories": ctl.stats().get("trajectories", None),
                "service_policy": {k: v for k, v in policy.stats().items() if isinstance(v, int)},
                "service_refused": refused, "service_tools": svc.stats().get("tools"),
                "service_tools_folded": svc.stats().get("tools_folded")}
    finally:
        policy.close()
        svc.close()
        store.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tools", type=int, default=1_000_000)
    ap.add_argument("--trajectories", type=int, default=100_000)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="kvtier-soak-") as d:
        out = run(a.tools, a.trajectories, Path(d))
    print(json.dumps(out, indent=None if a.json else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
