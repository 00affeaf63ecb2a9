"""Admission and pressure: who gets HBM next, and who gives it up.

A mixin of :class:`kvtier.bench.sim.simulator.Simulator` (shares its fields; one
owner, not thread-safe).  New sessions are admitted FIFO only while occupancy
after admission stays at or under the admission ceiling; resumed rounds come
first and may use the pool up to 100%.  When the head of a queue does not fit,
paused trajectories still resident in HBM are victims (the policy's
``victim_action``: drop, swap out, or ``retain``); an emergency preemption and
the resume-queue wedge breaker keep the node from deadlocking.
"""
from __future__ import annotations

import math

from kvtier.tiering.model.decision import Action

from kvtier.bench.sim.node import P_HOST, P_NVME, REJECTED, SessionState
from kvtier.bench.sim.transfers import COPY_OUT

EVICTION_TAU_S = 300.0      # time constant of the eviction-rate estimate (PauseContext.eviction_rate_per_s)


class EvictionRate:
    """How often paused HBM-resident trajectories have been made to leave, recently: victims
    taken over trajectory-seconds of residence in the paused set, both sums decayed with time
    constant ``EVICTION_TAU_S`` (``PauseContext.eviction_rate_per_s``).  One owner, not
    thread-safe."""

    __slots__ = ("ev", "ex", "t", "n")

    def __init__(self) -> None:
        self.ev = self.ex = self.t = 0.0
        self.n = 0

    def _advance(self, now: float) -> None:
        dt = now - self.t
        if dt > 0.0:
            d = math.exp(-dt / EVICTION_TAU_S)
            self.ev *= d
            self.ex = self.ex * d + self.n * EVICTION_TAU_S * (1.0 - d)
            self.t = now

    def resident(self, now: float, n: int) -> None:
        """The paused HBM-resident set has ``n`` trajectories from ``now`` on."""
        self._advance(now)
        self.n = n

    def evicted(self, now: float) -> None:
        """One of them was made to leave at ``now``."""
        self._advance(now)
        self.ev += 1.0

    def rate(self, now: float) -> float | None:
        """Evictions per trajectory-second (None before any residence)."""
        self._advance(now)
        return self.ev / self.ex if self.ex > 0.0 else None


class Admission:
    """The admission queues and victim selection (a mixin; see the module docstring)."""

    def _evict(self, deficit: int, exclude: SessionState | None) -> int:
        """Evict paused HBM-resident victims (oldest first) until ``deficit`` blocks are freed
        or on their way.  Returns blocks freed or pending."""
        got = 0
        cands = [v for v in self.paused_hbm if v is not exclude and v.evictable and v.moving is None]
        if not self._default_victims and len(cands) > 1:
            # the policy's eviction order (highest priority first; ties: oldest pause first)
            pri = self.policy.victim_priority
            now = self.now
            keyed = [(-float(pri(self._ctx(v, with_truth=True), now - v.pause_t)), i, v)
                     for i, v in enumerate(cands)]
            keyed.sort()
            cands = [v for _, _, v in keyed]
        plan = self.policy.victim_decision if getattr(self.policy, "plan_victims", False) else None
        for v in cands:
            if got >= deficit:
                break
            if not v.evictable or v.moving is not None:
                continue
            d = None
            if plan is not None:
                d = plan(self._ctx(v, with_truth=True), self.now - v.pause_t)
                act = Action(d.action)
            else:
                act = Action(self.policy.victim_action(self._ctx(v, with_truth=True)))
            self.m.victims[act.value] = self.m.victims.get(act.value, 0) + 1
            if act == Action.RETAIN:
                v.evictable = False                    # pinned for this pause
                continue
            self.evr.evicted(self.now)
            blocks = v.hbm
            if act == Action.RECOMPUTE:
                self._drop(v)
            else:
                moved = self._offload(v, act)
                mv = v.moving
                if mv is not None and v.hbm and mv.then in COPY_OUT:
                    # freed when the copy-out completes (only a copy-out frees them: a copy already
                    # complete frees at once, and a prefetch pending on the landing may then start
                    # a reload that must not count as blocks on their way to free)
                    mv.victim_blocks = blocks
                    self.pending_free += blocks
                if d is not None and moved:
                    self.lifecycle.evicted(v.s.id, d)   # its way back, through the controller
            got += blocks
        return got

    def _emergency(self, exclude: SessionState) -> bool:
        for v in self.paused_hbm:
            if v is not exclude and v.moving is None and v.hbm:
                self.m.emergency += 1
                self.evr.evicted(self.now)
                self._drop(v)
                return True
        return False

    def _wedged(self) -> bool:
        """Nothing is running and no foreground transfer is in flight: no event will free HBM
        (tool returns and arrivals only add demand), so a blocked queue head waits forever."""
        return (self.pending_free <= 0 and not self.eng.busy
                and self.fg_inflight == 0)

    def _preempt_queued(self, head: SessionState, need: int) -> bool:
        """Wedge breaker: resumed rounds queued behind ``head`` may hold HBM (their state was
        still resident, or came back, when their tool returned) and are not paused, so no
        victim rule reaches them; when they fill the pool the node deadlocks.  Free their HBM,
        latest return first, until ``need`` fits: a complete lower-tier copy is kept (reloaded
        when the round starts), otherwise the state is dropped (recomputed).  Counted in
        ``emergency_preemptions`` and ``resume_queue_preemptions``.  True if anything was freed."""
        freed = False
        for v in reversed(self.resume_q):
            if need <= self._free():
                break
            if v is head or not v.hbm or v.moving is not None:
                continue
            self.m.emergency += 1
            self.m.queue_preempted += 1
            freed = True
            if v.copy_tier is not None and v.copy_blocks >= self.blocks(v.ctx):
                if v in self.clean:                  # no longer a duplicate of HBM
                    del self.clean[v]
                    self.clean_blocks -= v.copy_blocks
                    self._refresh_durable(v)
                self._hbm(v, 0)
                v.place = P_HOST if v.copy_tier == "host" else P_NVME
            else:
                self._drop(v)
        return freed

    def _resume_head(self) -> SessionState:
        """The resumed round admitted next: the queue's head (FIFO, vLLM's and SGLang's FCFS), or
        with ``NodeConfig.holders_first`` the first queued round whose context is still resident
        in HBM (retained, prefetched back, or its copy-out in flight), as vLLM's scheduler drains
        its ``kv_holding_waiting`` queue (requests that hold KV blocks) before ``waiting``."""
        q = self.resume_q
        if self.holders_first:
            for y in q:
                if y.hbm and y.hbm >= self.blocks(y.ctx):
                    return y
        return q[0]

    def _pop_resume(self, x: SessionState) -> None:
        if self.resume_q[0] is x:
            self.resume_q.popleft()
        else:
            self.resume_q.remove(x)

    def _pump(self) -> None:
        while self.resume_q:
            x = self._resume_head()
            r = x.rounds[x.k]
            total = self.blocks(x.ctx + r.new_tokens + r.output_tokens)
            if total + sum(self.shared_loaded.values()) > self.hbm_total:
                self._pop_resume(x)
                self._reject(x)
                continue
            need = total - x.hbm
            if need <= self._free():
                self._pop_resume(x)
                self._hbm(x, x.hbm + need)
                self._start_round(x)
                continue
            deficit = need - self._free() - self.pending_free
            if deficit > 0:
                self._evict(deficit, x)
                if need <= self._free():
                    continue
                if self.pending_free <= 0 and not self.eng.busy and self._emergency(x):
                    continue
                if self._wedged() and self._preempt_queued(x, need):
                    continue
            break
        if self.resume_q:
            return
        while self.new_q:
            x = self.new_q[0]
            r = x.rounds[0]
            sp = x.s.shared_prefix_id
            sh = 0 if (sp is None or sp in self.shared_loaded) else self.blocks(x.shared)
            need = sh + self.blocks(r.new_tokens + r.output_tokens)
            if need + sum(self.shared_loaded.values()) > self.hbm_total:
                self.new_q.popleft()
                self._reject(x)
                continue
            shared_total = sum(self.shared_loaded.values())
            if self.used + need <= self.ceiling_blocks or (self.used == shared_total and need <= self._free()):
                # under the ceiling, or alone on an otherwise empty node (a session bigger than the
                # ceiling would otherwise wait forever)
                self.new_q.popleft()
                if sh:
                    self.shared_loaded[sp] = sh
                    self._set_used(sh)
                    x.recompute = x.shared      # the first user prefills the shared prefix
                self._hbm(x, need - sh)
                self.m.admit_waits.append(self.now - x.s.arrival_s)
                self.m.admit_recent.add(self.now, self.now - x.s.arrival_s)
                self._start_round(x)
                continue
            deficit = self.used + need - self.ceiling_blocks - self.pending_free
            if deficit > 0:
                self._evict(deficit, None)
                if self.used + need <= self.ceiling_blocks:
                    continue
            break

    def _reject(self, x: SessionState) -> None:
        x.phase = REJECTED
        self._close_record(x)
        self._idle_flush(x)
        self._unlist(x)
        self._hbm(x, 0)
        self._set_copy(x, None, 0)
        self.m.rejected += 1
