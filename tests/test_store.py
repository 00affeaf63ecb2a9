"""TieredStore scenarios against real files, real LMDB and real io_uring.

Each test reads as a story; every one ends with check_integrity().
"""
import asyncio
import hashlib
import threading

import numpy as np
import pytest

from kvtier.store import (BadBuffer, BadHandle, BadKey, ConfigMismatch, RootLocked, StoreClosed,
                   StoreConfig, StoreError, StoreFull, Tier, TieredStore)

BLOCK = 16 << 10  # 16 KiB blocks keep the tests small and fast


def key(i: int) -> bytes:
    return hashlib.blake2b(i.to_bytes(8, "little"), digest_size=16).digest()


def block(i: int, n: int = BLOCK) -> np.ndarray:
    """Deterministic, distinct bytes for block i."""
    return np.random.default_rng(i).integers(0, 256, n, dtype=np.uint8)


def cfg(tmp_path, **kw) -> StoreConfig:
    base = dict(root=tmp_path / "store", host_bytes=8 * BLOCK, nvme_bytes=64 * BLOCK,
                block_bytes=BLOCK, slab_bytes=16 * BLOCK, queue_depth=4, io_bytes=64 << 10)
    base.update(kw)
    return StoreConfig(**base)


def read(st, i) -> np.ndarray | None:
    out = np.empty(st.config.block_bytes, np.uint8)
    return out if st.get(key(i), out) else None


def _uring_reason():
    from kvtier.store.io import io_uring_unavailable_reason
    return io_uring_unavailable_reason()


@pytest.mark.parametrize("engine", ["io_uring", "threads"])
def test_put_get_both_tiers_and_reopen(tmp_path, engine):
    if engine == "io_uring" and (why := _uring_reason()) is not None:
        pytest.skip(f"io_uring unusable here: {why}")
    c = cfg(tmp_path, io_engine=engine)
    with TieredStore.open(c) as st:
        # store 12 blocks into an 8-frame host tier -> the oldest are demoted to NVMe
        for i in range(12):
            assert st.put(key(i), block(i)) is True
        assert st.stats().io_engine == engine
        assert st.stats().demotions >= 4
        assert Tier.NVME in st.where(key(0)) and Tier.HOST in st.where(key(11))
        # every block reads back exactly, from whichever tier holds it
        for i in range(12):
            np.testing.assert_array_equal(read(st, i), block(i))
        # storing a key again is a no-op (content-addressed)
        assert st.put(key(3), block(3)) is False
        on_nvme = {i for i in range(12) if Tier.NVME in st.where(key(i))}
        st.check_integrity()
    # reopen: host DRAM was volatile, every NVMe block is back with the right bytes
    with TieredStore.open(c) as st:
        assert {i for i in range(12) if st.contains(key(i))} == on_nvme
        for i in on_nvme:
            np.testing.assert_array_equal(read(st, i), block(i))
        st.check_integrity()


def test_host_bytes_zero_sends_every_put_to_nvme(tmp_path):
    c = cfg(tmp_path, host_bytes=0)
    with TieredStore.open(c) as st:
        # a batch gets contiguous slots and goes straight to NVMe
        assert st.put_many([key(i) for i in range(10)], [block(i) for i in range(10)]) == 10
        assert all(st.where(key(i)) == {Tier.NVME} for i in range(10))
        s = st.stats()
        assert s.host_frames_total == 0 and s.nvme_blocks == 10
        outs = [np.empty(BLOCK, np.uint8) for _ in range(10)]
        assert st.get_many([key(i) for i in range(10)], outs) == [True] * 10
        for i, o in enumerate(outs):
            np.testing.assert_array_equal(o, block(i))
        st.check_integrity()
    with TieredStore.open(c) as st:
        assert st.lookup([key(i) for i in range(10)]) == 10
        st.check_integrity()


def test_unaligned_sources_and_odd_block_size_use_bounce_buffers(tmp_path):
    odd = 10_000  # not a multiple of 4096: slots are padded, I/O bounces
    c = cfg(tmp_path, host_bytes=0, block_bytes=odd)
    raw = bytearray(odd + 1)
    with TieredStore.open(c) as st:
        src = memoryview(raw)[1:]           # deliberately misaligned source
        src[:] = block(7, odd).tobytes()
        assert st.put(key(7), src)
        out = bytearray(odd + 3)
        assert st.get(key(7), memoryview(out)[3:])   # misaligned destination
        assert bytes(out[3:]) == block(7, odd).tobytes()
        st.check_integrity()


def test_lookup_is_longest_stored_prefix(tmp_path):
    with TieredStore.open(cfg(tmp_path)) as st:
        keys = [key(i) for i in range(6)]
        st.put_many(keys[:4], [block(i) for i in range(4)])
        st.put(keys[5], block(5))            # a gap at 4
        assert st.lookup(keys) == 4
        assert st.lookup(keys[4:]) == 0
        assert st.lookup([]) == 0
        st.check_integrity()


def test_eviction_demotes_then_drops_lru_when_nvme_full(tmp_path):
    # host 4 frames, NVMe 4 slots: 10 puts must drop the oldest blocks
    c = cfg(tmp_path, host_bytes=4 * BLOCK, nvme_bytes=4 * BLOCK, slab_bytes=4 * BLOCK)
    with TieredStore.open(c) as st:
        for i in range(10):
            st.put(key(i), block(i))
        present = [i for i in range(10) if st.contains(key(i))]
        # the newest survive, the oldest were dropped, and nothing exceeds capacity
        assert 9 in present and 0 not in present
        assert len(present) <= 8
        s = st.stats()
        assert s.evictions_dropped >= 2 and s.nvme_slots_used <= 4
        for i in present:
            np.testing.assert_array_equal(read(st, i), block(i))
        st.check_integrity()


def test_host_mask_and_host_frames_agree_with_where_and_stats(tmp_path):
    # 4 host frames: 7 puts push the 3 oldest down, then the newest is dropped
    c = cfg(tmp_path, host_bytes=4 * BLOCK)
    with TieredStore.open(c) as st:
        for i in range(6):
            st.put(key(i), block(i))
        st.put(key(6), block(6))
        st.drop([key(6)])
        keys = [key(i) for i in range(8)]          # 6 dropped, 7 never stored
        mask = st.host_mask(keys)
        assert mask == [Tier.HOST in st.where(k) for k in keys]
        assert mask == [False] * 3 + [True] * 3 + [False] * 2
        f, s = st.host_frames(), st.stats()
        assert (f.total, f.used, f.demotions) == (s.host_frames_total, s.host_frames_used, s.demotions)
        assert f.total == 4 and f.used == 3 and f.demotions == 3
        assert st.host_mask([]) == []
        with pytest.raises(BadKey):
            st.host_mask([b""])
    with pytest.raises(StoreClosed):
        st.host_frames()


def test_two_phase_store_invisible_until_complete(tmp_path):
    with TieredStore.open(cfg(tmp_path)) as st:
        st.put(key(0), block(0))
        # prepare: key 0 is already stored -> skipped; 1 and 2 get buffers
        ps = st.prepare_store([key(0), key(1), key(2)])
        assert ps.skipped == (key(0),) and [s.key for s in ps.slots] == [key(1), key(2)]
        assert not st.contains(key(1)) and st.lookup([key(0), key(1)]) == 1
        # the "engine" fills the buffers (a DMA in real life)
        for s, i in zip(ps.slots, (1, 2)):
            s.buffer[:] = block(i).tobytes()
        assert st.complete_store(ps.handle, success=True) == 2
        np.testing.assert_array_equal(read(st, 2), block(2))
        # a failed transfer releases its space and stores nothing
        used = st.stats().host_frames_used
        ps = st.prepare_store([key(3)])
        assert st.complete_store(ps.handle, success=False) == 0
        assert not st.contains(key(3)) and st.stats().host_frames_used == used
        # completing twice or a made-up handle is an error, store intact
        with pytest.raises(BadHandle):
            st.complete_store(ps.handle)
        with pytest.raises(BadHandle):
            st.complete_load(12345)
        st.check_integrity()


def test_two_phase_store_to_nvme_is_durable_on_complete(tmp_path):
    c = cfg(tmp_path)
    with TieredStore.open(c) as st:
        ps = st.prepare_store([key(i) for i in range(5)], tier="nvme")
        for j, s in enumerate(ps.slots):
            s.buffer[:] = block(j).tobytes()
        assert st.complete_store(ps.handle) == 5
        assert st.where(key(4)) == {Tier.NVME}
        st.check_integrity()
    with TieredStore.open(c) as st:
        np.testing.assert_array_equal(read(st, 4), block(4))


def test_prepare_load_pins_blocks_against_eviction(tmp_path):
    c = cfg(tmp_path, host_bytes=4 * BLOCK)
    with TieredStore.open(c) as st:
        keys = [key(i) for i in range(4)]
        st.put_many(keys, [block(i) for i in range(4)])
        st.demote(keys[:2])                          # 0,1 -> NVMe only
        assert st.where(keys[0]) == {Tier.NVME}
        # load all four: two from host frames, two staged from NVMe and verified
        pl = st.prepare_load(keys + [key(99)])
        assert pl.hits == 4
        assert [s.tier for s in pl.slots] == [Tier.NVME, Tier.NVME, Tier.HOST, Tier.HOST]
        for s, i in zip(pl.slots, range(4)):
            assert bytes(s.buffer) == block(i).tobytes()
            assert s.buffer.readonly
        # while pinned, the host blocks cannot be evicted: a flood of puts cannot take them
        with pytest.raises(StoreFull):
            st.put_many([key(i) for i in range(10, 13)], [block(i) for i in range(10, 13)])
        assert Tier.HOST in st.where(keys[2]) and Tier.HOST in st.where(keys[3])
        st.check_integrity()
        st.complete_load(pl.handle)
        # unpinned: now they can be evicted to make room
        st.put_many([key(i) for i in range(10, 13)], [block(i) for i in range(10, 13)])
        st.check_integrity()


def test_explicit_pins_nest_and_unpin_of_unpinned_raises(tmp_path):
    with TieredStore.open(cfg(tmp_path, host_bytes=2 * BLOCK, nvme_bytes=0)) as st:
        st.put(key(0), block(0))
        assert st.pin([key(0)]) == 1 and st.pin([key(0)]) == 1
        st.unpin([key(0)])
        # still pinned once: filling the 2-frame host tier evicts 1, never 0
        st.put(key(1), block(1))
        st.put(key(2), block(2))
        assert st.contains(key(0)) and not st.contains(key(1))
        # pin 2 as well: now nothing is evictable
        st.pin([key(2)])
        with pytest.raises(StoreFull):
            st.put(key(3), block(3))
        st.unpin([key(0)])
        with pytest.raises(StoreError):
            st.unpin([key(0)])
        st.put(key(3), block(3))        # evicts 0 (no NVMe tier: dropped)
        assert not st.contains(key(0)) and st.contains(key(2))
        st.check_integrity()


def test_drop_while_reader_holds_pin_frees_at_last_unpin(tmp_path):
    with TieredStore.open(cfg(tmp_path, host_bytes=0)) as st:
        st.put(key(0), block(0))
        pl = st.prepare_load([key(0)])
        assert st.drop([key(0)]) == 1
        assert not st.contains(key(0))
        st.check_integrity()                     # the pinned slot is still owned
        assert bytes(pl.slots[0].buffer) == block(0).tobytes()
        st.complete_load(pl.handle)
        assert st.stats().nvme_slots_used == 0
        st.check_integrity()


def test_bad_input_raises_clear_errors_and_store_stays_intact(tmp_path):
    with TieredStore.open(cfg(tmp_path)) as st:
        st.put(key(0), block(0))
        with pytest.raises(BadBuffer, match="block_bytes"):
            st.put(key(1), np.zeros(BLOCK - 1, np.uint8))          # wrong size
        with pytest.raises(BadBuffer, match="buffer protocol"):
            st.put(key(1), [0] * BLOCK)                              # foreign object
        with pytest.raises(BadBuffer, match="contiguous"):
            st.put(key(1), np.zeros((BLOCK, 2), np.uint8)[:, 0])     # strided view
        with pytest.raises(BadBuffer, match="read-only"):
            st.get(key(0), bytes(BLOCK))                             # read-only out
        with pytest.raises(BadKey):
            st.put("not-bytes", block(1))
        with pytest.raises(BadKey):
            st.put(b"", block(1))
        with pytest.raises(BadKey):
            st.contains(b"x" * 65)
        with pytest.raises(ValueError, match="unknown tier"):
            st.put(key(1), block(1), tier="tape")
        assert st.get(key(12345), np.empty(BLOCK, np.uint8)) is False   # unknown key: a miss
        # none of that changed what is stored
        np.testing.assert_array_equal(read(st, 0), block(0))
        assert not st.contains(key(1))
        st.check_integrity()


def test_use_after_close_raises_store_closed(tmp_path):
    st = TieredStore.open(cfg(tmp_path))
    st.put(key(0), block(0))
    st.close()
    st.close()  # idempotent
    for call in (lambda: st.put(key(1), block(1)), lambda: st.get(key(0), np.empty(BLOCK, np.uint8)),
                 lambda: st.lookup([key(0)]), lambda: st.contains(key(0)), st.stats,
                 lambda: st.prepare_load([key(0)])):
        with pytest.raises(StoreClosed):
            call()


def test_root_is_locked_and_layout_is_pinned(tmp_path):
    c = cfg(tmp_path)
    with TieredStore.open(c):
        with pytest.raises(RootLocked):
            TieredStore.open(c)
    with pytest.raises(ConfigMismatch, match="block_bytes"):
        TieredStore.open(c.with_(block_bytes=2 * BLOCK))
    with TieredStore.open(c) as st:   # the failed opens left nothing locked
        st.check_integrity()


def test_bad_config_is_a_value_error(tmp_path):
    for kw in (dict(block_bytes=0), dict(io_engine="carrier-pigeon"), dict(queue_depth=0),
               dict(host_bytes=-1), dict(direct_io="maybe")):
        with pytest.raises(ValueError):
            cfg(tmp_path, **kw)


def test_lmdb_map_full_grows_and_keeps_everything(tmp_path):
    c = cfg(tmp_path, host_bytes=0, block_bytes=4096, nvme_bytes=3000 * 8192,   # 3000 slots of header + block
            slab_bytes=1024 * 4096, index_map_bytes=64 << 10, durable=False)
    with TieredStore.open(c) as st:
        small = np.zeros(4096, np.uint8)
        ks = [key(i) for i in range(2500)]
        for lo in range(0, len(ks), 500):
            st.put_many(ks[lo:lo + 500], [small] * 500)
        s = st.stats()
        assert s.index_grows >= 1 and s.index_map_bytes > (64 << 10)
        assert st.lookup(ks) == len(ks)
        st.check_integrity()
    with TieredStore.open(c) as st:
        assert st.lookup(ks) == len(ks)


def test_threads_putting_and_getting_overlapping_keys_read_exact_bytes(tmp_path):
    c = cfg(tmp_path, host_bytes=6 * BLOCK, nvme_bytes=24 * BLOCK)
    errors = []
    with TieredStore.open(c) as st:
        def worker(seed):
            rng = np.random.default_rng(seed)
            out = np.empty(BLOCK, np.uint8)
            try:
                for _ in range(60):
                    i = int(rng.integers(0, 20))        # 20 keys shared by 4 threads
                    if rng.random() < 0.5:
                        st.put(key(i), block(i))
                    elif st.get(key(i), out) and not np.array_equal(out, block(i)):
                        errors.append(f"key {i}: wrong bytes")
            except Exception as exc:  # StoreFull under pin contention is legitimate
                if not isinstance(exc, StoreFull):
                    errors.append(repr(exc))
        ts = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert errors == []
        for i in range(20):
            got = read(st, i)
            assert got is None or np.array_equal(got, block(i))
        st.check_integrity()


def test_async_variants(tmp_path):
    async def story(st):
        assert await st.aput(key(0), block(0))
        out = np.empty(BLOCK, np.uint8)
        assert await st.aget(key(0), out)
        assert await st.alookup([key(0), key(1)]) == 1
        ps = await st.aprepare_store([key(1)], tier="nvme")
        ps.slots[0].buffer[:] = block(1).tobytes()
        assert await st.acomplete_store(ps.handle) == 1
        return out

    with TieredStore.open(cfg(tmp_path)) as st:
        out = asyncio.run(story(st))
        np.testing.assert_array_equal(out, block(0))
        np.testing.assert_array_equal(read(st, 1), block(1))
        st.check_integrity()


def test_buffered_io_when_direct_io_off(tmp_path):
    c = cfg(tmp_path, host_bytes=0, direct_io="off")
    with TieredStore.open(c) as st:
        st.put(key(0), block(0))
        assert st.stats().direct_io is False
        np.testing.assert_array_equal(read(st, 0), block(0))
        st.check_integrity()


def test_torch_cpu_tensor_via_numpy(tmp_path):
    torch = pytest.importorskip("torch")
    with TieredStore.open(cfg(tmp_path)) as st:
        t = torch.arange(BLOCK // 4, dtype=torch.float32)
        assert st.put(key(0), t.numpy())
        back = torch.empty_like(t)
        assert st.get(key(0), back.numpy())
        assert torch.equal(back, t)
        st.check_integrity()


def test_auto_engine_survives_a_liburing_that_cannot_run_here(tmp_path):
    # regression: the PyPI liburing wheel died of SIGILL (AVX-512 code on an AVX2 CPU)
    # inside the process that opened the store; the probe runs in a child first
    from kvtier.store.io import ThreadEngine, UringEngine, make_engine
    why = _uring_reason()
    eng = make_engine("auto", 4)
    try:
        assert isinstance(eng, ThreadEngine if why is not None else UringEngine)
    finally:
        eng.close()
    with TieredStore.open(cfg(tmp_path)) as st:   # auto engine, in this very process
        assert st.put(key(1), block(1)) is True
        np.testing.assert_array_equal(read(st, 1), block(1))
        assert st.stats().io_engine == ("threads" if why is not None else "io_uring")


def test_a_mixed_batch_copies_dram_while_nvme_reads_are_in_flight(tmp_path, monkeypatch):
    st = TieredStore.open(cfg(tmp_path, io_engine="threads"))
    ks = [key(i) for i in range(6)]
    st.put_many(ks[:3], [block(i) for i in range(3)], tier="nvme")
    st.put_many(ks[3:], [block(i) for i in range(3, 6)], tier="host")
    order = ks[::-1][:2] + ks[:3] + ks[5:]             # host and NVMe blocks interleaved, a repeat
    outs = [np.empty(BLOCK, np.uint8) for _ in order]
    assert st.get_many(order, outs) == [True] * len(order)
    assert all(np.array_equal(o, block(ks.index(k))) for k, o in zip(order, outs))
    # a DRAM copy that fails: the NVMe reads in flight still land, the error goes on, nothing stays pinned
    io = st.parts.io
    real = io.copy_frames

    def broken(*a, **kw):
        raise StoreError("copy failed")
    monkeypatch.setattr(io, "copy_frames", broken)
    with pytest.raises(StoreError, match="copy failed"):
        st.get_many(ks, [np.empty(BLOCK, np.uint8) for _ in ks])
    monkeypatch.setattr(io, "copy_frames", real)
    assert st.demote(ks[3:]) == 3                     # unpinned: the host blocks can move down
    outs = [np.empty(BLOCK, np.uint8) for _ in ks]
    assert st.get_many(ks, outs) == [True] * 6 and all(np.array_equal(o, block(i)) for i, o in enumerate(outs))
    st.check_integrity()
    st.close()
