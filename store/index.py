"""Durable block index in LMDB.

One record per block that lives on the NVMe tier (the host tier is volatile
and never indexed)::

    key (1..64 bytes) -> 48-byte record (``store/index_record.py``): slot,
        length, payload checksum, namespace, last access, and a check over
        the key and those fields

A record is committed only after its bytes are written and flushed to the
slab (the store enforces that order), so every record on disk names durable
bytes.  The ``meta`` database pins the layout (block/slot size, slots per
slab); reopening with another layout raises ``ConfigMismatch``.
When the LMDB map fills, it is doubled and the transaction retried.

Durability of a commit.  The index is not on the durable path: a block is
durable once its slab bytes and slot header were flushed (the store acknowledges
the put then), and the header alone makes it recoverable (``store/rebuild.py``).
With ``durable=True`` and ``metasync=False`` (the default) a commit writes its
pages to the page cache only (MDB_NOSYNC: no device flush on the put's path);
the background flusher makes them durable within ``flush_s`` of the last commit
(one ``env.sync``), and ``close()`` does.  A killed process loses nothing (the
page cache holds every commit); a power loss or kernel crash may lose or tear
the unflushed commits, which the store detects at the next open
(``store/unclean.py``: the machine restarted while the store was open) and
repairs by rebuilding the index from the slot headers -- so every acknowledged
block is back.  ``metasync=True``: every commit is flushed before it returns
(data and meta pages: two device flushes), no rebuild is ever needed for it.
Writes (``commit``) and reads are serialised by the index's own lock, so the
store can commit without holding its metadata lock (lock order: store lock ->
index lock).  LMDB runs without its lock file (MDB_NOLOCK: no ``lock.mdb``):
only the process holding the root's flock ever opens the index, and that lock
keeps every reader out while a writer reuses pages.  A ``lock.mdb`` is shared
memory LMDB trusts blindly -- one cut short while mapped is a SIGBUS, a damaged
writer mutex a commit that waits forever -- so the index keeps none.

Damage.  The index is an accelerator, not the truth (every slot carries its own
header, see ``store/rebuild.py``).  Before LMDB maps ``data.mdb``,
``validate_file`` checks both meta pages (page flag, magic, version, page
size) and that the file holds every page the newest meta names, so a
truncated, zeroed or foreign file is never mapped (a mapped page past the end
of the file is a SIGBUS).  The file is then padded with a guard zone of zeros
so a damaged in-page offset cannot read past its end either; values are read
as buffers and checked for their size before a byte of them is touched.  Any
LMDB failure that means damage raises ``IndexCorrupt``; other failures
``StoreError`` -- never a raw ``lmdb.Error``.  So does damage LMDB cannot
see: a record whose check fails, keys out of order, or a walk that finds
more or fewer records than the table counts (a damaged page hides some).
The ``meta`` marker ``record_format`` says the records carry checks; an index
without it (an older kvtier's) is damage too, so it is rebuilt once.
"""
from __future__ import annotations

import errno
import json
import logging
import struct
import threading
from pathlib import Path
from typing import Iterable, Iterator

import lmdb

from .errors import ConfigMismatch, DiskFull, IndexCorrupt, StoreError
from .index_record import RECORD_FORMAT, REC_BYTES, TIER_NVME, IndexRecord, pack_record

__all__ = ["Index", "IndexRecord", "pack_record", "REC_BYTES", "TIER_NVME", "validate_file", "GUARD_BYTES"]

log = logging.getLogger(__name__)


# LMDB's meta page (lmdb 0.9, mdb.c): 16-byte page header, then MDB_meta.
_MDB_MAGIC, _MDB_VERSION, _P_META = 0xBEEFC0DE, 1, 0x08
_RECORD_FORMAT_KEY = b"record_format"
GUARD_BYTES = 256 << 10      # zeros kept past the last page: an in-page offset reaches < 128 KiB beyond
# lmdb errors that mean the file is damaged (the rest are resource or usage errors)
_DAMAGE = tuple(getattr(lmdb, n) for n in ("CorruptedError", "PageNotFoundError", "InvalidError",
                                           "BadTxnError", "BadValsizeError", "PanicError",
                                           "VersionMismatchError", "BadDbiError", "IncompatibleError",
                                           "InvalidParameterError", "BadRslotError")
                if hasattr(lmdb, n))


def _meta(page: bytes) -> tuple[int, int, int, int] | None:
    """(page size, last page, txn id, main root) of a valid meta page, else None."""
    if len(page) < 152:
        return None
    _pgno, _pad, flags = struct.unpack_from("<QHH", page, 0)
    magic, version = struct.unpack_from("<II", page, 16)
    if not flags & _P_META or magic != _MDB_MAGIC or version != _MDB_VERSION:
        return None
    psize = struct.unpack_from("<I", page, 40)[0]
    last_pg, txnid = struct.unpack_from("<QQ", page, 136)
    root = struct.unpack_from("<Q", page, 128)[0]
    if psize < 512 or psize > (1 << 16) or psize & (psize - 1):
        return None
    return psize, last_pg, txnid, root


def validate_file(path: Path) -> str | None:
    """Why ``<path>/data.mdb`` must not be mapped, or None if it looks sound.

    Checks both meta pages (flag, magic, version, page size) and that the file
    is at least as long as the pages the newest meta names.  Reads with plain
    ``read`` calls: never maps the file."""
    f = path / "data.mdb"
    try:
        size = f.stat().st_size
        with open(f, "rb") as fh:
            head = fh.read(4096)
            m0 = _meta(head)
            if m0 is None:
                return "meta page 0 is not an LMDB meta page"
            fh.seek(m0[0])
            m1 = _meta(fh.read(m0[0]))
    except FileNotFoundError:
        return "data.mdb is missing"
    except OSError as exc:
        return f"data.mdb cannot be read: {exc.strerror}"
    if m1 is None:
        return "meta page 1 is not an LMDB meta page"
    if m0[0] != m1[0]:
        return "the two meta pages disagree on the page size"
    psize = m0[0]
    for i, m in enumerate((m0, m1)):
        if (m[1] + 1) * psize > size:
            return f"meta page {i} names {m[1] + 1} pages; the file holds {size // psize}"
        if m[3] != (1 << 64) - 1 and m[3] > m[1]:
            return f"meta page {i}: root page {m[3]} past the last page {m[1]}"
    return None


def _check_count(walked: int, counted: int) -> None:
    """Raise ``IndexCorrupt`` if a walk of the table found another number of
    records than the table counts (a damaged page hides or invents some)."""
    if walked != counted:
        raise IndexCorrupt(f"a walk of the index finds {walked} records; the table counts {counted}")


def _pad_guard(path: Path) -> None:
    """Extend data.mdb by ``GUARD_BYTES`` of zeros past its last page (idempotent:
    LMDB ignores bytes past its last page; a larger file only means a larger map)."""
    f = path / "data.mdb"
    with open(f, "rb") as fh:
        m = _meta(fh.read(4096))
    if m is None:
        return
    want = (m[1] + 1) * m[0] + GUARD_BYTES
    if f.stat().st_size < want:
        with open(f, "r+b") as fh:
            fh.truncate(want)


class Index:
    def __init__(self, path: Path, map_bytes: int, durable: bool, metasync: bool = False,
                 flush_s: float = 1.0, create: bool = True) -> None:
        """Open (``create``: or create) the index at ``path``.  Raises
        ``IndexCorrupt`` if the file fails ``validate_file`` or LMDB refuses it,
        ``StoreError`` for other failures."""
        self.path = path
        if (path / "data.mdb").exists():
            why = validate_file(path)
            if why is not None:
                raise IndexCorrupt(f"{path}: {why}")
            try:
                _pad_guard(path)
            except OSError as exc:
                raise StoreError(f"{path}: cannot pad the index file: {exc.strerror}") from None
        elif not create:
            raise IndexCorrupt(f"{path}: data.mdb is missing")
        try:
            path.mkdir(parents=True, exist_ok=True)
            self._env = lmdb.open(str(path), map_size=map_bytes, subdir=True, max_dbs=4,
                                  sync=durable and metasync, metasync=durable and metasync, readahead=False, lock=False)
        except _DAMAGE as exc:
            raise IndexCorrupt(f"{path}: LMDB refuses the index: {exc}") from None
        except (lmdb.Error, OSError) as exc:
            raise StoreError(f"{path}: cannot open the index: {exc}") from None
        try:
            self._blocks = self._env.open_db(b"blocks")
            self._meta = self._env.open_db(b"meta")
        except lmdb.Error as exc:
            self._env.close()
            raise IndexCorrupt(f"{path}: cannot open the index tables: {exc}") from None
        self.grows = 0
        self._wlock = threading.Lock()       # held by every read and write transaction (no lock file)
        self._lazy_meta = durable and not metasync     # commits flushed by _flush_loop, not inline
        self._dirty = threading.Event()      # a commit not flushed yet
        self._stop = threading.Event()
        self._flusher = None
        if self._lazy_meta:
            self._flusher = threading.Thread(target=self._flush_loop, args=(flush_s,),
                                             name="kvtier-index-flush", daemon=True)
            self._flusher.start()

    def _flush_loop(self, flush_s: float) -> None:
        """Flush the last commit (data and meta pages) within ``flush_s`` of it."""
        while not self._stop.is_set():
            self._dirty.wait()
            if self._stop.wait(flush_s):
                return
            self._dirty.clear()
            try:
                self._env.sync(True)
            except lmdb.Error as exc:   # the next commit flushes it anyway
                log.warning("index flush failed: %s", exc)

    @property
    def map_size(self) -> int:
        """The LMDB map size now; 0 once closed (a store whose rebuild failed still reports stats)."""
        try:
            return self._env.info()["map_size"]
        except lmdb.Error:
            return 0

    def _write(self, fn) -> None:
        with self._wlock:
            self._write_locked(fn)

    def _write_locked(self, fn) -> None:
        while True:
            try:
                with self._env.begin(write=True) as txn:
                    fn(txn)
                if self._lazy_meta:
                    self._dirty.set()
                return
            except lmdb.MapFullError:
                new = self.map_size * 2
                log.info("LMDB map full; growing to %d bytes", new)
                self._env.set_mapsize(new)
                self.grows += 1
            except _DAMAGE as exc:
                raise IndexCorrupt(f"index commit failed, the index is damaged: {exc}") from None
            except lmdb.Error as exc:
                if getattr(exc, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or "No space" in str(exc):
                    raise DiskFull(f"index commit failed: {exc}") from None
                raise StoreError(f"index commit failed: {exc}") from None

    def _read(self, fn):
        """Run ``fn(txn)`` in a read transaction (values as buffers), under the write lock
        (no lock file: see the module doc); damage -> ``IndexCorrupt``."""
        try:
            with self._wlock, self._env.begin(buffers=True) as txn:
                return fn(txn)
        except _DAMAGE as exc:
            raise IndexCorrupt(f"index read failed, the index is damaged: {exc}") from None
        except lmdb.Error as exc:
            raise StoreError(f"index read failed: {exc}") from None

    def meta_get(self, name: bytes) -> bytes | None:
        """A value of the ``meta`` table (layout, high-water marks), or None."""
        def fn(txn):
            v = txn.get(name, db=self._meta)
            if v is not None and len(v) > 4096:
                raise IndexCorrupt(f"index meta {name!r} is {len(v)} bytes")
            return None if v is None else bytes(v)
        return self._read(fn)

    def check_layout(self, layout: dict) -> None:
        """Record ``layout`` (and the record format) on first open; raise
        ``ConfigMismatch`` if it differs later, ``IndexCorrupt`` if the stored
        one does not parse or the records carry no checks."""
        raw = self.meta_get(b"layout")
        if raw is None:
            blob = json.dumps(layout, sort_keys=True).encode()
            self._write(lambda txn: (txn.put(b"layout", blob, db=self._meta),
                                     txn.put(_RECORD_FORMAT_KEY, RECORD_FORMAT, db=self._meta)))
            return
        if self.meta_get(_RECORD_FORMAT_KEY) != RECORD_FORMAT:
            raise IndexCorrupt("the index's records carry no checks (an older kvtier wrote it)")
        try:
            old = json.loads(raw)
            if not isinstance(old, dict):
                raise ValueError(raw)
        except ValueError:
            raise IndexCorrupt("the index's layout record does not parse") from None
        diff = {k: (old.get(k), v) for k, v in layout.items() if old.get(k) != v}
        if diff:
            desc = ", ".join(f"{k}: stored {a} vs config {b}" for k, (a, b) in diff.items())
            raise ConfigMismatch(f"store root was created with another layout ({desc})")

    def commit(self, puts: Iterable[tuple[bytes, IndexRecord | bytes]] = (), deletes: Iterable[bytes] = (),
               packed: bool = False, meta: dict[bytes, bytes] | None = None) -> None:
        """Apply puts (records or ``pack_record`` bytes), deletes and ``meta``
        values in one durable transaction (all or nothing).  ``packed=True``:
        every record is already ``pack_record`` bytes (the batch hot path skips
        the per-record check).  Raises ``IndexCorrupt`` (damage), ``DiskFull``,
        ``StoreError``."""
        puts, deletes = list(puts), list(deletes)
        if not puts and not deletes and not meta:
            return

        def fn(txn):
            for k in deletes:
                txn.delete(k, db=self._blocks)
            if puts:
                txn.cursor(db=self._blocks).putmulti(
                    puts if packed else [(k, rec if isinstance(rec, bytes) else rec.pack(k)) for k, rec in puts])
            for k, v in (meta or {}).items():
                txn.put(k, v, db=self._meta)
        self._write(fn)

    def get(self, key: bytes) -> IndexRecord | None:
        """The record of ``key``, or None.  Raises ``IndexCorrupt`` for damage
        (a value that is not a record, or fails its check, counts as damage).
        None is not proof of absence: a damaged page can hide a key, which
        only a full walk (``iter_chunks``) notices."""
        def fn(txn):
            v = txn.get(key, db=self._blocks)
            return None if v is None else IndexRecord.unpack(key, v)
        return self._read(fn)

    def items(self) -> list[tuple[bytes, IndexRecord]]:
        """Every record, verified, in key order.  Raises ``IndexCorrupt`` for
        damage (a record that fails its check, keys out of order, a count that
        disagrees with the table's)."""
        def fn(txn):
            out = []
            last = None
            for k, v in txn.cursor(db=self._blocks):
                k = bytes(k)
                if not 0 < len(k) <= 64 or (last is not None and k <= last):
                    raise IndexCorrupt(f"index holds a {len(k)}-byte key out of order (a damaged page)")
                out.append((k, IndexRecord.unpack(k, v)))
                last = k
            _check_count(len(out), txn.stat(self._blocks)["entries"])
            return out
        return self._read(fn)

    def iter_chunks(self, n: int = 16384) -> Iterator[list[tuple[bytes, IndexRecord]]]:
        """Every (key, verified record) in key order, ``n`` at a time, each chunk
        read in its own short transaction (the background loader).  When no
        commit landed between the chunks, the walk's count is checked against
        the table's.  Raises ``IndexCorrupt`` for damage (as ``items``)."""
        after: bytes | None = None
        seen, txns = 0, set()
        while True:
            def fn(txn, after=after):
                cur = txn.cursor(db=self._blocks)
                ok = cur.set_range(after) if after is not None else cur.first()
                out = []
                last = after
                while ok and len(out) < n:
                    k = bytes(cur.key())
                    if not 0 < len(k) <= 64:
                        raise IndexCorrupt(f"index holds a {len(k)}-byte key (a damaged page)")
                    if last is not None and k <= last:
                        if k == after and not out:      # set_range landed on the last key read
                            ok = cur.next()
                            continue
                        raise IndexCorrupt("index keys out of order (a damaged page)")
                    out.append((k, IndexRecord.unpack(k, cur.value())))
                    last = k
                    ok = cur.next()
                return out, txn.id(), txn.stat(self._blocks)["entries"]
            chunk, txn_id, entries = self._read(fn)
            txns.add(txn_id)
            seen += len(chunk)
            if not chunk:
                if len(txns) == 1:
                    _check_count(seen, entries)
                return
            yield chunk
            after = chunk[-1][0]

    def count(self) -> int:
        return self._read(lambda txn: txn.stat(self._blocks)["entries"])

    def sync(self) -> None:
        """Flush every commit made so far to the device now.  Raises ``StoreError``."""
        try:
            self._env.sync(True)
        except lmdb.Error as exc:
            raise StoreError(f"index flush failed: {exc}") from None

    def close(self) -> bool:
        """Flush the commits not yet flushed (if deferred) and close.  Returns
        False if that flush failed (the caller keeps its unclean-open marker)."""
        flushed = True
        if self._flusher is not None:
            self._stop.set()
            self._dirty.set()
            self._flusher.join()
            self._flusher = None
            try:
                self._env.sync(True)
            except lmdb.Error as exc:
                log.warning("index flush at close failed: %s", exc)
                flushed = False
        try:
            self._env.close()
        except lmdb.Error as exc:
            log.warning("index close failed: %s", exc)
        return flushed
