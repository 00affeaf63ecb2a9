"""One node of the cluster model: the one-node simulator with a cluster seat as its role.

:class:`ClusterNode` wraps a :class:`~kvtier.bench.sim.simulator.Simulator`
driven from outside by :class:`~kvtier.bench.sim.cluster.Cluster` (``step``
whenever its next event is the cluster's earliest).  Its :class:`Seat` is the
simulator's :class:`~kvtier.bench.sim.role.Role`; what it adds:

* **Arrivals** come from the cluster (:meth:`ClusterNode.arrive`), routed when they arrive.
* **Returns** (:class:`RoutedReturns`) ask the cluster's router where the resumed
  round runs.  Home: the one-node path.  Elsewhere: the state left here is
  released (HBM, host and NVMe copies; transfers in flight finish into
  nothing) and the session continues on the other node (:meth:`ClusterNode.adopt`) with
  no local state there.
* **Publishing.** With a remote tier, a pause whose state the policy keeps
  (any action but recompute) is published: the blocks not yet in the store go
  out over this node's NIC in the background (read from wherever the state
  is; no HBM is held for it).  A policy may override this per pause with
  ``Decision.extra["publish_remote"]`` (0: do not publish, 1: publish; a
  recompute decision never publishes, there is nothing left to read).
* **Remote fill.** A resumed round whose state is not local (place None: it
  moved here, or it was dropped) loads the prefix the store holds over this
  node's NIC and prefills the rest, as LMCache or HiCache load whatever
  prefix their remote backend hits.  With ``RemoteConfig.stream_inflight``
  (the default) it may instead wait for a publish still under way and read
  every published block as it lands; it takes whichever of the two brings it
  back sooner on an idle NIC and an idle engine (:meth:`NicFill.plan`), and
  recomputes when moving the blocks (latency + blocks / bandwidth, and the
  landing) is slower than prefilling them on an idle engine, as one node does.  The rule ignores both
  queues on purpose: a greedy queue-aware choice recomputed more under load
  and came out worse on mean JCT (docs/cluster.md).  The stall is the fill's
  wait (NIC queue included) plus the prefill time of what it recomputes.
* **Prefetches and moves.** Once a resume of this node has run on another
  node, a planned prefetch does not start while new work waits for admission
  here (:class:`HoldWhileAdmitting`; counted in ``prefetch_deferred``): it would take
  room from the queue until the tool returns, for a resume that may well run
  elsewhere (then the prefetched copy is freed unused).  The resume reloads on
  demand if it comes back here.  With one node, or a router that never moves a
  resume, nothing changes.
* ``SeatStats.active``: rounds routed here and not yet paused, finished or
  rejected (the routers' load signal, kept by :class:`SeatWatch`).

Not thread-safe: the cluster's event loop owns every node.
"""
from __future__ import annotations

from typing import Protocol

from kvtier.tiering.model.decision import Action, Policy

from kvtier.bench.sim.admission import Admission
from kvtier.bench.sim.cluster_remote import RemoteTier
from kvtier.bench.sim.events import EventKind, EventQueue
from kvtier.bench.sim.ledger import Ledger
from kvtier.bench.sim.metrics import SimCounters
from kvtier.bench.sim.moves import TransferEngine
from kvtier.bench.sim.node import NEW_Q, PAUSED, RESUME_Q, RUNNING, NodeConfig, SessionState, SimResult, WaitQueues
from kvtier.bench.sim.pauses import Pauses
from kvtier.bench.sim.simulator import Simulator
from kvtier.bench.sim.strategies import NoRemoteFill, PrefetchGate, RemoteFill, Returns, RoundWatch
from kvtier.bench.sim.trace import Session
from kvtier.bench.sim.transfers import Then, Transfer


class ClusterView(Protocol):
    """What a node asks of its :class:`~kvtier.bench.sim.cluster.Cluster` (on the cluster's one thread)."""

    @property
    def remote(self) -> RemoteTier | None: ...
    def route_resume(self, home: int, x: SessionState) -> "ClusterNode": ...


class SeatStats:
    """A cluster node's own counts (plain data, one owner: the cluster's event loop)."""

    __slots__ = ("active", "moved_out", "moved_in", "remote_fills", "remote_fill_tokens", "remote_fills_streamed",
                 "remote_declined", "published", "prefetch_held")

    def __init__(self) -> None:
        self.active = 0                    # rounds routed here, not yet paused, finished or rejected
        self.moved_out = 0                 # resumed rounds sent to another node
        self.moved_in = 0
        self.remote_fills = 0
        self.remote_fill_tokens = 0
        self.remote_fills_streamed = 0     # fills that waited for blocks still landing
        self.remote_declined = 0           # remote copy there, but recompute was faster
        self.published = 0
        self.prefetch_held = 0             # prefetches not started: admission waiting, resumes moving


class NicFill:
    """:class:`~kvtier.bench.sim.strategies.RemoteFill` over node ``index``'s NIC from the cluster's
    remote tier (see the module docstring, "Remote fill")."""

    def __init__(self, index: int, remote: RemoteTier, stats: SeatStats, *, clock: EventQueue, ledger: Ledger,
                 transfers: TransferEngine, m: SimCounters, comp_s_per_token: float) -> None:
        self._index = index
        self._remote = remote
        self._stats = stats
        self._clock = clock
        self._ledger = ledger
        self._transfers = transfers
        self._m = m
        self._comp = comp_s_per_token

    def start(self, x: SessionState) -> bool:
        rt, now, st = self._remote, self._clock.now, self._stats
        need = self._ledger.blocks(x.ctx)
        have = min(rt.available(x.s.id, now), need)
        pub = min(rt.published(x.s.id), need) if rt.cfg.stream_inflight else have
        if pub <= 0:
            return False
        have, stream = self.plan(x, have, pub)
        if have <= 0:
            st.remote_declined += 1
            return False
        tokens = min(x.ctx, have * self._ledger.bt)
        r = x.rounds[x.k]
        x.phase = RUNNING
        x.start_t = now
        rest = x.ctx - tokens
        x.need_prefill = rest + r.new_tokens
        self._m.recomputed += rest
        st.remote_fills += 1
        st.remote_fills_streamed += stream
        st.remote_fill_tokens += tokens
        done = rt.fetch(self._index, x.s.id, have, now, stream=stream)
        tr = Transfer(None, x, have, x.epoch, Then.FILLED)
        tr.target = rest                   # tokens it still recomputes (their prefill is in its stall)
        x.waiting_reload = True
        self._transfers.track(tr, done, EventKind.FILL)
        return True

    def plan(self, x: SessionState, landed: int, published: int) -> tuple[int, bool]:
        """How many blocks x's fill reads, and whether it streams blocks still landing: the
        landed prefix now, or every published block as it lands, whichever brings x back
        sooner on an idle NIC and an idle engine (load time + prefill of the rest); (0, False)
        when recomputing the whole context is sooner still.  Pure."""
        rt, now, c, bt = self._remote, self._clock.now, self._comp, self._ledger.bt
        best, plan = x.ctx * c, (0, False)
        for k, stream in ((landed, False), (published, True)):
            if k <= 0 or (stream and k <= landed):
                continue
            load = rt.lat + k * rt.per_block
            if stream:
                load = max(load, rt.landing_bound(x.s.id, k) - now)
            est = load + (x.ctx - min(x.ctx, k * bt)) * c
            if est < best:
                best, plan = est, (k, stream)
        return plan

    def landed(self, tr: Transfer) -> None:
        self._remote.end_read(tr.sess.s.id)


class HoldWhileAdmitting:
    """:class:`~kvtier.bench.sim.strategies.PrefetchGate`: once a resume of this node has run on
    another node, a planned prefetch does not start while new work waits for admission here."""

    def __init__(self, stats: SeatStats, queues: WaitQueues, m: SimCounters) -> None:
        self._stats = stats
        self._queues = queues
        self._m = m

    def holds(self, x: SessionState) -> bool:
        if self._stats.moved_out and self._queues.new and x.phase == PAUSED and x.moving is None:
            self._m.prefetch_deferred += 1      # reload on demand at resume (module docstring)
            self._stats.prefetch_held += 1
            return True
        return False


class SeatWatch:
    """:class:`~kvtier.bench.sim.strategies.RoundWatch` of a cluster node: counts the rounds routed
    here (``SeatStats.active``), publishes a pause's state to the remote tier, releases a
    finished session's values there."""

    def __init__(self, index: int, remote: RemoteTier | None, stats: SeatStats, clock: EventQueue,
                 ledger: Ledger) -> None:
        self._index = index
        self._remote = remote
        self._stats = stats
        self._clock = clock
        self._ledger = ledger

    def paused(self, x: SessionState) -> None:
        self._stats.active -= 1
        if self._remote is None or x.phase != PAUSED or x.decision is None:
            return
        d = x.decision
        want = (d.extra or {}).get("publish_remote")
        if Action(d.action) == Action.RECOMPUTE or (want is not None and not want):
            return
        if self._remote.publish(self._index, x.s.id, self._ledger.blocks(x.ctx), self._clock.now):
            self._stats.published += 1

    def finished(self, x: SessionState) -> None:
        self._stats.active -= 1
        if self._remote is not None:
            self._remote.release(x.s.id)

    def rejecting(self, x: SessionState) -> None:
        if x.phase in (NEW_Q, RESUME_Q):
            self._stats.active -= 1


class RoutedReturns:
    """:class:`~kvtier.bench.sim.strategies.Returns` of a cluster node: the router says where the
    resumed round runs; elsewhere, the pause ends here and the session moves there."""

    def __init__(self, index: int, cluster: ClusterView, stats: SeatStats, pauses: Pauses,
                 admission: Admission, clock: EventQueue) -> None:
        self._index = index
        self._cluster = cluster
        self._stats = stats
        self._pauses = pauses
        self._admission = admission
        self._clock = clock

    def returned(self, x: SessionState) -> None:
        dest = self._cluster.route_resume(self._index, x)
        if dest.index == self._index:
            self._stats.active += 1
            self._pauses.resume_here(x)
            return
        self._pauses.leave(x)
        self._stats.moved_out += 1
        y = dest.adopt(x.s, x.k + 1, x.ctx, self._clock.now)
        y.rec, x.rec = x.rec, None         # the pause's attribution record goes with it (stall there)
        dest.pump()
        self._admission.pump()             # the freed HBM may admit queued work here


class Seat:
    """The :class:`~kvtier.bench.sim.role.Role` of node ``index`` of ``cluster``."""

    def __init__(self, index: int, cluster: ClusterView) -> None:
        self.index = index
        self.cluster = cluster
        self.remote = cluster.remote
        self.stats = SeatStats()

    def remote_fill(self, clock: EventQueue, ledger: Ledger, transfers: TransferEngine, m: SimCounters,
                    comp_s_per_token: float) -> RemoteFill:
        if self.remote is None:
            return NoRemoteFill()
        return NicFill(self.index, self.remote, self.stats, clock=clock, ledger=ledger, transfers=transfers, m=m,
                       comp_s_per_token=comp_s_per_token)

    def prefetch_gate(self, queues: WaitQueues, m: SimCounters) -> PrefetchGate:
        return HoldWhileAdmitting(self.stats, queues, m)

    def round_watch(self, clock: EventQueue, ledger: Ledger) -> RoundWatch:
        return SeatWatch(self.index, self.remote, self.stats, clock, ledger)

    def returns(self, clock: EventQueue, pauses: Pauses, admission: Admission) -> Returns:
        return RoutedReturns(self.index, self.cluster, self.stats, pauses, admission, clock)


class ClusterNode:
    """Node ``index`` of ``cluster``: a :class:`Simulator` with a :class:`Seat` (see the module
    docstring).  ``sim`` and ``stats`` are public for the cluster's summary and tests."""

    def __init__(self, index: int, cluster: ClusterView, node: NodeConfig, policy: Policy, **kw) -> None:
        self.index = index
        self.seat = Seat(index, cluster)
        self.stats = self.seat.stats
        self.sim = Simulator((), node, policy, role=self.seat, **kw)

    def start(self) -> None:
        self.sim.start()

    def step(self) -> None:
        self.sim.step()

    def next_event_time(self) -> float | None:
        return self.sim.next_event_time()

    def finish(self) -> SimResult:
        return self.sim.finish()

    def arrive(self, s: Session, now: float) -> SessionState:
        """Session ``s`` arrives here at ``now`` (what the ARRIVE event does on one node)."""
        self.stats.active += 1
        return self.sim.arrive(s, now)

    def adopt(self, s: Session, k: int, ctx: int, now: float) -> SessionState:
        """Session ``s`` resumes here with round ``k`` and ``ctx`` private context tokens, its
        tool having returned at ``now``; nothing of its state is local.  The caller runs
        :meth:`pump` (after handing over what goes with the session)."""
        self.stats.active += 1
        self.stats.moved_in += 1
        return self.sim.adopt(s, k, ctx, now)

    def pump(self) -> None:
        self.sim.pump()

    def cluster_stats(self) -> dict:
        sim, st = self.sim, self.stats
        return {"node": self.index, "sessions_done": len(sim.m.jcts), "resumes": len(sim.m.stalls),
                "moved_in": st.moved_in, "moved_out": st.moved_out, "remote_fills": st.remote_fills,
                "prefetches_held_for_admission": st.prefetch_held,
                "hbm_peak_util": sim.m.peak_used / sim.ledger.hbm_total}
