"""Block I/O paths: host-frame copies, NVMe writes (direct or bounced) and verified reads.

Mixed into ``TieredStore``.  Everything here runs *without* the store lock on
entries the caller has pinned or holds pending (``_write_new_to_nvme`` takes
the lock only to allocate slots); it reads ``config``, ``_pool``, ``_nvme``,
``_hasher``, ``_bounce`` and ``_index`` and writes only the entries' ``slot``
and ``checksum`` fields of blocks nobody else can see yet.

Checksums are computed on the hashing threads (xxh3 releases the GIL) while
the calling thread submits and reaps the I/O.
"""
from __future__ import annotations

import ctypes
import logging
import os
from typing import Sequence

import numpy as np

from .config import ALIGN
from .entry import Entry as _Entry
from .errors import StoreError
from .hostpool import buffer_address
from .index import pack_record
from .types import checksum

log = logging.getLogger("kvtier.store.tiered")

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



class BlockIO:
    """The store's copy/read/write paths (a mixin of ``TieredStore``)."""

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

