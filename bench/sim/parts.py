"""NodeParts: a simulated node's parts, built in order.

Each part owns its fields and is handed, when built, the parts it uses; they
are built in this order, so a part only ever calls parts built before it::

    EventQueue       the clock and the event heap                       events.py
    SimCounters      counters and samples (the summary's input)         metrics.py
    PausedResidents  paused HBM-resident state: the victims             residents.py
    Ledger           block counts per tier, host cache lists, integrity ledger.py
    TransferEngine   FIFO servers, transfers started, in flight         moves.py
    WaitQueues       the resume and admission queues (plain data)       node.py
    PauseContexts    what the policy sees; VictimRanking, its order     contexts.py
    HostRoom         dropping clean / durable host copies for room      hostroom.py
    RoundStarts      a round's state resident, its prefill queued       rounds.py
    Placement        keep / drop / offload / stage / prefetch           placement.py
    SimController    the engines' lifecycle controller on this node     lifecycle.py
    Admission        queues, victims, wedge breaker (the pump)          admission.py
    Pauses           the decision at a pause, the tool's return         pauses.py
    RoundEnds        the engine's events: prefills and decodes done     ends.py
    Landings         the transfer state machine (one handler per state) landings.py

The node's :class:`~kvtier.bench.sim.role.Role` supplies four strategies while
the parts are built (the remote fill before RoundStarts, the prefetch gate
before Placement, the round watch before Admission, the returns last).
:func:`build_parts` runs on the thread that builds the simulator; the fields
are set once and never reassigned.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from kvtier.tiering.model.decision import Policy

from kvtier.bench.sim.admission import Admission
from kvtier.bench.sim.contexts import PauseContexts, VictimRanking
from kvtier.bench.sim.ends import RoundEnds
from kvtier.bench.sim.engine import EngineClock
from kvtier.bench.sim.events import EventQueue
from kvtier.bench.sim.hostroom import HostRoom
from kvtier.bench.sim.landings import Landings
from kvtier.bench.sim.ledger import Ledger
from kvtier.bench.sim.lifecycle import SimController
from kvtier.bench.sim.metrics import SimCounters
from kvtier.bench.sim.moves import TransferEngine
from kvtier.bench.sim.node import NodeConfig, SessionState, WaitQueues
from kvtier.bench.sim.pauses import Pauses
from kvtier.bench.sim.placement import Placement
from kvtier.bench.sim.residents import PausedResidents
from kvtier.bench.sim.role import Role
from kvtier.bench.sim.rounds import RoundStarts
from kvtier.bench.sim.strategies import Returns
from kvtier.bench.sim.transfers import TransferServers


@dataclass(frozen=True)
class NodeParts:
    """A node's parts (see the module doc); ``Simulator.parts`` for tools and white-box tests."""
    clock: EventQueue
    m: SimCounters
    residents: PausedResidents
    ledger: Ledger
    transfers: TransferEngine
    queues: WaitQueues
    contexts: PauseContexts
    starts: RoundStarts
    placement: Placement
    lifecycle: SimController
    admission: Admission
    pauses: Pauses
    ends: RoundEnds
    landings: Landings
    returns: Returns


def build_parts(node: NodeConfig, policy: Policy, sessions: list[SessionState], role: Role, *,
                reveal_true_wait: bool, progress: Callable[[int, int], None] | None, record_rounds: bool,
                occupancy_dt: float) -> NodeParts:
    """Build a node's parts in order.  ``sessions``: the node's list of sessions (the ledger and
    the round ends read it; the node appends to it)."""
    g, hw = node.geometry, node.hardware
    clock = EventQueue()
    m = SimCounters()
    residents = PausedResidents(clock)
    ledger = Ledger(node, clock, m, sessions, residents, occupancy_dt=occupancy_dt)
    transfers = TransferEngine(clock, ledger, m, TransferServers(node.block_bytes, hw))
    queues = WaitQueues()
    contexts = PauseContexts(node, reveal=reveal_true_wait, clock=clock, ledger=ledger, servers=transfers.xs,
                             m=m, queues=queues, residents=residents)
    ranking = VictimRanking(policy, contexts, clock, ledger)
    host_room = HostRoom(ledger, ranking, m)
    comp = 2.0 * g.compute_params / hw.prefill_flops
    engine = EngineClock(t_weights=hw.weights_bytes / node.hbm_bw_bps,
                         kv_s_per_token=node.token_bytes / node.hbm_bw_bps,
                         comp_s_per_token=comp, chunk=node.chunk_tokens)
    fill = role.remote_fill(clock, ledger, transfers, m, comp)
    starts = RoundStarts(clock=clock, ledger=ledger, m=m, transfers=transfers, engine=engine, fill=fill,
                         comp_s_per_token=comp)
    placement = Placement(ledger=ledger, residents=residents, transfers=transfers, host_room=host_room,
                          ranking=ranking, queues=queues, m=m, gate=role.prefetch_gate(queues, m),
                          prefetch_under_ceiling=not node.prefetch_past_ceiling)
    ctl = SimController(policy, clock=clock, block_bytes=node.block_bytes, contexts=contexts, ledger=ledger,
                        transfers=transfers, placement=placement, m=m)
    watch = role.round_watch(clock, ledger)
    admission = Admission(policy=policy, holders_first=bool(node.holders_first), clock=clock, ledger=ledger,
                          residents=residents, queues=queues, starts=starts, placement=placement,
                          transfers=transfers, engine=engine, ranking=ranking, contexts=contexts, controller=ctl,
                          m=m, watch=watch)
    pauses = Pauses(clock=clock, ledger=ledger, m=m, controller=ctl, placement=placement, admission=admission,
                    queues=queues, watch=watch)
    ends = RoundEnds(clock=clock, ledger=ledger, m=m, starts=starts, pauses=pauses, admission=admission,
                     watch=watch, sessions=sessions, progress=progress, record_rounds=record_rounds)
    landings = Landings(ledger=ledger, m=m, transfers=transfers, host_room=host_room, ranking=ranking,
                        placement=placement, starts=starts, admission=admission, fill=fill)
    return NodeParts(clock=clock, m=m, residents=residents, ledger=ledger, transfers=transfers, queues=queues,
                     contexts=contexts, starts=starts, placement=placement, lifecycle=ctl, admission=admission,
                     pauses=pauses, ends=ends, landings=landings, returns=role.returns(clock, pauses, admission))
