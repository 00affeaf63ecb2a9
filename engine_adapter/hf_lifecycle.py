"""The transformers hook's side of the lifecycle: the device step of a pause,
and the controller's ``DeviceHooks``.

:class:`~kvtier.engine_adapter.hf.AgentSession` runs every pause on a
:class:`kvtier.engine_adapter.wiring.Lifecycle` (the controller the vLLM and
SGLang plugins run on, with its timer thread): one ``Lifecycle.hold`` per pause,
one ``Lifecycle.release`` per resume.  The controller asks the policy once per
pause, holds the trajectory's block keys and carries the decision out on the
store (lease end -> host -> NVMe, staging NVMe -> host frames, release on
resume with the observed wait fed back).  What only the hook can do is here:

* :class:`PauseStep` -- the ``place`` of ``Lifecycle.hold``: the lifecycle's
  order carried out on the device cache (offload, drop or keep) and the
  device reload timed at the decision's ``prefetch_at_s``;
* :class:`SessionHooks` -- the controller's ``DeviceHooks``: ``context`` (the
  PauseContext the policy sees, from :class:`PauseContexts`), ``leased`` (the
  device side of a lease end: a retained cache, ``Tier.DEVICE``, is offloaded
  to host / NVMe or dropped; a host pause the controller demoted or dropped gets
  its reload re-timed; every step is recorded as a ``Demotion``) and ``reload``
  (an ``Event.RELOAD`` timer starts the store -> frames -> device reload).

Threads: ``PauseStep`` runs on the session's caller thread holding the
trajectory's lock; ``context`` runs under the controller's lock and takes no
lock; ``leased`` and ``reload`` run on the thread that ticks the controller and
take the trajectory's lock (``leased``), which the session's ``pause`` and
``resume`` hold too (the resume calls ``Lifecycle.release`` before taking it).
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Sequence

from kvtier.dma.layouts import FrameFormat
from kvtier.engine_adapter.hf_cache import free_bytes
from kvtier.engine_adapter.hf_trajectory import OFFLOADS, Demotion, HFTrajectory, Order, Reload, Trajectories
from kvtier.engine_adapter.hf_transfer import Departure, DeviceTransfers
from kvtier.engine_adapter.plugin_common import PlacementAdvisor
from kvtier.engine_adapter.wiring import Held, Lifecycle
from kvtier.tiering.lifecycle import (Event, ForecastSchedule, LeaseEnd, LifecycleController, LifecycleTimer, Plan,
                                      Trajectory)
from kvtier.tiering.lifecycle.foreground import Foreground
from kvtier.tiering.model.decision import Action, Decision, PauseContext, Policy
from kvtier.tiering.model.tiers import Move, Tier

if TYPE_CHECKING:
    from kvtier.store.tiered import TieredStore


def own_lifecycle(store: "TieredStore", policy: Policy, *, block_bytes: int) -> Lifecycle:
    """A session's own lifecycle over ``store``: a controller asking ``policy``
    (``ForecastSchedule``) whose moves yield to the session's reloads, its timer
    thread started.  Its advisor places nothing (every pause is a tracked one)."""
    ctl = LifecycleController(store, ForecastSchedule(policy), block_bytes=block_bytes)
    ctl.foreground = fg = Foreground()          # resumes first: background moves yield to them
    return Lifecycle(ctl, LifecycleTimer(ctl).start(), fg, PlacementAdvisor(Tier.HOST, policy=policy))


class PauseContexts:
    """The PauseContext a policy sees for one of the session's pauses: the device KV
    bytes, the session's HBM pressure, the bytes not yet stored where the next step
    puts them, the store's free room.  Reads the store; takes no lock."""

    def __init__(self, store: "TieredStore", fmt: FrameFormat, hbm_pressure: float) -> None:
        self.store, self.fmt, self.hbm_pressure = store, fmt, float(hbm_pressure)

    def of(self, tr: HFTrajectory, tool: str, *, on_device: bool, now_s: float) -> PauseContext:
        """``tr``'s context for a decision from the device (``on_device``: a block counts
        as new unless stored anywhere) or from the host tier (new unless on NVMe)."""
        if on_device:
            have = [bool(self.store.contains(k)) for k in tr.keys]
        else:
            have = ["nvme" in {str(t) for t in self.store.where(k)} for k in tr.keys]
        free = free_bytes(self.store)
        T, token_bytes = self.fmt.block_tokens, self.fmt.layer_bytes * self.fmt.layers // self.fmt.block_tokens
        new_tokens = sum(min(T, tr.cached_len - i * T) for i, h in enumerate(have) if not h)
        return PauseContext(tool=tool, kv_bytes=tr.kv_bytes, context_tokens=tr.cached_len,
                            new_bytes=min(tr.kv_bytes, new_tokens * token_bytes), hbm_pressure=self.hbm_pressure,
                            host_free_bytes=free["host"], nvme_free_bytes=free["nvme"], now_s=now_s,
                            true_wait_s=tr.true_wait, features=tr.features, trajectory_id=tr.tid)


class PauseStep:
    """The device side of one pause, as ``Lifecycle.hold``'s ``place``: the order
    (the policy's decision, or the plan's tier) carried out on ``tr``'s cache, the
    reload record made and timed.  After the call ``order``, ``departure`` and
    ``reason`` say what was asked, what was done and why.  Caller holds ``tr.lock``; raises what the transfers raise."""

    def __init__(self, tr: HFTrajectory, transfers: DeviceTransfers, stored: Sequence[bool]) -> None:
        self.tr, self.transfers, self.stored = tr, transfers, stored
        self.order: Order | None = None
        self.departure: Departure | None = None
        self.reason = ""

    def __call__(self, plan: Plan, decision: Decision | None) -> Held:
        tr = self.tr
        order = Order.of(plan, decision)
        action, reason = order.action, order.reason
        if (tr.cache is None or not tr.keys) and action != Action.RETAIN:
            action, reason = Action.RETAIN, "empty cache"          # nothing to move: nothing moves
        dep = self.transfers.leave_device(tr, action, self.stored)
        tr.paused, tr.t_pause = True, time.monotonic()
        tr.order, tr.action, tr.demotions, tr.reload = order, dep.action, [], None
        timers: tuple[tuple[float, Event], ...] = ()
        if dep.action in OFFLOADS:
            at = None if order.prefetch_at_s is None else max(0.0, order.prefetch_at_s)
            tr.reload = Reload(keys=tr.keys, seq_len=tr.cached_len, at_s=at)
            timers = () if at is None else ((at, Event.RELOAD),)
        self.order, self.departure, self.reason = order, dep, dep.fallback or reason
        return Held(dep.action.tier if tr.keys else None, timers)


class SessionHooks:
    """The controller's ``DeviceHooks`` for one session's trajectories (see the module doc).

    ``trajectories``: the session's records; ``transfers``: its data path;
    ``contexts``: what its policy sees; ``controller``: the controller it is attached to."""

    def __init__(self, trajectories: Trajectories, transfers: DeviceTransfers, contexts: PauseContexts,
                 store: "TieredStore", controller: LifecycleController) -> None:
        self.trajectories, self.transfers, self.contexts = trajectories, transfers, contexts
        self.store, self.controller = store, controller

    # -- DeviceHooks ---------------------------------------------------------
    def context(self, traj: Trajectory, base: PauseContext) -> PauseContext:
        """The hook's own view of one of its pauses; ``base`` for a trajectory it does not hold."""
        tr = self.trajectories.find(traj.tid)
        if tr is None or not tr.keys:
            return base
        on_device = traj.paused_at is None or traj.where == Tier.DEVICE   # running, or paused in HBM
        return self.contexts.of(tr, traj.tool or tr.tool, on_device=on_device, now_s=base.now_s)

    def leased(self, end: LeaseEnd) -> Tier | None:
        tr = self.trajectories.find(end.tid)
        if tr is None:
            return end.where
        with tr.lock:
            if not (tr.paused and self.controller.current(end.tid, end.pause_no)):
                return end.where                  # resumed meanwhile: nothing to step
            try:
                return self._lease_step(tr, end)
            except Exception as exc:  # never lose the trajectory: keep its placement, say why
                tr.demotions.append(Demotion(end.elapsed_s, tr.action, tr.action, 0,
                                             f"lease step failed: {type(exc).__name__}: {exc}"))
                return end.where

    def reload(self, tid: str, pause_no: int, at_s: float) -> None:
        tr = self.trajectories.find(tid)
        rl = None if tr is None else tr.reload
        if rl is None or rl.at_s is None or abs(rl.at_s - at_s) > 1e-6:
            return                                # superseded by a lease step, or not timed
        if self.controller.current(tid, pause_no):
            self.transfers.start_reload(rl)

    # -- the steps -----------------------------------------------------------
    def _lease_step(self, tr: HFTrajectory, end: LeaseEnd) -> Tier | None:
        """Carry out one lease end (caller holds ``tr.lock``); returns where the blocks are."""
        if end.action is None:                    # the policy keeps the placement, no more leases
            return end.where
        frm, d = tr.action, end.decision          # an answer with an action is the policy's decision
        to, reason, moved, where = Action(end.action), d.reason, 0, end.where
        if end.where == Tier.DEVICE:              # HBM: the hook's own move
            if to != Action.RETAIN:
                stored = [bool(self.store.contains(k)) for k in tr.keys]
                dep = self.transfers.leave_device(tr, to, stored)
                to, reason, moved = dep.action, dep.fallback or reason, dep.bytes_moved
                if to in OFFLOADS:
                    self._time_reload(tr, d.prefetch_at_s, new=True)
                where = to.tier
        elif end.move is Move.DEMOTE:             # host -> NVMe: the controller moved it
            to, moved = Action.OFFLOAD_NVME, end.moved_blocks * self.transfers.fmt.frame_bytes
            self._time_reload(tr, d.prefetch_at_s)
        elif end.move is Move.DROP:               # host -> recompute: the controller dropped it
            to = Action.RECOMPUTE
            if tr.reload is not None and self.transfers.claim_reload(tr.reload):
                tr.reload = None
        else:                                     # renewed (host -> retain is no step up)
            to = frm
        tr.demotions.append(Demotion(end.elapsed_s, frm, to, moved, reason))
        tr.action = to
        return where

    def _time_reload(self, tr: HFTrajectory, prefetch_at_s: float | None, *, new: bool = False) -> None:
        """(Re-)time ``tr``'s reload at ``prefetch_at_s`` after the pause (None: on resume).
        ``new``: the cache just left the device, so the reload record is made now.
        A reload already under way is left alone."""
        if new or tr.reload is None:
            tr.reload = Reload(keys=tr.keys, seq_len=tr.cached_len)
        elif tr.reload.started.is_set():
            return
        tr.reload.at_s = None if prefetch_at_s is None else max(0.0, float(prefetch_at_s))
        if tr.reload.at_s is not None:
            self.controller.add_timer(tr.tid, tr.reload.at_s, Event.RELOAD)
