"""Durable block index in LMDB.

One record per block that lives on the NVMe tier (the host tier is volatile
and never indexed)::

    key (1..64 bytes) -> struct "<B7xQQQ8sd" (48 bytes)
        tier u8 | pad | slot u64 | length u64 | checksum u64 (xxh3-64)
             | namespace tag 8s | last access f64 (unix seconds)

A record is committed only after its bytes are written and flushed to the
slab (the store enforces that order), so every record on disk names durable
bytes.  The ``meta`` database pins the layout (block/slot size, slots per
slab); reopening with another layout raises ``ConfigMismatch``.
When the LMDB map fills, it is doubled and the transaction retried.

Durability of a commit (``durable=True``): LMDB writes the transaction's data
pages and flushes them before ``commit`` returns.  With ``metasync=False``
(the default; MDB_NOMETASYNC) the meta page that makes the transaction current
is written but flushed only by the next commit, by the background flusher
(within ``flush_s`` of the last commit) or at ``close()``: one device flush per
commit instead of two.  LMDB keeps the database consistent either way; a power
loss can roll back the commits not yet covered by a flush (their blocks read as
misses -- their slots are free again, and a resurrected record whose slot was
reused fails its checksum), a killed process loses nothing.
Writes (``commit``) are serialised by the index's own lock, so the store can
commit without holding its metadata lock (lock order: store lock -> index lock).
"""
from __future__ import annotations

import errno
import json
import logging
import struct
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import lmdb

from .errors import ConfigMismatch, DiskFull, StoreError

log = logging.getLogger(__name__)

_REC = struct.Struct("<B7xQQQ8sd")
TIER_NVME = 2


@dataclass(frozen=True)
class IndexRecord:
    slot: int
    length: int
    checksum: int
    namespace: bytes
    last_access: float
    tier: int = TIER_NVME

    def pack(self) -> bytes:
        return _REC.pack(self.tier, self.slot, self.length, self.checksum, self.namespace, self.last_access)

    @classmethod
    def unpack(cls, raw: bytes) -> "IndexRecord":
        tier, slot, length, checksum, ns, la = _REC.unpack(raw)
        return cls(slot=slot, length=length, checksum=checksum, namespace=ns, last_access=la, tier=tier)


def pack_record(slot: int, length: int, checksum: int, namespace: bytes, last_access: float) -> bytes:
    """Packed NVMe record, without building an ``IndexRecord`` (hot path)."""
    return _REC.pack(TIER_NVME, slot, length, checksum, namespace, last_access)


class Index:
    def __init__(self, path: Path, map_bytes: int, durable: bool, metasync: bool = False,
                 flush_s: float = 1.0) -> None:
        path.mkdir(parents=True, exist_ok=True)
        self._env = lmdb.open(str(path), map_size=map_bytes, subdir=True, max_dbs=4,
                              sync=durable, metasync=durable and metasync, readahead=False, lock=True)
        self._blocks = self._env.open_db(b"blocks")
        self._meta = self._env.open_db(b"meta")
        self.grows = 0
        self._wlock = threading.Lock()
        self._lazy_meta = durable and not metasync
        self._dirty = threading.Event()      # a commit whose meta page is not flushed yet
        self._stop = threading.Event()
        self._flusher = None
        if self._lazy_meta:
            self._flusher = threading.Thread(target=self._flush_loop, args=(flush_s,),
                                             name="kvtier-index-flush", daemon=True)
            self._flusher.start()

    def _flush_loop(self, flush_s: float) -> None:
        """Flush the meta page of the last commit within ``flush_s`` of it."""
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
        return self._env.info()["map_size"]

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
            except lmdb.Error as exc:
                if getattr(exc, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or "No space" in str(exc):
                    raise DiskFull(f"index commit failed: {exc}") from None
                raise StoreError(f"index commit failed: {exc}") from None

    def check_layout(self, layout: dict) -> None:
        """Record ``layout`` on first open; raise ``ConfigMismatch`` if it differs later."""
        with self._env.begin(db=self._meta) as txn:
            raw = txn.get(b"layout")
        if raw is None:
            blob = json.dumps(layout, sort_keys=True).encode()
            self._write(lambda txn: txn.put(b"layout", blob, db=self._meta))
            return
        old = json.loads(raw)
        diff = {k: (old.get(k), v) for k, v in layout.items() if old.get(k) != v}
        if diff:
            desc = ", ".join(f"{k}: stored {a} vs config {b}" for k, (a, b) in diff.items())
            raise ConfigMismatch(f"store root was created with another layout ({desc})")

    def commit(self, puts: Iterable[tuple[bytes, IndexRecord | bytes]] = (), deletes: Iterable[bytes] = (),
               packed: bool = False) -> None:
        """Apply puts (records or ``pack_record`` bytes) and deletes in one durable
        transaction (all or nothing).  ``packed=True``: every record is already
        ``pack_record`` bytes (the batch hot path skips the per-record check)."""
        puts, deletes = list(puts), list(deletes)
        if not puts and not deletes:
            return

        def fn(txn):
            for k in deletes:
                txn.delete(k, db=self._blocks)
            if puts:
                txn.cursor(db=self._blocks).putmulti(
                    puts if packed else [(k, rec if isinstance(rec, bytes) else rec.pack()) for k, rec in puts])
        self._write(fn)

    def items(self) -> Iterator[tuple[bytes, IndexRecord]]:
        with self._env.begin(db=self._blocks) as txn:
            for k, v in txn.cursor():
                yield bytes(k), IndexRecord.unpack(v)

    def count(self) -> int:
        with self._env.begin(db=self._blocks) as txn:
            return txn.stat(self._blocks)["entries"]

    def close(self) -> None:
        """Flush the last commit's meta page (if deferred) and close."""
        if self._flusher is not None:
            self._stop.set()
            self._dirty.set()
            self._flusher.join()
            self._flusher = None
            try:
                self._env.sync(True)
            except lmdb.Error as exc:
                log.warning("index flush at close failed: %s", exc)
        self._env.close()
