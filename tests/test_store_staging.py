"""Two-phase staging memory and load promotion, against real files, LMDB and io_uring.

prepare_store to NVMe and prepare_load of NVMe blocks use the store's reusable,
pre-faulted staging pool (bounded; fresh memory when it cannot hold a request),
and a prepare_load of an NVMe block lands in a free host frame when the host
tier has room (the block is then promoted: it stays in the host tier).
Every story ends with check_integrity().
"""

import numpy as np

from kvtier.store import StoreConfig, Tier, TieredStore
from kvtier.store.hostpool import buffer_address
from kvtier_testutil import key, random_block

BLOCK = 16 << 10


def block(i: int) -> np.ndarray:
    return random_block(i, BLOCK)


def cfg(tmp_path, **kw) -> StoreConfig:
    base = dict(root=tmp_path / "store", host_bytes=4 * BLOCK, nvme_bytes=64 * BLOCK, block_bytes=BLOCK,
                slab_bytes=64 * BLOCK, queue_depth=4, io_bytes=64 << 10, staging_bytes=4 * BLOCK)
    base.update(kw)
    return StoreConfig(**base)


def fill(ps, first: int) -> None:
    for j, s in enumerate(ps.slots):
        np.frombuffer(s.buffer, np.uint8)[:] = block(first + j)


def test_prepare_store_to_nvme_reuses_staging_frames_and_falls_back_when_exhausted(tmp_path):
    with TieredStore.open(cfg(tmp_path)) as st:
        # 1. a batch to NVMe is staged in the pool: adjacent, aligned frames
        ps = st.prepare_store([key(i) for i in range(3)], tier="nvme")
        addrs = [buffer_address(s.buffer) for s in ps.slots]
        assert all(a % 4096 == 0 for a in addrs) and addrs == sorted(addrs)
        assert st.stats().staging_frames_used == 3
        fill(ps, 0)
        st.check_integrity()
        # 2. while that handle holds 3 of 4 frames, a 2-block request gets fresh memory
        ps2 = st.prepare_store([key(10), key(11)], tier="nvme")
        assert st.stats().staging_fallbacks == 1
        fill(ps2, 10)
        assert st.complete_store(ps2.handle) == 2
        # 3. completing frees the frames; the next batch reuses the same memory
        assert st.complete_store(ps.handle) == 3
        assert st.stats().staging_frames_used == 0
        ps3 = st.prepare_store([key(20), key(21), key(22)], tier="nvme")
        assert [buffer_address(s.buffer) for s in ps3.slots] == addrs
        fill(ps3, 20)
        assert st.complete_store(ps3.handle) == 3
        # 4. every block reads back exactly, from NVMe
        out = np.empty(BLOCK, np.uint8)
        for i in (0, 1, 2, 10, 11, 20, 21, 22):
            assert st.where(key(i)) == {Tier.NVME}
            assert st.get(key(i), out) and np.array_equal(out, block(i))
        # 5. an abandoned store returns its frames too
        ps4 = st.prepare_store([key(30)], tier="nvme")
        st.complete_store(ps4.handle, success=False)
        assert st.stats().staging_frames_used == 0 and not st.contains(key(30))
        st.check_integrity()


def test_prepare_load_promotes_nvme_blocks_into_free_host_frames(tmp_path):
    with TieredStore.open(cfg(tmp_path)) as st:
        # 1. six blocks straight to NVMe; the host tier (4 frames) holds two others
        st.put_many([key(i) for i in range(6)], [block(i) for i in range(6)], tier="nvme")
        st.put_many([key(100), key(101)], [block(100), block(101)], tier="host")
        # 2. loading the six: the first two land in the two free host frames,
        #    the rest in staging; nothing on the host tier is evicted for it
        pl = st.prepare_load([key(i) for i in range(6)])
        assert pl.hits == 6 and all(s.tier is Tier.NVME for s in pl.slots)
        for j, s in enumerate(pl.slots):
            assert np.array_equal(np.frombuffer(s.buffer, np.uint8), block(j))
        s = st.stats()
        assert s.promotions == 2 and s.host_frames_used == 4 and s.staging_frames_used == 4
        assert st.where(key(100)) == {Tier.HOST} and st.where(key(101)) == {Tier.HOST}
        st.check_integrity()
        st.complete_load(pl.handle)
        # 3. the promoted blocks stay in both tiers; the others are back to NVMe only
        assert st.where(key(0)) == st.where(key(1)) == {Tier.HOST, Tier.NVME}
        assert st.where(key(2)) == {Tier.NVME}
        assert st.stats().staging_frames_used == 0
        # 4. a second load finds the promoted ones in the host tier
        pl = st.prepare_load([key(0), key(1)])
        assert [s.tier for s in pl.slots] == [Tier.HOST, Tier.HOST]
        st.complete_load(pl.handle)
        st.check_integrity()
    # 5. reopen: every NVMe block is still there, host copies were volatile
    with TieredStore.open(cfg(tmp_path)) as st:
        out = np.empty(BLOCK, np.uint8)
        for i in range(6):
            assert st.get(key(i), out) and np.array_equal(out, block(i))
        assert not st.contains(key(100))
        st.check_integrity()


def test_load_of_a_block_another_reader_pins_stays_private_and_is_freed(tmp_path):
    with TieredStore.open(cfg(tmp_path)) as st:
        st.put(key(1), block(1), tier="nvme")
        # 1. another holder pins the block (its pin holds no host frame)
        st.pin([key(1)])
        # 2. the load lands in a host frame but cannot promote it while shared
        pl = st.prepare_load([key(1)])
        assert np.array_equal(np.frombuffer(pl.slots[0].buffer, np.uint8), block(1))
        assert st.stats().promotions == 0 and st.stats().host_frames_used == 1
        assert st.where(key(1)) == {Tier.NVME}
        st.check_integrity()                    # the private frame is accounted for
        # 3. complete_load frees it; the block stays on NVMe, intact
        st.complete_load(pl.handle)
        st.unpin([key(1)])
        assert st.stats().host_frames_used == 0
        out = np.empty(BLOCK, np.uint8)
        assert st.get(key(1), out) and np.array_equal(out, block(1))
        st.check_integrity()


def test_corrupt_block_in_a_load_frees_its_landing_frame(tmp_path):
    with TieredStore.open(cfg(tmp_path)) as st:
        st.put_many([key(i) for i in range(3)], [block(i) for i in range(3)], tier="nvme")
        # 1. flip bytes of the second block in its slab
        path, off = st.locate(key(1))
        with open(path, "r+b") as f:
            f.seek(off + 100)
            f.write(bytes(b ^ 0xFF for b in f.read(8)))
        # 2. the load stops at it: one block promoted, the corrupt one dropped, no frame leaked
        pl = st.prepare_load([key(i) for i in range(3)])
        assert pl.hits == 1 and not st.contains(key(1))
        st.complete_load(pl.handle)
        s = st.stats()
        assert s.promotions == 1 and s.host_frames_used == 1 and s.corrupt_dropped == 1
        st.check_integrity()
