"""What differs between a lone node and a node of a cluster: the node's role.

A :class:`~kvtier.bench.sim.simulator.Simulator` takes a :class:`Role` and asks
it once for each of its four strategies (:mod:`.strategies`), while it builds
its parts, handing it the parts each one uses:

* the remote fill: a lone node has none (a round without state recomputes); a
  cluster node loads the published prefix over its NIC;
* the prefetch gate: a lone node starts every planned prefetch; a cluster node
  holds it while admission waits there and resumes have moved away;
* the round watch: a lone node tells nobody; a cluster node counts the rounds
  routed to it and publishes a pause's state;
* the returns: a lone node resumes every round itself; a cluster node asks the
  router where it resumes.

:class:`Alone` is the lone node's; ``cluster_node.Seat`` the cluster's.
"""
from __future__ import annotations

from typing import Protocol

from kvtier.bench.sim.admission import Admission
from kvtier.bench.sim.events import EventQueue
from kvtier.bench.sim.ledger import Ledger
from kvtier.bench.sim.metrics import SimCounters
from kvtier.bench.sim.moves import TransferEngine
from kvtier.bench.sim.node import SessionState, WaitQueues
from kvtier.bench.sim.pauses import Pauses
from kvtier.bench.sim.strategies import (NoRemoteFill, NoWatch, OpenGate, PrefetchGate, RemoteFill, Returns,
                                         RoundWatch)


class Role(Protocol):
    """Builds the node's strategies (each called once, in the node's build order)."""

    def remote_fill(self, clock: EventQueue, ledger: Ledger, transfers: TransferEngine, m: SimCounters,
                    comp_s_per_token: float) -> RemoteFill: ...
    def prefetch_gate(self, queues: WaitQueues, m: SimCounters) -> PrefetchGate: ...
    def round_watch(self, clock: EventQueue, ledger: Ledger) -> RoundWatch: ...
    def returns(self, clock: EventQueue, pauses: Pauses, admission: Admission) -> Returns: ...


class HomeReturns:
    """Every resumed round runs on this node."""

    def __init__(self, pauses: Pauses) -> None:
        self._pauses = pauses

    def returned(self, x: SessionState) -> None:
        self._pauses.resume_here(x)


class Alone:
    """The role of a node on its own (the null strategies)."""

    def remote_fill(self, clock: EventQueue, ledger: Ledger, transfers: TransferEngine, m: SimCounters,
                    comp_s_per_token: float) -> RemoteFill:
        return NoRemoteFill()

    def prefetch_gate(self, queues: WaitQueues, m: SimCounters) -> PrefetchGate:
        return OpenGate()

    def round_watch(self, clock: EventQueue, ledger: Ledger) -> RoundWatch:
        return NoWatch()

    def returns(self, clock: EventQueue, pauses: Pauses, admission: Admission) -> Returns:
        return HomeReturns(pauses)
