"""A host plan's blocks the store pushed down to NVMe come back to host frames
when the schedule says (Schedule.restage_at): breakeven stages them only where
the staging pays over the forecast (tiering/policy/expected.py restage_time);
the baselines at once."""
from __future__ import annotations

import math

import pytest

from kvtier.store.tiered import Tier
from kvtier.tiering.lifecycle import ForecastSchedule, LifecycleController, ManualClock
from kvtier.tiering.model.costmodel import GB, HardwareProfile
from kvtier.tiering.model.decision import Action, Decision, PauseContext
from kvtier.tiering.model.presets import get_preset
from kvtier.tiering.policy.policies import make_policy

import test_lifecycle
from test_lifecycle import BLOCK, Scripted, write

store = test_lifecycle.store     # the 8-frame real store of test_lifecycle.py

GEOM = get_preset("gqa-70b")
TOKENS = 32768
KV = GEOM.kv_bytes(TOKENS)       # 10.7 GB


def node(nvme_read_gbps: float) -> HardwareProfile:
    return HardwareProfile(hbm_bytes=640 * GB, link_h2d_bps=25 * GB, link_d2h_bps=25 * GB, prefill_flops=3560e12,
                           nvme_read_bps=nvme_read_gbps * GB, host_bytes=1000 * GB)


def policy(nvme_read_gbps: float, waits: list[float]):
    p = make_policy("breakeven", geometry=GEOM, hardware=node(nvme_read_gbps))
    for w in waits * 20:
        p.observe("tool", w)
    return p


def ctx(free_gb: float = 500.0) -> PauseContext:
    return PauseContext(tool="tool", kv_bytes=KV, context_tokens=TOKENS, host_free_bytes=free_gb * GB,
                        evictable=False)


# ---------------------------------------------------------------- the price
def test_a_slow_disk_and_a_short_wait_stage_at_once():
    # 10.7 GB read at 2 GB/s is a 5 s stall the staging takes off the resume; the tool is back in 30-40 s
    p = policy(2.0, [30.0, 35.0, 40.0])
    assert p.restage_at(ctx(), 0.0) == 0.0
    assert p.restage_at(ctx(), 12.5) == 12.5          # later in the pause: now, seconds after the pause


def test_a_disk_as_fast_as_the_link_never_stages():
    p = policy(25.0, [30.0, 35.0, 40.0])              # an NVMe read is no slower than the link
    assert p.restage_at(ctx(), 0.0) is None


def test_in_nearly_full_dram_only_a_slow_disk_pays_for_the_staging():
    # the host tier 98% full: DRAM is dear; the tool is back in 30-40 s
    assert policy(2.0, [30.0, 35.0, 40.0]).restage_at(ctx(free_gb=20.0), 0.0) == 0.0   # saves a 5 s read
    assert policy(20.0, [30.0, 35.0, 40.0]).restage_at(ctx(free_gb=20.0), 0.0) is None  # saves 0.1 s


def test_an_hour_in_nearly_full_dram_costs_more_than_the_read_it_saves():
    p = policy(2.0, [3000.0, 3600.0])
    assert p.restage_at(ctx(free_gb=20.0), 0.0) is None
    assert p.restage_at(ctx(free_gb=500.0), 0.0) == 0.0   # half-empty DRAM is nearly free


def test_bad_elapsed_is_refused_and_the_baselines_stage_at_once():
    with pytest.raises(ValueError):
        policy(2.0, [30.0]).restage_at(ctx(), -1.0)
    with pytest.raises(ValueError):
        policy(2.0, [30.0]).restage_at(ctx(), math.nan)
    for name in ("eager", "point"):
        assert make_policy(name, geometry=GEOM, hardware=node(2.0)).restage_at(ctx(), 3.0) == 3.0


# ---------------------------------------------------------------- the controller on a real store
class Restage(Scripted):
    """A scripted policy whose restage time is given (None: never)."""

    def __init__(self, decisions: dict, restage: float | None) -> None:
        super().__init__(decisions, remaining={"host": 1.0, "filler": 60.0})
        self.restage = restage

    def restage_at(self, ctx, elapsed_s):
        return None if self.restage is None else max(elapsed_s, self.restage)


def pushed_out_then_paused_again(store, restage: float | None):
    """"a" pauses in host frames, a longer pause's write pushes it to NVMe,
    "a" runs again and pauses on a host plan: its first blocks sit on NVMe."""
    pol = Restage({"host": Decision(Action.OFFLOAD_HOST), "filler": Decision(Action.OFFLOAD_HOST)}, restage)
    clock = ManualClock()
    ctl = LifecycleController(store, ForecastSchedule(pol), clock=clock, block_bytes=BLOCK)
    ctl.hint("a", "host")
    first = write(store, 1, 4, "host")
    ctl.pause("a", first)
    ctl.tick()
    ctl.hint("f", "filler")
    ctl.pause("f", write(store, 2, 8, "host"))         # the 8-frame tier: "a" goes down to NVMe
    assert all(Tier.HOST not in store.where(k) for k in first)
    ctl.hint("a", "host")                              # "a" is back, runs, and pauses again
    timed = ctl.stats().get("stagings_timed", 0)
    ctl.pause("a", first)
    return ctl, clock, first, ctl.stats().get("stagings_timed", 0) - timed


def test_a_priced_out_staging_leaves_the_blocks_on_nvme(store):
    ctl, clock, first, _ = pushed_out_then_paused_again(store, None)
    clock.advance(1.0)
    ctl.tick()
    assert all(Tier.HOST not in store.where(k) for k in first)
    s = ctl.stats()
    assert s.get("stagings_priced_out", 0) >= 1 and s.get("staged_blocks", 0) == 0


def test_a_later_restage_time_arms_a_timer(store):
    ctl, clock, first, timed = pushed_out_then_paused_again(store, 5.0)
    assert timed == 1
    ctl.tick()
    assert all(Tier.HOST not in store.where(k) for k in first)   # not yet
    clock.advance(5.0)
    ctl.tick()
    assert all(Tier.HOST in store.where(k) for k in first)       # back in host frames at its time


def test_at_once_stages_on_the_next_tick(store):
    ctl, clock, first, timed = pushed_out_then_paused_again(store, 0.0)
    assert timed == 0
    ctl.tick()
    assert all(Tier.HOST in store.where(k) for k in first)
