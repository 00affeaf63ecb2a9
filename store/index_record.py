"""The index's record of one block, and the check that makes a damaged record damage.

One LMDB value per block on the NVMe tier::

    key (1..64 bytes) -> 48 bytes, little-endian
        offset size  field
        ------ ----  ------------------------------------------------------
             0    1  tier             u8, 2 (NVMe)
             1    3  pad              zeros
             4    4  check            u32: low 32 bits of xxh3-64(key + bytes [8, 48))
             8    8  slot             u64
            16    8  length           u64
            24    8  payload checksum u64 (xxh3-64 of the block bytes)
            32    8  namespace tag    8 bytes
            40    8  last access      f64 (unix seconds)

    +--+---+-------+--------+--------+--------+--------+--------+
    |t |pad| check |  slot  | length | xxh3   | ns tag | access |
    +--+---+-------+--------+--------+--------+--------+--------+
    0  1   4       8        16       24       32       40       48

The check covers the key too, so a flipped byte in a key or in a value reads
as damage (``IndexCorrupt``) instead of naming the wrong slot, a wrong
checksum, or another key.  An index written before records carried checks is
told apart by the ``meta`` marker ``RECORD_FORMAT`` (``store/index.py``).
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

import xxhash

from .errors import IndexCorrupt

TIER_NVME = 2
RECORD_FORMAT = b"checked-1"      # the meta value of an index whose records carry checks

_HEAD = struct.Struct("<B3xI")     # tier, check
_BODY = struct.Struct("<QQQ8sd")   # slot, length, checksum, namespace, last access
REC_BYTES = _HEAD.size + _BODY.size
assert REC_BYTES == 48

_digest = xxhash.xxh3_64_intdigest
_MASK = 0xFFFFFFFF


def pack_record(key: bytes, slot: int, length: int, checksum: int, namespace: bytes,
                last_access: float) -> bytes:
    """The packed record of ``key`` (hot path: no ``IndexRecord`` built)."""
    body = _BODY.pack(slot, length, checksum, namespace, last_access)
    return _HEAD.pack(TIER_NVME, _digest(key + body) & _MASK) + body


@dataclass(frozen=True)
class IndexRecord:
    slot: int
    length: int
    checksum: int
    namespace: bytes
    last_access: float
    tier: int = TIER_NVME

    def pack(self, key: bytes) -> bytes:
        return pack_record(key, self.slot, self.length, self.checksum, self.namespace, self.last_access)

    @classmethod
    def unpack(cls, key: bytes, raw) -> "IndexRecord":
        """Decode and verify the record of ``key``.

        Raises:
            IndexCorrupt: ``raw`` is not ``REC_BYTES`` long, names another tier,
                or its check does not match the key and the fields.
        """
        if len(raw) != REC_BYTES:
            raise IndexCorrupt(f"index value of {bytes(key).hex()} is {len(raw)} bytes, not a record")
        tier, check = _HEAD.unpack_from(raw, 0)
        body = bytes(raw[_HEAD.size:])
        if tier != TIER_NVME or _digest(bytes(key) + body) & _MASK != check:
            raise IndexCorrupt(f"index record of {bytes(key).hex()} fails its check")
        slot, length, checksum, ns, la = _BODY.unpack(body)
        return cls(slot=slot, length=length, checksum=checksum, namespace=ns, last_access=la, tier=tier)


def record_slot(raw: bytes) -> int:
    """The slot a packed record names (no check: for records this process packed)."""
    return _BODY.unpack_from(raw, _HEAD.size)[0]
