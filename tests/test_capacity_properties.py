"""Properties of the cost model that must hold for every input (hypothesis)."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.tiering.model import costmodel as cm
from kvtier.tiering.model.capacity import kv_demand_bytes, max_concurrency
from kvtier.tiering.model.paging import paged_vs_naive, prefix_sharing
from kvtier.tiering.model.presets import PRESETS

GB = 1e9
settings.register_profile("kvtier-plan", max_examples=150, deadline=None)
settings.load_profile("kvtier-plan")

models = st.sampled_from(sorted(PRESETS)).map(PRESETS.__getitem__)
tokens = st.integers(min_value=1, max_value=2_000_000)
pools = st.floats(min_value=1e6, max_value=1e13)
headrooms = st.floats(min_value=0.0, max_value=0.95)
bandwidths = st.floats(min_value=1e8, max_value=5e12)


def hardware(link: float) -> cm.HardwareProfile:
    return cm.HardwareProfile(hbm_bytes=640 * GB, link_h2d_bps=link, link_d2h_bps=link, prefill_flops=4e14)


@given(models, pools, tokens, tokens, st.integers(0, 100_000), headrooms)
def test_more_context_never_raises_concurrency(geom, pool, c1, c2, out, headroom):
    short, long_ = sorted((c1, c2))
    a = max_concurrency(geom, pool, short, output_tokens=out, headroom=headroom)
    b = max_concurrency(geom, pool, long_, output_tokens=out, headroom=headroom)
    assert b.concurrency <= a.concurrency


@given(models, pools, tokens, st.integers(0, 50_000), st.integers(0, 50_000), headrooms, st.data())
def test_more_output_or_less_pool_never_raises_concurrency(geom, pool, ctx, o1, o2, headroom, data):
    shared = data.draw(st.integers(0, ctx - 1))
    lo, hi = sorted((o1, o2))
    assert (max_concurrency(geom, pool, ctx, output_tokens=hi, shared_tokens=shared, headroom=headroom).concurrency
            <= max_concurrency(geom, pool, ctx, output_tokens=lo, shared_tokens=shared, headroom=headroom).concurrency)
    smaller = pool * data.draw(st.floats(0.01, 1.0))
    assert (max_concurrency(geom, smaller, ctx, output_tokens=lo, shared_tokens=shared, headroom=headroom).concurrency
            <= max_concurrency(geom, pool, ctx, output_tokens=lo, shared_tokens=shared, headroom=headroom).concurrency)


@given(models, pools, tokens, st.integers(0, 50_000), headrooms, st.data())
def test_concurrency_is_exactly_where_equation_7_stops_fitting(geom, pool, ctx, out, headroom, data):
    shared = data.draw(st.integers(0, ctx - 1))
    b = max_concurrency(geom, pool, ctx, output_tokens=out, shared_tokens=shared, headroom=headroom).concurrency
    demand = lambda n: kv_demand_bytes(geom, n, ctx, output_tokens=out, shared_tokens=shared,  # noqa: E731
                                       headroom_bytes=headroom * pool)
    assert demand(b + 1) > pool * (1 + 1e-12)
    if b > 0:
        assert demand(b) <= pool * (1 + 1e-12)


@given(models, tokens, bandwidths, bandwidths, st.floats(0.0, 10.0), st.floats(0.0, 5.0))
def test_more_link_bandwidth_never_raises_the_breakeven_wait(geom, ctx, bw1, bw2, mu_dram, stall):
    slow, fast = sorted((bw1, bw2))
    n = geom.kv_bytes(ctx)
    mu_hbm = mu_dram + 1.0
    t_slow = cm.breakeven_wait(n, hardware(slow), mu_hbm=mu_hbm, mu_dram=mu_dram, stall_s=stall)
    t_fast = cm.breakeven_wait(n, hardware(fast), mu_hbm=mu_hbm, mu_dram=mu_dram, stall_s=stall)
    assert t_fast <= t_slow


@given(models, tokens, bandwidths, st.floats(0.0, 1e5), st.floats(0.0, 1e5))
def test_once_offloading_pays_it_keeps_paying(geom, ctx, bw, w1, w2):
    # retain is exactly the waits up to the break-even; longer waits never go back to retain
    price = cm.price_pause(geom, ctx, hardware(bw), nvme=True)
    short, long_ = sorted((w1, w2))
    if price.action(short) != cm.RETAIN:
        assert price.action(long_) != cm.RETAIN
    assert (price.action(short) == cm.RETAIN) == (short <= price.retain_until_s)
    # the seed's break-even is the threshold whenever moving the state beats rebuilding it
    if not price.recompute_beats_roundtrip:
        assert price.retain_until_s == price.breakeven_wait_s


@given(st.floats(1.0, 1e13), bandwidths)
def test_seconds_bandwidth_round_trip(nbytes, bw):
    hw = hardware(bw)
    assert abs(cm.t_reload(nbytes, hw) * bw - nbytes) <= 1e-9 * nbytes
    assert abs(cm.hold_gb_s(nbytes, 1.0) * GB - nbytes) <= 1e-9 * nbytes


@given(st.lists(st.integers(1, 4096), min_size=1, max_size=50), st.integers(1, 256))
def test_paging_waste_is_under_one_block_per_request(lengths, block):
    r = paged_vs_naive(lengths, block, 4096)
    assert r.total_actual_tokens <= r.paged_slots < r.total_actual_tokens + block * len(lengths) + 1
    assert 0.0 <= r.paged_fragmentation_pct < 100.0
    assert r.block_table_entries * block == r.paged_slots


@given(st.integers(1, 100_000), st.integers(1, 100_000), st.integers(1, 10_000), st.integers(1, 512))
def test_sharing_never_costs_blocks(p, u, reqs, block):
    r = prefix_sharing(p, u, reqs, block)
    # padded prefix: sharing never costs blocks
    assert r.with_sharing_blocks <= r.without_sharing_blocks
    # full blocks only: never more than every request packing prefix + suffix on its own
    assert r.strict_with_sharing_blocks <= reqs * -(-(p + u) // block)
    # both countings agree when the prefix ends on a block boundary
    if p % block == 0:
        assert r.strict_with_sharing_blocks == r.with_sharing_blocks
    assert (r.with_sharing_blocks == r.without_sharing_blocks) == (reqs == 1)


@given(models, tokens, bandwidths, st.floats(1e8, 5e10), st.floats(0.001, 1.0))
def test_offload_nvme_starts_exactly_where_the_rule_says(geom, ctx, link, nvme_bw, share):
    hw = cm.HardwareProfile(hbm_bytes=640 * GB, link_h2d_bps=link, link_d2h_bps=link, prefill_flops=4e14,
                            nvme_read_bps=nvme_bw, nvme_write_bps=nvme_bw)
    price = cm.price_pause(geom, ctx, hw, nvme=True, nvme_max_share=share)
    start = price.offload_nvme_from_s()
    if start is None:
        assert price.action(1e9) != cm.OFFLOAD_NVME
    else:
        assert price.action(start * (1 + 1e-9)) == cm.OFFLOAD_NVME
        assert price.action(start * (1 - 1e-6)) != cm.OFFLOAD_NVME
