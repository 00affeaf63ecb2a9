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

    remote: Any      # the shared remote tier, or None when the store has none (read-only)

    # -- one-shot --------------------------------------------------------
    def put(self, key: bytes, data: Any, *, namespace: Any = None, tier: str | None = None) -> bool:
        """Store one block.  False if it was already stored or is in flight.
        Raises: BadKey, BadBuffer, StoreFull/DiskFull (no room; nothing evicted), StoreClosed."""
        ...

    def put_many(self, keys: Sequence[bytes], datas: Sequence[Any], *, namespace: Any = None,
                 tier: str | None = None) -> int:
        """Batch ``put``; returns how many were newly stored.
        Raises: as ``put``, and ValueError when the lengths differ; all-or-nothing on raise."""
        ...

    def get(self, key: bytes, out: Any) -> bool:
        """Copy a block into ``out``.  False on a miss (unknown, corrupt or unreadable:
        ``out`` is then zeroed).  Raises: BadKey, BadBuffer, StoreClosed."""
        ...

    def get_many(self, keys: Sequence[bytes], outs: Sequence[Any]) -> list[bool]:
        """Batch ``get``; one bool per key (``get_many_served``'s answer is not None).
        Raises: as ``get``, and ValueError when the lengths differ (nothing was read)."""
        ...

    def get_many_served(self, keys: Sequence[bytes], outs: Sequence[Any]) -> list[Any]:
        """Batch ``get`` naming, per key, the tier that served it (a
        ``kvtier.util.tiers.Tier``: ``HOST``, ``NVME``, or ``REMOTE`` in a store
        with a remote tier); None a miss (unknown, corrupt or unreadable: its
        ``out`` is then zeroed).  The tier is the one the bytes were read from
        in this call, not a query made before it.  Any thread, several at once.
        Raises: BadKey, BadBuffer, StoreClosed, and ValueError when the lengths
        differ (nothing was read)."""
        ...

    # -- queries (no side effects) ----------------------------------------
    def contains(self, key: bytes) -> bool:
        """True if the block is stored and readable now.  Raises: BadKey, StoreClosed."""
        ...

    def lookup(self, keys: Sequence[bytes]) -> int:
        """Length of the longest stored prefix of ``keys``.  Raises: BadKey, StoreClosed."""
        ...

    def where(self, key: bytes) -> frozenset:
        """The tiers holding the block now (empty if none).  Raises: BadKey, StoreClosed."""
        ...

    def host_mask(self, keys: Sequence[bytes]) -> list[bool]:
        """For each key, whether its block is in the host tier now (one query for many keys).
        Raises: BadKey, StoreClosed."""
        ...

    def host_frames(self) -> HostFramesLike:
        """The host tier's frames (total, used) and the demotions so far, without ``stats()``'s scan.
        Raises: StoreClosed."""
        ...

    # -- two-phase ----------------------------------------------------------
    def prepare_store(self, keys: Sequence[bytes], *, namespace: Any = None,
                      tier: str | None = None) -> PrepareStoreLike:
        """Reserve buffers for blocks the caller fills; invisible until ``complete_store``.
        Raises: BadKey, StoreFull (nothing evicted), StoreClosed."""
        ...

    def complete_store(self, handle: int, success: bool = True) -> int:
        """Publish (or discard) a prepared store; returns how many became visible.
        Raises: BadHandle, StoreFull/DiskFull, StoreIOError (the job's blocks are then
        discarded; nothing stored before is lost), StoreClosed."""
        ...

    def prepare_load(self, keys: Sequence[bytes]) -> PrepareLoadLike:
        """Pin and expose the longest loadable prefix of ``keys`` until ``complete_load``.
        Raises: BadKey, StoreClosed (nothing stays pinned)."""
        ...

    def complete_load(self, handle: int) -> None:
        """Unpin a prepared load.  Raises: BadHandle, StoreClosed."""
        ...

    # -- lifetime control ---------------------------------------------------
    def pin(self, keys: Sequence[bytes]) -> int:
        """Protect stored blocks from eviction; pins nest.  Returns how many were pinned.
        Raises: BadKey, StoreClosed."""
        ...

    def unpin(self, keys: Sequence[bytes]) -> None:
        """Undo one ``pin`` per key (also of a block dropped while pinned: that
        releases its space).  Raises: StoreError for a key with no pin (keys before it
        were unpinned), BadKey, StoreClosed."""
        ...

    def demote(self, keys: Sequence[bytes], keep_host: bool = False) -> int:
        """Write host blocks to the tier below; returns how many moved down.
        Raises: BadKey, StoreClosed, StoreFull/DiskFull/StoreIOError (no block changed tier)."""
        ...

    def drop(self, keys: Sequence[bytes]) -> int:
        """Forget blocks in every tier (a pinned one frees its space at its last unpin);
        returns how many were dropped.  Raises: BadKey, StoreClosed, StoreError (the index
        commit failed: nothing was dropped)."""
        ...

    # -- books --------------------------------------------------------------
    def stats(self) -> Any:
        """Counters and occupancy (``kvtier.store.StoreStats``).  Raises: StoreClosed."""
        ...

    def check_integrity(self) -> Any:
        """Verify the books balance.  Raises: IntegrityError listing every problem, StoreClosed."""
        ...

    def close(self) -> None:
        """Wait for in-flight operations and release everything; idempotent.  Raises: nothing."""
        ...

    # -- victim order -------------------------------------------------------
    def set_host_victim_order(self, order: Callable[[], Sequence[bytes] | None] | None) -> None:
        """Choose host-frame victims by ``order`` instead of recency (None: LRU, the default).

        ``order()`` returns block keys, the one to give up its frame first
        first (e.g. a lifecycle controller's forecast), or None (LRU this
        time).  The store takes victims from it in that order, skipping keys
        not in host frames or pinned, then from the LRU for whatever it names
        too few of.  It is called once per write to the host tier
        (``put_many``, ``prepare_store``; ``tier`` None or host) on the
        writer's thread, *before* the store takes its lock -- never with the
        store's lock held -- and the store keeps what it returned for that write; so it may take its owner's own locks
        (the controller's), must be cheap (a precomputed sequence) and must
        not call the store.  An exception from it counts as None.
        Raises: nothing."""
        ...
