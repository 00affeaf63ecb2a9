"""Block I/O paths: host-frame copies, NVMe writes (direct or bounced) and verified reads.

Threads: ``BlockIO`` is called on the store's caller threads, several at
once, *without* the store lock, on entries the caller has pinned or holds
pending; it writes only the ``checksum`` field of blocks nobody else can see
yet (slots are reserved by ``Placement`` beforehand).  Its own fields (the
hashing threads and the per-thread bounce areas) are set at construction and
need no lock.  Checksums are computed on the hashing threads (xxh3 releases
the GIL) while the calling thread submits and reaps the I/O.

Lock order: it takes no lock of the store's; the I/O engine's and the bounce
pools' own locks are leaves.
"""
from __future__ import annotations

import ctypes
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Sequence

import numpy as np

from . import record
from .aligned import BouncePool
from .config import ALIGN, HEADER_SECTOR
from .entry import Entry as _Entry
from .errors import StoreError
from .hostpool import buffer_address
from .index import pack_record
from .record import HEADER_BYTES
from .types import checksum

log = logging.getLogger("kvtier.store.tiered")

_GIL_FREE_COPY = 1 << 20
# Reads are verified on HASH_WORKERS threads (xxh3 releases the GIL) as each
# coalesced read completes, overlapping the rest of the batch's I/O.
HASH_WORKERS = max(1, min(2, (os.cpu_count() or 2) // 2))   # 1 on a 2-core VM: less GIL churn (measured)
HASH_PART_BYTES = 16 << 20    # checksums of a write are computed in parts of this size
INLINE_HASH_BYTES = 1 << 20   # smaller writes hash on the calling thread before they are issued


def _copy(dst: memoryview, src: memoryview) -> None:
    """memcpy between equal-length 1-D byte views.  Small copies use memoryview
    assignment (least overhead); large ones numpy, which releases the GIL."""
    if dst.nbytes < _GIL_FREE_COPY:
        dst[:] = src
    else:
        np.copyto(np.frombuffer(dst, dtype=np.uint8), np.frombuffer(src, dtype=np.uint8))


_memmove = ctypes.memmove   # a foreign call: releases the GIL while it copies



class BlockIO:
    """The store's copy/read/write paths over ``pool`` (the host ``FramePool``)
    and ``nvme`` (the ``NvmeTier``); owns the hashing threads and the aligned
    bounce areas.  Call :meth:`close` once, after the last I/O."""

    def __init__(self, cfg, pool, nvme) -> None:
        self._cfg, self._pool, self._nvme = cfg, pool, nvme
        self._bounce = BouncePool()
        self._hdr_bounce = BouncePool()
        self._hasher = ThreadPoolExecutor(max_workers=HASH_WORKERS, thread_name_prefix="kvtier-hash")

    def close(self) -> None:
        """Stop the hashing threads and unmap the bounce areas."""
        self._hasher.shutdown(wait=True)
        self._bounce.close()
        self._hdr_bounce.close()

    def copy_frames(self, frames: Sequence[int], bufs: Sequence[memoryview],
                     addrs: Sequence[int | None], into: bool) -> None:
        """Copy block buffers into (``into``) or out of host frames.  Blocks whose
        frames are adjacent and whose buffers lie back to back in memory are
        copied as one run (one large memcpy, GIL released); a buffer with no
        known address (read-only) is copied on its own."""
        pool = self._pool
        fb, base, bb = pool.frame_bytes, pool.address, self._cfg.block_bytes
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


    # -- NVMe writes -------------------------------------------------------
    def _header_views(self, n: int) -> list[memoryview]:
        """``n`` aligned, zeroed-past-the-record header sectors (this thread's reusable area)."""
        buf = self._hdr_bounce.get(n * HEADER_SECTOR)
        return [buf.view(j * HEADER_SECTOR, (j + 1) * HEADER_SECTOR) for j in range(n)]

    def write_slots(self, entries: Sequence[_Entry], slots: Sequence[int], srcs: Sequence[memoryview],
                     addrs: Sequence[int] | None, seq0: int) -> list[bytes]:
        """Write blocks from aligned, frame-sized ``srcs`` straight into ``slots``
        (no copy) and their record headers into the slabs' header regions, in
        the same batch, then flush.  A header carries its block's checksum: the
        hashing threads start on the blocks at once, in parts, while the block
        writes (issued first) are in flight; a header op waits (``IoOp.prepare``)
        only for the parts it covers.  Sets ``e.checksum``; returns the packed
        index records.  No lock held."""
        n = len(entries)
        headers = self._header_views(n)
        records: list[bytes] = [b""] * n

        def hash_part(part: range) -> None:
            for j in part:
                e = entries[j]
                c = e.checksum = checksum(srcs[j][:e.length])
                headers[j][:HEADER_BYTES] = record.pack(e.key, e.ns, e.length, c, seq0 + j)
                records[j] = pack_record(e.key, slots[j], e.length, c, e.ns, e.last_access)

        if n * self._cfg.block_bytes <= INLINE_HASH_BYTES:
            hash_part(range(n))          # small: no thread hand-off
            self._nvme.start_io(True, slots, srcs, addrs, headers=headers).wait()
        else:
            parts = self._hash_parts(n)
            futs = [self._hasher.submit(hash_part, part) for part in parts]
            per = parts[0].stop - parts[0].start

            def prepare(idx: list[int]):
                def wait() -> None:
                    for p in sorted({j // per for j in idx}):
                        futs[p].result()
                return wait
            try:
                self._nvme.start_io(True, slots, srcs, addrs, headers=headers, prepare=prepare).wait()
            finally:
                for f in futs:           # never leave a thread reading the caller's buffers
                    f.result()
        if self._cfg.durable:
            self._nvme.sync(slots)
        return records

    def _hash_parts(self, n: int) -> list[range]:
        """Split ``n`` blocks into contiguous parts of about HASH_PART_BYTES."""
        per = max(1, HASH_PART_BYTES // self._cfg.block_bytes)
        return [range(lo, min(n, lo + per)) for lo in range(0, n, per)]

    def write_frames(self, entries: list[_Entry], slots: list[int], seq0: int) -> list[bytes]:
        """Write pinned host frames to ``slots`` (demotion) and flush; returns the records."""
        pool = self._pool
        bufs = [pool.view(e.frame) for e in entries]
        return self.write_slots(entries, slots, bufs,
                                 [pool.address + e.frame * pool.frame_bytes for e in entries], seq0)

    def write_new(self, entries: list[_Entry], srcs: list[memoryview], addrs: list[int] | None,
                  slots: list[int], seq0: int) -> list[bytes]:
        """Write pending entries' bytes into their reserved ``slots`` and flush:
        straight from aligned, frame-sized sources, else through the bounce
        area.  Sets ``e.checksum``; returns the packed index records.  No lock held."""
        cfg = self._cfg
        if cfg.block_bytes != cfg.frame_bytes:
            addrs = None
        elif addrs is None:
            addrs = [buffer_address(s) for s in srcs]
        if addrs is not None and not any(a % ALIGN for a in addrs):
            return self.write_slots(entries, slots, srcs, addrs, seq0)
        return self._write_bounced(entries, srcs, slots, seq0)

    def _write_bounced(self, entries, srcs, slots, seq0: int) -> list[bytes]:
        """Unaligned sources (or padded blocks): stage through a double-buffered
        aligned bounce area chunk by chunk (copy + checksum + header), the
        staging of chunk i+1 overlapping the writes of chunk i; then flush."""
        cfg = self._cfg
        n = len(entries)
        fb = cfg.frame_bytes
        chunk = max(1, cfg.slots_per_io * cfg.queue_depth)
        bounce = self._bounce.get(min(n, 2 * chunk) * fb)
        headers = self._header_views(min(n, 2 * chunk))
        records: list[bytes] = [b""] * n

        def stage(lo: int, hi: int, half: int) -> tuple[list[memoryview], list[memoryview]]:
            out, hdrs = [], []
            for j in range(lo, hi):
                e = entries[j]
                c = e.checksum = checksum(srcs[j])
                at = half * chunk + (j - lo)
                b = bounce.view(at * fb, (at + 1) * fb)
                _copy(b[:cfg.block_bytes], srcs[j])
                h = headers[at]
                h[:HEADER_BYTES] = record.pack(e.key, e.ns, e.length, c, seq0 + j)
                records[j] = pack_record(e.key, slots[j], e.length, c, e.ns, e.last_access)
                out.append(b)
                hdrs.append(h)
            return out, hdrs

        bounds = [(lo, min(n, lo + chunk)) for lo in range(0, n, chunk)]
        bufs, hdrs = stage(*bounds[0], 0)
        for i, (lo, hi) in enumerate(bounds):
            batch = self._nvme.start_io(True, slots[lo:hi], bufs, headers=hdrs)
            try:
                if i + 1 < len(bounds):
                    bufs, hdrs = stage(*bounds[i + 1], (i + 1) % 2)
            finally:
                batch.wait()
        if cfg.durable:
            self._nvme.sync(slots)
        return records

    def read_verified(self, entries: list[_Entry], dsts: list[memoryview],
                       dst_addrs: list[int] | None = None,
                       while_reading: Callable[[], None] | None = None) -> list[bool]:
        """Read pinned NVMe entries into ``dsts`` and verify their checksums (no
        lock held).  Verification runs as each coalesced read completes, while the
        rest are in flight.  A block that fails (checksum or I/O) has its ``dst``
        zeroed and reads as False.  ``while_reading`` (e.g. a batch's DRAM
        copies) runs once on this thread while the first reads are in flight;
        if it raises, the reads in flight still land before the error goes on."""
        cfg = self._cfg
        n = len(entries)
        ok = [False] * n
        if cfg.block_bytes != cfg.frame_bytes:
            addrs = None
        else:
            addrs = dst_addrs if dst_addrs is not None else [buffer_address(d) for d in dsts]
        direct = addrs is not None and not any(a % ALIGN for a in addrs)
        chunk = n if direct else max(1, cfg.slots_per_io * cfg.queue_depth)
        fb = cfg.frame_bytes
        bounce = None if direct else self._bounce.get(min(n, chunk) * fb)
        for lo in range(0, n, chunk):
            hi = min(n, lo + chunk)
            if direct:
                bufs, baddrs = dsts[lo:hi], addrs[lo:hi]
            else:
                bufs = [bounce.view(j * fb, (j + 1) * fb) for j in range(hi - lo)]
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

            try:
                if while_reading is not None:
                    beside, while_reading = while_reading, None
                    beside()
            finally:
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

