"""A remote value's record header: built lazily for a put, checked bytewise for a get.

``value = record header (store/record.py, 112 bytes) + seal + payload``: the
seal is empty without a key and 32 bytes with one (auth.py); see ``tier.py``
for the names and the isolation domain.

Threading: ``Heads`` lets threads compute disjoint indexes at once;
``HeaderCheck`` is read-only after construction but for a benign cache.
"""
from __future__ import annotations

import struct
import threading
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
    """The bytes sent before each payload of a batch (record header, then the
    seal: ``sealer.seal``), each computed the first time it is read: backends
    read ``heads[i]`` right after moving payload i, so the hash reads it from
    cache.  ``sums[i]``, when not None, is payload i's xxh3 already known (the
    store's record of the block): an unkeyed header uses it instead of
    hashing (a keyed one carries none).  ``bodies[i]`` is what is sent after
    ``heads[i]``: the payload itself, or the staging buffer an encrypting
    sealer fills when it computes ``heads[i]`` (so those must be computed
    before the backend reads the body: ``compute``).  Threads may compute
    disjoint indexes at once (one list slot each); nothing else is shared."""

    __slots__ = ("_keys", "_bufs", "_bodies", "_tag", "_seq", "_done", "_sums", "_sealer")

    def __init__(self, keys, bufs, tag: bytes, seq: int, sums=None, sealer=None, bodies=None) -> None:
        from .auth import Unsealed
        self._keys, self._bufs, self._tag, self._seq = keys, bufs, tag, seq
        self._bodies = bufs if bodies is None else bodies
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
            c = self._sealer.payload_sum(b, None if self._sums is None else self._sums[i])
            h = record.pack(self._keys[i], self._tag, b.nbytes, c, self._seq)
            h = self._done[i] = self._sealer.seal(h, b, self._bodies[i])
        return h


class ArenaPool:
    """Reusable staging arenas of one size (pre-faulted once, kept for the next
    batch: a fresh 16 MiB arena costs ~4,000 page faults).  Keeps at most
    ``keep``.  Thread-safe."""

    def __init__(self, nbytes: int, keep: int = 2) -> None:
        self.nbytes, self._keep = nbytes, keep
        self._free: list[bytearray] = []
        self._lock = threading.Lock()

    def take(self) -> bytearray:
        with self._lock:
            if self._free:
                return self._free.pop()
        return bytearray(self.nbytes)

    def give(self, arena: bytearray) -> None:
        with self._lock:
            if len(self._free) < self._keep:
                self._free.append(arena)


class Staging(Sequence):
    """The bodies of an encrypting sealer's batch: ``per`` blocks of ``block``
    bytes per part, in an arena from ``pool`` taken when one of the part's
    bodies is first read and given back by ``release(part)`` once the call
    that sent them has returned.  Threads may read disjoint parts at once."""

    def __init__(self, n: int, block: int, per: int, pool: ArenaPool) -> None:
        self._n, self._block, self._per, self._pool = n, block, per, pool
        self._arenas: dict[int, memoryview] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self._n))]
        part, k = divmod(i, self._per)
        with self._lock:
            arena = self._arenas.get(part)
            if arena is None:
                arena = self._arenas[part] = memoryview(self._pool.take())
        return arena[k * self._block:(k + 1) * self._block]

    def release(self, part: int) -> None:
        with self._lock:
            arena = self._arenas.pop(part, None)
        if arena is not None:
            self._pool.give(arena.obj)
