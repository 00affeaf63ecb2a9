"""Faults on kvtier's data dir as a filesystem: ``fs-full`` (the size-limited mount filled to the
last block, then freed) and ``files-damage`` (one of kvtier's files other than slabs and the LMDB
data file flipped, truncated, filled with garbage or deleted while the engine serves).

What kvtier keeps under its data dir (``rig.data_dir``; the store root is ``<model>-w<world>``
inside it; engine_adapter/vllm_parts.py)::

    <root>/FORMAT               format marker + layout (store/layout.py), written at creation
    <root>/LOCK                 flock of the open store (empty)
    <root>/OPEN                 boot id while open (store/unclean.py)
    <root>/kvtier-stats.json    stats snapshot every few seconds (engine_adapter/vllm_metrics.py)
    <root>/index/data.mdb       LMDB index: IndexFlip / IndexTruncate (faults.py)
    <root>/index/lock.mdb       only an older kvtier's (LMDB now runs without a lock file: store/index.py)
    <root>/slabs/slab-*.kv      slabs: SlabFlip (faults.py)
    <root>/index.corrupt-<t>/   an index set aside by a rebuild (never read again: not damaged here)
    <root>.unreadable/          a root the engine set aside (engine_adapter/store_open.py): not either
    transient: FORMAT.tmp, OPEN.tmp, .kvtier-stats.json.<pid>, .kvtier-speed-probe, slabs/.direct-probe

Both classes follow faults.py's contract (``inject``/``recover`` raise ``FaultError`` when they
cannot do their part); called from the faults thread only.
"""
from __future__ import annotations

import errno
import os
import random
from pathlib import Path

from kvtier.bench.soak_live.faults import Fault, FaultError, flip_bytes
from kvtier.bench.soak_live.rig import Rig

FILLER = ".soak-fs-full-filler"
_OWN_FAULTS = ("data.mdb",)          # damaged by IndexFlip / IndexTruncate
_NOT_KVTIER = {FILLER, "lost+found"}


def fill_filesystem(path: Path) -> int:
    """Allocate every block the filesystem of ``path``'s folder still gives to a writer, into
    the new file ``path``; returns the bytes allocated.  ``posix_fallocate`` in halving pieces,
    then block-sized writes of zeros until ENOSPC.

    Raises:
        FaultError: ``path`` exists already, or a failure other than ENOSPC/EDQUOT.
    """
    full = (errno.ENOSPC, errno.EDQUOT)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        raise FaultError(f"{path}: {exc}") from None
    off = 0
    try:
        unit = max(512, os.statvfs(path.parent).f_frsize)     # the filesystem's block
        piece = _free_bytes(path.parent)
        while piece >= unit:
            try:
                os.posix_fallocate(fd, off, piece)
                off += piece
                piece = _free_bytes(path.parent)
            except OSError as exc:
                if exc.errno not in full:
                    raise
                piece = piece // 2 // unit * unit
        zeros = bytes(unit)
        os.lseek(fd, off, os.SEEK_SET)
        while True:
            try:
                n = os.write(fd, zeros)
            except OSError as exc:
                if exc.errno not in full:
                    raise
                break
            off += n
            if n < len(zeros):
                break
        try:
            os.fsync(fd)        # delayed allocation: the blocks are taken now, not at writeback
        except OSError as exc:
            if exc.errno not in full:
                raise
    except OSError as exc:
        raise FaultError(f"filling {path}: {exc}") from None
    finally:
        os.close(fd)
    return off


def _free_bytes(folder: Path) -> int:
    st = os.statvfs(folder)
    return st.f_bavail * st.f_frsize


class FsFull(Fault):
    """kvtier's data dir (a size-limited mount the rig made: bench/soak_live/fsmount.py) filled
    to the last block while the engine serves: new slabs, LMDB commits that grow the index and
    the stats snapshot get ENOSPC.  Recover deletes the filler."""
    name = "fs-full"

    def inject(self, rig: Rig, rng: random.Random) -> str:
        d = Path(rig.data_dir)
        if not os.path.ismount(d):
            raise FaultError(f"the data dir is not a size-limited mount ({d} is no mount point): "
                             f"the rig must mount it before the engine starts")
        took = fill_filesystem(d / FILLER)
        return f"{d} filled: {took} bytes in {FILLER}, {_free_bytes(d)} bytes left"

    def recover(self, rig: Rig, rng: random.Random) -> str:
        p = Path(rig.data_dir) / FILLER
        try:
            size = p.stat().st_blocks * 512
            p.unlink()
        except FileNotFoundError:
            return "no filler to delete"
        except OSError as exc:
            raise FaultError(f"{p}: {exc}") from None
        return f"filler deleted: {size} bytes free again ({_free_bytes(p.parent)} free)"


def kvtier_files(data_dir: Path) -> list[Path]:
    """Every regular file kvtier keeps under ``data_dir`` except those other faults damage (slab
    files, ``data.mdb``) and what was set aside (``index.corrupt-*``, ``*.unreadable``), sorted."""
    out = []
    for p in sorted(Path(data_dir).rglob("*")):
        rel = p.relative_to(data_dir).parts
        if any(part in _NOT_KVTIER or part.startswith("index.corrupt-") or part.endswith(".unreadable")
               for part in rel):
            continue
        if p.name in _OWN_FAULTS or (p.name.startswith("slab-") and p.suffix == ".kv"):
            continue
        if p.is_file() and not p.is_symlink():
            out.append(p)
    return out


def damage_file(p: Path, rng: random.Random) -> str:
    """One seeded damage to ``p``: bytes flipped, cut short, or deleted (an empty file: garbage
    written into it, or deleted).  Returns what was done.  Raises FaultError."""
    try:
        size = p.stat().st_size
        how = rng.choice(("flip", "truncate", "delete") if size else ("garbage", "delete"))
        if how == "flip":
            offsets = flip_bytes(p, rng, min(16, size))
            return f"{len(offsets)} bytes flipped in {p.name} ({size} bytes)"
        if how == "truncate":
            keep = rng.randrange(size)
            os.truncate(p, keep)
            return f"{p.name} cut from {size} to {keep} bytes"
        if how == "garbage":
            with open(p, "r+b") as f:
                f.write(rng.randbytes(64))
            return f"64 random bytes written into the empty {p.name}"
        p.unlink()
        return f"{p.name} deleted"
    except OSError as exc:
        raise FaultError(f"{p}: {exc}") from None


class FilesDamage(Fault):
    """One of kvtier's files under its data dir (:func:`kvtier_files`), picked by the seed,
    damaged while the engine serves (:func:`damage_file`).  The damage stays; kvtier must serve
    on (a miss, a rebuild) and, at the next start on this data dir, open or refuse with one
    clear StoreError."""
    name = "files-damage"

    def inject(self, rig: Rig, rng: random.Random) -> str:
        d = Path(rig.data_dir)
        files = kvtier_files(d)
        if not files:
            raise FaultError(f"no kvtier file to damage under {d}")
        p = rng.choice(files)
        return f"{p.relative_to(d)}: {damage_file(p, rng)}"
