"""The simulator on the engines' lifecycle controller.

Every pause of a simulated session is carried out by a
:class:`~kvtier.tiering.lifecycle.core.ControllerCore` -- the registry, the
schedule asked once per pause, the timers its plan arms, the dispatch of a due
timer and of a lease answer, the observed wait fed back at a resume -- the
code the engines and the transformers hook run.  What is the simulator's own:

* :class:`SimMoves`, the controller's :class:`~kvtier.tiering.lifecycle.backend.Moves`: its demote / drop / stage start
  the simulator's timed transfers on its FIFO servers (or its ledger moves)
  and complete on its clock, not as synchronous store calls;
* :class:`SimDevice`, the :class:`~kvtier.tiering.lifecycle.DeviceHooks` of the
  node's HBM: ``context`` is the simulator's full PauseContext (truth included
  for the oracle), ``leased`` the HBM side of a lease end (retain, offload,
  drop), ``reload`` the prefetch to HBM;
* :class:`SimTimers`, a Registry whose timers are the node's heap events
  (``EventKind.TIMER``): each is pushed when the controller arms it and fires
  that one timer (:meth:`ControllerCore.fire`) at its time -- the heap orders
  it among the node's own events by (time, push order);
* :class:`SimClock`, the node's :class:`~kvtier.bench.sim.events.EventQueue` as the controller's clock;
* :class:`Sessions`, the simulated session behind each trajectory id, shared by the three;
* the schedule, :class:`~kvtier.tiering.lifecycle.DeviceSchedule` (the
  device holder's mapping of a decision to timers).

HBM victims stay the admission's choice (``admission.py``), as vLLM and SGLang
choose GPU victims themselves; a victim's way back goes through the controller
(:meth:`ControllerCore.evicted`).  The parts are handed the node's parts they
use (clock, ledger, transfer engine, placement, contexts, counters) when built.
One owner, single-threaded (the node's event loop).
"""
from __future__ import annotations

import threading

from kvtier.tiering.model.decision import PauseContext, Policy
from kvtier.tiering.lifecycle import DeviceSchedule, Event, LeaseEnd, LeaseOutcome, Trajectory
from kvtier.tiering.lifecycle.core import ControllerCore
from kvtier.tiering.lifecycle.registry import Registry
from kvtier.tiering.lifecycle.shared import Shared
from kvtier.tiering.model.tiers import Move
from kvtier.util.tiers import Tier

from kvtier.bench.sim.contexts import PauseContexts
from kvtier.bench.sim.events import EventKind, EventQueue
from kvtier.bench.sim.ledger import Ledger
from kvtier.bench.sim.metrics import SimCounters
from kvtier.bench.sim.moves import TransferEngine
from kvtier.bench.sim.node import SessionState
from kvtier.bench.sim.placement import Placement
from kvtier.bench.sim.transfers import Leg, Then


class Sessions:
    """The simulated session paused as each trajectory id now (its latest pause)."""

    def __init__(self) -> None:
        self._x: dict[str, SessionState] = {}

    def __getitem__(self, tid: str) -> SessionState:
        return self._x[tid]

    def set(self, tid: str, x: SessionState) -> None:
        """``x`` is the session paused as ``tid`` from now on."""
        self._x[tid] = x


class SimClock:
    """The node's time (:class:`EventQueue`'s ``now``) as a lifecycle Clock."""

    def __init__(self, clock: EventQueue) -> None:
        self._clock = clock

    def now(self) -> float:
        return self._clock.now

    def sleep_until(self, t: float, wake: threading.Event) -> None:
        """No thread waits on simulated time: its timers are heap events."""


class SimTimers(Registry):
    """Trajectories as a Registry keeps them; timers as the node's ``EventKind.TIMER`` events."""

    def __init__(self, clock: EventQueue, sessions: Sessions) -> None:
        super().__init__()
        self._clock = clock
        self._sessions = sessions

    def schedule(self, at: float, traj: Trajectory, event: Event) -> None:
        x = self._sessions[traj.tid]
        if event is Event.RELOAD:
            x.pf_due = at                       # a later plan supersedes it (see SimDevice.reload)
        elif event is Event.STAGE:
            x.st_due = at
        self._clock.push(at, EventKind.TIMER, (traj.tid, traj.pause_no, event), x.epoch)

    def arm(self, x: SessionState, t: Trajectory, timers, *, reload_in_past: bool) -> None:
        """Arm ``timers`` (seconds after the pause) after a lease end or an eviction: a
        staging not before now, a reload not before now (unless ``reload_in_past``: the HBM
        side of a lease end arms it at its planned time, as the simulator always did), a
        lease only if still ahead."""
        now = self._clock.now
        for dt, ev in timers:
            at = x.pause_t + dt
            if ev is Event.LEASE:
                if at <= now:
                    continue
            elif ev is Event.STAGE or not reload_in_past:
                at = max(now, at)
            self.schedule(at, t, ev)

    def next_due(self) -> float | None:
        return None                             # due timers are the node's heap events

    def pop_due(self, now: float) -> list:
        return []


class SimMoves:
    """The simulator's moves, held by :class:`ControllerCore` (see the module doc)."""

    def __init__(self, shared: Shared, *, clock: EventQueue, sessions: Sessions, timers: SimTimers,
                 ledger: Ledger, transfers: TransferEngine, placement: Placement, m: SimCounters) -> None:
        self.counters = shared.counters
        self.clock = clock
        self._sessions = sessions
        self._timers = timers
        self._ledger = ledger
        self._transfers = transfers
        self._placement = placement
        self._m = m

    # -- the core's placement points
    def pause_moves(self, t: Trajectory, tier, now: float) -> None:
        """Nothing: the pause's own move (the offload) already moved what it had to."""

    def lease_applies(self, t: Trajectory, evicted: bool) -> bool:
        t.where = self._sessions[t.tid].place    # the node's ledger is where the blocks are
        return True

    def arm_lease(self, t: Trajectory, out: LeaseOutcome) -> None:
        """Nothing here: :meth:`lease_move` (or the HBM side) arms them after its move."""

    def lease_move(self, t: Trajectory, where: Tier | None, out: LeaseOutcome, evicted: bool) -> int:
        if out.action is None:
            return 0                             # the policy keeps the plan
        m, x = self._m, self._sessions[t.tid]
        m.lease_redecisions += 1
        x.decision = t.decision
        a = "lease_" + out.action
        m.actions[a] = m.actions.get(a, 0) + 1
        if x.moving is not None:
            return 0                             # coming back, or still on its way down: plan stands
        x.pf_due = -1.0                          # the new decision's prefetch plan replaces the old
        x.st_due = -1.0
        x.stage_pending = False
        if where is Tier.DEVICE:
            return 0                             # the HBM side: SimDevice.leased
        if out.move is Move.DEMOTE and where is Tier.HOST:
            self.demote(t, "lease end")
        elif out.move is Move.DROP and where in (Tier.HOST, Tier.NVME):
            self.drop(t, "lease end: recompute")
        self._timers.arm(x, t, out.timers, reload_in_past=False)
        return 0

    def arm_return(self, t: Trajectory, timers) -> None:
        x = self._sessions[t.tid]
        x.decision = t.decision
        x.pf_due = -1.0
        x.st_due = -1.0
        self._timers.arm(x, t, timers, reload_in_past=False)

    # -- the moves
    def demote(self, t: Trajectory, why: str, *, limit: int | None = None) -> int:
        """Host -> NVMe: a write-through copy already durable is just released from host
        frames; else a timed NVMe write of the host copy (``Then.DEMOTED``) if NVMe has room."""
        led, x = self._ledger, self._sessions[t.tid]
        if x in led.durable:
            led.host_to_nvme(x)                  # already on NVMe: drop the host copy
            self.counters["demotions"] += 1
        elif x.copy_tier is Tier.HOST and led.nvme_used + x.copy_blocks <= led.nvme_total:
            self._transfers.start(Leg.NVME_WRITE, x, x.copy_blocks, Then.DEMOTED)
            self.counters["demotions"] += 1
            return x.copy_blocks
        return 0

    def drop(self, t: Trajectory, why: str) -> None:
        self._placement.drop(self._sessions[t.tid])

    def stage(self, t: Trajectory) -> None:
        """A STAGE timer: NVMe -> host (``Placement.try_stage``) if it is still the plan's."""
        x = self._sessions[t.tid]
        if self.clock.now == x.st_due:
            self._placement.try_stage(x)
            mv = x.moving
            if mv is not None and mv.then is Then.STAGED:
                self.counters["stagings"] += 1   # started now (it may find no host room when it lands)

    def watermarks(self) -> None:
        """None: host room is the node's (``HostRoom``)."""


class SimDevice:
    """The node's HBM as the controller's DeviceHooks (see the module doc)."""

    def __init__(self, *, clock: EventQueue, sessions: Sessions, timers: SimTimers, contexts: PauseContexts,
                 placement: Placement) -> None:
        self._clock = clock
        self._sessions = sessions
        self._timers = timers
        self._contexts = contexts
        self._placement = placement

    def context(self, traj: Trajectory, base: PauseContext | None) -> PauseContext:
        """The node's full PauseContext (the truth too, for the oracle); ``base`` is None."""
        return self._contexts.of(self._sessions[traj.tid], with_truth=True)

    def leased(self, end: LeaseEnd) -> Tier | None:
        """The HBM side of a lease end: retain, drop or offload as the new action says,
        then the answer's timers."""
        x = self._sessions[end.tid]
        if end.where is not Tier.DEVICE or end.action is None or x.moving is not None:
            return x.place
        self._placement.place(x, end.action)
        self._timers.arm(x, self._timers.get(end.tid), end.timers, reload_in_past=True)
        return x.place

    def reload(self, tid: str, pause_no: int, at_s: float) -> None:
        """A RELOAD timer: the prefetch to HBM (``Placement.try_prefetch``) if it is still the plan's."""
        x = self._sessions[tid]
        if self._clock.now == x.pf_due:
            self._placement.try_prefetch(x)


class SimController(ControllerCore):
    """The lifecycle controller of one simulated node: :class:`ControllerCore`
    holding :class:`SimMoves`, with the node's HBM as its device, on the
    node's clock and event heap, scheduling by :class:`DeviceSchedule`."""

    def __init__(self, policy: Policy, *, clock: EventQueue, block_bytes: int, contexts: PauseContexts,
                 ledger: Ledger, transfers: TransferEngine, placement: Placement, m: SimCounters) -> None:
        self._sessions = sessions = Sessions()
        self._timers = timers = SimTimers(clock, sessions)
        device = SimDevice(clock=clock, sessions=sessions, timers=timers, contexts=contexts, placement=placement)
        super().__init__(DeviceSchedule(policy), clock=SimClock(clock), block_bytes=block_bytes,
                         device=device, registry=timers, history=64,
                         moves=lambda shared: SimMoves(shared, clock=clock, sessions=sessions, timers=timers,
                                                       ledger=ledger, transfers=transfers, placement=placement,
                                                       m=m))
        self.moves: SimMoves

    def session(self, tid: str) -> SessionState:
        """The simulated session paused as ``tid`` now (its latest pause)."""
        return self._sessions[tid]

    def trajectory(self, tid: str) -> Trajectory | None:
        """``tid``'s trajectory (one owner, single-threaded: read without the lock)."""
        return self._timers.get(tid)

    def _base_ctx(self, t: Trajectory) -> None:
        """No base view: SimDevice.context is the whole of what the policy sees (the
        node's PauseContext), so the core's store-side view is not built."""
        return None

    def _event(self, t: Trajectory, what: str, detail) -> None:
        """Not recorded (a simulated node's counters are its metrics; ``counters`` are kept)."""

    def pause_session(self, x: SessionState):
        """``x`` paused now: the controller's plan for it (the policy's decision).  The
        caller makes the pause's own move, then calls :meth:`armed`."""
        tid = x.s.id
        self._sessions.set(tid, x)
        self.hint(tid, x.rounds[x.k].tool or "?")
        self.plan_for(tid)
        return self.trajectory(tid).decision

    def armed(self, x: SessionState) -> None:
        """The pause's move is made: start its plan's timers."""
        self.pause(x.s.id, tier=x.place)
