"""The self-describing record codec (store/record.py) and the BlockStore contract."""
import inspect

import pytest

from kvtier.store import BlockStore, CorruptRecord, StoreConfig, StoreError, TieredStore
from kvtier.store import record


def test_pack_unpack_round_trip():
    raw = record.pack(b"k" * 64, b"ns-tag-8", 4096, 0xDEADBEEF, 7)
    assert len(raw) == record.HEADER_BYTES == 112
    h = record.unpack(raw + bytes(100))
    assert (h.key, h.namespace, h.length, h.checksum, h.seq) == (b"k" * 64, b"ns-tag-8", 4096, 0xDEADBEEF, 7)


@pytest.mark.parametrize("pos", [0, 5, 6, 9, 17, 25, 33, 41, 104])
def test_any_flipped_header_byte_is_corrupt(pos):
    raw = bytearray(record.pack(b"key", bytes(8), 10, 1, 2))
    raw[pos] ^= 0x40
    with pytest.raises(CorruptRecord):
        record.unpack(raw)


def test_empty_slot_and_short_buffer_are_corrupt_with_a_reason():
    with pytest.raises(CorruptRecord, match="magic"):
        record.unpack(bytes(4096))
    with pytest.raises(CorruptRecord, match="needs 112"):
        record.unpack(b"KVTB")
    assert issubclass(CorruptRecord, StoreError)


def test_encode_decode_verifies_payload_and_key():
    blob = record.encode(b"abc", bytes(8), b"payload!" * 8, seq=3)
    h, payload = record.decode(blob, expect_key=b"abc")
    assert bytes(payload) == b"payload!" * 8 and h.seq == 3
    bad = bytearray(blob)
    bad[-1] ^= 1
    with pytest.raises(CorruptRecord, match="payload checksum"):
        record.decode(bad)
    with pytest.raises(CorruptRecord, match="another key"):
        record.decode(blob, expect_key=b"abd")
    with pytest.raises(CorruptRecord, match="payload bytes"):
        record.decode(blob[:-1])


def test_pack_refuses_bad_fields():
    with pytest.raises(ValueError):
        record.pack(b"", bytes(8), 1, 1, 1)
    with pytest.raises(ValueError):
        record.pack(b"k", b"short", 1, 1, 1)


def test_tiered_store_satisfies_block_store_protocol(tmp_path):
    with TieredStore.open(StoreConfig(root=tmp_path, host_bytes=1 << 16, nvme_bytes=1 << 16,
                                      block_bytes=4096)) as st:
        assert isinstance(st, BlockStore)
    for name, member in vars(BlockStore).items():
        if name.startswith("_") or not callable(member):
            continue
        want = inspect.signature(member)
        have = inspect.signature(getattr(TieredStore, name))
        assert list(want.parameters) == list(have.parameters), name


def test_protocol_module_imports_only_typing():
    import ast

    import kvtier.store.protocol as p
    tree = ast.parse(inspect.getsource(p))
    mods = {n.module if isinstance(n, ast.ImportFrom) else a.name
            for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
            for a in n.names}
    assert mods == {"__future__", "typing"}
