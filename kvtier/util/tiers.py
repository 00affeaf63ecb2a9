"""The one vocabulary for "where KV is", shared by the policy, the lifecycle, the engine plugins
and the store (``enum`` only, so every room may import it).

``DEVICE`` is the engine's own memory (what a policy's ``retain`` keeps), ``HOST`` the host
DRAM frames, ``NVME`` the NVMe slabs, ``REMOTE`` the shared remote tier.  The store holds
``HOST``, ``NVME`` and ``REMOTE``; a placement on ``DEVICE`` is stored as :attr:`Tier.stored`
(host frames) by a holder without a device tier of its own.  The members are ``str`` values, so
a call that takes a tier name (``BlockStore.put(..., tier="host")``) takes a ``Tier``.
"""
from __future__ import annotations

import enum

__all__ = ["Tier"]


class Tier(str, enum.Enum):
    """Where blocks are, or where a placement puts them."""
    DEVICE = "device"   # the engine's own memory (HBM): kept through the wait
    HOST = "host"       # host DRAM frames
    NVME = "nvme"       # the NVMe slabs
    REMOTE = "remote"   # the shared remote tier (store/remote), when ``remote_url`` is set

    def __str__(self) -> str:
        return self.value

    @property
    def stored(self) -> "Tier":
        """The tier a holder without a device tier of its own (the engines' store) writes
        for this placement: ``DEVICE`` is kept in host frames."""
        return Tier.HOST if self is Tier.DEVICE else self
