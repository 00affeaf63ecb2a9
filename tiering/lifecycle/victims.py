"""Host-frame victims by forecast at write time: the store's eviction order.

A host write that finds no free frame makes the store evict.  By default the
store evicts by recency (its LRU).  Under a forecast schedule the controller
installs a :class:`ForecastVictims` on the store
(``TieredStore.set_host_victim_order``), so an engine's own host write gives
up the frames the forecast wants least, not the oldest ones:

1. trajectories running for ``release_after_s`` or more (the engine holds
   their KV; a finished one never comes back), longest-running first;
2. paused trajectories *and* writers (running, their coming pause already
   planned: ``plan_for`` was asked) by the schedule's victim key, the one
   expected back last first; each gives up its context's end first, so its
   prefix stays in DRAM.  A block several trajectories share (a common
   prompt prefix) is ranked with the one that wants it soonest.  A writer expected back later than a paused
   trajectory therefore pushes its own overflow to NVMe instead of
   displacing that pause; one expected back sooner displaces it;
3. (the store) whatever the order does not name, by recency.

The order is computed lazily, when the store asks for it and something
changed (an engine call marked it stale) or ``refresh_s`` clock seconds
passed, and kept as one tuple until then, so an eviction batch costs the
victims it takes, not a scan.

Locks: the store calls it with the store's lock held; it takes the
controller's ``_lock``, which the controller never holds while calling the
store (see the controller's module doc), so the order store lock -> ``_lock``
cannot deadlock.  It never calls the store.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from .controller import LifecycleController


class ForecastVictims:
    """The store's host victim order from one controller's registry (see the module doc)."""

    refresh_s: float = 1.0    # clock seconds an order is reused at most (keys drift as time passes)
    rank_writers: bool = True  # a running trajectory whose pause is planned is ranked by its forecast too

    def __init__(self, controller: "LifecycleController") -> None:
        self._ctl = controller
        self._seq: tuple[bytes, ...] | None = None
        self._at = -math.inf
        self._stale = True
        self.refreshes = 0

    def invalidate(self) -> None:
        """Something the order depends on changed (lock-free: a flag)."""
        self._stale = True

    def __call__(self) -> Sequence[bytes] | None:
        ctl = self._ctl
        with ctl._lock:
            now = ctl.clock.now()
            if self._seq is not None and not self._stale and now - self._at < self.refresh_s:
                return self._seq
            self._stale = False
            self._at = now
            self._seq = self._compute(now)
            self.refreshes += 1
            return self._seq

    def _compute(self, now: float) -> tuple[bytes, ...]:
        """Under the controller's lock."""
        ctl = self._ctl
        first, ranked = [], []
        for t in ctl._reg:
            if not t.keys:
                continue
            if t.paused_at is not None or (self.rank_writers and t.plan is not None):
                ranked.append((ctl._key(t, now), t))
            elif t.resumed_at is not None and now - t.resumed_at >= ctl.release_after_s:
                first.append(t)
        # built soonest-wanted first, then reversed: a block several trajectories share (a
        # common prompt prefix) goes with the one that wants it soonest, so it leaves last
        ranked.sort(key=lambda kt: kt[0])
        first.sort(key=lambda t: t.resumed_at, reverse=True)
        seen: set[bytes] = set()
        out: list[bytes] = []
        for t in [t for _, t in ranked] + first:
            for k in t.keys:
                if k not in seen:
                    seen.add(k)
                    out.append(k)
        out.reverse()
        return tuple(out)
