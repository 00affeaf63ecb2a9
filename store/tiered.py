"""TieredStore: content-addressed KV blocks in host DRAM and on NVMe.

Where a block lives::

    put(key, data) ──> host frame pool ──(evict LRU: demote)──> NVMe slab slot
          │                  ▲ (volatile)                        (durable, indexed in LMDB)
          └── host_bytes=0 or tier=NVME ────────────────────────────────┘

* The host tier is a cache in volatile memory; evicting a host-only block
  demotes it to NVMe when the NVMe tier has room (after evicting NVMe LRU
  blocks if needed) and drops it otherwise (KV state is recomputable).
* A block is on NVMe only once its bytes were written and flushed *and then*
  its LMDB record committed; lookups never see a block before that.  On reopen
  the in-memory map and the free-slot map are rebuilt from the index.
* Every NVMe read is verified against the block's xxh3-64 checksum; a
  mismatch (or a failed read) is a miss: the block is dropped from the index,
  the caller's buffer is zeroed, corrupt bytes are never served.
* Pins (readers in ``get``, ``prepare_load`` handles, explicit ``pin``) keep a
  block from eviction; host frames are reference-counted (owner + each pin).

Threading: every public method is thread-safe.  Metadata (``_entries``,
LRUs, allocators, index, handles) is owned by ``_lock``; copies and NVMe I/O
run outside it on pinned/pending entries -- demotion on eviction too (its
blocks are pinned while their frames are written; see ``_demote``).  Index
commits are serialised by the index's own lock.  ``close()`` waits for
in-flight operations.
"""
from __future__ import annotations

import bisect
import ctypes
import enum
import fcntl
import itertools
import logging
import os
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Iterable, Sequence

import numpy as np
import xxhash
from aiofiles.os import wrap as aio_wrap

from .aligned import AlignedBuffer, BouncePool
from .config import ALIGN, StoreConfig
from .errors import (BadBuffer, BadHandle, BadKey, DiskFull, IntegrityError, RootLocked,
                     StoreClosed, StoreError, StoreFull)
from .hostpool import FramePool, buffer_address
from .index import Index, pack_record
from .io import make_engine
from .keys import Namespace
from .nvme import NvmeTier

log = logging.getLogger(__name__)

MAX_KEY_BYTES = 64
NO_NAMESPACE = bytes(8)
LAYOUT_VERSION = 1


class Tier(str, enum.Enum):
    HOST = "host"
    NVME = "nvme"

    def __str__(self) -> str:
        return self.value


def checksum(buf) -> int:
    """The per-block checksum (xxh3-64) stored in the index."""
    return xxhash.xxh3_64_intdigest(buf)


_GIL_FREE_COPY = 1 << 20
# Checksums of a batch are computed on HASH_WORKERS threads (xxh3 releases the
# GIL) in parts of about HASH_PART_BYTES, overlapping the batch's I/O.
HASH_WORKERS = max(1, min(2, (os.cpu_count() or 2) // 2))   # 1 on a 2-core VM: less GIL churn (measured)
HASH_PART_BYTES = 16 << 20
INLINE_HASH_BYTES = 1 << 20   # smaller writes hash on the calling thread, overlapping their own I/O


def _copy(dst: memoryview, src: memoryview) -> None:
    """memcpy between equal-length 1-D byte views.  Small copies use memoryview
    assignment (least overhead); large ones numpy, which releases the GIL."""
    if dst.nbytes < _GIL_FREE_COPY:
        dst[:] = src
    else:
        np.copyto(np.frombuffer(dst, dtype=np.uint8), np.frombuffer(src, dtype=np.uint8))


_memmove = ctypes.memmove   # a foreign call: releases the GIL while it copies


def _writable_address(mv: memoryview) -> int | None:
    """Address of a writable buffer (cheap), or None for a read-only one."""
    if mv.readonly:
        return None
    return ctypes.addressof(ctypes.c_char.from_buffer(mv))


def _keys(keys: Sequence) -> list[bytes]:
    """Validated keys (fast path for plain bytes of an allowed length)."""
    out = []
    for k in keys:
        if type(k) is bytes and 0 < len(k) <= MAX_KEY_BYTES:
            out.append(k)
        else:
            out.append(TieredStore._key(k))
    return out


# ------------------------------------------------------------------ results
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


# ------------------------------------------------------------------ internals
class _Entry:
    """A block's bookkeeping.  Owned by the store lock."""
    __slots__ = ("key", "length", "ns", "frame", "slot", "checksum", "last_access", "pins",
                 "visible", "dead", "demote_slot")

    def __init__(self, key: bytes, length: int, ns: bytes, now: float) -> None:
        self.key = key
        self.length = length
        self.ns = ns
        self.frame: int | None = None
        self.slot: int | None = None
        self.checksum: int | None = None
        self.last_access = now
        self.pins = 0
        self.visible = False   # False while a store is in flight
        self.dead = False      # dropped while pinned: resources freed at the last unpin
        self.demote_slot: int | None = None   # NVMe slot reserved by a demotion in flight


class _Staging:
    """Staging memory of one two-phase job: frames of the store's staging pool
    (reused, pre-faulted, pinned like the host pool) or, when the pool cannot
    hold the request, one fresh aligned mapping."""
    __slots__ = ("frames", "buf", "views")

    def __init__(self, frames: list[int] | None, buf: AlignedBuffer | None, views: list[memoryview]) -> None:
        self.frames, self.buf, self.views = frames, buf, views


@dataclass
class _StoreJob:
    entries: list[_Entry]
    bufs: list[memoryview]
    tier: Tier
    staging: _Staging | None


@dataclass
class _LoadJob:
    entries: list[_Entry]
    frames: list[int | None]     # the frame each pin holds a reference on
    staging: _Staging | None
    private: list[int]           # host frames holding loaded blocks that could not be promoted


class TieredStore:
    """See the module docstring.  Create with :meth:`open`; use as a context manager."""

    # ---------------------------------------------------------------- open/close
    def __init__(self, config: StoreConfig) -> None:
        self.config = cfg = config
        self._lock = threading.RLock()
        self._idle = threading.Condition(self._lock)
        self._changed = threading.Condition(self._lock)   # a demotion finished (frames may be free)
        self._demotions_in_flight = 0
        self._busy = 0
        self._closed = True
        root = cfg.root_path
        root.mkdir(parents=True, exist_ok=True)
        self._lockfd = os.open(root / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lockfd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lockfd)
            raise RootLocked(f"{root} is in use by another open TieredStore") from None
        self._pool = self._engine = self._index = self._nvme = None
        try:
            self._open_parts(cfg)
        except BaseException:
            self._close_parts()
            raise
        self._closed = False

    def _open_parts(self, cfg: StoreConfig) -> None:
        self._index = Index(cfg.root_path / "index", cfg.index_map_bytes, cfg.durable, cfg.index_metasync)
        self._index.check_layout({"version": LAYOUT_VERSION, "slot_bytes": cfg.slot_bytes,
                                  "block_bytes": cfg.block_bytes, "slots_per_slab": cfg.slots_per_slab})
        self._engine = make_engine(cfg.io_engine, cfg.queue_depth)
        self._pool = FramePool(cfg.host_frames, cfg.slot_bytes, pin=cfg.pin_host)
        self._bounce = BouncePool()
        self._hasher = ThreadPoolExecutor(max_workers=HASH_WORKERS, thread_name_prefix="kvtier-hash")
        self._entries: dict[bytes, _Entry] = {}
        self._host_lru: OrderedDict[bytes, None] = OrderedDict()
        self._nvme_lru: OrderedDict[bytes, None] = OrderedDict()
        self._dead: set[_Entry] = set()
        self._handles: dict[int, _StoreJob | _LoadJob] = {}
        self._handle_ids = itertools.count(1)
        self._touched: set[bytes] = set()
        self._counters = dict(puts=0, hits_host=0, hits_nvme=0, misses=0, demotions=0,
                              evictions_dropped=0, corrupt_dropped=0, promotions=0, staging_fallbacks=0)
        self._staging_pool: FramePool | None = None   # created at first use
        self._private_frames: set[int] = set()       # host frames held by load jobs, no entry owns them
        # Rebuild from the index: every record names durable bytes.
        records = sorted(self._index.items(), key=lambda kv: kv[1].last_access)
        valid, stale, seen = [], [], set()
        for key, rec in records:
            if rec.slot >= cfg.nvme_slots or rec.length != cfg.block_bytes or rec.slot in seen:
                stale.append(key)
            else:
                seen.add(rec.slot)
                valid.append((key, rec))
        self._nvme = NvmeTier(cfg, self._engine, [rec.slot for _, rec in valid])
        n_files = len(self._nvme._fds) * self._nvme.sps
        for key, rec in valid:
            if rec.slot >= n_files:  # slab file gone: the block is gone
                stale.append(key)
                self._nvme.free([rec.slot])
                continue
            e = _Entry(key, rec.length, rec.namespace, rec.last_access)
            e.slot, e.checksum, e.last_access, e.visible = rec.slot, rec.checksum, rec.last_access, True
            self._entries[key] = e
            self._nvme_lru[key] = None
        if stale:
            log.warning("dropping %d index entries that do not fit this config", len(stale))
            self._index.commit(deletes=stale)

    @classmethod
    def open(cls, config: StoreConfig) -> "TieredStore":
        """Open (creating if needed) the store at ``config.root``.

        Raises ``RootLocked`` if another open store holds the root,
        ``ConfigMismatch`` if the root has another block layout, ``StoreError``
        if a required feature (io_uring, O_DIRECT, pinning) was forced and is missing.
        """
        return cls(config)

    def __enter__(self) -> "TieredStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Wait for in-flight operations, persist access times, release everything.
        Idempotent.  Outstanding prepare_* handles are abandoned (stores not completed
        are discarded)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            while self._busy:
                self._idle.wait()
            try:
                touched = [(k, self._entries[k]) for k in self._touched
                           if k in self._entries and self._entries[k].slot is not None
                           and self._entries[k].visible]
                self._index.commit(puts=[(k, self._record(e)) for k, e in touched])
            except StoreError as exc:
                log.warning("could not persist access times: %s", exc)
            self._close_parts()

    def _close_parts(self) -> None:
        for part in (self._nvme, self._engine, self._index, self._pool, getattr(self, "_staging_pool", None)):
            if part is not None:
                part.close()
        if getattr(self, "_hasher", None) is not None:
            self._hasher.shutdown(wait=True)
        if getattr(self, "_bounce", None) is not None:
            self._bounce.close()
        if self._lockfd is not None:
            os.close(self._lockfd)  # releases the flock
            self._lockfd = None

    @property
    def closed(self) -> bool:
        return self._closed

    # ---------------------------------------------------------------- validation
    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosed("store is closed")

    @staticmethod
    def _key(key) -> bytes:
        if not isinstance(key, (bytes, bytearray, memoryview)):
            raise BadKey(f"keys are bytes, got {type(key).__name__}")
        key = bytes(key)
        if not 0 < len(key) <= MAX_KEY_BYTES:
            raise BadKey(f"keys are 1..{MAX_KEY_BYTES} bytes, got {len(key)}")
        return key

    def _buf(self, obj, writable: bool, what: str) -> memoryview:
        try:
            mv = memoryview(obj)
        except TypeError:
            raise BadBuffer(f"{what} must support the buffer protocol, got {type(obj).__name__}") from None
        if not mv.c_contiguous:
            raise BadBuffer(f"{what} must be C-contiguous")
        if writable and mv.readonly:
            raise BadBuffer(f"{what} is read-only")
        if mv.nbytes != self.config.block_bytes:
            raise BadBuffer(f"{what} is {mv.nbytes} bytes; this store's block_bytes is {self.config.block_bytes}")
        if mv.format != "B" or mv.ndim != 1:
            mv = mv.cast("B")
        return mv

    def _views(self, objs: Sequence, writable: bool, what: str) -> tuple[list[memoryview], list[int]]:
        """Validated 1-D byte views of ``objs`` and their addresses, in one pass
        (the batch hot path: a well-formed memoryview is taken as is).  Raises
        ``BadBuffer`` exactly as ``_buf`` does."""
        bb = self.config.block_bytes
        buf = self._buf
        from_buffer, addressof = ctypes.c_char.from_buffer, ctypes.addressof
        views: list[memoryview] = []
        addrs: list[int] = []
        add_v, add_a = views.append, addrs.append
        for o in objs:
            if type(o) is not memoryview or o.nbytes != bb or o.ndim != 1 or o.format != "B" \
                    or not o.c_contiguous or (writable and o.readonly):
                o = buf(o, writable, what)
            add_a(buffer_address(o) if o.readonly else addressof(from_buffer(o)))
            add_v(o)
        return views, addrs

    @staticmethod
    def _ns(namespace) -> bytes:
        if namespace is None:
            return NO_NAMESPACE
        if isinstance(namespace, Namespace):
            return namespace.tag
        if isinstance(namespace, (bytes, bytearray)) and len(namespace) <= 8:
            return bytes(namespace).ljust(8, b"\0")
        raise ValueError("namespace must be a keys.Namespace, up to 8 bytes, or None")

    def _tier(self, tier) -> Tier:
        if tier is None:
            return Tier.HOST if self._pool.n_frames else Tier.NVME
        try:
            t = Tier(tier)
        except ValueError:
            raise ValueError(f"unknown tier {tier!r}; known: host, nvme") from None
        if t is Tier.HOST and not self._pool.n_frames:
            raise ValueError("tier='host' but this store has host_bytes=0")
        if t is Tier.NVME and not self.config.nvme_slots:
            raise ValueError("tier='nvme' but this store has nvme_bytes=0")
        return t

    @staticmethod
    def _record(e: _Entry) -> bytes:
        return pack_record(e.slot, e.length, e.checksum, e.ns, e.last_access)

    # ---------------------------------------------------------------- busy/pins
    def _enter(self) -> None:
        self._check_open()
        self._busy += 1

    def _leave(self) -> None:
        self._busy -= 1
        if not self._busy:
            self._idle.notify_all()

    def _pin(self, e: _Entry) -> None:
        e.pins += 1
        if e.frame is not None:
            self._pool.incref(e.frame)

    def _unpin(self, e: _Entry, had_frame: int | None) -> None:
        if e.pins <= 0:
            raise StoreError(f"unpin of an unpinned block {e.key.hex()}")
        e.pins -= 1
        if had_frame is not None:
            self._pool.decref(had_frame)
        if e.dead and e.pins == 0:
            self._dead.discard(e)
            if e.slot is not None:
                self._nvme.free([e.slot])
                e.slot = None

    # ---------------------------------------------------------------- removal
    def _drop(self, entries: Sequence[_Entry], reason: str) -> None:
        """Forget blocks: index first (durably), then memory.  Pinned ones free
        their slot at the last unpin; their frame lives on via the pins' refs."""
        entries = [e for e in entries if not e.dead]
        on_disk = [e.key for e in entries if e.slot is not None and e.visible]
        self._index.commit(deletes=on_disk)
        for e in entries:
            if self._entries.get(e.key) is e:
                del self._entries[e.key]
            self._host_lru.pop(e.key, None)
            self._nvme_lru.pop(e.key, None)
            self._touched.discard(e.key)
            if e.frame is not None:
                self._pool.decref(e.frame)   # the owner's reference
                if e.pins == 0:
                    e.frame = None
            if e.pins:
                e.dead = True
                self._dead.add(e)
            elif e.slot is not None:
                self._nvme.free([e.slot])
                e.slot = None
            if reason == "corrupt":
                self._counters["corrupt_dropped"] += 1
            elif reason == "evict":
                self._counters["evictions_dropped"] += 1

    # ---------------------------------------------------------------- allocation
    def _alloc_frames(self, n: int) -> list[int]:
        """``n`` host frames, evicting (demoting) unpinned LRU host blocks.

        Called with the lock held exactly once; it is released while demotion
        writes run (see ``_demote``), so callers must have made their own
        pending state visible (entries inserted, ``_enter``) before calling.
        Raises ``StoreFull`` if pins leave too few evictable frames."""
        if n > self._pool.n_frames:
            raise StoreFull(f"{n} blocks exceed the host tier's {self._pool.n_frames} frames")
        while self._pool.free_count < n:
            need = n - self._pool.free_count
            batch = max(need, min(self.config.slots_per_io, max(1, self._pool.n_frames // 4)))
            victims = []
            for k in self._host_lru:
                e = self._entries[k]
                if e.pins == 0:
                    victims.append(e)
                    if len(victims) >= batch:
                        break
            if not victims:
                if self._demotions_in_flight:   # their frames come free when they finish
                    self._changed.wait()
                    self._check_open()
                    continue
                raise StoreFull("host tier full and every host block is pinned or in flight")
            self._evict_host(victims)
        return self._pool.alloc_many(n)

    def _evict_host(self, victims: list[_Entry]) -> None:
        """Remove ``victims`` from the host tier: blocks already on NVMe just lose
        their frame; the others are demoted to NVMe if it has room, else dropped.
        Lock held once; released during the demotion writes."""
        to_demote = [e for e in victims if e.slot is None]
        for e in victims:
            if e.slot is not None:
                self._release_frame(e)
        if not to_demote:
            return
        if self._nvme.capacity > 0:
            try:
                self._demote(to_demote)
            except StoreError as exc:
                log.warning("demotion to NVMe failed (%s); dropping %d host blocks", exc, len(to_demote))
        # the lock was released: only touch victims that are still ours to evict
        for e in to_demote:
            if self._entries.get(e.key) is not e or e.frame is None or e.pins:
                continue            # dropped, already evicted, or pinned by a reader meanwhile
            if e.slot is not None:
                self._release_frame(e)
            else:
                self._drop([e], reason="evict")

    def _release_frame(self, e: _Entry) -> None:
        self._host_lru.pop(e.key, None)
        self._pool.decref(e.frame)
        e.frame = None

    def _demote(self, entries: list[_Entry]) -> list[_Entry]:
        """Write host blocks to NVMe; returns the entries now on NVMe (they keep
        their frames).  Two-phase, so the slab I/O runs without the lock:

        1. (lock) reserve slots (evicting NVMe LRU blocks if needed) and pin the
           blocks (``demote_slot`` set): readers keep reading the host copy, and
           nothing can evict, demote or free the frames meanwhile;
        2. (no lock) write the frames, checksum them on the hashing threads, fdatasync;
        3. (lock) for blocks still alive, commit their index records (durable
           before visible) and record the slot; free the slots of blocks dropped
           meanwhile; unpin.

        Called with the lock held exactly once.  Raises ``StoreFull``/``DiskFull``
        (no room) or ``StoreIOError``; on raise no block changed tier."""
        entries = [e for e in entries if e.demote_slot is None and e.slot is None and e.frame is not None]
        if not entries:
            return []
        self._enter()
        try:
            slots = self._alloc_slots(len(entries), protect=entries)
        except BaseException:
            self._leave()
            raise
        for e, s in zip(entries, slots):
            e.demote_slot = s
            self._pin(e)
        self._demotions_in_flight += 1
        err: BaseException | None = None
        sums: list[int] = []
        self._lock.release()
        try:
            sums = self._write_frames(entries, slots)
        except BaseException as exc:
            err = exc
        finally:
            self._lock.acquire()
        alive: list[_Entry] = []
        try:
            for e, s, c in zip(entries, slots, sums or [None] * len(entries)):
                e.demote_slot = None
                if err is None and not e.dead and self._entries.get(e.key) is e:
                    e.slot, e.checksum = s, c
                    alive.append(e)
                else:
                    self._nvme.free([s])
            if alive:
                try:
                    self._index.commit(puts=[(e.key, self._record(e)) for e in alive])
                except BaseException as exc:
                    for e in alive:
                        self._nvme.free([e.slot])
                        e.slot = e.checksum = None
                    alive, err = [], exc
            for e in alive:
                self._nvme_lru[e.key] = None
            self._counters["demotions"] += len(alive)
        finally:
            for e in entries:
                self._unpin(e, e.frame)
            self._demotions_in_flight -= 1
            self._leave()
            self._changed.notify_all()
        if err is not None:
            raise err
        return alive

    def _write_frames(self, entries: list[_Entry], slots: list[int]) -> list[int]:
        """Write pinned host frames to ``slots`` and flush (no lock held); the
        checksums are computed on the hashing threads meanwhile and returned."""
        pool = self._pool
        bufs = [pool.view(e.frame) for e in entries]
        sums = [0] * len(entries)

        def hash_part(part: range) -> None:
            for j in part:
                sums[j] = checksum(bufs[j][:entries[j].length])

        futs = [self._hasher.submit(hash_part, part) for part in self._hash_parts(len(entries))]
        try:
            self._nvme.start_io(True, slots, bufs, [pool.address + e.frame * pool.frame_bytes
                                                    for e in entries]).wait()
        finally:
            for f in futs:
                f.result()
        if self.config.durable:
            self._nvme.sync(slots)
        return sums

    def _alloc_slots(self, n: int, protect: Sequence[_Entry] = ()) -> list[int]:
        """``n`` NVMe slots, evicting unpinned NVMe LRU blocks if needed.  Lock held.
        Raises ``StoreFull`` (not enough evictable) or ``DiskFull`` (filesystem full)."""
        nv = self._nvme
        if n > nv.capacity:
            raise StoreFull(f"{n} blocks exceed the NVMe tier's {nv.capacity} slots")
        while True:
            if nv.free_slots < n:
                need = n - nv.free_slots
                prot = {id(e) for e in protect}
                victims = []
                for k in self._nvme_lru:
                    e = self._entries[k]
                    if e.pins == 0 and id(e) not in prot:
                        victims.append(e)
                        if len(victims) >= need:
                            break
                if len(victims) < need:
                    raise StoreFull(f"NVMe tier full: {need} more slots needed, "
                                    f"{len(victims)} evictable (others pinned)")
                self._evict_nvme(victims)
            slots = nv.alloc(n)  # may raise DiskFull (tier capped; loop again next call)
            if slots is not None:
                return slots

    def _evict_nvme(self, victims: list[_Entry]) -> None:
        keep = [e for e in victims if e.frame is not None]   # still cached on host
        gone = [e for e in victims if e.frame is None]
        if keep:
            self._index.commit(deletes=[e.key for e in keep])
            for e in keep:
                self._nvme_lru.pop(e.key, None)
                self._nvme.free([e.slot])
                e.slot = e.checksum = None
        if gone:
            self._drop(gone, reason="evict")

    # ---------------------------------------------------------------- put
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
        ks = _keys(keys)
        srcs, src_addrs = self._views(datas, False, "data")
        ns = self._ns(namespace)
        bb = self.config.block_bytes
        with self._lock:
            self._check_open()
            t = self._tier(tier)
            entries_map = self._entries
            now = time.time()
            entries, new_srcs, new_addrs = [], [], []
            for k, s, a in zip(ks, srcs, src_addrs):
                e = entries_map.get(k)
                if e is not None:      # stored, being stored, or a repeat within this batch
                    if e.visible:
                        self._touch(e)
                    continue
                # pending (invisible) until published: concurrent puts of this key skip it
                entries_map[k] = e = _Entry(k, bb, ns, now)
                entries.append(e)
                new_srcs.append(s)
                new_addrs.append(a)
            if not entries:
                return 0
            self._enter()
            if t is Tier.HOST:
                try:
                    frames = self._alloc_frames(len(entries))   # may demote (lock released meanwhile)
                except BaseException:
                    self._abort_pending(entries)
                    self._leave()
                    raise
                for e, f in zip(entries, frames):
                    e.frame = f
        try:
            if t is Tier.HOST:
                self._copy_frames(frames, new_srcs, new_addrs, into=True)
            else:
                self._write_new_to_nvme(entries, new_srcs, new_addrs)
        except BaseException:
            with self._lock:
                self._abort_pending(entries)
                self._leave()
            raise
        with self._lock:
            self._publish(entries, t)
            self._counters["puts"] += len(entries)
            self._leave()
        return len(entries)

    def _copy_frames(self, frames: Sequence[int], bufs: Sequence[memoryview],
                     addrs: Sequence[int | None], into: bool) -> None:
        """Copy block buffers into (``into``) or out of host frames.  Blocks whose
        frames are adjacent and whose buffers lie back to back in memory are
        copied as one run (one large memcpy, GIL released); a buffer with no
        known address (read-only) is copied on its own."""
        pool = self._pool
        fb, base, bb = pool.frame_bytes, pool.address, self.config.block_bytes
        runs_ok = fb == bb
        n = len(frames)
        if runs_ok and n > 16 and None not in addrs:
            # vectorised run detection: cut where frames or buffers stop being adjacent
            fa = np.asarray(frames, dtype=np.int64)
            aa = np.asarray(addrs, dtype=np.uint64)
            cut = np.flatnonzero((np.diff(fa) != 1) | (np.diff(aa) != np.uint64(fb))) + 1
            bounds = [0, *cut.tolist(), n]
            for lo, hi in zip(bounds, bounds[1:]):
                f = base + frames[lo] * fb
                if into:
                    _memmove(f, addrs[lo], (hi - lo) * bb)
                else:
                    _memmove(addrs[lo], f, (hi - lo) * bb)
            return
        i = 0
        while i < n:
            a = addrs[i]
            if a is None:
                v = pool.view(frames[i], bb)
                if into:
                    _copy(v, bufs[i])
                else:
                    _copy(bufs[i], v)
                i += 1
                continue
            j = i + 1
            if runs_ok:
                while j < n and frames[j] == frames[j - 1] + 1 and addrs[j] == addrs[j - 1] + fb:
                    j += 1
            f = base + frames[i] * fb
            if into:
                _memmove(f, a, (j - i) * bb)
            else:
                _memmove(a, f, (j - i) * bb)
            i = j

    def _abort_pending(self, entries: Sequence[_Entry]) -> None:
        for e in entries:
            if self._entries.get(e.key) is e:
                del self._entries[e.key]
            if e.frame is not None:
                self._pool.decref(e.frame)
                e.frame = None
            if e.slot is not None:
                self._nvme.free([e.slot])
                e.slot = None

    def _publish(self, entries: Sequence[_Entry], t: Tier) -> None:
        for e in entries:
            e.visible = True
        (self._host_lru if t is Tier.HOST else self._nvme_lru).update(dict.fromkeys([e.key for e in entries]))

    def _write_new_to_nvme(self, entries: list[_Entry], srcs: list[memoryview],
                           addrs: list[int] | None = None) -> None:
        """Write pending entries' bytes to NVMe, flush, then commit their index
        records (durable before visible).  Called without the lock; takes it for
        slot allocation only.  Checksums (and the packed index records) are
        computed on the hashing threads (xxh3 releases the GIL) while this
        thread submits and reaps the writes."""
        cfg = self.config
        with self._lock:
            slots = self._alloc_slots(len(entries))
            for e, s in zip(entries, slots):
                e.slot = s
        records: list[bytes | None] = [None] * len(entries)
        if cfg.block_bytes != cfg.slot_bytes:
            addrs = None
        elif addrs is None:
            addrs = [buffer_address(s) for s in srcs]
        if addrs is not None and not any(a % ALIGN for a in addrs):
            self._write_direct(entries, srcs, slots, addrs, records)
        else:
            self._write_bounced(entries, srcs, slots)
        if cfg.durable:
            self._nvme.sync(slots)
        if None in records:      # bounced writes leave the packing to here
            records = [r if r is not None else self._record(e) for e, r in zip(entries, records)]
        self._index.commit(puts=[(e.key, r) for e, r in zip(entries, records)], packed=True)

    def _hash_parts(self, n: int) -> list[range]:
        """Split ``n`` blocks into contiguous parts of about HASH_PART_BYTES."""
        per = max(1, HASH_PART_BYTES // self.config.block_bytes)
        return [range(lo, min(n, lo + per)) for lo in range(0, n, per)]

    def _write_direct(self, entries, srcs, slots, addrs, records) -> None:
        """Sources are aligned: write straight from them (no copy).  The I/O is
        planned and submitted first; then the hashing threads checksum the same
        (unchanging) sources and pack the index records while it runs."""
        batch = self._nvme.start_io(True, slots, srcs, addrs)

        def hash_part(part: range) -> None:
            for j in part:
                e = entries[j]
                e.checksum = checksum(srcs[j])
                records[j] = pack_record(e.slot, e.length, e.checksum, e.ns, e.last_access)

        if len(entries) * self.config.block_bytes <= INLINE_HASH_BYTES:
            try:                 # small: hash here while the write is in flight (no thread hand-off)
                hash_part(range(len(entries)))
            finally:
                batch.wait()
            return
        futs = [self._hasher.submit(hash_part, part) for part in self._hash_parts(len(entries))]
        try:
            batch.wait()
        finally:
            for f in futs:       # never leave a thread reading the caller's buffers
                f.result()

    def _write_bounced(self, entries, srcs, slots) -> None:
        """Unaligned sources (or padded slots): stage through a double-buffered
        aligned bounce area chunk by chunk; staging (copy + checksum) of chunk
        i+1 overlaps the writes of chunk i."""
        cfg = self.config
        n = len(entries)
        chunk = max(1, cfg.slots_per_io * cfg.queue_depth)
        bounce = self._bounce.get(min(n, 2 * chunk) * cfg.slot_bytes)

        def stage(lo: int, hi: int, half: int) -> list[memoryview]:
            out = []
            for j in range(lo, hi):
                entries[j].checksum = checksum(srcs[j])
                off = (half * chunk + (j - lo)) * cfg.slot_bytes
                b = bounce.view(off, off + cfg.slot_bytes)
                _copy(b[:cfg.block_bytes], srcs[j])
                out.append(b)
            return out

        bounds = [(lo, min(n, lo + chunk)) for lo in range(0, n, chunk)]
        bufs = stage(*bounds[0], 0)
        for i, (lo, hi) in enumerate(bounds):
            batch = self._nvme.start_io(True, slots[lo:hi], bufs)
            try:
                if i + 1 < len(bounds):
                    bufs = stage(*bounds[i + 1], (i + 1) % 2)
            finally:
                batch.wait()

    # ---------------------------------------------------------------- get
    def get(self, key, out) -> bool:
        """Copy a block into ``out`` (writable, exactly ``block_bytes``).

        Returns False on a miss -- unknown key, or an NVMe copy whose checksum
        fails or cannot be read (that block is then dropped and ``out`` zeroed).
        Raises ``BadKey``/``BadBuffer``/``StoreClosed``.
        """
        return self.get_many([key], [out])[0]

    def get_many(self, keys: Sequence, outs: Sequence) -> list[bool]:
        """Batch ``get``; NVMe reads of contiguous slots are coalesced."""
        if len(keys) != len(outs):
            raise ValueError(f"{len(keys)} keys but {len(outs)} buffers")
        ks = _keys(keys)
        dsts, dst_addrs = self._views(outs, True, "out")
        result = [False] * len(ks)
        host, nvme = [], []          # (request index, entry, frame held)
        with self._lock:
            self._check_open()
            get = self._entries.get
            host_lru, nvme_lru, touched = self._host_lru, self._nvme_lru, self._touched
            now = time.time()
            misses = 0
            for i, k in enumerate(ks):
                e = get(k)
                if e is None or not e.visible:
                    misses += 1
                    continue
                e.pins += 1           # pinned: never evicted or freed while we copy
                e.last_access = now
                f = e.frame
                if f is not None:
                    host_lru.move_to_end(k)
                    host.append((i, e, f))
                else:
                    nvme.append((i, e, None))
                if e.slot is not None:
                    nvme_lru.move_to_end(k)
                    touched.add(k)
            if host:
                self._pool.incref_many([f for _, _, f in host])
            self._counters["misses"] += misses
            self._enter()
        try:
            if host:
                self._copy_frames([f for _, _, f in host], [dsts[i] for i, _, _ in host],
                                  [dst_addrs[i] for i, _, _ in host], into=False)
                for i, _, _ in host:
                    result[i] = True
            if nvme:
                ok = self._read_verified([e for _, e, _ in nvme], [dsts[i] for i, _, _ in nvme],
                                         [dst_addrs[i] for i, _, _ in nvme])
                for (i, _, _), good in zip(nvme, ok):
                    result[i] = good
        finally:
            with self._lock:
                if host:
                    self._pool.decref_many([f for _, _, f in host])
                bad = []
                for i, e, _ in host + nvme:
                    if e.pins > 0 and not e.dead:   # the common case; _unpin frees dead blocks
                        e.pins -= 1
                    else:
                        self._unpin(e, None)
                    if not result[i] and e.frame is None:
                        bad.append(e)
                self._counters["hits_host"] += len(host)
                self._counters["hits_nvme"] += sum(result[i] for i, _, _ in nvme)
                self._counters["misses"] += len(bad)
                if bad:
                    self._drop(bad, reason="corrupt")
                self._leave()
        return result

    def _read_verified(self, entries: list[_Entry], dsts: list[memoryview],
                       dst_addrs: list[int] | None = None) -> list[bool]:
        """Read pinned NVMe entries into ``dsts`` and verify their checksums (no
        lock held).  Verification runs as each coalesced read completes, while the
        rest are in flight.  A block that fails (checksum or I/O) has its ``dst``
        zeroed and reads as False."""
        cfg = self.config
        n = len(entries)
        ok = [False] * n
        if cfg.block_bytes != cfg.slot_bytes:
            addrs = None
        else:
            addrs = dst_addrs if dst_addrs is not None else [buffer_address(d) for d in dsts]
        direct = addrs is not None and not any(a % ALIGN for a in addrs)
        chunk = n if direct else max(1, cfg.slots_per_io * cfg.queue_depth)
        bounce = None if direct else self._bounce.get(min(n, chunk) * cfg.slot_bytes)
        for lo in range(0, n, chunk):
            hi = min(n, lo + chunk)
            if direct:
                bufs, baddrs = dsts[lo:hi], addrs[lo:hi]
            else:
                bufs = [bounce.view(j * cfg.slot_bytes, (j + 1) * cfg.slot_bytes) for j in range(hi - lo)]
                baddrs = None
            batch = self._nvme.start_io(False, [e.slot for e in entries[lo:hi]], bufs, baddrs)
            futs = []

            def verify(js, lo=lo, bufs=bufs) -> None:
                for j in js:
                    e, b = entries[lo + j], bufs[j]
                    if checksum(b[:e.length]) == e.checksum:
                        if not direct:
                            _copy(dsts[lo + j], b[:e.length])
                        ok[lo + j] = True
                    else:
                        log.warning("checksum mismatch on block %s (slot %d); dropping it", e.key.hex(), e.slot)

            # verify each coalesced read on the hashing threads as soon as it completes
            try:
                batch.wait(lambda op, batch=batch: futs.append(self._hasher.submit(verify, batch.groups[op])))
            except StoreError as exc:
                log.warning("NVMe read failed (%s); its blocks read as misses", exc)
            finally:
                for f in futs:
                    f.result()
        for j in range(n):
            if not ok[j]:
                np.frombuffer(dsts[j], dtype=np.uint8).fill(0)
        return ok

    def _touch(self, e: _Entry) -> None:
        e.last_access = time.time()
        if e.frame is not None:
            self._host_lru.move_to_end(e.key)
        if e.slot is not None:
            self._nvme_lru.move_to_end(e.key)
            self._touched.add(e.key)

    # ---------------------------------------------------------------- queries
    def contains(self, key) -> bool:
        """True if the block is stored (in any tier) and readable now."""
        k = self._key(key)
        with self._lock:
            self._check_open()
            e = self._entries.get(k)
            return e is not None and e.visible

    def lookup(self, keys: Sequence) -> int:
        """Length of the longest prefix of ``keys`` that is stored.  No side effects."""
        ks = [self._key(k) for k in keys]
        with self._lock:
            self._check_open()
            entries = self._entries
            n = 0
            for k in ks:
                e = entries.get(k)
                if e is None or not e.visible:
                    break
                n += 1
            return n

    def where(self, key) -> frozenset[Tier]:
        """Tiers currently holding the block (empty if none)."""
        k = self._key(key)
        with self._lock:
            self._check_open()
            e = self._entries.get(k)
            if e is None or not e.visible:
                return frozenset()
            return frozenset(t for t, has in ((Tier.HOST, e.frame is not None),
                                              (Tier.NVME, e.slot is not None)) if has)

    def locate(self, key) -> tuple[str, int] | None:
        """(slab file path, byte offset) of a block's NVMe copy, or None.
        For tools and fault-injection tests; the store itself never needs it."""
        k = self._key(key)
        with self._lock:
            self._check_open()
            e = self._entries.get(k)
            if e is None or not e.visible or e.slot is None:
                return None
            path, off = self._nvme.locate(e.slot)
            return str(path), off

    # ---------------------------------------------------------------- pins, demote, drop
    def pin(self, keys: Sequence) -> int:
        """Protect stored blocks from eviction (e.g. a prefix shared by live
        trajectories).  Returns how many were pinned; pins nest; undo with ``unpin``."""
        ks = [self._key(k) for k in keys]
        with self._lock:
            self._check_open()
            n = 0
            for k in ks:
                e = self._entries.get(k)
                if e is not None and e.visible:
                    self._pin(e)
                    n += 1
            return n

    def unpin(self, keys: Sequence) -> None:
        """Undo one ``pin`` per key.  Raises ``StoreError`` for a key that is not pinned."""
        ks = [self._key(k) for k in keys]
        with self._lock:
            self._check_open()
            for k in ks:
                e = self._entries.get(k)
                if e is None:
                    e = next((d for d in self._dead if d.key == k), None)
                if e is None or e.pins == 0:
                    raise StoreError(f"unpin of a block that is not pinned: {k.hex()}")
                self._unpin(e, e.frame)

    def demote(self, keys: Sequence, keep_host: bool = False) -> int:
        """Write host-resident blocks to NVMe (lease-based demotion); unless
        ``keep_host``, their host frames are freed.  Pinned blocks keep their
        frames.  Returns how many blocks are now on NVMe that were not before."""
        ks = [self._key(k) for k in keys]
        with self._lock:
            self._check_open()
            todo = []
            for k in ks:
                e = self._entries.get(k)
                if e is not None and e.visible and e.frame is not None and e.slot is None and e not in todo:
                    todo.append(e)
            done = self._demote(todo) if todo else []
            if not keep_host:
                for k in dict.fromkeys(ks):
                    e = self._entries.get(k)
                    if e is not None and e.frame is not None and e.slot is not None and e.pins == 0:
                        self._release_frame(e)
            return len(done)

    def drop(self, keys: Sequence) -> int:
        """Forget blocks in every tier (they are recomputable).  Returns how many
        were dropped; a pinned block disappears now and frees its space at the last unpin."""
        ks = [self._key(k) for k in keys]
        with self._lock:
            self._check_open()
            es = [self._entries[k] for k in dict.fromkeys(ks)
                  if k in self._entries and self._entries[k].visible]
            self._drop(es, reason="drop")
            return len(es)

    # ---------------------------------------------------------------- two-phase
    def prepare_store(self, keys: Sequence, *, namespace=None, tier=None) -> PrepareStoreResult:
        """Reserve space for blocks the engine will fill (e.g. by DMA).

        Keys already stored or in flight are ``skipped``.  Host tier: the buffers
        are host frames (pinned memory when CUDA is present).  NVMe tier: aligned
        staging memory written to NVMe at ``complete_store``.  Reserved blocks are
        invisible until ``complete_store(handle, success=True)``.
        Raises ``StoreFull`` when no room can be made, ``BadKey``, ``StoreClosed``.
        """
        ks = [self._key(k) for k in keys]
        ns = self._ns(namespace)
        with self._lock:
            self._check_open()
            t = self._tier(tier)
            new, skipped, seen = [], [], set()
            for k in ks:
                if k in self._entries or k in seen:
                    skipped.append(k)
                else:
                    seen.add(k)
                    new.append(k)
            now = time.time()
            entries = [_Entry(k, self.config.block_bytes, ns, now) for k in new]
            for e in entries:          # pending (invisible): concurrent stores of these keys skip
                self._entries[e.key] = e
            staging = None
            if t is Tier.HOST:
                self._enter()
                try:
                    frames = self._alloc_frames(len(entries))   # may demote (lock released meanwhile)
                except BaseException:
                    self._abort_pending(entries)
                    raise
                finally:
                    self._leave()
                for e, f in zip(entries, frames):
                    e.frame = f
                bufs = [self._pool.view(e.frame, e.length) for e in entries]
            else:
                staging = self._alloc_staging(len(entries))
                bufs = staging.views
            h = next(self._handle_ids)
            self._handles[h] = _StoreJob(entries, bufs, t, staging)
            return PrepareStoreResult(h, tuple(StoreSlot(e.key, b) for e, b in zip(entries, bufs)),
                                      tuple(skipped))

    def complete_store(self, handle: int, success: bool = True) -> int:
        """Finish a ``prepare_store``: on success the blocks become visible (NVMe
        ones after their bytes are durable); on failure their space is released.
        Returns how many blocks became visible.  Raises ``BadHandle`` for an
        unknown/completed handle; ``StoreFull``/``DiskFull`` if the NVMe write
        cannot get room (the blocks are then discarded)."""
        with self._lock:
            self._check_open()
            job = self._handles.get(handle)
            if not isinstance(job, _StoreJob):
                raise BadHandle(f"no store in flight with handle {handle!r}")
            del self._handles[handle]
            if not success or not job.entries:
                self._abort_pending(job.entries)
                self._free_staging(job.staging)
                return 0
            if job.tier is Tier.HOST:
                self._publish(job.entries, Tier.HOST)
                self._counters["puts"] += len(job.entries)
                return len(job.entries)
            self._enter()
        try:
            self._write_new_to_nvme(job.entries, job.bufs)
        except BaseException:
            with self._lock:
                self._abort_pending(job.entries)
                self._free_staging(job.staging)
                self._leave()
            raise
        with self._lock:
            self._publish(job.entries, Tier.NVME)
            self._counters["puts"] += len(job.entries)
            self._free_staging(job.staging)
            self._leave()
        return len(job.entries)

    def _alloc_staging(self, n: int) -> _Staging:
        """Staging buffers for ``n`` blocks (lock held): frames of the staging
        pool -- reused and pre-faulted, so copies into them run at warm-memory
        speed -- or fresh aligned memory when the pool cannot hold ``n`` now
        (counted in ``stats().staging_fallbacks``)."""
        cfg = self.config
        sb, bb = cfg.slot_bytes, cfg.block_bytes
        pool = self._staging_pool
        if pool is None:
            pool = self._staging_pool = FramePool(cfg.staging_bytes // sb, sb,
                                                  pin="off" if cfg.pin_host == "off" else "auto")
        frames = pool.alloc_many(n) if n else None
        if frames is not None:
            return _Staging(frames, None, [pool.view(f, bb) for f in frames])
        if n:
            self._counters["staging_fallbacks"] += 1
        buf = AlignedBuffer(max(1, n) * sb)
        return _Staging(None, buf, [buf.view(j * sb, j * sb + bb) for j in range(n)])

    def _free_staging(self, staging: _Staging | None) -> None:
        """Return a job's staging memory (frames back to the pool).  Callers hold
        the lock, so the staging books balance whenever it is free."""
        if staging is None:
            return
        if staging.frames is not None:
            with self._lock:
                pool = self._staging_pool
                if pool is not None and not self._closed:
                    for f in staging.frames:
                        pool.decref(f)
                staging.frames = None
        elif staging.buf is not None:
            staging.views = []
            staging.buf.close()
            staging.buf = None

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
        ks = [self._key(k) for k in keys]
        bb = self.config.block_bytes
        with self._lock:
            self._check_open()
            pinned = []
            for k in ks:
                e = self._entries.get(k)
                if e is None or not e.visible:
                    break
                self._pin(e)
                self._touch(e)
                pinned.append((e, e.frame))
            from_nvme = [j for j, (e, f) in enumerate(pinned) if f is None]
            land = self._pool.alloc_many(min(len(from_nvme), self._pool.free_count)) or []
            self._private_frames.update(land)
            staging = self._alloc_staging(len(from_nvme) - len(land)) if len(from_nvme) > len(land) else None
            self._enter()
        bufs: list[memoryview] = []
        try:
            views = [self._pool.view(f, bb) for f in land] + (staging.views if staging is not None else [])
            ok = self._read_verified([pinned[j][0] for j in from_nvme], views) if from_nvme else []
            cut = len(pinned)
            where = dict(zip(from_nvme, zip(views, ok)))
            for j, (e, f) in enumerate(pinned):
                if f is not None:
                    bufs.append(self._pool.view(f, e.length).toreadonly())
                else:
                    v, good = where[j]
                    if not good:
                        cut = j
                        break
                    bufs.append(v.toreadonly())
        except BaseException:
            with self._lock:
                for e, f in pinned:
                    self._unpin(e, f)
                self._release_private(land)
                self._free_staging(staging)
                self._leave()
            raise
        with self._lock:
            bad = [e for e, f in pinned[cut:cut + 1] if f is None]
            for e, f in pinned[cut:]:
                self._unpin(e, f)
            if bad:
                self._drop(bad, reason="corrupt")
            kept = pinned[:cut]
            frames = [f for _, f in kept]
            landed = dict(zip(from_nvme, land))     # request index -> host frame it was read into
            private = []
            for j, (e, _) in enumerate(kept):
                f = landed.pop(j, None)
                if f is None:
                    continue
                if e.frame is None and e.pins == 1 and not e.dead and self._entries.get(e.key) is e:
                    # promote: the frame becomes the block's host copy (owner ref 1 + our pin)
                    self._private_frames.discard(f)
                    e.frame = f
                    self._pool.incref(f)
                    frames[j] = f
                    self._host_lru[e.key] = None
                    self._counters["promotions"] += 1
                else:   # another reader pinned it meanwhile (its pin holds no frame): keep it private
                    private.append(f)
            self._release_private(list(landed.values()))   # frames of blocks past the cut
            self._counters["hits_host"] += sum(f is not None for _, f in kept)
            self._counters["hits_nvme"] += sum(f is None for _, f in kept)
            h = next(self._handle_ids)
            self._handles[h] = _LoadJob([e for e, _ in kept], frames, staging, private)
            self._leave()
        return PrepareLoadResult(h, tuple(LoadSlot(e.key, b, Tier.HOST if f is not None else Tier.NVME)
                                          for (e, f), b in zip(kept, bufs)))

    def _release_private(self, frames: Sequence[int]) -> None:
        """Free host frames a load job held without an owning entry (lock held)."""
        for f in frames:
            self._private_frames.discard(f)
            self._pool.decref(f)

    def complete_load(self, handle: int) -> None:
        """Unpin the blocks of a ``prepare_load``.  Raises ``BadHandle`` for an
        unknown or already completed handle."""
        with self._lock:
            self._check_open()
            job = self._handles.get(handle)
            if not isinstance(job, _LoadJob):
                raise BadHandle(f"no load in flight with handle {handle!r}")
            del self._handles[handle]
            for e, f in zip(job.entries, job.frames):
                self._unpin(e, f)
            self._release_private(job.private)
            self._free_staging(job.staging)

    # ---------------------------------------------------------------- stats, integrity
    def stats(self) -> StoreStats:
        with self._lock:
            self._check_open()
            live = [e for e in self._entries.values() if e.visible]
            return StoreStats(
                block_bytes=self.config.block_bytes, slot_bytes=self.config.slot_bytes,
                io_engine=self._engine.name, direct_io=bool(self._nvme.direct),
                host_pinned=self._pool.pinned,
                host_frames_total=self._pool.n_frames, host_frames_used=self._pool.used_count,
                host_blocks=sum(e.frame is not None for e in live),
                nvme_slots_total=self._nvme.capacity,
                nvme_slots_used=self._nvme.capacity - self._nvme.free_slots,
                nvme_blocks=sum(e.slot is not None for e in live), nvme_full=self._nvme.full,
                index_map_bytes=self._index.map_size, index_grows=self._index.grows,
                pinned_blocks=sum(e.pins > 0 for e in live),
                staging_frames_total=self._staging_pool.n_frames if self._staging_pool else 0,
                staging_frames_used=self._staging_pool.used_count if self._staging_pool else 0,
                **self._counters)

    def check_integrity(self) -> IntegrityReport:
        """Verify the books balance: free + used == total for host frames, NVMe
        slots and index entries; every frame/slot has exactly one owner; frame
        refcounts equal 1 + pins; the LMDB index matches the NVMe-resident blocks.
        Raises ``IntegrityError`` listing every problem; returns the counts."""
        with self._lock:
            self._check_open()
            problems = []
            owners = list(self._entries.values()) + list(self._dead)
            frames = [e.frame for e in owners if e.frame is not None]
            frames += list(self._private_frames)      # load jobs' unpromoted landing frames
            slots = [e.slot for e in owners if e.slot is not None]
            slots += [e.demote_slot for e in owners if e.demote_slot is not None]   # demotions in flight
            pool, nv = self._pool, self._nvme
            if pool.free_count + pool.used_count != pool.n_frames:
                problems.append("host: free + used != total")
            if len(set(frames)) != len(frames):
                problems.append("host: a frame has two owners")
            if len(frames) != pool.used_count:
                problems.append(f"host: {pool.used_count} frames used but {len(frames)} owned")
            for e in owners:
                if e.frame is not None:
                    want = e.pins + (0 if e.dead else 1)
                    if pool.refcount(e.frame) != want:
                        problems.append(f"host: frame {e.frame} refcount {pool.refcount(e.frame)} != {want}")
            used_slots = nv.capacity - nv.free_slots
            if len(set(slots)) != len(slots):
                problems.append("nvme: a slot has two owners")
            if len(slots) != used_slots:
                problems.append(f"nvme: {used_slots} slots used but {len(slots)} owned")
            free_from_extents = sum(n for _, n in nv.alloc_map.extents())
            if free_from_extents != nv.free_slots:
                problems.append("nvme: free-extent map disagrees with its count")
            ext = nv.alloc_map.extents()
            starts = [st for st, _ in ext]
            for s in slots:
                i = bisect.bisect_right(starts, s) - 1
                if i >= 0 and s < ext[i][0] + ext[i][1]:
                    problems.append(f"nvme: slot {s} is used and free")
                    break
            disk = dict(self._index.items())
            want = {e.key: e for e in self._entries.values() if e.visible and e.slot is not None}
            if set(disk) != set(want):
                problems.append(f"index: {len(disk)} records but {len(want)} NVMe-resident blocks")
            for k, rec in disk.items():
                e = want.get(k)
                if e is not None and (rec.slot != e.slot or rec.checksum != e.checksum):
                    problems.append(f"index: record of {k.hex()} disagrees with memory")
            for e in self._entries.values():
                if e.visible and e.frame is None and e.slot is None:
                    problems.append(f"block {e.key.hex()} visible but in no tier")
            sp = self._staging_pool
            if sp is not None:
                leased = sum(len(j.staging.frames) for j in self._handles.values()
                             if j.staging is not None and j.staging.frames is not None)
                if sp.free_count + sp.used_count != sp.n_frames:
                    problems.append("staging: free + used != total")
                if not self._busy and leased != sp.used_count:
                    problems.append(f"staging: {sp.used_count} frames used but {leased} held by handles")
            if problems:
                raise IntegrityError("; ".join(problems))
            return IntegrityReport(
                host_frames_total=pool.n_frames, host_frames_free=pool.free_count,
                host_frames_used=pool.used_count, nvme_slots_total=nv.capacity,
                nvme_slots_free=nv.free_slots, nvme_slots_used=used_slots,
                index_entries=len(disk), live_blocks=sum(e.visible for e in self._entries.values()))


# Async variants (``aput``, ``aget``, ``alookup``, ...): one wrapper for the
# blocking calls (aiofiles.os.wrap) that runs them in the running loop's default
# executor, or in the one passed as ``executor=``.  Same contracts and errors.
_ASYNC = ("put", "put_many", "get", "get_many", "contains", "lookup", "prepare_store",
          "complete_store", "prepare_load", "complete_load", "demote", "drop", "pin", "unpin")
for _name in _ASYNC:
    setattr(TieredStore, "a" + _name, aio_wrap(getattr(TieredStore, _name)))
del _name
