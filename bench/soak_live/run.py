"""The soak: start the rig, run the agents, the fault plan and the sampler together, return a
JSON-able document (:func:`run_soak`).

Per fault: when it was injected and recovered, what it did, and ``recovery_s``: the seconds from
its ``recover`` to the first probe request (a fixed prompt under its own salt, sent every 0.5 s)
whose output equals the probe's first answer, taken before any fault; None (never recovered)
after ``recover_timeout_s``.  An engine exit that no fault caused is a crash: recorded with its
exit code and log tail, and the engine is restarted so that the soak goes on.
"""
from __future__ import annotations

import random
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from kvtier.bench.live.cluster import ClusterError, ClusterSpec, _tail
from kvtier.bench.live.http_engine import HttpEngine, ServerError
from kvtier.bench.live.server_metrics import PREFIX, samples
from kvtier.bench.live.workload import token_ids
from kvtier.bench.soak_live.agents import Agents
from kvtier.bench.soak_live.faults import FaultError, fault_kinds
from kvtier.bench.soak_live.rig import Rig, proc_stats
from kvtier.bench.soak_live.schedule import describe, plan


@dataclass(frozen=True)
class SoakOptions:
    model: str
    workdir: Path
    minutes: float = 8.0
    seed: int = 0
    kinds: Sequence[str] | None = None     # None: every kind
    engine_blocks: int = 24                # the engine's cache, in 32-token blocks
    max_context: int = 640
    concurrent: int = 6
    vocab: int = 256
    warmup_s: float = 30.0
    hold_s: float = 5.0
    spacing_s: float = 40.0
    sample_s: float = 5.0
    recover_timeout_s: float = 180.0
    kvtier: dict = field(default_factory=lambda: {"nvme_gb": 0.05, "host_gb": 0.002, "remote_write": "through"})


class _Probe:
    def __init__(self, url: str, seed: int, vocab: int) -> None:
        self.url, self.prompt = url, token_ids(seed, "probe", 0, 96, vocab)
        self.expected: tuple[int, ...] | None = None

    def once(self) -> bool:
        try:
            out = tuple(HttpEngine(self.url, timeout_s=30, cache_salt="soak-probe").generate(
                self.prompt, max_tokens=4, kv_transfer_params={"kvtier": {"tool": "probe",
                                                                          "trajectory_id": "probe"}}).tokens)
        except ServerError:
            return False
        if self.expected is None:
            self.expected = out
        return out == self.expected


def _kvtier_samples(url: str) -> dict[str, float]:
    try:
        text = HttpEngine(url, timeout_s=10).metrics_text() or ""
    except ServerError:
        return {}
    out: dict[str, float] = {}
    for name, labels, value in samples(text):
        if name.startswith(PREFIX):
            keep = ",".join(f"{k}={v}" for k, v in sorted(labels.items()) if k not in ("engine", "model_name"))
            key = name[len("vllm:"):] + (f"{{{keep}}}" if keep else "")
            out[key] = out.get(key, 0.0) + value
    return out


def run_soak(o: SoakOptions, progress: Callable[[str], None] = print) -> dict[str, Any]:
    """Raises ClusterError when the rig does not start, ValueError for an unknown kind."""
    spec = ClusterSpec(model=o.model, workdir=Path(o.workdir), engines=1, engine_blocks=o.engine_blocks,
                       max_model_len=o.max_context + 64, kvtier=dict(o.kvtier))
    faults = fault_kinds(spec.context_tokens, o.vocab)
    kinds = list(o.kinds) if o.kinds else list(faults)
    unknown = [k for k in kinds if k not in faults]
    if unknown:
        raise ValueError(f"unknown fault kind {unknown[0]!r}; known: {', '.join(faults)}")
    schedule = plan(seed=o.seed, minutes=o.minutes, kinds=kinds, warmup_s=o.warmup_s, hold_s=o.hold_s,
                    spacing_s=o.spacing_s)
    progress(describe(schedule, o.seed))
    rig = Rig(spec, progress)
    stop, stopping = threading.Event(), threading.Event()
    events: list[dict] = []
    crashes: list[dict] = []
    series: list[dict] = []
    lives: dict[int, dict[str, float]] = {}
    try:
        rig.start_redis()
        rig.start_engine()
        probe = _Probe(rig.url, o.seed, o.vocab)
        if not probe.once():
            raise RuntimeError("the probe request failed on a fresh engine")
        t0 = time.monotonic()
        agents = Agents(rig.url, seed=o.seed, vocab=o.vocab, max_context=o.max_context, concurrent=o.concurrent,
                        engine_stopping=stopping, t0=t0)

        def check_crash() -> None:
            if not rig.engine_alive() and not stopping.is_set():
                crashes.append({"t_s": round(time.monotonic() - t0, 1), "returncode": rig.engine.returncode,
                                "log_tail": _tail(rig.engine_log, 2000)})
                progress(f"CRASH: the engine exited with {rig.engine.returncode}; restarting it")
                rig.start_engine()

        def sampler() -> None:
            while not stop.wait(o.sample_s):
                pids = rig.engine_pids()
                row = {"t_s": round(time.monotonic() - t0, 1), **proc_stats(pids)}
                if pids:
                    counters = _kvtier_samples(rig.url)
                    if counters:
                        lives[pids[0]] = counters
                    row["kvtier"] = counters
                series.append(row)

        agent_thread = threading.Thread(target=agents.run, args=(stop,), name="soak-agents", daemon=True)
        sample_thread = threading.Thread(target=sampler, name="soak-sampler", daemon=True)
        agent_thread.start()
        sample_thread.start()
        rng = random.Random(f"{o.seed}/faults")
        end = t0 + o.minutes * 60.0
        for p in schedule:
            while time.monotonic() < t0 + p.at_s:
                check_crash()
                time.sleep(0.5)
            check_crash()
            f = faults[p.kind]
            ev: dict[str, Any] = {"kind": f.name, "at_s": round(time.monotonic() - t0, 1)}
            if f.stops_engine:
                stopping.set()
            try:
                ev["injected"] = f.inject(rig, rng)
                time.sleep(p.hold_s)
                ev["recovered"] = f.recover(rig, rng)
            except FaultError as exc:
                ev["error"] = str(exc)
            except ClusterError as exc:      # the engine did not come back: nothing left to soak
                ev["error"] = f"the engine did not restart: {str(exc)[-1500:]}"
                crashes.append({"t_s": round(time.monotonic() - t0, 1), "returncode": None,
                                "log_tail": ev["error"]})
                ev["recover_at_s"], ev["recovery_s"] = round(time.monotonic() - t0, 1), None
                events.append(ev)
                progress(f"t+{ev['at_s']:.0f} s {f.name}: {ev['error']}")
                break
            finally:
                stopping.clear()
            ev["recover_at_s"] = round(time.monotonic() - t0, 1)
            t_rec = time.monotonic()
            ev["recovery_s"] = None
            while time.monotonic() - t_rec < o.recover_timeout_s:
                check_crash()
                if probe.once():
                    ev["recovery_s"] = round(time.monotonic() - t_rec, 2)
                    break
                time.sleep(0.5)
            progress(f"t+{ev['at_s']:.0f} s {f.name}: {ev.get('injected', ev.get('error'))}; "
                     f"{ev.get('recovered', '')}; service back after {ev['recovery_s']} s")
            events.append(ev)
        dead = not rig.engine_alive() and not stopping.is_set() and any(c["returncode"] is None for c in crashes)
        while not dead and time.monotonic() < end:
            check_crash()
            time.sleep(0.5)
        if not dead:
            check_crash()
        stop.set()
        agent_thread.join(timeout=o.recover_timeout_s)
        sample_thread.join(timeout=30)
        wall = time.monotonic() - t0
    finally:
        stop.set()
        rig.close()
    return _document(o, schedule, events, crashes, agents, series, lives, wall)


def _document(o, schedule, events, crashes, agents, series, lives, wall) -> dict[str, Any]:
    totals: dict[str, float] = {}
    for counters in lives.values():
        for k, v in counters.items():
            if "_total" in k or "remote_" in k and not k.endswith(("_up", "_open", "consecutive_failures")):
                totals[k] = totals.get(k, 0.0) + v
    windows = [(e["at_s"], e["recover_at_s"] + (e["recovery_s"] or 0.0), e["kind"]) for e in events]

    def kind_at(t: float) -> str | None:
        return next((k for a, b, k in windows if a <= t <= b), None)

    wrong = [asdict(t) for t in agents.turns if not t.correct]
    return {
        "options": {"minutes": o.minutes, "seed": o.seed, "engine_blocks": o.engine_blocks,
                    "max_context": o.max_context, "concurrent": o.concurrent, "kvtier": o.kvtier,
                    "hold_s": o.hold_s, "spacing_s": o.spacing_s},
        "schedule": [asdict(p) for p in schedule],
        "faults": events,
        "wall_s": round(wall, 1),
        "turns": len(agents.turns),
        "resumes": sum(1 for t in agents.turns if t.turn > 0),
        "wrong_outputs": len(wrong),
        "wrong": wrong[:20],
        "failed_requests": sum(1 for f in agents.failures if not f.at_engine_stop),
        "failed_at_engine_stop": sum(1 for f in agents.failures if f.at_engine_stop),
        "failed_turns": len({(f.session, f.turn) for f in agents.failures}),   # each retried until it was served
        "failures": [dict(asdict(f), during=kind_at(f.t_s)) for f in agents.failures],
        "crashes": crashes,
        "never_recovered": [e["kind"] for e in events if e["recovery_s"] is None],
        "kvtier_totals": totals,
        "series": series,
        "resume_ttft": [(round(t.t_s, 2), round(t.ttft_s, 4), kind_at(t.t_s)) for t in agents.turns if t.turn > 0],
    }
