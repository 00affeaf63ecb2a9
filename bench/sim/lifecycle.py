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
* :class:`SimTimers`, a Registry whose timers are the simulator's heap events
  (``CTL_EVENT``): each is pushed when the controller arms it and fires that
  one timer (:meth:`ControllerCore.fire`) at its time -- the heap orders it
  among the node's own events by (time, push order), as before the move;
* :class:`SimClock`, the simulator's time as the controller's clock;
* the schedule, :class:`~kvtier.tiering.lifecycle.DeviceSchedule` (the
  device holder's mapping of a decision to timers).

HBM victims stay the admission's choice (``admission.py``), as vLLM and SGLang
choose GPU victims themselves; a victim's way back goes through the controller
(:meth:`ControllerCore.evicted`).  One owner, single-threaded (the simulator).
"""
from __future__ import annotations

import threading
from typing import Protocol

from kvtier.tiering.model.decision import Action, PauseContext, Policy
from kvtier.tiering.lifecycle import DeviceSchedule, Event, LeaseEnd, LeaseOutcome, Trajectory, Where
from kvtier.tiering.lifecycle.core import ControllerCore
from kvtier.tiering.lifecycle.registry import Registry
from kvtier.tiering.lifecycle.shared import Shared
from kvtier.tiering.model.tiers import Move

from kvtier.bench.sim.metrics import SimCounters
from kvtier.bench.sim.node import P_HBM, P_HOST, P_NONE, P_NVME, SessionState
from kvtier.bench.sim.transfers import Leg, Then


class SimHost(Protocol):
    """What the controller's glue reads and calls of its :class:`~kvtier.bench.sim.simulator.Simulator`
    (the node's event loop, on the simulator's one thread)."""

    now: float
    policy: Policy
    bb: int
    m: SimCounters
    durable: dict[SessionState, int]
    nvme_used: int
    nvme_total: int
    lifecycle: "SimController"

    def _push(self, t: float, kind: int, obj: object, tok: int) -> None: ...
    def _ctx(self, x: SessionState, *, with_truth: bool) -> PauseContext: ...
    def _place(self, x: SessionState, act: Action) -> None: ...
    def _xfer(self, kind: Leg, x: SessionState, blocks: int, then: Then, victim_blocks: int = 0) -> None: ...
    def _host_to_nvme(self, x: SessionState) -> None: ...
    def _drop(self, x: SessionState) -> None: ...
    def _try_stage(self, x: SessionState) -> None: ...
    def _try_prefetch(self, x: SessionState) -> None: ...

CTL_EVENT = 7            # the simulator's event kind for a controller timer
WHERE_OF = {P_HBM: Where.DEVICE, P_HOST: Where.HOST, P_NVME: Where.NVME, P_NONE: Where.NOWHERE}
TIER_OF = {P_HBM: "device", P_HOST: "host", P_NVME: "nvme", P_NONE: None}


class SimClock:
    """The simulator's time (``Simulator.now``) as a lifecycle Clock."""

    def __init__(self, sim: SimHost) -> None:
        self.sim = sim

    def now(self) -> float:
        return self.sim.now

    def sleep_until(self, t: float, wake: threading.Event) -> None:
        """No thread waits on simulated time: its timers are heap events."""


class SimTimers(Registry):
    """Trajectories as a Registry keeps them; timers as simulator heap events."""

    def __init__(self, sim: SimHost) -> None:
        super().__init__()
        self.sim = sim

    def schedule(self, at: float, traj: Trajectory, event: Event) -> None:
        sim = self.sim
        x = sim.lifecycle.session(traj.tid)
        if event is Event.RELOAD:
            x.pf_due = at                       # a later plan supersedes it (see SimDevice.reload)
        elif event is Event.STAGE:
            x.st_due = at
        sim._push(at, CTL_EVENT, (traj.tid, traj.pause_no, event), x.epoch)

    def next_due(self) -> float | None:
        return None                             # due timers are the simulator's heap events

    def pop_due(self, now: float) -> list:
        return []


class SimMoves:
    """The simulator's moves, held by :class:`ControllerCore` (see the module doc)."""

    def __init__(self, sim: SimHost, shared: Shared) -> None:
        self.sim = sim
        self._reg = shared.reg
        self.counters = shared.counters
        self._x: dict[str, SessionState] = {}

    def session(self, tid: str) -> SessionState:
        """The simulated session paused as ``tid`` now (its latest pause)."""
        return self._x[tid]

    def set_session(self, tid: str, x: SessionState) -> None:
        """``x`` is the session paused as ``tid`` from now on."""
        self._x[tid] = x

    # -- the core's placement points
    def pause_moves(self, t: Trajectory, tier, now: float) -> None:
        """Nothing: the pause's own move (the offload) already moved what it had to."""

    def lease_applies(self, t: Trajectory, evicted: bool) -> bool:
        t.where = WHERE_OF[self._x[t.tid].place]    # the simulator's ledger is where the blocks are
        return True

    def arm_lease(self, t: Trajectory, out: LeaseOutcome) -> None:
        """Nothing here: :meth:`lease_move` (or the HBM side) arms them after its move."""

    def lease_move(self, t: Trajectory, where: Where, out: LeaseOutcome, evicted: bool) -> int:
        if out.action is None:
            return 0                             # the policy keeps the plan
        sim, x = self.sim, self._x[t.tid]
        sim.m.lease_redecisions += 1
        x.decision = t.decision
        a = "lease_" + out.action
        sim.m.actions[a] = sim.m.actions.get(a, 0) + 1
        if x.moving is not None:
            return 0                             # coming back, or still on its way down: plan stands
        x.pf_due = -1.0                          # the new decision's prefetch plan replaces the old
        x.st_due = -1.0
        x.stage_pending = False
        if where is Where.DEVICE:
            return 0                             # the HBM side: SimDevice.leased
        if out.move is Move.DEMOTE and where is Where.HOST:
            self.demote(t, "lease end")
        elif out.move is Move.DROP and where in (Where.HOST, Where.NVME):
            self.drop(t, "lease end: recompute")
        self.arm(x, t, out.timers, reload_in_past=False)
        return 0

    def arm_return(self, t: Trajectory, timers) -> None:
        x = self._x[t.tid]
        x.decision = t.decision
        x.pf_due = -1.0
        x.st_due = -1.0
        self.arm(x, t, timers, reload_in_past=False)

    def arm(self, x: SessionState, t: Trajectory, timers, *, reload_in_past: bool) -> None:
        """Arm ``timers`` (seconds after the pause) after a lease end or an eviction: a
        staging not before now, a reload not before now (unless ``reload_in_past``: the HBM
        side of a lease end arms it at its planned time, as the simulator always did), a
        lease only if still ahead."""
        now, reg = self.sim.now, self._reg
        for dt, ev in timers:
            at = x.pause_t + dt
            if ev is Event.LEASE:
                if at <= now:
                    continue
            elif ev is Event.STAGE or not reload_in_past:
                at = max(now, at)
            reg.schedule(at, t, ev)

    # -- the moves
    def demote(self, t: Trajectory, why: str, *, limit: int | None = None) -> int:
        """Host -> NVMe: a write-through copy already durable is just released from host
        frames; else a timed NVMe write of the host copy (``Then.DEMOTED``) if NVMe has room."""
        sim, x = self.sim, self._x[t.tid]
        if x in sim.durable:
            sim._host_to_nvme(x)                 # already on NVMe: drop the host copy
            self.counters["demotions"] += 1
        elif x.copy_tier == "host" and sim.nvme_used + x.copy_blocks <= sim.nvme_total:
            sim._xfer(Leg.NVME_WRITE, x, x.copy_blocks, Then.DEMOTED)
            self.counters["demotions"] += 1
            return x.copy_blocks
        return 0

    def drop(self, t: Trajectory, why: str) -> None:
        self.sim._drop(self._x[t.tid])

    def stage(self, t: Trajectory) -> None:
        """A STAGE timer: NVMe -> host (``Simulator._try_stage``) if it is still the plan's."""
        sim, x = self.sim, self._x[t.tid]
        if sim.now == x.st_due:
            sim._try_stage(x)
            mv = x.moving
            if mv is not None and mv.then is Then.STAGED:
                self.counters["stagings"] += 1   # started now (it may find no host room when it lands)

    def watermarks(self) -> None:
        """None: host room is the simulator's ledger's (``ledger._host_room``)."""


class SimDevice:
    """The node's HBM as the controller's DeviceHooks (see the module doc)."""

    def __init__(self, sim: SimHost) -> None:
        self.sim = sim

    def context(self, traj: Trajectory, base: PauseContext | None) -> PauseContext:
        """The simulator's full PauseContext (the truth too, for the oracle); ``base`` is None."""
        return self.sim._ctx(self.sim.lifecycle.session(traj.tid), with_truth=True)

    def leased(self, end: LeaseEnd) -> Where:
        """The HBM side of a lease end: retain, drop or offload as the new action says,
        then the answer's timers."""
        sim, ctl = self.sim, self.sim.lifecycle
        x = ctl.session(end.tid)
        if end.where is not Where.DEVICE or end.action is None or x.moving is not None:
            return WHERE_OF[x.place]
        sim._place(x, Action(end.action))
        ctl.moves.arm(x, ctl.trajectory(end.tid), end.timers, reload_in_past=True)
        return WHERE_OF[x.place]

    def reload(self, tid: str, pause_no: int, at_s: float) -> None:
        """A RELOAD timer: the prefetch to HBM (``Simulator._try_prefetch``) if it is still the plan's."""
        sim = self.sim
        x = sim.lifecycle.session(tid)
        if sim.now == x.pf_due:
            sim._try_prefetch(x)


class SimController(ControllerCore):
    """The lifecycle controller of one simulated node: :class:`ControllerCore`
    holding :class:`SimMoves`, with the node's HBM as its device, on the
    simulator's clock and event heap, scheduling by :class:`DeviceSchedule`."""

    def __init__(self, sim: SimHost) -> None:
        self.sim = sim
        super().__init__(DeviceSchedule(sim.policy), clock=SimClock(sim), block_bytes=sim.bb,
                         device=SimDevice(sim), registry=SimTimers(sim), history=64,
                         moves=lambda shared: SimMoves(sim, shared))
        self.moves: SimMoves

    def session(self, tid: str) -> SessionState:
        """The simulated session paused as ``tid`` now (its latest pause)."""
        return self.moves.session(tid)

    def trajectory(self, tid: str) -> Trajectory | None:
        """``tid``'s trajectory (one owner, single-threaded: read without the lock)."""
        return self._reg.get(tid)

    def _base_ctx(self, t: Trajectory) -> None:
        """No base view: SimDevice.context is the whole of what the policy sees (the
        simulator's PauseContext), so the core's store-side view is not built."""
        return None

    def _event(self, t: Trajectory, what: str, detail) -> None:
        """Not recorded (a simulated node's counters are its metrics; ``counters`` are kept)."""

    def pause_session(self, x: SessionState):
        """``x`` paused now: the controller's plan for it (the policy's decision).  The
        caller makes the pause's own move, then calls :meth:`armed`."""
        tid = x.s.id
        self.moves.set_session(tid, x)
        self.hint(tid, x.rounds[x.k].tool or "?")
        self.plan_for(tid)
        return self.trajectory(tid).decision

    def armed(self, x: SessionState) -> None:
        """The pause's move is made: start its plan's timers."""
        self.pause(x.s.id, tier=TIER_OF.get(x.place))
