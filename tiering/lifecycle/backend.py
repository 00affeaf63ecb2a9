"""The moves a lifecycle backend makes: the interface the core holds.

:class:`~.core.ControllerCore` decides *when* (a pause, a due timer, a lease
answer); a :class:`Moves` decides *what that does* to the blocks.  Two
implement it::

    StoreMoves  synchronous BlockStore calls (the engines, the HF hook): moves.py
    SimMoves    timed transfers on the simulator's FIFO servers: bench/sim/lifecycle.py

Each is built over the core's :class:`~.shared.Shared` view and holds its own
fields.  Threading: the methods marked "lock held" run under the core's lock
(``Shared.lock``) and must not call the store or block; the others run
without it, one move at a time (the core's ``_io`` lock), on a kvtier thread
or the simulator's.
"""
from __future__ import annotations

from typing import Protocol

from kvtier.tiering.model.tiers import Tier

from .registry import Event, Trajectory
from .schedules import LeaseOutcome


class Moves(Protocol):
    """What a backend does with a pause's blocks (see the module doc)."""

    def pause_moves(self, t: Trajectory, tier: Tier | None, now: float) -> None:
        """At a pause, before the plan's timers (lock held): moves to arm for where
        the blocks were put (``tier``; None: nowhere)."""
        ...

    def lease_applies(self, t: Trajectory, evicted: bool) -> bool:
        """Whether a due lease of paused ``t`` is asked at all (lock held)."""
        ...

    def arm_lease(self, t: Trajectory, out: LeaseOutcome) -> None:
        """Arm a lease answer's timers (lock held, before :meth:`lease_move`)."""
        ...

    def lease_move(self, t: Trajectory, where: Tier | None, out: LeaseOutcome, evicted: bool) -> int:
        """Carry out a lease answer (``where``: where ``t`` was when asked).  Returns blocks moved."""
        ...

    def arm_return(self, t: Trajectory, timers: tuple[tuple[float, Event], ...]) -> None:
        """Arm an eviction's way back (lock held)."""
        ...

    def demote(self, t: Trajectory, why: str, *, limit: int | None = None) -> int:
        """Host -> NVMe: ``t``'s blocks (``limit``: at most that many).  Returns blocks moved."""
        ...

    def stage(self, t: Trajectory) -> None:
        """NVMe -> host frames for ``t``'s blocks not there now."""
        ...

    def drop(self, t: Trajectory, why: str) -> None:
        """Forget ``t``'s blocks."""
        ...

    def watermarks(self) -> None:
        """Every tick, after the due timers: the backend's own upkeep."""
        ...
