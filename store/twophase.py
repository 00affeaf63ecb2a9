"""Two-phase jobs: ``prepare_store``/``complete_store`` and ``prepare_load``/``complete_load``.

Mixed into ``TieredStore``.  A job is plain data kept in ``_handles`` under
the store lock until its ``complete_*``; staging memory (frames of a reusable,
pre-faulted pool, or a fresh aligned mapping when the pool cannot hold the
request) is leased to the job and returned when it completes.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

from .aligned import AlignedBuffer
from .entry import Entry as _Entry
from .errors import BadHandle
from .hostpool import FramePool
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
    """Two-phase store and load (a mixin of ``TieredStore``)."""

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
                if self._find(k, settle=False) is not None or k in seen:
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
        sb, bb = cfg.frame_bytes, cfg.block_bytes
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
                e = self._find(k)
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
                    self.events.emit_stored([e.key], "host")
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

