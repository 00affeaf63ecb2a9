"""The transfer state machine: queueing moves of KV state and what each completion does.

A mixin of :class:`kvtier.bench.sim.simulator.Simulator` (shares its fields; one
owner, not thread-safe).  A :class:`~kvtier.bench.sim.transfers.Transfer`'s
``then`` is its state; :meth:`_on_xfer` dispatches to one handler per state::

    offload to host:   D2H ------------------> TO_HOST   (copy complete: free HBM)
    offload to NVMe:   D2H --> VIA_NVME --NVME_WRITE--> TO_NVME
    reload from host:  H2D ------------------> LOADED    (state resident)
    reload from NVMe:  NVME_READ --> THEN_H2D --H2D--> LOADED
    lease demotion:    NVME_WRITE ----------> DEMOTED   (host copy -> NVMe copy)
    staging:           NVME_READ -----------> STAGED    (NVMe copy -> host copy)
    write-through:     NVME_WRITE (background) -> WRITTEN

A handler returns True when the admission queues should be pumped afterwards.
"""
from __future__ import annotations

from kvtier.bench.sim.node import DONE, P_HBM, P_HOST, P_NONE, P_NVME, PAUSED, REJECTED, RUNNING, SessionState
from kvtier.bench.sim.transfers import Leg, Then, Transfer

XFER_EVENT = 4        # the simulator's event kind for a transfer completion


class TransferStateMachine:
    """Starts transfers and handles their completions (a mixin; see the module docstring)."""

    def _xfer(self, kind: Leg, x: SessionState, blocks: int, then: Then, victim_blocks: int = 0, *,
              track: bool = True, background: bool = False) -> Transfer:
        """Queue a transfer on its FIFO server (see :class:`TransferServers`); ``track``: x.moving
        is set to it; ``background``: a write-through (NVMe write's spare time)."""
        xs = self.xs
        done = xs.queue(kind, blocks, self.now, background)
        rec = x.rec
        if rec is not None and not background:
            rec.transfer_s += xs.last_dur
            if kind <= Leg.H2D:
                rec.link_queue_s += xs.last_wait
            else:
                rec.nvme_queue_s += xs.last_wait
        tr = Transfer(kind, x, blocks, x.epoch, then, victim_blocks)
        tr.shift0 = self.xs.wt_shift
        tr.fg = not background
        if tr.fg:
            self.fg_inflight += 1
        if track:
            x.moving = tr
        self._push(done, XFER_EVENT, tr, 0)
        return tr

    def _write_through(self, x: SessionState) -> None:
        """Write-through: copy the part of x's host copy not yet on NVMe to NVMe in the
        background (the NVMe write server is shared, FIFO; x.moving is not set)."""
        if not self.wt or x.copy_tier != "host" or x.nv >= x.copy_blocks:
            return
        delta = x.copy_blocks - x.nv
        if self.nvme_used + delta > self.nvme_total:
            self.m.wt_skipped += 1
            return
        self.nvme_used += delta
        x.nv = x.copy_blocks
        tr = self._xfer(Leg.NVME_WRITE, x, delta, Then.WRITTEN, track=False, background=True)
        tr.gen, tr.target = x.nv_gen, x.nv

    def _reload(self, x: SessionState) -> None:
        """Bring x's lower-tier copy back to HBM (its blocks are already reserved)."""
        if x.copy_tier == "nvme":
            self._xfer(Leg.NVME_READ, x, x.copy_blocks, Then.THEN_H2D)
        else:
            self._xfer(Leg.H2D, x, self.blocks(x.ctx), Then.LOADED)

    # ------------------------------------------------------------ completions
    def _on_xfer(self, tr: Transfer) -> None:
        x = tr.sess
        if tr.then == Then.WRITTEN and self.xs.wt_shift > tr.shift0:
            # foreground writes preempted the write-through queue since this one was queued
            d, tr.shift0 = self.xs.wt_shift - tr.shift0, self.xs.wt_shift
            self._push(self.now + d, XFER_EVENT, tr, 0)
            return
        if tr.fg:
            self.fg_inflight -= 1
        if x.moving is tr:
            x.moving = None
        live = x.epoch == tr.epoch and x.phase == PAUSED
        pump = getattr(self, _HANDLERS[tr.then])(tr, x, live)
        if not live and x.phase == PAUSED:
            # a move of an earlier pause landed during this one: state this pause retained while
            # it was still moving becomes an eviction candidate now (the pause could not list it)
            self._make_resident_paused(x)
        if pump:
            self._pump()

    def _done_via_nvme(self, tr: Transfer, x: SessionState, live: bool) -> bool:
        # HBM -> bounce buffers done; the NVMe write follows (HBM held until it completes).  Of
        # an earlier pause (x resumed since) the write just completes the copy: x.moving stays
        # as it is, None or the move of x's current pause (it was overwritten, then cleared, so
        # that a copy-out in flight looked finished and x could be taken as a victim mid-copy)
        nxt = self._xfer(Leg.NVME_WRITE, x, tr.blocks, Then.TO_NVME, tr.victim_blocks, track=live)
        nxt.epoch = tr.epoch
        return False

    def _done_offload(self, tr: Transfer, x: SessionState, live: bool) -> bool:
        to_host = tr.then == Then.TO_HOST
        self.pending_free -= tr.victim_blocks
        if live:
            self._offloaded(x, P_HOST if to_host else P_NVME)
        elif to_host and x.phase not in (DONE, REJECTED) and not (x.phase == PAUSED and x.moving is not None):
            # resumed meanwhile (or paused again and retained): the copy duplicates HBM.  Not
            # while a copy-out of x's current pause is in flight: once it lands the host copy is
            # x's only copy, and a clean one would be dropped for room, its state lost
            self._mark_clean(x)
        if to_host and x.phase not in (DONE, REJECTED):
            self._write_through(x)
        return True

    def _done_written(self, tr: Transfer, x: SessionState, live: bool) -> bool:
        # a write-through of a host copy landed
        if tr.gen == x.nv_gen and x.copy_tier == "host" and x.nv >= tr.target:
            x.nv_ok = max(x.nv_ok, tr.target)
            self.m.wt_written_blocks += tr.blocks
            self._refresh_durable(x)
        return False

    def _done_demoted(self, tr: Transfer, x: SessionState, live: bool) -> bool:
        # host -> NVMe lease demotion finished.  Of an earlier pause, with x paused again, it
        # leaves x's host copy alone: the current pause's plan has it on host (moved to NVMe
        # under its feet it was placed on host with its copy on NVMe, or gone if NVMe was full)
        if x.copy_tier == "host" and (live or x.phase != PAUSED):
            if self.nvme_used + x.copy_blocks <= self.nvme_total:
                self._set_copy(x, "nvme", x.copy_blocks)
            else:
                self.m.fallbacks += 1
                self._set_copy(x, None, 0)
            if live and x.place == P_HOST:
                x.place = P_NVME if x.copy_tier == "nvme" else P_NONE
        if live and x.stage_pending:
            x.stage_pending = False
            self._try_stage(x)
        if live and x.prefetch_pending:
            x.prefetch_pending = False
            self._try_prefetch(x)
        return True

    def _done_staged(self, tr: Transfer, x: SessionState, live: bool) -> bool:
        # NVMe -> host staging finished
        if x.copy_tier == "nvme" and x.phase not in (DONE, REJECTED):
            if self._host_room(tr.blocks, x, self._stage_rank(x)):
                self._nvme_to_host(x, tr.blocks)       # the NVMe copy is released (kept: write-through)
                self.m.staged += 1
            else:
                self.m.stage_skipped += 1
        if live:
            x.place = P_HOST if x.copy_tier == "host" else x.place
            if x.prefetch_pending:
                x.prefetch_pending = False
                self._try_prefetch(x)
        elif x.phase == RUNNING and x.waiting_reload:
            nxt = self._xfer(Leg.H2D, x, self.blocks(x.ctx), Then.LOADED)   # the round came back mid-staging
            nxt.epoch = tr.epoch
            return False
        return True

    def _done_then_h2d(self, tr: Transfer, x: SessionState, live: bool) -> bool:
        nxt = self._xfer(Leg.H2D, x, self.blocks(x.ctx), Then.LOADED)
        nxt.epoch = tr.epoch
        return False

    def _done_loaded(self, tr: Transfer, x: SessionState, live: bool) -> bool:
        x.place = P_HBM
        self._mark_clean(x)
        if live:
            self._make_resident_paused(x)
        elif x.phase == RUNNING and x.waiting_reload:
            x.waiting_reload = False
            self._resumed(x, 0.0)
            self._enqueue_prefill(x)
        return True


_HANDLERS = {            # state -> handler method (looked up on the instance: subclasses may override)
    Then.TO_HOST: "_done_offload",
    Then.VIA_NVME: "_done_via_nvme",
    Then.TO_NVME: "_done_offload",
    Then.WRITTEN: "_done_written",
    Then.DEMOTED: "_done_demoted",
    Then.STAGED: "_done_staged",
    Then.THEN_H2D: "_done_then_h2d",
    Then.LOADED: "_done_loaded",
}
