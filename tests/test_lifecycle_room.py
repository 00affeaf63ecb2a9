"""Room in kvtier's host frames: who gives it up, how much, and what comes back.

Stories on a real TieredStore (8 host frames) with a ManualClock, like
tests/test_lifecycle.py: a staging takes no more frames from a victim than it
needs (the victim keeps its prefix); a host pause the store's LRU pushed
out for another's write is brought back by forecast; a host pause pushed
out by another's staging is staged back at its lease end if the policy
keeps it in host; a pause a staging displaced comes back as soon as the
one that displaced it pauses again on a longer tool; a trajectory running
for a while gives its frames to a staging, one that just resumed does not.
"""
from __future__ import annotations

from kvtier.util.tiers import Tier
from kvtier.tiering.model.decision import Action, Decision
from kvtier.tiering.lifecycle import ForecastSchedule, LifecycleController, ManualClock
from kvtier.tiering.lifecycle.registry import Event
from kvtier_testutil import key
import test_lifecycle
from test_lifecycle import BLOCK, Scripted, tiers, write


store = test_lifecycle.store     # the 8-frame real store of test_lifecycle.py, one fixture for all three files


def keys_of(tid: str, n: int) -> list[bytes]:
    return [key(ord(tid) * 100 + i) for i in range(n)]


def in_host(store, keys) -> list[bool]:
    return [Tier.HOST in store.where(k) for k in keys]


def test_a_victim_gives_up_only_the_frames_a_staging_needs_its_prefix_stays(store):
    pol = Scripted({"slow": Decision(Action.OFFLOAD_HOST), "fast": Decision(Action.OFFLOAD_NVME, stage_at_s=1.0)},
                   remaining={"slow": 100.0, "fast": 1.0})
    clock = ManualClock()
    ctl = LifecycleController(store, ForecastSchedule(pol), clock=clock, block_bytes=BLOCK)
    ctl.hint("a", "slow")
    ctl.pause("a", write(store, ord("a"), 6, "host"))          # 6 of 8 frames
    ctl.hint("b", "fast")
    ctl.pause("b", write(store, ord("b"), 4, "nvme"))          # wants 4 frames back at 1 s: 2 are free
    clock.set(1.0)
    ctl.tick()
    assert all(in_host(store, keys_of("b", 4)))                # staged
    assert in_host(store, keys_of("a", 6)) == [True] * 4 + [False] * 2   # "a" lost its last 2 blocks only
    assert tiers(store, keys_of("a", 6)[4:]) == {Tier.NVME}   # demoted, not dropped
    assert ctl.where("a") is Tier.HOST                        # most of it is still in DRAM


def test_a_host_pause_the_stores_lru_pushed_out_is_brought_back_by_forecast(store):
    # "soon" (back in about 1 s) is in host frames; "long" (about 60 s) then writes 8
    # blocks to host: the store's LRU pushes "soon" out.  The next tick brings "soon"
    # back, taking the frames from the end of "long", which is expected back later.
    pol = Scripted({"soon": Decision(Action.OFFLOAD_HOST), "long": Decision(Action.OFFLOAD_HOST)},
                   remaining={"soon": 1.0, "long": 60.0})
    clock = ManualClock()
    ctl = LifecycleController(store, ForecastSchedule(pol), clock=clock, block_bytes=BLOCK)
    ctl.hint("s", "soon")
    ctl.pause("s", write(store, ord("s"), 4, "host"))
    ctl.tick()
    ctl.hint("l", "long")
    ctl.pause("l", write(store, ord("l"), 8, "host"))      # the LRU evicts all of "s"
    assert not any(in_host(store, keys_of("s", 4)))
    ctl.tick()
    assert all(in_host(store, keys_of("s", 4)))             # restored
    assert in_host(store, keys_of("l", 8)) == [True] * 4 + [False] * 4   # "l" keeps its prefix
    assert ctl.stats()["restores"] == 1


def test_a_host_pause_pushed_out_is_staged_back_at_its_lease_end(store):
    pol = Scripted({"review": Decision(Action.OFFLOAD_HOST, demote_at_s=10.0),
                    "grep": Decision(Action.OFFLOAD_NVME, stage_at_s=1.0)},
                   lease={"review": Decision(Action.OFFLOAD_HOST)}, remaining={"review": 50.0, "grep": 1.0})
    clock = ManualClock()
    ctl = LifecycleController(store, ForecastSchedule(pol), clock=clock, block_bytes=BLOCK)
    ctl.hint("r", "review")
    ctl.pause("r", write(store, ord("r"), 8, "host"))
    ctl.hint("g", "grep")
    ctl.pause("g", write(store, ord("g"), 8, "nvme"))
    clock.set(1.0)
    ctl.tick()                                                 # "g" staged: "r" (back later) gives way
    assert not any(in_host(store, keys_of("r", 8))) and ctl.where("r") is Tier.NVME
    ctl.hint("g", None)                                        # "g" is back and runs on
    clock.set(10.0)
    ctl.tick()                                                 # "r"'s lease: the policy keeps it in host
    assert not any(in_host(store, keys_of("r", 8)))            # "g" ran for 9 s < release_after_s: it keeps them
    ctl.add_timer("r", 25.0, Event.LEASE)                      # a later lease end (paused at 0)
    clock.set(25.0)
    ctl.tick()                                                 # "g" has run 24 s: its frames go to "r"
    assert all(in_host(store, keys_of("r", 8)))
    assert ctl.where("r") is Tier.HOST
    assert ctl.stats()["released_blocks"] == 8


def _read_displaces_bash(store, clock: ManualClock) -> LifecycleController:
    """"b" (bash, back in about 1 s) holds 6 of 8 frames; "r" (read, about 0.1 s) is staged
    back at its pause and takes 4 of them, from "b"'s end; then "r" is back (0.1 s)."""
    pol = Scripted({"bash": Decision(Action.RETAIN), "read": Decision(Action.RETAIN),
                    "test": Decision(Action.RETAIN)},
                   remaining={"bash": 1.0, "read": 0.1, "test": 60.0})
    ctl = LifecycleController(store, ForecastSchedule(pol), clock=clock, block_bytes=BLOCK)
    ctl.hint("b", "bash")
    ctl.pause("b", write(store, ord("b"), 6, "host"))
    ctl.hint("r", "read")
    ctl.pause("r", write(store, ord("r"), 6, "nvme"))         # its plan is host: staged now
    ctl.tick()
    assert all(in_host(store, keys_of("r", 6)))
    assert in_host(store, keys_of("b", 6)) == [True] * 2 + [False] * 4   # displaced: its end went
    return ctl


def test_a_pause_a_staging_displaced_comes_back_when_the_displacer_pauses_on_a_longer_tool(store):
    # "r" pauses again on "test" (about 60 s): the tick after that pause brings "b" back
    # whole, from "r"'s end
    clock = ManualClock()
    ctl = _read_displaces_bash(store, clock)
    clock.set(0.1)
    ctl.hint("r", "test")                                       # back, and will wait on a test run
    ctl.tick()
    assert in_host(store, keys_of("b", 6)) == [True] * 2 + [False] * 4   # "r" runs: nothing moves
    ctl.pause("r")
    ctl.tick()
    assert all(in_host(store, keys_of("b", 6)))                 # back whole before its return
    assert in_host(store, keys_of("r", 6)) == [True] * 2 + [False] * 4   # "r" keeps its prefix
    assert ctl.stats()["restores"] == 1


def test_a_displaced_pause_stays_out_while_the_displacer_is_expected_back_sooner(store):
    # "r" pauses again on a tool as short as before: "b" is not brought back
    clock = ManualClock()
    ctl = _read_displaces_bash(store, clock)
    clock.set(0.1)
    ctl.hint("r", "read")
    ctl.pause("r")
    ctl.tick()
    assert all(in_host(store, keys_of("r", 6)))
    assert in_host(store, keys_of("b", 6)) == [True] * 2 + [False] * 4
    assert ctl.stats().get("restores", 0) == 0
