"""Engine loads first: the lifecycle's stagings and demotions step aside while
an engine load is in progress, run in slices, and stop when the trajectory
they move resumes.  Real TieredStore, real controller, a ManualClock."""
from __future__ import annotations

import threading
import time
from collections import deque

from kvtier.util.tiers import Tier
from kvtier.tiering.model.decision import Action, Decision
from kvtier.tiering.lifecycle import ForecastSchedule, LifecycleController, ManualClock
from kvtier.tiering.lifecycle.foreground import Foreground
from test_lifecycle import BLOCK, Scripted, store, tiers, write  # noqa: F401  (store: the fixture)


def staged_later(store, n: int = 4):
    """A trajectory paused to NVMe with a staging due at 10 s, and its controller."""
    pol = Scripted({"build": Decision(Action.OFFLOAD_NVME, stage_at_s=10.0)})
    clock = ManualClock()
    ctl = LifecycleController(store, ForecastSchedule(pol), clock=clock, block_bytes=BLOCK)
    ctl.hint("t", "build")
    keys = write(store, 3, n, "nvme")
    ctl.pause("t", keys)
    ctl.tick()
    assert tiers(store, keys) == {Tier.NVME}
    clock.set(10.0)
    return ctl, keys


def test_a_staging_waits_for_an_engine_load_in_progress(store):
    ctl, keys = staged_later(store)
    ctl.foreground = fg = Foreground(max_wait_s=60.0)
    ctl.move_log = deque()
    done = threading.Event()
    with fg.loading():                           # an engine load is running
        th = threading.Thread(target=lambda: (ctl.tick(), done.set()))
        th.start()
        time.sleep(0.3)
        # the staging is due but waits for the load: nothing moved yet
        assert not done.is_set() and tiers(store, keys) == {Tier.NVME} and not ctl.move_log
    th.join(10)                                  # the load ended: the staging runs
    assert done.is_set() and all(Tier.HOST in store.where(k) for k in keys)
    assert ctl.where("t") is Tier.HOST
    assert fg.stats()["yields"] >= 1 and fg.stats()["loads"] == 1
    assert [m[2] for m in ctl.move_log] == ["stage"] and ctl.move_log[0][4] == len(keys)


def test_a_waiting_move_is_delayed_not_starved(store):
    ctl, keys = staged_later(store)
    ctl.foreground = fg = Foreground(max_wait_s=0.05)
    with fg.loading():                           # a load that outlasts the bound
        ctl.tick()
        assert all(Tier.HOST in store.where(k) for k in keys)
    # it waited (the slice, and the staging's lookups of where the blocks are), each wait bounded
    assert 1 <= fg.stats()["yields"] <= 3


class ResumeOnSecondSlice(Foreground):
    """A gate whose second wait is the moment the trajectory comes back (a real
    resume, called where a staging would be racing it)."""

    def __init__(self, ctl: LifecycleController, tid: str) -> None:
        super().__init__()
        self.ctl, self.tid, self.calls = ctl, tid, 0

    def wait_idle(self) -> float:
        self.calls += 1
        if self.calls == 2:
            self.ctl.resume(self.tid)
        return 0.0


def test_a_staging_stops_when_its_trajectory_resumes(store):
    ctl, keys = staged_later(store, n=4)
    ctl.moves.io.slice_bytes = BLOCK                      # one block per slice
    ctl.foreground = ResumeOnSecondSlice(ctl, "t")
    ctl.tick()
    in_host = [Tier.HOST in store.where(k) for k in keys]
    assert in_host == [True, False, False, False]     # the first slice, then the resume ended it
    assert ctl.where("t") is None and ctl.stats()["staged_blocks"] == 1


def test_a_demotion_runs_in_slices_and_stops_at_a_resume(store):
    pol = Scripted({"x": Decision(Action.OFFLOAD_HOST, demote_at_s=1.0)},
                   lease={"x": Decision(Action.OFFLOAD_NVME)})
    clock = ManualClock()
    ctl = LifecycleController(store, ForecastSchedule(pol), clock=clock, block_bytes=BLOCK)
    ctl.hint("t", "x")
    keys = write(store, 5, 4, "host")
    ctl.pause("t", keys)
    ctl.tick()
    ctl.moves.io.slice_bytes = 2 * BLOCK
    ctl.move_log = deque()
    ctl.foreground = ResumeOnSecondSlice(ctl, "t")
    clock.advance(1.5)
    ctl.tick()                                   # lease end -> demote: one slice of 2, then the resume
    assert [m[2] for m in ctl.move_log] == ["demote"] and ctl.move_log[0][4] == 2
    assert [store.where(k) == frozenset({Tier.NVME}) for k in keys] == [True, True, False, False]
    assert ctl.where("t") is None


def test_a_staging_does_not_slip_into_the_gap_between_two_engine_calls(store):
    # one resume is several engine calls (SGLang: batch_exists, then batch_get_v1)
    ctl, keys = staged_later(store)
    ctl.foreground = fg = Foreground(max_wait_s=60.0, quiet_s=0.5)
    done = threading.Event()
    with fg.loading():
        th = threading.Thread(target=lambda: (ctl.tick(), done.set()))
        th.start()
        time.sleep(0.1)
    with fg.loading():                           # the next call of the same resume, at once
        time.sleep(0.3)
        assert not done.is_set() and tiers(store, keys) == {Tier.NVME}
    th.join(10)                                  # quiet after the last call: the staging runs
    assert done.is_set() and all(Tier.HOST in store.where(k) for k in keys)


def test_an_engine_lookup_marked_with_touch_holds_a_staging_back_like_a_load(store):
    # most of a vLLM resume is its per-chunk lookups, between and before its load jobs
    ctl, keys = staged_later(store)
    ctl.foreground = fg = Foreground(max_wait_s=60.0, quiet_s=0.3)
    fg.touch()
    assert not fg.idle() and not fg.busy()       # no load in progress, but an engine call just now
    t0 = time.perf_counter()
    ctl.tick()                                   # due now; runs once quiet_s passed since the touch
    assert time.perf_counter() - t0 >= 0.25
    assert all(Tier.HOST in store.where(k) for k in keys) and fg.stats()["yields"] >= 1
    assert fg.idle()


def test_touches_keep_a_staging_waiting_until_they_stop(store):
    ctl, keys = staged_later(store)
    ctl.foreground = fg = Foreground(max_wait_s=60.0, quiet_s=0.2)
    done = threading.Event()
    fg.touch()
    th = threading.Thread(target=lambda: (ctl.tick(), done.set()))
    th.start()
    for _ in range(8):                           # lookups every 0.1 s for 0.8 s: never 0.2 s quiet
        time.sleep(0.1)
        assert not done.is_set() and tiers(store, keys) == {Tier.NVME}
        fg.touch()
    th.join(10)
    assert done.is_set() and all(Tier.HOST in store.where(k) for k in keys)


def test_a_prefill_step_holds_a_staging_back_until_the_next_step(store):
    # a CPU engine's prefill runs on the cores the moves use: the step that schedules it holds them
    ctl, keys = staged_later(store)
    ctl.foreground = fg = Foreground(max_wait_s=60.0, quiet_s=0.05)
    done = threading.Event()
    fg.step(True)                                # the engine scheduled a new request's prefill
    assert not fg.idle() and not fg.busy()       # no load, but a prefill step runs
    th = threading.Thread(target=lambda: (ctl.tick(), done.set()))
    th.start()
    time.sleep(0.3)
    assert not done.is_set() and tiers(store, keys) == {Tier.NVME}
    fg.step(False)                               # the next step (a decode): the prefill is done
    th.join(10)
    assert done.is_set() and all(Tier.HOST in store.where(k) for k in keys)
    assert fg.stats()["prefill_steps"] == 1 and fg.stats()["yields"] >= 1


def test_steps_without_a_prefill_hold_nothing_back(store):
    ctl, keys = staged_later(store)
    ctl.foreground = fg = Foreground(max_wait_s=1.0, quiet_s=1.0)
    for _ in range(3):
        fg.step(False)                           # decode steps, no prefill before them
    assert fg.idle()
    ctl.tick()                                   # a step that counted would make it wait (a yield)
    assert all(Tier.HOST in store.where(k) for k in keys)
    assert fg.stats() == {"loads": 0, "yields": 0, "yield_s": 0.0, "prefill_steps": 0}


def test_a_prefill_step_the_engine_never_follows_holds_moves_at_most_max_wait(store):
    # an engine that goes idle after a prefill step calls no next step: the hold ends on its own
    ctl, keys = staged_later(store)
    ctl.foreground = fg = Foreground(max_wait_s=0.2, quiet_s=0.0)
    fg.step(True)
    ctl.tick()
    assert all(Tier.HOST in store.where(k) for k in keys)
    time.sleep(0.25)
    assert fg.idle()
