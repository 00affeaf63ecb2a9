"""BreakEvenPolicy's options: one frozen, validated object; unknown options refused by name, in
the library and at the simulator's ``--set``; the simulator's variant registry."""
from __future__ import annotations

import dataclasses
import json
import math

import pytest

from kvtier.bench.sim.variants import SIM_POLICY_NAMES, make_sim_policy
from kvtier.tiering.policy.breakeven import BreakEvenPolicy, OraclePolicy, PointBreakEvenPolicy, PointStat
from kvtier.tiering.policy.breakeven_options import (OPTION_NAMES, BreakEvenOptions, Lease, Queues, VictimPlan,
                                                     split_options)
from kvtier.tiering.model.decision import PauseContext
from kvtier.tiering.policy.policies import POLICY_NAMES, make_policy
from kvtier.tiering.model.presets import get_node, get_preset
from kvtier.tiering.policy.pricing import CostPrices
from kvtier_testutil import run_cli

GEOM, NODE = get_preset("llama-3.1-8b"), get_node("pcie5-x16")


def test_the_options_are_one_frozen_object_checked_when_made():
    o = BreakEvenOptions()
    assert (o.lease_quantile, o.lease, o.queues, o.victim_plan) == (0.9, "priced", "timing", "none")
    assert o.lease_key == "p90" and not o.plan_victims
    assert BreakEvenOptions(lease_quantile=0.875).lease_key == ""           # no forecast key: computed
    assert BreakEvenOptions(victim_plan="stage").plan_victims
    # the modes are enums whose values are the option strings: a string is taken as its member
    assert (o.lease, o.queues, o.victim_plan) == (Lease.PRICED, Queues.TIMING, VictimPlan.NONE)
    assert BreakEvenOptions(queues="price").queues is Queues.PRICE
    assert BreakEvenOptions(queues="price") == BreakEvenOptions(queues=Queues.PRICE)
    assert f"{BreakEvenOptions(lease='quantile').lease}" == "quantile"
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.queues = "price"  # type: ignore[misc]
    # each bad value is refused with the option's name
    for name, bad in (("lease_quantile", 1.0), ("lease_quantile", True), ("nvme", 1), ("lease", "never"),
                      ("queues", "on"), ("victim_plan", "all"), ("early_stage_fill", 1.5),
                      ("revocable_busy_s", -1.0), ("victim_free_weight", math.inf),
                      ("victim_floor_wait_s", math.nan), ("early_host_wait_s", "2")):
        with pytest.raises(ValueError, match=name):
            BreakEvenOptions(**{name: bad})


def test_a_policy_takes_the_object_or_its_fields_not_both():
    opts = BreakEvenOptions(queues="price", early_host_wait_s=0.0)
    a = BreakEvenPolicy(GEOM, NODE, options=opts)
    b = make_policy("breakeven", geometry=GEOM, hardware=NODE, queues="price", early_host_wait_s=0.0)
    assert a.options == b.options == opts
    with pytest.raises(ValueError, match="not both"):
        BreakEvenPolicy(GEOM, NODE, options=opts, queues="off")
    with pytest.raises(ValueError, match="not both"):
        BreakEvenPolicy(GEOM, NODE, prices=CostPrices(), stall_weight=2.0)
    # price fields and options sort themselves; the point rule and the oracle take both
    p = PointBreakEvenPolicy(GEOM, NODE, point_stat="p50", stall_weight=2.0, lease="quantile")
    assert p.prices.stall_weight == 2.0 and p.options.lease is Lease.QUANTILE and p.point_stat is PointStat.P50
    assert OraclePolicy(GEOM, NODE, staging=False).options.staging is False
    # what expected.py reads is public: the options, ref_gb, flops_per_token, droppable_price
    assert a.ref_gb == pytest.approx(GEOM.kv_bytes(a.prices.ref_tokens) / 1e9)
    assert a.flops_per_token == 2.0 * GEOM.compute_params
    assert a.droppable_price(0.0) == 0.0 < a.droppable_price(0.9)


def test_unknown_options_list_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['victim_ordr'\].*lease_quantile.*stall_weight"):
        split_options("breakeven", {"victim_ordr": "remaining"})
    opts, prices = split_options("breakeven", {"queues": "off", "stall_weight": 2.0})
    assert opts == {"queues": "off"} and prices == {"stall_weight": 2.0}


def test_the_simulators_variants_sit_beside_the_products_policies():
    assert SIM_POLICY_NAMES[:len(POLICY_NAMES)] == POLICY_NAMES and "breakeven_recency" in SIM_POLICY_NAMES
    v = make_sim_policy("breakeven_recency", geometry=GEOM, hardware=NODE, queues="price")
    ctx = PauseContext(tool="x", kv_bytes=GEOM.kv_bytes(4096), context_tokens=4096)
    assert v.options.queues == "price" and v.victim_priority(ctx, 12.5) == 12.5   # the longest-paused first
    assert make_sim_policy("lru", geometry=GEOM, hardware=NODE).name == "lru"      # the product's, by name
    with pytest.raises(ValueError, match="breakeven_recency"):
        make_sim_policy("breakeven_recent", geometry=GEOM, hardware=NODE)
    with pytest.raises(ValueError, match="victim_order"):
        make_sim_policy("breakeven_recency", geometry=GEOM, hardware=NODE, victim_order="recency")


def test_set_keeps_working_for_options_and_names_an_unknown_one(capsys):
    rc, out, _ = run_cli(capsys, "bench", "simulate", "--synth", "6", "--policies", "breakeven,breakeven_recency",
                         "--set", "breakeven.queues=price", "--set", "breakeven_recency.lease=quantile", "--json")
    assert rc == 0 and set(json.loads(out)["policies"]) == {"breakeven", "breakeven_recency"}
    rc, out, err = run_cli(capsys, "bench", "simulate", "--synth", "6", "--policies", "breakeven",
                           "--set", "breakeven.nvme_write_hbm=false")
    assert rc != 0
    lines = [ln for ln in err.splitlines() if "nvme_write_hbm" in ln]
    assert len(lines) == 1 and "unknown option" in lines[0]
