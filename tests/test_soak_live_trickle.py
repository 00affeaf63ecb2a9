"""The live soak's trickling remote: kvtier's real Redis tier talks to a real redis-server
(127.0.0.1, its own port, stopped by PID) through the soak's TrickleProxy.

The story: values are put and got normally through the proxy; while it trickles, a get is a
miss (cut at the tier's deadline, the breaker trips) and the proxy shows it trickled bytes; once
it forwards at full speed again, the same value is served.  The proxy finds a redis-server
SIGKILLed and restarted on the same port, closes a client whose server went away, refuses
connections past its bound and leaves no thread behind.
"""
from __future__ import annotations

import random
import socket
import threading
import types

import numpy as np
import pytest

from kvtier.bench.soak_live.faults import FaultError
from kvtier.bench.soak_live.faults_remote import RemoteTrickle
from kvtier.bench.soak_live.trickle import TrickleProxy
from kvtier.store import StoreConfig, TieredStore
from kvtier.store.remote import RemoteTier
from kvtier_testutil import key, random_block
from remote_servers import HOST, RedisServer, redis_binary

pytestmark = [pytest.mark.faults,
              pytest.mark.skipif(redis_binary() is None, reason="redis-server is not installed")]

BB = 64 << 10
DEADLINE_S = 1.0
SECRET = b"a test secret of 32 bytes length"


@pytest.fixture
def redis(tmp_path):
    srv = RedisServer(tmp_path / "redis").start()
    yield srv
    srv.stop()


@pytest.fixture
def proxy(redis):
    p = TrickleProxy(redis.port).start()
    yield p
    p.close()


@pytest.fixture
def tier(proxy):
    t = RemoteTier.from_url(f"redis://{HOST}:{proxy.port}?deadline={DEADLINE_S}", BB, secret=SECRET)
    assert t.wait_ready(15), t.stats()
    yield t
    t.close()


def fetch(tier: RemoteTier, i: int) -> tuple[list[bool], np.ndarray]:
    out = np.full(BB, 0x5A, np.uint8)
    return tier.fetch([key(i)], [memoryview(out)]), out


def raw(port: int) -> socket.socket:
    return socket.create_connection((HOST, port), timeout=10)


def closed_by_peer(s: socket.socket) -> bool:
    """True once the other end has closed (EOF or reset), waiting up to the socket's timeout."""
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True


def test_values_pass_normally_then_trickle_to_a_miss_then_pass_again(tier, proxy):
    # through the proxy at full speed: a put and a verified get
    assert tier.publish([key(7)], [memoryview(random_block(7, BB))]) == 1
    got, out = fetch(tier, 7)
    assert got == [True] and (out == random_block(7, BB)).all()
    assert proxy.stats().trickled_down == 0

    # trickling: the same get is cut at the tier's deadline, a miss with nothing left in the buffer
    proxy.trickle(True)
    got, out = fetch(tier, 7)
    st, ps = tier.stats(), proxy.stats()
    print(f"under trickle: {st}\nproxy: {ps}")
    assert got == [False] and not out.any()
    assert st.trips >= 1 and st.hits == 1
    assert ps.trickling and ps.trickled_down > 0

    # full speed again: the value (never deleted by the cut call) is served once the breaker is up
    proxy.trickle(False)
    assert tier.wait_ready(15), tier.stats()
    got, out = fetch(tier, 7)
    assert got == [True] and (out == random_block(7, BB)).all()
    assert proxy.stats().failed is None


def test_a_put_trickled_upstream_is_not_accepted(tier, proxy):
    # both ways: the 64 KiB SET reaches the server far too slowly; the tier cuts it, stores nothing
    proxy.trickle(True, upstream=True)
    assert tier.wait_ready(15), tier.stats()        # the probe's PING still passes
    assert tier.publish([key(8)], [memoryview(random_block(8, BB))]) == 0
    assert proxy.stats().trickled_up > 0
    proxy.trickle(False)
    assert tier.wait_ready(15), tier.stats()
    assert fetch(tier, 8)[0] == [False]             # the cut SET left no value behind
    assert tier.publish([key(8)], [memoryview(random_block(8, BB))]) == 1
    assert fetch(tier, 8)[0] == [True]


def test_the_engine_facing_get_through_the_store_is_a_miss_under_trickle(tmp_path, tier, proxy):
    # TieredStore.get_many of a block only the remote holds (the same key, so the same name)
    assert tier.publish([key(9)], [memoryview(random_block(9, BB))]) == 1
    cfg = StoreConfig(root=tmp_path / "s", host_bytes=8 * BB, nvme_bytes=8 * BB, block_bytes=BB,
                      io_engine="threads", pin_host="off",
                      remote_url=f"redis://{HOST}:{proxy.port}?deadline={DEADLINE_S}",
                      remote_key=SECRET.decode())
    with TieredStore.open(cfg) as st:
        assert st.remote.wait_ready(15)
        proxy.trickle(True)
        out = np.full(BB, 0x5A, np.uint8)
        assert st.get_many([key(9)], [out]) == [False]
        assert not out.any()
        st.check_integrity()
        proxy.trickle(False)
        assert st.remote.wait_ready(15)
        assert st.get_many([key(9)], [out]) == [True]
        assert (out == random_block(9, BB)).all()


def test_the_proxy_survives_a_redis_kill_and_restart_on_the_same_port(tmp_path, redis, proxy, tier):
    assert tier.publish([key(1)], [memoryview(random_block(1, BB))]) == 1
    held = raw(proxy.port)
    held.sendall(b"PING\r\n")
    assert held.recv(64) == b"+PONG\r\n"

    # SIGKILL: the open connection's client side is closed; a new one is closed at once
    redis.kill()
    assert closed_by_peer(held)
    fresh = raw(proxy.port)
    assert closed_by_peer(fresh)
    held.close()
    fresh.close()
    assert proxy.stats().upstream_failures >= 2

    # restarted empty on the same port: the tier finds it through the same proxy
    again = RedisServer(tmp_path / "redis2", port=redis.port).start()
    try:
        fetch(tier, 1)                              # may be the call that notices the old server died
        assert tier.wait_ready(15), tier.stats()
        assert fetch(tier, 1)[0] == [False]         # the restarted server is empty
        assert tier.publish([key(1)], [memoryview(random_block(1, BB))]) == 1
        assert fetch(tier, 1)[0] == [True]
    finally:
        again.stop()


def test_connections_past_the_bound_are_refused_and_buffers_stay_bounded(redis):
    big = 1 << 20
    p = TrickleProxy(redis.port, max_connections=2, buffer_bytes=64 << 10).start()
    try:
        a, b = raw(p.port), raw(p.port)
        c = raw(p.port)
        assert closed_by_peer(c)                    # the third is closed at once
        # a 1 MiB value read through a trickle: at most buffer_bytes wait in the proxy
        a.sendall(b"*3\r\n$3\r\nSET\r\n$3\r\nbig\r\n$%d\r\n%s\r\n" % (big, b"v" * big))
        assert a.recv(64) == b"+OK\r\n"
        p.trickle(True)
        a.sendall(b"GET big\r\n")
        got = b""
        while len(got) < 3 * p.chunk:
            got += a.recv(4096)
        st = p.stats()
        assert st.refused == 1 and st.open == 2
        assert 0 < st.buffered_max <= 64 << 10
        assert got.startswith(b"$%d\r\nvvv" % big)
        for s in (a, b, c):
            s.close()
    finally:
        p.close()


def test_close_leaves_no_thread_and_no_listener(redis):
    p = TrickleProxy(redis.port).start()
    name = f"kvtier-trickle-{p.port}"
    s = raw(p.port)
    s.sendall(b"PING\r\n")
    assert s.recv(64) == b"+PONG\r\n"
    assert any(t.name == name for t in threading.enumerate())
    p.close()
    p.close()                                       # idempotent
    assert not any(t.name == name for t in threading.enumerate())
    assert closed_by_peer(s)                        # its open pair was closed
    s.close()
    with pytest.raises(ConnectionRefusedError):
        raw(p.port)


def test_the_remote_trickle_fault_switches_the_rigs_proxy(redis):
    p = TrickleProxy(redis.port).start()
    try:
        fault = RemoteTrickle()
        rig = types.SimpleNamespace(redis_proxy=p)
        said = fault.inject(rig, random.Random(3))
        assert p.trickling and "trickling" in said
        said = fault.recover(rig, random.Random(3))
        assert not p.trickling and "full speed" in said
    finally:
        p.close()
    with pytest.raises(FaultError):
        fault.inject(types.SimpleNamespace(), random.Random(0))
