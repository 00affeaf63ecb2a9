"""Admission and pressure: who gets HBM next, and who gives it up.

New sessions are admitted FIFO only while occupancy after admission stays at
or under the admission ceiling; resumed rounds come first and may use the pool
up to 100%.  When the head of a queue does not fit, paused trajectories still
resident in HBM (:class:`~kvtier.bench.sim.residents.PausedResidents`) are
victims (the policy's ``victim_action``: drop, swap out, or ``retain``); an
emergency preemption and the resume-queue wedge breaker keep the node from
deadlocking.  :meth:`Admission.pump` is called after every event that may free
HBM or queue work.  One owner, the node's event loop; not thread-safe.
"""
from __future__ import annotations

from kvtier.tiering.model.decision import Action, Policy
from kvtier.util.tiers import Tier

from kvtier.bench.sim.contexts import PauseContexts, VictimRanking
from kvtier.bench.sim.engine import EngineClock
from kvtier.bench.sim.events import EventQueue
from kvtier.bench.sim.ledger import Ledger
from kvtier.bench.sim.lifecycle import SimController
from kvtier.bench.sim.metrics import SimCounters
from kvtier.bench.sim.moves import TransferEngine
from kvtier.bench.sim.node import REJECTED, SessionState, WaitQueues
from kvtier.bench.sim.placement import Placement
from kvtier.bench.sim.residents import EVICTION_TAU_S, EvictionRate, PausedResidents
from kvtier.bench.sim.strategies import RoundWatch
from kvtier.bench.sim.rounds import RoundStarts
from kvtier.bench.sim.transfers import COPY_OUT

__all__ = ["Admission", "EVICTION_TAU_S", "EvictionRate"]


class Admission:
    """The admission queues and victim selection (see the module docstring).
    ``holders_first``: ``NodeConfig.holders_first`` (:meth:`_resume_head`)."""

    def __init__(self, *, policy: Policy, holders_first: bool, clock: EventQueue, ledger: Ledger,
                 residents: PausedResidents, queues: WaitQueues, starts: RoundStarts, placement: Placement,
                 transfers: TransferEngine, engine: EngineClock, ranking: VictimRanking,
                 contexts: PauseContexts, controller: SimController, m: SimCounters,
                 watch: RoundWatch) -> None:
        self._policy = policy
        self._holders_first = holders_first
        self._clock = clock
        self._ledger = ledger
        self._residents = residents
        self._queues = queues
        self._starts = starts
        self._placement = placement
        self._transfers = transfers
        self._engine = engine
        self._ranking = ranking
        self._contexts = contexts
        self._ctl = controller
        self._m = m
        self._watch = watch

    # ------------------------------------------------------------ victims
    def _evict(self, deficit: int, exclude: SessionState | None) -> int:
        """Evict paused HBM-resident victims (oldest first) until ``deficit`` blocks are freed
        or on their way.  Returns blocks freed or pending."""
        got = 0
        cands = [v for v in self._residents if v is not exclude and v.evictable and v.moving is None]
        cands = self._ranking.evict_order(cands)
        plan = self._policy.plan_victims
        for v in cands:
            if got >= deficit:
                break
            if not v.evictable or v.moving is not None:
                continue
            got += self._evict_one(v, plan)
        return got

    def _evict_one(self, v: SessionState, plan: bool) -> int:
        """Ask the policy what victim ``v`` does (``plan``: its whole victim_decision, whose way
        back the controller arms) and do it.  Returns the HBM blocks it frees (at once or when
        its copy-out lands; 0 if the policy pins it)."""
        pol, now, m = self._policy, self._clock.now, self._m
        d = None
        if plan:
            d = pol.victim_decision(self._contexts.of(v, with_truth=True), now - v.pause_t)
            act = Action(d.action)
        else:
            act = Action(pol.victim_action(self._contexts.of(v, with_truth=True)))
        m.victims[act.value] = m.victims.get(act.value, 0) + 1
        if act == Action.RETAIN:
            v.evictable = False                    # pinned for this pause
            return 0
        self._residents.evicted()
        blocks = v.hbm
        if act == Action.RECOMPUTE:
            self._placement.drop(v)
        else:
            moved = self._placement.offload(v, act)
            mv = v.moving
            if mv is not None and v.hbm and mv.then in COPY_OUT:
                # freed when the copy-out completes (only a copy-out frees them: a copy already
                # complete frees at once, and a prefetch pending on the landing may then start
                # a reload that must not count as blocks on their way to free)
                mv.victim_blocks = blocks
                self._ledger.pending(blocks)
            if d is not None and moved:
                self._ctl.evicted(v.s.id, d)       # its way back, through the controller
        return blocks

    def _emergency(self, exclude: SessionState) -> bool:
        for v in self._residents:
            if v is not exclude and v.moving is None and v.hbm:
                self._m.emergency += 1
                self._residents.evicted()
                self._placement.drop(v)
                return True
        return False

    def _wedged(self) -> bool:
        """Nothing is running and no foreground transfer is in flight: no event will free HBM
        (tool returns and arrivals only add demand), so a blocked queue head waits forever."""
        return (self._ledger.pending_free <= 0 and not self._engine.busy
                and self._transfers.fg_inflight == 0)

    def preempt_queued(self, head: SessionState, need: int) -> bool:
        """Wedge breaker: resumed rounds queued behind ``head`` may hold HBM (their state was
        still resident, or came back, when their tool returned) and are not paused, so no
        victim rule reaches them; when they fill the pool the node deadlocks.  Free their HBM,
        latest return first, until ``need`` fits: a complete lower-tier copy is kept (reloaded
        when the round starts), otherwise the state is dropped (recomputed).  Counted in
        ``emergency_preemptions`` and ``resume_queue_preemptions``.  True if anything was freed."""
        led, m = self._ledger, self._m
        freed = False
        for v in reversed(self._queues.resume):
            if need <= led.free():
                break
            if v is head or not v.hbm or v.moving is not None:
                continue
            m.emergency += 1
            m.queue_preempted += 1
            freed = True
            if v.copy_tier is not None and v.copy_blocks >= led.blocks(v.ctx):
                led.unmark_clean(v)                  # no longer a duplicate of HBM
                led.hbm(v, 0)
                v.place = Tier.HOST if v.copy_tier is Tier.HOST else Tier.NVME
            else:
                self._placement.drop(v)
        return freed

    # ------------------------------------------------------------ the queues
    def _resume_head(self) -> SessionState:
        """The resumed round admitted next: the queue's head (FIFO, vLLM's and SGLang's FCFS), or
        with ``NodeConfig.holders_first`` the first queued round whose context is still resident
        in HBM (retained, prefetched back, or its copy-out in flight), as vLLM's scheduler drains
        its ``kv_holding_waiting`` queue (requests that hold KV blocks) before ``waiting``."""
        q = self._queues.resume
        if self._holders_first:
            for y in q:
                if y.hbm and y.hbm >= self._ledger.blocks(y.ctx):
                    return y
        return q[0]

    def _pop_resume(self, x: SessionState) -> None:
        q = self._queues.resume
        if q[0] is x:
            q.popleft()
        else:
            q.remove(x)

    def pump(self) -> None:
        """Admit what fits now: resumed rounds first, then new sessions under the ceiling,
        taking victims when the head does not fit."""
        if self._pump_resumes():
            return
        self._pump_new()

    def _pump_resumes(self) -> bool:
        """Admit queued resumes.  True while some still wait (new sessions wait behind them)."""
        led, q = self._ledger, self._queues.resume
        while q:
            x = self._resume_head()
            r = x.rounds[x.k]
            total = led.blocks(x.ctx + r.new_tokens + r.output_tokens)
            if total + led.shared_total() > led.hbm_total:
                self._pop_resume(x)
                self.reject(x)
                continue
            need = total - x.hbm
            if need <= led.free():
                self._pop_resume(x)
                led.hbm(x, x.hbm + need)
                self._starts.start_round(x)
                continue
            deficit = need - led.free() - led.pending_free
            if deficit > 0:
                self._evict(deficit, x)
                if need <= led.free():
                    continue
                if led.pending_free <= 0 and not self._engine.busy and self._emergency(x):
                    continue
                if self._wedged() and self.preempt_queued(x, need):
                    continue
            break
        return bool(q)

    def _pump_new(self) -> None:
        led, q, m = self._ledger, self._queues.new, self._m
        while q:
            x = q[0]
            r = x.rounds[0]
            sp = x.s.shared_prefix_id
            sh = 0 if (sp is None or sp in led.shared_loaded) else led.blocks(x.shared)
            need = sh + led.blocks(r.new_tokens + r.output_tokens)
            if need + led.shared_total() > led.hbm_total:
                q.popleft()
                self.reject(x)
                continue
            shared_total = led.shared_total()
            if led.used + need <= led.ceiling_blocks or (led.used == shared_total and need <= led.free()):
                # under the ceiling, or alone on an otherwise empty node (a session bigger than the
                # ceiling would otherwise wait forever)
                q.popleft()
                if sh:
                    led.load_shared(sp, sh)
                    x.recompute = x.shared      # the first user prefills the shared prefix
                led.hbm(x, need - sh)
                now = self._clock.now
                m.admit_waits.append(now - x.s.arrival_s)
                m.admit_recent.add(now, now - x.s.arrival_s)
                self._starts.start_round(x)
                continue
            deficit = led.used + need - led.ceiling_blocks - led.pending_free
            if deficit > 0:
                self._evict(deficit, None)
                if led.used + need <= led.ceiling_blocks:
                    continue
            break

    def reject(self, x: SessionState) -> None:
        """x can never fit the pool: it ends here, its state released."""
        self._watch.rejecting(x)
        x.phase = REJECTED
        self._m.close_record(x)
        self._ledger.idle_flush(x)
        self._placement.unlist(x)
        self._ledger.hbm(x, 0)
        self._ledger.set_copy(x, None, 0)
        self._m.rejected += 1
