"""``ttl_reload``: Continuum's hold without a forecast, its TTL set where holding has cost one reload."""
from __future__ import annotations

import pytest

from kvtier.tiering.model.costmodel import GB, t_reload
from kvtier.tiering.model.decision import Action, PauseContext
from kvtier.tiering.model.presets import get_node, get_preset
from kvtier.tiering.policy.policies import CostPrices, make_policy


@pytest.fixture
def policy():
    geo, hw = get_preset("llama-3.1-70b"), get_node("h100x8")
    return make_policy("ttl_reload", geometry=geo, hardware=hw), geo, hw


def _ctx(geo, *, tokens=16384, u=0.5, tool="pytest"):
    return PauseContext(tool=tool, kv_bytes=int(geo.kv_bytes(tokens)), context_tokens=tokens, hbm_pressure=u)


def test_holds_until_holding_has_cost_one_round_trip(policy):
    p, geo, hw = policy
    ctx = _ctx(geo)
    d = p.decide(ctx)
    assert d.action is Action.RETAIN
    pr = CostPrices()
    rate = pr.hbm_pressure_factor(ctx.hbm_pressure) / (geo.kv_bytes(pr.ref_tokens) / GB) * ctx.kv_bytes / GB
    assert d.demote_at_s == pytest.approx(2.0 * pr.stall_weight * t_reload(ctx.kv_bytes, hw) / rate)
    assert p.on_lease_expiry(ctx, d.demote_at_s, d).action is Action.OFFLOAD_HOST


def test_a_fuller_pool_holds_for_less_and_no_wait_is_learned(policy):
    p, geo, _ = policy
    short = p.decide(_ctx(geo, u=0.9)).demote_at_s
    long_ = p.decide(_ctx(geo, u=0.2)).demote_at_s
    assert short < long_
    for _ in range(50):
        p.observe("pytest", 1000.0, None)
    assert p.decide(_ctx(geo, u=0.2)).demote_at_s == pytest.approx(long_)
