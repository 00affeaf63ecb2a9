"""The simulator carries every pause out through the engines' lifecycle controller.

Toy node of tests/test_sim.py (1 ms per block over the link, 10 ms per block to
or from NVMe); the controller is ``Simulator.lifecycle`` (a SimController:
ControllerCore holding SimMoves, the node's HBM as its DeviceHooks).
"""
from __future__ import annotations

from collections import Counter

import pytest

from kvtier.bench.sim.lifecycle import SimController, SimMoves
from kvtier.bench.sim.runner import default_node
from kvtier.bench.sim.simulator import Simulator
from kvtier.bench.sim.synth import SynthConfig, synthesize
from kvtier.bench.sim.trace import make_session
from kvtier.tiering.policy.policies import make_policy
from kvtier.tiering.model.decision import Action, Decision
from kvtier.tiering.lifecycle import ControllerCore, DeviceSchedule, Event, LifecycleController
from kvtier.tiering.lifecycle.moves import StoreMoves

from test_sim import ONE, PRESSURE, Fixed, PlansVictims, toy_node


def _sim(policy, sessions=ONE, node=None) -> tuple[Simulator, dict]:
    sim = Simulator(sessions, node or toy_node(), policy, check_every=1)
    return sim, sim.run().metrics


def _by(prefix: str, counters: Counter) -> dict[str, int]:
    return {k[len(prefix):]: v for k, v in counters.items() if k.startswith(prefix)}


def test_backends_are_moves_held_by_one_core():
    """One core class; what a move does is the Moves object it holds (composition, no mixins)."""
    assert issubclass(LifecycleController, ControllerCore) and issubclass(SimController, ControllerCore)
    assert not issubclass(LifecycleController, StoreMoves) and not issubclass(SimController, SimMoves)
    sim = Simulator(ONE, toy_node(), Fixed(Action.OFFLOAD_HOST), check_every=1)
    assert isinstance(sim.lifecycle.moves, SimMoves) and not isinstance(sim.lifecycle.moves, StoreMoves)
    for name in ("pause_moves", "lease_applies", "arm_lease", "lease_move", "arm_return", "demote", "stage",
                 "drop", "watermarks"):          # the Moves protocol (backend.py), on both backends
        assert callable(getattr(SimMoves, name)) and callable(getattr(StoreMoves, name))


def test_a_run_s_pauses_are_the_controller_s():
    """A synthetic trace under breakeven on a quarter of the default HBM at 25 GB/s (retain,
    offload, lease ends, HBM victims): decisions by action, lease answers, pauses and resumes
    counted by the controller are the simulator's metrics."""
    ss = synthesize(SynthConfig(sessions=150, rate_per_s=1.0, seed=3))
    n0 = default_node()
    node = default_node(hbm_bytes=n0.hardware.hbm_bytes * 0.25, link_h2d_bps=25e9, link_d2h_bps=25e9)
    sim, m = _sim(make_policy("breakeven", geometry=node.geometry, hardware=node.hardware), ss, node)
    c = sim.lifecycle.counters
    decided = _by("decision:", c)
    leased = _by("lease:", c)
    assert decided == {a: n for a, n in m["actions"].items() if not a.startswith("lease_")}
    assert len(decided) >= 2 and sum(leased.values()) > 0 and m["victims"]   # the run exercises them
    assert {f"lease_{a}": n for a, n in leased.items()} == {a: n for a, n in m["actions"].items()
                                                           if a.startswith("lease_")}
    assert sum(leased.values()) == m["lease_redecisions"]
    assert c["leases"] >= m["lease_redecisions"]                    # a lease end may keep the plan (None)
    assert c["pauses"] == sum(decided.values()) == c["resumes"]     # every pause's tool came back
    # a resumed round either started (a metric's resume) or was rejected in the resume queue
    assert m["resumes"] <= c["resumes"] <= m["resumes"] + m["sessions_rejected"]


def test_a_host_lease_end_demotes_through_sim_moves(monkeypatch):
    """offload_host under a 1 s lease, answered offload_nvme: the controller's lease end calls
    SimMoves.demote, whose timed NVMe write moves the copy down; the resume reads NVMe."""
    calls = []
    orig = SimMoves.demote

    def spy(self, t, why, **kw):
        calls.append((t.tid, why, self.clock.now))
        return orig(self, t, why, **kw)

    monkeypatch.setattr(SimMoves, "demote", spy)
    pol = Fixed(Action.OFFLOAD_HOST, demote_at=1.0, on_lease=Decision(Action.OFFLOAD_NVME))
    sim, m = _sim(pol)
    assert [(tid, why) for tid, why, _ in calls] == [("a", "lease end")]
    assert calls[0][2] == pytest.approx(0.160 + 0.016 + 1.0, abs=1e-9)   # paused after 176 ms, leased 1 s later
    assert sim.lifecycle.counters["lease:offload_nvme"] == 1 and sim.lifecycle.counters["demotions"] == 1
    assert m["actions"] == {"offload_host": 1, "lease_offload_nvme": 1}
    assert m["moved_gb"]["nvme"] > 0                               # written down, then read back


def test_an_hbm_lease_end_is_the_device_side():
    """retain under a 1 s lease, answered offload_host: the lease end of a Tier.DEVICE pause
    goes to the DeviceHooks (SimDevice.leased), which starts the D2H offload."""
    pol = Fixed(Action.RETAIN, demote_at=1.0, on_lease=Decision(Action.OFFLOAD_HOST))
    sim, m = _sim(pol)
    assert m["actions"] == {"retain": 1, "lease_offload_host": 1}
    assert m["moved_gb"]["d2h"] > 0 and m["moved_gb"]["h2d"] > 0
    assert sim.lifecycle.counters["demotions"] == 0                # not a host -> NVMe move


def test_a_plan_s_staging_and_reload_are_controller_timers():
    """offload_nvme staged at 2 s, reloaded to HBM at 4 s of a 5 s tool: both are the
    controller's timers (STAGE -> SimMoves.stage, RELOAD -> SimDevice.reload), so the
    resume finds its state resident (no stall)."""
    class Staged(Fixed):
        def decide(self, ctx):
            return Decision(Action.OFFLOAD_NVME, stage_at_s=2.0, prefetch_at_s=4.0)

    sim, m = _sim(Staged(Action.OFFLOAD_NVME))
    plan = DeviceSchedule._timers(Decision(Action.OFFLOAD_NVME, stage_at_s=2.0, prefetch_at_s=4.0),
                                  Action.OFFLOAD_NVME, reload=True, lease=True)
    assert plan == ((2.0, Event.STAGE), (4.0, Event.RELOAD))
    assert sim.lifecycle.counters["stagings"] == 1 == m["staged_to_host"]
    assert m["resume_stall_p99_s"] == 0.0
    assert sim.lifecycle.where("a") is None                        # resumed: the controller saw it back


def test_device_schedule_keeps_retain_on_the_device():
    """The device holder's mapping differs from the engines' ForecastSchedule: retain stays on
    the device, an NVMe pause without stage_at_s is not staged (its prefetch is a RELOAD)."""
    from kvtier.tiering.lifecycle import ForecastSchedule, Trajectory
    from kvtier.tiering.model.decision import PauseContext

    d = Decision(Action.OFFLOAD_NVME, prefetch_at_s=3.0)

    class One(Fixed):
        def decide(self, ctx):
            return d

    ctx = PauseContext(tool="t", kv_bytes=1 << 20, context_tokens=1024)
    dev = DeviceSchedule(One(Action.OFFLOAD_NVME)).plan(Trajectory("a"), ctx)
    eng = ForecastSchedule(One(Action.OFFLOAD_NVME)).plan(Trajectory("a"), ctx)
    assert dev.tier == eng.tier == "nvme"
    assert dev.timers == ((3.0, Event.RELOAD),) and eng.timers == ((3.0, Event.STAGE),)
    ret = DeviceSchedule(Fixed(Action.RETAIN)).plan(Trajectory("b"), ctx)
    assert ret.tier == "device"


def test_an_hbm_victim_s_way_back_goes_through_the_controller():
    """The admission picks the HBM victim (the device's own choice); its victim_decision (to
    NVMe, staged 5 s after the pause) is handed to the controller, which arms the staging as a
    pause's plan: it is the controller's decision for that pause now, and the staging ran."""
    pol = PlansVictims(stage_at=5.0)
    sim, m = _sim(pol, PRESSURE, toy_node(pool_blocks=30))
    c = sim.lifecycle.counters
    assert m["victims"] == {"offload_nvme": 1} and c["evicted"] == 1
    assert c["stagings"] == 1 == m["staged_to_host"]
    a = next(x for x in sim.sessions if x.s.id == "a")
    # the node's copy of the pause's decision is the controller's, adopted from victim_decision
    assert a.decision.action is Action.OFFLOAD_NVME and a.decision.stage_at_s == 5.0
