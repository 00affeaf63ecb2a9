"""The cost model's pure functions: presets, footprints, times, the decision rule, capacity, paging."""
from __future__ import annotations

import math
from dataclasses import replace

import pytest

from kvtier.tiering.model import costmodel as cm
from kvtier.tiering.model.capacity import NodeBudget, capacity_table, kv_demand_bytes, max_concurrency, weights_bytes
from kvtier.tiering.model.paging import paged_vs_naive, prefix_sharing
from kvtier.tiering.model.presets import NODES, PRESETS, get_node, get_preset

GB = 1e9


# --- presets ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("name,layers,kv_heads,head_dim,token_bytes", [
    ("llama-3.1-8b", 32, 8, 128, 131_072),     # 128 KiB per token in bf16
    ("llama-3.1-70b", 80, 8, 128, 327_680),    # 320 KiB, the texts' 70B
    ("gqa-70b", 80, 8, 128, 327_680),
    ("mistral-7b", 32, 8, 128, 131_072),
    ("qwen2.5-7b", 28, 4, 128, 57_344),
    ("qwen2.5-72b", 80, 8, 128, 327_680),
    ("qwen3-8b", 36, 8, 128, 147_456),
    ("qwen3-32b", 64, 8, 128, 262_144),
])
def test_dense_presets_carry_published_geometry(name, layers, kv_heads, head_dim, token_bytes):
    g = get_preset(name)
    assert (g.layers, g.kv_heads, g.head_dim, g.dtype_bytes) == (layers, kv_heads, head_dim, 2)
    assert g.token_bytes == 2 * layers * kv_heads * head_dim * 2 == token_bytes


def test_deepseek_v3_is_mla_with_a_576_latent():
    g = get_preset("deepseek-v3")
    assert (g.layers, g.mla_latent_dim, g.params, g.active_params) == (61, 576, 671e9, 37e9)
    # one 576-wide latent per layer per token, not K and V per head: 61 x 576 x 2 bytes
    assert g.token_bytes == 61 * 576 * 2
    # recompute runs the 37B active parameters, weights hold all 671B
    hw = get_node("h100x8")
    assert cm.t_recompute(g, 1000, hw) == pytest.approx(2 * 37e9 * 1000 / hw.prefill_flops)
    assert g.weights_bytes(1) == 671e9


def test_preset_lookup_is_case_insensitive_and_unknown_names_list_the_known_ones():
    assert get_preset(" Llama-3.1-8B ") is PRESETS["llama-3.1-8b"]
    with pytest.raises(ValueError) as exc:
        get_preset("llama-4-9000b")
    msg = str(exc.value)
    assert "unknown model preset" in msg
    assert all(name in msg for name in PRESETS)
    with pytest.raises(ValueError, match="h100x8"):
        get_node("tpu-v5")
    # the contract module does not import the presets (presets imports it)
    assert not hasattr(cm, "get_preset") and not hasattr(cm, "PRESETS")


def test_texts_node_preset():
    hw = get_node("h100x8")
    assert round(hw.hbm_bytes / GB, 1) == 687.2                   # 8 x 80 GiB
    assert hw.link_h2d_bps == hw.link_d2h_bps == 512 * GB           # 8 x 64 GB/s
    assert hw.prefill_flops == 3560e12


# --- geometry and times ----------------------------------------------------------------------------

def test_geometry_rejects_non_positive_fields():
    for bad in ({"layers": 0}, {"kv_heads": -1}, {"head_dim": 0}, {"dtype_bytes": 0}, {"params": -7e9},
                {"params": math.nan}, {"d_model": 0}, {"active_params": 2e9}):
        fields = dict(name="x", layers=2, kv_heads=2, head_dim=8, dtype_bytes=2, params=1e9) | bad
        with pytest.raises(ValueError, match="model geometry"):
            cm.ModelGeometry(**fields)


def test_recompute_quadratic_term():
    g = get_preset("gqa-70b")
    hw = get_node("pcie5-x16")
    s = 16384
    linear = cm.t_recompute(g, s, hw)
    quad = cm.t_recompute(g, s, hw, quadratic=True)
    assert quad - linear == pytest.approx(4 * 80 * s**2 * 8192 / hw.prefill_flops)
    with pytest.raises(ValueError, match="d_model"):
        cm.t_recompute(cm.ModelGeometry("x", 2, 2, 8, 2, 1e9), 10, hw, quadratic=True)
    with pytest.raises(ValueError):
        cm.t_recompute(g, -1, hw)


def test_nvme_roundtrip_is_the_serial_sum():
    hw = cm.HardwareProfile(hbm_bytes=80 * GB, link_h2d_bps=50 * GB, link_d2h_bps=25 * GB, prefill_flops=1e15,
                            nvme_read_bps=10 * GB, nvme_write_bps=5 * GB)
    n = 10 * GB
    assert cm.t_nvme_roundtrip(n, hw) == pytest.approx(0.4 + 2.0 + 1.0 + 0.2)
    assert cm.t_roundtrip(n, hw) == pytest.approx(0.6)  # asymmetric link: 0.4 out + 0.2 back


def test_decision_rule_story():
    # The texts' 70B at 16k tokens over one PCIe Gen5 link, NVMe considered.
    g = replace(get_preset("gqa-70b"), params=70e9)
    hw = replace(get_node("pcie5-x16"), nvme_read_bps=14 * GB, nvme_write_bps=14 * GB)
    price = cm.price_pause(g, 16384, hw, nvme=True)
    # a 0.1 s wait is shorter than the 215 ms round trip: keep the state
    assert price.action(0.1) == cm.RETAIN
    # exactly at the break-even: still retain (offloading cannot pay back)
    assert price.action(price.breakeven_wait_s) == cm.RETAIN
    # 45 s: the NVMe round trip (~1 s) is > 1% of the wait, so host DRAM
    assert price.action(45) == cm.OFFLOAD_HOST
    # 10 minutes: NVMe's round trip is under 1% of the wait, free the host DRAM too
    assert price.action(600) == cm.OFFLOAD_NVME
    # without NVMe in play the same wait stays in host DRAM
    assert cm.price_pause(g, 16384, hw).action(600) == cm.OFFLOAD_HOST
    # the action names are the policy layer's Action values
    from kvtier.tiering.model.decision import Action
    assert {cm.RETAIN, cm.OFFLOAD_HOST, cm.OFFLOAD_NVME, cm.RECOMPUTE} == {a.value for a in Action}
    with pytest.raises(ValueError):
        price.action(-1)


def test_recompute_wins_when_the_link_is_slower_than_prefill():
    g = get_preset("llama-3.1-8b")
    hw = cm.HardwareProfile(hbm_bytes=80 * GB, link_h2d_bps=0.1 * GB, link_d2h_bps=0.1 * GB, prefill_flops=1e15)
    price = cm.price_pause(g, 4096, hw)
    assert price.t_recompute_s < price.t_roundtrip_s
    # retain only while the wait is shorter than the rebuild; after that, drop and recompute
    assert price.retain_until_s == pytest.approx(price.t_recompute_s)
    assert price.action(price.t_recompute_s * 0.9) == cm.RETAIN
    assert price.action(price.t_recompute_s * 1.1) == cm.RECOMPUTE
    assert price.action(3600) == cm.RECOMPUTE
    assert price.offload_nvme_from_s() is None


def test_breakeven_grows_with_dram_price_and_stall():
    hw = get_node("h100x8")
    n = 10 * GB
    rt = cm.t_roundtrip(n, hw)
    assert cm.breakeven_wait(n, hw) == pytest.approx(rt)
    assert cm.breakeven_wait(n, hw, mu_hbm=2, mu_dram=1) == pytest.approx(2 * rt)
    assert cm.breakeven_wait(n, hw, stall_s=0.5) == pytest.approx(rt + 0.5)
    with pytest.raises(ValueError):
        cm.breakeven_wait(n, hw, mu_hbm=1, mu_dram=1)


# --- capacity --------------------------------------------------------------------------------------

def test_weights_equation_4():
    assert weights_bytes(70e9, 2, tp=8) == pytest.approx(17.5 * GB)
    with pytest.raises(ValueError):
        weights_bytes(70e9, 2, tp=0)


def test_node_budget_refuses_weights_larger_than_memory():
    with pytest.raises(ValueError, match="no room left for a KV pool"):
        NodeBudget(hbm_bytes=80 * GB, weights_bytes=141.2 * GB, runtime_bytes=0)
    with pytest.raises(ValueError):
        NodeBudget(hbm_bytes=80 * GB, weights_bytes=-1)
    assert NodeBudget(hbm_bytes=640 * GB, weights_bytes=140 * GB, runtime_bytes=36 * GB).kv_pool_bytes == 464 * GB


def test_max_concurrency_is_the_largest_b_the_demand_equation_fits():
    g = get_preset("gqa-70b")
    pool = 464 * GB
    row = max_concurrency(g, pool, 32768, output_tokens=2048, shared_tokens=24576, headroom=0.1)
    assert row.concurrency == 122
    fits = kv_demand_bytes(g, 122, 32768, output_tokens=2048, shared_tokens=24576, headroom_bytes=0.1 * pool)
    over = kv_demand_bytes(g, 123, 32768, output_tokens=2048, shared_tokens=24576, headroom_bytes=0.1 * pool)
    assert fits <= pool < over


def test_a_prefix_bigger_than_the_pool_leaves_room_for_nobody():
    g = get_preset("gqa-70b")
    row = max_concurrency(g, 1 * GB, 10_000, shared_tokens=9_000)
    assert row.concurrency == 0


def test_capacity_table_rows_follow_the_contexts():
    node = NodeBudget(hbm_bytes=687.2 * GB, weights_bytes=141.2 * GB, runtime_bytes=20 * GB)
    rows = capacity_table(get_preset("gqa-70b"), node, [8192, 32768, 131072])
    assert [r.concurrency for r in rows] == [195, 48, 12]
    with pytest.raises(ValueError):
        capacity_table(get_preset("gqa-70b"), node, [])


# --- paging ----------------------------------------------------------------------------------------

def test_paging_validation():
    with pytest.raises(ValueError, match="exceeds"):
        paged_vs_naive([10, 5000], 16, 4096)
    with pytest.raises(ValueError):
        paged_vs_naive([], 16, 4096)
    with pytest.raises(ValueError):
        paged_vs_naive([0], 16, 4096)
    with pytest.raises(ValueError):
        prefix_sharing(380, 90, 500, 0)


def test_sharing_strict_count_duplicates_the_straddling_block():
    # 380 = 23 x 16 + 12: the 24th block holds 12 prefix tokens and the first 4 of each suffix
    r = prefix_sharing(380, 90, 500, 16)
    assert r.strict_with_sharing_blocks == 23 + 500 * math.ceil((12 + 90) / 16)
    assert r.prefill_tokens_saved == 499 * 380


def test_geometry_with_sub_byte_token_footprint_is_rejected():
    # regression: the service fuzzer found a geometry whose m_token rounded to 0,
    # which made the break-even policy divide by zero
    import pytest
    from kvtier.tiering.model.costmodel import ModelGeometry
    with pytest.raises(ValueError, match="less than one byte"):
        ModelGeometry("tiny", layers=1, kv_heads=1, head_dim=1, dtype_bytes=1e-9, params=1e6)
