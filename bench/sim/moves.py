"""The transfer engine: moves of KV state queued on the node's FIFO servers.

:class:`TransferEngine` starts transfers (:class:`~kvtier.bench.sim.transfers.Transfer`,
plain data) on :class:`~kvtier.bench.sim.transfers.TransferServers` and queues
their landings on the node's clock as ``EventKind.XFER`` events; what a landing
does is :mod:`.landings`' (the state machine).  It counts the foreground
transfers in flight (``fg_inflight``: each ends in an admission pump), which
the wedge breaker reads.  One owner, the node's event loop; not thread-safe.
"""
from __future__ import annotations

from kvtier.util.tiers import Tier

from kvtier.bench.sim.events import EventKind, EventQueue
from kvtier.bench.sim.ledger import Ledger
from kvtier.bench.sim.metrics import SimCounters
from kvtier.bench.sim.node import SessionState
from kvtier.bench.sim.transfers import Leg, Then, Transfer, TransferServers


class TransferEngine:
    """Starts the node's transfers (see the module docstring)."""

    def __init__(self, clock: EventQueue, ledger: Ledger, m: SimCounters, servers: TransferServers) -> None:
        self._clock = clock
        self._ledger = ledger
        self._m = m
        self.xs = servers
        self.fg_inflight = 0                   # foreground transfers in flight

    def start(self, kind: Leg, x: SessionState, blocks: int, then: Then, victim_blocks: int = 0, *,
              track: bool = True, background: bool = False) -> Transfer:
        """Queue a transfer on its FIFO server (see :class:`TransferServers`); ``track``: x.moving
        is set to it; ``background``: a write-through (NVMe write's spare time)."""
        xs = self.xs
        done = xs.queue(kind, blocks, self._clock.now, background)
        rec = x.rec
        if rec is not None and not background:
            rec.transfer_s += xs.last_dur
            if kind <= Leg.H2D:
                rec.link_queue_s += xs.last_wait
            else:
                rec.nvme_queue_s += xs.last_wait
        tr = Transfer(kind, x, blocks, x.epoch, then, victim_blocks)
        tr.shift0 = xs.wt_shift
        tr.fg = not background
        if tr.fg:
            self.fg_inflight += 1
        if track:
            x.moving = tr
        self._clock.push(done, EventKind.XFER, tr, 0)
        return tr

    def track(self, tr: Transfer, done: float, kind: EventKind) -> None:
        """A foreground transfer booked on a server that is not the node's (the cluster's NIC):
        counted in flight, set as its session's move, landing at ``done`` as a ``kind`` event."""
        self.fg_inflight += 1
        tr.sess.moving = tr
        self._clock.push(done, kind, tr, 0)

    def landed(self, tr: Transfer) -> bool:
        """``tr`` has landed: no longer in flight, nor its session's move.  False when its
        landing waits for the foreground NVMe writes that preempted it (a write-through, requeued
        later by that much); the caller then does nothing more with it."""
        xs = self.xs
        if tr.then == Then.WRITTEN and xs.wt_shift > tr.shift0:
            d, tr.shift0 = xs.wt_shift - tr.shift0, xs.wt_shift
            self._clock.push(self._clock.now + d, EventKind.XFER, tr, 0)
            return False
        if tr.fg:
            self.fg_inflight -= 1
        if tr.sess.moving is tr:
            tr.sess.moving = None
        return True

    def write_through(self, x: SessionState) -> None:
        """Write-through: copy the part of x's host copy not yet on NVMe to NVMe in the
        background (the NVMe write server is shared, FIFO; x.moving is not set)."""
        led = self._ledger
        if not led.wt or x.copy_tier is not Tier.HOST or x.nv >= x.copy_blocks:
            return
        delta = x.copy_blocks - x.nv
        if led.nvme_used + delta > led.nvme_total:
            self._m.wt_skipped += 1
            return
        led.reserve_nv(x, x.copy_blocks)
        tr = self.start(Leg.NVME_WRITE, x, delta, Then.WRITTEN, track=False, background=True)
        tr.gen, tr.target = x.nv_gen, x.nv

    def reload(self, x: SessionState) -> None:
        """Bring x's lower-tier copy back to HBM (its blocks are already reserved)."""
        if x.copy_tier is Tier.NVME:
            self.start(Leg.NVME_READ, x, x.copy_blocks, Then.THEN_H2D)
        else:
            self.start(Leg.H2D, x, self._ledger.blocks(x.ctx), Then.LOADED)
