"""``eager`` (RFC #57103: prefetch as soon as the pause starts) and ``point``
(Tokencake: reload at the predicted mean minus the reload time): stories."""
from __future__ import annotations

import pytest

from kvtier.bench.sim.runner import default_node, run_policies
from kvtier.bench.sim.synth import SynthConfig, synthesize
from kvtier.tiering.model.costmodel import GB, HardwareProfile, t_offload, t_reload
from kvtier.tiering.model.decision import Action, PauseContext
from kvtier.tiering.policy.policies import POLICY_NAMES, make_policy
from kvtier.tiering.model.presets import get_preset

GEOM = get_preset("gqa-70b")
NODE = HardwareProfile(hbm_bytes=640 * GB, link_h2d_bps=25 * GB, link_d2h_bps=25 * GB, prefill_flops=3560e12,
                       weights_bytes=141 * GB, runtime_bytes=20 * GB, host_bytes=1000 * GB)
KV = GEOM.kv_bytes(32768)


def pause(**kw) -> PauseContext:
    return PauseContext(tool="pytest", kv_bytes=KV, context_tokens=32768, hbm_pressure=0.5, **kw)


def mk(name: str):
    return make_policy(name, geometry=GEOM, hardware=NODE)


def test_both_are_registered():
    assert {"eager", "point"} <= set(POLICY_NAMES)


def test_eager_offloads_and_brings_back_at_once_whatever_the_wait():
    eager = mk("eager")
    for w in (0.1, 45.0, 3600.0):
        eager.observe("pytest", w)                                   # learns nothing
    # room in DRAM: offload there, reload due as soon as the copy-out lands
    d = eager.decide(pause())
    assert d.action == Action.OFFLOAD_HOST and d.prefetch_at_s == 0.0
    # DRAM full: NVMe, staged back and reloaded at once
    d = eager.decide(pause(host_free_bytes=0))
    assert d.action == Action.OFFLOAD_NVME and d.stage_at_s == 0.0 and d.prefetch_at_s == 0.0
    # nowhere to go: recompute
    assert eager.decide(pause(host_free_bytes=0, nvme_free_bytes=0)).action == Action.RECOMPUTE
    # a device victim is swapped to DRAM when it fits, as lru's
    assert eager.victim_action(pause()) == Action.OFFLOAD_HOST
    assert eager.victim_action(pause(host_free_bytes=0)) == Action.RECOMPUTE


def test_point_reloads_at_the_predicted_mean_minus_the_reload_time():
    point = mk("point")
    for _ in range(40):                                              # pytest takes 45 s, every time
        point.observe("pytest", 45.0)
    d = point.decide(pause())
    assert d.action == Action.OFFLOAD_HOST
    mean = point.predictor.forecast("pytest", None).mean_s
    assert d.prefetch_at_s == pytest.approx(max(t_offload(KV, NODE), mean - t_reload(KV, NODE)))
    assert 40.0 < d.prefetch_at_s < 45.0
    # DRAM full: NVMe, staged before the reload, both before the predicted return
    d = point.decide(pause(host_free_bytes=0))
    assert d.action == Action.OFFLOAD_NVME and d.stage_at_s <= d.prefetch_at_s < 45.0
    # a wait shorter than the round trip is not worth moving
    for _ in range(40):
        point.observe("grep", 0.05)
    ctx = PauseContext(tool="grep", kv_bytes=KV, context_tokens=32768)
    assert point.decide(ctx).action == Action.RETAIN


def test_absurd_context_raises():
    for name in ("eager", "point"):
        with pytest.raises(ValueError):
            mk(name).decide(PauseContext(tool="x", kv_bytes=10**18, context_tokens=1))


def test_the_simulator_runs_both_with_its_books_balanced():
    sessions = synthesize(SynthConfig(sessions=40, rate_per_s=0.5, seed=3))
    res = run_policies(sessions, default_node(), ("eager", "point", "breakeven"), check_every=17)
    for name in ("eager", "point"):
        m = res[name].metrics
        assert m["jct_mean_s"] > 0 and m["resume_stall_p99_s"] >= 0
