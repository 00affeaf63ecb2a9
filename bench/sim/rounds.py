"""A round's start: its state resident, its prefill queued on the engine.

:class:`RoundStarts` gets a round going once admission has reserved its HBM:
a first round prefills; a resumed round whose state was dropped recomputes
it (or, in a cluster, fills it from the remote tier: the node's
:class:`~kvtier.bench.sim.strategies.RemoteFill`); one whose state is still in HBM
(or on its way out) prefills its new tokens at once; otherwise it waits for a
prefetch under way or a demand reload.  One owner, the node's event loop;
not thread-safe.
"""
from __future__ import annotations


from kvtier.util.tiers import Tier

from kvtier.bench.sim.engine import EngineClock
from kvtier.bench.sim.events import EventKind, EventQueue
from kvtier.bench.sim.ledger import Ledger
from kvtier.bench.sim.metrics import SimCounters
from kvtier.bench.sim.moves import TransferEngine
from kvtier.bench.sim.node import RUNNING, SessionState
from kvtier.bench.sim.strategies import RemoteFill
from kvtier.bench.sim.transfers import Leg, Then

_STILL_IN_HBM = (Then.TO_HOST, Then.TO_NVME, Then.VIA_NVME)    # a copy-out in flight: HBM still holds it


class RoundStarts:
    """Starts rounds whose memory is reserved (see the module docstring)."""

    def __init__(self, *, clock: EventQueue, ledger: Ledger, m: SimCounters, transfers: TransferEngine,
                 engine: EngineClock, fill: RemoteFill, comp_s_per_token: float) -> None:
        self._clock = clock
        self._ledger = ledger
        self._m = m
        self._transfers = transfers
        self.engine = engine
        self._fill = fill
        self.comp_s_per_token = comp_s_per_token

    def schedule_engine(self, t: float | None) -> None:
        """Queue the engine's next event at ``t`` (None: the engine is idle)."""
        if t is not None:
            self._clock.push(t, EventKind.ENGINE, None, self.engine.epoch)

    def enqueue_prefill(self, x: SessionState) -> None:
        """x's state is resident (or its recompute counted in its prefill): queue its prefill."""
        if x.hit_k != x.k:                       # equation (2) of 000: counted once per round
            x.hit_k = x.k
            self._m.prompt_tokens += x.shared + x.ctx + x.rounds[x.k].new_tokens
            self._m.prefilled_tokens += x.need_prefill
        self.schedule_engine(self.engine.enqueue_prefill(x, x.k > 0, self._clock.now))

    def start_round(self, x: SessionState) -> None:
        """Memory is reserved; get the state resident and queue the prefill."""
        if x.k > 0 and x.place is None and self._fill.start(x):
            return
        r = x.rounds[x.k]
        x.phase = RUNNING
        x.start_t = self._clock.now
        if x.k == 0:
            x.need_prefill = r.new_tokens + x.recompute
            self.enqueue_prefill(x)
            return
        if x.place is None:
            x.need_prefill = x.ctx + r.new_tokens
            self._m.recomputed += x.ctx
            self.resumed(x, x.ctx * self.comp_s_per_token)
            self.enqueue_prefill(x)
            return
        x.need_prefill = r.new_tokens
        mv = x.moving
        if mv is not None and mv.kind in (Leg.H2D, Leg.NVME_READ):
            x.waiting_reload = True                  # prefetch under way
            return
        if x.place is Tier.DEVICE or (mv is not None and mv.then in _STILL_IN_HBM):
            self.resumed(x, 0.0)
            self.enqueue_prefill(x)                  # data still in HBM
            return
        self._transfers.reload(x)                    # demand reload (blocks already reserved)
        x.waiting_reload = True

    def resumed(self, x: SessionState, rebuild_s: float) -> None:
        """x's state is resident (or its recompute queued): record the resume stall."""
        wait = self._clock.now - x.return_t
        self._m.stalls.append(wait + rebuild_s)
        rec = x.rec
        if rec is not None:
            rec.stall_s += wait
            rec.recompute_s += rebuild_s
