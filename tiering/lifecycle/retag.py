"""A pause's tool learned late: which correction applies, and what it does.

A router in front of the engine forwards a *forecast* of the tool the
trajectory's next pause waits on (docs/conversation-hints.md); the true tool
is named in the response, which the router parses while it streams (or once
it ends).  When the two differ it tells the engine, and the controller's
:meth:`~.core.ControllerCore.retag` corrects the trajectory's tool::

    the retag lands ...                 outcome     what the controller does
    --------------------------------    ---------   --------------------------------------------
    before the response ended           NOTED       sets the tool and drops a plan made on the
      (the pause has not started)                   forecast: the next store job or the pause's
                                                    start plans on the true tool
    after it ended (paused)             REPLANNED   sets the tool, cancels the forecast plan's
                                                    timers, plans again (timers from the pause's
                                                    start; blocks move as at a pause: an NVMe
                                                    plan demotes, a host plan stages back)
    for a trajectory it does not know   UNKNOWN     nothing
    naming a forecast it was not told   STALE       nothing (the trajectory moved on: its next
                                                    request came first, with another tool)
    a second one in the same pause      REPEATED    nothing (one correction per pause: a flood
                                                    of retags costs a lookup each)
    naming the tool it already has      SAME        nothing

Either way the resume learns the wait under the tool the trajectory has
then: the true one once a retag applied.  A pause held in a plugin's device
memory (``Tier.DEVICE``) keeps its holder's placement; only its plan changes.
"""
from __future__ import annotations

import enum

from .registry import Trajectory


class Retagged(str, enum.Enum):
    """What a retag did (see the module doc); counted as ``retag:<value>``."""

    NOTED = "noted"
    REPLANNED = "replanned"
    UNKNOWN = "unknown"
    STALE = "stale"
    REPEATED = "repeated"
    SAME = "same"

    def __str__(self) -> str:
        return self.value

    @property
    def applied(self) -> bool:
        return self in (Retagged.NOTED, Retagged.REPLANNED)


def outcome(t: Trajectory | None, tool: str, forecast: str) -> Retagged:
    """Which correction a retag of ``t`` to ``tool``, told ``forecast``, is (lock held)."""
    if t is None:
        return Retagged.UNKNOWN
    if t.tool == tool:
        return Retagged.SAME
    if t.tool != forecast:
        return Retagged.STALE
    if t.retagged == t.pause_no:
        return Retagged.REPEATED
    return Retagged.NOTED if t.paused_at is None else Retagged.REPLANNED
