"""Dropping files' pages from the page cache, so a benchmark's read comes from the device."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable


def drop_page_cache(paths: Iterable[str | os.PathLike]) -> None:
    """``sync``, then ask the kernel to forget the cached pages of each file (``POSIX_FADV_DONTNEED``);
    a directory is walked and each file under it dropped.  Unprivileged; dirty pages are written
    first by the sync, so nothing is lost.  Linux (and any system with ``posix_fadvise``).

    Raises:
        OSError: a path cannot be opened.
    """
    os.sync()
    for p in paths:
        p = Path(p)
        files = [Path(d) / f for d, _, fs in os.walk(p) for f in fs] if p.is_dir() else [p]
        for f in files:
            fd = os.open(f, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
