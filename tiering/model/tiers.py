"""The one vocabulary for "where KV is": the tier a placement puts blocks in.

Dependency-free (``enum`` only), so the policy's :class:`~kvtier.tiering.model.decision.Action`,
the lifecycle's plans and the engine plugins name a tier the same way, from a
hint to a store write::

    Action.tier:   retain -> DEVICE   offload_host -> HOST   offload_nvme -> NVME   recompute -> None
    Tier.stored:   DEVICE -> HOST (a holder without a device tier keeps a retain
                   in host frames: a copy below HBM is the cheap kind), else itself

The members are ``str`` values ("device", "host", "nvme"), so a store that
takes a tier name (``BlockStore.put(..., tier="host")``) takes a ``Tier``.
"""
from __future__ import annotations

import enum

__all__ = ["Tier", "Move"]


class Tier(str, enum.Enum):
    """Where a placement keeps a paused trajectory's KV."""
    DEVICE = "device"   # the engine's own memory (HBM): kept through the wait
    HOST = "host"       # host DRAM frames below it
    NVME = "nvme"       # the NVMe tier

    def __str__(self) -> str:
        return self.value

    @property
    def stored(self) -> "Tier":
        """The tier a holder without a device tier of its own (the engines' store)
        writes for this placement: ``DEVICE`` is kept in host frames."""
        return Tier.HOST if self is Tier.DEVICE else self


class Move(str, enum.Enum):
    """What a lease end does to a paused trajectory's blocks."""
    KEEP = "keep"       # stay where they are (host frames: bring back what was pushed out)
    DEMOTE = "demote"   # host -> NVMe
    DROP = "drop"       # forget them: recompute at the resume

    def __str__(self) -> str:
        return self.value
