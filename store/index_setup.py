"""The index on disk: opened (set aside and rebuilt from the slot headers when
damaged), and rebuilt offline.  Functions only; ``IndexKeeper`` (``indexing.py``)
runs the index of an open store.

Threads: the caller's; ``open_index`` and ``offline_rebuild`` run before a
store opens (the root's flock held), ``rebuild_index`` also from the index
keeper's rebuild thread with the store lock held.
"""
from __future__ import annotations

import logging
import time

from . import rebuild, unclean
from .errors import IndexCorrupt, StoreError
from .index import Index
from .layout import check_format

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


def offline_rebuild(cfg, progress=None, reason: str = "asked for by the operator"):
    """Rebuild the index of a closed store from its slot headers (the root's flock
    is held meanwhile).  Returns the ``rebuild.ScanResult``.  Raises
    ``RootLocked`` if a store has the root open, ``OldLayout``, ``StoreError``."""
    root = cfg.root_path
    if not root.is_dir():
        raise StoreError(f"{root} is not a store directory")
    with rebuild.closed_store_slabs(cfg, before=lambda: check_format(root, layout_of(cfg))) as nvme:
        out: list = []
        if rebuild_index(cfg, nvme, reason, out, progress).close():
            unclean.mark_closed(root)     # the new index is complete and flushed
        return out[0]
