"""Results and stats the store hands out: small immutable types.

``Tier`` names a tier; ``checksum`` is the per-block xxh3-64 (the same one the
slot headers and the index carry).  No behaviour lives here.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import xxhash

from kvtier.util.tiers import Tier


def checksum(buf) -> int:
    """The per-block checksum (xxh3-64) stored in the index."""
    return xxhash.xxh3_64_intdigest(buf)


@dataclass(frozen=True)
class StoreSlot:
    """A writable buffer the engine fills between prepare_store and complete_store."""
    key: bytes
    buffer: memoryview


@dataclass(frozen=True)
class PrepareStoreResult:
    handle: int
    slots: tuple[StoreSlot, ...]      # blocks to fill, in request order
    skipped: tuple[bytes, ...]        # already stored (or being stored): nothing to do


@dataclass(frozen=True)
class LoadSlot:
    """A read-only buffer holding a verified block until complete_load."""
    key: bytes
    buffer: memoryview
    tier: Tier


@dataclass(frozen=True)
class PrepareLoadResult:
    handle: int
    slots: tuple[LoadSlot, ...]       # the longest loadable prefix of the requested keys

    @property
    def hits(self) -> int:
        return len(self.slots)


@dataclass(frozen=True)
class HostFrames:
    """The host tier's occupancy (``TieredStore.host_frames``): cheap, no scan of the blocks."""
    total: int
    used: int
    demotions: int


@dataclass(frozen=True)
class StoreStats:
    block_bytes: int
    slot_bytes: int
    io_engine: str
    direct_io: bool
    host_pinned: bool
    host_frames_total: int
    host_frames_used: int
    host_blocks: int
    nvme_slots_total: int
    nvme_slots_used: int
    nvme_blocks: int
    nvme_full: bool
    index_map_bytes: int
    index_grows: int
    pinned_blocks: int
    puts: int
    hits_host: int
    hits_nvme: int
    misses: int
    demotions: int
    evictions_dropped: int
    corrupt_dropped: int
    promotions: int = 0            # NVMe blocks prepare_load landed in free host frames
    staging_fallbacks: int = 0     # staging requests the staging pool could not hold (fresh memory)
    staging_frames_total: int = 0
    staging_frames_used: int = 0
    frame_bytes: int = 0           # host frame / block-in-slot bytes (slot_bytes adds the header sector)
    index_rebuilds: int = 0        # times the index was set aside and rebuilt since open (at open included)
    blocks_recovered: int = 0      # blocks those rebuilds found in slot headers
    hits_remote: int = 0           # blocks served from the remote tier (store/remote)
    remote: dict | None = None     # RemoteStats.as_dict() of the remote tier; None without one

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class IntegrityReport:
    host_frames_total: int
    host_frames_free: int
    host_frames_used: int
    nvme_slots_total: int
    nvme_slots_free: int
    nvme_slots_used: int
    index_entries: int
    live_blocks: int

