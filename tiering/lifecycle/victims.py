"""Host-frame victims at write time: the store's eviction order under a forecast schedule.

A host write that finds no free frame makes the store evict.  By default the
store evicts by recency (its LRU).  Under a forecast schedule the controller
installs an :class:`OversizeVictims` on the store
(``TieredStore.set_host_victim_order``): a context larger than the whole host
tier gives up its own frames first while it runs, so its write never pushes
out the pauses that fit; whatever the order does not name goes by recency.

The order is computed lazily, when the store asks for it and an engine call
marked it stale, and kept until then.

What an order sees of the controller is a :class:`VictimView` (the store
moves implement it): the core's :class:`~.shared.Shared` view (registry,
lock, clock), and whether a context is larger than the host tier.

Locks: the store asks for the order before it takes its own lock (a write
that may evict reads it first and keeps that snapshot: ``BlockStore.set_host_victim_order``);
the order takes ``Shared.lock`` and never calls the store.  So the
controller's lock is never taken while the store's is held.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, Sequence

if TYPE_CHECKING:
    from .registry import Trajectory
    from .shared import Shared


class VictimView(Protocol):
    """What a victim order uses (see the module doc)."""

    shared: "Shared"

    def oversize(self, t: "Trajectory") -> bool:
        """``t``'s context is larger than the whole host tier (lock held)."""
        ...


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
    exists) and kept while nothing changed.  Called by a store writer with no
    store lock held; takes ``Shared.lock`` (see the module doc).
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
        """The order now (None: the LRU).  The store reads it as a new list at
        each eviction batch (it skips the head of an order it saw before as
        already out of host frames, but a writer's own keys enter host frames
        after the order was computed)."""
        return self._compute()

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
