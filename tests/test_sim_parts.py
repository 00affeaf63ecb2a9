"""The simulated node's parts: its clock, its ledger's integrity check, and its role's strategies.

Toy node and policies of tests/test_sim.py (1 ms per block over the link; one session "a":
160 prompt tokens, 16 out, a 5 s tool, then 32 new tokens and 16 out: 11 blocks of context).
"""
from __future__ import annotations

import pytest

from kvtier.bench.sim.events import EventKind, EventQueue
from kvtier.bench.sim.node import PAUSED, SessionState
from kvtier.bench.sim.role import Alone
from kvtier.bench.sim.simulator import Simulator
from kvtier.tiering.model.decision import Action
from kvtier.util.tiers import Tier

from test_sim import MS, ONE, Fixed, toy_node


def test_the_clock_pops_by_time_then_by_push_order():
    q = EventQueue()
    q.push(2.0, EventKind.XFER, "late", 0)
    q.push(1.0, EventKind.RETURN, "first", 7)
    q.push(1.0, EventKind.ARRIVE, "second", 0)          # same time: after the earlier push
    assert q.next_time() == 1.0
    assert q.pop() == (EventKind.RETURN, "first", 7) and q.now == 1.0
    assert q.pop() == (EventKind.ARRIVE, "second", 0)
    assert q.pop() == (EventKind.XFER, "late", 0) and q.now == 2.0
    assert q.next_time() is None and q.handled == 3
    with pytest.raises(IndexError):
        q.pop()


def test_a_jump_moves_the_clock_and_counts_only_an_event_handled_there():
    q = EventQueue()
    q.jump(3.0, counted=True)                            # a cluster's arrival, handled by this node
    q.jump(4.0, counted=False)                           # a session moved in: not an event here
    assert q.now == 4.0 and q.handled == 1


def test_the_ledger_integrity_check_catches_a_count_the_sessions_do_not_hold():
    sim = Simulator(ONE, toy_node(), Fixed(Action.OFFLOAD_HOST))
    sim.start()
    x = sim.sessions[0]
    while x.phase != PAUSED:                             # run until "a" paused with its host copy
        sim.step()
    assert x.copy_tier is Tier.HOST and sim.ledger.host_used == x.copy_blocks == 11
    sim.check_integrity()                                # consistent
    sim.ledger.host_used += 1                            # one host frame nobody holds
    with pytest.raises(AssertionError, match="block accounting broken"):
        sim.check_integrity()


class Watching(Alone):
    """A lone node whose role holds every prefetch and records what it is told."""

    def __init__(self) -> None:
        self.told: list[tuple[str, str]] = []

    def prefetch_gate(self, queues, m):
        told = self.told

        class HoldEvery:
            def holds(self, x: SessionState) -> bool:
                m.prefetch_deferred += 1
                told.append(("held", x.s.id))
                return True
        return HoldEvery()

    def round_watch(self, clock, ledger):
        told = self.told

        class Recorder:
            def paused(self, x: SessionState) -> None:
                told.append(("paused", x.s.id))

            def finished(self, x: SessionState) -> None:
                told.append(("finished", x.s.id))

            def rejecting(self, x: SessionState) -> None:
                told.append(("rejecting", x.s.id))
        return Recorder()


def test_a_role_s_strategies_are_what_the_node_consults():
    # the lone node: the host copy is prefetched 4 s into the 5 s tool, so the resume does not stall
    pol = lambda: Fixed(Action.OFFLOAD_HOST, prefetch_at=4.0)   # noqa: E731
    alone = Simulator(ONE, toy_node(), pol(), check_every=1).run()
    assert alone.stalls == (0.0,) and alone.metrics["prefetch_deferred"] == 0
    # a role whose gate holds every prefetch: "a" reloads its 11 blocks on demand at the return
    role = Watching()
    held = Simulator(ONE, toy_node(), pol(), check_every=1, role=role).run()
    assert held.stalls == (pytest.approx(11 * MS),) and held.metrics["prefetch_deferred"] == 1
    # the watch heard the pause, the held prefetch and the end, in that order
    assert role.told == [("paused", "a"), ("held", "a"), ("finished", "a")]
