"""The transformers hook's side of the lifecycle controller (its ``DeviceHooks``).

:class:`AgentSession` runs every pause on a
:class:`kvtier.tiering.lifecycle.LifecycleController`, the same one the engine
plugins use: the controller asks the policy once per pause, holds the
trajectory's block keys and carries the decision out on the store (lease end
-> host -> NVMe, staging NVMe -> host frames, release on resume with the
observed wait fed back).  What only the hook can do is here:

* ``context``: the PauseContext the policy sees (the device KV bytes, HBM
  pressure, bytes not yet stored where the next step puts them, the store's
  free room), so decisions are those the hook made before it ran on the
  controller;
* ``leased``: the device side of a lease end -- a retained cache
  (``Where.DEVICE``) is offloaded to host / NVMe or dropped; a host pause the
  controller demoted or dropped gets its reload re-timed; every step is
  recorded as a :class:`Demotion`;
* ``reload``: an ``Event.RELOAD`` timer starts the store -> frames -> device
  reload at the decision's ``prefetch_at_s``.

A mixin of ``AgentSession`` (it uses the session's ``lifecycle``, ``store``,
``fmt``, ``hbm_pressure``, ``_traj`` and its ``_context``, ``_leave_device``,
``_claim_reload``, ``_start_reload``).  Threads: ``context`` runs under the
controller's lock and takes no lock; ``leased`` and ``reload`` run on the
thread that ticks the controller and take the trajectory's lock, which the
session's ``resume`` also holds (it calls the controller's ``settle`` first,
outside that lock).
"""
from __future__ import annotations

import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from kvtier.tiering.model.decision import Action, Decision, PauseContext
from kvtier.tiering.lifecycle import Event, LeaseEnd, Trajectory, Where
from kvtier.tiering.model.tiers import Move

_OFFLOADS = (Action.OFFLOAD_HOST, Action.OFFLOAD_NVME)


@dataclass(frozen=True)
class Demotion:
    """One lease end while the tool ran: the placement stepped from ``from_action`` to ``to_action``."""

    at_s: float                    # the lease time, seconds after the pause
    from_action: Action
    to_action: Action              # == from_action: the lease was renewed
    bytes_moved: int               # bytes written by the step (D2H + store, or host -> NVMe)
    reason: str


@dataclass
class Reload:
    """One paused trajectory's store -> frames -> device reload (started once: by its
    ``Event.RELOAD`` timer at ``at_s`` after the pause, or by the resume)."""

    keys: tuple[bytes, ...]
    seq_len: int
    at_s: float | None = None      # the prefetch time it is timed for (None: on resume)
    started: threading.Event = field(default_factory=threading.Event)
    ready: Future = field(default_factory=Future)   # -> (HFLayout, h2d Completion) or None on a miss
    missing: tuple[bytes, ...] = ()
    bytes_loaded: int = 0


class LifecycleHooks:
    """The ``DeviceHooks`` of :class:`kvtier.engine_adapter.hf.AgentSession` (see the module doc)."""

    # -- DeviceHooks ---------------------------------------------------------
    def context(self, traj: Trajectory, base: PauseContext) -> PauseContext:
        """The hook's own view of one of its pauses; ``base`` for a trajectory it does not hold."""
        tr = self._traj.get(traj.tid)
        if tr is None or not tr.keys:
            return base
        placement = Action.RETAIN if traj.where in (Where.RUNNING, Where.DEVICE) else Action.OFFLOAD_HOST
        ctx, _ = self._context(tr, traj.tool or tr.tool, tr.keys, tr.kv_bytes, placement, tr.features,
                               tr.true_wait, now_s=base.now_s)
        return ctx

    def leased(self, end: LeaseEnd) -> Where:
        tr = self._traj.get(end.tid)
        if tr is None:
            return end.where
        with tr.lock:
            if not (tr.paused and self.lifecycle.current(end.tid, end.pause_no)):
                return end.where                  # resumed meanwhile: nothing to step
            try:
                return self._lease_step(tr, end)
            except Exception as exc:  # never lose the trajectory: keep its placement, say why
                tr.demotions.append(Demotion(end.elapsed_s, tr.action, tr.action, 0,
                                             f"lease step failed: {type(exc).__name__}: {exc}"))
                return end.where

    def reload(self, tid: str, pause_no: int, at_s: float) -> None:
        tr = self._traj.get(tid)
        rl = None if tr is None else tr.reload
        if rl is None or rl.at_s is None or abs(rl.at_s - at_s) > 1e-6:
            return                                # superseded by a lease step, or not timed
        if self.lifecycle.current(tid, pause_no):
            self._start_reload(rl)

    # -- the steps -----------------------------------------------------------
    def _lease_step(self, tr: Any, end: LeaseEnd) -> Where:
        """Carry out one lease end (caller holds ``tr.lock``); returns where the blocks are."""
        frm = tr.action
        d = end.decision if isinstance(end.decision, Decision) else tr.decision
        if end.action is None:                    # the policy keeps the placement, no more leases
            return end.where
        to, reason, moved, where = Action(end.action), d.reason, 0, end.where
        if end.where is Where.DEVICE:             # HBM: the hook's own move
            if to != Action.RETAIN:
                stored = [bool(self.store.contains(k)) for k in tr.keys]
                to, reason, moved, _, _ = self._leave_device(tr, to, reason, tr.keys, stored)
                if to in _OFFLOADS:
                    self._time_reload(tr, d.prefetch_at_s, new=True)
                where = Where.of(to.tier)
        elif end.move is Move.DEMOTE:                # host -> NVMe: the controller moved it
            to, moved = Action.OFFLOAD_NVME, end.moved_blocks * self.fmt.frame_bytes
            self._time_reload(tr, d.prefetch_at_s)
        elif end.move is Move.DROP:                  # host -> recompute: the controller dropped it
            to = Action.RECOMPUTE
            if tr.reload is not None and self._claim_reload(tr.reload):
                tr.reload = None
        else:                                     # renewed (host -> retain is no step up)
            to = frm
        tr.demotions.append(Demotion(end.elapsed_s, frm, to, moved, reason))
        tr.action = to
        return where

    def _time_reload(self, tr: Any, prefetch_at_s: float | None, *, new: bool = False) -> None:
        """(Re-)time ``tr``'s reload at ``prefetch_at_s`` after the pause (None: on resume).
        ``new``: the cache just left the device, so the reload record is made now.
        A reload already under way is left alone."""
        if new or tr.reload is None:
            tr.reload = Reload(keys=tr.keys, seq_len=tr.cached_len)
        elif tr.reload.started.is_set():
            return
        tr.reload.at_s = None if prefetch_at_s is None else max(0.0, float(prefetch_at_s))
        if tr.reload.at_s is not None:
            self.lifecycle.add_timer(tr.tid, tr.reload.at_s, Event.RELOAD)
