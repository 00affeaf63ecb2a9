"""Paused trajectories whose state is still in HBM with nothing moving it: the victims.

:class:`PausedResidents` is the set admission takes victims from (oldest pause
first, in insertion order) and :class:`EvictionRate` how often its members
have been made to leave (``PauseContext.eviction_rate_per_s``).  One owner,
the node's event loop; not thread-safe.
"""
from __future__ import annotations

import math
from typing import Iterator

from kvtier.util.tiers import Tier

from kvtier.bench.sim.events import EventQueue
from kvtier.bench.sim.node import SessionState

EVICTION_TAU_S = 300.0      # time constant of the eviction-rate estimate (PauseContext.eviction_rate_per_s)


class EvictionRate:
    """How often paused HBM-resident trajectories have been made to leave, recently: victims
    taken over trajectory-seconds of residence in the paused set, both sums decayed with time
    constant ``EVICTION_TAU_S`` (``PauseContext.eviction_rate_per_s``).  One owner, not
    thread-safe."""

    __slots__ = ("ev", "ex", "t", "n")

    def __init__(self) -> None:
        self.ev = self.ex = self.t = 0.0
        self.n = 0

    def _advance(self, now: float) -> None:
        dt = now - self.t
        if dt > 0.0:
            d = math.exp(-dt / EVICTION_TAU_S)
            self.ev *= d
            self.ex = self.ex * d + self.n * EVICTION_TAU_S * (1.0 - d)
            self.t = now

    def resident(self, now: float, n: int) -> None:
        """The paused HBM-resident set has ``n`` trajectories from ``now`` on."""
        self._advance(now)
        self.n = n

    def evicted(self, now: float) -> None:
        """One of them was made to leave at ``now``."""
        self._advance(now)
        self.ev += 1.0

    def rate(self, now: float) -> float | None:
        """Evictions per trajectory-second (None before any residence)."""
        self._advance(now)
        return self.ev / self.ex if self.ex > 0.0 else None


class PausedResidents:
    """The paused sessions admission may take HBM from, oldest pause first.

    A member is paused, holds HBM and has no transfer in flight when listed
    (:meth:`add` checks the last two); ``SessionState.evictable`` says whether
    admission may still take it this pause (a ``retain`` answer pins it).
    """

    def __init__(self, clock: EventQueue) -> None:
        self._clock = clock
        self._set: dict[SessionState, None] = {}     # insertion order = oldest pause first
        self.rate = EvictionRate()

    def add(self, x: SessionState) -> None:
        """List x if its state is in HBM with nothing moving it (no-op otherwise, or if listed)."""
        if x.place is Tier.DEVICE and x.moving is None and x not in self._set:
            self._set[x] = None
            self.rate.resident(self._clock.now, len(self._set))
            x.evictable = True

    def remove(self, x: SessionState) -> None:
        """Unlist x (no-op if not listed); it is not evictable from now on."""
        if x in self._set:
            del self._set[x]
            self.rate.resident(self._clock.now, len(self._set))
        x.evictable = False

    def evicted(self) -> None:
        """One member was made to leave now (counted in the eviction rate)."""
        self.rate.evicted(self._clock.now)

    def __contains__(self, x: SessionState) -> bool:
        return x in self._set

    def __iter__(self) -> Iterator[SessionState]:
        return iter(self._set)

    def __len__(self) -> int:
        return len(self._set)
