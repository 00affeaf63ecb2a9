"""A pause's tool learned late (a router's retag) on the real controller and a real TieredStore.

Each story: a trajectory is hinted with a forecast tool, the router's correction lands
before or after the response ends, and the pause's plan, timers, blocks and learned
wait follow the true tool.  A ManualClock drives the timers (``tick``)."""
from __future__ import annotations

import pytest

from kvtier.store import StoreConfig, TieredStore
from kvtier.tiering.lifecycle import ForecastSchedule, LifecycleController, ManualClock
from kvtier.tiering.lifecycle.retag import Retagged
from kvtier.tiering.model.decision import Action, Decision
from kvtier.util.tiers import Tier
from kvtier_testutil import key, random_block
from test_lifecycle import BLOCK, Scripted, tiers

# the forecast ("edit") is kept in host frames under a long lease; the true tool ("pytest") goes to NVMe,
# staged back at 30 s; "ls" is cheaper to recompute
DECISIONS = {"edit": Decision(Action.OFFLOAD_HOST, demote_at_s=100.0),
             "pytest": Decision(Action.OFFLOAD_NVME, stage_at_s=30.0),
             "ls": Decision(Action.RECOMPUTE)}


@pytest.fixture
def store(tmp_path):
    with TieredStore.open(StoreConfig(root=tmp_path / "s", host_bytes=16 * BLOCK, nvme_bytes=64 * BLOCK,
                                      block_bytes=BLOCK)) as s:
        yield s
        s.check_integrity()


def controller(store):
    pol = Scripted(DECISIONS)
    clock = ManualClock()
    return LifecycleController(store, ForecastSchedule(pol), clock=clock, block_bytes=BLOCK), pol, clock


def stored(store, ctl, tid: str, n: int) -> list[bytes]:
    """One store job of ``tid``: its plan places the blocks (as the vLLM plugin's ``place``)."""
    keys = [key(1000 + i) for i in range(n)]
    plan = ctl.plan_blocks(tid, keys, tokens_per_block=16)
    store.put_many(keys, [random_block(1000 + i, BLOCK) for i in range(n)], tier=plan.tier)
    return keys


def test_a_retag_after_the_pause_started_replans_it_on_the_true_tool(store):
    ctl, pol, clock = controller(store)
    ctl.hint("t", "edit")                                   # the router's forecast
    keys = stored(store, ctl, "t", 4)
    assert ctl.pause("t").action == "offload_host"          # planned on the forecast: host frames, lease at 100 s
    ctl.tick()
    assert tiers(store, keys) == {Tier.HOST}
    clock.advance(0.05)
    # the response named pytest: re-planned now, the host lease cancelled, the blocks demoted at once
    assert ctl.retag("t", "pytest", forecast="edit") is Retagged.REPLANNED
    assert ctl.plan_for("t").action == "offload_nvme" and ctl.decision("t").action is Action.OFFLOAD_NVME
    ctl.tick()
    assert tiers(store, keys) == {Tier.NVME} and ctl.where("t") is Tier.NVME
    clock.set(30.0)                                         # the true plan's staging, timed from the pause
    ctl.tick()
    assert all(Tier.HOST in store.where(k) for k in keys) and ctl.where("t") is Tier.HOST
    clock.set(100.0)                                        # the forecast plan's lease never fires
    assert ctl.tick() == 0 and ctl.counter_values().get("leases", 0) == 0
    # the resume learns the wait under the true tool
    ctl.hint("t", "ls")
    ctl.learn()
    assert pol.observed == [("pytest", pytest.approx(100.0))]
    assert ctl.counter_values()["retag:replanned"] == 1


def test_a_retag_before_the_response_ends_makes_the_pause_plan_on_the_true_tool(store):
    ctl, pol, clock = controller(store)
    ctl.hint("t", "edit")
    keys = stored(store, ctl, "t", 2)                       # the first store job: planned on the forecast
    assert tiers(store, keys) == {Tier.HOST}
    assert ctl.retag("t", "pytest", forecast="edit") is Retagged.NOTED   # the name came early in the stream
    more = stored(store, ctl, "t", 4)[2:]                   # later store jobs follow the true plan
    assert tiers(store, more) == {Tier.NVME}
    assert ctl.pause("t").action == "offload_nvme"          # the pause starts on the true tool
    ctl.tick()
    assert tiers(store, keys + more) == {Tier.NVME}         # the forecast's host blocks demoted at the pause
    assert ctl.counter_values()["decision:offload_nvme"] == 1


def test_retags_that_do_not_apply_change_nothing(store):
    ctl, pol, clock = controller(store)
    assert ctl.retag("nobody", "pytest", forecast="edit") is Retagged.UNKNOWN
    assert ctl.stats()["trajectories"] == 0                 # an unknown id creates nothing
    ctl.hint("t", "edit")
    stored(store, ctl, "t", 2)
    ctl.pause("t")
    assert ctl.retag("t", "edit", forecast="edit") is Retagged.SAME
    # the trajectory moved on (its next request came first, with another forecast): stale
    assert ctl.retag("t", "pytest", forecast="grep") is Retagged.STALE
    assert ctl.plan_for("t").action == "offload_host"
    # one correction per pause: a flood of retags re-plans once
    assert ctl.retag("t", "ls", forecast="edit") is Retagged.REPLANNED
    for _ in range(1000):
        assert ctl.retag("t", "pytest", forecast="ls") is Retagged.REPEATED
    assert ctl.plan_for("t").action == "recompute"
    c = ctl.counter_values()
    assert (c["retag:unknown"], c["retag:same"], c["retag:stale"], c["retag:repeated"]) == (1, 1, 1, 1000)
    # the next pause may be corrected again
    ctl.hint("t", "edit")
    ctl.pause("t")
    assert ctl.retag("t", "pytest", forecast="edit") is Retagged.REPLANNED
