"""The store's parts on their own: slot allocator, frame pool, slab I/O."""
import mmap

import numpy as np
import pytest

from kvtier.store import BadBuffer, StoreClosed, StoreConfig, StoreError
from kvtier.store.hostpool import FramePool, buffer_address
from kvtier.store.io import ThreadEngine, make_engine
from kvtier.store.nvme import NvmeTier
from kvtier.store.slots import SlotAllocator, runs_of


def test_slot_allocator_story():
    a = SlotAllocator(10)
    # a batch gets one contiguous run
    assert a.alloc(4) == [0, 1, 2, 3] and a.alloc(3) == [4, 5, 6]
    # free a hole in the middle: 2 slots there, 3 at the end
    a.free([1, 2])
    assert a.alloc(3) == [7, 8, 9]            # first extent that fits whole
    assert a.alloc(2) == [1, 2]
    a.free([0, 1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert a.extents() == [(0, 10)] and a.free_count == 10   # merged back to one extent
    with pytest.raises(StoreError, match="double free"):
        a.free([3])
    assert a.alloc(11) is None


def test_slot_allocator_fragmented_alloc_and_rebuild():
    a = SlotAllocator(8, used=[1, 3, 5])
    assert a.free_count == 5 and a.extents() == [(0, 1), (2, 1), (4, 1), (6, 2)]
    assert sorted(a.alloc(4)) == [0, 2, 4, 6]   # no run of 4: lowest slots piecewise
    a.cap(6)
    assert a.free_count == 0 and a.total == 6
    assert runs_of([5, 1, 2, 3, 7]) == [(1, 3), (5, 1), (7, 1)]


def test_frame_pool_refcounts_and_double_free():
    p = FramePool(3, 4096, pin="off")
    assert buffer_address(p.view(0)) % 4096 == 0       # page-aligned frames
    f = p.alloc()
    p.incref(f)                                         # a reader pins it
    assert p.decref(f) is False and p.refcount(f) == 1  # still owned
    assert p.decref(f) is True and p.free_count == 3    # freed at zero
    with pytest.raises(StoreError, match="double free"):
        p.decref(f)
    with pytest.raises(StoreError):
        p.incref(f)
    assert [p.alloc() for _ in range(4)][-1] is None    # exhausted: None, not an exception
    p.close()
    with pytest.raises(StoreClosed):
        p.alloc()


def test_nvme_tier_rejects_unaligned_and_wrong_size_buffers(tmp_path):
    cfg = StoreConfig(root=tmp_path, nvme_bytes=8 * 4096, block_bytes=4096, slab_bytes=8 * 4096)
    eng = make_engine("auto", 4)
    tier = NvmeTier(cfg, eng, [])
    try:
        slots = tier.alloc(2)
        good = mmap.mmap(-1, 3 * 4096)
        mv = memoryview(good)
        hdr = memoryview(mmap.mmap(-1, 2 * 4096))
        hdrs = [hdr[:4096], hdr[4096:]]
        with pytest.raises(BadBuffer, match="aligned"):
            tier.start_io(True, slots[:1], [mv[1:4097]], headers=hdrs[:1])
        with pytest.raises(BadBuffer, match="slots are"):
            tier.start_io(True, slots[:1], [mv[:8192]], headers=hdrs[:1])
        with pytest.raises(ValueError, match="header"):
            tier.start_io(True, slots, [mv[:4096], mv[4096:8192]])
        # two adjacent slots coalesce into one op over the blocks (adjacent in memory:
        # one iovec entry) plus one op over their two header sectors (adjacent too)
        ops = tier.ops(True, slots, [mv[:4096], mv[4096:8192]], headers=hdrs)
        assert [[b.nbytes for b in op.bufs] for op in ops] == [[8192], [8192]]
        assert ops[0].offset == tier.hdr_region + slots[0] * 4096 and ops[1].offset == slots[0] * 4096
        mv[:8192] = bytes(range(256)) * 32
        tier.start_io(True, slots, [mv[:4096], mv[4096:8192]], headers=hdrs).wait()
        back = mmap.mmap(-1, 8192)
        bv = memoryview(back)
        tier.start_io(False, slots, [bv[:4096], bv[4096:]]).wait()
        assert bytes(bv) == bytes(mv[:8192])
    finally:
        tier.close()
        eng.close()


def test_thread_engine_reports_short_reads(tmp_path):
    import os
    from kvtier.store.io import IoOp
    path = tmp_path / "f"
    path.write_bytes(b"x" * 100)
    fd = os.open(path, os.O_RDONLY)
    eng = ThreadEngine(2)
    try:
        buf = memoryview(bytearray(4096))
        with pytest.raises(StoreError, match="short read"):
            eng.run([IoOp(False, fd, 0, (buf,))])
    finally:
        eng.close()
        os.close(fd)


@pytest.mark.cuda
def test_host_pool_is_cuda_pinned_and_takes_async_copies():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    p = FramePool(4, 1 << 20, pin="on")
    try:
        assert p.pinned
        gpu = torch.arange(1 << 18, dtype=torch.int32, device="cuda")
        host = torch.frombuffer(p.view(1), dtype=torch.int32)
        host.copy_(gpu, non_blocking=True)          # only legal async from pinned memory
        torch.cuda.synchronize()
        assert torch.equal(host, gpu.cpu())
    finally:
        p.close()


def test_index_defers_commit_flushes_to_its_flusher_and_flushes_at_close(tmp_path):
    import subprocess
    import sys
    import threading

    from kvtier.store.index import Index, pack_record
    # 1. default: no device flush inside a commit (the slot headers are the durable copy);
    #    the background flusher and close() flush
    idx = Index(tmp_path / "ix", 1 << 20, durable=True)
    assert not idx._env.flags()["sync"] and idx._flusher is not None
    idx.commit(puts=[(b"k" * 16, pack_record(b"k" * 16, 3, 4096, 77, bytes(8), 1.0))])
    # 2. the commit is visible to another reader of the same files right away
    #    (what a process reopening after a SIGKILL sees: the page cache survives)
    probe = ("import lmdb, sys; e = lmdb.open(sys.argv[1], max_dbs=4, readonly=True); "
             "t = e.begin(db=e.open_db(b'blocks', create=False)); print(t.get(b'k' * 16) is not None)")
    out = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "ix")], capture_output=True,
                         text=True, check=True).stdout
    assert out.strip() == "True"
    # 3. close stops the background flusher and flushes the last meta page
    idx.close()
    assert not any(t.name == "kvtier-index-flush" and t.is_alive() for t in threading.enumerate())
    idx = Index(tmp_path / "ix", 1 << 20, durable=True)
    assert [k for k, _ in idx.items()] == [b"k" * 16]
    idx.close()
    # 4. index_metasync=True: both flushes at every commit, no flusher thread
    idx = Index(tmp_path / "ix2", 1 << 20, durable=True, metasync=True)
    assert idx._env.flags()["sync"] and idx._env.flags()["metasync"] and idx._flusher is None
    assert idx.close()


@pytest.mark.parametrize("host", [True, False])
def test_batch_of_mixed_runs_round_trips_and_plans_by_adjacency(tmp_path, host):
    """Blocks partly back to back in memory, partly scattered, across slab ends:
    the vectorised copy/I/O planning must still put every block's own bytes
    under its key."""
    bb, n = 4096, 40
    cfg = StoreConfig(root=tmp_path, host_bytes=(n * bb if host else 0), nvme_bytes=2 * n * bb,
                      block_bytes=bb, slab_bytes=16 * bb)
    src = mmap.mmap(-1, 2 * n * bb)
    np.frombuffer(src, dtype=np.uint8)[:] = np.random.default_rng(1).integers(0, 256, 2 * n * bb, dtype=np.uint8)
    sv = memoryview(src)
    # blocks 0..19 back to back, then every other block (no two adjacent), in reverse
    offs = list(range(20)) + list(range(2 * n - 2, 2 * n - 42, -2))
    datas = [sv[o * bb:(o + 1) * bb] for o in offs]
    keys = [i.to_bytes(16, "little") for i in range(n)]
    from kvtier.store import TieredStore
    with TieredStore.open(cfg) as st:
        # step 1: one batch put; repeated keys in the same batch count once
        assert st.put_many(keys + keys[:3], datas + datas[:3]) == n
        # step 2: NVMe planning cuts ops at slab ends (8 slots per slab here) and
        # merges only memory-adjacent buffers; the runs' header writes follow the block writes
        if not host:
            hdrs = [memoryview(bytearray(4096)) for _ in range(6)]      # not adjacent: one entry each
            ops, groups = st._nvme.plan(True, list(range(14, 20)), datas[14:20], headers=hdrs)
            assert [len(g) for g in groups] == [2, 4, 2, 4] and [len(op.bufs) for op in ops] == [1, 1, 2, 4]
        # step 3: read back into outputs in the opposite layout (scattered first)
        dst = mmap.mmap(-1, 2 * n * bb)
        dv = memoryview(dst)
        outs = [dv[o * bb:(o + 1) * bb] for o in reversed(offs)]
        assert st.get_many(list(reversed(keys)), outs) == [True] * n
        for k, o, d in zip(keys, reversed(outs), datas):
            assert bytes(o) == bytes(d), k.hex()
        st.check_integrity()
