"""Every remote call has one overall deadline; a value that did not verify never stays in the buffer.

A misbehaving server on loopback (tests/fake_redis.py) serves a real, valid
value -- taken from a real redis-server where the tier published it -- but
trickles it, stalls or closes half-way, or answers garbage.  Each fetch must
return a miss within the deadline (+ a generous 1.5 s), leave the caller's
buffer zeroed, and trip the breaker; never raise.
"""
from __future__ import annotations

import time

import numpy as np
import pytest

from fake_redis import MisbehavingRedis
from kvtier.store import StoreConfig, TieredStore
from kvtier.store.remote import RemoteTier
from kvtier_testutil import key, random_block
from remote_servers import redis_server  # noqa: F401 (fixture)

pytestmark = pytest.mark.faults

BB = 64 << 10
DEADLINE_S = 1.0
SLACK_S = 1.5
SECRET = "a test secret of 32 bytes length"


@pytest.fixture(scope="module")
def real_value(redis_server):
    """A valid sealed value of block 7 (what a kvtier publish wrote), read raw off redis."""
    t = RemoteTier.from_url(redis_server.url, BB, secret=SECRET.encode())
    try:
        assert t.wait_ready(15)
        assert t.publish([key(7)], [memoryview(random_block(7, BB))]) == 1
        raw = redis_server.client().get(t.name(key(7)))
    finally:
        t.close()
    assert raw is not None and len(raw) == t.head_bytes + BB
    return raw


def fetch_from(mode: str, value: bytes, **kw):
    srv = MisbehavingRedis(mode, value, **kw)
    t = RemoteTier.from_url(f"{srv.url}?deadline={DEADLINE_S}", BB, secret=SECRET.encode())
    try:
        assert t.wait_ready(10), t.stats()
        out = np.full(BB, 0x5A, np.uint8)
        t0 = time.monotonic()
        got = t.fetch([key(7)], [memoryview(out)])      # must not raise
        span = time.monotonic() - t0
        return got, out, span, t.stats()
    finally:
        t.close()
        srv.stop()


def test_a_well_behaved_fake_serves_the_value(real_value):
    # the control: the same value, sent at once, is a verified hit
    got, out, _span, _st = fetch_from("ok", real_value)
    assert got == [True]
    assert (out == random_block(7, BB)).all()


@pytest.mark.parametrize("mode", ["trickle", "stall", "close", "garbage", "half_line"])
def test_misbehaving_server_is_cut_at_the_deadline(real_value, mode):
    # trickle: 2 KiB every 0.1 s would take ~3.3 s for the 64 KiB value
    got, out, span, st = fetch_from(mode, real_value)
    print(f"{mode}: miss after {span * 1e3:.0f} ms (deadline {DEADLINE_S:g} s)")
    assert got == [False]
    assert span <= DEADLINE_S + SLACK_S, span
    assert not out.any()                        # no unverified byte stays in the buffer
    assert st.state in ("down", "connecting"), st
    assert st.trips >= 1 and st.hits == 0


def test_engine_get_through_the_store_is_bounded(tmp_path, real_value):
    # the engine-facing path: TieredStore.get_many against a trickling remote
    srv = MisbehavingRedis("trickle", real_value)
    cfg = StoreConfig(root=tmp_path / "s", host_bytes=8 * BB, nvme_bytes=8 * BB, block_bytes=BB,
                      io_engine="threads", pin_host="off", remote_url=f"{srv.url}?deadline={DEADLINE_S}",
                      remote_key=SECRET)
    try:
        with TieredStore.open(cfg) as st:
            assert st.remote.wait_ready(10)
            out = np.full(BB, 0x5A, np.uint8)
            t0 = time.monotonic()
            assert st.get_many([key(7)], [out]) == [False]
            span = time.monotonic() - t0
            assert span <= DEADLINE_S + SLACK_S, span
            assert not out.any()
            st.check_integrity()
    finally:
        srv.stop()


def test_default_deadline_is_within_the_documented_two_seconds():
    from kvtier.store.remote import parse_remote_url
    assert parse_remote_url("redis://127.0.0.1:1").deadline_s <= 2.0
