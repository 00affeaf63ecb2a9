"""Forged values on the shared tier: with a key they are misses; without one the trust model is stated.

The attacker is any client of the Redis server (plain redis-py): it lists
``kvtier:*``, reads a value, replaces the payload, recomputes every unkeyed
checksum (the record header's payload and header xxh3s) and writes it back.
"""
from __future__ import annotations

import logging

import numpy as np
import pytest

from kvtier.store import StoreConfig, TieredStore, record
from kvtier.store.remote import BadRemoteKey, RemoteTier, load_key
from kvtier_testutil import key, random_block
from remote_servers import redis_server  # noqa: F401 (fixture)

pytestmark = pytest.mark.faults

BB = 64 << 10
SECRET = b"victim's secret, 32 bytes long.."
HEAD = record.HEADER_BYTES


def tier(url, secret=None, domain=""):
    t = RemoteTier.from_url(url, BB, domain, secret=secret)
    assert t.wait_ready(15), t.stats()
    return t


def forge(raw: bytes, payload: bytes) -> bytes:
    """What an attacker without the key can do: keep the header's fields, put its
    own payload, recompute the payload xxh3 and the header's own checksum."""
    h = record.unpack(raw[:HEAD])
    head = record.pack(h.key, h.namespace, len(payload), record.payload_checksum(payload), h.seq + 1)
    return head + raw[HEAD:len(raw) - len(payload)] + payload


def fetch(t, k):
    out = np.full(BB, 0x33, np.uint8)
    return t.fetch([k], [memoryview(out)])[0], out


def test_forged_value_is_a_miss_and_is_deleted_with_a_key(redis_server):
    r = redis_server.client()
    victim = tier(redis_server.url, SECRET, domain="forge-keyed")
    try:
        k = key(11)
        assert victim.publish([k], [memoryview(random_block(11, BB))]) == 1
        name = victim.name(k)
        # the attacker finds the value by listing and rewrites it in place
        assert name in r.keys("kvtier:*")
        evil = bytes(np.full(BB, 0xEE, np.uint8))
        r.set(name, forge(r.get(name), evil))
        ok, out = fetch(victim, k)
        assert not ok and not out.any()          # a miss; no forged (or any) byte served
        assert victim.stats().corrupt_dropped == 1
        assert r.get(name) is None               # the forged value was deleted
    finally:
        victim.close()


def test_without_a_key_the_tier_trusts_every_client(redis_server, caplog):
    # the documented trust model: an unkeyed tier logs it once at start, and
    # a forgery that recomputes the unkeyed checksums is served
    with caplog.at_level(logging.WARNING, logger="kvtier.store.remote.tier"):
        victim = tier(redis_server.url, None, domain="forge-unkeyed")
    try:
        assert sum("trusts every client" in m for m in caplog.messages) == 1
        k = key(12)
        assert victim.publish([k], [memoryview(random_block(12, BB))]) == 1
        r = redis_server.client()
        evil = bytes(np.full(BB, 0xEE, np.uint8))
        r.set(victim.name(k), forge(r.get(victim.name(k)), evil))
        ok, out = fetch(victim, k)
        assert ok and out.tobytes() == evil      # what "trusts every client" means
        assert not victim.stats().keyed
    finally:
        victim.close()


def test_names_need_the_key(redis_server):
    # a client without the key (or with another) cannot find the domain's values,
    # and its publishes never land where the keyed domain reads
    keyed = tier(redis_server.url, SECRET, domain="tenant")
    other = tier(redis_server.url, b"another tenant's secret key....", domain="tenant")
    unkeyed = tier(redis_server.url, None, domain="tenant")
    try:
        k = key(13)
        assert keyed.publish([k], [memoryview(random_block(13, BB))]) == 1
        assert len({keyed.name(k), other.name(k), unkeyed.name(k)}) == 3
        assert other.contains([k]) == [False] and unkeyed.contains([k]) == [False]
        assert unkeyed.publish([k], [memoryview(bytes(BB))]) == 1
        ok, out = fetch(keyed, k)
        assert ok and (out == random_block(13, BB)).all()
    finally:
        for t in (keyed, other, unkeyed):
            t.close()


def test_a_sealed_value_moved_to_another_name_is_a_miss(redis_server):
    # replaying a genuine value under another block's name: the seal covers the key
    t = tier(redis_server.url, SECRET, domain="replay")
    r = redis_server.client()
    try:
        a, b = key(14), key(15)
        assert t.publish([a, b], [memoryview(random_block(14, BB)), memoryview(random_block(15, BB))]) == 2
        r.set(t.name(b), r.get(t.name(a)))
        assert fetch(t, b)[0] is False
        assert fetch(t, a)[0] is True
    finally:
        t.close()


def test_flipped_seal_or_header_or_payload_byte_is_a_miss(redis_server):
    t = tier(redis_server.url, SECRET, domain="flip")
    r = redis_server.client()
    try:
        k = key(16)
        for pos in (3, HEAD + 7, HEAD + 31, t.head_bytes + 5, t.head_bytes + BB - 1):
            assert t.publish([k], [memoryview(random_block(16, BB))]) == 1
            raw = bytearray(r.get(t.name(k)))
            raw[pos] ^= 0x01
            r.set(t.name(k), bytes(raw))
            ok, out = fetch(t, k)
            assert not ok and not out.any(), pos
    finally:
        t.close()


def test_key_sources_and_the_key_never_shows(tmp_path, redis_server, monkeypatch):
    f = tmp_path / "key"
    f.write_bytes(SECRET + b"\n")
    assert load_key(key_file=f, env={}) == SECRET
    assert load_key(env={"KVTIER_REMOTE_KEY": SECRET.decode()}) == SECRET
    assert load_key(env={"KVTIER_REMOTE_KEY_FILE": str(f)}) == SECRET
    assert load_key(env={}) is None
    with pytest.raises(BadRemoteKey):
        load_key(b"short", env={})
    with pytest.raises(BadRemoteKey):
        load_key(key_file=tmp_path / "absent", env={})
    with pytest.raises(BadRemoteKey):
        StoreConfig(root=tmp_path, remote_key="short")
    # the plugins' path: the key comes from the environment
    monkeypatch.setenv("KVTIER_REMOTE_KEY_FILE", str(f))
    cfg = StoreConfig.from_env(tmp_path / "s", host_bytes=4 * BB, nvme_bytes=4 * BB, block_bytes=BB,
                               io_engine="threads", pin_host="off", remote_url=redis_server.url)
    assert SECRET.decode()[:10] not in repr(cfg)
    with TieredStore.open(cfg) as st:
        assert st.remote.keyed and st.stats().remote["keyed"]
        assert SECRET.decode()[:10] not in repr(st.stats())
        assert st.remote.wait_ready(15)
        assert st.put_many([key(17)], [random_block(17, BB)], tier="remote") == 1
    monkeypatch.delenv("KVTIER_REMOTE_KEY_FILE")
    monkeypatch.setenv("KVTIER_REMOTE_KEY", SECRET.decode())
    with TieredStore.open(cfg.with_(root=tmp_path / "t", remote_key_file=None, remote_key=None)) as st:
        assert st.remote.wait_ready(15)
        out = np.zeros(BB, np.uint8)
        assert st.get_many([key(17)], [out]) == [True] and (out == random_block(17, BB)).all()
