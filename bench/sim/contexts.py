"""What the policy sees of the node: :class:`PauseContexts` builds a session's PauseContext,
and :class:`VictimRanking` orders victims by the policy's ``victim_priority``.

PauseContext's fields here: whole KV bytes, bytes not already in a lower tier,
occupancy, free host/NVMe bytes (droppable host copies count as free), the
transfer queues (``link_out_queue_s`` = the device->host backlog now,
``link_in_queue_s`` = the mean wait reloads found, the NVMe equivalents,
``link_utilisation``), the eviction rate of paused HBM-resident state, the
admission queue's head and recent wait; ``true_wait_s`` for the oracle only.
Both read the node's parts and change nothing.  One owner, the node's event
loop; not thread-safe.
"""
from __future__ import annotations

from kvtier.tiering.model.decision import PauseContext, Policy

from kvtier.bench.sim.events import EventQueue
from kvtier.bench.sim.ledger import Ledger
from kvtier.bench.sim.metrics import SimCounters
from kvtier.bench.sim.node import NodeConfig, SessionState, WaitQueues
from kvtier.bench.sim.residents import PausedResidents
from kvtier.bench.sim.transfers import Leg, TransferServers


class PauseContexts:
    """The node's PauseContext of a session (see the module docstring).  ``reveal``: put the
    real wait into every context asked ``with_truth`` (the oracle)."""

    def __init__(self, node: NodeConfig, *, reveal: bool, clock: EventQueue, ledger: Ledger,
                 servers: TransferServers, m: SimCounters, queues: WaitQueues,
                 residents: PausedResidents) -> None:
        self._tb = node.token_bytes
        self._reveal = reveal
        self._clock = clock
        self._ledger = ledger
        self._xs = servers
        self._m = m
        self._queues = queues
        self._residents = residents

    def of(self, x: SessionState, *, with_truth: bool) -> PauseContext:
        """x's context now (its current round's tool)."""
        led, tb = self._ledger, self._tb
        r = x.rounds[x.k]
        kvb = x.ctx * tb
        stored = min(x.copy_blocks * led.bt, x.ctx) if x.copy_tier else 0
        return PauseContext(
            tool=r.tool or "?", kv_bytes=kvb, context_tokens=x.ctx,
            new_bytes=(x.ctx - stored) * tb,
            hbm_pressure=min(1.0, led.used / led.hbm_total),
            host_free_bytes=float(max(0, led.host_total - led.host_used + led.clean_blocks
                                      + led.durable_blocks) * led.bb),
            nvme_free_bytes=float(max(0, led.nvme_total - led.nvme_used) * led.bb),
            now_s=self._clock.now, true_wait_s=r.tool_wait_s if (with_truth and self._reveal) else None,
            trajectory_id=x.s.id, evictable=True, write_through=led.wt,
            host_droppable_bytes=float((led.clean_blocks + led.durable_blocks) * led.bb),
            admission_waiting_bytes=self._new_q_bytes(), **self._queue_view())

    def _queue_view(self) -> dict:
        """What the policy sees of the transfer queues (PauseContext's link/NVMe fields)."""
        xs, now, new_q = self._xs, self._clock.now, self._queues.new
        # new work's recent wait for admission: the head's wait so far, or the recent mean if longer
        aw = self._m.admit_recent.mean()
        if aw is not None and new_q:
            aw = max(aw, now - new_q[0].s.arrival_s)
        return {"link_out_queue_s": xs.backlog_s(Leg.D2H, now), "link_in_queue_s": xs.mean_wait[Leg.H2D],
                "nvme_write_queue_s": xs.backlog_s(Leg.NVME_WRITE, now),
                "nvme_read_queue_s": xs.mean_wait[Leg.NVME_READ],
                "link_utilisation": max(xs.utilisation(Leg.D2H, now), xs.utilisation(Leg.H2D, now)),
                "eviction_rate_per_s": self._residents.rate.rate(now), "admission_wait_s": aw}

    def _new_q_bytes(self) -> float:
        """KV bytes the head of the admission queue needs (0.0 when nothing waits)."""
        new_q = self._queues.new
        if not new_q:
            return 0.0
        r = new_q[0].rounds[0]
        return float(self._ledger.blocks(r.new_tokens + r.output_tokens) * self._ledger.bb)


class VictimRanking:
    """The policy's ``victim_priority`` over paused sessions (highest: leaves first).  A
    policy that keeps :meth:`Policy.victim_priority` ranks by time paused (the longest-paused
    first) without building contexts (``default`` is True)."""

    def __init__(self, policy: Policy, contexts: PauseContexts, clock: EventQueue, ledger: Ledger) -> None:
        self._policy = policy
        self._contexts = contexts
        self._clock = clock
        self._ledger = ledger
        self.default = type(policy).victim_priority is Policy.victim_priority

    def priority(self, v: SessionState) -> float:
        """v's priority now (the policy's, over its full context)."""
        return float(self._policy.victim_priority(self._contexts.of(v, with_truth=True),
                                                  self._clock.now - v.pause_t))

    def host_order(self, cands: list[SessionState]) -> list[tuple[float, SessionState]]:
        """Durable host copies' owners as (priority, session), highest first (ties: the order
        given).  With the default ranking ``cands`` is sorted in place by pause time first."""
        now = self._clock.now
        if self.default:
            cands.sort(key=lambda v: v.pause_t)
            return [(now - v.pause_t, v) for v in cands]
        keyed = [(self.priority(v), v) for v in cands]
        keyed.sort(key=lambda kv: -kv[0])
        return keyed

    def evict_order(self, cands: list[SessionState]) -> list[SessionState]:
        """HBM victims in the policy's order (highest first; ties: the order given, oldest pause
        first).  The default ranking keeps the order given."""
        if self.default or len(cands) <= 1:
            return cands
        keyed = [(-self.priority(v), i, v) for i, v in enumerate(cands)]
        keyed.sort()
        return [v for _, _, v in keyed]

    def stage_rank(self, x: SessionState) -> float | None:
        """A staging of x may push out only host copies ranked above this (None: any, when no
        durable copy could be pushed out)."""
        led = self._ledger
        if not led.wt or not led.durable:
            return None
        if self.default:
            return self._clock.now - x.pause_t
        return self.priority(x)
