"""Placement: the moves of a paused session's state that the node makes on its own behalf.

:class:`Placement` carries out an action on a paused session's HBM state (keep
it, listed as an eviction candidate; drop it; start its offload to host or
NVMe, falling back host -> NVMe -> drop when a tier is full), frees the HBM
once an offload's copy is complete, and starts the plan's staging (NVMe ->
host) and prefetch (back to HBM) when their timers fire.  The pause handling
(:mod:`.pauses`), the admission's victims (:mod:`.admission`), the lifecycle
controller's moves (:mod:`.lifecycle`) and the transfer landings
(:mod:`.landings`) call it.  One owner, the node's event loop; not thread-safe.
"""
from __future__ import annotations

from kvtier.tiering.model.decision import Action
from kvtier.util.tiers import Tier

from kvtier.bench.sim.contexts import VictimRanking
from kvtier.bench.sim.hostroom import HostRoom
from kvtier.bench.sim.ledger import Ledger
from kvtier.bench.sim.metrics import SimCounters
from kvtier.bench.sim.moves import TransferEngine
from kvtier.bench.sim.node import PAUSED, SessionState, WaitQueues
from kvtier.bench.sim.residents import PausedResidents
from kvtier.bench.sim.strategies import PrefetchGate
from kvtier.bench.sim.transfers import Leg, Then


class Placement:
    """A paused session's state: kept, dropped, offloaded, staged, prefetched (see the module
    docstring).  ``prefetch_under_ceiling``: a prefetch may not lift occupancy past the
    admission ceiling while new sessions wait (``NodeConfig.prefetch_past_ceiling`` False)."""

    def __init__(self, *, ledger: Ledger, residents: PausedResidents, transfers: TransferEngine,
                 host_room: HostRoom, ranking: VictimRanking, queues: WaitQueues, m: SimCounters,
                 gate: PrefetchGate, prefetch_under_ceiling: bool) -> None:
        self._ledger = ledger
        self._residents = residents
        self._transfers = transfers
        self._host_room = host_room
        self._ranking = ranking
        self._queues = queues
        self._m = m
        self._gate = gate
        self._pf_ceiling = prefetch_under_ceiling

    def place(self, x: SessionState, act: Action) -> None:
        """Carry out ``act`` on x's HBM state: keep it (revocable), drop it, or start its offload."""
        if act == Action.RETAIN:
            self._residents.add(x)
        elif act == Action.RECOMPUTE:
            self.drop(x)
        else:
            self.offload(x, act)

    def keep(self, x: SessionState) -> None:
        """x's state is in HBM with nothing moving it: an eviction candidate (no-op otherwise)."""
        self._residents.add(x)

    def unlist(self, x: SessionState) -> None:
        """x is no eviction candidate from now on."""
        self._residents.remove(x)

    def drop(self, x: SessionState) -> None:
        """Free x's HBM and its lower-tier copy: recomputed when it resumes."""
        self._residents.remove(x)
        self._ledger.hbm(x, 0)
        self._ledger.set_copy(x, None, 0)
        x.place = None

    def offload(self, x: SessionState, act: Action) -> bool:
        """Start moving x's HBM state down.  Returns False if it had to drop instead."""
        led, xfer = self._ledger, self._transfers
        self._residents.remove(x)
        need = led.blocks(x.ctx)
        if act == Action.OFFLOAD_HOST:
            have = x.copy_blocks if x.copy_tier is Tier.HOST else 0
            if self._host_room.make(need - have, x):
                delta = need - have
                if x.copy_tier is Tier.NVME:
                    if led.wt:                          # the NVMe copy stays as the host copy's backing
                        led.nvme_to_host(x, need)
                    else:
                        led.set_copy(x, None, 0)
                led.set_copy(x, Tier.HOST, need)        # reserve host frames now
                if delta:
                    xfer.start(Leg.D2H, x, delta, Then.TO_HOST)
                else:
                    self.offloaded(x, Tier.HOST)
                    xfer.write_through(x)
                return True
            self._m.fallbacks += 1
        return self._offload_nvme(x, need)

    def _offload_nvme(self, x: SessionState, need: int) -> bool:
        led = self._ledger
        have = x.copy_blocks if x.copy_tier is Tier.NVME else 0
        if x.copy_tier is Tier.HOST and x.nv_ok and x.nv == x.nv_ok:
            have = x.nv_ok                              # write-through: its durable prefix is on NVMe
        if led.nvme_used - (x.nv if x.copy_tier is Tier.HOST else have) + need <= led.nvme_total:
            delta = need - have
            if x.copy_tier is Tier.HOST:
                if x.nv_ok and x.nv == x.nv_ok:
                    led.host_to_nvme(x)                 # keep the durable prefix, drop the host copy
                else:
                    led.set_copy(x, None, 0)
                    delta = need
            led.set_copy(x, Tier.NVME, need)
            if delta:
                self._transfers.start(Leg.D2H, x, delta, Then.VIA_NVME)
            else:
                self.offloaded(x, Tier.NVME)
            return True
        self._m.fallbacks += 1
        self.drop(x)
        return False

    def offloaded(self, x: SessionState, place: Tier) -> None:
        """The copy is complete: if x is still in the same pause, free its HBM blocks."""
        if x.phase == PAUSED:
            x.place = place
            self._ledger.hbm(x, 0)
            if x.stage_pending:
                x.stage_pending = False
                self.try_stage(x)
            if x.prefetch_pending:
                x.prefetch_pending = False
                self.try_prefetch(x)

    def try_prefetch(self, x: SessionState) -> None:
        """Bring x's copy back to HBM ahead of its return (Decision.prefetch_at_s), if there is
        room that waiting work does not need; after its move lands if one is in flight."""
        if self._gate.holds(x):
            return
        if x.phase != PAUSED or x.place not in (Tier.HOST, Tier.NVME):
            return
        if x.moving is not None:
            x.prefetch_pending = True
            return
        led, queues = self._ledger, self._queues
        need = led.blocks(x.ctx)
        if need > led.free() or queues.resume or (
                self._pf_ceiling and queues.new and led.used + need > led.ceiling_blocks):
            # no room now, or it would take room under the ceiling that waiting admissions need:
            self._m.prefetch_deferred += 1      # reload on demand at resume
            return
        led.hbm(x, need)
        self._transfers.reload(x)

    def try_stage(self, x: SessionState) -> None:
        """Copy x's NVMe state up to host DRAM ahead of its return (Decision.stage_at_s)."""
        if x.phase != PAUSED or x.place is not Tier.NVME or x.copy_tier is not Tier.NVME:
            return
        if x.moving is not None:
            x.stage_pending = True                 # still on its way down: stage when it lands
            return
        if not self._host_room.make(x.copy_blocks, x, self._ranking.stage_rank(x)):
            self._m.stage_skipped += 1               # no host room: it will reload from NVMe
            return
        self._transfers.start(Leg.NVME_READ, x, x.copy_blocks, Then.STAGED)
