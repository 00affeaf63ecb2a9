"""The lifecycle controller on a real TieredStore, driven by a ManualClock.

Each scenario reads as a story: a trajectory pauses, the clock moves, the
timer work runs (``tick``), and the store's tiers are checked with ``where``.
"""
from __future__ import annotations

import pytest

from kvtier.store import StoreConfig, TieredStore
from kvtier.util.tiers import Tier
from kvtier.tiering.model.decision import Action, Decision, PauseContext, Policy
from kvtier.tiering.lifecycle import (ForecastSchedule, LifecycleController, LifecycleTimer, ManualClock,
                                      TTLSchedule)
from kvtier_testutil import key, random_block

BLOCK = 4096


class Scripted(Policy):
    """A policy whose decision per tool is given (the controller is what is under test)."""

    name = "scripted"

    def __init__(self, decisions: dict, lease: dict | None = None, remaining: dict | None = None) -> None:
        self.decisions, self.lease, self.remaining = decisions, lease or {}, remaining or {}
        self.observed: list[tuple[str, float]] = []

    def decide(self, ctx: PauseContext) -> Decision:
        return self.decisions[ctx.tool]

    def on_lease_expiry(self, ctx, elapsed_s, current):
        return self.lease.get(ctx.tool)

    def victim_priority(self, ctx, elapsed_s):
        return self.remaining.get(ctx.tool, 0.0)

    def observe(self, tool, wait_s, features=None):
        self.observed.append((tool, wait_s))


@pytest.fixture
def store(tmp_path):
    with TieredStore.open(StoreConfig(root=tmp_path / "s", host_bytes=8 * BLOCK, nvme_bytes=64 * BLOCK,
                                      block_bytes=BLOCK)) as s:
        yield s
        s.check_integrity()


def write(store, tid: int, n: int, tier: str) -> list[bytes]:
    keys = [key(tid * 100 + i) for i in range(n)]
    store.put_many(keys, [random_block(tid * 100 + i, BLOCK) for i in range(n)], tier=tier)
    return keys


def tiers(store, keys) -> set:
    return set().union(*(store.where(k) for k in keys))


def test_host_lease_ends_in_demotion_and_stage_brings_it_back_before_the_return(store):
    pol = Scripted({"pytest": Decision(Action.OFFLOAD_HOST, demote_at_s=5.0)},
                   lease={"pytest": Decision(Action.OFFLOAD_NVME, stage_at_s=20.0)})
    clock = ManualClock()
    ctl = LifecycleController(store, ForecastSchedule(pol), clock=clock, block_bytes=BLOCK)
    ctl.hint("t1", "pytest")
    plan = ctl.plan_for("t1", context_tokens=64)
    assert plan.tier == "host"                       # offload_host -> host frames under a 5 s lease
    keys = write(store, 1, 4, plan.tier)
    ctl.pause("t1", keys)
    assert ctl.tick() == 1 and ctl.stats().get("stagings", 0) == 0   # admission: already in host frames
    clock.advance(4.9)
    assert ctl.tick() == 0 and tiers(store, keys) == {Tier.HOST}   # lease still running
    clock.advance(0.2)
    assert ctl.tick() == 1                           # lease end: the policy says NVMe, staged at 20 s
    assert tiers(store, keys) == {Tier.NVME}
    assert ctl.where("t1") is Tier.NVME
    clock.set(20.0)
    ctl.tick()                                       # staged back to host frames ahead of the return
    assert all(Tier.HOST in store.where(k) for k in keys)
    assert ctl.where("t1") is Tier.HOST
    clock.set(25.0)
    assert ctl.resume("t1") == pytest.approx(25.0)   # the observed wait goes to the policy,
    assert pol.observed == []                        # not on the engine's resume but before its next answer
    ctl.hint("t1", "pytest")
    assert ctl.plan_for("t1", context_tokens=64).tier == "host"
    assert pol.observed == [("pytest", pytest.approx(25.0))]
    assert ctl.learn() == 0                          # given once
    assert ctl.stats()["staged_blocks"] == 4 and ctl.stats()["demoted_blocks"] == 4


def test_recompute_class_pause_plans_no_write(store):
    ctl = LifecycleController(store, ForecastSchedule(Scripted({"human": Decision(Action.RECOMPUTE)})),
                              clock=ManualClock(), block_bytes=BLOCK)
    ctl.hint("t", "human")
    assert ctl.plan_for("t").tier is None
    assert ctl.pause("t") is not None and ctl.where("t") is None
    assert store.stats().nvme_blocks == 0 and store.stats().host_blocks == 0


def test_host_victims_are_chosen_by_forecast_not_recency(store):
    # two host-resident pauses: "slow" expected back in 100 s, "fast" in 1 s;
    # "slow" paused *later* (recency would evict "fast" first)
    pol = Scripted({"fast": Decision(Action.OFFLOAD_HOST), "slow": Decision(Action.OFFLOAD_HOST)},
                   remaining={"fast": 1.0, "slow": 100.0})
    clock = ManualClock()
    ctl = LifecycleController(store, ForecastSchedule(pol), clock=clock, block_bytes=BLOCK)
    for tid, tool in (("a", "fast"), ("b", "slow")):
        ctl.hint(tid, tool)
        ctl.pause(tid, write(store, ord(tid), 4, "host"))
        clock.advance(1)
    assert store.stats().host_frames_used == 8       # host tier full
    assert ctl.make_room(4)                          # room for 4 more blocks
    assert tiers(store, [key(ord("b") * 100 + i) for i in range(4)]) == {Tier.NVME}
    assert tiers(store, [key(ord("a") * 100 + i) for i in range(4)]) == {Tier.HOST}


def test_a_resume_cancels_pending_timers(store):
    pol = Scripted({"x": Decision(Action.OFFLOAD_HOST, demote_at_s=1.0)})
    clock = ManualClock()
    ctl = LifecycleController(store, ForecastSchedule(pol), clock=clock, block_bytes=BLOCK)
    ctl.hint("t", "x")
    keys = write(store, 7, 2, "host")
    ctl.pause("t", keys)
    ctl.hint("t", "x")                               # the next request of the trajectory: it is back
    clock.advance(5)
    assert ctl.tick() == 0 and tiers(store, keys) == {Tier.HOST}


def test_ttl_schedule_demotes_at_age_forgets_at_ttl_and_keeps_watermarks(store):
    clock = ManualClock()
    ctl = LifecycleController(store, TTLSchedule(idle_ttl_s=10, demote_after_s=3), clock=clock,
                              block_bytes=BLOCK)
    ctl.hint("old", "any")
    old = write(store, 1, 4, "host")
    ctl.pause("old", old)
    clock.advance(3)
    ctl.tick()
    assert tiers(store, old) == {Tier.NVME}          # fixed demotion age, whatever the tool
    clock.advance(7)
    ctl.tick()
    assert tiers(store, old) == set()                # idle TTL: forgotten
    # watermarks: 8 host frames, high 0.9 -> above 7.2 used, demote to <= 5.6
    for tid in ("p", "q"):
        ctl.hint(tid, "any")
        ctl.pause(tid, write(store, ord(tid), 4, "host"))
        clock.advance(0.1)
    ctl.tick()
    assert store.stats().host_frames_used <= 5
    assert tiers(store, [key(ord("p") * 100 + i) for i in range(4)]) == {Tier.NVME}   # the longer idle


def test_timer_thread_runs_due_work_off_the_caller_thread(store):
    clock = ManualClock()
    pol = Scripted({"x": Decision(Action.OFFLOAD_HOST, demote_at_s=1.0)},
                   lease={"x": Decision(Action.OFFLOAD_NVME)})
    ctl = LifecycleController(store, ForecastSchedule(pol), clock=clock, block_bytes=BLOCK)
    timer = LifecycleTimer(ctl, idle_s=0.01).start()
    try:
        ctl.hint("t", "x")
        keys = write(store, 9, 2, "host")
        ctl.pause("t", keys)
        clock.advance(2)                 # the thread sees the due lease at its next wake-up
        for _ in range(500):
            if ctl.where("t") is Tier.NVME:
                break
            import time
            time.sleep(0.01)
        assert ctl.where("t") is Tier.NVME and tiers(store, keys) == {Tier.NVME}
    finally:
        timer.close()


def test_host_victims_follow_the_real_policys_forecast_not_its_hbm_victim_order(store):
    # a breakeven policy that orders HBM victims by time paused (the simulator's variant
    # breakeven_recency; breakeven orders them by the forecast's remaining wait); kvtier's host
    # frames go by its forecast: "slow" (about 100 s) leaves before "fast" (about 1 s), though
    # "fast" paused first
    import random
    from kvtier.bench.sim.variants import make_sim_policy
    from kvtier.tiering.model.presets import get_node, get_preset
    pol = make_sim_policy("breakeven_recency", geometry=get_preset("llama-3.1-8b"), hardware=get_node("pcie5-x16"))
    rng = random.Random(3)
    for tool, median in (("fast", 1.0), ("slow", 100.0)):
        for _ in range(40):
            pol.observe(tool, median * rng.lognormvariate(0.0, 0.3))
    clock = ManualClock()
    ctl = LifecycleController(store, ForecastSchedule(pol), clock=clock, block_bytes=BLOCK)
    for tid, tool in (("a", "fast"), ("b", "slow")):
        ctl.hint(tid, tool, context_tokens=64)
        assert ctl.pause(tid, write(store, ord(tid), 4, "host")).tier == "host"
        clock.advance(0.5)
    ctx = PauseContext(tool="fast", kv_bytes=4 * BLOCK, context_tokens=64)
    assert pol.victim_priority(ctx, 1.0) > pol.victim_priority(ctx, 0.5)   # its own order: time paused
    assert store.stats().host_frames_used == 8
    assert ctl.make_room(4)
    assert tiers(store, [key(ord("b") * 100 + i) for i in range(4)]) == {Tier.NVME}
    assert tiers(store, [key(ord("a") * 100 + i) for i in range(4)]) == {Tier.HOST}
