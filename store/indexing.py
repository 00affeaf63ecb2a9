"""IndexKeeper: the index of a running store -- the background load that makes
open cost the same at any size, lookups while it runs, commits, and the mid-run
rebuild when damage turns up later.  (Opening the index, rebuilding a damaged
one at open and offline: ``index_setup.py``.)

Fields, all the keeper's own (owned by the store lock, ``BlockTable.lock``,
unless noted):

* ``_loading`` -- True until the background loader has put every index record
  into the table and the free map covers the slots below ``_hw0`` (the slot
  high-water mark at open).  Meanwhile the free map holds only
  ``[_hw0, capacity)`` plus slots freed since; a key missing from the table is
  looked up in LMDB (``find``); ``_gone`` holds keys removed since open so the
  loader does not bring them back; ``_seen`` marks slots below ``_hw0``
  already owned by an entry.  Eviction waits for the load.
* ``_index``, ``_index_bad``, ``_skipped``, ``_hw`` (owned by ``_ilock``) -- the
  index failed with damage: commits are skipped (memory is the truth, and the
  slots carry headers) until the rebuild thread has written a fresh index
  from memory (plus a scan of the slot headers if the load had not finished)
  and set the old one aside.  A rebuild that fails (a full disk) is tried again
  by the first commit ``REBUILD_RETRY_S`` later (``_retry_at``, ``_bad_reason``).
* ``_seq`` -- next write sequence number (``time_ns`` at open, or past the
  persisted high-water mark if the clock went back).

Threads: the store's caller threads; the loader thread (``kvtier-index-load``,
started by :meth:`IndexKeeper.start`); after damage, one rebuild thread
(``kvtier-index-rebuild``).  ``close()`` of the store stops and joins both.

Lock order: store lock -> ``_ilock`` -> the index's own write lock.
"""
from __future__ import annotations

import logging
import threading
import time

import numpy as np

from . import rebuild
from .blocks import BlockTable
from .entry import Entry as _Entry
from .errors import IndexCorrupt, StoreError
from .index import Index, IndexRecord, pack_record
from .index_setup import _HW, _SEQ, read_marks, rebuild_index
from .slots import SlotAllocator

log = logging.getLogger("kvtier.store.tiered")

REBUILD_RETRY_S = 5.0     # after a failed mid-run rebuild, the next try waits this long


def record_of(e: _Entry) -> bytes:
    """The packed index record of an NVMe block."""
    return pack_record(e.key, e.slot, e.length, e.checksum, e.ns, e.last_access)


class IndexKeeper:
    """The index of a running store: lookups while loading, commits, rebuilds.

    ``table`` is the store's ``BlockTable``; ``nvme`` its ``NvmeTier`` (the keeper
    sets its free map); ``index`` the opened ``Index``; ``recovered`` the
    ``ScanResult`` of a rebuild at open, if one ran.  Call :meth:`start` once the
    store is open."""

    def __init__(self, cfg, table: BlockTable, nvme, index: Index, recovered: list) -> None:
        self._cfg, self._table, self._nvme = cfg, table, nvme
        self._index = index
        self._ilock = threading.Lock()
        self._index_bad = False
        self._skipped: dict[bytes, bytes] = {}   # records of commits skipped while the index was bad
        self._rebuilder: threading.Thread | None = None
        self._retry_at, self._bad_reason = 0.0, ""    # a failed rebuild's next try (owned by _ilock)
        self._index_rebuilds = len(recovered)
        self._blocks_recovered = sum(len(s.found) for s in recovered)
        hw, seq = read_marks(index)
        self._hw0 = self._hw = min(hw, nvme.n_files_slots)
        self._seq = max(time.time_ns(), seq + 1)
        self._gone: set[bytes] = set()
        self._seen = bytearray(self._hw0)
        self._loading = True
        self._loaded_ok = False
        self._stop_load = threading.Event()
        nvme.alloc_map = SlotAllocator.free_above(nvme.capacity, self._hw0)
        self._loader = threading.Thread(target=self._load, name="kvtier-index-load", daemon=True)

    def start(self) -> None:
        """Start the background load (once the store is open: damage it finds must
        be able to start the rebuild thread).  Any thread, once."""
        self._loader.start()

    def stop(self) -> None:
        """Ask the load to stop (any thread; see :meth:`join`)."""
        self._stop_load.set()

    def join(self) -> None:
        """Wait for the load and a rebuild in flight to end.  Without the table lock."""
        for t in (self._loader, self._rebuilder):
            if t is not None and t.is_alive():
                t.join()

    # -- what the books read ------------------------------------------------
    @property
    def index(self) -> Index:
        """The ``Index`` now (a rebuild replaces it).  Lock held."""
        return self._index

    @property
    def loading(self) -> bool:
        """True until every index record is in the table.  Lock held."""
        return self._loading

    @property
    def rebuilds(self) -> int:
        return self._index_rebuilds

    @property
    def blocks_recovered(self) -> int:
        return self._blocks_recovered

    # -- write sequence ---------------------------------------------------
    def next_seqs(self, n: int) -> int:
        """First of ``n`` fresh write sequence numbers (lock held)."""
        s = self._seq
        self._seq += n
        return s

    # -- lookups while loading ---------------------------------------------
    def find(self, k: bytes, settle: bool = True) -> _Entry | None:
        """The entry of ``k``, faulting it in from the index while the load runs
        (lock held).  ``settle=False`` (a put: storing a block again is harmless)
        never waits for the load."""
        e = self._table.get(k)
        if e is None and self._loading and k not in self._gone:
            e = self._fault_in(k, settle)
        return e

    def find_new(self, k: bytes) -> _Entry | None:
        return self.find(k, settle=False)

    def finder(self):
        """The lookup to use for a batch (lock held): ``find`` while loading, else the table's."""
        return self.find if self._loading else self._table.get

    def _fault_in(self, k: bytes, settle: bool) -> _Entry | None:
        """``k``'s entry from its index record while the load runs (lock held).
        A record that verifies and fits is adopted at once.  Otherwise the index
        cannot answer yet -- a damaged page can hide a key -- so (``settle``)
        wait until the load, and the rebuild any damage starts, has settled,
        and answer from memory."""
        rec = None
        with self._ilock:
            if not self._index_bad:
                try:
                    rec = self._index.get(k)
                except IndexCorrupt as exc:
                    self._damaged(str(exc))
                except StoreError as exc:
                    log.warning("index lookup failed (%s); a miss", exc)
                    return None
            if rec is not None and (why := self._doubt(rec)) is not None:
                self._damaged(f"the index record of {k.hex()} {why}")
                rec = None
        if rec is not None:
            return self._adopt(k, rec, front=False) if self._fits(rec) else None
        if not settle:
            return None
        self.wait_settled()
        return self._table.get(k)

    def _fits(self, rec: IndexRecord) -> bool:
        return rec.slot < self._hw0 and rec.length == self._cfg.block_bytes

    def _doubt(self, rec: IndexRecord) -> str | None:
        """Why a verified record cannot be right (damage the check cannot see), or None."""
        if rec.slot < self._hw0:
            return f"names slot {rec.slot}, which another record names" if self._seen[rec.slot] else None
        if rec.slot < self._nvme.n_files_slots:
            return f"names slot {rec.slot}, past the high-water mark {self._hw0}"
        return None

    def _adopt(self, k: bytes, rec: IndexRecord, front: bool) -> _Entry:
        e = _Entry(k, rec.length, rec.namespace, rec.last_access)
        e.slot, e.checksum, e.visible = rec.slot, rec.checksum, True
        self._table.adopt(e, front)
        if rec.slot < len(self._seen):
            self._seen[rec.slot] = 1
        return e

    def forget(self, k: bytes) -> None:
        """``k`` left the table (lock held): the loader must not bring it back."""
        if self._loading:
            self._gone.add(k)

    # -- the background load -------------------------------------------------
    def _load(self) -> None:
        lock = self._table.lock
        try:
            decoded: list[tuple[bytes, IndexRecord]] = []     # verified (iter_chunks)
            limit = self._nvme.capacity
            for chunk in self._index.iter_chunks():
                if self._stop_load.is_set() or self._index_bad:
                    return              # closing, or damage found elsewhere: the rebuild takes over
                decoded.extend(chunk)
                if len(decoded) > limit:
                    raise IndexCorrupt(f"index holds more than the tier's {limit} slots of records")
            decoded.sort(key=lambda kr: kr[1].last_access, reverse=True)   # newest first: each goes to the LRU front
            stale = []
            table = self._table
            for lo in range(0, len(decoded), 8192):
                if self._stop_load.is_set():
                    return
                with lock:
                    for k, rec in decoded[lo:lo + 8192]:
                        if k in table or k in self._gone:
                            continue
                        why = self._doubt(rec)
                        if why is not None:
                            raise IndexCorrupt(f"the index record of {k.hex()} {why}")
                        if not self._fits(rec):
                            stale.append(k)
                            continue
                        self._adopt(k, rec, front=True)
            with lock:
                self._finish_load(stale)
        except IndexCorrupt as exc:
            with lock, self._ilock:
                self._damaged(str(exc))
        except BaseException as exc:      # never leave waiters hanging
            if self._stop_load.is_set():
                return                      # closing: the store is going away anyway
            log.exception("index load failed: %s", exc)
            with lock, self._ilock:
                self._damaged(f"load failed: {exc!r}")

    def _finish_load(self, stale: list[bytes]) -> None:
        """Free every slot below ``_hw0`` that no entry owns; end the load (lock held)."""
        seen = np.frombuffer(bytes(self._seen), dtype=np.uint8) if self._seen else np.zeros(0, np.uint8)
        free = np.flatnonzero(seen == 0)
        if free.size:
            cut = np.flatnonzero(np.diff(free) != 1) + 1
            starts = np.split(free, cut)
            self._nvme.alloc_map.free_runs((int(r[0]), len(r)) for r in starts)
        self._loading, self._loaded_ok = False, True
        self._gone.clear()
        self._seen = bytearray()
        if stale:
            log.warning("dropping %d index entries that do not fit this config", len(stale))
            self.commit(deletes=stale)
        self._table.changed.notify_all()

    def wait_settled(self) -> None:
        """Wait (lock held) until no load or rebuild is running."""
        while (self._loading or self._rebuilder is not None) and not self._table.closed:
            self._table.changed.wait(0.05)

    # -- commits ---------------------------------------------------------------
    def commit(self, puts=(), deletes=(), packed: bool = False, slots=()) -> None:
        """Commit to the index.  Damage marks the index bad and schedules a rebuild
        from memory; until it is done commits are skipped (the blocks' headers are
        on disk, so nothing is lost even by a crash meanwhile).  Any thread.

        Raises:
            DiskFull, StoreError: other failures (nothing was committed).
        """
        with self._ilock:
            if self._index_bad and self._rebuilder is None and time.monotonic() >= self._retry_at:
                self._damaged(self._bad_reason)        # the last rebuild failed: try again
            if not self._index_bad:
                top = max(slots) + 1 if len(slots) else 0
                meta = {_HW: str(top).encode()} if top > self._hw else None
                try:
                    self._index.commit(puts, deletes, packed=packed, meta=meta)
                    if meta:
                        self._hw = top
                    return
                except IndexCorrupt as exc:
                    self._damaged(str(exc))
            # kept for the rebuild: a put whose commit is skipped is published right after
            for k, r in puts:
                self._skipped[k] = r if isinstance(r, bytes) else r.pack(k)
            for k in deletes:
                self._skipped.pop(k, None)

    def persist(self, touched: list[_Entry]) -> None:
        """At close (lock held): commit the access times of ``touched`` and the
        write-sequence mark.  Raises: StoreError."""
        self.commit(puts=[(e.key, record_of(e)) for e in touched])
        with self._ilock:
            if not self._index_bad:
                self._index.commit(meta={_SEQ: str(self._seq).encode()})

    def close(self) -> bool:
        """Close the index; True if it holds every commit (flushed)."""
        return self._index.close()

    # -- damage mid-run ---------------------------------------------------------
    def _damaged(self, reason: str) -> None:
        """The index is damaged: mark it and start the rebuild thread (once; not
        after ``close()``, which joins it)."""
        self._index_bad, self._bad_reason = True, reason
        if self._rebuilder is None and not self._table.closed:
            self._rebuilder = threading.Thread(target=self._rebuild_mid_run, args=(reason,),
                                               name="kvtier-index-rebuild", daemon=True)
            self._rebuilder.start()

    def _rebuild_mid_run(self, reason: str) -> None:
        table = self._table
        try:
            self._loader.join()
            scan = None
            if not self._loaded_ok:
                scan = rebuild.scan_slots(self._nvme, self._cfg)   # no lock: reads only
            with table.lock:
                if table.closed:
                    return
                if scan is not None:
                    self._merge_scan(scan)
                with self._ilock:
                    recs = {e.key: record_of(e) for e in table.entries()
                            if e.visible and e.slot is not None}
                    for k, r in self._skipped.items():     # puts about to be published
                        e = table.get(k)
                        if k not in recs and e is not None and e.slot == rebuild.unpack_slot(r):
                            recs[k] = r
                    self._skipped.clear()
                    recs = list(recs.items())
                    self._index.close()
                    self._index = rebuild_index(self._cfg, self._nvme, reason, memory=recs, scanned=scan)
                    self._hw = max((e.slot for e in table.entries() if e.slot is not None),
                                   default=-1) + 1
                    self._index_bad = False
                self._index_rebuilds += 1
                if scan is not None:
                    self._blocks_recovered += len(scan.found)
        except BaseException as exc:
            log.exception("index rebuild failed (tried again in %.0f s): %s", REBUILD_RETRY_S, exc)
            with self._ilock:
                self._retry_at = time.monotonic() + REBUILD_RETRY_S
        finally:
            with table.lock:
                self._rebuilder = None
                if self._loading:       # the rebuild failed before the free map was rebuilt:
                    self._loading = False   # slots below the high-water mark no entry owns stay unused
                table.changed.notify_all()

    def _merge_scan(self, scan) -> None:
        """Adopt scanned blocks memory does not know, then rebuild the free map
        from every slot an entry owns (lock held; the load is over)."""
        owned = set()
        table = self._table
        for e in list(table.entries()) + list(table.dead()):
            for s in (e.slot, e.demote_slot):
                if s is not None:
                    owned.add(s)
        for k, (slot, h) in scan.found.items():
            if k in table or k in self._gone or slot in owned:
                continue
            self._adopt(k, IndexRecord(slot, h.length, h.checksum, h.namespace, h.seq / 1e9), front=True)
            owned.add(slot)
        cap = self._nvme.capacity
        self._nvme.alloc_map = SlotAllocator(cap, owned)
        self._loading = False
        self._gone.clear()
        self._seen = bytearray()
