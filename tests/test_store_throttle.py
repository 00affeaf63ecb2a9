"""A slower NVMe device, emulated (store/throttle.py): the real I/O still happens
and its bytes come back right; each batch reserves the device for its bytes
over the rate, after every earlier batch's reservation."""
from __future__ import annotations

import hashlib

import numpy as np
import pytest

from kvtier.store import StoreConfig, Tier, TieredStore
from kvtier.store.io import IoOp, make_engine
from kvtier.store.throttle import ThrottledEngine, store_engine

BLOCK = 64 << 10


def key(i: int) -> bytes:
    return hashlib.blake2b(i.to_bytes(8, "little"), digest_size=16).digest()


def cfg(tmp_path, **kw) -> StoreConfig:
    return StoreConfig(root=tmp_path / "store", host_bytes=0, nvme_bytes=64 * BLOCK, block_bytes=BLOCK,
                       slab_bytes=16 * BLOCK, queue_depth=4, durable=False, **kw)


def test_a_throttled_store_reads_back_what_it_wrote_and_says_it_is_throttled(tmp_path):
    c = cfg(tmp_path, nvme_throttle_gbps=0.05)
    data = [np.random.default_rng(i).integers(0, 256, BLOCK, dtype=np.uint8) for i in range(8)]
    with TieredStore.open(c) as st:
        st.put_many([key(i) for i in range(8)], data, tier=Tier.NVME)
        out = [np.empty(BLOCK, np.uint8) for _ in range(8)]
        assert st.get_many([key(i) for i in range(8)], out) == [True] * 8
        assert all((a == b).all() for a, b in zip(out, data))
        assert "throttled to 0.05 GB/s" in st.stats().io_engine


def test_batches_queue_behind_each_other_at_the_rate(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"\0" * (4 * BLOCK))
    import os
    fd = os.open(path, os.O_RDWR)
    eng = ThrottledEngine(make_engine("threads", 2), 1e6)          # 1 MB/s: a 64 KiB batch reserves 65.5 ms
    try:
        bufs = [memoryview(bytearray(BLOCK)) for _ in range(2)]
        src = memoryview(bytearray(b"\x07" * BLOCK))
        w = eng.start([IoOp(fd=fd, write=True, offset=0, bufs=(src,))])
        r1 = eng.start([IoOp(fd=fd, write=False, offset=BLOCK, bufs=(bufs[0],))])
        r2 = eng.start([IoOp(fd=fd, write=False, offset=2 * BLOCK, bufs=(bufs[1],))])
        # each reservation starts where the one before ends: one device, not three
        assert r1._ends_at == pytest.approx(w._ends_at + BLOCK / 1e6)
        assert r2._ends_at == pytest.approx(r1._ends_at + BLOCK / 1e6)
        for b in (w, r1, r2):
            b.wait()
        assert os.pread(fd, BLOCK, 0) == bytes(src)                 # the real write happened
    finally:
        os.close(fd)
        eng.close()


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), float("nan"), True, "1"])
def test_bad_rates_are_refused(tmp_path, bad):
    with pytest.raises(ValueError, match="nvme_throttle_gbps"):
        cfg(tmp_path, nvme_throttle_gbps=bad)


def test_the_setting_layers_and_off_means_the_plain_engine(tmp_path, monkeypatch):
    assert not isinstance(store_engine(cfg(tmp_path)), ThrottledEngine)
    monkeypatch.setenv("KVTIER_NVME_THROTTLE_GBPS", "0.5")
    c = StoreConfig.from_env(tmp_path / "s", block_bytes=BLOCK)
    assert c.nvme_throttle_gbps == 0.5
    e = store_engine(c)
    try:
        assert isinstance(e, ThrottledEngine) and e.bytes_per_s == 0.5e9
    finally:
        e.close()
