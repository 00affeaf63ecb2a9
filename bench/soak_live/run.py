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
from kvtier.bench.soak_live.fsmount import why_not
from kvtier.bench.soak_live.growth import judge
from kvtier.bench.soak_live.rig import Rig, proc_stats
from kvtier.bench.soak_live.schedule import describe, plan


@dataclass(frozen=True)
class SoakOptions:
    model: str
    workdir: Path
    minutes: float = 8.0
    seed: int = 0
    kinds: Sequence[str] | None = None     # None: every kind this host can run (:func:`plannable`)
    engine_blocks: int = 24                # the engine's cache, in 32-token blocks
    max_context: int = 640
    concurrent: int = 6
    vocab: int = 256
    warmup_s: float = 30.0
    hold_s: float = 5.0
    spacing_s: float = 40.0
    sample_s: float = 5.0
    recover_timeout_s: float = 180.0
    data_mib: int | None = 256             # kvtier's data dir on its own ext4 (fs-full); None: not
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


def plannable(asked: Sequence[str] | None, known: Sequence[str],
              data_mib: int | None) -> tuple[list[str], dict[str, str]]:
    """The fault kinds a soak plans, and those left out with why.  ``asked`` None: every
    ``known`` kind this host can run (``fs-full`` needs ``data_mib`` and a size-limited mount,
    :func:`~kvtier.bench.soak_live.fsmount.why_not`); named kinds must all run.

    Raises:
        ValueError: an unknown or empty list of kinds, or ``fs-full`` named where it cannot run.
    """
    kinds = list(known) if asked is None else list(asked)
    unknown = [k for k in kinds if k not in known]
    if unknown or not kinds:
        raise ValueError(f"unknown fault kind {unknown[0]!r}; known: {', '.join(known)}" if unknown
                         else "give at least one fault kind")
    why = None if "fs-full" not in kinds else "--data-mib 0" if data_mib is None else why_not()
    if why is None:
        return kinds, {}
    if asked is not None:
        raise ValueError(f"fs-full needs kvtier's data dir on a size-limited mount: {why} "
                         "(leave fs-full out of the kinds)")
    return [k for k in kinds if k != "fs-full"], {"fs-full": why}


def run_soak(o: SoakOptions, progress: Callable[[str], None] = print) -> dict[str, Any]:
    """Raises ClusterError when the rig does not start, ValueError for an unknown kind."""
    return Soak(o, progress).run()


class Soak:
    """One soak run (module doc).  The calling thread runs the fault plan and owns the rig's
    restarts; the agents and the sampler run in their own threads and only read the rig."""

    def __init__(self, o: SoakOptions, progress: Callable[[str], None]) -> None:
        spec = ClusterSpec(model=o.model, workdir=Path(o.workdir), engines=1, engine_blocks=o.engine_blocks,
                           max_model_len=o.max_context + 64, kvtier=dict(o.kvtier))
        self.faults = fault_kinds(spec.context_tokens, o.vocab)
        self.kinds, self.left_out = plannable(o.kinds, list(self.faults), o.data_mib)
        for kind, why in self.left_out.items():
            progress(f"{kind} left out: {why}")
        self.o, self.progress = o, progress
        self.schedule = plan(seed=o.seed, minutes=o.minutes, kinds=self.kinds, warmup_s=o.warmup_s,
                             hold_s=o.hold_s, spacing_s=o.spacing_s)
        self.rig = Rig(spec, progress, data_mib=o.data_mib if "fs-full" in self.kinds else None)
        self.stop, self.stopping = threading.Event(), threading.Event()
        self.events: list[dict] = []
        self.crashes: list[dict] = []
        self.series: list[dict] = []          # the sampler thread's
        self.lives: dict[int, dict[str, float]] = {}   # engine pid -> its last kvtier counters (sampler's)
        self.t0 = time.monotonic()
        self.dead = False                     # the engine did not come back: nothing left to soak

    def _now(self) -> float:
        return round(time.monotonic() - self.t0, 1)

    def run(self) -> dict[str, Any]:
        o, rig = self.o, self.rig
        self.progress(describe(self.schedule, o.seed))
        try:
            rig.prepare()
            rig.start_redis()
            rig.start_engine()
            self.probe = _Probe(rig.url, o.seed, o.vocab)
            if not self.probe.once():
                raise ClusterError("the probe request failed on a fresh engine")
            self.t0 = time.monotonic()
            agents = Agents(rig.url, seed=o.seed, vocab=o.vocab, max_context=o.max_context,
                            concurrent=o.concurrent, engine_stopping=self.stopping, t0=self.t0)
            threads = [threading.Thread(target=agents.run, args=(self.stop,), name="soak-agents", daemon=True),
                       threading.Thread(target=self._sample, name="soak-sampler", daemon=True)]
            for t in threads:
                t.start()
            rng = random.Random(f"{o.seed}/faults")
            for p in self.schedule:
                self._idle_until(self.t0 + p.at_s)
                if self.dead:
                    break
                self._one_fault(p, rng)
            self._idle_until(self.t0 + o.minutes * 60.0)
            self.stop.set()
            threads[0].join(timeout=o.recover_timeout_s)
            threads[1].join(timeout=30)
            wall = time.monotonic() - self.t0
        finally:
            self.stop.set()
            rig.close()
        return _document(o, self.schedule, self.events, self.crashes, agents, self.series, self.lives, wall,
                         kinds=self.kinds, left_out=self.left_out)

    def _idle_until(self, t: float) -> None:
        while not self.dead and time.monotonic() < t:
            self._check_crash()
            time.sleep(0.5)
        if not self.dead:
            self._check_crash()

    def _check_crash(self) -> None:
        """An engine exit no fault caused: record it, restart the engine."""
        rig = self.rig
        if rig.engine_alive() or self.stopping.is_set():
            return
        self.crashes.append({"t_s": self._now(), "returncode": rig.engine.returncode,
                             "log_tail": _tail(rig.engine_log, 2000)})
        self.progress(f"CRASH: the engine exited with {rig.engine.returncode}; restarting it")
        try:
            rig.start_engine()
        except ClusterError as exc:
            self._engine_gone(str(exc))

    def _engine_gone(self, why: str) -> None:
        self.crashes.append({"t_s": self._now(), "returncode": None,
                             "log_tail": f"the engine did not restart: {why[-1500:]}"})
        self.dead = True

    def _one_fault(self, p, rng: random.Random) -> None:
        f = self.faults[p.kind]
        ev: dict[str, Any] = {"kind": f.name, "at_s": self._now(), "recovery_s": None}
        self.events.append(ev)
        if f.stops_engine:
            self.stopping.set()
        try:
            ev["injected"] = f.inject(self.rig, rng)
            time.sleep(p.hold_s)
            ev["recovered"] = f.recover(self.rig, rng)
        except FaultError as exc:
            ev["error"] = str(exc)
        except ClusterError as exc:
            ev["error"] = "the engine did not restart"
            self._engine_gone(str(exc))
        finally:
            self.stopping.clear()
        ev["recover_at_s"] = self._now()
        t_rec = time.monotonic()
        while not self.dead and time.monotonic() - t_rec < self.o.recover_timeout_s:
            self._check_crash()
            if not self.dead and self.probe.once():
                ev["recovery_s"] = round(time.monotonic() - t_rec, 2)
                break
            time.sleep(0.5)
        self.progress(f"t+{ev['at_s']:.0f} s {f.name}: {ev.get('injected', '')}; "
                      f"{ev.get('recovered', ev.get('error', ''))}; service back after {ev['recovery_s']} s")

    def _sample(self) -> None:
        while not self.stop.wait(self.o.sample_s):
            pids = self.rig.engine_pids()
            stats = proc_stats(pids)
            # still serving after the read: not a tree a kill took away while it was being read
            alive = bool(pids) and self.rig.serving and stats["rss_mib"] > 0
            row = {"t_s": self._now(), "pid": pids[0] if alive else None, **stats}
            if pids:
                counters = _kvtier_samples(self.rig.url)
                if counters:
                    self.lives[pids[0]] = counters
                row["kvtier"] = counters
            self.series.append(row)


def _document(o, schedule, events, crashes, agents, series, lives, wall, *, kinds: Sequence[str],
              left_out: dict[str, str]) -> dict[str, Any]:
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
                    "hold_s": o.hold_s, "spacing_s": o.spacing_s, "data_mib": o.data_mib},
        "kinds": list(kinds), "left_out": dict(left_out),
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
        "growth": judge(series),
        "resume_ttft": [(round(t.t_s, 2), round(t.ttft_s, 4), kind_at(t.t_s)) for t in agents.turns if t.turn > 0],
    }
