"""TieredStore: content-addressed KV blocks in host DRAM and on NVMe.

Where a block lives::

    put(key, data) ──> host frame pool ──(evict LRU: demote)──> NVMe slab slot
          │                  ▲ (volatile)                        (durable, indexed in LMDB)
          └── host_bytes=0 or tier=NVME ────────────────────────────────┘

* The host tier is a cache in volatile memory; evicting a host-only block
  demotes it to NVMe when the NVMe tier has room (after evicting NVMe LRU
  blocks if needed) and drops it otherwise (KV state is recomputable).
* A block is on NVMe only once its bytes and its slot header were written and
  flushed *and then* its LMDB record committed; lookups never see a block
  before that.  On reopen the in-memory map and the free-slot map are loaded
  from the index in the background (``indexing.py``); a damaged index is set
  aside and rebuilt from the slot headers (``rebuild.py``).
* Every NVMe read is verified against the block's xxh3-64 checksum; a
  mismatch (or a failed read) is a miss: the block is dropped from the index,
  the caller's buffer is zeroed, corrupt bytes are never served.
* Pins (readers in ``get``, ``prepare_load`` handles, explicit ``pin``) keep a
  block from eviction; host frames are reference-counted (owner + each pin).

The store is composed: one part per concern (``parts.py`` lists them), each
handed the parts it uses.  This class validates input, holds the parts and
forwards to them.

Threads: every public method is thread-safe.  Metadata (the ``BlockTable``:
entries, LRUs, handles; the allocators; the index keeper's load state) is
owned by the store lock, ``BlockTable.lock``; copies and NVMe I/O run outside
it on pinned/pending entries -- demotion on eviction too (its blocks are
pinned while their frames are written; see ``Placement.demote``).  Threads
of its own: the index loader and, after damage, the index rebuilder
(``indexing.py``), the hashing threads (``blockio.py``).  ``close()`` waits
for in-flight operations.

Lock order: store lock -> the index keeper's lock -> the index's write lock.
A host victim order (:meth:`TieredStore.set_host_victim_order`) is read
*before* the store lock is taken, by a write that may evict (``put_many``,
``prepare_store``); under the lock the store reads that snapshot
(:class:`VictimSnapshot`) and calls no one, so an order may take its owner's
locks without ever nesting them inside the store's.  The root's ``LOCK``
file (flock) is held from open to close.
"""
from __future__ import annotations

import fcntl
import logging
import os
from typing import Callable, Mapping, Sequence

from aiofiles.os import wrap as aio_wrap

from .config import StoreConfig
from .entry import MAX_KEY_BYTES, NO_NAMESPACE, Entry, check_buffer, check_buffers, check_key, check_keys, \
    check_namespace
from .errors import RootLocked, StoreError
from .events import EventHub
from .index_setup import offline_rebuild
from .parts import StoreParts, open_parts
from .types import (HostFrames, IntegrityReport, LoadSlot, PrepareLoadResult, PrepareStoreResult, StoreSlot,
                    StoreStats, Tier, checksum)

log = logging.getLogger(__name__)

__all__ = ["TieredStore", "StoreParts", "use_remote_store", "Tier", "StoreStats", "IntegrityReport",
           "PrepareStoreResult", "PrepareLoadResult", "StoreSlot", "LoadSlot", "checksum", "MAX_KEY_BYTES",
           "NO_NAMESPACE"]

# What ``TieredStore.open`` builds for a config with ``remote_url``: installed by
# the package (``store/__init__.py``), so this module never imports the remote
# store, which builds on it.
_remote_store: Callable[[StoreConfig], "TieredStore"] | None = None


def use_remote_store(factory: Callable[[StoreConfig], "TieredStore"] | None) -> None:
    """Make ``TieredStore.open`` call ``factory(config)`` for a config with a
    ``remote_url`` (None: such a config raises ``StoreError``).  Any thread,
    before the stores it concerns are opened."""
    global _remote_store
    _remote_store = factory


class VictimSnapshot:
    """A host victim order as last read outside the store lock.

    ``refresh()`` calls the order (a writer's thread, store lock NOT held; an
    exception counts as None, the LRU); ``__call__`` is what the store's
    placement reads under its lock: a new list of the snapshot's keys each
    time (the placement walks a list it has not seen from its head), or None.
    It calls nothing and takes no lock.  A snapshot written by one writer and
    read by another is as current as the order was at either's start."""

    def __init__(self, order: Callable[[], Sequence[bytes] | None]) -> None:
        self._order = order
        self._seq: Sequence[bytes] | None = None

    def refresh(self) -> None:
        try:
            self._seq = self._order()
        except Exception as exc:
            log.debug("host victim order failed (%s): LRU this time", exc)
            self._seq = None

    def __call__(self) -> list[bytes] | None:
        seq = self._seq
        return None if seq is None else list(seq)


class TieredStore:
    """See the module docstring.  Create with :meth:`open`; use as a context manager."""

    remote = None    # the shared remote tier (a RemoteTieredStore's, store/remote/store.py); None: none

    # ---------------------------------------------------------------- open/close
    def __init__(self, config: StoreConfig) -> None:
        self.config = cfg = config
        self.events = EventHub()         # KV-event listeners (store/events.py); none by default
        root = cfg.root_path
        root.mkdir(parents=True, exist_ok=True)
        self._lockfd = os.open(root / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lockfd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lockfd)
            raise RootLocked(f"{root} is in use by another open TieredStore") from None
        try:
            self._parts = p = open_parts(cfg, self.events)
        except BaseException:
            os.close(self._lockfd)   # releases the flock
            raise
        self._table, self._keeper, self._placement = p.table, p.keeper, p.placement
        self._jobs, self._oneshot, self._lifetime, self._books = p.jobs, p.oneshot, p.lifetime, p.books
        # the parts a subclass (store/remote/store.py) uses, by these names (_entries: read only)
        self._pool, self._nvme, self._lock, self._counters = p.pool, p.nvme, p.table.lock, p.table.counters
        self._entries: Mapping[bytes, Entry] = p.table.mapping()
        self._victims: VictimSnapshot | None = None    # set_host_victim_order's, read before a write locks
        self._table.open()
        self._keeper.start()

    @classmethod
    def open(cls, config: StoreConfig) -> "TieredStore":
        """Open (creating if needed) the store at ``config.root``.

        A damaged index is set aside (``index.corrupt-<time>``) and rebuilt from
        the slot headers (one WARNING); the index's records are loaded in the
        background, so open costs the same at any size.

        Raises ``RootLocked`` if another open store holds the root,
        ``ConfigMismatch`` if the root has another block layout, ``OldLayout``
        if it was written by a previous on-disk format, ``StoreError`` if a
        required feature (io_uring, O_DIRECT, pinning) was forced and is missing
        or the root cannot be read or written.
        With ``config.remote_url`` it is a ``RemoteTieredStore`` (store/remote/store.py).
        """
        make: Callable[[StoreConfig], TieredStore] = cls
        if config.remote_url is not None and cls is TieredStore:
            if _remote_store is None:
                raise StoreError("remote_url is set but no remote store is installed (kvtier.store.remote)")
            make = _remote_store
        try:
            return make(config)
        except StoreError:
            raise
        except OSError as exc:
            raise StoreError(f"{config.root}: cannot open the store: {exc}") from None

    @classmethod
    def rebuild(cls, config: StoreConfig, progress=None):
        """Set the index of a closed store aside and rebuild it from the slot
        headers (``kvtier store rebuild``).  ``progress(done, total)`` is called
        as slots are scanned.  Returns the scan's ``rebuild.ScanResult``.
        Raises ``RootLocked`` if the store is open, ``OldLayout``, ``StoreError``."""
        return offline_rebuild(config, progress)

    def __enter__(self) -> "TieredStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Wait for in-flight operations, persist access times, release everything.
        Idempotent.  Outstanding prepare_* handles are abandoned (stores not completed
        are discarded)."""
        table = self._table
        with table.lock:
            if not table.shut():
                return
            self._keeper.stop()
            table.wait_idle()
            table.changed.notify_all()
        self._keeper.join()
        with table.lock:
            try:
                self._keeper.persist(table.touched())
            except StoreError as exc:
                log.warning("could not persist access times: %s", exc)
            self._close_parts()

    def _close_parts(self) -> None:
        self._parts.close(self.config)
        os.close(self._lockfd)  # releases the flock

    @property
    def closed(self) -> bool:
        return self._table.closed

    @property
    def parts(self) -> StoreParts:
        """The store's parts (see the module doc), for tools and white-box tests;
        the store itself never needs it."""
        return self._parts

    # ---------------------------------------------------------------- validation
    def _check_open(self) -> None:
        self._table.check_open()

    _key = staticmethod(check_key)
    _ns = staticmethod(check_namespace)

    def _buf(self, obj, writable: bool, what: str) -> memoryview:
        return check_buffer(obj, self.config.block_bytes, writable, what)

    def _views(self, objs: Sequence, writable: bool, what: str) -> tuple[list[memoryview], list[int]]:
        return check_buffers(objs, self.config.block_bytes, writable, what)

    # ---------------------------------------------------------------- put / get
    def put(self, key, data, *, namespace=None, tier=None) -> bool:
        """Store one block (``data``: exactly ``block_bytes``, any buffer-protocol object).

        Goes to the host tier (or straight to NVMe if ``host_bytes=0`` or
        ``tier="nvme"``).  Returns False if the key was already stored or is
        being stored (content-addressed: same key, same bytes).  Raises
        ``BadKey``/``BadBuffer`` for bad input, ``StoreFull``/``DiskFull`` when
        no room can be made, ``StoreClosed`` after close.  On any raise nothing
        was stored and nothing stored before was lost.
        """
        return self.put_many([key], [data], namespace=namespace, tier=tier) == 1

    def put_many(self, keys: Sequence, datas: Sequence, *, namespace=None, tier=None) -> int:
        """Batch ``put``; blocks of one call get contiguous NVMe slots where possible
        (coalesced I/O).  Returns how many were newly stored.  All-or-nothing on raise."""
        if len(keys) != len(datas):
            raise ValueError(f"{len(keys)} keys but {len(datas)} buffers")
        ks = check_keys(keys)
        srcs, src_addrs = self._views(datas, False, "data")
        self._read_victim_order(tier)
        return self._oneshot.put_many(ks, srcs, src_addrs, self._ns(namespace), tier)

    def get(self, key, out) -> bool:
        """Copy a block into ``out`` (writable, exactly ``block_bytes``).

        Returns False on a miss -- unknown key, or an NVMe copy whose checksum
        fails or cannot be read (that block is then dropped and ``out`` zeroed).
        Raises ``BadKey``/``BadBuffer``/``StoreClosed``.
        """
        return self.get_many([key], [out])[0]

    def get_many(self, keys: Sequence, outs: Sequence) -> list[bool]:
        """Batch ``get``: per key, whether it was served (``get_many_served``'s
        answer is not None).  Raises as ``get_many_served``."""
        return [t is not None for t in self.get_many_served(keys, outs)]

    def get_many_served(self, keys: Sequence, outs: Sequence) -> list[Tier | None]:
        """Batch ``get`` that names, per key, the tier that served it:
        ``Tier.HOST`` (a host-frame copy), ``Tier.NVME`` (an NVMe read whose
        checksum held) or, in a store with a remote tier, ``Tier.REMOTE``;
        None a miss (``out`` zeroed where a read failed).  NVMe reads of
        contiguous slots are coalesced, and a mixed batch's DRAM copies run
        while its NVMe reads are in flight.  Any caller thread.
        Raises: ValueError when the lengths differ (nothing was read),
        ``BadKey``/``BadBuffer``, ``StoreClosed``."""
        if len(keys) != len(outs):
            raise ValueError(f"{len(keys)} keys but {len(outs)} buffers")
        ks = check_keys(keys)
        dsts, dst_addrs = self._views(outs, True, "out")
        return self._oneshot.get_many(ks, dsts, dst_addrs)

    # ---------------------------------------------------------------- two-phase
    def prepare_store(self, keys: Sequence, *, namespace=None, tier=None) -> PrepareStoreResult:
        """Reserve space for blocks the engine will fill (e.g. by DMA).

        Keys already stored or in flight are ``skipped``.  Host tier: the buffers
        are host frames (pinned memory when CUDA is present).  NVMe tier: aligned
        staging memory written to NVMe at ``complete_store``.  Reserved blocks are
        invisible until ``complete_store(handle, success=True)``.
        Raises ``StoreFull`` when no room can be made, ``BadKey``, ``StoreClosed``.
        """
        self._read_victim_order(tier)
        return self._jobs.prepare_store([self._key(k) for k in keys], self._ns(namespace), tier)

    def complete_store(self, handle: int, success: bool = True) -> int:
        """Finish a ``prepare_store``: on success the blocks become visible (NVMe
        ones after their bytes are durable); on failure their space is released.
        Returns how many blocks became visible.  Raises ``BadHandle`` for an
        unknown/completed handle; ``StoreFull``/``DiskFull`` if the NVMe write
        cannot get room (the blocks are then discarded)."""
        return self._jobs.complete_store(handle, success)

    def prepare_load(self, keys: Sequence) -> PrepareLoadResult:
        """Pin the longest stored prefix of ``keys`` and expose each block as a
        read-only buffer: host blocks in place; NVMe blocks read and verified
        (a corrupt one ends the prefix and is dropped) into free host frames
        while the host tier has room -- the block is then promoted: it stays in
        the host tier after ``complete_load`` too -- and into the store's
        reusable staging memory otherwise.  ``LoadSlot.tier`` names the tier
        the block was found in.  No block is evicted to make room for a load.
        The blocks cannot be evicted until ``complete_load(handle)``; buffers
        must not be used after it."""
        return self._jobs.prepare_load([self._key(k) for k in keys])

    def complete_load(self, handle: int) -> None:
        """Unpin the blocks of a ``prepare_load``.  Raises ``BadHandle`` for an
        unknown or already completed handle."""
        self._jobs.complete_load(handle)

    # ---------------------------------------------------------------- queries
    def contains(self, key) -> bool:
        """True if the block is stored (in any tier) and readable now."""
        return self._lifetime.contains(self._key(key))

    def lookup(self, keys: Sequence) -> int:
        """Length of the longest prefix of ``keys`` that is stored.  No side effects."""
        return self._lifetime.lookup([self._key(k) for k in keys])

    def where(self, key) -> frozenset[Tier]:
        """Tiers currently holding the block (empty if none)."""
        return self._lifetime.where(self._key(key))

    def host_mask(self, keys: Sequence) -> list[bool]:
        """For each key, whether its block is in the host tier now: ``where``
        for many keys under one lock hold.  Raises BadKey, StoreClosed."""
        return self._lifetime.host_mask([self._key(k) for k in keys])

    def host_frames(self) -> HostFrames:
        """Host frames in all and in use, and the demotions counted so far,
        without ``stats()``'s scan of every block.  Raises StoreClosed."""
        return self._lifetime.host_frames()

    def locate(self, key) -> tuple[str, int] | None:
        """(slab file path, byte offset) of a block's NVMe copy, or None.
        For tools and fault-injection tests; the store itself never needs it."""
        return self._lifetime.locate(self._key(key))

    # ---------------------------------------------------------------- lifetime control
    def pin(self, keys: Sequence) -> int:
        """Protect stored blocks from eviction (e.g. a prefix shared by live
        trajectories).  Returns how many were pinned; pins nest; undo with ``unpin``."""
        return self._lifetime.pin([self._key(k) for k in keys])

    def unpin(self, keys: Sequence) -> None:
        """Undo one ``pin`` per key.  A block dropped while pinned stays
        unpinnable even after its key was stored again: its older pins are
        released first, and the last one frees its frame and slot.  Raises
        ``StoreError`` for a key with no ``pin`` to undo (nothing changed for
        that key; keys before it were unpinned)."""
        self._lifetime.unpin([self._key(k) for k in keys])

    def demote(self, keys: Sequence, keep_host: bool = False) -> int:
        """Write host-resident blocks to NVMe (lease-based demotion); unless
        ``keep_host``, their host frames are freed.  Pinned blocks keep their
        frames.  Returns how many blocks are now on NVMe that were not before."""
        return self._lifetime.demote([self._key(k) for k in keys], keep_host)

    def drop(self, keys: Sequence) -> int:
        """Forget blocks in every tier (they are recomputable).  Returns how many
        were dropped; a pinned block disappears now and frees its space at the last unpin."""
        return self._lifetime.drop([self._key(k) for k in keys])

    def set_host_victim_order(self, order: Callable[[], Sequence[bytes] | None] | None) -> None:
        """Choose host-frame victims by ``order`` instead of recency (None: LRU,
        the default); the contract of ``order`` is ``BlockStore.set_host_victim_order``'s:
        it is called before a write takes the store lock, never under it.
        Thread-safe; raises nothing."""
        snap = None if order is None else VictimSnapshot(order)
        self._victims = snap
        self._placement.set_host_victim_order(snap)

    def _read_victim_order(self, tier) -> None:
        """Before a write that may evict host frames (``tier`` None or host), store
        lock not held: the order's snapshot now."""
        snap = self._victims
        if snap is not None and tier not in (Tier.NVME, Tier.REMOTE):
            snap.refresh()

    # ---------------------------------------------------------------- books
    def stats(self) -> StoreStats:
        """Counters and occupancy.  Waits for a background index load or rebuild.
        Raises StoreClosed."""
        return self._books.stats()

    def check_integrity(self) -> IntegrityReport:
        """Verify the books balance (what is checked: ``store/books.py``,
        ``Books.check_integrity``).  Raises ``IntegrityError`` listing every
        problem; returns the counts."""
        return self._books.check_integrity()

    def wait_prepared(self, timeout_s: float = 30.0) -> bool:
        """Wait until the slot preparer (``StoreConfig.prepare_slots``) has nothing
        left to zero within a slab of the allocation watermark; True if so (also
        when preparation is off), False on timeout.  Takes no store lock; any thread."""
        return self._books.wait_prepared(timeout_s)


# Async variants (``aput``, ``aget``, ``alookup``, ...): one wrapper for the
# blocking calls (aiofiles.os.wrap) that runs them in the running loop's default
# executor, or in the one passed as ``executor=``.  Same contracts and errors.
_ASYNC = ("put", "put_many", "get", "get_many", "get_many_served", "contains", "lookup", "prepare_store",
          "complete_store", "prepare_load", "complete_load", "demote", "drop", "pin", "unpin")
for _name in _ASYNC:
    setattr(TieredStore, "a" + _name, aio_wrap(getattr(TieredStore, _name)))
del _name
