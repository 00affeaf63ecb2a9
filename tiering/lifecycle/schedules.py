"""Schedules: how a pause becomes a plan the controller carries out over time.

Two kinds, one interface (the controller never asks which one it has):

* :class:`ForecastSchedule` -- kvtier's: asks a :class:`~kvtier.tiering.model.decision.Policy`
  once per pause.  ``recompute`` writes nothing; ``retain``/``offload_host``
  go to host frames under the decision's lease (``demote_at_s``), whose end
  re-asks the policy (``on_lease_expiry``: demote to NVMe, renew, or drop);
  ``offload_nvme`` goes to NVMe and is staged back to host frames at the
  decision's ``stage_at_s`` (or ``prefetch_at_s``).  Host-frame victims: the
  trajectory expected back last, by the forecast's expected remaining wait
  E[W - e | W > e] -- per block, whatever the trajectory's size (each block
  left in host frames saves the same NVMe read at its resume), and whatever
  order the policy uses for HBM victims (``victim_priority``, the fallback
  for a policy without a forecast).
* :class:`TTLSchedule` -- vLLM's session lifecycle (main branch,
  ``kv_offload/tiering/lifecycle.py``) as a baseline: every pause to host,
  host -> NVMe after a fixed age, forgotten after a fixed idle TTL, high/low
  watermarks (0.9/0.7) on the host frames with the coldest, longest-idle
  sessions demoted first.  No forecast.
"""
from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Mapping

from kvtier.tiering.model.decision import Action, Decision, PauseContext, Policy
from kvtier.tiering.policy.pricing import expected_remaining
from kvtier.tiering.model.tiers import Move, Tier

from .registry import Event, Plan, Trajectory

HOST_ACTIONS = (Action.RETAIN, Action.OFFLOAD_HOST)


@dataclass(frozen=True)
class LeaseOutcome:
    """What to do when a lease ends: ``move`` (keep, demote, drop);
    ``timers`` are new timers (seconds after the pause); ``action`` the policy's
    new action (None: it kept the placement)."""
    move: Move
    timers: tuple[tuple[float, Event], ...] = ()
    action: Action | None = None


class Schedule(ABC):
    """Turns pauses into plans.  Called under the controller's lock: must be
    cheap and must not block (no I/O, no HTTP)."""

    name = "abstract"
    policy: Policy | None = None                    # the policy it asks, or None (a fixed-timer schedule)
    watermarks: tuple[float, float] | None = None   # (high, low) host-frame fill, or None
    oversize_victims = False    # True: contexts larger than the host tier are the store's first host victims

    @abstractmethod
    def plan(self, traj: Trajectory, ctx: PauseContext) -> Plan: ...

    def on_lease(self, traj: Trajectory, ctx: PauseContext, elapsed_s: float) -> LeaseOutcome:
        return LeaseOutcome(Move.DEMOTE)

    @abstractmethod
    def victim_key(self, traj: Trajectory, ctx: PauseContext, elapsed_s: float) -> float:
        """Host-frame eviction order: the paused trajectory with the largest key leaves first."""

    def on_evicted(self, traj: Trajectory, ctx: PauseContext, elapsed_s: float) -> tuple[tuple[float, Event], ...]:
        """A host-resident pause was demoted to make room: timers to bring it
        back (seconds after the pause).  Default: none."""
        return ()

    def observe(self, tool: str, wait_s: float, features: Mapping[str, str] | None) -> None:
        """The observed wait of a resumed pause."""

    def restage_at(self, traj: Trajectory, ctx: PauseContext, elapsed_s: float) -> float | None:
        """When a host plan's blocks the store pushed down to NVMe come back to
        host frames, seconds after the pause (at least ``elapsed_s``); None:
        the resume reads them from NVMe.  Default: at once."""
        return elapsed_s

    def wants_host(self, traj: Trajectory) -> bool:
        """Whether paused ``traj`` should be in host frames now (its plan's tier;
        a lease answer may have moved it on)."""
        return traj.plan is not None and traj.plan.tier is Tier.HOST


def _t(x: float | None) -> bool:
    return x is not None and math.isfinite(x) and x >= 0


class ForecastSchedule(Schedule):
    """kvtier's schedule over a policy (see the module doc)."""

    def __init__(self, policy: Policy, *, oversize_victims: bool = True) -> None:
        self.policy = policy
        self.name = policy.name
        self.oversize_victims = bool(oversize_victims)

    def plan(self, traj: Trajectory, ctx: PauseContext) -> Plan:
        """``decide`` once (``retain`` keeps the blocks in kvtier's host frames:
        the engine frees a finished request's device blocks itself)."""
        d = self.policy.decide(ctx)
        traj.decision = d
        return self._plan_of(d)

    @staticmethod
    def _plan_of(d: Decision) -> Plan:
        a = d.action if type(d.action) is Action else Action(d.action)
        tier = None if a.tier is None else a.tier.stored    # no device tier: retain is kept in host frames
        if tier is None:
            return Plan(None, (), str(a), d.reason)
        if tier is Tier.HOST:
            timers = ((d.demote_at_s, Event.LEASE),) if _t(d.demote_at_s) else ()
            return Plan(tier, timers, str(a), d.reason)
        stage = d.stage_at_s if _t(d.stage_at_s) else d.prefetch_at_s
        return Plan(tier, ((stage, Event.STAGE),) if _t(stage) else (), str(a), d.reason)

    def on_lease(self, traj: Trajectory, ctx: PauseContext, elapsed_s: float) -> LeaseOutcome:
        cur = traj.decision if traj.decision is not None else Decision(Action.OFFLOAD_HOST)
        new = self.policy.on_lease_expiry(ctx, elapsed_s, cur)
        if new is None:
            return LeaseOutcome(Move.KEEP)
        traj.decision = new
        if new.action is Action.RECOMPUTE:
            return LeaseOutcome(Move.DROP, (), Action(new.action))
        if new.action in HOST_ACTIONS:
            if _t(new.demote_at_s) and new.demote_at_s > elapsed_s:
                return LeaseOutcome(Move.KEEP, ((new.demote_at_s, Event.LEASE),), Action(new.action))
            return LeaseOutcome(Move.KEEP, (), Action(new.action))
        stage = new.stage_at_s if _t(new.stage_at_s) else new.prefetch_at_s
        timers = ((stage, Event.STAGE),) if _t(stage) else ()
        return LeaseOutcome(Move.DEMOTE, timers, Action(new.action))

    def on_evicted(self, traj: Trajectory, ctx: PauseContext, elapsed_s: float) -> tuple[tuple[float, Event], ...]:
        """Stage it back at its decision's reload time (``stage_at_s``, else
        ``prefetch_at_s``) if that is still ahead; else ask the policy as at a
        lease end from host frames and stage at that answer's reload time."""
        d = traj.decision
        for t in ((d.stage_at_s, d.prefetch_at_s) if d is not None else ()):
            if _t(t) and t > elapsed_s:
                return ((t, Event.STAGE),)
        new = self.policy.on_lease_expiry(ctx, elapsed_s, Decision(Action.OFFLOAD_HOST))
        if new is not None:
            for t in (new.stage_at_s, new.prefetch_at_s):
                if _t(t) and t > elapsed_s:
                    return ((t, Event.STAGE),)
        return ()

    def remaining(self, ctx: PauseContext, elapsed_s: float) -> float:
        """The forecast's expected remaining wait after ``elapsed_s`` paused
        (the policy's ``victim_priority`` for a policy that does not forecast, or
        whose forecast refuses this pause's tool)."""
        try:
            fc = self.policy.forecast(ctx)
            if fc is not None:
                return float(expected_remaining(fc.distribution, float(elapsed_s)))
        except (TypeError, ValueError):
            pass
        return float(self.policy.victim_priority(ctx, elapsed_s))

    def restage_at(self, traj: Trajectory, ctx: PauseContext, elapsed_s: float) -> float | None:
        """The policy's :meth:`~kvtier.tiering.model.decision.Policy.restage_at`
        (breakeven: when the staging pays over the forecast; the baselines: at once)."""
        return self.policy.restage_at(ctx, elapsed_s)

    def victim_key(self, traj: Trajectory, ctx: PauseContext, elapsed_s: float) -> float:
        """The expected remaining wait: the pause expected back last leaves host
        frames first, block for block (measured in ``kvtier bench engine --engine
        sglang``, breakeven: 87-90 resumes from DRAM this way in 3 runs, 83-89 in
        3 runs with the policy's ``victim_priority`` (now the time paused) x
        blocks, 76 in one run with the forecast's remaining wait x blocks)."""
        return self.remaining(ctx, elapsed_s)

    def observe(self, tool: str, wait_s: float, features: Mapping[str, str] | None) -> None:
        self.policy.observe(tool, wait_s, features)

    def wants_host(self, traj: Trajectory) -> bool:
        """The current decision (a lease end's answer, else the pause's) keeps it in host frames."""
        d = traj.decision
        if d is not None:
            return d.action in HOST_ACTIONS
        return super().wants_host(traj)


class TTLSchedule(Schedule):
    """vLLM's fixed-timer session lifecycle (see the module doc).

    idle_ttl_s:        a paused session's blocks are forgotten after this long.
    demote_after_s:    host -> NVMe after this long paused.
    high/low:          host-frame fill watermarks: above ``high`` the coldest,
                       longest-idle paused sessions are demoted until ``low``.
    """

    name = "ttl"

    def __init__(self, idle_ttl_s: float = 300.0, demote_after_s: float = 30.0,
                 high: float = 0.9, low: float = 0.7) -> None:
        if not (0 < low < high <= 1):
            raise ValueError(f"watermarks need 0 < low < high <= 1, got low={low!r} high={high!r}")
        if not (idle_ttl_s > 0 and demote_after_s >= 0):
            raise ValueError("idle_ttl_s must be > 0 and demote_after_s >= 0")
        self.idle_ttl_s, self.demote_after_s = float(idle_ttl_s), float(demote_after_s)
        self.watermarks = (float(high), float(low))

    def plan(self, traj: Trajectory, ctx: PauseContext) -> Plan:
        return Plan(Tier.HOST, ((self.demote_after_s, Event.DEMOTE), (self.idle_ttl_s, Event.EXPIRE)),
                    "ttl", f"demote at {self.demote_after_s:g}s, expire at {self.idle_ttl_s:g}s")

    def victim_key(self, traj: Trajectory, ctx: PauseContext, elapsed_s: float) -> float:
        return (1.0 - traj.heat) * 1e9 + elapsed_s   # coldest first, then longest idle


def _dt(x) -> float:
    return max(0.0, float(x))


class DeviceSchedule(Schedule):
    """A policy's decisions for a holder that keeps paused KV in its own device
    memory and runs its own reload to it (the simulator's HBM; see
    docs/engines.md for which holder uses which schedule).

    Where :class:`ForecastSchedule` (the engines: no device tier, no device
    prefetch) keeps ``retain`` in host frames and stages an NVMe pause at
    ``prefetch_at_s`` when ``stage_at_s`` is None, here ``retain`` stays on
    the device (``Tier.DEVICE``), ``prefetch_at_s`` is the holder's own
    reload to the device (``Event.RELOAD``, :meth:`DeviceHooks.reload`, from
    host or straight from NVMe) and only ``stage_at_s`` stages NVMe -> host.
    Timers, in this order, seconds after the pause (each at least 0):
    ``(stage_at_s, STAGE)`` for ``offload_nvme``, ``(prefetch_at_s, RELOAD)``,
    ``(demote_at_s, LEASE)``.  A lease end's timers depend on where the
    blocks are (``traj.where``): on the device a reload only for an offload;
    in host frames all three; on NVMe no lease (none after recompute);
    nowhere none.  HBM victims are the holder's own choice
    (``victim_priority`` is the policy's); a victim's way back is
    :meth:`on_evicted` over the policy's ``victim_decision``.
    """

    oversize_victims = False

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.name = policy.name

    def plan(self, traj: Trajectory, ctx: PauseContext) -> Plan:
        d = self.policy.decide(ctx)
        traj.decision = d
        a = d.action if type(d.action) is Action else Action(d.action)
        timers = self._timers(d, a, reload=a in (Action.OFFLOAD_HOST, Action.OFFLOAD_NVME), lease=True)
        return Plan(a.tier, timers, a.value, d.reason)

    @staticmethod
    def _timers(d: Decision, a: Action, *, reload: bool, lease: bool) -> tuple[tuple[float, Event], ...]:
        out = []
        if d.stage_at_s is not None and a is Action.OFFLOAD_NVME:
            out.append((_dt(d.stage_at_s), Event.STAGE))
        if reload and d.prefetch_at_s is not None:
            out.append((_dt(d.prefetch_at_s), Event.RELOAD))
        if lease and d.demote_at_s is not None:
            out.append((_dt(d.demote_at_s), Event.LEASE))
        return tuple(out)

    def on_lease(self, traj: Trajectory, ctx: PauseContext, elapsed_s: float) -> LeaseOutcome:
        new = self.policy.on_lease_expiry(ctx, elapsed_s, traj.decision)
        if new is None:
            return LeaseOutcome(Move.KEEP)
        traj.decision = new
        a = new.action if type(new.action) is Action else Action(new.action)
        move = Move.DROP if a.tier is None else Move.DEMOTE if a.tier is Tier.NVME else Move.KEEP
        w = traj.where
        if w is Tier.DEVICE:
            timers = self._timers(new, a, reload=a in (Action.OFFLOAD_HOST, Action.OFFLOAD_NVME), lease=True)
        elif w is Tier.HOST:
            timers = self._timers(new, a, reload=True, lease=True)
        elif w is Tier.NVME and a is not Action.RECOMPUTE:
            timers = self._timers(new, a, reload=True, lease=False)
        else:
            timers = ()
        return LeaseOutcome(move, timers, a)

    def on_evicted(self, traj: Trajectory, ctx: PauseContext, elapsed_s: float) -> tuple[tuple[float, Event], ...]:
        """A device victim's way back: its decision's (``victim_decision``) timers."""
        d = traj.decision
        if d is None:
            return ()
        return self._timers(d, Action(d.action), reload=True, lease=True)

    def victim_key(self, traj: Trajectory, ctx: PauseContext, elapsed_s: float) -> float:
        return float(self.policy.victim_priority(ctx, elapsed_s))

    def observe(self, tool: str, wait_s: float, features: Mapping[str, str] | None) -> None:
        self.policy.observe(tool, wait_s, features)
