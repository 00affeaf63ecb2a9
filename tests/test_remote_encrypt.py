"""Encrypted values on the shared tier: a client without the key sees no plaintext byte.

With ``encrypt`` (``StoreConfig.remote_encrypt`` / ``KVTIER_REMOTE_ENCRYPT``)
the tier writes AES-256-GCM ciphertext of the record header and the payload;
the attacker is any client of the Redis server (plain redis-py) that lists
and reads every value.
"""
from __future__ import annotations

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from kvtier.store import StoreConfig, TieredStore, record
from kvtier.store.remote import BadRemoteKey, RemoteTier, load_encrypt, tier as tier_module
from kvtier.store.remote.gcm import BOUNCE_BYTES, Gcm, decrypt_step, in_place_allowed
from kvtier_testutil import key, random_block
from remote_servers import mooncake_cluster, redis_server  # noqa: F401 (fixtures)

pytestmark = pytest.mark.faults

BB = 64 << 10
SECRET = b"tenant secret for encryption...."
HEAD = record.HEADER_BYTES


def tier(url, secret=SECRET, domain="enc", encrypt=True, block=BB):
    t = RemoteTier.from_url(url, block, domain, secret=secret, encrypt=encrypt)
    assert t.wait_ready(15), t.stats()
    return t


def fetch(t, ks, block=BB):
    outs = [np.full(block, 0x33, np.uint8) for _ in ks]
    return t.fetch(ks, [memoryview(o) for o in outs]), outs


STEPS = [pytest.param(None, id="as-installed"),
         pytest.param(False, id="bounced"),
         pytest.param(True, id="in-place", marks=pytest.mark.skipif(
             not in_place_allowed(), reason="this cryptography refuses in-place update_into"))]


@pytest.mark.parametrize("in_place", STEPS)
@pytest.mark.parametrize("size", [5000, 3 * BOUNCE_BYTES + 17])
def test_gcm_matches_the_standard_construction(in_place, size):
    # encrypt/decrypt over several buffers are one AES-256-GCM stream (what AESGCM
    # computes over their concatenation), whichever way decrypt writes its output;
    # tag is the GMAC form of auth.py
    rng = np.random.default_rng(5)
    k, nonce = bytes(rng.integers(0, 256, 32, np.uint8)), bytes(12)
    head, payload = bytes(rng.integers(0, 256, 112, np.uint8)), bytes(rng.integers(0, 256, size, np.uint8))
    g, ref = Gcm(k, decrypt_step(in_place)), AESGCM(k)
    assert g.tag(nonce, head, payload) == ref.encrypt(nonce, head, payload)[-16:]
    h_out, p_out = bytearray(112), bytearray(size)
    tag = g.encrypt(nonce, b"KVTE", [head, payload], [h_out, p_out])
    assert bytes(h_out) + bytes(p_out) + tag == ref.encrypt(nonce, head + payload, b"KVTE")
    assert g.decrypt(nonce, b"KVTE", [h_out, p_out], tag) and bytes(h_out) == head and bytes(p_out) == payload
    g.encrypt(nonce, b"KVTE", [head, payload], [h_out, p_out])
    p_out[size - 4321] ^= 1
    assert not g.decrypt(nonce, b"KVTE", [h_out, p_out], tag)
    with pytest.raises(ValueError):
        g.encrypt(nonce, b"", [payload], [bytearray(10)])


def test_decrypt_of_a_numpy_frame_lands_in_the_frame():
    # the tier decrypts straight into host frames (uint8 arrays), not into a copy
    rng = np.random.default_rng(9)
    k, nonce = bytes(32), bytes(range(12))
    plain = rng.integers(0, 256, 2 * BOUNCE_BYTES + 5, np.uint8)
    frame = np.empty_like(plain)
    g = Gcm(k)
    tag = g.encrypt(nonce, b"", [plain], [frame])
    assert not (frame == plain).all()
    assert g.decrypt(nonce, b"", [frame], tag) and (frame == plain).all()


def test_no_plaintext_byte_of_a_known_payload_in_any_stored_value(redis_server):
    t = tier(redis_server.url, domain="enc-plain")
    r = redis_server.client()
    try:
        ks = [key(100 + i) for i in range(6)]
        data = [random_block(100 + i, BB) for i in range(6)]
        assert t.publish(ks, [memoryview(d) for d in data]) == 6
        names = r.keys("kvtier:*")
        assert {t.name(k) for k in ks} <= set(names)
        for v in (r.get(n) for n in names):               # every value on the server
            for d, k in zip(data, ks):
                p = d.tobytes()
                assert not any(p[o:o + 16] in v for o in range(0, BB - 16, 997))   # no 16-byte run of it
                assert k not in v                                                  # nor the block key
        for v in (r.get(t.name(k)) for k in ks):
            assert v[HEAD:HEAD + 4] == b"KVTE" and not v.startswith(record.MAGIC)  # the header is ciphertext too
        ok, outs = fetch(t, ks)
        assert ok == [True] * 6 and all((o == d).all() for o, d in zip(outs, data))
        assert t.stats().encrypted and t.encrypted
    finally:
        t.close()


def test_flipped_byte_anywhere_is_a_miss_zeroed_and_deleted(redis_server):
    t = tier(redis_server.url, domain="enc-flip")
    r = redis_server.client()
    try:
        k = key(120)
        for pos in (0, 45, HEAD + 2, HEAD + 9, HEAD + 31, t.head_bytes, t.head_bytes + BB - 1):
            assert t.publish([k], [memoryview(random_block(120, BB))]) == 1
            raw = bytearray(r.get(t.name(k)))
            raw[pos] ^= 0x01
            r.set(t.name(k), bytes(raw))
            ok, outs = fetch(t, [k])
            assert ok == [False] and not outs[0].any(), pos        # no decrypted garbage left behind
            assert r.get(t.name(k)) is None, pos
        assert t.stats().corrupt_dropped == 7
    finally:
        t.close()


def test_an_encrypted_value_moved_to_another_name_is_a_miss(redis_server):
    t = tier(redis_server.url, domain="enc-replay")
    r = redis_server.client()
    try:
        a, b = key(130), key(131)
        assert t.publish([a, b], [memoryview(random_block(130, BB)), memoryview(random_block(131, BB))]) == 2
        r.set(t.name(b), r.get(t.name(a)))
        assert fetch(t, [b])[0] == [False]
        assert fetch(t, [a])[0] == [True]
    finally:
        t.close()


def test_keyed_readers_open_both_forms_and_others_open_neither(redis_server):
    # a fleet part-way through turning encryption on: with the key, a reader opens
    # authenticated and encrypted values alike; another key or no key finds neither
    enc = tier(redis_server.url, domain="enc-mixed")
    mac = tier(redis_server.url, domain="enc-mixed", encrypt=False)
    other = tier(redis_server.url, secret=b"some other tenant's key.........", domain="enc-mixed")
    try:
        ka, kb = key(140), key(141)
        da, db = random_block(140, BB), random_block(141, BB)
        assert enc.publish([ka], [memoryview(da)]) == 1 and mac.publish([kb], [memoryview(db)]) == 1
        for reader in (enc, mac):
            ok, outs = fetch(reader, [ka, kb])
            assert ok == [True, True] and (outs[0] == da).all() and (outs[1] == db).all()
        assert other.contains([ka, kb]) == [False, False]
    finally:
        for t in (enc, mac, other):
            t.close()


@pytest.mark.parametrize("backend", ["redis", "mooncake"])
def test_multi_part_batch_round_trip(request, backend, monkeypatch):
    # ciphertext is staged in parts (tier.STAGE_BYTES); every part's arena goes back to the pool
    monkeypatch.setattr(tier_module, "STAGE_BYTES", 3 * BB)
    url = request.getfixturevalue("redis_server" if backend == "redis" else "mooncake_cluster").url
    t = tier(url, domain=f"enc-parts-{backend}")
    try:
        ks = [key(150 + i) for i in range(10)]
        data = [random_block(150 + i, BB) for i in range(10)]
        assert t.publish(ks, [memoryview(d) for d in data]) == 10
        ok, outs = fetch(t, ks + [key(999)])
        assert ok == [True] * 10 + [False]
        assert all((o == d).all() for o, d in zip(outs, data))
    finally:
        t.close()


def test_encryption_needs_a_key(tmp_path, redis_server, monkeypatch):
    monkeypatch.delenv("KVTIER_REMOTE_KEY", raising=False)
    monkeypatch.delenv("KVTIER_REMOTE_KEY_FILE", raising=False)
    with pytest.raises(BadRemoteKey, match="needs a key"):
        RemoteTier.from_url(redis_server.url, BB, encrypt=True)
    cfg = StoreConfig(root=tmp_path / "s", host_bytes=4 * BB, nvme_bytes=0, block_bytes=BB, pin_host="off",
                      remote_url=redis_server.url, remote_encrypt=True)
    with pytest.raises(BadRemoteKey, match="needs a key"):
        TieredStore.open(cfg)
    monkeypatch.setenv("KVTIER_REMOTE_ENCRYPT", "1")
    with pytest.raises(BadRemoteKey, match="needs a key"):
        TieredStore.open(cfg.with_(remote_encrypt=None))
    with pytest.raises(ValueError):
        StoreConfig(root=tmp_path / "s", remote_encrypt="yes")


def test_load_encrypt():
    assert load_encrypt(True, env={}) and not load_encrypt(False, env={"KVTIER_REMOTE_ENCRYPT": "1"})
    assert load_encrypt(None, env={"KVTIER_REMOTE_ENCRYPT": "1"})
    assert not load_encrypt(None, env={}) and not load_encrypt(None, env={"KVTIER_REMOTE_ENCRYPT": "0"})
    with pytest.raises(ValueError):
        load_encrypt(None, env={"KVTIER_REMOTE_ENCRYPT": "maybe"})


def test_stores_share_encrypted_blocks(tmp_path, redis_server, monkeypatch):
    monkeypatch.delenv("KVTIER_REMOTE_ENCRYPT", raising=False)
    cfg = dict(host_bytes=8 * BB, nvme_bytes=0, block_bytes=BB, pin_host="off", remote_url=redis_server.url,
               remote_domain="enc-stores", remote_key=SECRET)
    with TieredStore.open(StoreConfig(root=tmp_path / "a", remote_encrypt=True, **cfg)) as a, \
            TieredStore.open(StoreConfig(root=tmp_path / "b", **cfg)) as b:
        monkeypatch.setenv("KVTIER_REMOTE_ENCRYPT", "1")
        with TieredStore.open(StoreConfig(root=tmp_path / "c", **cfg)) as c:
            assert a.remote.wait_ready(15) and b.remote.wait_ready(15)
            assert a.remote.encrypted and not b.remote.encrypted and c.remote.encrypted
            ks, data = [key(160 + i) for i in range(3)], [random_block(160 + i, BB) for i in range(3)]
            assert a.put_many(ks, data, tier="remote") == 3
            got = np.zeros(BB, np.uint8)
            assert b.get(ks[2], memoryview(got)) and (got == data[2]).all()
            assert b.stats().remote["encrypted"] is False


def test_plugin_config_passes_the_key_file_and_encrypt_to_the_store(tmp_path):
    from kvtier.engine_adapter.config import PluginConfig
    f = tmp_path / "key"
    f.write_bytes(SECRET)
    cfg = PluginConfig.parse({"data_dir": str(tmp_path), "remote_key_file": str(f), "remote_encrypt": True},
                             engine="vllm")
    opts = cfg.store_options()
    assert opts["remote_key_file"] == str(f) and opts["remote_encrypt"] is True
    assert "remote_encrypt" not in PluginConfig.parse({"data_dir": str(tmp_path)}, engine="vllm").store_options()
    with pytest.raises(ValueError, match="remote_encrypt"):
        PluginConfig.parse({"data_dir": str(tmp_path), "remote_encrypt": "yes"}, engine="vllm")
