"""A remote value's record header: built lazily for a put, checked bytewise for a get.

``value = record header (store/record.py, 112 bytes) + seal + payload``: the
seal is empty without a key and 32 bytes with one (auth.py); see ``tier.py``
for the names and the isolation domain.

Threading: ``Heads`` lets threads compute disjoint indexes at once;
``HeaderCheck`` is read-only after construction but for a benign cache.
"""
from __future__ import annotations

import struct
from collections.abc import Sequence

import xxhash

from .. import record

_PREFIX = struct.Struct("<4sHBB8sQ")       # record bytes [0, 24): magic, version, key length, flags, tag, length
_SUM = struct.Struct("<Q")
_xxh3 = xxhash.xxh3_64_intdigest


class HeaderCheck:
    """Verifies a remote value's record header against what it must say.

    Same checks as ``record.unpack`` plus the expectations (magic, version,
    key length, no flags, the domain tag and ``block_bytes`` are one
    expected 24-byte prefix per key length; the key bytes, zero padded;
    the header's own xxh3), as byte comparisons -- no decoded object per
    value.  ``payload_sum(key, head)`` is the payload xxh3 the header
    promises, or None if anything else fails.  Read-only after construction
    except a per-key-length cache (benign races: equal values)."""

    def __init__(self, tag: bytes, length: int) -> None:
        self._tag, self._length = tag, length
        self._prefix: dict[int, bytes] = {}

    def payload_sum(self, key: bytes, head) -> int | None:
        hb = bytes(head[:record.HEADER_BYTES])
        n = len(key)
        prefix = self._prefix.get(n)
        if prefix is None:
            prefix = self._prefix[n] = _PREFIX.pack(record.MAGIC, record.FORMAT_VERSION, n, 0,
                                                    self._tag, self._length)
        if (len(hb) != record.HEADER_BYTES or hb[:24] != prefix or hb[40:40 + n] != key
                or hb[40 + n:104].count(0) != 104 - 40 - n
                or _xxh3(hb[:104]) != _SUM.unpack_from(hb, 104)[0]):
            return None
        return _SUM.unpack_from(hb, 24)[0]


class Heads(Sequence):
    """The record headers (each followed by its seal) of a batch, each computed
    (payload xxh3 + pack + ``sealer.seal``) the first time it is read: backends read ``heads[i]`` right after moving
    payload i, so the hash reads it from cache.  ``sums[i]``, when not None,
    is payload i's xxh3 already known (the store's record of the block): it
    is used instead of hashing.  Threads may compute disjoint indexes at once
    (one list slot each); nothing else is shared."""

    __slots__ = ("_keys", "_bufs", "_tag", "_seq", "_done", "_sums", "_sealer")

    def __init__(self, keys, bufs, tag: bytes, seq: int, sums=None, sealer=None) -> None:
        from .auth import Unsealed
        self._keys, self._bufs, self._tag, self._seq = keys, bufs, tag, seq
        self._sums = sums
        self._sealer = Unsealed() if sealer is None else sealer
        self._done: list[bytes | None] = [None] * len(keys)

    def __len__(self) -> int:
        return len(self._keys)

    def compute(self, part: range) -> None:
        """Compute the headers of ``part`` now (a helper thread, ahead of the backend)."""
        for i in part:
            self[i]

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        h = self._done[i]
        if h is None:
            b = self._bufs[i]
            c = None if self._sums is None else self._sums[i]
            h = record.pack(self._keys[i], self._tag, b.nbytes,
                            record.payload_checksum(b) if c is None else c, self._seq)
            h = self._done[i] = h + self._sealer.seal(h, b)
        return h
