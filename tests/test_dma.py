"""dma: layouts, staging frames and movers on CPU tensors (the CUDA calls are the only thing skipped)."""
from __future__ import annotations

import asyncio
import itertools

import pytest
import torch

from kvtier.dma.layouts import CrossLayerLayout, FrameFormat, HFLayout, SglangPageFirstLayout, VllmLayout
from kvtier.dma.movers import DeviceToHostMover, DeviceToStoreMover, HostToDeviceMover, mover_class
from kvtier.dma.spec import DeviceBlocks, Endpoint, HostFrames, StoreBlocks, TransferSpec
from kvtier.dma.staging import FramePool, FramePoolFull, runs
from kvtier.util.tiers import Tier

FMT = FrameFormat(layers=4, block_tokens=8, kv_heads=2, head_dim=4, dtype=torch.float32)
LAYOUTS = ("vllm", "cross_layer", "sglang_page_first")
LAYOUT_CLASSES = {c.name: c for c in (VllmLayout, CrossLayerLayout, SglangPageFirstLayout, HFLayout)}


def filled(name: str, num_blocks: int = 10, seed: int = 0):
    """An engine layout whose every element is distinct and known."""
    lay = LAYOUT_CLASSES[name].allocate(FMT, num_blocks)
    g = torch.Generator().manual_seed(seed)
    tensors = getattr(lay, "tensors", None) or [lay.tensor]
    for t in tensors:
        t.copy_(torch.randn(t.shape, generator=g))
    return lay


def reference_frame(lay, b: int) -> torch.Tensor:
    """The canonical frame of block b built element by element from block_views."""
    out = torch.zeros(FMT.shape)
    for l in range(FMT.layers):
        k, v = lay.block_views(b, l)
        t = k.shape[0]
        out[l, 0, :t], out[l, 1, :t] = k, v
    return out


# -- layouts ---------------------------------------------------------------

@pytest.mark.parametrize("name", LAYOUTS)
def test_vectorised_gather_matches_block_views(name):
    lay = filled(name)
    ids = [7, 2, 5]
    out = torch.empty(3, *FMT.shape)
    lay.gather(ids, out)
    for i, b in enumerate(ids):
        assert torch.equal(out[i], reference_frame(lay, b))


@pytest.mark.parametrize("name", LAYOUTS)
def test_scatter_then_gather_round_trips_and_touches_only_named_blocks(name):
    src, dst = filled(name, seed=1), filled(name, seed=2)
    before = filled(name, seed=2)
    frames = torch.empty(2, *FMT.shape)
    src.gather([1, 3], frames)
    # scatter src blocks 1,3 into dst blocks 4,0, only layers 1..2
    dst.scatter(frames, [4, 0], range(1, 3))
    for (sb, db) in ((1, 4), (3, 0)):
        for l in range(FMT.layers):
            got, want = dst.block_views(db, l), (src if l in (1, 2) else before).block_views(sb if l in (1, 2) else db, l)
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    for b in (2, 5, 9):                         # untouched blocks stay as they were
        assert torch.equal(reference_frame(dst, b), reference_frame(before, b))


def test_frame_is_layer_major():
    # the bytes of layer l are one contiguous slice [l*layer_bytes, (l+1)*layer_bytes)
    lay = filled("vllm")
    out = torch.empty(1, *FMT.shape)
    lay.gather([3], out)
    flat = out[0].reshape(-1)
    per_layer = FMT.layer_bytes // FMT.itemsize
    for l in range(FMT.layers):
        k, v = lay.block_views(3, l)
        assert torch.equal(flat[l * per_layer:(l + 1) * per_layer], torch.cat([k.reshape(-1), v.reshape(-1)]))


def test_hf_layout_partial_tail_block_is_zero_padded_and_round_trips():
    S = 8 * 2 + 3                                # two full blocks and 3 tokens
    src = HFLayout.allocate(FMT, S)
    for t in (*src.keys, *src.values):
        t.copy_(torch.randn(t.shape))
    assert src.num_blocks == 3 and src.valid_tokens(2) == 3
    frames = torch.full((3, *FMT.shape), 7.0)
    src.gather([0, 1, 2], frames)
    assert torch.all(frames[2, :, :, 3:] == 0)
    dst = HFLayout.allocate(FMT, S)
    dst.scatter(frames, [0, 1, 2])
    for a, b in zip((*src.keys, *src.values), (*dst.keys, *dst.values)):
        assert torch.equal(a, b)


def test_layout_bad_input_raises_clear_errors():
    lay = filled("cross_layer")
    with pytest.raises(ValueError, match="out of range"):
        lay.gather([10], torch.empty(1, *FMT.shape))
    with pytest.raises(ValueError, match="frames must be"):
        lay.gather([1], torch.empty(2, *FMT.shape))
    with pytest.raises(ValueError, match="does not match"):
        VllmLayout([torch.zeros(2, 3, 8, 2, 5)] * 4, FMT)


def test_layer_groups_cover_layers_in_order():
    assert FMT.layer_groups(2) == [range(0, 2), range(2, 4)]
    assert FMT.layer_groups(3) == [range(0, 2), range(2, 4)]
    assert FMT.layer_groups(10) == [range(i, i + 1) for i in range(4)]


# -- staging ---------------------------------------------------------------

def test_frame_pool_prefers_contiguous_runs_and_rejects_double_free():
    pool = FramePool(FMT, 8)
    a = pool.alloc(3)                             # [0,1,2]
    b = pool.alloc(2)                             # [3,4]
    pool.free(a[1:2])                             # hole at 1
    c = pool.alloc(3)                             # first run of 3 free: [5,6,7]
    assert a == (0, 1, 2) and b == (3, 4) and c == (5, 6, 7)
    with pytest.raises(FramePoolFull):
        pool.alloc(2)                             # only frame 1 is free
    assert pool.free_count == 1                   # a failed alloc took nothing
    with pytest.raises(ValueError, match="double free"):
        pool.free([1])
    pool.check_integrity()
    assert runs([5, 6, 7, 1, 3, 4]) == [(0, 5, 3), (3, 1, 1), (4, 3, 2)]


# -- movers ----------------------------------------------------------------

@pytest.fixture
def movers():
    pool = FramePool(FMT, 16)
    d2h, h2d = DeviceToHostMover(pool), HostToDeviceMover(pool)
    yield pool, d2h, h2d
    d2h.close()
    h2d.close()


@pytest.mark.parametrize("strategy,name", list(itertools.product(("batched", "per_block"), LAYOUTS + ("hf",))))
def test_offload_and_reload_round_trip_every_layout_and_strategy(movers, strategy, name):
    pool, d2h, h2d = movers
    d2h.strategy = h2d.strategy = strategy
    if name == "hf":
        src = HFLayout.allocate(FMT, 8 * 4 + 5)
        for t in (*src.keys, *src.values):
            t.copy_(torch.randn(t.shape))
        dst = HFLayout.allocate(FMT, 8 * 4 + 5)
        ids = dst_ids = [0, 1, 2, 3, 4]
    else:
        src, dst = filled(name, seed=3), LAYOUT_CLASSES[name].allocate(FMT, 10)
        ids, dst_ids = [6, 1, 8], [0, 9, 4]
    d2h.register_layout("src", src)
    h2d.register_layout("dst", dst)
    frames = pool.alloc(len(ids))
    # offload: device blocks -> frames
    r = d2h.transfer_async(1, TransferSpec(DeviceBlocks("src", ids), HostFrames(frames))).result(10)
    assert r.ok and r.nbytes == len(ids) * FMT.frame_bytes
    # reload into other blocks in 2 layer groups
    c = h2d.transfer_async(2, TransferSpec(HostFrames(frames), DeviceBlocks("dst", dst_ids), layer_groups=2))
    assert c.result(10).ok and c.groups == 2 and c.group_done(0) and c.group_done(1)
    for sb, db in zip(ids, dst_ids):
        assert torch.equal(reference_frame(dst, db), reference_frame(src, sb))
    assert [r.job_id for r in d2h.get_finished()] == [1] and d2h.get_finished() == []


@pytest.mark.parametrize("tier", ["host", "nvme"])
def test_two_phase_offload_gathers_straight_into_the_store(tmp_path, tier):
    from kvtier.store.config import StoreConfig
    from kvtier.store.tiered import TieredStore

    src = HFLayout.allocate(FMT, 8 * 4 + 5)                 # 4 full blocks and a 5-token tail
    for t in (*src.keys, *src.values):
        t.copy_(torch.randn(t.shape))
    keys = [bytes([i]) * 16 for i in range(5)]
    cfg = StoreConfig(root=tmp_path / "st", host_bytes=16 * FMT.frame_bytes, nvme_bytes=32 * FMT.frame_bytes,
                      block_bytes=FMT.frame_bytes)
    with TieredStore.open(cfg) as st:
        d2s = DeviceToStoreMover(FramePool(FMT, 1), st)
        d2s.register_layout("c", src)
        # blocks 0..4 -> the store's buffers -> published in the requested tier
        r = d2s.transfer_async(1, TransferSpec(DeviceBlocks("c", range(5)), StoreBlocks(keys, tier=tier))).result(10)
        assert r.ok and r.nbytes == 5 * FMT.frame_bytes
        out = torch.empty(FMT.shape)
        for b, k in enumerate(keys):
            assert {str(t) for t in st.where(k)} == {tier}
            assert st.get(k, out.view(-1).view(torch.uint8).numpy())
            assert torch.equal(out, reference_frame(src, b))          # the tail block is zero padded
        # the same keys again: all already stored, nothing moves
        r = d2s.transfer_async(2, TransferSpec(DeviceBlocks("c", range(5)), StoreBlocks(keys, tier=tier))).result(10)
        assert r.ok and r.nbytes == 0
        # more new blocks than the store can hold: the job fails and none of them becomes visible
        more = [bytes([100 + i]) * 16 for i in range(40)]
        src40 = HFLayout.allocate(FMT, 8 * 40)
        d2s.register_layout("big", src40)
        r = d2s.transfer_async(3, TransferSpec(DeviceBlocks("big", range(40)), StoreBlocks(more, tier=tier))).result(10)
        assert not r.ok and "Full" in r.error
        assert not any(st.contains(k) for k in more) and all(st.contains(k) for k in keys)
        d2s.close()
        st.check_integrity()


def test_jobs_on_one_mover_finish_in_submission_order_and_are_awaitable(movers):
    pool, d2h, _ = movers
    d2h.register_layout("v", filled("vllm"))
    frames = pool.alloc(10)
    comps = [d2h.transfer_async(j, TransferSpec(DeviceBlocks("v", [j]), HostFrames([frames[j]])))
             for j in range(10)]

    async def wait_all():
        return await asyncio.gather(*comps)

    results = asyncio.run(wait_all())
    assert all(r.ok for r in results)
    assert [r.job_id for r in d2h.get_finished()] == list(range(10))


def test_pipelined_reload_reports_groups_in_order_with_earlier_layers_written(movers):
    # when group g is reported, layers of groups <= g hold the data, later layers don't yet
    pool, d2h, h2d = movers
    src, dst = filled("cross_layer", seed=4), CrossLayerLayout.allocate(FMT, 10)
    d2h.register_layout("src", src)
    h2d.register_layout("dst", dst)
    frames = pool.alloc(3)
    assert d2h.transfer_async(1, TransferSpec(DeviceBlocks("src", [0, 1, 2]), HostFrames(frames))).result(10).ok
    seen = []

    def on_group(g):
        written = [bool(torch.equal(dst.tensor[:3, l], src.tensor[:3, l])) for l in range(FMT.layers)]
        seen.append((g, written))

    c = h2d.transfer_async(2, TransferSpec(HostFrames(frames), DeviceBlocks("dst", [0, 1, 2]), layer_groups=4),
                           on_group=on_group)
    assert c.result(10).ok
    assert seen == [(g, [l <= g for l in range(4)]) for g in range(4)]
    c.wait_group(3)                                # returns at once: already complete


def test_bad_specs_are_rejected_before_anything_moves(movers):
    pool, d2h, h2d = movers
    d2h.register_layout("v", filled("vllm"))
    with pytest.raises(ValueError, match="unknown device layout 'nope'; registered: v"):
        d2h.transfer_async(1, TransferSpec(DeviceBlocks("nope", [0]), HostFrames([0])))
    with pytest.raises(ValueError, match="out of range"):
        d2h.transfer_async(1, TransferSpec(DeviceBlocks("v", [99]), HostFrames([0])))
    with pytest.raises(ValueError, match="moves device->staging"):
        d2h.transfer_async(1, TransferSpec(HostFrames([0]), DeviceBlocks("v", [0])))
    with pytest.raises(ValueError, match="source has 2 blocks but destination has 1"):
        TransferSpec(DeviceBlocks("v", [0, 1]), HostFrames([0]))
    with pytest.raises(ValueError, match="known: device->staging"):
        mover_class("store", "device")
    with pytest.raises(ValueError, match="format"):
        h2d.register_layout("x", VllmLayout.allocate(FrameFormat(2, 8, 2, 4), 3))
    assert d2h.get_finished() == []               # nothing was queued


def test_calibrate_keeps_one_of_the_strategies(movers):
    pool, d2h, _ = movers
    d2h.register_layout("v", filled("vllm"))
    timings = d2h.calibrate("v", [1, 2, 3], pool.alloc(3), repeats=1)
    assert set(timings) == {"batched", "per_block"} and d2h.strategy == min(timings, key=timings.get)


def test_spec_is_plain_data():
    spec = TransferSpec(HostFrames([1, 2]), StoreBlocks([b"a" * 16, b"b" * 16], tier="nvme"))
    assert spec.pair == (Endpoint.STAGING, Endpoint.STORE) and spec.num_blocks == 2
    assert spec.dst.tier is Tier.NVME                   # a tier name is taken as its Tier
    with pytest.raises(ValueError, match="tier"):
        StoreBlocks([b"a"], tier="tape")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("strategy", ["batched", "per_block"])
def test_cuda_movers_round_trip_with_streams_and_group_events(strategy):
    # device blocks -> pinned frames on the copy stream -> other device blocks, 2 layer groups
    pool = FramePool(FMT, 8)
    assert pool.pinned
    src = VllmLayout.allocate(FMT, 10, device="cuda")
    for t in src.tensors:
        t.normal_()
    dst = VllmLayout.allocate(FMT, 10, device="cuda")
    with DeviceToHostMover(pool, strategy=strategy) as d2h, HostToDeviceMover(pool, strategy=strategy) as h2d:
        d2h.register_layout("s", src)
        h2d.register_layout("d", dst)
        frames = pool.alloc(3)
        assert d2h.transfer_async(1, TransferSpec(DeviceBlocks("s", [5, 0, 9]), HostFrames(frames))).result(30).ok
        c = h2d.transfer_async(2, TransferSpec(HostFrames(frames), DeviceBlocks("d", [1, 2, 3]), layer_groups=2))
        c.wait_group(1)                      # the current stream waits on the GPU for the last group
        got = torch.stack([dst.tensors[l][:, [1, 2, 3]] for l in range(FMT.layers)]).cpu()
        want = torch.stack([src.tensors[l][:, [5, 0, 9]] for l in range(FMT.layers)]).cpu()
        assert torch.equal(got, want) and c.result(30).ok
