"""The transfer state machine: what each landing of a transfer does.

A :class:`~kvtier.bench.sim.transfers.Transfer`'s ``then`` is its state;
:meth:`Landings.on_xfer` dispatches to one handler per state::

    offload to host:   D2H ------------------> TO_HOST   (copy complete: free HBM)
    offload to NVMe:   D2H --> VIA_NVME --NVME_WRITE--> TO_NVME
    reload from host:  H2D ------------------> LOADED    (state resident)
    reload from NVMe:  NVME_READ --> THEN_H2D --H2D--> LOADED
    lease demotion:    NVME_WRITE ----------> DEMOTED   (host copy -> NVMe copy)
    staging:           NVME_READ -----------> STAGED    (NVMe copy -> host copy)
    write-through:     NVME_WRITE (background) -> WRITTEN
    remote fill:       the cluster's NIC ----> FILLED    (:meth:`Landings.on_fill`)

A handler returns True when the admission queues should be pumped afterwards.
A landing is *live* when its session is still in the pause that started it.
One owner, the node's event loop; not thread-safe.
"""
from __future__ import annotations

from typing import Callable

from kvtier.util.tiers import Tier

from kvtier.bench.sim.admission import Admission
from kvtier.bench.sim.contexts import VictimRanking
from kvtier.bench.sim.hostroom import HostRoom
from kvtier.bench.sim.ledger import Ledger
from kvtier.bench.sim.metrics import SimCounters
from kvtier.bench.sim.moves import TransferEngine
from kvtier.bench.sim.node import DONE, PAUSED, REJECTED, RUNNING, SessionState
from kvtier.bench.sim.placement import Placement
from kvtier.bench.sim.strategies import RemoteFill
from kvtier.bench.sim.rounds import RoundStarts
from kvtier.bench.sim.transfers import Leg, Then, Transfer


class Landings:
    """Handles transfer landings (see the module docstring)."""

    def __init__(self, *, ledger: Ledger, m: SimCounters, transfers: TransferEngine, host_room: HostRoom,
                 ranking: VictimRanking, placement: Placement, starts: RoundStarts, admission: Admission,
                 fill: RemoteFill) -> None:
        self._ledger = ledger
        self._m = m
        self._transfers = transfers
        self._host_room = host_room
        self._ranking = ranking
        self._placement = placement
        self._starts = starts
        self._admission = admission
        self._fill = fill
        self._handlers: dict[Then, Callable[[Transfer, SessionState, bool], bool]] = {
            Then.TO_HOST: self._done_offload,
            Then.VIA_NVME: self._done_via_nvme,
            Then.TO_NVME: self._done_offload,
            Then.WRITTEN: self._done_written,
            Then.DEMOTED: self._done_demoted,
            Then.STAGED: self._done_staged,
            Then.THEN_H2D: self._done_then_h2d,
            Then.LOADED: self._done_loaded,
        }

    def on_xfer(self, tr: Transfer) -> None:
        """An XFER event: ``tr`` landed on the node's servers."""
        if not self._transfers.landed(tr):
            return
        x = tr.sess
        live = x.epoch == tr.epoch and x.phase == PAUSED
        pump = self._handlers[tr.then](tr, x, live)
        if not live and x.phase == PAUSED:
            # a move of an earlier pause landed during this one: state this pause retained while
            # it was still moving becomes an eviction candidate now (the pause could not list it)
            self._placement.keep(x)
        if pump:
            self._admission.pump()

    def on_fill(self, tr: Transfer) -> None:
        """A FILL event: a fill over the cluster's NIC landed; x's round goes on (it recomputes
        what the fill did not bring, ``tr.target`` tokens)."""
        self._transfers.landed(tr)
        x = tr.sess
        self._fill.landed(tr)
        x.place = Tier.DEVICE
        if x.phase == RUNNING and x.waiting_reload:
            x.waiting_reload = False
            self._starts.resumed(x, tr.target * self._starts.comp_s_per_token)
            self._starts.enqueue_prefill(x)
        self._admission.pump()

    def _h2d(self, tr: Transfer, x: SessionState) -> bool:
        """The reload's H2D follows (of the same pause as ``tr``)."""
        nxt = self._transfers.start(Leg.H2D, x, self._ledger.blocks(x.ctx), Then.LOADED)
        nxt.epoch = tr.epoch
        return False

    def _done_via_nvme(self, tr: Transfer, x: SessionState, live: bool) -> bool:
        # HBM -> bounce buffers done; the NVMe write follows (HBM held until it completes).  Of
        # an earlier pause (x resumed since) the write just completes the copy: x.moving stays
        # as it is, None or the move of x's current pause (it was overwritten, then cleared, so
        # that a copy-out in flight looked finished and x could be taken as a victim mid-copy)
        nxt = self._transfers.start(Leg.NVME_WRITE, x, tr.blocks, Then.TO_NVME, tr.victim_blocks, track=live)
        nxt.epoch = tr.epoch
        return False

    def _done_offload(self, tr: Transfer, x: SessionState, live: bool) -> bool:
        to_host = tr.then == Then.TO_HOST
        self._ledger.pending(-tr.victim_blocks)
        if live:
            self._placement.offloaded(x, Tier.HOST if to_host else Tier.NVME)
        elif to_host and x.phase not in (DONE, REJECTED) and not (x.phase == PAUSED and x.moving is not None):
            # resumed meanwhile (or paused again and retained): the copy duplicates HBM.  Not
            # while a copy-out of x's current pause is in flight: once it lands the host copy is
            # x's only copy, and a clean one would be dropped for room, its state lost
            self._ledger.mark_clean(x)
        if to_host and x.phase not in (DONE, REJECTED):
            self._transfers.write_through(x)
        return True

    def _done_written(self, tr: Transfer, x: SessionState, live: bool) -> bool:
        # a write-through of a host copy landed
        if tr.gen == x.nv_gen and x.copy_tier is Tier.HOST and x.nv >= tr.target:
            x.nv_ok = max(x.nv_ok, tr.target)
            self._m.wt_written_blocks += tr.blocks
            self._ledger.refresh_durable(x)
        return False

    def _done_demoted(self, tr: Transfer, x: SessionState, live: bool) -> bool:
        # host -> NVMe lease demotion finished.  Of an earlier pause, with x paused again, it
        # leaves x's host copy alone: the current pause's plan has it on host (moved to NVMe
        # under its feet it was placed on host with its copy on NVMe, or gone if NVMe was full)
        led = self._ledger
        if x.copy_tier is Tier.HOST and (live or x.phase != PAUSED):
            if led.nvme_used + x.copy_blocks <= led.nvme_total:
                led.set_copy(x, Tier.NVME, x.copy_blocks)
            else:
                self._m.fallbacks += 1
                led.set_copy(x, None, 0)
            if live and x.place is Tier.HOST:
                x.place = Tier.NVME if x.copy_tier is Tier.NVME else None
        if live and x.stage_pending:
            x.stage_pending = False
            self._placement.try_stage(x)
        if live and x.prefetch_pending:
            x.prefetch_pending = False
            self._placement.try_prefetch(x)
        return True

    def _done_staged(self, tr: Transfer, x: SessionState, live: bool) -> bool:
        # NVMe -> host staging finished
        if x.copy_tier is Tier.NVME and x.phase not in (DONE, REJECTED):
            if self._host_room.make(tr.blocks, x, self._ranking.stage_rank(x)):
                self._ledger.nvme_to_host(x, tr.blocks)   # the NVMe copy is released (kept: write-through)
                self._m.staged += 1
            else:
                self._m.stage_skipped += 1
        if live:
            x.place = Tier.HOST if x.copy_tier is Tier.HOST else x.place
            if x.prefetch_pending:
                x.prefetch_pending = False
                self._placement.try_prefetch(x)
        elif x.phase == RUNNING and x.waiting_reload:
            return self._h2d(tr, x)                   # the round came back mid-staging
        return True

    def _done_then_h2d(self, tr: Transfer, x: SessionState, live: bool) -> bool:
        return self._h2d(tr, x)

    def _done_loaded(self, tr: Transfer, x: SessionState, live: bool) -> bool:
        x.place = Tier.DEVICE
        self._ledger.mark_clean(x)
        if live:
            self._placement.keep(x)
        elif x.phase == RUNNING and x.waiting_reload:
            x.waiting_reload = False
            self._starts.resumed(x, 0.0)
            self._starts.enqueue_prefill(x)
        return True
