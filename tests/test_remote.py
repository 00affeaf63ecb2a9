"""The remote tier on real servers: Redis, a three-master Redis Cluster, Mooncake Store.

Servers are started by tests/remote_servers.py on 127.0.0.1 (explicit free
ports) and stopped by PID.  Fault tests (servers killed mid-run) are in
test_remote_faults.py.
"""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from kvtier.store import StoreConfig, Tier, TieredStore
from kvtier.store.remote import BadRemoteURL, RemoteTier, parse_remote_url
from kvtier_testutil import key, random_block
from remote_servers import (free_port, mooncake_cluster, redis_cluster_url,  # noqa: F401 (fixtures)
                            redis_server)

BB = 64 << 10          # block bytes in these tests


def tier(url: str, domain: str = "") -> RemoteTier:
    t = RemoteTier.from_url(url, BB, domain)
    assert t.wait_ready(15), t.stats()
    return t


def blocks(lo: int, n: int) -> tuple[list[bytes], list[np.ndarray]]:
    return [key(i) for i in range(lo, lo + n)], [random_block(i, BB) for i in range(lo, lo + n)]


def outs(n: int) -> list[memoryview]:
    return [memoryview(np.full(BB, 0xAA, np.uint8)) for _ in range(n)]


@pytest.fixture(params=["redis", "cluster", "mooncake"])
def url(request):
    if request.param == "redis":
        return request.getfixturevalue("redis_server").url
    if request.param == "cluster":
        return request.getfixturevalue("redis_cluster_url")[0]
    return request.getfixturevalue("mooncake_cluster").url


# ---------------------------------------------------------------- URLs
def test_url_forms_and_redaction():
    s = parse_remote_url("redis://alice:s3cret@127.0.0.1:7000/3")
    assert (s.kind, s.hosts, s.db, s.username, s.password) == ("redis", (("127.0.0.1", 7000),), 3, "alice", "s3cret")
    assert "s3cret" not in s.redacted() and "s3cret" not in repr(s)
    assert parse_remote_url("redis://a:1,b:2,c:3").kind == "redis-cluster"
    assert parse_remote_url("redis+cluster://a:1").kind == "redis-cluster"
    assert parse_remote_url("rediss://h").tls
    assert parse_remote_url("unix:///run/r.sock?db=2").unix_path == "/run/r.sock"
    m = parse_remote_url("mooncake://127.0.0.1:50051?metadata=http://127.0.0.1:8080/metadata&protocol=tcp")
    assert (m.kind, m.metadata_url) == ("mooncake", "http://127.0.0.1:8080/metadata")
    env = {"KVTIER_REMOTE_PASSWORD": "fromenv"}
    assert parse_remote_url("redis://h:1", env=env).password == "fromenv"
    assert parse_remote_url("redis://:inurl@h:1", env=env).password == "inurl"


@pytest.mark.parametrize("bad", ["ftp://h", "redis://:pw@h:notaport", "redis://h/x", "mooncake://h:1",
                                 "redis://a:1,b:2/3", "redis://h?timeout=-1", "nonsense"])
def test_bad_urls_are_one_line_errors_without_the_password(bad):
    with pytest.raises(BadRemoteURL) as ei:
        parse_remote_url(bad)
    assert "pw" not in str(ei.value).replace("pwd", "")
    with pytest.raises(ValueError):
        StoreConfig(root="unused", remote_url=bad)


def test_config_repr_hides_the_remote_url():
    c = StoreConfig(root="unused", remote_url="redis://:topsecret@127.0.0.1:1", remote_domain="tenant-a")
    assert "topsecret" not in repr(c) and "tenant-a" not in repr(c)


# ---------------------------------------------------------------- data path
def test_publish_then_fetch_bit_exact(url):
    t = tier(url)
    try:
        ks, data = blocks(1000, 12)
        assert t.publish(ks, [memoryview(d) for d in data]) == 12
        got = outs(13)
        ok = t.fetch(ks + [key(99999)], got)
        assert ok == [True] * 12 + [False]
        assert all(bytes(g) == d.tobytes() for g, d in zip(got, data))
        assert t.lookup(ks + [key(99999)] + ks) == 12
        s = t.stats()
        assert (s.state, s.hits, s.misses, s.corrupt_dropped) == ("up", 12, 1, 0)
    finally:
        t.close()


def test_cluster_spreads_blocks_over_every_master(redis_cluster_url):
    url, nodes = redis_cluster_url
    t = tier(url)
    try:
        ks, data = blocks(2000, 30)
        assert t.publish(ks, [memoryview(d) for d in data]) == 30
        sizes = [n.client().dbsize() for n in nodes]
        assert all(s > 0 for s in sizes), sizes           # every master holds some of them
    finally:
        t.close()


def flip_byte(url: str, t: RemoteTier, k: bytes, offset: int) -> None:
    """Flip one byte of a block's value on the server (a fault, not through kvtier)."""
    name = t.name(k)
    if url.startswith("mooncake"):
        from mooncake.store import MooncakeDistributedStore   # a second, raw client
        spec = parse_remote_url(url)
        raw = MooncakeDistributedStore()
        (h, p), = spec.hosts
        assert raw.setup("127.0.0.1", spec.metadata_url, 0, 16 << 20, "tcp", "", f"{h}:{p}") == 0
        buf = bytearray(raw.get(name.decode()))
        buf[offset] ^= 0xFF
        raw.remove(name.decode(), True)
        assert raw.put(name.decode(), bytes(buf)) == 0
        raw.close()
        return
    import redis
    spec = parse_remote_url(url)
    if spec.kind == "redis-cluster":
        from redis.cluster import ClusterNode, RedisCluster
        c = RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in spec.hosts])
    else:
        (h, p), = spec.hosts
        c = redis.Redis(host=h, port=p)
    val = bytearray(c.get(name))
    val[offset] ^= 0xFF
    c.set(name, bytes(val))
    c.close()


@pytest.mark.parametrize("where", ["payload", "header"])
def test_flipped_byte_is_a_miss_and_is_deleted(url, where):
    t = tier(url)
    try:
        ks, data = blocks(3000 if where == "payload" else 3100, 3)
        assert t.publish(ks, [memoryview(d) for d in data]) == 3
        flip_byte(url, t, ks[1], 112 + 777 if where == "payload" else 20)
        got = outs(3)
        assert t.fetch(ks, got) == [True, False, True]     # never served
        assert bytes(got[1]) == bytes(BB)                    # the buffer was zeroed
        assert t.stats().corrupt_dropped == 1
        assert t.contains(ks) == [True, False, True]       # deleted on the server
    finally:
        t.close()


@pytest.mark.parametrize("lend", [False, True], ids=["own-buffers", "lent"])
def test_mooncake_pipelined_parts_bit_exact_with_a_missing_and_a_corrupt_value(mooncake_cluster, monkeypatch, lend):
    """A batch moves in parts (``PART_BYTES``), two calls in flight
    (store/remote/calls.py ``Batch``): here 10 values in parts of 2, so five
    calls each way.  Every hit is bit-exact, a missing and a corrupt value
    (in different parts) are misses -- the corrupt one zeroed and deleted --
    and no byte outside the destination frames changes."""
    from kvtier.store.hostpool import buffer_address
    from kvtier.store.remote import arenas, mooncake_backend
    monkeypatch.setattr(mooncake_backend, "PART_BYTES", 2 * BB)
    submitted = []
    t = tier(mooncake_cluster.url)
    real_add = mooncake_backend.Calls.batch

    def counting_batch(self, *a, **kw):
        b = real_add(self, *a, **kw)
        add = b.add
        b.add = lambda *x, **y: submitted.append(b.what) or add(*x, **y)
        return b
    monkeypatch.setattr(mooncake_backend.Calls, "batch", counting_batch)
    frames = np.full(12 * BB, 0x5A, np.uint8)               # guard frame, 10 destination frames, guard frame
    t.register(buffer_address(memoryview(frames)), frames.nbytes)
    try:
        ks, data = blocks(3500 + 50 * lend, 10)
        assert t.publish(ks[:4] + ks[5:], [memoryview(d) for d in data[:4] + data[5:]]) == 9   # 4: never put
        assert submitted.count("put") == 5
        flip_byte(mooncake_cluster.url, t, ks[7], 112 + 999)
        order = [3, 0, 9, 6, 1, 8, 4, 2, 7, 5]
        dest = [memoryview(frames)[(1 + i) * BB:(2 + i) * BB] for i in order]
        ok = t.fetch([ks[i] for i in order], dest, loan=arenas.Loan() if lend else None)
        assert ok == [i not in (4, 7) for i in order]
        assert submitted.count("get") == 5
        for i, buf, hit in zip(order, dest, ok):
            if hit:
                assert bytes(buf) == data[i].tobytes(), i
        assert bytes(dest[order.index(7)]) == bytes(BB)        # corrupt: zeroed, never served
        assert t.contains([ks[7]]) == [False]                  # and deleted
        assert (frames[:BB] == 0x5A).all() and (frames[11 * BB:] == 0x5A).all()   # guards untouched
    finally:
        t.close()


def test_mooncake_waiting_workers_run_at_lowered_priority(mooncake_cluster):
    """Mooncake's client spins while it waits for a transfer; kvtier's call
    workers lower their own priority (calls.WAITER_NICE), and only theirs:
    the client's transfer threads and every other thread keep theirs."""
    import os
    import threading

    from kvtier.store.remote import calls
    t = tier(mooncake_cluster.url)
    try:
        ks, data = blocks(3700, 4)
        assert t.publish(ks, [memoryview(d) for d in data]) == 4       # workers exist now
        assert t.fetch(ks, outs(4)) == [True] * 4
        workers = {th.native_id for th in threading.enumerate() if th.name.startswith("kvtier-remote-call")}
        assert workers
        base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        nice = {int(tid): os.getpriority(os.PRIO_PROCESS, int(tid)) for tid in os.listdir("/proc/self/task")}
        assert all(nice[w] == min(19, base + calls.WAITER_NICE) for w in workers), nice
        assert all(v == base for tid, v in nice.items() if tid not in workers), nice
    finally:
        t.close()


def test_isolation_domains_never_hit_each_other(url):
    a, b, a2 = tier(url, "tenant-a"), tier(url, "tenant-b"), tier(url, "tenant-a")
    try:
        ks, data = blocks(4000, 4)
        assert a.publish(ks, [memoryview(d) for d in data]) == 4
        assert b.fetch(ks, outs(4)) == [False] * 4 and b.lookup(ks) == 0
        assert a2.fetch(ks, outs(4)) == [True] * 4       # the same domain shares
        assert a.name(ks[0]) != b.name(ks[0])
        assert ks[0].hex().encode() not in a.name(ks[0])  # names do not reveal block keys
    finally:
        for t in (a, b, a2):
            t.close()


def test_only_string_values_under_kvtier_names(redis_server):
    t = tier(redis_server.url)
    try:
        ks, data = blocks(5000, 5)
        t.publish(ks, [memoryview(d) for d in data])
        c = redis_server.client()
        names = list(c.scan_iter(count=1000))
        assert names and all(n.startswith(b"kvtier:") for n in names)
        assert {c.type(n) for n in names} == {b"string"}
        assert c.strlen(t.name(ks[0])) == 112 + BB        # header + raw payload, uncompressed
    finally:
        t.close()


# ---------------------------------------------------------------- open while down, credentials
def test_unreachable_remote_is_misses_and_never_logs_the_password(tmp_path, caplog):
    port = free_port()                               # nothing listens there
    url = f"redis://:hunter2@127.0.0.1:{port}"
    caplog.set_level(logging.DEBUG)
    with TieredStore.open(StoreConfig(root=tmp_path / "s", host_bytes=4 * BB, nvme_bytes=8 * BB,
                                      io_engine="threads", pin_host="off", block_bytes=BB, remote_url=url)) as st:
        ks, data = blocks(6000, 3)
        st.put_many(ks[:2], data[:2])
        assert st.put(ks[2], data[2], tier="remote") is False     # published nowhere, no error
        got = outs(3)
        assert st.get_many(ks, got) == [True, True, False]       # local tiers unaffected
        assert st.lookup(ks) == 2
        s = st.stats()
        assert s.remote["state"] in ("connecting", "down") and s.remote["skipped_while_down"] >= 1
        text = caplog.text + repr(s) + repr(st.config)
        assert "hunter2" not in text


def test_plain_store_refuses_the_remote_tier(tmp_path):
    with TieredStore.open(StoreConfig(root=tmp_path / "s", host_bytes=4 * BB, nvme_bytes=4 * BB,
                                      block_bytes=BB, io_engine="threads", pin_host="off")) as st:
        with pytest.raises(ValueError, match="remote_url"):
            st.put(key(1), random_block(1, BB), tier="remote")
        assert st.stats().remote is None


# ---------------------------------------------------------------- TieredStore integration
def test_store_falls_through_to_remote_and_lands_in_host(tmp_path, url):
    cfg = dict(host_bytes=8 * BB, nvme_bytes=8 * BB, io_engine="threads", pin_host="off", block_bytes=BB, remote_url=url)
    with TieredStore.open(StoreConfig(root=tmp_path / "a", **cfg)) as a, \
            TieredStore.open(StoreConfig(root=tmp_path / "b", **cfg)) as b:
        assert a.remote.wait_ready(15) and b.remote.wait_ready(15)
        ks, data = blocks(7000 + 100 * ("cluster" in url) + 200 * url.startswith("mooncake"), 6)
        assert a.put_many(ks[:3], data[:3], tier="remote") == 3
        a.put_many(ks[3:5], data[3:5], tier=Tier.NVME)    # published with their records' xxh3
        a.put_many(ks[5:], data[5:])                       # host only: hashed when published
        assert a.where(ks[3]) == {Tier.NVME} and a.where(ks[5]) == {Tier.HOST}
        assert a.publish(ks[3:]) == 3
        assert b.lookup(ks) == 6
        got = outs(1)
        assert b.get(ks[0], got[0]) and bytes(got[0]) == data[0].tobytes()
        assert b.where(ks[0]) == {Tier.HOST}              # the remote hit landed in a host frame
        job = b.prepare_load(ks)
        try:
            assert [s.tier for s in job.slots] == [Tier.HOST] + [Tier.REMOTE] * 5
            assert all(bytes(s.buffer) == d.tobytes() for s, d in zip(job.slots, data))
        finally:
            b.complete_load(job.handle)
        b.check_integrity()
        assert b.stats().hits_remote == 6


def test_get_many_served_names_remote_hits(tmp_path, redis_server):
    cfg = dict(host_bytes=8 * BB, nvme_bytes=8 * BB, io_engine="threads", pin_host="off", block_bytes=BB,
               remote_url=redis_server.url)
    with TieredStore.open(StoreConfig(root=tmp_path / "b", **cfg)) as b:
        assert b.remote.wait_ready(15)
        ks, data = blocks(7600, 4)
        b.put_many(ks[:1], data[:1], tier=Tier.HOST)
        b.put_many(ks[1:2], data[1:2], tier=Tier.NVME)
        assert b.put_many(ks[2:3], data[2:3], tier="remote") == 1    # on the remote only
        got = outs(4)
        assert b.get_many_served(ks, got) == [Tier.HOST, Tier.NVME, Tier.REMOTE, None]
        assert all(bytes(got[i]) == data[i].tobytes() for i in range(3))
        assert b.get_many_served(ks[2:3], outs(1)) == [Tier.HOST]     # the remote hit landed in a host frame
        assert b.get_many(ks, outs(4)) == [True, True, True, False]
        assert b.stats().hits_remote == 1
        b.check_integrity()


CHILD = textwrap.dedent("""
    import sys, numpy as np
    sys.path.insert(0, sys.argv[3])
    from kvtier.store import StoreConfig, TieredStore
    from kvtier_testutil import key, random_block
    BB = 64 << 10
    with TieredStore.open(StoreConfig(root=sys.argv[1], host_bytes=16 * BB, nvme_bytes=16 * BB,
                                      io_engine="threads", pin_host="off", block_bytes=BB, remote_url=sys.argv[2])) as st:
        assert st.remote.wait_ready(15)
        ks = [key(i) for i in range(8000, 8010)]
        st.put_many(ks, [random_block(i, BB) for i in range(8000, 8010)])
        print(st.publish(ks))
""")


def test_two_processes_share_blocks_bit_exact(tmp_path, url):
    """Node A (a child process, its own root) publishes; node B reads them."""
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    r = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "a"), url, tests_dir],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == "10"
    with TieredStore.open(StoreConfig(root=tmp_path / "b", host_bytes=16 * BB, nvme_bytes=16 * BB,
                                      io_engine="threads", pin_host="off", block_bytes=BB, remote_url=url)) as b:
        assert b.remote.wait_ready(15)
        ks = [key(i) for i in range(8000, 8010)]
        got = outs(10)
        assert b.get_many(ks, got) == [True] * 10
        assert all(bytes(g) == random_block(i, BB).tobytes() for g, i in zip(got, range(8000, 8010)))


# ---------------------------------------------------------------- benchmark section
def test_bench_remote_section_beside_the_raw_client(url):
    """``kvtier bench tiers --remote``'s section on every server: both sides
    move every byte (the section raises on a refused put, a missed or wrong
    read), one row per size, 512 KiB taking Mooncake's zero-copy path."""
    from kvtier.bench.cmd_tiers import _Aligned
    from kvtier.bench.remote_bench import remote_section
    sizes, total = [64 << 10, 512 << 10], 2 << 20
    src, dst = _Aligned(total, fill_seed=5), _Aligned(total)
    sec = remote_section(url, sizes, total, 2, src, dst)
    assert sec["backend"] == parse_remote_url(url).kind
    assert [r["block_bytes"] for r in sec["rows"]] == sizes
    for r in sec["rows"]:
        assert r["bytes"] == total and r["blocks"] == total // r["block_bytes"]
        for col in ("put_gbps", "get_gbps", "raw_put_gbps", "raw_get_gbps",
                    "put_vs_raw_paired_median", "get_vs_raw_paired_median"):
            assert r[col] > 0, (col, r)
        if sec["backend"] == "mooncake":           # the value-format baseline: the same calls, kvtier's layout
            for col in ("fmt_put_gbps", "fmt_get_gbps", "put_format_vs_raw_paired_median",
                        "get_vs_format_paired_median", "put_cpu_ms", "raw_get_cpu_ms",
                        "polite_put_gbps", "polite_get_gbps", "put_vs_polite_paired_median",
                        "get_vs_polite_paired_median"):   # and the raw calls waited for as the tier waits
                assert r[col] > 0, (col, r)
    assert bytes(dst.mv) == bytes(src.mv)          # the last read (kvtier's or raw's) is bit-exact
    assert sec["put_vs_raw"] > 0 and sec["get_vs_raw"] > 0
