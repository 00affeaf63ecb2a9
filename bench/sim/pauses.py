"""Pauses: the policy's decision at a tool call and what the node does with it.

A mixin of :class:`kvtier.bench.sim.simulator.Simulator` (shares its fields; one
owner, not thread-safe).  When a round other than the last finishes decoding,
the node's lifecycle controller (``Simulator.lifecycle``, :mod:`.lifecycle`)
asks the policy once (:class:`PauseContext`: whole KV bytes, bytes not already
in a lower tier, occupancy, free host/NVMe bytes; ``true_wait_s`` for the oracle
only); the node makes the pause's own move (:meth:`_place`) and the controller
arms the plan's timers (``stage_at_s``, ``prefetch_at_s``, ``demote_at_s``,
seconds after the pause).  Lease ends, stagings and prefetches are the
controller's timers, carried out by :mod:`.lifecycle`'s SimMoves / SimDevice
with the primitives here (``_offload``, ``_drop``, ``_try_stage``,
``_try_prefetch``).  When the tool returns the controller resumes the pause (the
policy ``observe``s the real wait) and the next round is queued.
"""
from __future__ import annotations

from kvtier.tiering.model.decision import Action, PauseContext

from kvtier.bench.sim.attribution import PauseRecord
from kvtier.bench.sim.node import P_HBM, P_HOST, P_NONE, P_NVME, PAUSED, RESUME_Q, SessionState
from kvtier.bench.sim.transfers import Leg, Then

RETURN_EVENT = 1   # the simulator's event kind for a tool return


class PauseHandling:
    """Decisions at pauses, leases, prefetch and staging (a mixin; see the module docstring)."""

    def _ctx(self, x: SessionState, *, with_truth: bool) -> PauseContext:
        r = x.rounds[x.k]
        kvb = x.ctx * self.tb
        stored = min(x.copy_blocks * self.bt, x.ctx) if x.copy_tier else 0
        return PauseContext(
            tool=r.tool or "?", kv_bytes=kvb, context_tokens=x.ctx,
            new_bytes=(x.ctx - stored) * self.tb,
            hbm_pressure=min(1.0, self.used / self.hbm_total),
            host_free_bytes=float(max(0, self.host_total - self.host_used + self.clean_blocks
                                      + self.durable_blocks) * self.bb),
            nvme_free_bytes=float(max(0, self.nvme_total - self.nvme_used) * self.bb),
            now_s=self.now, true_wait_s=r.tool_wait_s if (with_truth and self.reveal) else None,
            trajectory_id=x.s.id, evictable=True, write_through=self.wt,
            host_droppable_bytes=float((self.clean_blocks + self.durable_blocks) * self.bb),
            admission_waiting_bytes=self._new_q_bytes(), **self._queue_view())

    def _queue_view(self) -> dict:
        """What the policy sees of the transfer queues (PauseContext's link/NVMe fields)."""
        xs, now = self.xs, self.now
        # new work's recent wait for admission: the head's wait so far, or the recent mean if longer
        aw = self.m.admit_recent.mean()
        if aw is not None and self.new_q:
            aw = max(aw, now - self.new_q[0].s.arrival_s)
        return {"link_out_queue_s": xs.backlog_s(Leg.D2H, now), "link_in_queue_s": xs.mean_wait[Leg.H2D],
                "nvme_write_queue_s": xs.backlog_s(Leg.NVME_WRITE, now),
                "nvme_read_queue_s": xs.mean_wait[Leg.NVME_READ],
                "link_utilisation": max(xs.utilisation(Leg.D2H, now), xs.utilisation(Leg.H2D, now)),
                "eviction_rate_per_s": self.evr.rate(now), "admission_wait_s": aw}

    def _new_q_bytes(self) -> float:
        """KV bytes the head of the admission queue needs (0.0 when nothing waits)."""
        if not self.new_q:
            return 0.0
        r = self.new_q[0].rounds[0]
        return float(self.blocks(r.new_tokens + r.output_tokens) * self.bb)

    def _pause(self, x: SessionState) -> None:
        r = x.rounds[x.k]
        x.epoch += 1
        self._idle_flush(x)
        x.phase = PAUSED
        x.place = P_HBM
        x.pause_t = self.now
        x.return_t = self.now + (r.tool_wait_s or 0.0)
        x.prefetch_pending = False
        x.stage_pending = False
        x.waiting_reload = False
        self._push(x.return_t, RETURN_EVENT, x, x.epoch)
        ctl = self.lifecycle
        d = ctl.pause_session(x)                 # the controller asks the policy (DeviceSchedule)
        x.decision = d
        a = d.action.value if isinstance(d.action, Action) else str(d.action)
        self.m.actions[a] = self.m.actions.get(a, 0) + 1
        self._close_record(x)
        x.rec = PauseRecord(a, d.extra)
        self._place(x, Action(d.action))         # the pause's own move
        ctl.armed(x)                             # then the plan's timers (staging, reload, lease)
        self._pump()

    def _place(self, x: SessionState, act: Action) -> None:
        """Carry out ``act`` on x's HBM state: keep it (revocable), drop it, or start its offload."""
        if act == Action.RETAIN:
            self._make_resident_paused(x)
        elif act == Action.RECOMPUTE:
            self._drop(x)
        else:
            self._offload(x, act)

    def _make_resident_paused(self, x: SessionState) -> None:
        if x.place == P_HBM and x.moving is None and x not in self.paused_hbm:
            self.paused_hbm[x] = None
            self.evr.resident(self.now, len(self.paused_hbm))
            x.evictable = True

    def _unlist(self, x: SessionState) -> None:
        if x in self.paused_hbm:
            del self.paused_hbm[x]
            self.evr.resident(self.now, len(self.paused_hbm))
        x.evictable = False

    def _drop(self, x: SessionState) -> None:
        self._unlist(x)
        self._hbm(x, 0)
        self._set_copy(x, None, 0)
        x.place = P_NONE

    def _offload(self, x: SessionState, act: Action) -> bool:
        """Start moving x's HBM state down.  Returns False if it had to drop instead."""
        self._unlist(x)
        need = self.blocks(x.ctx)
        if act == Action.OFFLOAD_HOST:
            have = x.copy_blocks if x.copy_tier == "host" else 0
            if self._host_room(need - have, x):
                delta = need - have
                if x.copy_tier == "nvme":
                    if self.wt:                         # the NVMe copy stays as the host copy's backing
                        self._nvme_to_host(x, need)
                    else:
                        self._set_copy(x, None, 0)
                self._set_copy(x, "host", need)         # reserve host frames now
                if delta:
                    self._xfer(Leg.D2H, x, delta, Then.TO_HOST)
                else:
                    self._offloaded(x, P_HOST)
                    self._write_through(x)
                return True
            self.m.fallbacks += 1
            act = Action.OFFLOAD_NVME
        have = x.copy_blocks if x.copy_tier == "nvme" else 0
        if x.copy_tier == "host" and x.nv_ok and x.nv == x.nv_ok:
            have = x.nv_ok                              # write-through: its durable prefix is on NVMe
        if self.nvme_used - (x.nv if x.copy_tier == "host" else have) + need <= self.nvme_total:
            delta = need - have
            if x.copy_tier == "host":
                if x.nv_ok and x.nv == x.nv_ok:
                    self._host_to_nvme(x)               # keep the durable prefix, drop the host copy
                else:
                    self._set_copy(x, None, 0)
                    delta = need
            self._set_copy(x, "nvme", need)
            if delta:
                self._xfer(Leg.D2H, x, delta, Then.VIA_NVME)
            else:
                self._offloaded(x, P_NVME)
            return True
        self.m.fallbacks += 1
        self._drop(x)
        return False

    def _offloaded(self, x: SessionState, place: str) -> None:
        """The copy is complete: if x is still in the same pause, free its HBM blocks."""
        if x.phase == PAUSED:
            x.place = place
            self._hbm(x, 0)
            if x.stage_pending:
                x.stage_pending = False
                self._try_stage(x)
            if x.prefetch_pending:
                x.prefetch_pending = False
                self._try_prefetch(x)

    def _try_prefetch(self, x: SessionState) -> None:
        if x.phase != PAUSED or x.place not in (P_HOST, P_NVME):
            return
        if x.moving is not None:
            x.prefetch_pending = True
            return
        need = self.blocks(x.ctx)
        if need > self._free() or self.resume_q or (
                self.pf_ceiling and self.new_q and self.used + need > self.ceiling_blocks):
            # no room now, or it would take room under the ceiling that waiting admissions need:
            self.m.prefetch_deferred += 1       # reload on demand at resume
            return
        self._hbm(x, need)
        self._reload(x)

    def _try_stage(self, x: SessionState) -> None:
        """Copy x's NVMe state up to host DRAM ahead of its return (Decision.stage_at_s)."""
        if x.phase != PAUSED or x.place != P_NVME or x.copy_tier != "nvme":
            return
        if x.moving is not None:
            x.stage_pending = True                 # still on its way down: stage when it lands
            return
        if not self._host_room(x.copy_blocks, x, self._stage_rank(x)):
            self.m.stage_skipped += 1                # no host room: it will reload from NVMe
            return
        self._xfer(Leg.NVME_READ, x, x.copy_blocks, Then.STAGED)

    def _stage_rank(self, x: SessionState) -> float | None:
        """A staging may push out only host copies the policy ranks above x itself."""
        if not self.wt or not self.durable:
            return None
        if self._default_victims:
            return self.now - x.pause_t
        return float(self.policy.victim_priority(self._ctx(x, with_truth=True), self.now - x.pause_t))

    def _on_return(self, x: SessionState) -> None:
        r = x.rounds[x.k]
        self.lifecycle.resume(x.s.id, wait_s=float(r.tool_wait_s or 0.0))
        self.lifecycle.learn()      # the policy observes the wait at the return (a simulation has no timer thread)
        self._idle_flush(x)
        self._unlist(x)
        mv = x.moving
        if mv is not None and mv.victim_blocks:
            # a victim resumed during its copy-out keeps its blocks: they are no longer on their way
            self.pending_free -= mv.victim_blocks
            mv.victim_blocks = 0
        x.epoch += 1
        x.prefetch_pending = False
        x.stage_pending = False
        x.k += 1
        x.phase = RESUME_Q
        self.resume_q.append(x)
        self._pump()
