"""Forgetting idle trajectories (tiering/lifecycle/pruning.py) on a real TieredStore.

A long-running engine sees a new session id for every agent; without
forgetting, the registry (and every scan of it) grows with all of them.
Stories with a ManualClock: an idle running trajectory with nothing in host
frames is forgotten, one that still holds DRAM is kept until its frames go,
a paused one is kept however long it waits, a touch restarts the idle time,
the cap forgets the oldest first (timers too), and an id that comes back
after being forgotten is a new trajectory that pauses and resumes as any.
"""
from __future__ import annotations

import pytest

from kvtier.util.tiers import Tier
from kvtier.tiering.model.decision import Action, Decision
from kvtier.tiering.lifecycle import ForecastSchedule, LifecycleController, ManualClock
from kvtier.tiering.lifecycle.pruning import Pruner
from kvtier.tiering.lifecycle.registry import Event
import test_lifecycle
from test_lifecycle import BLOCK, Scripted, write

store = test_lifecycle.store     # the 8-frame real store of test_lifecycle.py


def controller(store, pruner: Pruner, decisions=None):
    pol = Scripted(decisions or {"bash": Decision(Action.OFFLOAD_NVME), "edit": Decision(Action.OFFLOAD_HOST)})
    clock = ManualClock()
    return LifecycleController(store, ForecastSchedule(pol), clock=clock, block_bytes=BLOCK, pruner=pruner), clock, pol


def session(ctl, store, tid: str, n: int, tier: str, tool: str = "bash") -> list[bytes]:
    """One round: hinted, blocks written, paused; then resumed (running again)."""
    ctl.hint(tid, tool)
    keys = write(store, sum(map(ord, tid)), n, tier)
    ctl.pause(tid, keys)
    ctl.hint(tid, None)       # the next request: resumed, running
    return keys


def known(ctl) -> set[str]:
    return {t.tid for t in ctl.shared.reg}


def test_an_idle_running_trajectory_is_forgotten_its_blocks_stay_in_the_store(store):
    ctl, clock, _ = controller(store, Pruner(forget_after_s=100.0, every_s=1.0))
    keys = session(ctl, store, "a", 3, "nvme")
    clock.set(99.0)
    ctl.tick()
    assert known(ctl) == {"a"}                    # not idle long enough
    clock.set(101.0)
    ctl.tick()
    assert known(ctl) == set() and ctl.stats()["forgotten"] == 1
    assert all(store.contains(k) for k in keys)   # forgetting moves no bytes


def test_an_idle_trajectory_holding_host_frames_is_kept_until_they_go(store):
    ctl, clock, _ = controller(store, Pruner(forget_after_s=10.0, every_s=0.0))
    keys = session(ctl, store, "h", 4, "host", tool="edit")
    assert all(Tier.HOST in store.where(k) for k in keys)
    clock.set(50.0)
    ctl.tick()
    assert "h" in known(ctl)                       # its DRAM still counts in the host decisions
    store.demote(keys)                             # its frames given up (a victim, released)
    clock.set(200.0)                               # past the recheck of a holder (60 s)
    ctl.tick()
    assert "h" not in known(ctl)


def test_a_paused_trajectory_is_not_forgotten_however_long_it_waits(store):
    ctl, clock, pol = controller(store, Pruner(forget_after_s=10.0, every_s=0.0))
    ctl.hint("p", "bash")
    ctl.pause("p", write(store, 7, 2, "nvme"))
    clock.set(10_000.0)
    ctl.tick()
    assert ctl.where("p") is Tier.NVME
    ctl.hint("p", None)                            # back after 10,000 s: the wait is fed back
    assert ctl.learn() == 1 and pol.observed == [("bash", 10_000.0)]


def test_a_touch_restarts_the_idle_time(store):
    ctl, clock, _ = controller(store, Pruner(forget_after_s=100.0, every_s=0.0))
    session(ctl, store, "t", 2, "nvme")
    clock.set(90.0)
    ctl.add_blocks("t", write(store, 99, 1, "nvme"))   # a store job of its running request
    clock.set(150.0)
    ctl.tick()
    assert "t" in known(ctl)                       # 60 s since the touch
    clock.set(191.0)
    ctl.tick()
    assert "t" not in known(ctl)


def test_the_cap_forgets_running_ones_untouched_longest_then_paused_ones_with_their_timers(store):
    pol_decisions = {"bash": Decision(Action.OFFLOAD_NVME, stage_at_s=50.0)}
    ctl, clock, _ = controller(store, Pruner(forget_after_s=1e9, max_trajectories=2, every_s=0.0), pol_decisions)
    ctl.hint("old", "bash")
    ctl.pause("old", write(store, 1, 1, "nvme"))       # paused first: its staging timer at 50 s
    clock.set(1.0)
    session(ctl, store, "r1", 1, "nvme")
    clock.set(2.0)
    session(ctl, store, "r2", 1, "nvme")
    clock.set(3.0)
    ctl.hint("new", "bash")
    ctl.pause("new", write(store, 4, 1, "nvme"))
    ctl.tick()                                         # 4 known, cap 2: r1 then r2 go
    assert known(ctl) == {"old", "new"}
    ctl.moves.pruner.max_trajectories = 1
    ctl.tick()
    assert known(ctl) == {"new"}                       # then the pause paused longest
    assert all(tid != "old" for _, tid, _, _ in ctl.shared.reg.pending())
    # the id comes back: a new trajectory, whose first pause is not the old one's timer's
    ctl.hint("old", "bash")
    ctl.pause("old", write(store, 5, 1, "nvme"))
    clock.set(10.0)
    ctl.tick()
    assert ctl.where("old") is Tier.NVME and ctl.block_count("old") == 1   # only the blocks written since


def test_registry_stays_bounded_over_many_sessions(store):
    ctl, clock, _ = controller(store, Pruner(forget_after_s=5.0, max_trajectories=50, every_s=1.0))
    for i in range(400):
        session(ctl, store, f"s{i}", 1, "nvme")
        clock.advance(0.5)
        ctl.tick()
        assert ctl.stats()["trajectories"] <= 50 + 2              # pruned as it goes (a run every clock second)
    assert ctl.stats()["forgotten"] >= 340


def test_bad_pruner_settings_are_rejected():
    with pytest.raises(ValueError):
        Pruner(forget_after_s=-1.0)
    with pytest.raises(ValueError):
        Pruner(max_trajectories=0)
    with pytest.raises(ValueError):
        Pruner(every_s=float("nan"))


def test_the_registry_benchmark_runs_both_ways_and_forgets_every_finished_session(tmp_path):
    from kvtier.bench.bench_registry import run
    doc = run(sessions=300, blocks=4, data_dir=tmp_path)
    keep, prune = doc["keep"], doc["prune"]
    assert keep["registry_after_pruning"] == 300 and keep["forgotten"] == 0
    assert prune["registry_after_pruning"] == 0 and prune["forgotten"] >= 300
    assert prune["traced_mib_now"] < keep["traced_mib_now"]
    assert list(tmp_path.iterdir()) == []                 # its stores are removed


def test_the_registry_benchmark_rejects_bad_input():
    from kvtier.bench.bench_registry import main, run
    with pytest.raises(ValueError):
        run(sessions=0)
    with pytest.raises(SystemExit):
        main(["--sessions", "0"])


def test_registry_forget_takes_one_id_or_many_and_their_timers():
    from kvtier.tiering.lifecycle.registry import Registry
    reg = Registry()
    for tid in ("ab", "c", "d"):
        reg.schedule(1.0, reg.get_or_create(tid), Event.STAGE)
    reg.forget("ab")                          # one id (not its characters)
    assert {t.tid for t in reg} == {"c", "d"} and len(reg._timers) == 2
    reg.forget(["c", "zz"])
    assert {t.tid for t in reg} == {"d"} and [x[2] for x in reg._timers] == ["d"]
