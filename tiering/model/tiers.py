"""The policy's words for "where KV is": the tier enum (one, :mod:`kvtier.util.tiers`, shared
with the store) and what a lease end does (:class:`Move`).

Dependency-free (``enum`` and the neutral enum only), so the policy's :class:`~kvtier.tiering.model.decision.Action`,
the lifecycle's plans and the engine plugins name a tier the same way, from a
hint to a store write::

    Action.tier:   retain -> DEVICE   offload_host -> HOST   offload_nvme -> NVME   recompute -> None
    Tier.stored:   DEVICE -> HOST (a holder without a device tier keeps a retain
                   in host frames: a copy below HBM is the cheap kind), else itself

The members are ``str`` values ("device", "host", "nvme", "remote"), so a store that
takes a tier name (``BlockStore.put(..., tier="host")``) takes a ``Tier``.
"""
from __future__ import annotations

import enum

from kvtier.util.tiers import Tier

__all__ = ["Tier", "Move"]


class Move(str, enum.Enum):
    """What a lease end does to a paused trajectory's blocks."""
    KEEP = "keep"       # stay where they are (host frames: bring back what was pushed out)
    DEMOTE = "demote"   # host -> NVMe
    DROP = "drop"       # forget them: recompute at the resume

    def __str__(self) -> str:
        return self.value
