"""Speculative staging stops where its blocks are pushed out before the resume
reads them (tiering/lifecycle/staging_payoff.py), and resumes where they are read."""
from __future__ import annotations

import pytest

from kvtier.tiering.lifecycle.staging_payoff import StagingPayoff


def test_it_pays_until_enough_pauses_say_otherwise():
    p = StagingPayoff(window=8, min_pauses=4, min_kept=0.5, probe_every=4)
    for _ in range(3):
        p.resumed(40, 0)                    # three pauses whose staged blocks were all pushed out
    assert p.pays() and p.allow()           # too few to judge
    p.resumed(40, 0)
    assert not p.pays()
    allowed = [p.allow() for _ in range(8)]
    assert allowed.count(True) == 2 and allowed[3] and allowed[7]   # every 4th is a probe


def test_a_window_of_kept_blocks_turns_it_back_on():
    p = StagingPayoff(window=4, min_pauses=2, min_kept=0.5)
    p.resumed(10, 0)
    p.resumed(10, 1)
    assert not p.pays()
    for _ in range(4):
        p.resumed(10, 9)                    # the workload changed: staged blocks are read now
    assert p.pays()


def test_the_ledger_hands_back_resumed_pauses_once():
    p = StagingPayoff()
    p.staged("a", 3, [b"k1", b"k2"])
    p.staged("a", 3, [b"k3"])               # more of the same pause
    p.staged("b", 1, [b"x"])
    p.staged("c", 2, [b"y"])
    assert sorted(p.tracked()) == ["a", "b", "c"]
    due = p.due({"a": 4, "b": 1, "c": None})   # a resumed, b still paused, c forgotten
    assert due == [("a", [b"k1", b"k2", b"k3"])]
    assert sorted(p.tracked()) == ["b"]
    p.staged("b", 2, [b"z"])                 # a later pause starts its own list
    assert p.due({"b": 3}) == [("b", [b"z"])]


def test_kept_counts_are_clamped_and_bad_bounds_refused():
    p = StagingPayoff(min_pauses=1)
    p.resumed(5, 9)
    assert p.pays()
    with pytest.raises(ValueError):
        StagingPayoff(min_kept=1.5)


# ---------------------------------------------------------------- on a real store, through the controller
from kvtier.store.tiered import Tier                                              # noqa: E402
from kvtier.tiering.model.decision import Action, Decision                        # noqa: E402
from kvtier.tiering.lifecycle import ForecastSchedule, LifecycleController, ManualClock   # noqa: E402
import test_lifecycle                                                             # noqa: E402
from test_lifecycle import BLOCK, Scripted, write                                 # noqa: E402

store = test_lifecycle.store     # the 8-frame real store of test_lifecycle.py


def test_restores_stop_once_their_blocks_are_pushed_out_before_every_resume(store):
    # Round after round a pause expected back soon is pushed out by a long one's write, restored
    # by forecast, pushed out again by another write, and only then resumes: every block staged
    # for it was read from NVMe anyway.  After four such rounds the restores stop (but for a probe now and then).
    pol = Scripted({"soon": Decision(Action.OFFLOAD_HOST), "long": Decision(Action.OFFLOAD_HOST)},
                   remaining={"soon": 1.0, "long": 60.0})
    ctl = LifecycleController(store, ForecastSchedule(pol), clock=ManualClock(), block_bytes=BLOCK)
    restores = []
    for i in range(6):
        s, l1, l2 = f"s{i}", f"l{i}", f"m{i}"
        ctl.hint(s, "soon")
        ctl.pause(s, write(store, 10 * i + 1, 4, "host"))
        ctl.tick()
        ctl.hint(l1, "long")
        ctl.pause(l1, write(store, 10 * i + 2, 8, "host"))     # pushes "s" out
        before = ctl.stats().get("restores", 0)
        ctl.tick()                                             # restores "s" while staging pays
        restores.append(ctl.stats().get("restores", 0) - before)
        ctl.hint(l2, "long")
        ctl.pause(l2, write(store, 10 * i + 3, 8, "host"))     # pushes "s" out again
        ctl.hint(s, "soon")                                    # "s" resumes: nothing it staged is left
        ctl.tick()
    st = ctl.stats()
    assert min(restores[:4]) >= 1                              # while there is too little to judge
    assert restores[4] == 0 and sum(restores[4:]) <= 1         # then it is known not to pay: probes only
    assert st["staged_checked_blocks"] >= 16 and st["staged_kept_blocks"] == 0
    assert st["stagings_skipped"] >= 2
    assert not ctl.moves.payoff.pays()
