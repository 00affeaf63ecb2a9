"""``BlockStore``: the contract every user of a block store codes against.

The movers (``kvtier.dma``), the HF hook and both engine plugins type their
store as ``BlockStore``; ``kvtier.store.TieredStore`` is the implementation.
This module imports nothing but ``typing`` (so a plugin can import the
contract without pulling in LMDB, numpy or torch); the result types are
described structurally here and implemented by ``kvtier.store.types``.

Keys are content addresses (1..64 bytes); a buffer is any C-contiguous
buffer-protocol object or contiguous CPU ``torch.Tensor`` of exactly
``block_bytes``.  Every method is thread-safe.  Every failure is a
``kvtier.store.StoreError`` subclass (``BadKey``/``BadBuffer`` also derive
from ``ValueError``); a method that raises stored nothing half-way and lost
nothing stored before.
"""
from __future__ import annotations

from typing import Any, Callable, Protocol, Sequence, runtime_checkable

__all__ = ["BlockStore", "StoreSlotLike", "LoadSlotLike", "PrepareStoreLike", "PrepareLoadLike", "HostFramesLike"]


class StoreSlotLike(Protocol):
    """A writable buffer to fill between ``prepare_store`` and ``complete_store``."""
    key: bytes
    buffer: memoryview


class LoadSlotLike(Protocol):
    """A read-only, verified block held until ``complete_load``; ``tier`` says where it was found."""
    key: bytes
    buffer: memoryview
    tier: Any


class PrepareStoreLike(Protocol):
    handle: int
    slots: tuple[StoreSlotLike, ...]      # blocks to fill, in request order
    skipped: tuple[bytes, ...]            # already stored or in flight


class PrepareLoadLike(Protocol):
    handle: int
    slots: tuple[LoadSlotLike, ...]       # the longest loadable prefix

    @property
    def hits(self) -> int: ...


class HostFramesLike(Protocol):
    total: int        # host frames in all
    used: int         # frames holding a block (or landing one)
    demotions: int    # blocks demoted to the tier below so far (a counter)


@runtime_checkable
class BlockStore(Protocol):
    """Content-addressed KV blocks in tiers (host DRAM, NVMe, optionally lower ones)."""

    # -- one-shot --------------------------------------------------------
    def put(self, key: bytes, data: Any, *, namespace: Any = None, tier: str | None = None) -> bool:
        """Store one block.  False if it was already stored or is in flight.
        Raises: BadKey, BadBuffer, StoreFull/DiskFull (no room; nothing evicted), StoreClosed."""
        ...

    def put_many(self, keys: Sequence[bytes], datas: Sequence[Any], *, namespace: Any = None,
                 tier: str | None = None) -> int:
        """Batch ``put`` (all-or-nothing on raise); returns how many were newly stored."""
        ...

    def get(self, key: bytes, out: Any) -> bool:
        """Copy a block into ``out``.  False on a miss (unknown, corrupt or unreadable:
        ``out`` is then zeroed).  Raises: BadKey, BadBuffer, StoreClosed."""
        ...

    def get_many(self, keys: Sequence[bytes], outs: Sequence[Any]) -> list[bool]:
        """Batch ``get``; one bool per key."""
        ...

    # -- queries (no side effects) ----------------------------------------
    def contains(self, key: bytes) -> bool:
        """True if the block is stored and readable now."""
        ...

    def lookup(self, keys: Sequence[bytes]) -> int:
        """Length of the longest stored prefix of ``keys``."""
        ...

    def where(self, key: bytes) -> frozenset:
        """The tiers holding the block now (empty if none)."""
        ...

    def host_mask(self, keys: Sequence[bytes]) -> list[bool]:
        """For each key, whether its block is in the host tier now (one query for many keys)."""
        ...

    def host_frames(self) -> HostFramesLike:
        """The host tier's frames (total, used) and the demotions so far, without ``stats()``'s scan."""
        ...

    # -- two-phase ----------------------------------------------------------
    def prepare_store(self, keys: Sequence[bytes], *, namespace: Any = None,
                      tier: str | None = None) -> PrepareStoreLike:
        """Reserve buffers for blocks the caller fills; invisible until ``complete_store``.
        Raises: BadKey, StoreFull (nothing evicted), StoreClosed."""
        ...

    def complete_store(self, handle: int, success: bool = True) -> int:
        """Publish (or discard) a prepared store; returns how many became visible.
        Raises: BadHandle, StoreFull/DiskFull, StoreIOError."""
        ...

    def prepare_load(self, keys: Sequence[bytes]) -> PrepareLoadLike:
        """Pin and expose the longest loadable prefix of ``keys`` until ``complete_load``."""
        ...

    def complete_load(self, handle: int) -> None:
        """Unpin a prepared load.  Raises: BadHandle."""
        ...

    # -- lifetime control ---------------------------------------------------
    def pin(self, keys: Sequence[bytes]) -> int:
        """Protect stored blocks from eviction; pins nest.  Returns how many were pinned."""
        ...

    def unpin(self, keys: Sequence[bytes]) -> None:
        """Undo one ``pin`` per key (also of a block dropped while pinned: that
        releases its space).  Raises: StoreError for a key with no pin."""
        ...

    def demote(self, keys: Sequence[bytes], keep_host: bool = False) -> int:
        """Write host blocks to the tier below; returns how many moved down."""
        ...

    def drop(self, keys: Sequence[bytes]) -> int:
        """Forget blocks in every tier (a pinned one frees its space at its last unpin)."""
        ...

    def set_host_victim_order(self, order: Callable[[], Sequence[bytes] | None] | None) -> None:
        """Take host-frame victims in ``order()``'s order (keys, the first to give up
        its frame first; None from it, or ``order`` None: by recency).  ``order`` is
        called with the store's lock held: it must be cheap, must not call the
        store, and may take only locks never held while calling the store; an
        exception from it counts as None.  Raises nothing."""
        ...

    # -- books --------------------------------------------------------------
    def stats(self) -> Any:
        """Counters and occupancy (``kvtier.store.StoreStats``)."""
        ...

    def check_integrity(self) -> Any:
        """Verify the books balance; raises IntegrityError listing every problem."""
        ...

    def close(self) -> None:
        """Wait for in-flight operations and release everything; idempotent."""
        ...
