"""Self-describing records: the header every stored block carries.

Every NVMe slot has a fixed 112-byte header (in its slab's header region,
store/nvme.py), and every remote value starts with one; it says what the
block bytes are, so the index is derivable from the data::

    offset size  field
    ------ ----  ---------------------------------------------------------
         0    4  magic            b"KVTB"
         4    2  format version   u16 little-endian (FORMAT_VERSION = 1)
         6    1  key length       u8, 1..64
         7    1  flags            u8, 0 (reserved)
         8    8  namespace tag    8 bytes (Namespace.tag, or zeros)
        16    8  payload length   u64 (block bytes that follow)
        24    8  payload checksum u64 xxh3-64 of the payload
        32    8  write sequence   u64, grows with every write of the store
        40   64  key              key bytes, zero padded to 64
       104    8  header checksum  u64 xxh3-64 of bytes [0, 104)
       112       end (HEADER_BYTES)

    +------+----+--+--+--------+--------+--------+--------+-----//-----+--------+
    | KVTB | v  |kl|fl| ns tag | length | xxh3   |  seq   | key (64)   | hdr    |
    |      |    |  |  |        |        | payload|        |            | xxh3   |
    +------+----+--+--+--------+--------+--------+--------+-----//-----+--------+
    0      4    6  7  8        16       24       32       40           104    112

The header checksum makes a flipped header a clean "not a record"; the
payload checksum makes flipped block bytes a miss.  The newest ``seq`` wins
when two records name the same key (a rebuild after the slot was rewritten).

``pack``/``unpack`` work on the header alone; ``encode``/``decode`` on a
header followed by its payload (the remote tier's values).  Every decoding
failure raises ``CorruptRecord`` saying which check failed.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

import xxhash

from .errors import CorruptRecord

MAGIC = b"KVTB"
FORMAT_VERSION = 1
MAX_KEY = 64
_HEAD = struct.Struct("<4sHBB8sQQQ64s")      # bytes [0, 104)
_SUM = struct.Struct("<Q")
HEADER_BYTES = _HEAD.size + _SUM.size        # 112
assert _HEAD.size == 104 and HEADER_BYTES == 112

__all__ = ["MAGIC", "FORMAT_VERSION", "HEADER_BYTES", "RecordHeader", "pack", "unpack",
           "encode", "decode", "payload_checksum", "looks_like_record"]


def payload_checksum(buf) -> int:
    """xxh3-64 of a payload (the same checksum the index keeps)."""
    return xxhash.xxh3_64_intdigest(buf)


@dataclass(frozen=True)
class RecordHeader:
    key: bytes
    namespace: bytes      # 8-byte tag
    length: int
    checksum: int         # xxh3-64 of the payload
    seq: int
    version: int = FORMAT_VERSION


def pack(key: bytes, namespace: bytes, length: int, checksum: int, seq: int) -> bytes:
    """The 112-byte header.  Raises ``ValueError`` for a key not 1..64 bytes,
    a namespace not 8 bytes, or a negative length/seq."""
    if not 0 < len(key) <= MAX_KEY:
        raise ValueError(f"record keys are 1..{MAX_KEY} bytes, got {len(key)}")
    if len(namespace) != 8:
        raise ValueError(f"namespace tags are 8 bytes, got {len(namespace)}")
    if length < 0 or seq < 0:
        raise ValueError("length and seq must be non-negative")
    head = _HEAD.pack(MAGIC, FORMAT_VERSION, len(key), 0, namespace, length, checksum, seq, key)
    return head + _SUM.pack(xxhash.xxh3_64_intdigest(head))


def looks_like_record(buf) -> bool:
    """True if ``buf`` starts with the record magic (cheap; proves nothing else)."""
    return bytes(memoryview(buf)[:4]) == MAGIC


def unpack(buf) -> RecordHeader:
    """Decode the header at the start of ``buf`` (at least 112 bytes).

    Raises ``CorruptRecord``: too short, wrong magic (e.g. an empty slot or a
    block of the previous format), unknown version, header checksum mismatch,
    key length outside 1..64 or flags set."""
    mv = memoryview(buf)
    if mv.nbytes < HEADER_BYTES:
        raise CorruptRecord(f"record header needs {HEADER_BYTES} bytes, got {mv.nbytes}")
    head = mv[:_HEAD.size]
    magic, version, klen, flags, ns, length, csum, seq, key = _HEAD.unpack(head)
    if magic != MAGIC:
        raise CorruptRecord(f"no record magic (found {magic!r})")
    (want,) = _SUM.unpack(mv[_HEAD.size:HEADER_BYTES])
    if xxhash.xxh3_64_intdigest(head) != want:
        raise CorruptRecord("record header checksum mismatch")
    if version != FORMAT_VERSION:
        raise CorruptRecord(f"record format version {version}; this kvtier reads {FORMAT_VERSION}")
    if not 0 < klen <= MAX_KEY or flags:
        raise CorruptRecord(f"record key length {klen} / flags {flags} out of range")
    return RecordHeader(key=key[:klen], namespace=ns, length=length, checksum=csum, seq=seq,
                        version=version)


def encode(key: bytes, namespace: bytes, payload, seq: int) -> bytes:
    """Header + payload as one bytes object (a remote value)."""
    mv = memoryview(payload).cast("B")
    return pack(key, namespace, mv.nbytes, payload_checksum(mv), seq) + bytes(mv)


def decode(blob, expect_key: bytes | None = None) -> tuple[RecordHeader, memoryview]:
    """Verify and split a header + payload blob; the payload is a view into ``blob``.

    Raises ``CorruptRecord`` if the header fails ``unpack``, the blob is
    shorter or longer than the header says, the payload checksum fails, or the
    key differs from ``expect_key``."""
    mv = memoryview(blob).cast("B")
    hdr = unpack(mv)
    if mv.nbytes != HEADER_BYTES + hdr.length:
        raise CorruptRecord(f"record says {hdr.length} payload bytes, blob holds {mv.nbytes - HEADER_BYTES}")
    if expect_key is not None and hdr.key != expect_key:
        raise CorruptRecord("record holds another key")
    payload = mv[HEADER_BYTES:]
    if payload_checksum(payload) != hdr.checksum:
        raise CorruptRecord("record payload checksum mismatch")
    return hdr, payload
