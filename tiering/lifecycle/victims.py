"""Host-frame victims by forecast at write time: the store's eviction order.

A host write that finds no free frame makes the store evict.  By default the
store evicts by recency (its LRU).  Under a forecast schedule the controller
installs a :class:`ForecastVictims` on the store
(``TieredStore.set_host_victim_order``), so an engine's own host write gives
up the frames the forecast wants least, not the oldest ones:

1. trajectories running for ``release_after_s`` or more (the engine holds
   their KV; a finished one never comes back), longest-running first;
2. paused trajectories *and* writers (running, their coming pause already
   planned: ``plan_for`` or ``plan_blocks`` was asked) by the schedule's victim key, the one
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

What an order sees of the controller is a :class:`VictimView` (the store
moves implement it): the core's :class:`~.shared.Shared` view (registry,
lock, clock, victim key), the running time after which a trajectory gives
up its frames, and whether a context is larger than the host tier.

Locks: the store calls it with the store's lock held; it takes
``Shared.lock``, which the controller never holds while calling the store
(see the controller's module doc), so the order store lock -> ``Shared.lock``
cannot deadlock.  It never calls the store.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Protocol, Sequence

if TYPE_CHECKING:
    from .registry import Trajectory
    from .shared import Shared


class VictimView(Protocol):
    """What a victim order uses (see the module doc)."""

    shared: "Shared"
    release_after_s: float

    def oversize(self, t: "Trajectory") -> bool:
        """``t``'s context is larger than the whole host tier (lock held)."""
        ...


class ForecastVictims:
    """The store's host victim order from one controller's registry (see the module doc)."""

    refresh_s: float = 1.0    # clock seconds an order is reused at most (keys drift as time passes)
    rank_writers: bool = True  # a running trajectory whose pause is planned is ranked by its forecast too

    def __init__(self, view: VictimView) -> None:
        self._view = view
        self._seq: tuple[bytes, ...] | None = None
        self._at = -math.inf
        self._stale = True
        self.refreshes = 0

    def invalidate(self) -> None:
        """Something the order depends on changed (lock-free: a flag)."""
        self._stale = True

    def __call__(self) -> Sequence[bytes] | None:
        sh = self._view.shared
        with sh.lock:
            now = sh.clock.now()
            if self._seq is not None and not self._stale and now - self._at < self.refresh_s:
                return self._seq
            self._stale = False
            self._at = now
            self._seq = self._compute(now)
            self.refreshes += 1
            return self._seq

    def _compute(self, now: float) -> tuple[bytes, ...]:
        """Under ``Shared.lock``."""
        view = self._view
        sh = view.shared
        first, ranked = [], []
        for t in sh.reg:
            if not t.keys:
                continue
            if t.paused_at is not None or (self.rank_writers and t.plan is not None):
                ranked.append((sh.key(t, now), t))
            elif t.resumed_at is not None and now - t.resumed_at >= view.release_after_s:
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


class OversizeVictims:
    """The store's host victim order under a forecast schedule by default:
    contexts larger than the whole host tier give up their frames first
    while they run (their writes; a finished one never comes back).

    Such a context can never be served from DRAM whole, so letting its write
    push out the pauses that do fit (the store's LRU would) trades several
    whole-DRAM resumes for one that is partly from NVMe either way.  So its
    own blocks are the first host victims, its context's end first (a write
    of it takes the free frames, then its own blocks written before give way:
    its overflow goes to NVMe); the largest such context goes first.  A block it
    shares with a trajectory that fits (a common prompt prefix) is not named.
    Everything else is evicted by the store's LRU, as without an order; a
    paused oversize context is the controller's to move: its stagings (the
    pause's own, retries, restores, the policy's timed ones) may displace
    pauses expected back later, as any staging does.

    Recomputed lazily after an engine call changed the registry (one pass
    over the trajectories; a pass over their keys only while an oversize one
    exists) and kept while nothing changed.  Locks: as
    :class:`ForecastVictims` (store lock -> ``Shared.lock``).
    """

    def __init__(self, view: VictimView) -> None:
        self._view = view
        self._seq: tuple[bytes, ...] | None = None
        self._stale = True
        self.refreshes = 0

    def invalidate(self) -> None:
        """Something the order depends on changed (lock-free: a flag)."""
        self._stale = True

    def __call__(self) -> Sequence[bytes] | None:
        """A new list per call: the store skips the head of an order it saw
        before as already out of host frames, but a writer's own keys enter
        host frames after the order was computed."""
        seq = self._compute()
        return None if seq is None else list(seq)

    def _compute(self) -> tuple[bytes, ...] | None:
        view = self._view
        with view.shared.lock:
            if not self._stale:
                return self._seq
            self._stale = False
            self.refreshes += 1
            reg = view.shared.reg
            big = [t for t in reg if t.keys and t.paused_at is None and view.oversize(t)]
            if not big:
                self._seq = None
                return None
            fits: set[bytes] = set()
            for t in reg:
                if t.keys and not view.oversize(t):
                    fits.update(t.keys)
            out: list[bytes] = []
            seen: set[bytes] = set()
            for t in sorted(big, key=lambda t: -len(t.keys)):
                for k in reversed(t.keys):
                    if k not in fits and k not in seen:
                        seen.add(k)
                        out.append(k)
            self._seq = tuple(out) if out else None
            return self._seq
