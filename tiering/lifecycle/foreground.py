"""Engine loads first: the gate that makes the lifecycle's background moves
(demotions, stagings) step aside while an engine is loading a resume.

A resume is on the engine's critical path; a demotion or a staging is not.
On a small machine both compete for the same disk, cores and interpreter
lock, so a staging thread reading 20 MB while a resume reads 30 MB makes the
resume slower (measured in ``kvtier bench engine --engine sglang``: the
slowest resumes overlapped stagings).  The plugins mark their load calls with
:meth:`Foreground.loading`; the controller's moves run in slices and, before
each slice, :meth:`Foreground.wait_idle` until no load is in progress and
none ended in the last ``quiet_s`` -- one resume is several engine calls
(SGLang's ``batch_exists`` then ``batch_get_v1``; vLLM's load jobs, one per
batch of chunks), and a slice started in the gap between two of them runs
beside the next (measured: a 338-block SGLang resume took 149 ms with two
staging slices beside it for 126 ms) -- for at most ``max_wait_s`` per
slice, so background work is delayed, never starved.

An engine call that is part of a resume but no load (vLLM's per-chunk
``lookup``, which runs between its load jobs and before the first: most of a
vLLM resume's time) marks itself with :meth:`touch`: the moves wait
``quiet_s`` after it as after a load.  Measured in ``kvtier bench engine
--engine vllm --bytes-per-token 1024`` (breakeven, one run each): without it
a 1,334-chunk resume with 1,326 chunks in DRAM took 645 ms, slower than lru's
1,296-chunk resumes from NVMe (341 ms); with it breakeven's 1,296-1,334-chunk
resumes with 1,150-1,265 in DRAM took 236-251 ms and its p99 went 682 -> 364 ms.

Where the engine's forward pass runs on the same cores as kvtier's threads
(vLLM's CPU platform), a move beside a prefill slows the prefill, which is the
rest of a resume's time to the first token: the plugin then reports each
engine step with :meth:`step`, and a step that prefills a new request holds
the moves back as a load does, until the next step (bounded by ``max_wait_s``
from the step's start, for an engine that goes idle after it).  Measured in
``kvtier bench live`` with a host tier under one context, where the moves are
most frequent (docs/live.md; K = 6, paired): breakeven's resume TTFT p50 was
7.7 +- 2.0 ms lower with prefill steps holding the moves back than without,
and its mean job completion 0.42 +- 0.20 s lower.

Threading: any thread may enter :meth:`loading` (nesting and concurrent loads
count); :meth:`touch` and :meth:`step` are the engine's (lock-free but for the
end of a prefill step); :meth:`wait_idle` is called from kvtier threads only,
never an engine thread.
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Iterator


class Foreground:
    """Counts engine loads in progress (see the module doc).

    max_wait_s: the longest one background slice waits for loads to finish
                (default 0.5 s of wall time).
    quiet_s:    how long after the last load ended a slice still waits (the
                gap between the engine calls of one resume; default 20 ms).
    Raises ValueError for a negative ``max_wait_s`` or ``quiet_s``.
    """

    def __init__(self, max_wait_s: float = 0.5, quiet_s: float = 0.02) -> None:
        if not (max_wait_s >= 0 and quiet_s >= 0):
            raise ValueError(f"max_wait_s and quiet_s must be >= 0, got {max_wait_s!r}, {quiet_s!r}")
        self.max_wait_s, self.quiet_s = float(max_wait_s), float(quiet_s)
        self._last_end = -float("inf")
        self._active = 0
        self._prefill_since: float | None = None   # a prefill step runs since then (None: none)
        self._cv = threading.Condition()
        self.loads = 0                 # loads seen
        self.yields = 0                # background slices that waited
        self.yield_s = 0.0             # seconds they waited, in all
        self.prefill_steps = 0         # engine steps that prefilled a new request

    @contextmanager
    def loading(self) -> Iterator[None]:
        """Mark an engine load (the body) as in progress."""
        with self._cv:
            self._active += 1
            self.loads += 1
        try:
            yield
        finally:
            with self._cv:
                self._active -= 1
                if not self._active:
                    self._last_end = time.perf_counter()
                    self._cv.notify_all()

    def touch(self) -> None:
        """An engine call of a resume that is not a load (a lookup) ran now:
        moves wait ``quiet_s`` from here, as after a load.  Lock-free (one
        float store; a waiter re-reads it when its wait ends), so cheap enough
        for a call per chunk on an engine thread."""
        self._last_end = time.perf_counter()

    def step(self, prefill: bool) -> None:
        """The engine scheduled a step; ``prefill``: it prefills a new request, a
        forward pass on the cores the moves share.  Moves wait from here until
        a step without one (then ``quiet_s`` more), or ``max_wait_s`` from this
        one's start.  The engine thread's, once per step: a float store, and a
        wake of the waiting moves at a prefill step's end."""
        if prefill:
            self._prefill_since = time.perf_counter()
            self.prefill_steps += 1
        elif self._prefill_since is not None:
            with self._cv:
                self._prefill_since = None
                self._last_end = time.perf_counter()
                self._cv.notify_all()

    def _free_at(self) -> float:
        """When moves may run, as things stand (lock held): never while a load is in
        progress, else ``quiet_s`` after the last engine call and not before a prefill
        step in progress stops holding them (``max_wait_s`` from its start)."""
        if self._active:
            return float("inf")
        since = self._prefill_since
        free = self._last_end + self.quiet_s
        return free if since is None else max(free, since + self.max_wait_s)

    def busy(self) -> bool:
        with self._cv:
            return self._active > 0

    def idle(self) -> bool:
        """No load or prefill step in progress and no engine call marked in the last ``quiet_s``."""
        with self._cv:
            return time.perf_counter() >= self._free_at()

    def wait_idle(self) -> float:
        """Block (a kvtier thread) until no load or prefill step is in progress
        and none ended in the last ``quiet_s``, or ``max_wait_s`` passed.  Returns
        the seconds waited."""
        with self._cv:
            t0 = time.perf_counter()
            deadline, waited = t0 + self.max_wait_s, False
            while True:
                now = time.perf_counter()
                until = min(deadline, self._free_at())
                if now >= until:
                    break
                waited = True
                self._cv.wait(until - now)
            if not waited:
                return 0.0
            took = time.perf_counter() - t0
            self.yields += 1
            self.yield_s += took
            return took

    def stats(self) -> dict[str, float]:
        with self._cv:
            return {"loads": self.loads, "yields": self.yields, "yield_s": round(self.yield_s, 6),
                    "prefill_steps": self.prefill_steps}
