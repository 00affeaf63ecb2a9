"""What the lifecycle controller asks of a plugin that keeps paused KV in its
own device memory and runs its own device reload (the HF hook): the policy's
view of a pause, the device side of a lease end, the reload at its time.

The engines (vLLM, SGLang) free a finished request's device blocks
themselves, so they pass no hooks; the HF hook's retain keeps the cache on
the device through a pause, so a lease end there is the hook's move.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from kvtier.tiering.model.decision import Action, Decision, PauseContext
from kvtier.tiering.model.tiers import Move, Tier

from .registry import Trajectory


@dataclass(frozen=True)
class LeaseEnd:
    """A lease that ended, as the controller tells its :class:`DeviceHooks`:
    ``move`` is the schedule's answer (a :class:`Move`), ``action``
    the policy's new action (None: it kept the placement), ``decision`` the
    pause's decision now; ``where`` is where the controller left the blocks
    (``Tier.DEVICE``: untouched, the plugin moves them; None: nowhere) after moving
    ``moved_blocks`` blocks itself."""

    tid: str
    pause_no: int
    elapsed_s: float
    move: Move
    action: Action | None
    decision: Decision | None
    where: Tier | None
    moved_blocks: int
    timers: tuple = ()     # the schedule's new timers, (seconds after the pause, Event)


class DeviceHooks(Protocol):
    """What a plugin that keeps paused KV in its own device memory and runs its
    own device reload (the HF hook) does for the controller.  ``context`` is
    called under the controller's lock (it must not call the controller);
    ``leased`` and ``reload`` on the thread that runs :meth:`tick` /
    :meth:`settle`, outside that lock (they may call the controller)."""

    def context(self, traj: Trajectory, base: PauseContext) -> PauseContext:
        """The PauseContext a policy should see for ``traj`` (``base``: the controller's)."""
        ...

    def leased(self, end: LeaseEnd) -> Tier | None:
        """A lease of one of the plugin's pauses ended; carry out the device side
        (HBM -> host / NVMe / drop for ``Tier.DEVICE``) and return where the
        blocks are now (None: nowhere, dropped)."""
        ...

    def reload(self, tid: str, pause_no: int, at_s: float) -> None:
        """A ``Event.RELOAD`` timer (``at_s`` seconds after the pause) is due: start the device reload."""
        ...
