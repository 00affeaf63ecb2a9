"""Transfers as plain data.

A transfer names a source endpoint and locations and a destination endpoint and
locations; it carries no tensors, no streams and no file descriptors, so a
planner can emit transfers without importing CUDA.  A mover per
(source, destination) pair executes them (see :mod:`kvtier.dma.movers`).

    DEVICE   blocks of an engine KV layout, addressed by (layout name, block ids)
    STAGING  staging frames of a :class:`kvtier.dma.staging.FramePool`, by frame id
    STORE    blocks of a :class:`kvtier.store.protocol.BlockStore` (a TieredStore), by content key

    device --D2H--> staging --put--> store     (offload; store tier host or nvme)
    device <--H2D-- staging <--get-- store     (reload, in layer groups)

The endpoints are not tiers (:class:`~kvtier.util.tiers.Tier`): staging frames are the
movers' own pinned buffers, not the store's host tier, and the store holds its blocks in
whichever of its tiers :attr:`StoreBlocks.tier` names.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Union

from kvtier.util.tiers import Tier


class Endpoint(str, enum.Enum):
    """What a transfer's source or destination is (one mover per pair)."""
    DEVICE = "device"     # engine KV blocks (GPU memory; CPU tensors without CUDA)
    STAGING = "staging"   # dma staging frames (pinned host memory when CUDA is present)
    STORE = "store"       # the tiered store (its own host tier or NVMe tier)

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class DeviceBlocks:
    """Blocks ``block_ids`` of the device layout registered as ``layout``."""

    layout: str
    block_ids: tuple[int, ...]
    endpoint: Endpoint = field(default=Endpoint.DEVICE, init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "block_ids", tuple(int(b) for b in self.block_ids))
        if any(b < 0 for b in self.block_ids):
            raise ValueError(f"device block ids must be >= 0, got {self.block_ids}")


@dataclass(frozen=True)
class HostFrames:
    """Staging frames ``frame_ids`` of the mover's frame pool."""

    frame_ids: tuple[int, ...]
    endpoint: Endpoint = field(default=Endpoint.STAGING, init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "frame_ids", tuple(int(f) for f in self.frame_ids))
        if any(f < 0 for f in self.frame_ids):
            raise ValueError(f"frame ids must be >= 0, got {self.frame_ids}")


@dataclass(frozen=True)
class StoreBlocks:
    """Blocks of the tiered store, by content key.

    ``tier`` is where a store-bound transfer should land (``Tier.HOST`` or ``Tier.NVME``,
    or its name); loads ignore it (the store knows where each key lives).
    """

    keys: tuple[bytes, ...]
    tier: Tier = Tier.HOST
    endpoint: Endpoint = field(default=Endpoint.STORE, init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "keys", tuple(bytes(k) for k in self.keys))
        if self.tier not in (Tier.HOST, Tier.NVME):
            raise ValueError(f"store tier must be 'host' or 'nvme', got {self.tier!r}")
        object.__setattr__(self, "tier", Tier(self.tier))


Location = Union[DeviceBlocks, HostFrames, StoreBlocks]


@dataclass(frozen=True)
class TransferSpec:
    """Move ``src`` to ``dst`` element-wise (i-th source block -> i-th destination).

    ``layer_groups``: for transfers into DEVICE, complete the load in this many
    groups of consecutive layers, each with its own completion event, so an
    engine can start on the first layers while the rest stream in.
    """

    src: Location
    dst: Location
    layer_groups: int = 1

    def __post_init__(self) -> None:
        n_src, n_dst = _count(self.src), _count(self.dst)
        if n_src != n_dst:
            raise ValueError(f"transfer source has {n_src} blocks but destination has {n_dst}")
        if self.layer_groups < 1:
            raise ValueError(f"layer_groups must be >= 1, got {self.layer_groups}")

    @property
    def pair(self) -> tuple[Endpoint, Endpoint]:
        return (self.src.endpoint, self.dst.endpoint)

    @property
    def num_blocks(self) -> int:
        return _count(self.src)


def _count(loc: Location) -> int:
    if isinstance(loc, DeviceBlocks):
        return len(loc.block_ids)
    if isinstance(loc, HostFrames):
        return len(loc.frame_ids)
    if isinstance(loc, StoreBlocks):
        return len(loc.keys)
    raise TypeError(f"not a transfer location: {type(loc).__name__}")


@dataclass(frozen=True)
class JobResult:
    """One finished transfer, as returned by ``Mover.get_finished()``.

    ``ok`` is False when the transfer failed (``error`` says why) or, for a
    load from the store, when any block was missing or corrupt (``missing``
    lists those keys); the destination must then be treated as garbage.
    """

    job_id: int
    ok: bool
    nbytes: int
    seconds: float
    error: str = ""
    missing: tuple[bytes, ...] = ()
