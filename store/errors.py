"""Exceptions raised by the store.

Every error the store raises on purpose is a :class:`StoreError`.  Errors
caused by the caller's input also derive from ``ValueError`` so the CLI
reports them as one line (exit 2).  None of them leaves the store in a
damaged state: an operation that raises has stored nothing half-way and
lost nothing stored before.
"""
from __future__ import annotations


class StoreError(Exception):
    """Base class of everything the store raises deliberately."""


class StoreClosed(StoreError):
    """The store (or one of its tiers) was used after ``close()``."""


class BadKey(StoreError, ValueError):
    """A key is not bytes, is empty, or is longer than ``MAX_KEY_BYTES``."""


class BadBuffer(StoreError, ValueError):
    """A data/out buffer is of the wrong size, read-only, non-contiguous,
    not a buffer at all, or (for the direct-I/O layer) not 4096-aligned."""


class BadHandle(StoreError, ValueError):
    """``complete_store``/``complete_load`` got a handle this store did not
    hand out, or one that was already completed."""


class StoreFull(StoreError):
    """No tier has room for the block and nothing can be evicted (all pinned)."""


class DiskFull(StoreFull):
    """The filesystem under the NVMe tier ran out of space.

    The tier is capped at what it already holds and marked full
    (``stats().nvme_full``); everything stored before stays readable.
    """


class StoreIOError(StoreError):
    """A read or write on the NVMe tier failed or was short."""


class ConfigMismatch(StoreError, ValueError):
    """The root was created with a different block size / layout."""


class RootLocked(StoreError):
    """Another live ``TieredStore`` (this or another process) holds the root."""


class IntegrityError(StoreError):
    """``check_integrity()`` found books that do not balance."""


class CorruptRecord(StoreError):
    """A self-describing record (slot header or remote value) failed to decode:
    wrong magic, unknown format version, header or payload checksum mismatch,
    or a key/length that does not fit.  The store treats the block as a miss
    (a slot whose header fails is free during a rebuild)."""


class IndexCorrupt(StoreError):
    """The LMDB index is damaged (truncated, bad meta pages, a bad page found
    while reading or committing).  ``TieredStore.open`` catches it, moves the
    index aside as ``index.corrupt-<time>`` and rebuilds it from the slot
    headers; mid-run the affected block reads as a miss and a rebuild is
    scheduled.  It reaches a caller only from ``kvtier store check``-style
    tools that inspect an index without repairing it."""


class OldLayout(ConfigMismatch):
    """The data directory was written by a previous on-disk format (slots
    without headers).  Nothing was changed; the message says what to do."""
