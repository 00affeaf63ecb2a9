"""Did the machine restart while the store was open?  ``<root>/OPEN``.

The index's commits are not flushed one by one (``store/index.py``): a block
is durable once its slab bytes and slot header are ``fdatasync``ed, and the
LMDB commit that makes it visible is only written to the page cache, flushed
by a background timer (within ~1 s) and at ``close()``.  That is safe against
a killed process -- the page cache outlives it -- but a power loss or kernel
crash can lose (or tear) the index's unflushed commits.  The slot headers still
hold every acknowledged block, so the fix is a rebuild from them, and the
only question at open is whether one is needed::

    <root>/OPEN    "kvtier open <boot id>"   written (and fsynced) at open,
                                             removed at a clean close

* no ``OPEN``: the last store closed cleanly -> the index is complete.
* ``OPEN`` naming this kernel's boot id (``/proc/sys/kernel/random/boot_id``):
  the process died (SIGKILL, OOM, crash) but the kernel did not, so every
  commit it made is in the page cache -> the index is complete.
* ``OPEN`` naming another boot id (or none could be read): the machine went
  down with the store open -> rebuild the index from the slot headers.

Not thread-safe; the store calls it at open and close, holding the root's flock.
"""
from __future__ import annotations

from pathlib import Path

from .durable import fsync_dir, write_durably

MARKER = "OPEN"
_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
_PREFIX = "kvtier open "


def boot_id() -> str:
    """This kernel's boot id, or "" where the system has none (then any leftover
    marker counts as a restart: a rebuild too many, never one too few)."""
    try:
        return _BOOT_ID.read_text().strip()
    except OSError:
        return ""


def restarted_since_open(root: Path) -> str | None:
    """Why the index of ``root`` may lack commits (the machine restarted while a
    store had it open), or None if it is complete.  Never raises for a missing
    or unreadable marker: an unreadable one counts as a restart."""
    path = Path(root) / MARKER
    try:
        text = path.read_bytes().decode("utf-8", "replace")    # damaged bytes: no boot id -> a restart
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"{path} cannot be read ({exc.strerror}): treating it as a restart"
    old = text[len(_PREFIX):].strip() if text.startswith(_PREFIX) else ""
    now = boot_id()
    if old and now and old == now:
        return None
    return ("the machine restarted while the store was open (power loss or kernel crash): "
            "index commits not yet flushed may be lost")


def mark_open(root: Path) -> None:
    """Write ``<root>/OPEN`` with this boot id and make it durable (before the
    first unflushed commit).  Raises ``OSError``."""
    write_durably(Path(root) / MARKER, _PREFIX + boot_id() + "\n")


def mark_closed(root: Path) -> None:
    """Remove ``<root>/OPEN`` (call only after the index was flushed).  Raises ``OSError``."""
    root = Path(root)
    try:
        (root / MARKER).unlink()
    except FileNotFoundError:
        return
    fsync_dir(root)
