"""Every input cardinality is bounded: invented tool names and trajectories do not grow memory.

The CI-sized soak (bench/soak.py at 14,000 names / 6,000 trajectories; the
full million is ``python -m kvtier.bench.soak``) plus the caps one by one.
"""
from __future__ import annotations

import threading

import pytest

from kvtier.bench.soak import run
from kvtier.tiering.model.decision import Action, Decision, PauseContext
from kvtier.tiering.lifecycle.bounded_work import BoundedWork
from kvtier.tiering.lifecycle.service_policy import ServicePolicy
from kvtier.tiering.forecasting.predictor import PredictorConfig, ToolWaitPredictor

pytestmark = pytest.mark.faults


def test_soak_counts_stay_under_their_caps_and_rss_is_flat(tmp_path):
    out = run(tools=14_000, trajectories=6_000, root=tmp_path, warmup=7_000)
    print(out)
    assert out["predictor_nodes"] <= 2048 + 2
    assert out["predictor_folded"] >= 14_000 - 2048 - 1
    assert out["lifecycle_trajectories"] <= 2_000 + 256 + 1     # max_trajectories, pruned every tick
    assert out["service_policy"]["cached"] <= 4096
    assert out["service_policy"]["work_queued"] <= 256
    assert out["service_tools"] <= 4096
    assert out["rss_growth_mib"] < 50, out          # the second 7,000 names add (almost) nothing
    assert out["rss_end_mib"] - out["rss_start_mib"] < 200, out


def test_predictor_folds_the_least_recently_seen_into_the_class_prior(tmp_path):
    p = ToolWaitPredictor(tmp_path / "pred", config=PredictorConfig(max_nodes=3))
    p.observe("pytest", 2.0)
    for i in range(10):
        p.observe(f"tool-{i}", 5.0, features={"cmd": "x"})
        p.observe("pytest", 2.0)                    # kept: seen again and again
    assert len(p) <= 3 + 2 and p.folded >= 17
    assert "pytest" in p.tools()
    assert p.forecast("tool-0").source in ("global", "prior")   # folded: forecast from its root
    assert p.forecast("tool-0").n == p.forecast("never-seen").n
    p.close()
    # the disk holds no more than memory: a reopen is bounded too
    q = ToolWaitPredictor(tmp_path / "pred", config=PredictorConfig(max_nodes=3))
    assert len(q) <= 3 + 2
    q.close()


class _SlowClient:
    def __init__(self):
        self.gate = threading.Event()
        self.decides = self.observes = 0

    def decide(self, tool, tokens, model):
        self.gate.wait(5)
        self.decides += 1
        return type("A", (), {"decision": Decision(Action.RETAIN)})()

    def observe(self, tool, wait_s, features=None):
        self.gate.wait(5)
        self.observes += 1


def test_service_policy_work_is_bounded_against_a_slow_service():
    from kvtier.tiering import make_policy
    from kvtier.tiering.model.presets import DEFAULT_NODE, get_node, get_preset
    local = make_policy("breakeven", geometry=get_preset("qwen3-0.6b"), hardware=get_node(DEFAULT_NODE))
    client = _SlowClient()
    pol = ServicePolicy("http://127.0.0.1:9", "qwen3-0.6b", local=local, client=client, max_jobs=64)
    try:
        for i in range(20_000):                     # a service that does not keep up
            pol.decide(PauseContext(tool=f"t{i}", context_tokens=1024, kv_bytes=1 << 20))
            pol.observe(f"t{i % 20}", 1.0)
        s = pol.stats()
        assert s["work_queued"] <= 64
        assert s["work_dropped"] > 0 and s["work_coalesced"] > 0
        assert s["work_submitted"] >= 20_000
    finally:
        client.gate.set()
        pol.close()


def test_bounded_work_coalesces_and_drops_oldest_counted():
    gate = threading.Event()
    seen = []
    dropped = []
    w = BoundedWork("t", max_jobs=2, per_key=2, on_drop=dropped.append)
    w.submit("block", lambda items: gate.wait(5))   # occupies the worker
    import time
    deadline = time.monotonic() + 5
    while w.queued() and time.monotonic() < deadline:
        time.sleep(0.01)
    for k, v in [("a", 1), ("a", 2), ("a", 3), ("b", 1), ("c", 1)]:
        w.submit(k, seen.append, v)
    s = w.stats()
    assert s["queued"] == 2 and dropped == ["a"]     # "a" was oldest when "c" came
    assert s["coalesced"] == 2 and s["dropped"] == 1 + 2   # one item of a's batch, then a's two
    gate.set()
    deadline = time.monotonic() + 5
    while w.queued() and time.monotonic() < deadline:
        time.sleep(0.01)
    w.close(timeout=2)
    assert [1] in seen and len(seen) == 2
