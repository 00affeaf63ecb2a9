"""The lifecycle controller's core: registry, schedule, timers and their dispatch.

:class:`ControllerCore` is what every holder of paused KV shares: the
trajectory registry fed by hints and pauses, the :class:`~.schedules.Schedule`
asked once per pause, the timers its plan arms, the dispatch of a due timer
(:meth:`_handle`: lease end -> :meth:`_lease`, demote, stage, expire, reload)
and the observed wait fed back at a resume.  What a move *does* is the
:class:`~.backend.Moves` it holds (no mode flags)::

    LifecycleController = ControllerCore holding StoreMoves   (engines, HF hook:
                          synchronous BlockStore calls, tiering/lifecycle/moves.py)
    SimController       = ControllerCore holding SimMoves     (the simulator: timed
                          transfers on its FIFO servers, bench/sim/lifecycle.py)

The moves are built over the core's :class:`~.shared.Shared` view (the
registry under its lock, the clock, counters, and the core services a move
calls), never over the core itself.  A plugin that holds paused KV in its own
device memory passes :class:`~.device.DeviceHooks` (the HF hook; the
simulator's HBM).

Threading: every public method is thread-safe; registry state is owned by
``Shared.lock`` (``_lock`` here); moves are made outside it, one at a time
under ``_io``.
"""
from __future__ import annotations

import logging
import math
import threading
from collections import Counter, deque
from typing import Any, Callable, Iterable, Mapping, Protocol

from kvtier.tiering.model.decision import Decision, PauseContext
from kvtier.tiering.model.tiers import Tier

from .backend import Moves
from .clock import Clock, MonotonicClock
from .device import DeviceHooks, LeaseEnd
from .registry import Event, Plan, Registry, Trajectory
from .retag import Retagged, outcome
from .schedules import Schedule
from .shared import Shared

log = logging.getLogger("kvtier.lifecycle")
_PLAN: Any = object()      # pause(tier=...) default: the plan's tier


class VictimOrder(Protocol):
    """A store's host victim order the core keeps fresh (victims.py)."""

    def invalidate(self) -> None: ...


class ControllerCore:
    """The registry/schedule/timer core (see the module doc) holding its moves.

    schedule:     a Schedule (ForecastSchedule over a policy, TTLSchedule, DeviceSchedule).
    clock:        a Clock; MonotonicClock by default.
    block_bytes:  bytes of one block (a pause is priced at its blocks' bytes by default).
    price_bytes:  tokens -> the KV bytes a policy should price a pause at.
    host_price_bytes: the host DRAM the policy's hardware model has (None:
                  ``host_free_bytes`` is left unbounded); see LifecycleController.
    pool_price_bytes: the engine's KV pool the policy's hardware model has: a
                  pause's ``hbm_pressure`` is the KV of every paused trajectory
                  (its own included) over it, at most 1 -- how far the engine's
                  cache is from keeping them all (None: 0, as a holder that says
                  nothing); see LifecycleController.
    registry:     the Registry holding trajectories and timers (a simulator's
                  puts timers on its own event heap); a fresh one by default.
    device:       DeviceHooks of a plugin holding KV in its device memory, or None.
    moves:        builds the core's :class:`~.backend.Moves` over its :class:`~.shared.Shared` view.
    Raises ValueError for ``block_bytes <= 0`` or ``pool_price_bytes <= 0``.
    """

    def __init__(self, schedule: Schedule, *, moves: Callable[[Shared], Moves], clock: Clock | None = None,
                 block_bytes: int, price_bytes: Callable[[int], int] | None = None,
                 host_price_bytes: float | None = None, pool_price_bytes: float | None = None,
                 history: int = 1024, device: DeviceHooks | None = None,
                 registry: Registry | None = None) -> None:
        if block_bytes <= 0:
            raise ValueError(f"block_bytes must be > 0, got {block_bytes!r}")
        if pool_price_bytes is not None and not (math.isfinite(pool_price_bytes) and pool_price_bytes > 0):
            raise ValueError(f"pool_price_bytes must be a positive number of bytes, got {pool_price_bytes!r}")
        self._pool_price = pool_price_bytes
        self._paused_kv: tuple[tuple[int, int, int], float] = ((-1, -1, -1), 0.0)   # (pauses, resumes, forgotten) -> bytes
        self.schedule = schedule
        self.block_bytes = int(block_bytes)
        self._price = price_bytes
        self._host_price = host_price_bytes
        self.shared = Shared(Registry() if registry is None else registry, clock or MonotonicClock(),
                             event=self._event, key=self._key, plan_return=self._plan_return,
                             order_changed=self._order_changed, restage_at=self._restage_at)
        self._reg, self._lock = self.shared.reg, self.shared.lock
        self._io = threading.Lock()            # one move sequence (tick, settle, make_room) at a time
        self.counters = self.shared.counters
        self.events: deque[tuple[float, str, str, str]] = deque(maxlen=history)  # (t, tid, what, detail)
        self._waits: deque[float] = deque(maxlen=history)
        # resumes' waits not yet given to the schedule (learn()); bounded: under a flood the oldest go unlearned
        self._unlearned: deque[tuple[str, float, Mapping[str, str] | None]] = deque(maxlen=history)
        self.device = device
        self.victims: VictimOrder | None = None   # a store's host victim order (victims.py), or None
        # the engine's own KV pool use in [0, 1] (vLLM: its block pool, holds included), or None:
        # then the paused trajectories' KV over pool_price_bytes stands in for it
        self.pool_usage: Callable[[], float] | None = None
        self.moves: Moves = moves(self.shared)

    @property
    def clock(self) -> Clock:
        return self.shared.clock

    # ------------------------------------------------------------ engine side
    def hint(self, tid: str, tool: str | None, *, features: Mapping[str, str] | None = None,
             context_tokens: int | None = None, resume: bool = True) -> None:
        """The tool ``tid`` will wait on at its next pause (None: no hint).
        With ``resume`` (a new request of the trajectory: vLLM) a paused
        ``tid`` is back; without it (more blocks of the same pause: SGLang's
        backup batches) the pause goes on."""
        with self._lock:
            t = self._reg.get_or_create(tid)
            t.seen_at = self.clock.now()
            if t.paused_at is not None:
                if not resume:
                    return
                self._resume_locked(t)
            if tool is not None or resume:   # a new request without a tool: it will not pause on one
                t.tool, t.features = tool, features
            if context_tokens is not None:
                t.context_tokens = max(t.context_tokens, int(context_tokens))
            self._order_changed()

    def plan_for(self, tid: str, *, context_tokens: int | None = None) -> Plan | None:
        """The plan of ``tid``'s coming pause, decided once (the first call of a
        pause episode asks the schedule; later calls reuse it).  None: the
        trajectory has no tool hint (the plugin uses its default tier)."""
        with self._lock:
            t = self._reg.get(tid)
            if t is None or t.tool is None:
                return None
            if context_tokens is not None:
                t.context_tokens = max(t.context_tokens, int(context_tokens))
            return self._plan_locked(t)

    def plan_blocks(self, tid: str, keys: Iterable[bytes], *, tokens_per_block: float,
                    context_tokens: int | None = None) -> Plan | None:
        """One store job of ``tid`` (one call, one lock): ``keys`` hold its KV
        (as :meth:`add_blocks`), its context is ``context_tokens`` (default: its
        blocks so far times ``tokens_per_block``, the plugin's count), and the
        plan of its coming pause is returned (as :meth:`plan_for`; None: no tool
        hint, the plugin places by default).  ``tokens_per_block`` also tells
        the moves how large a hint's announced context is in blocks."""
        with self._lock:
            t = self._reg.get_or_create(tid)
            t.seen_at = self.clock.now()
            if t.add_keys(keys):
                self._order_changed()
            if t.tool is None:
                return None
            if tokens_per_block > 0:
                self.shared.tokens_per_block = float(tokens_per_block)
            n = len(t.keys) * tokens_per_block if context_tokens is None else context_tokens
            t.context_tokens = max(t.context_tokens, int(n))
            return self._plan_locked(t)

    def _plan_locked(self, t: Trajectory) -> Plan:
        if t.plan is None:
            t.plan = self.schedule.plan(t, self._ctx(t))
            self._order_changed()
            self.counters[f"decision:{t.plan.action}"] += 1
            plan = t.plan
            self._event(t, "decide", lambda: f"{plan.action} -> {plan.tier} ({plan.reason})")
        return t.plan

    def retag(self, tid: str, tool: str, *, forecast: str) -> Retagged:
        """``tid``'s coming or current pause waits on ``tool``, not on ``forecast``,
        the tool it was told (:mod:`.retag`: set, and planned again if paused).
        Never raises for a trajectory it does not know."""
        with self._lock:
            t = self._reg.get(tid)
            out = outcome(t, tool, forecast)
            self.counters[f"retag:{out}"] += 1
            if not out.applied:
                return out
            t.tool, t.retagged, t.plan, t.decision = tool, t.pause_no, None, None
            self._event(t, "retag", lambda: f"{forecast} -> {tool} ({out})")
            if out is Retagged.REPLANNED:
                self._reg.cancel(t)
                plan = self._plan_locked(t)
                if t.where is not Tier.DEVICE:
                    self.moves.pause_moves(t, plan.tier, self.clock.now())
                self._reg.schedule_after_pause(t, plan.timers)
            self._order_changed()
        self.shared.wake()
        return out

    def add_blocks(self, tid: str, keys: Iterable[bytes]) -> None:
        """Remember that ``keys`` hold ``tid``'s KV (any order of calls with plan_for)."""
        with self._lock:
            t = self._reg.get_or_create(tid)
            t.seen_at = self.clock.now()
            if t.add_keys(keys):
                self._order_changed()

    def set_blocks(self, tid: str, keys: Iterable[bytes]) -> None:
        """``tid``'s KV is exactly ``keys`` now (a plugin whose last, partial
        block gets a new key as the context grows: the HF hook)."""
        with self._lock:
            t = self._reg.get_or_create(tid)
            t.seen_at = self.clock.now()
            t.keys, t.key_set = [], set()
            t.add_keys(keys)
            self._order_changed()

    def current(self, tid: str, pause_no: int) -> bool:
        """True while ``tid`` is paused in its pause number ``pause_no`` (a device hook's staleness check)."""
        with self._lock:
            t = self._reg.get(tid)
            return t is not None and t.paused_at is not None and t.pause_no == pause_no

    def block_count(self, tid: str) -> int:
        """How many block keys ``tid`` has (0 if unknown)."""
        with self._lock:
            t = self._reg.get(tid)
            return 0 if t is None else len(t.keys)

    def pause(self, tid: str, keys: Iterable[bytes] | None = None, *, tier: Tier | None = _PLAN,
              timers: Iterable[tuple[float, Event]] = (), until_s: float | None = None) -> Plan | None:
        """``tid`` paused now (vLLM: request finished; SGLang: its backup was
        written).  Starts the plan's timers.  Returns the plan (None: unhinted).

        ``tier``: where the plugin actually put the blocks when that is not the
        plan's tier (``Tier.DEVICE``: kept in its device memory, the HF hook's
        retain; None: nothing written, a fallback to recompute).  ``timers``: the
        plugin's own timers, (seconds after the pause, event), e.g. ``Event.RELOAD``.
        ``until_s``: the caller knows the pause ends then (a scripted tool):
        timers at or after it are not armed."""
        with self._lock:
            t = self._reg.get(tid)
            if t is None:
                return None
            if keys is not None:
                t.add_keys(keys)
            if t.paused_at is not None or t.tool is None:
                return t.plan
            plan = t.plan or self.schedule.plan(t, self._ctx(t))
            if t.plan is None:
                self.counters[f"decision:{plan.action}"] += 1
            t.plan = plan
            now = self.clock.now()
            t.paused_at, t.resumed_at, t.seen_at = now, None, now
            tier = plan.tier if tier is _PLAN else None if tier is None else Tier(tier)
            t.where = tier
            self.moves.pause_moves(t, tier, now)
            for dt, ev in (*plan.timers, *timers):
                if until_s is None or dt < until_s:
                    self._reg.schedule(now + dt, t, ev)
            self.counters["pauses"] += 1
            self._order_changed()
            where = t.where or "nowhere"
            self._event(t, "pause", lambda: f"{where} timers={[(round(dt, 3), str(e)) for dt, e in plan.timers]}")
        self.shared.wake()
        return plan

    def resume(self, tid: str, *, wait_s: float | None = None) -> float | None:
        """``tid`` is back: cancel its timers, feed the observed wait to the
        schedule's policy (``wait_s``: the wait the caller knows, a scripted
        tool's, instead of the clock's).  Returns the wait (None if it was not paused)."""
        with self._lock:
            t = self._reg.get(tid)
            return None if t is None or t.paused_at is None else self._resume_locked(t, wait_s)

    def where(self, tid: str) -> Tier | None:
        """Where paused ``tid``'s blocks are (None: running, unknown, or a pause that
        placed nothing)."""
        with self._lock:
            t = self._reg.get(tid)
            return None if t is None else t.where

    def decision(self, tid: str) -> Decision | None:
        """The schedule's decision for ``tid``'s current pause (ForecastSchedule:
        the policy's Decision; None for TTL or an unknown trajectory)."""
        with self._lock:
            t = self._reg.get(tid)
            return None if t is None else t.decision

    def add_timer(self, tid: str, at_s: float, event: Event) -> bool:
        """A plugin's own timer for ``tid``'s current pause, ``at_s`` seconds
        after it.  False (nothing armed) if ``tid`` is not paused."""
        with self._lock:
            t = self._reg.get(tid)
            if t is None or t.paused_at is None:
                return False
            self._reg.schedule(t.paused_at + max(0.0, float(at_s)), t, event)
        self.shared.wake()
        return True

    def settle(self, tid: str, before_s: float, *, max_leases: int = 64) -> int:
        """Carry out now, in order, ``tid``'s lease ends due before ``before_s``
        seconds after its pause, each asked at its own lease time: a scripted
        tool whose wait the caller knows, with time fast-forwarded.  Stagings
        and reloads are left to the clock.  Returns leases handled.  Never raises.
        Call from a kvtier or caller thread holding none of a plugin's locks the
        device hooks take."""
        n = 0
        with self._io:
            for _ in range(max_leases):
                with self._lock:
                    t = self._reg.get(tid)
                    at = None if t is None or t.paused_at is None else \
                        self._reg.pop_event(t, Event.LEASE, t.paused_at + before_s)
                if at is None:
                    break
                try:
                    self._handle(t, Event.LEASE, at, elapsed=at - t.paused_at)
                except Exception as exc:
                    self.counters["errors"] += 1
                    log.warning("kvtier: settling %s failed: %s", tid, exc)
                n += 1
        return n

    def _resume_locked(self, t: Trajectory, wait_s: float | None = None) -> float:
        wait = max(0.0, self.clock.now() - t.paused_at) if wait_s is None else max(0.0, float(wait_s))
        t.paused_at, t.plan, t.decision = None, None, None
        t.resumed_at = t.seen_at = self.clock.now()
        t.pause_no += 1
        t.reuses += 1
        t.where = None
        t.last_wait_s = wait
        self._waits.append(wait)
        self._order_changed()
        self.counters["resumes"] += 1
        if t.tool is not None:      # learned before the schedule's next answer (_ctx), not on the engine's resume
            self._unlearned.append((t.tool, wait, t.features))
        self._event(t, "resume", lambda: f"wait {wait:.3f}s")
        return wait

    def learn(self) -> int:
        """Give the schedule every wait observed at a resume and not yet given
        (the schedule's ``observe``); :meth:`tick` and every schedule answer do
        this first.  Returns the waits given.  Never raises."""
        with self._lock:
            return self._learn_locked()

    def _learn_locked(self) -> int:
        n = len(self._unlearned)
        while self._unlearned:
            tool, wait, features = self._unlearned.popleft()
            try:
                self.schedule.observe(tool, wait, features)
            except Exception as exc:   # feedback must never reach the engine
                log.warning("kvtier: observe(%r, %.3g) failed: %s", tool, wait, exc)
        return n

    def tick(self) -> int:
        """Carry out every due timer and the watermarks.  Returns timers handled.  Never raises."""
        with self._io:
            with self._lock:
                self._learn_locked()
                due = self._reg.pop_due(self.clock.now())
            for t, ev, at in due:
                try:
                    self._handle(t, ev, at)
                except Exception as exc:  # a store fault must not kill the timer thread
                    self.counters["errors"] += 1
                    log.warning("kvtier: %s of %s failed: %s", ev, t.tid, exc)
            self.moves.watermarks()
            return len(due)

    def next_due(self) -> float | None:
        with self._lock:
            return self._reg.next_due()

    def fire(self, tid: str, pause_no: int, event: Event, at: float) -> bool:
        """Carry out one timer that the caller's own event loop held (a
        simulator whose registry puts timers on its heap): ``tid``'s ``event``
        of its pause ``pause_no``, due at ``at``.  False (nothing done) if that
        pause is over.  Never raises for a stale timer."""
        with self._io:
            with self._lock:
                t = self._reg.get(tid)
                if t is None or t.pause_no != pause_no or t.paused_at is None:
                    return False
            self._handle(t, event, at)
            return True

    def evicted(self, tid: str, decision: Decision | None = None) -> None:
        """The holder moved paused ``tid`` out of its device memory by its own
        victim choice (HBM victims are the device's: the simulator's admission,
        vLLM's and SGLang's schedulers); ``decision``: the policy's plan for the
        victim (``victim_decision``), adopted as the pause's decision.  Arms the
        schedule's way back (``on_evicted``) like a pause's plan."""
        with self._lock:
            t = self._reg.get(tid)
            if t is None or t.paused_at is None:
                return
            if decision is not None:
                t.decision = decision
            self.counters["evicted"] += 1
        self._plan_return(t)

    def _plan_return(self, t: Trajectory) -> None:
        """After an eviction: the schedule's timers to bring ``t`` back."""
        with self._lock:
            if t.paused_at is None:
                return
            try:
                timers = self.schedule.on_evicted(t, self._ctx(t), max(0.0, self.clock.now() - t.paused_at))
            except Exception as exc:
                log.debug("kvtier: on_evicted(%s) failed: %s", t.tid, exc)
                return
            self.moves.arm_return(t, timers)
        if timers:
            self.shared.wake()

    def _handle(self, t: Trajectory, ev: Event, at: float | None = None, *, elapsed: float | None = None) -> None:
        if ev is Event.RELOAD:
            if self.device is not None and t.paused_at is not None and at is not None:
                self.device.reload(t.tid, t.pause_no, at - t.paused_at)
            return
        if ev is Event.DEMOTE:
            self.moves.demote(t, "age")
        elif ev is Event.EXPIRE:
            self.moves.drop(t, "idle ttl")
        elif ev is Event.STAGE:
            self.moves.stage(t)
        elif ev is Event.LEASE:
            self._lease(t, elapsed)

    def _lease(self, t: Trajectory, elapsed: float | None) -> None:
        """A lease ended: re-ask the schedule, then the moves carry out its
        answer (``Moves.lease_move``) and the device hooks their side."""
        with self._lock:
            evicted = t.where is Tier.NVME and t.plan is not None and t.plan.tier is Tier.HOST
            if t.paused_at is None or not self.moves.lease_applies(t, evicted):
                return
            where, no = t.where, t.pause_no
            elapsed = self.clock.now() - t.paused_at if elapsed is None else elapsed
            out = self.schedule.on_lease(t, self._ctx(t), elapsed)
            self.moves.arm_lease(t, out)
            self.counters["leases"] += 1
            if out.action is not None:
                self.counters[f"lease:{out.action}"] += 1
            self._event(t, "lease", lambda: f"{out.move} ({out.action}){' after eviction' if evicted else ''} "
                                            f"timers={[(round(dt, 3), str(e)) for dt, e in out.timers]}")
        moved = self.moves.lease_move(t, where, out, evicted)
        if self.device is not None:
            self._device_leased(t, LeaseEnd(t.tid, no, elapsed, out.move, out.action, t.decision,
                                            t.where, moved, out.timers))

    def _device_leased(self, t: Trajectory, end: LeaseEnd) -> None:
        """Tell the device hooks a lease ended; record where they left the blocks."""
        now_where = self.device.leased(end)
        with self._lock:
            if t.pause_no == end.pause_no and t.paused_at is not None:
                t.where = now_where

    # ------------------------------------------------------------ helpers
    def _ctx(self, t: Trajectory) -> PauseContext:
        """The PauseContext a schedule sees for ``t`` (the device hooks' view,
        when there are hooks), the waits observed so far learned first (lock held)."""
        if self._unlearned:
            self._learn_locked()
        ctx = self._base_ctx(t)
        return ctx if self.device is None else self.device.context(t, ctx)

    def _base_ctx(self, t: Trajectory) -> PauseContext:
        kv = self._kv_bytes(t)
        free = math.inf if self._host_price is None else self._host_price * self.shared.host_free_share
        return PauseContext(tool=t.tool or "unknown", kv_bytes=kv, context_tokens=int(t.context_tokens),
                            now_s=self.clock.now(), features=t.features, trajectory_id=t.tid,
                            host_free_bytes=free, hbm_pressure=self._pool_pressure(t, kv))

    def _kv_bytes(self, t: Trajectory) -> int:
        """The KV bytes ``t`` is priced at (lock held)."""
        tokens = int(t.context_tokens)
        kv = int(self._price(tokens)) if self._price is not None and tokens else len(t.keys) * self.block_bytes
        return max(kv, 0)

    def _pool_pressure(self, t: Trajectory, kv: int) -> float:
        """The engine's pool use (``pool_usage``) where it tells it; else the paused
        trajectories' KV, ``t``'s ``kv`` included, over the engine's
        pool (``pool_price_bytes``), at most 1; 0 without a pool (lock held).  The
        sum is kept until the next pause, resume or forgetting."""
        usage = self.pool_usage
        if usage is not None:
            try:
                return min(1.0, max(0.0, float(usage())))
            except Exception as exc:     # a reading must never fail a decision
                log.debug("kvtier: pool usage unreadable: %s", exc)
        if self._pool_price is None:
            return 0.0
        c = self.counters
        stamp = (c["pauses"], c["resumes"], c["forgotten"])
        seen, total = self._paused_kv
        if seen != stamp:
            total = float(sum(self._kv_bytes(p) for p in self._reg.paused()))
            self._paused_kv = (stamp, total)
        if t.paused_at is None:
            total += kv
        return min(1.0, total / self._pool_price)

    def _key(self, t: Trajectory, now: float) -> float:
        try:
            return float(self.schedule.victim_key(t, self._ctx(t), max(0.0, now - (t.paused_at or now))))
        except Exception:
            return math.inf

    def _restage_at(self, t: Trajectory, now: float) -> float | None:
        """The clock time the schedule brings paused ``t``'s pushed-out blocks back
        to host frames (None: never; lock held); a failing schedule: at once."""
        elapsed = max(0.0, now - (t.paused_at if t.paused_at is not None else now))
        try:
            at = self.schedule.restage_at(t, self._ctx(t), elapsed)
        except Exception as exc:
            log.debug("kvtier: restage_at(%s) failed: %s", t.tid, exc)
            return now
        return None if at is None else now + max(0.0, float(at) - elapsed)

    def _order_changed(self) -> None:
        if self.victims is not None:
            self.victims.invalidate()

    def _event(self, t: Trajectory, what: str, detail: "str | Callable[[], str]") -> None:
        """Record one lifecycle event (``detail``: its text, or a callable making it,
        called only here: a backend that records nothing pays no formatting)."""
        if callable(detail):
            detail = detail()
        self.events.append((self.clock.now(), t.tid, what, detail))
        log.debug("kvtier: %s %s %s", t.tid, what, detail)

    def set_clock(self, clock: Clock) -> None:
        """Run on ``clock`` from now on (a replay's trace clock, the simulator's).
        Call before any traffic: times already recorded stay in the old clock's seconds."""
        with self._lock:
            self.shared.clock = clock

    def set_device(self, hooks: DeviceHooks | None) -> None:
        """Attach (or, with None, detach) the DeviceHooks of a plugin that keeps
        paused KV in its device memory (the HF hook does this itself)."""
        with self._lock:
            self.device = hooks

    def set_waker(self, wake: Callable[[], None]) -> None:
        """Called by a timer thread: ``wake()`` when a new timer may be due earlier."""
        self.shared.wake = wake

    def counter_values(self) -> dict[str, int]:
        """The counters alone (decisions by action as ``decision:<action>``, pauses,
        resumes, demoted/staged/dropped blocks, leases): a copy, cheap enough
        for an engine's per-step metrics."""
        with self._lock:
            return dict(self.counters)

    def stats(self) -> dict[str, Any]:
        """:meth:`counter_values`, paused trajectories by tier, and recent observed waits."""
        with self._lock:
            out: dict[str, Any] = dict(self.counters)
            out["paused"] = Counter(str(t.where or "nowhere") for t in self._reg.paused())
            out["trajectories"] = len(self._reg)
            w = sorted(self._waits)
        out["observed_wait_p50_s"] = w[len(w) // 2] if w else None
        return out

