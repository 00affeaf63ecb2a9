"""The index's life in a running store: open (rebuilding a damaged one), the
background load that makes open cost the same at any size, commits, and the
mid-run rebuild when damage turns up later.

Mixed into ``TieredStore``.  Fields (all owned by the store lock unless noted):

* ``_loading`` -- True until the background loader has put every index record
  into ``_entries``/``_nvme_lru`` and the free map covers the slots below
  ``_hw0`` (the slot high-water mark at open).  Meanwhile the free map holds
  only ``[_hw0, capacity)`` plus slots freed since; a key missing from
  ``_entries`` is looked up in LMDB (``_find``); ``_gone`` holds keys removed
  since open so the loader does not bring them back; ``_seen`` marks slots
  below ``_hw0`` already owned by an entry.  Eviction waits for the load.
* ``_index_bad`` (owned by ``_ilock``) -- the index failed with damage: commits
  are skipped (memory is the truth, and the slots carry headers) until the
  rebuild thread has written a fresh index from memory (plus a scan of the
  slot headers if the load had not finished) and set the old one aside.
* ``_seq`` -- next write sequence number (``time_ns`` at open, or past the
  persisted high-water mark if the clock went back).

Lock order: store lock -> ``_ilock`` -> the index's own write lock.
"""
from __future__ import annotations

import logging
import threading
import time

import numpy as np

from . import rebuild, unclean
from .entry import Entry as _Entry
from .errors import IndexCorrupt, StoreError
from .index import Index, IndexRecord
from .slots import SlotAllocator

log = logging.getLogger("kvtier.store.tiered")

LAYOUT_VERSION = 3     # 3: self-describing slots, header regions (2 was a short-lived interleaved layout)
_HW, _SEQ = b"slot_hw", b"seq_hw"


def layout_of(cfg) -> dict:
    return {"version": LAYOUT_VERSION, "slot_bytes": cfg.slot_bytes, "block_bytes": cfg.block_bytes,
            "slots_per_slab": cfg.slots_per_slab}


def open_index(cfg, nvme, reason_out: list) -> Index:
    """The index of ``cfg.root``: opened if sound and complete, else set aside and
    rebuilt from ``nvme``'s slot headers (one WARNING): damaged, missing, or
    possibly short of unflushed commits because the machine restarted while a
    store had it open (``store/unclean.py``).  ``reason_out`` gets the rebuild's
    ScanResult if one ran.  Raises ``ConfigMismatch`` (another layout), ``StoreError``."""
    path = cfg.root_path / "index"
    restarted = unclean.restarted_since_open(cfg.root_path)
    if restarted is not None and nvme.n_files_slots:
        return rebuild_index(cfg, nvme, restarted, reason_out)
    try:
        idx = Index(path, cfg.index_map_bytes, cfg.durable, cfg.index_metasync,
                    create=nvme.n_files_slots == 0)
        try:
            idx.check_layout(layout_of(cfg))
            read_marks(idx)
            return idx
        except BaseException:
            idx.close()
            raise
    except IndexCorrupt as exc:
        reason = str(exc)
    return rebuild_index(cfg, nvme, reason, reason_out)


def read_marks(idx: Index) -> tuple[int, int]:
    """The index's slot high-water mark and write-sequence mark (0 if unset).

    Raises:
        IndexCorrupt: a mark that is not a decimal number.
    """
    out = []
    for name in (_HW, _SEQ):
        raw = idx.meta_get(name) or b"0"
        if not raw.isdigit() or len(raw) > 20:
            raise IndexCorrupt(f"the index's {name.decode()} mark {raw[:24]!r} is not a number")
        out.append(int(raw))
    return out[0], out[1]


def rebuild_index(cfg, nvme, reason: str, out: list | None = None, progress=None,
                  memory: list | None = None, scanned=None) -> Index:
    """Set the index aside and write a new one from the slot headers (or, with
    ``memory``, from those packed records).  Logs one WARNING with what was recovered."""
    scan = None
    if memory is None:
        scan = rebuild.scan_slots(nvme, cfg, progress)
        records = rebuild.records_of(scan)
    else:
        records = memory
    path = cfg.root_path / "index"
    try:
        moved = rebuild.move_aside(path)
    except OSError as exc:
        raise StoreError(f"{path}: cannot move the damaged index aside: {exc.strerror}") from None
    idx = Index(path, cfg.index_map_bytes, cfg.durable, cfg.index_metasync)
    try:
        idx.check_layout(layout_of(cfg))
        hw = (max((slot for slot, _ in scan.found.values()), default=-1) + 1 if scan is not None
              else max((rebuild.unpack_slot(r) for _, r in records), default=-1) + 1)
        rebuild.write_index(idx, records, {_HW: str(hw).encode(), _SEQ: str(time.time_ns()).encode()})
    except BaseException:
        idx.close()
        raise
    what = scan.summary() if scan is not None else f"{len(records)} blocks written from memory" + (
        f" after a scan of the slot headers ({scanned.summary()})" if scanned is not None else "")
    log.warning("index at %s was damaged (%s); %s; rebuilt it: %s", path, reason,
                f"set aside as {moved.name}" if moved else "nothing to set aside", what)
    if out is not None and scan is not None:
        scan.moved_to = str(moved) if moved else None
        out.append(scan)
    return idx


class IndexKeeper:
    """Open/load/commit/rebuild of the index (a mixin of ``TieredStore``)."""

    def _init_index_state(self, recovered: list) -> None:
        idx = self._index
        self._ilock = threading.Lock()
        self._index_bad = False
        self._skipped: dict[bytes, bytes] = {}   # records of commits skipped while the index was bad
        self._rebuilder: threading.Thread | None = None
        self._index_rebuilds = len(recovered)
        self._blocks_recovered = sum(len(s.found) for s in recovered)
        hw, seq = read_marks(idx)
        self._hw0 = self._hw = min(hw, self._nvme.n_files_slots)
        self._seq = max(time.time_ns(), seq + 1)
        self._gone: set[bytes] = set()
        self._seen = bytearray(self._hw0)
        self._loading = True
        self._loaded_ok = False
        self._stop_load = threading.Event()
        self._nvme.alloc_map = SlotAllocator.free_above(self._nvme.capacity, self._hw0)
        self._loader = threading.Thread(target=self._load, name="kvtier-index-load", daemon=True)

    def _start_loader(self) -> None:
        """Start the background load (once the store is open: damage it finds must
        be able to start the rebuild thread)."""
        self._loader.start()

    # -- write sequence ---------------------------------------------------
    def _next_seqs(self, n: int) -> int:
        """First of ``n`` fresh write sequence numbers (lock held)."""
        s = self._seq
        self._seq += n
        return s

    # -- lookups while loading ---------------------------------------------
    def _find(self, k: bytes, settle: bool = True) -> _Entry | None:
        """The entry of ``k``, faulting it in from the index while the load runs
        (lock held).  ``settle=False`` (a put: storing a block again is harmless)
        never waits for the load."""
        e = self._entries.get(k)
        if e is None and self._loading and k not in self._gone:
            e = self._fault_in(k, settle)
        return e

    def _find_new(self, k: bytes) -> _Entry | None:
        return self._find(k, settle=False)

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
        self._wait_settled()
        return self._entries.get(k)

    def _fits(self, rec: IndexRecord) -> bool:
        return rec.slot < self._hw0 and rec.length == self.config.block_bytes

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
        self._entries[k] = e
        self._nvme_lru[k] = None
        if front:
            self._nvme_lru.move_to_end(k, last=False)
        if rec.slot < len(self._seen):
            self._seen[rec.slot] = 1
        return e

    def _forget(self, k: bytes) -> None:
        """``k`` left ``_entries`` (lock held): the loader must not bring it back."""
        if self._loading:
            self._gone.add(k)

    # -- the background load -------------------------------------------------
    def _load(self) -> None:
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
            for lo in range(0, len(decoded), 8192):
                if self._stop_load.is_set():
                    return
                with self._lock:
                    for k, rec in decoded[lo:lo + 8192]:
                        if k in self._entries or k in self._gone:
                            continue
                        why = self._doubt(rec)
                        if why is not None:
                            raise IndexCorrupt(f"the index record of {k.hex()} {why}")
                        if not self._fits(rec):
                            stale.append(k)
                            continue
                        self._adopt(k, rec, front=True)
            with self._lock:
                self._finish_load(stale)
        except IndexCorrupt as exc:
            with self._lock, self._ilock:
                self._damaged(str(exc))
        except BaseException as exc:      # never leave waiters hanging
            if self._stop_load.is_set():
                return                      # closing: the store is going away anyway
            log.exception("index load failed: %s", exc)
            with self._lock, self._ilock:
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
            self._commit(deletes=stale)
        self._changed.notify_all()

    def _wait_settled(self) -> None:
        """Wait (lock held) until no load or rebuild is running."""
        while (self._loading or self._rebuilder is not None) and not self._closed:
            self._changed.wait(0.05)

    # -- commits ---------------------------------------------------------------
    def _commit(self, puts=(), deletes=(), packed: bool = False, slots=()) -> None:
        """Commit to the index.  Damage marks the index bad and schedules a rebuild
        from memory; until it is done commits are skipped (the blocks' headers are
        on disk, so nothing is lost even by a crash meanwhile).  Raises
        ``DiskFull``/``StoreError`` for other failures."""
        with self._ilock:
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

    # -- damage mid-run ---------------------------------------------------------
    def _damaged(self, reason: str) -> None:
        """The index is damaged: mark it and start the rebuild thread (once; not
        after ``close()``, which joins it)."""
        self._index_bad = True
        if self._rebuilder is None and not self._closed:
            self._rebuilder = threading.Thread(target=self._rebuild_mid_run, args=(reason,),
                                               name="kvtier-index-rebuild", daemon=True)
            self._rebuilder.start()

    def _rebuild_mid_run(self, reason: str) -> None:
        try:
            self._loader.join()
            scan = None
            if not self._loaded_ok:
                scan = rebuild.scan_slots(self._nvme, self.config)   # no lock: reads only
            with self._lock:
                if self._closed:
                    return
                if scan is not None:
                    self._merge_scan(scan)
                with self._ilock:
                    recs = {e.key: self._record(e) for e in self._entries.values()
                            if e.visible and e.slot is not None}
                    for k, r in self._skipped.items():     # puts about to be published
                        e = self._entries.get(k)
                        if k not in recs and e is not None and e.slot == rebuild.unpack_slot(r):
                            recs[k] = r
                    self._skipped.clear()
                    recs = list(recs.items())
                    self._index.close()
                    self._index = rebuild_index(self.config, self._nvme, reason, memory=recs, scanned=scan)
                    self._hw = max((e.slot for e in self._entries.values() if e.slot is not None),
                                   default=-1) + 1
                    self._index_bad = False
                self._index_rebuilds += 1
                if scan is not None:
                    self._blocks_recovered += len(scan.found)
        except BaseException as exc:
            log.exception("index rebuild failed: %s", exc)
        finally:
            with self._lock:
                self._rebuilder = None
                if self._loading:       # the rebuild failed before the free map was rebuilt:
                    self._loading = False   # slots below the high-water mark no entry owns stay unused
                self._changed.notify_all()

    def _merge_scan(self, scan) -> None:
        """Adopt scanned blocks memory does not know, then rebuild the free map
        from every slot an entry owns (lock held; the load is over)."""
        owned = set()
        for e in list(self._entries.values()) + list(self._dead):
            for s in (e.slot, e.demote_slot):
                if s is not None:
                    owned.add(s)
        for k, (slot, h) in scan.found.items():
            if k in self._entries or k in self._gone or slot in owned:
                continue
            self._adopt(k, IndexRecord(slot, h.length, h.checksum, h.namespace, h.seq / 1e9), front=True)
            owned.add(slot)
        cap = self._nvme.capacity
        self._nvme.alloc_map = SlotAllocator(cap, owned)
        self._loading = False
        self._gone.clear()
        self._seen = bytearray()


def offline_rebuild(cfg, progress=None, reason: str = "asked for by the operator"):
    """Rebuild the index of a closed store from its slot headers (the root's flock
    is held meanwhile).  Returns the ``rebuild.ScanResult``.  Raises
    ``RootLocked`` if a store has the root open, ``OldLayout``, ``StoreError``."""
    from .layout import check_format

    root = cfg.root_path
    if not root.is_dir():
        raise StoreError(f"{root} is not a store directory")
    with rebuild.closed_store_slabs(cfg, before=lambda: check_format(root, layout_of(cfg))) as nvme:
        out: list = []
        if rebuild_index(cfg, nvme, reason, out, progress).close():
            unclean.mark_closed(root)     # the new index is complete and flushed
        return out[0]
