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

Threading: every public method is thread-safe.  Metadata (``_entries``,
LRUs, allocators, index, handles) is owned by ``_lock``; copies and NVMe I/O
run outside it on pinned/pending entries -- demotion on eviction too (its
blocks are pinned while their frames are written; see ``_demote``).  Index
commits are serialised by the index's own lock.  ``close()`` waits for
in-flight operations.
"""
from __future__ import annotations

import fcntl
import itertools
import logging
import os
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

from aiofiles.os import wrap as aio_wrap

from .aligned import BouncePool
from .blockio import HASH_WORKERS, BlockIO
from .books import Books
from .config import StoreConfig
from .entry import (MAX_KEY_BYTES, NO_NAMESPACE, Entry as _Entry, check_buffer, check_buffers, check_key,
                    check_keys, check_namespace)
from .errors import RootLocked, StoreClosed, StoreError
from .events import EventHub
from .hostpool import FramePool
from .index import pack_record
from .io import make_engine
from .nvme import NvmeTier
from .indexing import IndexKeeper, layout_of, offline_rebuild, open_index
from .layout import check_format
from .lifetime import Lifetime
from .placement import Placement
from .twophase import TwoPhase, _LoadJob, _StoreJob
from . import unclean
from .types import (IntegrityReport, LoadSlot, PrepareLoadResult, PrepareStoreResult, StoreSlot,
                    StoreStats, Tier, checksum)

log = logging.getLogger(__name__)

_keys = check_keys

__all__ = ["TieredStore", "Tier", "StoreStats", "IntegrityReport", "PrepareStoreResult",
           "PrepareLoadResult", "StoreSlot", "LoadSlot", "checksum", "MAX_KEY_BYTES", "NO_NAMESPACE"]


class TieredStore(IndexKeeper, BlockIO, Placement, TwoPhase, Lifetime, Books):
    """See the module docstring.  Create with :meth:`open`; use as a context manager.

    The class is assembled from one file per concern: ``blockio`` (copy, write and
    verified-read paths), ``placement`` (allocation and eviction), ``twophase``
    (prepare/complete jobs and staging), ``lifetime`` (queries, pins, demote,
    drop), ``books`` (stats, integrity),
    ``indexing`` (index open, background load, commits, rebuild); this file
    owns the metadata, the lock, open/close and the one-shot calls."""
    # ---------------------------------------------------------------- open/close
    def __init__(self, config: StoreConfig) -> None:
        self.config = cfg = config
        self.events = EventHub()         # KV-event listeners (store/events.py); none by default
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
        self._marked_open = False
        try:
            self._open_parts(cfg)
        except BaseException:
            self._close_parts()
            raise
        self._closed = False
        self._start_loader()

    def _open_parts(self, cfg: StoreConfig) -> None:
        check_format(cfg.root_path, layout_of(cfg))
        self._engine = make_engine(cfg.io_engine, cfg.queue_depth)
        self._nvme = NvmeTier(cfg, self._engine, ())
        recovered: list = []
        self._index = open_index(cfg, self._nvme, recovered)
        if not (cfg.durable and cfg.index_metasync):   # commits are flushed later: see store/unclean.py
            unclean.mark_open(cfg.root_path)
            self._marked_open = True
        self._pool = FramePool(cfg.host_frames, cfg.frame_bytes, pin=cfg.pin_host)
        self._bounce = BouncePool()
        self._hdr_bounce = BouncePool()
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
        # NVMe blocks come from the index in the background (see indexing.py)
        self._init_index_state(recovered)

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
        if config.remote_url is not None and cls is TieredStore:
            from .remote.store import RemoteTieredStore
            cls = RemoteTieredStore
        try:
            return cls(config)
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
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._stop_load.set()
            while self._busy:
                self._idle.wait()
            self._changed.notify_all()
        for t in (self._loader, self._rebuilder):
            if t is not None:
                t.join()
        with self._lock:
            try:
                touched = [(k, self._entries[k]) for k in self._touched
                           if k in self._entries and self._entries[k].slot is not None
                           and self._entries[k].visible]
                self._commit(puts=[(k, self._record(e)) for k, e in touched])
                with self._ilock:
                    if not self._index_bad:
                        self._index.commit(meta={b"seq_hw": str(self._seq).encode()})
            except StoreError as exc:
                log.warning("could not persist access times: %s", exc)
            self._close_parts()

    def _close_parts(self) -> None:
        loader = getattr(self, "_loader", None)
        if loader is not None and loader.is_alive():
            self._stop_load.set()
            loader.join()
        for part in (self._nvme, self._engine, self._pool, getattr(self, "_staging_pool", None)):
            if part is not None:
                part.close()
        flushed = self._index.close() if self._index is not None else True
        if self._marked_open and flushed:     # the index holds every commit now: a clean close
            try:
                unclean.mark_closed(self.config.root_path)
            except OSError as exc:
                log.warning("could not remove %s/OPEN (the next open rebuilds only after a restart): %s",
                            self.config.root_path, exc.strerror)
            self._marked_open = False
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

    _key = staticmethod(check_key)
    _ns = staticmethod(check_namespace)

    def _buf(self, obj, writable: bool, what: str) -> memoryview:
        return check_buffer(obj, self.config.block_bytes, writable, what)

    def _views(self, objs: Sequence, writable: bool, what: str) -> tuple[list[memoryview], list[int]]:
        return check_buffers(objs, self.config.block_bytes, writable, what)


    def _tier(self, tier) -> Tier:
        if tier is None:
            return Tier.HOST if self._pool.n_frames else Tier.NVME
        try:
            t = Tier(tier)
        except ValueError:
            raise ValueError(f"unknown tier {tier!r}; known: host, nvme, remote") from None
        if t is Tier.REMOTE:        # RemoteTieredStore handles it before this point
            raise ValueError("tier='remote' but this store has no remote_url")
        if t is Tier.HOST and not self._pool.n_frames:
            raise ValueError("tier='host' but this store has host_bytes=0")
        if t is Tier.NVME and not self.config.nvme_slots:
            raise ValueError("tier='nvme' but this store has nvme_bytes=0")
        return t

    @staticmethod
    def _record(e: _Entry) -> bytes:
        return pack_record(e.key, e.slot, e.length, e.checksum, e.ns, e.last_access)

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
        in_host = [e.key for e in entries if e.frame is not None and e.visible]
        self._commit(deletes=on_disk)
        self.events.emit_removed(in_host, "host")
        self.events.emit_removed(on_disk, "nvme")
        for e in entries:
            if self._entries.get(e.key) is e:
                del self._entries[e.key]
                self._forget(e.key)
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
            find = self._find_new if self._loading else entries_map.get
            for k, s, a in zip(ks, srcs, src_addrs):
                e = find(k)
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
        self.events.emit_stored([e.key for e in entries], str(t))
        (self._host_lru if t is Tier.HOST else self._nvme_lru).update(dict.fromkeys([e.key for e in entries]))

    # ---------------------------------------------------------------- get
    def get(self, key, out) -> bool:
        """Copy a block into ``out`` (writable, exactly ``block_bytes``).

        Returns False on a miss -- unknown key, or an NVMe copy whose checksum
        fails or cannot be read (that block is then dropped and ``out`` zeroed).
        Raises ``BadKey``/``BadBuffer``/``StoreClosed``.
        """
        return self.get_many([key], [out])[0]

    def get_many(self, keys: Sequence, outs: Sequence) -> list[bool]:
        """Batch ``get``; NVMe reads of contiguous slots are coalesced, and a
        mixed batch's DRAM copies run while its NVMe reads are in flight."""
        if len(keys) != len(outs):
            raise ValueError(f"{len(keys)} keys but {len(outs)} buffers")
        ks = _keys(keys)
        dsts, dst_addrs = self._views(outs, True, "out")
        result = [False] * len(ks)
        host, nvme = [], []          # (request index, entry, frame held)
        with self._lock:
            self._check_open()
            get = self._find if self._loading else self._entries.get
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
        def host_copies() -> None:
            self._copy_frames([f for _, _, f in host], [dsts[i] for i, _, _ in host],
                              [dst_addrs[i] for i, _, _ in host], into=False)
            for i, _, _ in host:
                result[i] = True

        checked = False      # the NVMe reads' checksums are in (a raise before: nothing is corrupt)
        try:
            if nvme:     # a mixed batch: its DRAM copies run while its NVMe reads are in flight
                ok = self._read_verified([e for _, e, _ in nvme], [dsts[i] for i, _, _ in nvme],
                                         [dst_addrs[i] for i, _, _ in nvme],
                                         while_reading=host_copies if host else None)
                checked = True
                for (i, _, _), good in zip(nvme, ok):
                    result[i] = good
            elif host:
                host_copies()
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
                    if checked and not result[i] and e.frame is None:
                        bad.append(e)
                self._counters["hits_host"] += len(host)
                self._counters["hits_nvme"] += sum(result[i] for i, _, _ in nvme)
                self._counters["misses"] += len(bad)
                if bad:
                    self._drop(bad, reason="corrupt")
                self._leave()
        return result

    def _touch(self, e: _Entry) -> None:
        e.last_access = time.time()
        if e.frame is not None:
            self._host_lru.move_to_end(e.key)
        if e.slot is not None:
            self._nvme_lru.move_to_end(e.key)
            self._touched.add(e.key)


# Async variants (``aput``, ``aget``, ``alookup``, ...): one wrapper for the
# blocking calls (aiofiles.os.wrap) that runs them in the running loop's default
# executor, or in the one passed as ``executor=``.  Same contracts and errors.
_ASYNC = ("put", "put_many", "get", "get_many", "contains", "lookup", "prepare_store",
          "complete_store", "prepare_load", "complete_load", "demote", "drop", "pin", "unpin")
for _name in _ASYNC:
    setattr(TieredStore, "a" + _name, aio_wrap(getattr(TieredStore, _name)))
del _name
