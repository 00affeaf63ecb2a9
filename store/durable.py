"""Small files made durable: write-then-rename, and the directory fsync that
makes a new, renamed or removed entry survive a crash.

Used for the store's markers (``FORMAT``, ``OPEN``) and new slab files.
Not thread-safe per path; callers hold the root's flock.
"""
from __future__ import annotations

import os
from pathlib import Path


def fsync_dir(path: Path) -> None:
    """``fsync`` the directory ``path`` (its entries: a created, renamed or
    removed file).  Raises ``OSError``."""
    dfd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def write_durably(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` atomically and durably: a ``.tmp``
    sibling written and fsynced, renamed over ``path``, the directory fsynced.
    A crash leaves the old file or the new one, never a torn one.  Raises ``OSError``."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)
