"""NVMe tier: preallocated slab files of fixed-size, 4096-aligned slots.

On-disk layout under ``<root>/slabs/``::

    slab-00000.kv                          slab-00001.kv
    +--------+--------+-- ... --+--------+ +--------+-- ...
    | slot 0 | slot 1 |         | slot   | | slot S | ...
    |        |        |         |  S-1   | |        |
    +--------+--------+-- ... --+--------+ +--------+-- ...
    ^ offset 0         each slot = slot_bytes (block rounded up to 4096)

    global slot s  ->  file s // S, offset (s % S) * slot_bytes
    S = slots_per_slab; a block occupies exactly one slot, bytes
    [0, length) are the block, the rest of the slot is padding.

Slab files are created lazily (``posix_fallocate``, so the blocks exist and
writes cannot hit ENOSPC later) when the allocator first hands out one of
their slots.  If the filesystem is full, the tier is capped at the slabs that
exist, marked ``full``, and ``DiskFull`` is raised; nothing stored is touched.
The slabs hold bytes only: which slot holds which block (and its checksum)
lives in the LMDB index, so a slot whose index entry never committed is free.

Files are opened ``O_DIRECT``; if the filesystem refuses it, buffered I/O plus
``fdatasync`` is used and a warning is logged (``direct_io="on"`` makes that
an error instead).  Buffers for I/O must be 4096-aligned, slot-sized views.
"""
from __future__ import annotations

import ctypes
import errno
import logging
import os
from pathlib import Path
from typing import Sequence

import numpy as np

from .config import ALIGN, StoreConfig
from .errors import BadBuffer, DiskFull, StoreClosed, StoreError
from .hostpool import buffer_address
from .io import IoBatch, IoEngine, IoOp
from .slots import SlotAllocator, runs_of

log = logging.getLogger(__name__)


def _span(addr: int, nbytes: int) -> memoryview:
    """A byte view of ``nbytes`` at ``addr`` -- several caller buffers that lie
    back to back in memory, written/read as one iovec entry.  It does not keep
    that memory alive: the caller holds the original buffers until the I/O is done."""
    return memoryview((ctypes.c_char * nbytes).from_address(addr)).cast("B")


class NvmeTier:
    """Slab files + free-slot map.  The owning store serialises ``alloc``/``free``;
    ``start_io`` may run concurrently from several threads."""

    def __init__(self, cfg: StoreConfig, engine: IoEngine, used_slots: Sequence[int]) -> None:
        self.cfg = cfg
        self.engine = engine
        self.slot_bytes = cfg.slot_bytes
        self.sps = cfg.slots_per_slab
        self.slab_bytes = self.sps * self.slot_bytes
        self.dir = cfg.root_path / "slabs"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.capacity = cfg.nvme_slots
        self.full = False
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
        if self.capacity and not self._fds and cfg.direct_io != "off":
            # no slab yet: find out now whether this filesystem takes O_DIRECT, so
            # the warning (or, with direct_io="on", the error) comes at open
            probe = self.dir / ".direct-probe"
            os.close(self._open(probe, create=True))
            probe.unlink()
        self.alloc_map = SlotAllocator(self.capacity, used_slots)

    # -- files -----------------------------------------------------------
    def _path(self, i: int) -> Path:
        return self.dir / f"slab-{i:05d}.kv"

    def _slab_len(self, i: int) -> int:
        return min(self.sps, self.capacity - i * self.sps) * self.slot_bytes

    def _open(self, path: Path, create: bool) -> int:
        flags = os.O_RDWR | (os.O_CREAT if create else 0)
        want_direct = self.cfg.direct_io != "off" and self.direct is not False
        if want_direct:
            try:
                fd = os.open(path, flags | os.O_DIRECT, 0o644)
                self.direct = True
                return fd
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                if self.cfg.direct_io == "on":
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
        dfd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(dfd)   # the new file's directory entry survives a crash
        finally:
            os.close(dfd)

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

    # -- I/O -------------------------------------------------------------
    def _check_buf(self, b: memoryview, addr: int) -> None:
        if b.nbytes != self.slot_bytes:
            raise BadBuffer(f"I/O buffer is {b.nbytes} bytes, slots are {self.slot_bytes}")
        if self.direct and addr % ALIGN:
            raise BadBuffer(f"I/O buffer at 0x{addr:x} is not {ALIGN}-aligned (O_DIRECT)")

    def ops(self, write: bool, slots: Sequence[int], bufs: Sequence[memoryview]) -> list[IoOp]:
        return self.plan(write, slots, bufs)[0]

    def plan(self, write: bool, slots: Sequence[int], bufs: Sequence[memoryview],
             addrs: Sequence[int] | None = None) -> tuple[list[IoOp], list[list[int]]]:
        """Coalesce (slot, buffer) pairs into vectored ops over contiguous slot runs
        of at most ``slots_per_io`` slots within one slab.  Returns the ops and,
        per op, the indices (into ``slots``) it covers.

        ``addrs`` (the buffers' addresses, if the caller has them) lets buffers
        that are also adjacent in memory share one iovec entry.  Raises
        ``BadBuffer`` for a wrong-size or (O_DIRECT) unaligned buffer."""
        self._check_open()
        n = len(slots)
        if n != len(bufs):
            raise ValueError("slots and buffers differ in length")
        if addrs is None:
            addrs = [buffer_address(b) for b in bufs]
        sb, sps, per_io = self.slot_bytes, self.sps, self.cfg.slots_per_io
        direct = self.direct
        for b, a in zip(bufs, addrs):          # inline checks; _check_buf words the error
            if b.nbytes != sb or (direct and a % ALIGN):
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
        mem_cut = np.diff(a_sorted) != np.uint64(sb)      # True: next buffer not adjacent
        order_l = order.tolist()
        bounds = [0, *cut.tolist(), n]
        for r0, r1 in zip(bounds, bounds[1:]):
            for lo in range(r0, r1, per_io):
                hi = min(r1, lo + per_io)
                segs = [lo, *(np.flatnonzero(mem_cut[lo:hi - 1]) + lo + 1).tolist(), hi]
                iov = tuple(bufs[order_l[p]] if q - p == 1 else _span(int(a_sorted[p]), (q - p) * sb)
                            for p, q in zip(segs, segs[1:]))
                s0 = int(ss[lo])
                ops.append(IoOp(write, self._fds[s0 // sps], (s0 % sps) * sb, iov))
                groups.append(order_l[lo:hi])
        return ops, groups

    def start_io(self, write: bool, slots: Sequence[int], bufs: Sequence[memoryview],
                 addrs: Sequence[int] | None = None) -> IoBatch:
        """Start the coalesced I/O; ``batch.groups[i]`` lists the indices op ``i`` covers.
        The buffers must stay alive and unchanged (writes) until the batch is waited."""
        ops, groups = self.plan(write, slots, bufs, addrs)
        batch = self.engine.start(ops)
        batch.groups = groups
        return batch

    def sync(self, slots: Sequence[int]) -> None:
        """fdatasync the slabs holding ``slots`` (call after their writes completed)."""
        self._check_open()
        for i in sorted({s // self.sps for s in slots}):
            os.fdatasync(self._fds[i])

    def locate(self, slot: int) -> tuple[Path, int]:
        """(slab path, byte offset) of a slot -- for tools and fault-injection tests."""
        return self._path(slot // self.sps), (slot % self.sps) * self.slot_bytes

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosed("NVMe tier is closed")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for fd in self._fds:
            os.close(fd)
        self._fds.clear()


__all__ = ["NvmeTier", "runs_of"]
