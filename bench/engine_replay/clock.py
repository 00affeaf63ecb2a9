"""The replay's trace clock: real time, held back while the replay is behind.

Trace seconds flow at ``1 / time_scale`` of wall seconds, but never past the
start of the next round the replay has not started yet.  So when the CPU
cannot keep up with the scaled trace (a big context takes longer to move than
its scaled wait), the trace waits for the replay instead of the lifecycle's
timers running ahead of the engine (a staging "before the return" that fires
long before the replay reaches the return would flatter the policy).  While
the replay is ahead, time flows with the wall clock and the lifecycle thread
runs concurrently with the engine, as in a server.
"""
from __future__ import annotations

import threading
import time


class ReplayClock:
    """A :class:`kvtier.tiering.lifecycle.Clock` in trace seconds (see the module doc)."""

    def __init__(self, time_scale: float, t0: float = 0.0) -> None:
        self.scale = float(time_scale)
        self._lock = threading.Lock()
        self._base_t, self._base_wall = float(t0), time.monotonic()
        self._cap = float(t0)

    def now(self) -> float:
        with self._lock:
            return min(self._cap, self._base_t + (time.monotonic() - self._base_wall) / self.scale)

    def wait_until(self, t: float) -> None:
        """Called by the replay before a round that starts at trace time ``t``:
        lets time flow up to ``t`` (sleeping while it does), then pins it there."""
        with self._lock:
            now = min(self._cap, self._base_t + (time.monotonic() - self._base_wall) / self.scale)
            self._base_t, self._base_wall = now, time.monotonic()
            self._cap = max(self._cap, t)
        while True:
            with self._lock:
                now = self._base_t + (time.monotonic() - self._base_wall) / self.scale
                if now >= t:
                    self._base_t, self._base_wall = t, time.monotonic()
                    return
                left = (t - now) * self.scale
            time.sleep(min(left, 0.05))

    def hold(self, next_t: float) -> None:
        """While the current round runs, time may flow up to ``next_t`` at most."""
        with self._lock:
            self._cap = max(self._cap, next_t)

    def sleep_until(self, t: float, wake: threading.Event) -> None:
        wake.wait(min(max(0.0, (t - self.now()) * self.scale), 0.05))
