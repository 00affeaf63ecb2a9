"""Leases of the transformers hook: when a decision's ``demote_at_s`` passes with
the tool still running, ask ``policy.on_lease_expiry`` and step the state down
(HBM -> host/NVMe or drop, host -> NVMe) or renew the lease.

:class:`LeaseSteps` is a mixin of :class:`kvtier.engine_adapter.hf.AgentSession`:
it uses the session's ``policy``, ``store``, ``fmt`` and its ``_context``,
``_leave_device``, ``_schedule_reload`` and ``_claim_reload``.  A lease timer
thread holds the trajectory's lock while it demotes (see the hf module doc).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, replace
from typing import Any

from kvtier.engine_adapter.hf_cache import cache_bytes
from kvtier.tiering.decision import Action

MAX_LEASES = 64      # lease expiries per pause (a policy that renews forever stops here)


@dataclass(frozen=True)
class Demotion:
    """One lease expiry while the tool ran: the placement stepped from ``from_action`` to ``to_action``."""

    at_s: float                    # the lease time, seconds after the pause
    from_action: Action
    to_action: Action              # == from_action: the lease was renewed
    bytes_moved: int               # bytes written by the step (D2H + store, or host -> NVMe)
    reason: str


class LeaseSteps:
    """Arming, cancelling and carrying out a pause's leases (see the module doc)."""

    def _arm_lease(self, tr: Any) -> float | None:
        """Start the lease timer of ``tr.decision`` if the lease can still expire; returns its time."""
        d = tr.decision
        at = None if d is None else d.demote_at_s
        if at is None or tr.action not in (Action.RETAIN, Action.OFFLOAD_HOST):
            return None
        if tr.scripted_wait is not None and at >= tr.scripted_wait:
            return None                           # the tool is back first
        delay = max(0.0, at - (time.monotonic() - tr.t_pause))
        timer = threading.Timer(delay, self._lease_fired, args=(tr, tr.epoch, at))
        timer.daemon = True
        tr.lease_timer = timer
        timer.start()
        return at

    def _cancel_lease(self, tr: Any) -> None:
        if tr.lease_timer is not None:
            tr.lease_timer.cancel()
            tr.lease_timer = None

    def _lease_fired(self, tr: Any, epoch: int, at: float) -> None:
        """Lease timer thread: demote unless the trajectory was resumed (or re-paused) meanwhile."""
        with tr.lock:
            d = tr.decision
            if not (tr.paused and tr.epoch == epoch and tr.lease_timer is not None
                    and d is not None and d.demote_at_s == at):
                return
            tr.lease_timer = None
            try:
                self._expire_lease(tr)
            except Exception as exc:  # never lose the trajectory: keep its placement, report why
                tr.decision = replace(d, demote_at_s=None)
                tr.demotions.append(Demotion(at, tr.action, tr.action, 0,
                                             f"lease expiry failed: {type(exc).__name__}: {exc}"))

    def _expire_lease(self, tr: Any, arm: bool = True) -> None:
        """``tr.decision``'s lease ran out with the tool still running: ask the policy, step down.

        Caller holds ``tr.lock``.  HBM -> host/NVMe offloads now (frees the
        device cache); HBM -> recompute frees it; host -> NVMe demotes the
        trajectory's host-only blocks in the store; host -> recompute stops
        the reload (the blocks stay in the store for its LRU).  A host-tier
        trajectory whose reload already started is left alone.
        """
        cur = tr.decision
        at = cur.demote_at_s
        frm = tr.action
        if frm == Action.OFFLOAD_HOST and tr.reload is not None and tr.reload.started.is_set():
            tr.decision = replace(cur, demote_at_s=None)
            return
        kv = cache_bytes(tr.cache) if frm == Action.RETAIN else tr.kv_bytes
        ctx, have = self._context(tr, tr.tool, tr.keys, kv, frm, tr.features)
        new = self.policy.on_lease_expiry(ctx, at, cur)
        if new is None:                           # keep the placement, no more leases
            tr.decision = replace(cur, demote_at_s=None)
            return
        if new.demote_at_s is not None and not new.demote_at_s > at:
            new = replace(new, demote_at_s=None)  # a lease must move forward
        to, reason, moved = new.action, new.reason, 0
        if frm == Action.RETAIN:
            if to != Action.RETAIN:
                to, reason, moved, _, _ = self._leave_device(tr, to, reason, tr.keys, have)
                if to in (Action.OFFLOAD_HOST, Action.OFFLOAD_NVME):
                    self._schedule_reload(tr, new.prefetch_at_s)
        elif to in (Action.OFFLOAD_NVME, Action.RECOMPUTE, Action.OFFLOAD_HOST):   # frm: host
            if not self._claim_reload(tr.reload):
                tr.decision = replace(cur, demote_at_s=None)
                return
            if to == Action.OFFLOAD_NVME:
                host_only = [k for k, h in zip(tr.keys, have) if not h]
                moved = int(self.store.demote(host_only)) * self.fmt.frame_bytes if host_only else 0
            if to == Action.RECOMPUTE:
                tr.reload = None
            else:
                self._schedule_reload(tr, new.prefetch_at_s)
        else:                                     # host -> retain is no step down: stay in host
            to = frm
        if to != new.action:
            new = replace(new, action=to, demote_at_s=None)
        tr.demotions.append(Demotion(at, frm, to, moved, reason))
        tr.action, tr.decision = to, new
        if arm and len(tr.demotions) < MAX_LEASES:
            self._arm_lease(tr)
