"""NVMe tier: preallocated slab files of fixed-size, self-describing slots.

On-disk layout under ``<root>/slabs/`` (S = slots_per_slab, H = 4096, F = frame_bytes)::

    slab-00000.kv
    +--------+--------+-- ... --+--------++-----------+-----------+-- ... --+-----------+
    | hdr 0  | hdr 1  |         | hdr S-1|| block 0   | block 1   |         | block S-1 |
    +--------+--------+-- ... --+--------++-----------+-----------+-- ... --+-----------+
    ^ 0                                  ^ S*H
      header region: one 4096-byte          block region: one frame (block rounded
      sector per slot                        up to 4096) per slot

    header sector of slot s:  file s // S, offset (s % S) * H
    block of slot s:          file s // S, offset S*H + (s % S) * F
    a header sector: the 112-byte record header (store/record.py), then zeros

A write of a run of contiguous slots is two vectored ops in the same batch:
the blocks (caller buffers that lie back to back in memory share one iovec
entry, so they go out without a copy) and their headers (one sector each),
both flushed by the same ``fdatasync`` before the index commit.  Reads touch
only the block region.  The header names key, namespace, length, xxh3
checksum and write sequence, so the index is derivable from the header
regions alone (``store/rebuild.py``): a slot whose header does not decode is
free.  The header region is always S sectors (also in a last, shorter slab),
so a later, larger ``nvme_bytes`` never moves a block.

Slab files are created lazily (``posix_fallocate``, so the blocks exist and
writes cannot hit ENOSPC later) when the allocator first hands out one of
their slots.  If the filesystem is full, the tier is capped at the slabs that
exist, marked ``full``, and ``DiskFull`` is raised; nothing stored is touched.
Once the filesystem has room for the next slab again, :meth:`NvmeTier.uncap`
(called before each placement) restores the configured capacity.

Files are opened ``O_DIRECT``; if the filesystem refuses it, buffered I/O plus
``fdatasync`` is used and a warning is logged (``direct_io="on"`` makes that
an error instead).  Buffers for I/O must be 4096-aligned, frame-sized views.
"""
from __future__ import annotations

import ctypes
import errno
import logging
import os
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from .config import ALIGN, HEADER_SECTOR, StoreConfig, Switch
from .durable import fsync_dir
from .errors import BadBuffer, DiskFull, StoreClosed, StoreError
from .hostpool import buffer_address
from .io import IoBatch, IoEngine, IoOp, Prepare
from .slots import SlotAllocator, runs_of
from .slotprep import SlotPreparer

log = logging.getLogger(__name__)

HEADER_OP_SLOTS = 256      # header sectors per header write (1 MiB; its checksums are one prepare)
UNCAP_EVERY_S = 1.0        # a capped tier looks for room for its next slab at most this often


def _span(addr: int, nbytes: int) -> memoryview:
    """A byte view of ``nbytes`` at ``addr`` -- several caller buffers that lie
    back to back in memory, written/read as one iovec entry.  It does not keep
    that memory alive: the caller holds the original buffers until the I/O is done."""
    return memoryview((ctypes.c_char * nbytes).from_address(addr)).cast("B")


def _join(headers: Sequence[memoryview], idx: list[int]) -> tuple[memoryview, ...]:
    """The header views of ``idx`` as iovec entries, adjacent ones merged."""
    out: list[memoryview] = []
    run_start, run_n, prev = None, 0, None
    for j in idx:
        a = buffer_address(headers[j])
        if prev is not None and a == prev + HEADER_SECTOR:
            run_n += 1
        else:
            if run_start is not None:
                out.append(_span(run_start, run_n * HEADER_SECTOR) if run_n > 1 else headers[first])
            run_start, run_n, first = a, 1, j
        prev = a
    out.append(_span(run_start, run_n * HEADER_SECTOR) if run_n > 1 else headers[first])
    return tuple(out)


class NvmeTier:
    """Slab files + free-slot map.  The owning store serialises ``alloc``/``free``;
    ``start_io`` may run concurrently from several threads."""

    def __init__(self, cfg: StoreConfig, engine: IoEngine, used_slots: Sequence[int]) -> None:
        self.cfg = cfg
        self.engine = engine
        self.slot_bytes = cfg.slot_bytes
        self.frame_bytes = cfg.frame_bytes
        self.sps = cfg.slots_per_slab
        self.hdr_region = self.sps * HEADER_SECTOR     # the block region starts here
        self.slab_bytes = self.hdr_region + self.sps * self.frame_bytes
        self.dir = cfg.root_path / "slabs"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.capacity = cfg.nvme_slots
        self.full = False
        self._uncap_at = 0.0     # monotonic time of the next room check while full
        self.direct: bool | None = None   # decided when the first slab opens
        self._fds: list[int] = []
        self._closed = False
        # Open the slabs that exist (in order; a gap ends the list).
        n_slabs = -(-self.capacity // self.sps) if self.capacity else 0
        for i in range(n_slabs):
            p = self._path(i)
            if not p.exists():
                break
            self._fds.append(self._open(p, create=False))
            if os.fstat(self._fds[-1]).st_size < self._slab_len(i):  # crashed while growing
                self._grow_file(i, self._fds[-1])
        if self.capacity and not self._fds and cfg.direct_io is not Switch.OFF:
            # no slab yet: find out now whether this filesystem takes O_DIRECT, so
            # the warning (or, with direct_io="on", the error) comes at open
            probe = self.dir / ".direct-probe"
            os.close(self._open(probe, create=True))
            probe.unlink()
        self.alloc_map = SlotAllocator(self.capacity, used_slots)
        # zeros over new slabs' never-used slots in idle time (store/slotprep.py); None: off
        self.prep = SlotPreparer(self, ahead_slots=self.sps) if cfg.prepare_slots and self.capacity else None

    # -- files -----------------------------------------------------------
    def _path(self, i: int) -> Path:
        return self.dir / f"slab-{i:05d}.kv"

    def _slab_len(self, i: int) -> int:
        return self.hdr_region + min(self.sps, self.cfg.nvme_slots - i * self.sps) * self.frame_bytes

    def _open(self, path: Path, create: bool) -> int:
        flags = os.O_RDWR | (os.O_CREAT if create else 0)
        want_direct = self.cfg.direct_io is not Switch.OFF and self.direct is not False
        if want_direct:
            try:
                fd = os.open(path, flags | os.O_DIRECT, 0o644)
                self.direct = True
                return fd
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                if self.cfg.direct_io is Switch.ON:
                    raise StoreError(f"{path.parent}: filesystem refuses O_DIRECT (direct_io='on')") from None
                log.warning("%s: filesystem refuses O_DIRECT; using buffered I/O + fdatasync", path.parent)
        self.direct = False
        return os.open(path, flags, 0o644)

    def _grow_file(self, i: int, fd: int) -> None:
        try:
            os.posix_fallocate(fd, 0, self._slab_len(i))
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise DiskFull(f"no space for NVMe slab {i} ({self._slab_len(i)} bytes) under {self.dir}") from None
            raise

    def _create_slab(self, i: int) -> None:
        p = self._path(i)
        fd = self._open(p, create=True)
        try:
            self._grow_file(i, fd)
        except BaseException:
            os.close(fd)
            try:
                p.unlink()
            except OSError:
                pass
            raise
        self._fds.append(fd)
        fsync_dir(self.dir)     # the new file's directory entry survives a crash
        if self.prep is not None:
            self.prep.note_created(i * self.sps, min(self.capacity, (i + 1) * self.sps))

    # -- slots -----------------------------------------------------------
    @property
    def free_slots(self) -> int:
        return self.alloc_map.free_count

    def alloc(self, n: int) -> list[int] | None:
        """``n`` slots (contiguous when possible), slab files created as needed.

        Returns ``None`` if fewer than ``n`` are free.  Raises ``DiskFull`` if
        a slab cannot be created (the tier is then capped and marked full).
        """
        self._check_open()
        if self.prep is None:
            return self._alloc(n)
        with self.prep.lock:        # the preparer never zeroes a slot handed out
            slots = self._alloc(n)
            self.prep.note_alloc(slots or ())
        return slots

    def _alloc(self, n: int) -> list[int] | None:
        slots = self.alloc_map.alloc(n)
        if slots is None:
            return None
        need = max(slots) // self.sps + 1 if slots else 0
        try:
            while len(self._fds) < need:
                self._create_slab(len(self._fds))
        except DiskFull:
            self.alloc_map.free(slots)
            cap = len(self._fds) * self.sps
            self.alloc_map.cap(cap)
            self.capacity = min(self.capacity, cap)
            self.full = True
            log.warning("NVMe tier full at %d slots (%d bytes): filesystem out of space",
                        self.capacity, self.capacity * self.slot_bytes)
            raise
        return slots

    def free(self, slots: Sequence[int]) -> None:
        self.alloc_map.free(slots)

    def uncap(self) -> bool:
        """A tier capped by a full filesystem gets its configured capacity back once the
        filesystem has room for its next slab (checked at most every ``UNCAP_EVERY_S``;
        the slab is created by the alloc that needs it, which caps again if the room is
        gone by then).  Returns True if the capacity grew.  The owning store serialises it
        with ``alloc``/``free``.  Never raises (a failed check leaves the cap)."""
        if not self.full or time.monotonic() < self._uncap_at:
            return False
        self._uncap_at = time.monotonic() + UNCAP_EVERY_S
        try:
            st = os.statvfs(self.dir)
        except OSError:
            return False
        if st.f_bavail * st.f_frsize < self._slab_len(len(self._fds)) + (1 << 20):
            return False
        self.alloc_map.grow(self.cfg.nvme_slots)
        self.capacity, self.full = self.cfg.nvme_slots, False
        log.warning("NVMe tier: the filesystem has room again; capacity back to %d slots", self.capacity)
        return True

    # -- I/O -------------------------------------------------------------
    def _check_buf(self, b: memoryview, addr: int) -> None:
        if b.nbytes != self.frame_bytes:
            raise BadBuffer(f"I/O buffer is {b.nbytes} bytes, blocks in slots are {self.frame_bytes}")
        if self.direct and addr % ALIGN:
            raise BadBuffer(f"I/O buffer at 0x{addr:x} is not {ALIGN}-aligned (O_DIRECT)")

    def ops(self, write: bool, slots: Sequence[int], bufs: Sequence[memoryview],
            headers: Sequence[memoryview] | None = None) -> list[IoOp]:
        return self.plan(write, slots, bufs, headers=headers)[0]

    def plan(self, write: bool, slots: Sequence[int], bufs: Sequence[memoryview],
             addrs: Sequence[int] | None = None, headers: Sequence[memoryview] | None = None,
             prepare: Prepare | None = None) -> tuple[list[IoOp], list[list[int]]]:
        """Coalesce (slot, buffer) pairs into vectored ops over contiguous slot runs
        of at most ``slots_per_io`` slots within one slab.  Returns the ops and,
        per op, the indices (into ``slots``) it covers.

        Each run is one op over the block region (buffers adjacent in memory
        share an iovec entry; ``addrs`` are their addresses if the caller has
        them).  A write adds, after all block ops, ops over the header region
        writing ``headers`` (one aligned 4096-byte view per slot; up to
        ``HEADER_OP_SLOTS`` contiguous slots per op).  ``prepare(indices)``, if
        given, returns the callable the engine runs right before issuing the
        header op covering ``indices`` (it fills those headers: a header carries
        its block's checksum).  Raises ``BadBuffer`` for a wrong-size or (O_DIRECT)
        unaligned buffer, ``ValueError`` if a write has no headers."""
        self._check_open()
        n = len(slots)
        if n != len(bufs):
            raise ValueError("slots and buffers differ in length")
        if write and (headers is None or len(headers) != n):
            raise ValueError("a slot write needs one header sector per slot")
        if addrs is None:
            addrs = [buffer_address(b) for b in bufs]
        fb, sps, per_io = self.frame_bytes, self.sps, self.cfg.slots_per_io
        direct = self.direct
        for b, a in zip(bufs, addrs):          # inline checks; _check_buf words the error
            if b.nbytes != fb or (direct and a % ALIGN):
                self._check_buf(b, a)
        ops: list[IoOp] = []
        groups: list[list[int]] = []
        if n == 0:
            return ops, groups
        # Vectorised planning: sort by slot, cut runs where slots stop being
        # consecutive, cross a slab, or reach slots_per_io; within an op, cut
        # iovec entries where buffers stop being adjacent in memory.
        s_arr = np.asarray(slots, dtype=np.int64)
        order = np.argsort(s_arr, kind="stable")
        ss = s_arr[order]
        if int(ss[-1]) >= len(self._fds) * sps:
            raise StoreError(f"slot {int(ss[-1])} has no slab file")
        a_sorted = np.asarray(addrs, dtype=np.uint64)[order]
        cut = np.flatnonzero((np.diff(ss) != 1) | (np.diff(ss // sps) != 0)) + 1
        mem_cut = np.diff(a_sorted) != np.uint64(fb)      # True: next buffer not adjacent
        order_l = order.tolist()
        bounds = [0, *cut.tolist(), n]
        hdr_region = self.hdr_region
        for r0, r1 in zip(bounds, bounds[1:]):
            for lo in range(r0, r1, per_io):
                hi = min(r1, lo + per_io)
                segs = [lo, *(np.flatnonzero(mem_cut[lo:hi - 1]) + lo + 1).tolist(), hi]
                iov = tuple(bufs[order_l[p]] if q - p == 1 else _span(int(a_sorted[p]), (q - p) * fb)
                            for p, q in zip(segs, segs[1:]))
                s0 = int(ss[lo])
                ops.append(IoOp(write, self._fds[s0 // sps], hdr_region + (s0 % sps) * fb, iov))
                groups.append(order_l[lo:hi])
        if write:
            # header sectors after every block op: the blocks stream out at once while
            # the headers' checksums are computed; a run of up to HEADER_OP_SLOTS
            # contiguous slots is one header op
            for r0, r1 in zip(bounds, bounds[1:]):
                for lo in range(r0, r1, HEADER_OP_SLOTS):
                    idx = order_l[lo:min(r1, lo + HEADER_OP_SLOTS)]
                    s0 = int(ss[lo])
                    ops.append(IoOp(True, self._fds[s0 // sps], (s0 % sps) * HEADER_SECTOR, _join(headers, idx),
                                    prepare(idx) if prepare is not None else None))
                    groups.append(idx)
        return ops, groups

    def header_offset(self, slot: int) -> int:
        """Byte offset of a slot's header sector in its slab file."""
        return (slot % self.sps) * HEADER_SECTOR

    def fd_of(self, slot: int) -> int:
        """The open slab file holding ``slot`` (the rebuild scan reads through it)."""
        self._check_open()
        return self._fds[slot // self.sps]

    @property
    def n_files_slots(self) -> int:
        """Slots that have a slab file (the rest of the capacity was never used)."""
        return min(self.capacity, len(self._fds) * self.sps)

    def start_io(self, write: bool, slots: Sequence[int], bufs: Sequence[memoryview],
                 addrs: Sequence[int] | None = None, headers: Sequence[memoryview] | None = None,
                 prepare: Prepare | None = None) -> IoBatch:
        """Start the coalesced I/O (see ``plan``); ``batch.groups[i]`` lists the
        indices op ``i`` covers.  The buffers must stay alive and unchanged
        (writes) until the batch is waited."""
        ops, groups = self.plan(write, slots, bufs, addrs, headers, prepare)
        if self.prep is not None:       # a read makes the disk busy too: the zeros wait for idle time
            self.prep.note_io()
        batch = self.engine.start(ops)
        batch.groups = groups
        return batch

    def sync(self, slots: Sequence[int]) -> None:
        """fdatasync the slabs holding ``slots`` (call after their writes completed)."""
        self._check_open()
        for i in sorted({s // self.sps for s in slots}):
            os.fdatasync(self._fds[i])

    def locate(self, slot: int) -> tuple[Path, int]:
        """(slab path, byte offset of the block) of a slot -- for tools and
        fault-injection tests (its header sector: ``header_offset``)."""
        return self._path(slot // self.sps), self.hdr_region + (slot % self.sps) * self.frame_bytes

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosed("NVMe tier is closed")

    def close(self) -> None:
        if self._closed:
            return
        if self.prep is not None:
            self.prep.close()       # before its files close
        self._closed = True
        for fd in self._fds:
            os.close(fd)
        self._fds.clear()


__all__ = ["NvmeTier", "runs_of"]
