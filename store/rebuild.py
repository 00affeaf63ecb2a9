"""Rebuild the index from the slot headers (the slabs are the truth).

A scan reads every slot that has a slab file and decodes its header
(``store/record.py``):

* a header that does not decode (no magic, checksum mismatch, unknown
  version) or does not fit this store (length != block_bytes) is a free slot;
* two headers naming the same key: the newest write sequence wins, the older
  slot is free;
* block bytes are *not* verified here -- every NVMe read verifies them against
  the checksum the header (and so the rebuilt index) carries, and a block that
  fails is a miss.

A block dropped or evicted while its slot was not reused since comes back
(its header is intact): harmless, since its bytes are what its content key
names.  Nothing is tombstoned.

Only the header regions are read (4096 bytes per slot, sequential).
"""
from __future__ import annotations

import fcntl
import logging
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import xxhash

from . import record
from .aligned import AlignedBuffer
from .config import HEADER_SECTOR, StoreConfig
from .errors import RootLocked, StoreError
from .index import Index, pack_record
from .index_record import record_slot
from .io import IoOp

log = logging.getLogger("kvtier.store.rebuild")

SCAN_IO_BYTES = 8 << 20
Progress = Callable[[int, int], None]     # (slots scanned so far, slots to scan)


@dataclass
class ScanResult:
    found: dict[bytes, tuple[int, record.RecordHeader]] = field(default_factory=dict)  # key -> (slot, header)
    slots_scanned: int = 0
    empty: int = 0          # no record magic (never written, or not a record)
    bad: int = 0            # a record magic whose header fails, or does not fit this store
    superseded: int = 0     # older copies of a key that a newer sequence replaced
    seconds: float = 0.0
    moved_to: str | None = None   # where a rebuild set the damaged index aside

    def summary(self) -> str:
        return (f"{len(self.found)} blocks recovered from {self.slots_scanned} slots "
                f"({self.bad} bad headers, {self.superseded} superseded copies, {self.empty} empty) "
                f"in {self.seconds:.2f} s")


_HDR_DTYPE = np.dtype([("magic", "S4"), ("version", "<u2"), ("klen", "u1"), ("flags", "u1"), ("ns", "S8"),
                       ("length", "<u8"), ("checksum", "<u8"), ("seq", "<u8"), ("key", "V64"), ("hsum", "<u8"),
                       ("rest", "V%d" % (HEADER_SECTOR - record.HEADER_BYTES))])
assert _HDR_DTYPE.itemsize == HEADER_SECTOR


def _take_many(res: ScanResult, cfg: StoreConfig, s0: int, view: memoryview, n: int) -> None:
    """Decode ``n`` header sectors at once (numpy over the fields; the header
    checksum per candidate) -- the same checks as ``record.unpack``."""
    arr = np.frombuffer(view, dtype=_HDR_DTYPE, count=n)
    magic = arr["magic"] == record.MAGIC
    cand = np.flatnonzero(magic)
    res.empty += n - cand.size
    if not cand.size:
        return
    ok = ((arr["version"][cand] == record.FORMAT_VERSION) & (arr["flags"][cand] == 0)
          & (arr["klen"][cand] >= 1) & (arr["klen"][cand] <= record.MAX_KEY)
          & (arr["length"][cand] == cfg.block_bytes))
    hsum = arr["hsum"][cand].tolist()
    digest = xxhash.xxh3_64_intdigest
    found, good = res.found, []
    for j, i in enumerate(cand.tolist()):
        off = i * HEADER_SECTOR
        if ok[j] and digest(view[off:off + 104]) == hsum[j]:
            good.append(i)
    res.bad += cand.size - len(good)
    if not good:
        return
    g = np.asarray(good)
    klen, seq = arr["klen"][g].tolist(), arr["seq"][g].tolist()
    csum, ns = arr["checksum"][g].tolist(), arr["ns"][g].tolist()
    keys = arr["key"][g]
    bb = cfg.block_bytes
    for j, i in enumerate(good):
        k = keys[j].tobytes()[:klen[j]]
        old = found.get(k)
        if old is not None:
            res.superseded += 1
            if old[1].seq >= seq[j]:
                continue
        found[k] = (s0 + i, record.RecordHeader(key=k, namespace=ns[j].ljust(8, b"\0"), length=bb,
                                                 checksum=csum[j], seq=seq[j]))


def scan_slots(nvme, cfg: StoreConfig, progress: Progress | None = None) -> ScanResult:
    """Read the header region of every slab of ``nvme`` (an open ``NvmeTier``):
    sequential reads of ``SCAN_IO_BYTES``, ``queue_depth`` in flight, so the scan
    runs at disk speed and reads 4096 bytes per slot whatever the block size.
    Newest sequence per key wins.  A region that cannot be read counts as empty
    slots (logged).  No lock needed: it only reads; slots written meanwhile may
    be seen old or new."""
    t0 = time.perf_counter()
    res = ScanResult()
    total = nvme.n_files_slots
    sps = cfg.slots_per_slab
    per_op = max(1, SCAN_IO_BYTES // HEADER_SECTOR)
    depth = max(1, cfg.queue_depth)
    op_bytes = per_op * HEADER_SECTOR
    buf = AlignedBuffer(depth * op_bytes)
    try:
        slot = 0
        while slot < total:
            ops, starts = [], []
            while slot < total and len(ops) < depth:
                n = min(per_op, total - slot, sps - slot % sps)
                at = len(ops) * op_bytes
                view = buf.view(at, at + n * HEADER_SECTOR)
                ops.append(IoOp(False, nvme.fd_of(slot), nvme.header_offset(slot), (view,)))
                starts.append((slot, n, view))
                slot += n
            try:
                nvme.engine.start(ops).wait()
            except StoreError as exc:
                log.warning("rebuild scan: a header read failed (%s); those slots count as empty", exc)
                for _, n, _ in starts:
                    res.slots_scanned += n
                    res.empty += n
                starts = []
            for s0, n, view in starts:
                _take_many(res, cfg, s0, view, n)
                res.slots_scanned += n
            if progress is not None:
                progress(res.slots_scanned, total)
    finally:
        buf.close()
    res.seconds = time.perf_counter() - t0
    return res


def move_aside(index_dir: Path) -> Path | None:
    """Rename a damaged index directory to ``index.corrupt-<UTC time>`` (kept for
    inspection); returns the new path, or None if there was nothing to move."""
    if not index_dir.exists():
        return None
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    dst = index_dir.with_name(f"{index_dir.name}.corrupt-{stamp}")
    n = 1
    while dst.exists():
        n += 1
        dst = index_dir.with_name(f"{index_dir.name}.corrupt-{stamp}-{n}")
    index_dir.rename(dst)
    return dst


def records_of(scan: ScanResult) -> list[tuple[bytes, bytes]]:
    """Packed index records of a scan (last access = the write time in the sequence)."""
    return [(k, pack_record(k, slot, h.length, h.checksum, h.namespace, h.seq / 1e9))
            for k, (slot, h) in scan.found.items()]


def write_index(index: Index, records: list[tuple[bytes, bytes]], meta: dict[bytes, bytes],
                chunk: int = 1 << 16) -> None:
    """Commit ``records`` (packed) into a fresh index in chunks, then ``meta``."""
    records = sorted(records)
    for lo in range(0, len(records), chunk):
        index.commit(puts=records[lo:lo + chunk], packed=True)
    index.commit(meta=meta)


def unpack_slot(packed: bytes) -> int:
    """The slot a packed index record names."""
    return record_slot(packed)


@contextmanager
def closed_store_slabs(cfg: StoreConfig, before=None):
    """The slabs of a closed store, for an offline scan: holds the root's flock
    (the one an open ``TieredStore`` holds), calls ``before()`` under it, then
    yields an ``NvmeTier`` over the slabs; everything is closed on the way out.

    Raises:
        RootLocked: a ``TieredStore`` has the root open.
        StoreError: what ``before`` or opening the slabs raises.
    """
    from .io import make_engine
    from .nvme import NvmeTier

    root = cfg.root_path
    fd = os.open(root / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RootLocked(f"{root} is in use by an open TieredStore") from None
        if before is not None:
            before()
        engine = make_engine(cfg.io_engine, cfg.queue_depth)
        try:
            nvme = NvmeTier(cfg, engine, ())
            try:
                yield nvme
            finally:
                nvme.close()
        finally:
            engine.close()
    finally:
        os.close(fd)
