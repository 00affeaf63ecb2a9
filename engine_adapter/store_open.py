"""Opening an engine's store so that no data left on disk keeps the engine from starting.

``TieredStore.open`` refuses a root it cannot read safely: a format marker missing beside data,
damaged, or naming another format (``OldLayout``), or a layout other than the engine's
(``ConfigMismatch``).  A CLI tool should stop there; an engine should not, since every KV block
in the root is recomputable.  So the engine's open discards such a root (renamed to
``<root>.unreadable`` first, then deleted: a crash mid-delete leaves that name, which the next
discard removes; kept, it would hold the tier's disk space and the new store could not grow),
logs one WARNING saying what it found, and opens a new store.

    store = open_engine_store(store_cfg)

Other errors (another process holds the root, the filesystem refuses) are raised as they are.
"""
from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvtier.store import StoreConfig, TieredStore

log = logging.getLogger("kvtier.engine")
ASIDE_SUFFIX = ".unreadable"


def discard(root: Path) -> None:
    """Rename ``root`` to ``<root>.unreadable`` (an earlier one deleted first), then delete it.
    Raises OSError when the rename or a delete fails."""
    aside = root.with_name(root.name + ASIDE_SUFFIX)
    if aside.exists():
        shutil.rmtree(aside)
    root.rename(aside)
    shutil.rmtree(aside)


def open_engine_store(store_cfg: "StoreConfig") -> "TieredStore":
    """The store at ``store_cfg``, after discarding a root it refused (module doc).

    Raises:
        StoreError: what ``TieredStore.open`` raises for anything but an unreadable root, or
            for the new root too; OSError when the unreadable root cannot be moved.
    """
    from kvtier.store import TieredStore
    from kvtier.store.errors import ConfigMismatch, OldLayout
    try:
        return TieredStore.open(store_cfg)
    except (OldLayout, ConfigMismatch) as exc:
        discard(Path(store_cfg.root_path))
        log.warning("kvtier: %s. Deleted it (its KV blocks are recomputable) and opened a new store "
                    "there.", exc)
    return TieredStore.open(store_cfg)
