"""Forgetting trajectories, so that a long-running engine's registry stays bounded.

An engine serves agents for days.  Every session it sees becomes a trajectory
in the controller's registry, which holds the session's block keys.  A
finished session never says that it is finished: it just stops coming back.
Without forgetting, the registry grows with every session ever served.
Measured on a real store: after 20,000 finished 64-block sessions it held
140 MiB, and one host write took 474 ms, because the store's host victim
order is recomputed over every trajectory's keys with the store's lock held.
The restores and the room-making walk the registry too.

:class:`Pruner` runs on the lifecycle thread (``tick``), at most once every
``every_s`` clock seconds, and forgets:

* a running trajectory untouched (no hint, block, pause or resume) for
  ``forget_after_s``, once none of its blocks is in host frames.  A finished
  session's frames are given up first (as victims, or released to a
  staging), so the host decisions never lose a trajectory that still holds
  DRAM.  Its blocks stay in the store, which moves them by recency from then
  on;
* past ``max_trajectories``: the running trajectories untouched longest
  first, whatever they hold, then the paused ones paused longest first (their
  timers go too, and the return of a forgotten pause feeds no wait back).

An id that comes back after being forgotten is a new trajectory: only the
blocks written from then on are its.

What it sees of the controller is a :class:`PruneView` (the store moves
implement it): the core's :class:`~.shared.Shared` view (registry under its
lock, clock), whether a running trajectory already gave up its host frames,
a host-frame lookup that steps aside for engine loads, and a forget.

Threading: :meth:`Pruner.run` is called with the controller's ``_io`` held.
It copies the registry under ``Shared.lock``, filters outside it, reads host
frames through ``host_mask``, and forgets under the lock only the
trajectories that were not touched meanwhile.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from .registry import Trajectory
    from .shared import Shared


class PruneView(Protocol):
    """What :meth:`Pruner.run` uses (see the module doc)."""

    shared: "Shared"

    def released(self, t: "Trajectory") -> bool:
        """Running ``t`` gave up all its host frames in its current run (lock held)."""
        ...

    def host_mask(self, keys: list[bytes]) -> list[bool]:
        """Which of ``keys`` are in host frames (no lock held)."""
        ...

    def forget_locked(self, tids: list[str]) -> None:
        """Forget ``tids`` (lock held)."""
        ...


class Pruner:
    """Forgets idle trajectories (see the module doc).  Raises ValueError for a
    negative ``forget_after_s`` or ``every_s``, or ``max_trajectories`` < 1."""

    check_per_run: int = 256     # idle trajectories whose host frames one run reads at most
    recheck_s: float = 60.0      # clock seconds before an idle one found holding host frames is read again

    def __init__(self, forget_after_s: float = 600.0, max_trajectories: int = 20_000,
                 every_s: float = 5.0) -> None:
        if not (forget_after_s >= 0 and every_s >= 0):
            raise ValueError(f"forget_after_s and every_s must be >= 0, got {forget_after_s!r}, {every_s!r}")
        if not isinstance(max_trajectories, int) or max_trajectories < 1:
            raise ValueError(f"max_trajectories must be an int >= 1, got {max_trajectories!r}")
        self.forget_after_s = float(forget_after_s)
        self.max_trajectories = max_trajectories
        self.every_s = float(every_s)
        self._last = -math.inf
        self._held: dict[str, float] = {}   # tid -> when it was last found holding host frames

    def run(self, view: PruneView) -> int:
        """Forget what is due, if ``every_s`` passed since the last run.  Returns
        how many trajectories were forgotten."""
        sh = view.shared
        now = sh.clock.now()
        if 0.0 <= now - self._last < self.every_s:    # (a clock behind the last run: set_clock, run now)
            return 0
        self._last = now
        with sh.lock:   # a snapshot: (trajectory, paused at, last touched)
            every = [(t, t.paused_at, t.seen_at) for t in sh.reg]
        running = sorted(((t, seen) for t, p, seen in every if p is None), key=lambda ts: ts[1])
        over = len(every) - self.max_trajectories
        picked: dict[str, tuple["Trajectory", float]] = {}
        held, checked = self._held, 0
        for t, seen in running:
            if now - seen < self.forget_after_s or checked >= self.check_per_run:
                break
            if now - held.get(t.tid, -math.inf) < self.recheck_s:
                continue          # it held host frames at a recent run: the younger ones get their turn
            with sh.lock:
                keys, released = list(t.keys), view.released(t)
            checked += 1
            if released or not keys or not any(view.host_mask(keys)):
                picked[t.tid] = (t, seen)
            else:
                held[t.tid] = now
        if over > len(picked):
            # the cap: running ones untouched longest first, then paused ones paused longest first
            paused = sorted(((t, p, seen) for t, p, seen in every if p is not None), key=lambda tps: tps[1])
            for t, seen in running + [(t, seen) for t, _, seen in paused]:
                if len(picked) >= over:
                    break
                if t.tid not in picked:
                    picked[t.tid] = (t, seen)
        if len(held) > 4 * self.check_per_run:    # entries of trajectories touched since, or long gone
            for tid in [tid for tid, at in held.items() if now - at >= self.recheck_s]:
                del held[tid]
        if not picked:
            return 0
        with sh.lock:
            # touched meanwhile (a hint, a block, a pause, a resume): kept
            gone = [tid for tid, (t, seen) in picked.items()
                    if sh.reg.get(tid) is t and t.seen_at == seen]
            view.forget_locked(gone)
        for tid in gone:
            held.pop(tid, None)
        return len(gone)
