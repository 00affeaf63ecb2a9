"""Offline check of a closed store: the index against the slot headers.

``kvtier store check DIR`` runs this; ``kvtier store rebuild DIR`` runs
``TieredStore.rebuild``.  Both read the layout from ``<root>/FORMAT`` (so they
work when the index is gone) and hold the root's flock meanwhile.
"""
from __future__ import annotations

from pathlib import Path

from .config import StoreConfig
from .errors import IndexCorrupt, StoreError
from .index import Index, validate_file
from .layout import check_format, read_layout
from .rebuild import Progress, closed_store_slabs, scan_slots
from .unclean import MARKER, restarted_since_open


def config_for_root(root, io_engine: str = "auto") -> StoreConfig:
    """A ``StoreConfig`` that reads the store at ``root`` as it was written
    (layout from FORMAT, capacity from the slab files).  Raises ``OldLayout``,
    ``StoreError`` (no store there, or no layout recorded)."""
    root = Path(root)
    if not (root / "FORMAT").exists() and not (root / "slabs").is_dir():
        raise StoreError(f"{root} is not a kvtier store (no FORMAT marker, no slabs/)")
    check_format(root)
    lay = read_layout(root)
    if lay is None:
        raise StoreError(f"{root}/FORMAT records no layout; open the store once with this kvtier")
    slot, sps = int(lay["slot_bytes"]), int(lay["slots_per_slab"])
    files = sorted((root / "slabs").glob("slab-*.kv")) if (root / "slabs").is_dir() else []
    slots = sum(min(sps, f.stat().st_size // slot) for f in files)
    return StoreConfig(root=root, host_bytes=0, nvme_bytes=slots * slot, block_bytes=int(lay["block_bytes"]),
                       slab_bytes=sps * slot, io_engine=io_engine, durable=True)


def check_root(cfg: StoreConfig, progress: Progress | None = None) -> dict:
    """Compare the index of a closed store with its slot headers; changes nothing
    but the index file's guard padding.  Returns a JSON-ready dict (see
    ``kvtier store check --help``).  Raises ``RootLocked``, ``StoreError``."""
    root = cfg.root_path
    got: dict = {}
    with closed_store_slabs(cfg, before=lambda: got.update(_read_index(root / "index", cfg))) as nvme:
        scan = scan_slots(nvme, cfg, progress)
    index = got
    recs = index.pop("records_map")
    restart = restarted_since_open(root)
    agree = sum(1 for k, (slot, _) in scan.found.items() if recs.get(k) == slot)
    index_only = sum(1 for k, slot in recs.items() if scan.found.get(k, (None,))[0] != slot)
    return {
        "root": str(root),
        "layout": {"block_bytes": cfg.block_bytes, "slot_bytes": cfg.slot_bytes,
                   "slots_per_slab": cfg.slots_per_slab},
        "index": index,
        "slots": {"scanned": scan.slots_scanned, "blocks": len(scan.found), "bad_headers": scan.bad,
                  "superseded": scan.superseded, "empty": scan.empty, "seconds": round(scan.seconds, 3)},
        "agree": agree,
        "index_only": index_only,
        "headers_only": len(scan.found) - agree,
        # <root>/OPEN left behind: the last store did not close cleanly.  Same boot: a killed
        # process, its commits are in the page cache (index complete).  Another boot: the
        # machine went down with it open; the next open rebuilds the index from the headers.
        "last_close": ("clean" if not (root / MARKER).exists() else
                       "killed" if restart is None else "machine restarted"),
        "restart": restart,
        "healthy": index["ok"] and index_only == 0 and restart is None,
    }


def _read_index(path: Path, cfg: StoreConfig) -> dict:
    why = validate_file(path) if (path / "data.mdb").exists() else "data.mdb is missing"
    out = {"ok": False, "problem": why, "records": 0, "records_map": {}}
    if why is not None:
        return out
    try:
        idx = Index(path, cfg.index_map_bytes, durable=False, create=False)
        try:
            items = idx.items()
        finally:
            idx.close()
    except IndexCorrupt as exc:
        out["problem"] = str(exc)
        return out
    out.update(ok=True, problem=None, records=len(items), records_map={k: r.slot for k, r in items})
    return out
