"""Regression tests for store defects a review found, each named after its bug;
plus the contract items that came with the self-describing slots (torch
tensors as buffers, the old on-disk format refused, faults as StoreErrors)."""
import hashlib

import numpy as np
import pytest

from kvtier.store import (IntegrityError, OldLayout, StoreConfig, StoreError, StoreFull, Tier,
                          TieredStore)

BLOCK = 16 << 10


def key(i: int) -> bytes:
    return hashlib.blake2b(i.to_bytes(8, "little"), digest_size=16).digest()


def block(i: int) -> np.ndarray:
    return np.random.default_rng(i).integers(0, 256, BLOCK, dtype=np.uint8)


def cfg(tmp_path, **kw) -> StoreConfig:
    base = dict(root=tmp_path / "store", host_bytes=4 * BLOCK, nvme_bytes=0, block_bytes=BLOCK,
                slab_bytes=16 * BLOCK, queue_depth=4, io_engine="threads")
    base.update(kw)
    return StoreConfig(**base)


def test_put_many_that_cannot_fit_raises_store_full_before_evicting_anything(tmp_path):
    # host tier of 4 frames, no NVMe: an evicted block would be dropped
    with TieredStore.open(cfg(tmp_path)) as st:
        # 1. four blocks fill the host tier; two of them are pinned
        st.put_many([key(i) for i in range(4)], [block(i) for i in range(4)])
        assert st.pin([key(0), key(1)]) == 2
        # 2. three new blocks need three frames; only two blocks are evictable
        with pytest.raises(StoreFull):
            st.put_many([key(10), key(11), key(12)], [block(10), block(11), block(12)])
        # 3. nothing was evicted and nothing of the failed put is visible
        assert [st.contains(key(i)) for i in range(4)] == [True] * 4
        assert not any(st.contains(key(i)) for i in (10, 11, 12))
        assert st.stats().evictions_dropped == 0
        # 4. the same through prepare_store
        with pytest.raises(StoreFull):
            st.prepare_store([key(20), key(21), key(22)])
        assert [st.contains(key(i)) for i in range(4)] == [True] * 4
        st.unpin([key(0), key(1)])
        st.check_integrity()


def test_pin_drop_put_unpin_is_accepted_and_releases_the_dead_frame(tmp_path):
    with TieredStore.open(cfg(tmp_path)) as st:
        st.put(key(1), block(1))
        # 1. pin, then drop: the block disappears now, its frame lives on for the pin
        assert st.pin([key(1)]) == 1
        assert st.drop([key(1)]) == 1 and not st.contains(key(1))
        # 2. the key is stored again (a new block, a new frame)
        assert st.put(key(1), block(1))
        assert st.stats().host_frames_used == 2
        # 3. the old pin is released: accepted, and the dead frame is freed
        st.unpin([key(1)])
        assert st.stats().host_frames_used == 1
        assert st.contains(key(1))
        st.check_integrity()
        # 4. a second unpin has no pin to undo
        with pytest.raises(StoreError, match="not pinned"):
            st.unpin([key(1)])


def test_check_integrity_reports_pins_nothing_holds(tmp_path):
    with TieredStore.open(cfg(tmp_path)) as st:
        st.put(key(1), block(1))
        st.pin([key(1)])
        st.check_integrity()                 # a pin() holds it: fine
        # white-box: a pin taken by nobody (the shape of the old leak)
        table = st.parts.table
        e = table.get(key(1))
        with table.lock:
            table.pin(e)
        with pytest.raises(IntegrityError, match="pins nothing can release"):
            st.check_integrity()
        with table.lock:
            table.unpin(e, e.frame)
        st.unpin([key(1)])
        st.check_integrity()


@pytest.mark.parametrize("pinned", [False, True])
def test_torch_tensors_are_buffers_without_a_copy(tmp_path, pinned):
    torch = pytest.importorskip("torch")
    if pinned and not torch.cuda.is_available():
        pytest.skip("pinned tensors need CUDA")
    c = cfg(tmp_path, nvme_bytes=8 * (BLOCK + 4096))
    src = torch.from_numpy(block(3).copy()).view(torch.float16)     # 8192 halves
    if pinned:
        src = src.pin_memory()
    with TieredStore.open(c) as st:
        assert st.put(key(3), src)
        assert st.put_many([key(4)], [torch.from_numpy(block(4).copy()).view(torch.bfloat16)], tier="nvme") == 1
        out = torch.empty(BLOCK // 2, dtype=torch.bfloat16)
        assert st.get(key(3), out)
        assert torch.equal(out.view(torch.uint8), src.view(torch.uint8))
        outs = [torch.zeros(BLOCK, dtype=torch.uint8)]
        ptr = outs[0].data_ptr()
        assert st.get_many([key(4)], outs) == [True]
        assert outs[0].data_ptr() == ptr and np.array_equal(outs[0].numpy(), block(4))   # written in place
        # a non-contiguous tensor is refused clearly
        with pytest.raises(StoreError, match="contiguous"):
            st.put(key(5), torch.zeros(2 * BLOCK, dtype=torch.uint8)[::2])
        st.check_integrity()


def test_old_format_directory_is_refused_with_one_line(tmp_path):
    root = tmp_path / "store"
    (root / "index").mkdir(parents=True)
    (root / "index" / "data.mdb").write_bytes(bytes(8192))    # what a format-1 store leaves
    with pytest.raises(OldLayout, match="format 1.*move the directory aside"):
        TieredStore.open(cfg(tmp_path))
    assert (root / "index" / "data.mdb").read_bytes() == bytes(8192)   # untouched
    assert not (root / "FORMAT").exists()


def test_unreadable_root_is_a_store_error(tmp_path):
    (tmp_path / "store").write_bytes(b"not a directory")
    with pytest.raises(StoreError):
        TieredStore.open(cfg(tmp_path))


def test_index_damaged_mid_run_is_a_miss_then_rebuilt_and_commits_work_again(tmp_path):
    c = cfg(tmp_path, host_bytes=0, nvme_bytes=64 * (BLOCK + 4096))
    with TieredStore.open(c) as st:
        st.put_many([key(i) for i in range(20)], [block(i) for i in range(20)])
        st.check_integrity()
        # damage found while running: the next commit fails inside LMDB
        keeper = st.parts.keeper
        real = keeper.index.commit
        calls = []

        def broken(*a, **kw):
            calls.append(1)
            from kvtier.store import IndexCorrupt
            raise IndexCorrupt("simulated: bad page")
        keeper.index.commit = broken
        # the put still succeeds (its slot header is durable), a rebuild is scheduled
        assert st.put(key(100), block(100))
        st.stats()                                           # waits for the rebuild
        assert st.stats().index_rebuilds == 1 and len(calls) == 1
        assert keeper.index.commit is not broken and real is not None
        # commits work again; every block (the new one too) reads back
        assert st.put(key(101), block(101))
        for i in list(range(20)) + [100, 101]:
            out = np.empty(BLOCK, np.uint8)
            assert st.get(key(i), out) and np.array_equal(out, block(i)), i
        st.check_integrity()
    # and the rebuilt index is what a reopen finds
    with TieredStore.open(c) as st:
        assert st.lookup([key(i) for i in range(20)]) == 20 and st.contains(key(101))
        assert Tier.NVME in st.where(key(100))
        st.check_integrity()
    assert any(p.name.startswith("index.corrupt-") for p in (tmp_path / "store").iterdir())
