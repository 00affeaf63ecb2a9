"""Engine loads first: the gate that makes the lifecycle's background moves
(demotions, stagings) step aside while an engine is loading a resume.

A resume is on the engine's critical path; a demotion or a staging is not.
On a small machine both compete for the same disk, cores and interpreter
lock, so a staging thread reading 20 MB while a resume reads 30 MB makes the
resume slower (measured in ``kvtier bench engine --engine sglang``: the
slowest resumes overlapped stagings).  The plugins mark their load calls with
:meth:`Foreground.loading`; the controller's moves run in slices and, before
each slice, :meth:`Foreground.wait_idle` until no load is in progress -- for
at most ``max_wait_s`` per slice, so background work is delayed, never
starved.

Threading: any thread may enter :meth:`loading` (nesting and concurrent loads
count); :meth:`wait_idle` is called from kvtier threads only, never an engine
thread.
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
    Raises ValueError for a negative ``max_wait_s``.
    """

    def __init__(self, max_wait_s: float = 0.5) -> None:
        if not (max_wait_s >= 0):
            raise ValueError(f"max_wait_s must be >= 0, got {max_wait_s!r}")
        self.max_wait_s = float(max_wait_s)
        self._active = 0
        self._cv = threading.Condition()
        self.loads = 0                 # loads seen
        self.yields = 0                # background slices that waited
        self.yield_s = 0.0             # seconds they waited, in all

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
                    self._cv.notify_all()

    def busy(self) -> bool:
        with self._cv:
            return self._active > 0

    def wait_idle(self) -> float:
        """Block (a kvtier thread) until no load is in progress or
        ``max_wait_s`` passed.  Returns the seconds waited."""
        with self._cv:
            if not self._active:
                return 0.0
            t0 = time.perf_counter()
            self._cv.wait_for(lambda: self._active == 0, timeout=self.max_wait_s)
            waited = time.perf_counter() - t0
            self.yields += 1
            self.yield_s += waited
            return waited

    def stats(self) -> dict[str, float]:
        with self._cv:
            return {"loads": self.loads, "yields": self.yields, "yield_s": round(self.yield_s, 6)}
