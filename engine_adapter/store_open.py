"""Opening an engine's store so that no data left on disk keeps the engine from starting.

``TieredStore.open`` refuses a root it cannot read safely: a format marker missing beside data,
damaged, or naming another format (``OldLayout``), or a layout other than the engine's
(``ConfigMismatch``).  A CLI tool should stop there; an engine should not, since every KV block
in the root is recomputable.  So the engine's open sets such a root aside as
``<root>.unreadable`` (replacing an earlier one: at most one per root, so repeated damage cannot
fill the disk), logs one WARNING saying what it found and where it went, and opens a new store.

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


def set_aside(root: Path) -> Path:
    """Rename ``root`` to ``<root>.unreadable``, deleting an earlier one first; returns the new
    path.  Raises OSError when the rename fails."""
    aside = root.with_name(root.name + ASIDE_SUFFIX)
    if aside.exists():
        shutil.rmtree(aside)
    root.rename(aside)
    return aside


def open_engine_store(store_cfg: "StoreConfig") -> "TieredStore":
    """The store at ``store_cfg``, after setting aside a root it refused (module doc).

    Raises:
        StoreError: what ``TieredStore.open`` raises for anything but an unreadable root, or
            for the new root too; OSError when the unreadable root cannot be moved.
    """
    from kvtier.store import TieredStore
    from kvtier.store.errors import ConfigMismatch, OldLayout
    try:
        return TieredStore.open(store_cfg)
    except (OldLayout, ConfigMismatch) as exc:
        aside = set_aside(Path(store_cfg.root_path))
        log.warning("kvtier: %s. Set it aside as %s (its KV blocks are recomputable) and opened a new "
                    "store there.", exc, aside)
    return TieredStore.open(store_cfg)
