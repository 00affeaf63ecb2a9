"""Clocks the lifecycle controller runs on.

The controller never reads time itself: it is handed a :class:`Clock`, so an
engine runs it on the monotonic clock, a replay on a scaled one (trace
seconds), and tests and the simulator on a :class:`ManualClock` they advance
by hand.  Every time the controller stores or compares is in the clock's
seconds.
"""
from __future__ import annotations

import threading
import time
from typing import Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    """Seconds, monotonic non-decreasing.  ``sleep_until`` blocks the calling
    kvtier thread (never an engine thread) until ``now() >= t`` or ``wake`` is
    set, whichever is first."""

    def now(self) -> float: ...

    def sleep_until(self, t: float, wake: threading.Event) -> None: ...


class MonotonicClock:
    """``time.monotonic()``: what an engine plugin runs on."""

    def now(self) -> float:
        return time.monotonic()

    def sleep_until(self, t: float, wake: threading.Event) -> None:
        wake.wait(max(0.0, t - self.now()))


class ScaledClock:
    """Trace seconds for a replay: ``monotonic() / scale`` (scale 0.02 runs a
    trace 50x faster; a policy still sees the trace's waits)."""

    def __init__(self, scale: float) -> None:
        if not (scale > 0):
            raise ValueError(f"scale must be > 0, got {scale!r}")
        self.scale = float(scale)
        self._t0 = time.monotonic()

    def now(self) -> float:
        return (time.monotonic() - self._t0) / self.scale

    def sleep_until(self, t: float, wake: threading.Event) -> None:
        wake.wait(max(0.0, (t - self.now()) * self.scale))


class ManualClock:
    """A clock that moves only when told (tests, the simulator).  Thread-safe.
    ``sleep_until`` returns at once when the time has not come: a timer thread
    on a manual clock waits on ``wake`` instead (see LifecycleTimer)."""

    def __init__(self, t0: float = 0.0) -> None:
        self._t = float(t0)
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._t

    def advance(self, dt: float) -> float:
        """Move forward ``dt >= 0`` seconds; returns the new time.  Raises ValueError for dt < 0."""
        if dt < 0:
            raise ValueError(f"a clock cannot go back (dt={dt!r})")
        with self._lock:
            self._t += float(dt)
            return self._t

    def set(self, t: float) -> None:
        """Jump to ``t`` (not before now).  Raises ValueError otherwise."""
        with self._lock:
            if t < self._t:
                raise ValueError(f"a clock cannot go back ({t!r} < {self._t!r})")
            self._t = float(t)

    def sleep_until(self, t: float, wake: threading.Event) -> None:
        wake.wait(0.05 if t > self.now() else 0.0)
