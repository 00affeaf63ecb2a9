"""Two-phase jobs: ``prepare_store``/``complete_store`` and ``prepare_load``/``complete_load``.

A job is plain data kept in the ``BlockTable`` by handle until its
``complete_*``; staging memory (frames of a reusable, pre-faulted pool, or a
fresh aligned mapping when the pool cannot hold the request) is leased to the
job and returned when it completes.

Threads: the store's caller threads; a job may be completed on another
thread than the one that prepared it.  ``TwoPhase``'s own fields -- the
staging pool (created at first use) and the host frames load jobs hold that
no entry owns -- are owned by the store lock (``BlockTable.lock``), which
each method takes; the reads of a load run without it on pinned blocks.
Lock order: store lock -> index keeper.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence

from .aligned import AlignedBuffer
from .blockio import BlockIO
from .config import Switch
from .blocks import BlockTable
from .entry import Entry as _Entry
from .errors import BadHandle
from .events import EventHub
from .expiry import Expiry
from .hostpool import FramePool
from .indexing import IndexKeeper
from .placement import Placement
from .types import LoadSlot, PrepareLoadResult, PrepareStoreResult, StoreSlot, Tier


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



class TwoPhase:
    """Two-phase store and load over the store's ``BlockTable``; owns the
    staging pool and the load jobs' unpromoted landing frames.  ``tier_of``
    resolves a caller's ``tier=`` (raising ``ValueError``).  The public methods
    are ``TieredStore``'s (see their docs there); keys come validated."""

    def __init__(self, cfg, table: BlockTable, keeper: IndexKeeper, placement: Placement, io: BlockIO,
                 expiry: Expiry, events: EventHub, pool, tier_of: Callable[[object], Tier]) -> None:
        self._cfg, self._table, self._keeper, self._placement = cfg, table, keeper, placement
        self._io, self._expiry, self._events, self._pool, self._tier_of = io, expiry, events, pool, tier_of
        self._staging_pool: FramePool | None = None   # created at first use
        self._private_frames: set[int] = set()       # host frames held by load jobs, no entry owns them

    @property
    def staging_pool(self) -> FramePool | None:
        """The staging pool, once a job needed it (lock held for its counts)."""
        return self._staging_pool

    def private_frames(self) -> frozenset[int]:
        """Host frames load jobs hold that no entry owns (lock held)."""
        return frozenset(self._private_frames)

    def close(self) -> None:
        """Release the staging pool (the store is closed, its lock held or its threads gone)."""
        if self._staging_pool is not None:
            self._staging_pool.close()

    def prepare_store(self, ks: list[bytes], ns: bytes, tier) -> PrepareStoreResult:
        table = self._table
        with table.lock:
            table.check_open()
            t = self._tier_of(tier)
            new, skipped, seen = [], [], set()
            for k in ks:
                if self._keeper.find(k, settle=False) is not None or k in seen:
                    skipped.append(k)
                else:
                    seen.add(k)
                    new.append(k)
            now = time.time()
            entries = [_Entry(k, self._cfg.block_bytes, ns, now) for k in new]
            table.add_pending({e.key: e for e in entries})   # pending (invisible): concurrent stores skip them
            staging = None
            if t is Tier.HOST:
                table.enter()
                try:
                    frames = self._placement.alloc_frames(len(entries))   # may demote (lock released meanwhile)
                except BaseException:
                    table.abort(entries)
                    raise
                finally:
                    table.leave()
                for e, f in zip(entries, frames):
                    e.frame = f
                bufs = [self._pool.view(e.frame, e.length) for e in entries]
            else:
                staging = self._alloc_staging(len(entries))
                bufs = staging.views
            h = table.add_job(_StoreJob(entries, bufs, t, staging))
            return PrepareStoreResult(h, tuple(StoreSlot(e.key, b) for e, b in zip(entries, bufs)),
                                      tuple(skipped))

    def complete_store(self, handle: int, success: bool = True) -> int:
        table = self._table
        with table.lock:
            table.check_open()
            job = table.take_job(handle, _StoreJob)
            if job is None:
                raise BadHandle(f"no store in flight with handle {handle!r}")
            if not success or not job.entries:
                table.abort(job.entries)
                self._free_staging(job.staging)
                return 0
            if job.tier is Tier.HOST:
                self._placement.publish(job.entries, Tier.HOST)
                table.counters["puts"] += len(job.entries)
                return len(job.entries)
            table.enter()
        try:
            self._placement.write_new_to_nvme(job.entries, job.bufs)
        except BaseException:
            with table.lock:
                table.abort(job.entries)
                self._free_staging(job.staging)
                table.leave()
            raise
        with table.lock:
            self._placement.publish(job.entries, Tier.NVME)
            table.counters["puts"] += len(job.entries)
            self._free_staging(job.staging)
            table.leave()
        return len(job.entries)

    def _alloc_staging(self, n: int) -> _Staging:
        """Staging buffers for ``n`` blocks (lock held): frames of the staging
        pool -- reused and pre-faulted, so copies into them run at warm-memory
        speed -- or fresh aligned memory when the pool cannot hold ``n`` now
        (counted in ``stats().staging_fallbacks``)."""
        cfg = self._cfg
        sb, bb = cfg.frame_bytes, cfg.block_bytes
        pool = self._staging_pool
        if pool is None:
            pool = self._staging_pool = FramePool(cfg.staging_bytes // sb, sb,
                                                  pin=Switch.OFF if cfg.pin_host is Switch.OFF else Switch.AUTO)
        frames = pool.alloc_many(n) if n else None
        if frames is not None:
            return _Staging(frames, None, [pool.view(f, bb) for f in frames])
        if n:
            self._table.counters["staging_fallbacks"] += 1
        buf = AlignedBuffer(max(1, n) * sb)
        return _Staging(None, buf, [buf.view(j * sb, j * sb + bb) for j in range(n)])

    def _free_staging(self, staging: _Staging | None) -> None:
        """Return a job's staging memory (frames back to the pool).  Callers hold
        the lock, so the staging books balance whenever it is free."""
        if staging is None:
            return
        if staging.frames is not None:
            with self._table.lock:
                pool = self._staging_pool
                if pool is not None and not self._table.closed:
                    for f in staging.frames:
                        pool.decref(f)
                staging.frames = None
        elif staging.buf is not None:
            staging.views = []
            staging.buf.close()
            staging.buf = None

    def prepare_load(self, ks: list[bytes]) -> PrepareLoadResult:
        table, pool, bb = self._table, self._pool, self._cfg.block_bytes
        with table.lock:
            table.check_open()
            pinned = []
            now = time.time()
            for k in ks:
                e = self._keeper.find(k)
                if e is None or not e.visible:
                    break
                table.pin(e)
                table.touch(e, now)
                pinned.append((e, e.frame))
            from_nvme = [j for j, (e, f) in enumerate(pinned) if f is None]
            land = pool.alloc_many(min(len(from_nvme), pool.free_count)) or []
            self._private_frames.update(land)
            staging = self._alloc_staging(len(from_nvme) - len(land)) if len(from_nvme) > len(land) else None
            table.enter()
        bufs: list[memoryview] = []
        try:
            views = [pool.view(f, bb) for f in land] + (staging.views if staging is not None else [])
            ok = self._io.read_verified([pinned[j][0] for j in from_nvme], views) if from_nvme else []
            cut = len(pinned)
            where = dict(zip(from_nvme, zip(views, ok)))
            for j, (e, f) in enumerate(pinned):
                if f is not None:
                    bufs.append(pool.view(f, e.length).toreadonly())
                else:
                    v, good = where[j]
                    if not good:
                        cut = j
                        break
                    bufs.append(v.toreadonly())
        except BaseException:
            with table.lock:
                for e, f in pinned:
                    table.unpin(e, f)
                self._release_private(land)
                self._free_staging(staging)
                table.leave()
            raise
        with table.lock:
            try:
                h, kept = self._settle_load(pinned, cut, from_nvme, land, staging)
            finally:
                table.leave()
        return PrepareLoadResult(h, tuple(LoadSlot(e.key, b, Tier.HOST if f is not None else Tier.NVME)
                                          for (e, f), b in zip(kept, bufs)))

    def _settle_load(self, pinned: list, cut: int, from_nvme: list[int], land: list[int],
                     staging: _Staging | None) -> tuple[int, list]:
        """After a load's reads (lock held): unpin and drop what is past the cut
        (a corrupt block is dropped), promote the blocks read into free host
        frames, keep the job.  Returns its handle and the pinned prefix."""
        table = self._table
        bad = [e for e, f in pinned[cut:cut + 1] if f is None]
        for e, f in pinned[cut:]:
            table.unpin(e, f)
        if bad:
            self._expiry.drop(bad, reason="corrupt")
        kept = pinned[:cut]
        frames = [f for _, f in kept]
        landed = dict(zip(from_nvme, land))     # request index -> host frame it was read into
        private = []
        for j, (e, _) in enumerate(kept):
            f = landed.pop(j, None)
            if f is None:
                continue
            if e.frame is None and e.pins == 1 and not e.dead and table.is_current(e):
                # promote: the frame becomes the block's host copy (owner ref 1 + our pin)
                self._private_frames.discard(f)
                e.frame = f
                self._pool.incref(f)
                frames[j] = f
                table.publish([e], on_host=True)
                table.counters["promotions"] += 1
                self._events.emit_stored([e.key], Tier.HOST)
            else:   # another reader pinned it meanwhile (its pin holds no frame): keep it private
                private.append(f)
        self._release_private(list(landed.values()))   # frames of blocks past the cut
        table.counters["hits_host"] += sum(f is not None for _, f in kept)
        table.counters["hits_nvme"] += sum(f is None for _, f in kept)
        return table.add_job(_LoadJob([e for e, _ in kept], frames, staging, private)), kept

    def _release_private(self, frames: Sequence[int]) -> None:
        """Free host frames a load job held without an owning entry (lock held)."""
        for f in frames:
            self._private_frames.discard(f)
            self._pool.decref(f)

    def complete_load(self, handle: int) -> None:
        table = self._table
        with table.lock:
            table.check_open()
            job = table.take_job(handle, _LoadJob)
            if job is None:
                raise BadHandle(f"no load in flight with handle {handle!r}")
            for e, f in zip(job.entries, job.frames):
                table.unpin(e, f)
            self._release_private(job.private)
            self._free_staging(job.staging)

