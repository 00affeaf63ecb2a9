"""Host-frame victims at write time: the store's eviction order, and the
lifecycle controller's order installed on a real TieredStore.

The store (8 host frames) evicts by recency unless an order is set; with one
it takes the named blocks first (skipping blocks not in host frames and
pinned ones), then LRU.  A forecast schedule names only contexts larger than
the whole host tier (OversizeVictims): their own blocks give way first, so
such a write never pushes out a pause that fits; once paused, its stagings
displace only pauses expected back later than it, as any staging.  The TTL
schedule (vLLM's lifecycle) keeps the LRU.

Locks: the store reads the order before it takes its own lock, so the
controller's lock (which the order takes) is never taken while the store's is
held (the last two tests).
"""
from __future__ import annotations

import threading

import pytest

from kvtier.store.tiered import Tier
from kvtier.tiering.model.decision import Action, Decision
from kvtier.tiering.lifecycle import ForecastSchedule, LifecycleController, ManualClock, TTLSchedule
from kvtier.tiering.lifecycle.victims import OversizeVictims
from kvtier_testutil import key, random_block
import test_lifecycle
from test_lifecycle import BLOCK, Scripted, write


store = test_lifecycle.store     # the 8-frame real store of test_lifecycle.py, one fixture for all three files


def keys_of(tid: int, n: int) -> list[bytes]:
    return [key(tid * 100 + i) for i in range(n)]


def in_host(store, keys) -> list[bool]:
    return [Tier.HOST in store.where(k) for k in keys]


def test_the_store_evicts_by_a_set_order_first_then_lru_and_loses_nothing(store):
    a, b = write(store, 1, 4, "host"), write(store, 2, 4, "host")      # 8 of 8 frames; LRU: a first
    store.set_host_victim_order(lambda: [key(999)] + b[::-1])         # an unknown key is skipped
    write(store, 3, 2, "host")
    assert in_host(store, a) == [True] * 4                             # not the LRU's choice
    assert in_host(store, b) == [True, True, False, False]             # b's end first
    assert all(Tier.NVME in store.where(k) for k in b[2:])             # demoted, not dropped
    store.set_host_victim_order(None)                                  # back to LRU
    write(store, 4, 2, "host")
    assert in_host(store, a) == [False, False, True, True]


def test_a_pinned_or_failing_order_falls_back_to_lru(store):
    a, b = write(store, 1, 4, "host"), write(store, 2, 4, "host")
    store.pin(b)
    store.set_host_victim_order(lambda: b)                             # all pinned: LRU takes a
    write(store, 3, 2, "host")
    assert in_host(store, b) == [True] * 4 and in_host(store, a) == [False, False, True, True]
    store.unpin(b)

    def broken():
        raise RuntimeError("no order")
    store.set_host_victim_order(broken)
    write(store, 4, 2, "host")                                         # LRU again: a's next two
    assert in_host(store, a) == [False] * 4


def _pause(ctl, store, tid: int, tool: str, n: int) -> list[bytes]:
    name = str(tid)
    ctl.hint(name, tool)
    plan = ctl.plan_for(name, context_tokens=n * 64)
    keys = keys_of(tid, n)
    ctl.add_blocks(name, keys)
    write(store, tid, n, plan.tier)
    ctl.pause(name)
    return keys


@pytest.mark.parametrize("schedule", ["ttl", "forecast default"])
def test_the_ttl_schedule_and_the_default_keep_the_stores_lru(store, schedule):
    sch = TTLSchedule() if schedule == "ttl" else ForecastSchedule(Scripted({"any": Decision(Action.OFFLOAD_HOST)}))
    ctl = LifecycleController(store, sch, clock=ManualClock(), block_bytes=BLOCK)
    assert ctl.victims is None if schedule == "ttl" else isinstance(ctl.victims, OversizeVictims)
    first = _pause(ctl, store, 1, "any", 4)
    _pause(ctl, store, 2, "any", 4)
    _pause(ctl, store, 3, "any", 2)
    assert in_host(store, first) == [False, False, True, True]        # oldest first, as vLLM's lifecycle


def _write_oversize(ctl, store, tid: int, n: int) -> list[bytes]:
    """A running trajectory writing ``n`` host blocks in batches of 2 (as a plugin's put_many steps)."""
    name = str(tid)
    ctl.hint(name, "big")
    ctl.plan_for(name, context_tokens=n * 64)
    keys = keys_of(tid, n)
    ctl.add_blocks(name, keys)
    for lo in range(0, n, 2):
        store.put_many(keys[lo:lo + 2], [random_block(tid * 100 + i, BLOCK) for i in range(lo, min(n, lo + 2))],
                       tier="host")
    return keys


def test_a_context_larger_than_the_host_tier_pushes_out_its_own_blocks_not_a_pause_that_fits(store):
    pol = Scripted({t: Decision(Action.OFFLOAD_HOST) for t in ("small", "big")},
                   remaining={"small": 100.0, "big": 0.1})   # the big one is even expected back sooner
    ctl = LifecycleController(store, ForecastSchedule(pol), clock=ManualClock(), block_bytes=BLOCK)
    small = _pause(ctl, store, 1, "small", 4)                 # 4 of 8 frames
    big = _write_oversize(ctl, store, 2, 10)                  # 10 > 8 frames: the LRU would push out `small`
    assert in_host(store, small) == [True] * 4
    assert sum(in_host(store, big)) == 4                      # the 4 free frames, its overflow on NVMe
    assert all(store.where(k) for k in big)                   # nothing lost
    assert isinstance(ctl.victims, OversizeVictims) and ctl.victims.refreshes >= 1
    ctl.pause("2")
    ctl.tick()                                                # paused, expected back sooner: its staging
    assert in_host(store, small) == [False] * 4               # displaces the pause expected back later
    assert sum(in_host(store, big)) == 8 and all(store.where(k) for k in small + big)


def test_a_paused_oversize_context_displaces_no_pause_expected_back_sooner(store):
    pol = Scripted({t: Decision(Action.OFFLOAD_HOST) for t in ("small", "big")},
                   remaining={"small": 0.1, "big": 100.0})
    ctl = LifecycleController(store, ForecastSchedule(pol), clock=ManualClock(), block_bytes=BLOCK)
    small = _pause(ctl, store, 1, "small", 4)
    big = _write_oversize(ctl, store, 2, 10)
    ctl.pause("2")
    ctl.tick()                                                # its staging at the pause comes up short
    assert in_host(store, small) == [True] * 4 and sum(in_host(store, big)) == 4
    assert ctl.counters["stage_short"] == 1


def test_without_an_oversize_context_the_default_order_is_the_lru(store):
    pol = Scripted({"x": Decision(Action.OFFLOAD_HOST)})
    ctl = LifecycleController(store, ForecastSchedule(pol), clock=ManualClock(), block_bytes=BLOCK)
    first = _pause(ctl, store, 1, "x", 4)
    _pause(ctl, store, 2, "x", 4)
    assert ctl.victims() is None                              # the store walks its LRU
    _pause(ctl, store, 3, "x", 8)                             # exactly the host tier: fits, may displace anyone
    assert in_host(store, first) == [False] * 4
    assert ctl.victims() is None


def test_a_staging_that_came_up_short_is_tried_again_as_frames_come_free(store):
    pol = Scripted({t: Decision(Action.OFFLOAD_HOST) for t in ("small", "big")},
                   remaining={"small": 0.1, "big": 100.0})
    clock = ManualClock()
    ctl = LifecycleController(store, ForecastSchedule(pol), clock=clock, block_bytes=BLOCK)
    _pause(ctl, store, 1, "small", 4)
    big = _write_oversize(ctl, store, 2, 10)
    ctl.pause("2")
    ctl.tick()                                   # short: the paused 4-block trajectory keeps its frames
    assert sum(in_host(store, big)) == 4
    ctl.hint("1", "small")                       # it resumes (a new request) and runs on
    clock.advance(ctl.moves.restage_every_s)
    ctl.tick()                                   # tried again: it has not run long enough to give way
    assert sum(in_host(store, big)) == 4
    clock.advance(ctl.moves.release_after_s)
    ctl.tick()                                   # it has: its frames go to the staging
    assert sum(in_host(store, big)) == 8
    assert ctl.counters["stage_short"] >= 2 and ctl.counters["staged_blocks"] == 4


def test_a_context_announced_larger_than_the_host_tier_gives_way_from_its_first_batch(store):
    """vLLM's way: each store job hands its batch's blocks with the plugin's tokens per
    block (plan_blocks); the hint announced the whole context."""
    pol = Scripted({t: Decision(Action.OFFLOAD_HOST) for t in ("small", "big")},
                   remaining={"small": 100.0, "big": 0.1})
    ctl = LifecycleController(store, ForecastSchedule(pol), clock=ManualClock(), block_bytes=BLOCK)
    ctl.hint("1", "small")
    small = keys_of(1, 4)
    write(store, 1, 4, ctl.plan_blocks("1", small, tokens_per_block=64).tier)   # 64 tokens per block
    ctl.pause("1")
    ctl.hint("2", "big", context_tokens=10 * 64)
    big = keys_of(2, 10)
    for lo in range(0, 10, 2):
        ctl.plan_blocks("2", big[lo:lo + 2], tokens_per_block=64)
        store.put_many(big[lo:lo + 2], [random_block(200 + i, BLOCK) for i in range(lo, lo + 2)], tier="host")
    assert in_host(store, small) == [True] * 4
    assert sum(in_host(store, big)) == 4 and all(store.where(k) for k in big)


def test_a_timed_staging_of_an_oversize_pause_displaces_pauses_expected_back_later(store):
    from kvtier.tiering.lifecycle import Event
    pol = Scripted({t: Decision(Action.OFFLOAD_HOST) for t in ("small", "big")},
                   remaining={"small": 100.0, "big": 0.1})
    ctl = LifecycleController(store, ForecastSchedule(pol), clock=ManualClock(), block_bytes=BLOCK)
    small = _pause(ctl, store, 1, "small", 4)
    big = _write_oversize(ctl, store, 2, 10)
    ctl.pause("2")
    ctl.tick()                                   # the pause's own restaging displaces `small` too
    assert in_host(store, small) == [False] * 4 and sum(in_host(store, big)) == 8
    assert ctl.add_timer("2", 0.0, Event.STAGE)  # a policy's staging ahead of the return: nothing left to move
    ctl.tick()
    assert in_host(store, small) == [False] * 4 and sum(in_host(store, big)) == 8


def test_the_store_reads_its_victim_order_without_holding_its_lock(store):
    a, b = write(store, 1, 4, "host"), write(store, 2, 4, "host")      # 8 of 8 frames
    held: list[bool] = []

    def order():
        held.append(store.parts.table.lock._is_owned())               # the store's (re-entrant) lock
        return b[::-1]
    store.set_host_victim_order(order)
    write(store, 3, 2, "host")                                         # evicts: the order is asked
    assert held and not any(held)
    assert in_host(store, b) == [True, True, False, False] and all(in_host(store, a))


class _OrderCheckedLock:
    """The controller's lock, recording each acquire made while the same
    thread holds the store's lock (a lock-order violation)."""

    def __init__(self, store_lock) -> None:
        self._lock, self._store_lock = threading.Lock(), store_lock
        self.acquired = self.violations = 0

    def __enter__(self):
        self.violations += self._store_lock._is_owned()
        self._lock.acquire()
        self.acquired += 1
        return self

    def __exit__(self, *exc) -> None:
        self._lock.release()


def test_the_controllers_lock_is_never_taken_while_the_stores_is_held(store):
    pol = Scripted({t: Decision(Action.OFFLOAD_HOST) for t in ("small", "big")},
                   remaining={"small": 100.0, "big": 0.1})
    ctl = LifecycleController(store, ForecastSchedule(pol), clock=ManualClock(), block_bytes=BLOCK)
    checked = _OrderCheckedLock(store.parts.table.lock)
    ctl.shared.lock = ctl._lock = ctl.moves._lock = checked    # every holder of the one lock, before any traffic
    small = _pause(ctl, store, 1, "small", 4)
    big = _write_oversize(ctl, store, 2, 10)                   # evictions by the controller's order
    ctl.pause("2")
    ctl.tick()                                                 # its staging (store calls from the moves)
    assert checked.acquired > 0 and ctl.victims.refreshes >= 1
    assert checked.violations == 0
    assert sum(in_host(store, big)) == 8 and all(store.where(k) for k in small + big)
