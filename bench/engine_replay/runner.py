"""The replay loop: a trace's rounds through one engine, in scaled real time.

One thread plays the engine's scheduler: at each round's start (trace
seconds x ``time_scale``, wall clock) it runs the round -- resume (load and
compare every byte), store, finish -- while the plugin's own threads (kvtier's
I/O pool and lifecycle timer) run beside it.  A round whose start has passed
runs at once (the replay never skips work to keep time).  A resume's load time
is the engine's calls only (the byte comparison after them is not timed); the
slowest resumes are reported with the lifecycle moves that overlapped them
(:mod:`.breakdown`).

The heap built before the first round (the engine packages, the engine, the
workload) is frozen out of the garbage collector for the replay
(``gc.freeze``), as vLLM's engine core does after its start-up
(``freeze_gc_heap``) and SGLang advises (its ``freeze_gc`` API): otherwise a
full collection over it, hundreds of ms here, lands inside whichever load it
happens to interrupt, under any policy.
"""
from __future__ import annotations

import gc
import math
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

from .breakdown import ResumeRecord, summarize
from .clock import ReplayClock
from .workload import Workload


@dataclass
class PolicyResult:
    resumes: int = 0
    loads: list[float] = field(default_factory=list)
    served: Counter = field(default_factory=Counter)
    bit_exact: bool = True
    late_s: float = 0.0           # how far the replay ran behind the wall-clock schedule at worst (the
                                  # trace clock waits for it: see clock.py)
    wall_s: float = 0.0
    bytes_written: int = 0
    bytes_read: int = 0
    engine: dict = field(default_factory=dict)
    detail: list = field(default_factory=list)     # ResumeRecord per resume
    breakdown: dict = field(default_factory=dict)  # breakdown.summarize of the slowest resumes

    def as_dict(self) -> dict:
        ls = sorted(self.loads)
        return {"resumes": self.resumes, "load_p50_s": _q(ls, 0.5), "load_p99_s": _q(ls, 0.99),
                "load_mean_s": sum(ls) / len(ls) if ls else None,
                "served": {k: self.served.get(k, 0) for k in ("host", "nvme", "remote", "miss")},
                "bytes_written": self.bytes_written, "bytes_read": self.bytes_read,
                "bit_exact": self.bit_exact, "wall_s": round(self.wall_s, 3), "max_late_s": round(self.late_s, 3),
                **({"engine": self.engine} if self.engine else {}),
                **({"breakdown": self.breakdown} if self.breakdown else {})}


def _q(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    return xs[min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))]


def replay(engine, work: Workload, time_scale: float, *, on_step: Callable[[], None] | None = None) -> PolicyResult:
    """Run every step of ``work`` through ``engine`` (a VllmReplay or SglangReplay)
    on a :class:`ReplayClock` that the engine's lifecycle controller shares."""
    gc.collect()
    gc.freeze()            # the start-up heap, as the engines do (see the module doc)
    try:
        return _replay(engine, work, time_scale, on_step)
    finally:
        gc.unfreeze()      # the next policy's collection may free this one's engine


def _replay(engine, work: Workload, time_scale: float, on_step: Callable[[], None] | None) -> PolicyResult:
    res = PolicyResult()
    t0 = time.monotonic()
    first = work.steps[0].start_s if work.steps else 0.0
    clock = ReplayClock(time_scale, first)
    engine.set_clock(clock)
    steps = work.steps
    for i, step in enumerate(steps):
        due = t0 + (step.start_s - first) * time_scale
        res.late_s = max(res.late_s, time.monotonic() - due)
        clock.wait_until(step.start_s)
        clock.hold(steps[i + 1].start_s if i + 1 < len(steps) else math.inf)
        engine.begin(step)
        if step.resume_chunks:
            where, in_host = engine.served_from(step)
            s0 = time.perf_counter()
            found, exact, load_s = engine.resume(step)
            res.loads.append(load_s)
            res.resumes += 1
            res.served["miss" if not found else where] += 1
            res.detail.append(ResumeRecord(step.session, step.round, len(step.resume_chunks),
                                           "miss" if not found else where, in_host, load_s, s0, s0 + load_s))
            res.bit_exact &= exact
        if step.store_chunks:
            engine.store(step)
        engine.finish(step)
        if on_step is not None:
            on_step()
    res.wall_s = time.monotonic() - t0
    res.bytes_written, res.bytes_read = engine.io_bytes()
    res.engine = _summary(engine.stats())
    res.breakdown = summarize(res.detail, engine.moves())
    return res


def _summary(s: dict) -> dict:
    keep = {}
    for k in ("decisions", "chunks_skipped", "pages_set_skipped", "load_failures", "pages_get_miss"):
        if k in s:
            keep[k] = s[k]
    lc = s.get("lifecycle")
    if lc:
        keep["lifecycle"] = {k: lc[k] for k in ("pauses", "resumes", "demoted_blocks", "staged_blocks",
                                                  "dropped_blocks", "leases", "watermark_runs", "stage_short", "foreground")
                             if k in lc}
    return keep
