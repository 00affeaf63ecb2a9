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
