"""The lifecycle controller: a tool-wait forecast carried out on the store over time.

One controller per store.  The engine plugins (vLLM, SGLang, the HF hook)
feed it hints and pauses; it asks its :class:`~.schedules.Schedule` once per
pause and then acts on the store through the ``BlockStore`` protocol only::

    engine thread (cheap, no I/O)         kvtier threads (store I/O)
    -----------------------------         --------------------------------------
    hint(tid, tool)                       make_room(n)   host victims -> NVMe,
    plan_for(tid, ...) -> Plan (tier)                    by forecast (largest
    add_blocks(tid, keys)                                victim_key first)
    pause(tid)      -> timers             tick()         LEASE  -> re-ask policy
    resume(tid)     -> observed wait                     DEMOTE -> host -> NVMe
                       fed to the policy                 STAGE  -> NVMe -> host frames
                                                         EXPIRE -> drop

Engine-facing methods take the controller's lock, touch only the registry
and the schedule (a policy's ``decide`` is cheap and never blocks), and
never raise for a trajectory they do not know.  Store I/O runs in
:meth:`make_room` (called by the plugin's own I/O threads before a host
write) and :meth:`tick` (the :class:`~.timer.LifecycleTimer` thread, or a
test / the simulator driving a :class:`~.clock.ManualClock`).

Threading: every public method is thread-safe; registry state is owned by
``_lock``; store calls are made outside it.
"""
from __future__ import annotations

import logging
import math
import threading
from collections import Counter, deque
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

from kvtier.tiering.decision import PauseContext

from .clock import Clock, MonotonicClock
from .registry import Event, Plan, Registry, Trajectory, Where
from .schedules import Schedule

if TYPE_CHECKING:  # the protocol has no dependencies; imported for types only
    from kvtier.store.protocol import BlockStore

log = logging.getLogger("kvtier.lifecycle")


class LifecycleController:
    """See the module doc.

    store:        the BlockStore the plugin writes to (demote, prepare_load /
                  complete_load, drop, stats are used).
    schedule:     a Schedule (ForecastSchedule over a policy, or TTLSchedule).
    clock:        a Clock; MonotonicClock by default.
    price_bytes:  tokens -> the KV bytes a policy should price a pause at
                  (default: the blocks' stored bytes).
    """

    def __init__(self, store: "BlockStore", schedule: Schedule, *, clock: Clock | None = None,
                 block_bytes: int, price_bytes: Callable[[int], int] | None = None,
                 history: int = 1024) -> None:
        if block_bytes <= 0:
            raise ValueError(f"block_bytes must be > 0, got {block_bytes!r}")
        self.store, self.schedule = store, schedule
        self.clock = clock or MonotonicClock()
        self.block_bytes = int(block_bytes)
        self._price = price_bytes
        self._reg = Registry()
        self._lock = threading.Lock()
        self._io = threading.Lock()            # one make_room / tick at a time
        self.counters: Counter[str] = Counter()
        self.events: deque[tuple[float, str, str, str]] = deque(maxlen=history)  # (t, tid, what, detail)
        self._waits: deque[float] = deque(maxlen=history)
        self._wake: Callable[[], None] = lambda: None

    # ------------------------------------------------------------ engine side
    def hint(self, tid: str, tool: str | None, *, features: Mapping[str, str] | None = None,
             context_tokens: int | None = None, resume: bool = True) -> None:
        """The tool ``tid`` will wait on at its next pause (None: no hint).
        With ``resume`` (a new request of the trajectory: vLLM) a paused
        ``tid`` is back; without it (more blocks of the same pause: SGLang's
        backup batches) the pause goes on."""
        with self._lock:
            t = self._reg.get_or_create(tid)
            if t.paused_at is not None:
                if not resume:
                    return
                self._resume_locked(t)
            if tool is not None or resume:   # a new request without a tool: it will not pause on one
                t.tool, t.features = tool, features
            if context_tokens is not None:
                t.context_tokens = max(t.context_tokens, int(context_tokens))

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
            if t.plan is None:
                t.plan = self.schedule.plan(t, self._ctx(t))
                self.counters[f"decision:{t.plan.action}"] += 1
                self._event(t, "decide", f"{t.plan.action} -> {t.plan.tier} ({t.plan.reason})")
            return t.plan

    def add_blocks(self, tid: str, keys: Iterable[bytes]) -> None:
        """Remember that ``keys`` hold ``tid``'s KV (any order of calls with plan_for)."""
        with self._lock:
            self._reg.get_or_create(tid).add_keys(keys)

    def block_count(self, tid: str) -> int:
        """How many block keys ``tid`` has (0 if unknown)."""
        with self._lock:
            t = self._reg.get(tid)
            return 0 if t is None else len(t.keys)

    def pause(self, tid: str, keys: Iterable[bytes] | None = None) -> Plan | None:
        """``tid`` paused now (vLLM: request finished; SGLang: its backup was
        written).  Starts the plan's timers.  Returns the plan (None: unhinted)."""
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
            t.paused_at = now
            t.where = Where.NOWHERE if plan.tier is None else Where(plan.tier)
            # blocks stored at earlier pauses may sit in the other tier: move them to the plan's now
            if plan.tier == "nvme":
                self._reg.schedule(now, t, Event.DEMOTE)
            elif plan.tier == "host":
                self._reg.schedule(now, t, Event.STAGE)
            for dt, ev in plan.timers:
                self._reg.schedule(now + dt, t, ev)
            self.counters["pauses"] += 1
            self._event(t, "pause", f"{t.where} timers={[(round(dt, 3), str(e)) for dt, e in plan.timers]}")
        self._wake()
        return plan

    def resume(self, tid: str) -> float | None:
        """``tid`` is back: cancel its timers, feed the observed wait to the
        schedule's policy.  Returns the wait (None if it was not paused)."""
        with self._lock:
            t = self._reg.get(tid)
            return None if t is None or t.paused_at is None else self._resume_locked(t)

    def where(self, tid: str) -> Where | None:
        with self._lock:
            t = self._reg.get(tid)
            return None if t is None else t.where

    def _resume_locked(self, t: Trajectory) -> float:
        wait = max(0.0, self.clock.now() - t.paused_at)
        t.paused_at, t.plan, t.decision = None, None, None
        t.pause_no += 1
        t.reuses += 1
        t.where = Where.RUNNING
        t.last_wait_s = wait
        self._waits.append(wait)
        self.counters["resumes"] += 1
        if t.tool is not None:
            try:
                self.schedule.observe(t.tool, wait, t.features)
            except Exception as exc:   # feedback must never reach the engine
                log.warning("kvtier: observe(%r, %.3g) failed: %s", t.tool, wait, exc)
        self._event(t, "resume", f"wait {wait:.3f}s")
        return wait

    # ------------------------------------------------------------ kvtier side (store I/O)
    def make_room(self, n_blocks: int, *, for_tid: str | None = None) -> int:
        """Free host frames for ``n_blocks`` by demoting paused trajectories,
        largest ``victim_key`` first (for a staging ``for_tid``: only those
        expected back later than it).  Returns blocks demoted.  Never raises."""
        with self._io:
            return self._make_room(n_blocks, for_tid)

    def _make_room(self, n_blocks: int, for_tid: str | None, target_free: int | None = None) -> int:
        try:
            s = self.store.stats()
        except Exception as exc:
            log.debug("kvtier: stats failed: %s", exc)
            return 0
        total, used = int(s.host_frames_total), int(s.host_frames_used)
        need = (n_blocks if target_free is None else target_free) - (total - used)
        if need <= 0 or total == 0:
            return 0
        with self._lock:
            now = self.clock.now()
            own = self._reg.get(for_tid) if for_tid else None
            own_key = self._key(own, now) if own is not None and own.paused_at is not None else None
            cands = [(self._key(t, now), t) for t in self._reg.paused(Where.HOST) if t is not own]
            cands.sort(key=lambda kt: -kt[0])
            if own_key is not None:
                cands = [(k, t) for k, t in cands if k > own_key]
        moved = 0
        for _, t in cands:
            moved += self._demote(t, "victim")
            try:
                s = self.store.stats()
            except Exception:
                break
            if (n_blocks if target_free is None else target_free) <= s.host_frames_total - s.host_frames_used:
                break
        return moved

    def tick(self) -> int:
        """Carry out every due timer and the watermarks.  Returns timers handled.  Never raises."""
        with self._io:
            with self._lock:
                due = self._reg.pop_due(self.clock.now())
            for t, ev, _ in due:
                try:
                    self._handle(t, ev)
                except Exception as exc:  # a store fault must not kill the timer thread
                    self.counters["errors"] += 1
                    log.warning("kvtier: %s of %s failed: %s", ev, t.tid, exc)
            self._watermarks()
            return len(due)

    def next_due(self) -> float | None:
        with self._lock:
            return self._reg.next_due()

    def _handle(self, t: Trajectory, ev: Event) -> None:
        if ev is Event.DEMOTE:
            self._demote(t, "age")
        elif ev is Event.EXPIRE:
            self._drop(t, "idle ttl")
        elif ev is Event.STAGE:
            self._stage(t)
        elif ev is Event.LEASE:
            with self._lock:
                if t.paused_at is None or t.where is not Where.HOST:
                    return
                elapsed = self.clock.now() - t.paused_at
                out = self.schedule.on_lease(t, self._ctx(t), elapsed)
                for at, e in out.timers:
                    self._reg.schedule(t.paused_at + at, t, e)
                self.counters["leases"] += 1
                self._event(t, "lease", f"{out.move} ({out.action})")
            if out.move == "demote":
                self._demote(t, "lease end")
            elif out.move == "drop":
                self._drop(t, "lease end: recompute")

    def _demote(self, t: Trajectory, why: str) -> int:
        """Host -> NVMe (callers hold ``_io``, so no two moves of one trajectory overlap)."""
        with self._lock:
            if t.where in (Where.NOWHERE, Where.RUNNING) or t.paused_at is None:
                return 0
            keys, no = list(t.keys), t.pause_no
        n = self.store.demote(keys)
        with self._lock:
            if t.pause_no == no and t.paused_at is not None:
                t.where = Where.NVME
        self.counters["demoted_blocks"] += n
        self.counters["demotions"] += 1
        self._event(t, "demote", f"{n} blocks host -> nvme ({why})")
        return n

    def _drop(self, t: Trajectory, why: str) -> None:
        with self._lock:
            if t.paused_at is None:
                return
            keys, no = list(t.keys), t.pause_no
        n = self.store.drop(keys)
        with self._lock:
            if t.pause_no == no and t.paused_at is not None:
                t.where = Where.NOWHERE
        self.counters["dropped_blocks"] += n
        self._event(t, "drop", f"{n} blocks ({why})")

    def _stage(self, t: Trajectory) -> None:
        """NVMe -> host frames for ``t``'s blocks not in host frames now: room is
        made first (victims expected back later than ``t``), then the store's
        two-phase load promotes what fits into free frames (it evicts nothing)."""
        with self._lock:
            if t.where not in (Where.NVME, Where.HOST) or t.paused_at is None:
                return
            keys, no = list(t.keys), t.pause_no
        below = [k for k in keys if "host" not in {str(x) for x in self.store.where(k)}]
        if below:
            self._make_room(len(below), t.tid)
            res = self.store.prepare_load(below)
            self.store.complete_load(res.handle)
            still = sum(1 for k in below if "host" not in {str(x) for x in self.store.where(k)})
        else:
            still = 0
        with self._lock:
            if t.paused_at is not None and t.where in (Where.NVME, Where.HOST) and t.pause_no == no:
                t.where = Where.HOST if not still else t.where
        staged = len(below) - still
        self.counters["staged_blocks"] += staged
        if below:
            self.counters["stagings"] += 1
            self._event(t, "stage", f"{staged}/{len(below)} blocks nvme -> host")

    def _watermarks(self) -> None:
        wm = self.schedule.watermarks
        if wm is None:
            return
        try:
            s = self.store.stats()
        except Exception:
            return
        total = int(s.host_frames_total)
        if total and s.host_frames_used > wm[0] * total:
            self.counters["watermark_runs"] += 1
            self._make_room(0, None, target_free=total - int(wm[1] * total))

    # ------------------------------------------------------------ helpers
    def _ctx(self, t: Trajectory) -> PauseContext:
        tokens = int(t.context_tokens)
        stored = len(t.keys) * self.block_bytes
        kv = int(self._price(tokens)) if self._price is not None and tokens else stored
        return PauseContext(tool=t.tool or "unknown", kv_bytes=max(kv, 0), context_tokens=tokens,
                            now_s=self.clock.now(), features=t.features, trajectory_id=t.tid)

    def _key(self, t: Trajectory, now: float) -> float:
        try:
            return float(self.schedule.victim_key(t, self._ctx(t), max(0.0, now - (t.paused_at or now))))
        except Exception:
            return math.inf

    def _event(self, t: Trajectory, what: str, detail: str) -> None:
        self.events.append((self.clock.now(), t.tid, what, detail))
        log.debug("kvtier: %s %s %s", t.tid, what, detail)

    def set_waker(self, wake: Callable[[], None]) -> None:
        """Called by a timer thread: ``wake()`` when a new timer may be due earlier."""
        self._wake = wake

    def stats(self) -> dict[str, Any]:
        """Counters (decisions by action, pauses, resumes, demoted/staged/dropped
        blocks, leases), paused trajectories by tier, and recent observed waits."""
        with self._lock:
            out: dict[str, Any] = dict(self.counters)
            out["paused"] = Counter(str(t.where) for t in self._reg.paused())
            out["trajectories"] = len(self._reg)
            w = sorted(self._waits)
        out["observed_wait_p50_s"] = w[len(w) // 2] if w else None
        return out
