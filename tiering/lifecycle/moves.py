"""The lifecycle's moves on the store: demote, drop, stage, make room.

:class:`StoreMoves` is the engines' (and the HF hook's) :class:`~.backend.Moves`:
synchronous ``BlockStore`` calls.  It works on the core's
:class:`~.shared.Shared` view (registry under its lock, clock, counters) and
owns its own notes (stagings to retry, pauses a staging displaced, running
trajectories released).  Every move does store I/O: callers hold the core's
``_io`` lock (one move at a time) and never ``Shared.lock`` across a store
call.  Called from kvtier threads only (the lifecycle timer, the plugin's I/O
pool), never from an engine thread.

Engine loads first: demotions and stagings run in slices, each store call
made through :class:`~.yielding.YieldingStore`, which waits (bounded) while
the plugin's :class:`~.foreground.Foreground` gate says an engine load is in
progress; a move of a trajectory that resumed meanwhile stops (its own load
reads the rest).
"""
from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

from kvtier.tiering.model.tiers import Move, Tier

from .pruning import Pruner
from .registry import Event, Trajectory
from .schedules import LeaseOutcome, Schedule
from .shared import Shared
from .staging_payoff import StagingPayoff
from .yielding import YieldingStore

if TYPE_CHECKING:  # the protocol has no dependencies; imported for types only
    from kvtier.store.protocol import BlockStore


class StoreMoves:
    """Demotion, staging, eviction by forecast and watermarks on ``store`` (see
    the module doc).  ``shared``: the core's view; ``schedule``: its schedule;
    ``block_bytes``: bytes of one block; ``pruner``: forgets idle trajectories
    on the ticks (None: never).  Its store calls go through ``io``, a
    :class:`~.yielding.YieldingStore` (slices, the engine-load gate, the move log).
    """

    release_after_s: float = 10.0    # a trajectory running this long (clock seconds) gives up its host frames to a staging
    restage_every_s: float = 4.0     # clock seconds between tries of a staging that came up short
    restage_tries: int = 16          # tries per pause at most
    restore_per_tick: int = 2        # host pauses brought back per tick at most

    def __init__(self, store: "BlockStore", shared: Shared, schedule: Schedule, *, block_bytes: int,
                 pruner: Pruner | None = None) -> None:
        self.store = store
        self.shared = shared
        self.schedule = schedule
        self.block_bytes = int(block_bytes)
        self.pruner = pruner
        self.counters = shared.counters
        self._reg, self._lock = shared.reg, shared.lock
        self.io = YieldingStore(store, shared, block_bytes=block_bytes)
        self.payoff = StagingPayoff()    # speculative stagings stop where their blocks are pushed out unread
        self._restage: dict[str, tuple[int, int]] = {}   # tid -> (pause, tries) of a staging that came up short
        self._displaced: dict[str, int] = {}             # tid -> pause of a pause a staging displaced (_restore)
        self._released: dict[str, tuple[int, int]] = {}  # tid -> (resume, blocks) of a running one with none left in host
        self._seen_demotions = -1   # the store's demotion count at the last restore check
        self._seen_pauses = -1      # the core's pause count at the last restore check

    # ------------------------------------------------------------ the views' part (pruning.py, victims.py)
    def released(self, t: Trajectory) -> bool:
        """Running ``t`` gave up all its host frames in its current run (lock held)."""
        return self._released.get(t.tid) == (t.pause_no, len(t.keys))

    def forget_locked(self, tids: list[str]) -> None:
        """Forget the trajectories ``tids`` (lock held): the registry's entries and
        timers, and these moves' notes on them."""
        if not tids:
            return
        self._reg.forget(tids)
        for tid in tids:
            self.payoff.forget(tid)
            self._released.pop(tid, None)
            self._restage.pop(tid, None)
            self._displaced.pop(tid, None)
        self.counters["forgotten"] += len(tids)
        self.shared.order_changed()

    # ------------------------------------------------------------ the core's placement points (lock held)
    def pause_moves(self, t: Trajectory, tier: Tier | None, now: float) -> None:
        """Blocks stored at earlier pauses may sit in the other tier: demote them now for an
        NVMe plan; for a host plan bring them back to host frames at the schedule's restage
        time (:meth:`_arm_stage`)."""
        if tier is Tier.NVME:
            self._reg.schedule(now, t, Event.DEMOTE)
        elif tier is Tier.HOST and self._arm_stage(t, now):
            self._reg.schedule(now, t, Event.STAGE)

    def _arm_stage(self, t: Trajectory, now: float) -> bool:
        """A host plan's blocks below host frames come back at the schedule's restage
        time (:meth:`~.schedules.Schedule.restage_at`: breakeven's when the staging pays
        over the forecast, the baselines' at once), and only while such stagings keep
        their blocks until the resume (:class:`~.staging_payoff.StagingPayoff`).  A later
        time arms a timer; True: the staging is due now (the caller makes it).  Lock held."""
        at = self.shared.restage_at(t, now)
        if at is None:
            self.counters["stagings_priced_out"] += 1
            return False
        if not self.payoff.allow():
            self.counters["stagings_skipped"] += 1
            return False
        if at > now:
            self.counters["stagings_timed"] += 1
            self._reg.schedule(at, t, Event.STAGE)
            return False
        return True

    def lease_applies(self, t: Trajectory, evicted: bool) -> bool:
        return evicted or t.where in (Tier.HOST, Tier.DEVICE)

    def arm_lease(self, t: Trajectory, out: LeaseOutcome) -> None:
        self._reg.schedule_after_pause(t, out.timers)

    def arm_return(self, t: Trajectory, timers: tuple[tuple[float, Event], ...]) -> None:
        self._reg.schedule_after_pause(t, timers)

    # ------------------------------------------------------------ moves (no lock held)
    def lease_move(self, t: Trajectory, where: Tier | None, out: LeaseOutcome, evicted: bool) -> int:
        """A lease answer on the store: drop, demote, or (kept in host frames,
        also after an eviction) bring back what was pushed out.  A pause in a
        plugin's device memory (``Tier.DEVICE``) is its hooks' move."""
        if where is Tier.DEVICE:
            return 0
        if out.move is Move.DROP:
            self.drop(t, "lease end: recompute")
        elif out.move is Move.DEMOTE and not evicted:
            return self.demote(t, "lease end")
        elif out.move is Move.KEEP and (evicted or where is Tier.HOST):
            # host is still the plan: bring back what was pushed out, when and while that pays
            with self._lock:
                now = self.shared.clock.now()
                due = t.paused_at is not None and self._arm_stage(t, now)
            self.shared.wake()
            if due:
                self.stage(t)
        return 0

    def make_room(self, n_blocks: int, for_tid: str | None, *, any_victim: bool = False) -> bool:
        """Free host frames for ``n_blocks`` more blocks; True if they are free now.

        Victims: paused trajectories in host frames by the schedule's victim
        key, largest first.  For a paused ``for_tid`` (a staging) first the
        trajectories *running* now (not paused) that still have blocks in host
        frames and have run for ``release_after_s`` (longest first) -- the
        engine holds their KV while they run, and a finished one never comes
        back -- then only paused victims whose key is larger than
        its own (a pause never displaces one the forecast wants back sooner),
        also for a context larger than the host tier (only its *writes* give
        way to pauses that fit: :class:`~.victims.OversizeVictims`); the room
        may then be partial: as much as those victims free (the staging brings
        back the prefix that fits)."""
        free = self.io.free_frames()
        if free is None:
            return False
        if n_blocks <= free:
            return True
        with self._lock:
            now = self.shared.clock.now()
            own = self._reg.get(for_tid) if for_tid else None
            # a running trajectory being admitted may displace anyone; a paused one being
            # staged only those the forecast wants back later than it
            own_key = None if own is None or any_victim or own.paused_at is None else self.shared.key(own, now)
            running = [] if own_key is None else sorted(   # only a staging takes frames from running ones
                ((t, t.pause_no) for t in self._reg if t.paused_at is None and t.keys and t is not own
                 and t.resumed_at is not None and now - t.resumed_at >= self.release_after_s
                 and not self.released(t)),
                key=lambda tn: tn[0].resumed_at)
            cands = [(self.shared.key(t, now), t) for t in self._reg.paused(Tier.HOST) if t is not own]
            cands = sorted(((k, t) for k, t in cands if own_key is None or k > own_key), key=lambda kt: -kt[0])
        for t, no in running:
            if self._release_running(t, no, n_blocks - free):
                free = self.io.free_frames()
                if free is None:
                    return False
                if n_blocks <= free:
                    return True
        for _, t in cands:
            # a whole session at the watermarks (vLLM's lifecycle); else no more than the room wanted
            if self.demote(t, "victim", limit=None if any_victim else n_blocks - free) and own_key is not None:
                with self._lock:
                    if t.paused_at is not None:
                        self._displaced[t.tid] = t.pause_no    # brought back by _restore when its turn comes
            self.shared.plan_return(t)
            free = self.io.free_frames()
            if free is None:
                return False
            if n_blocks <= free:
                return True
        return False

    def oversize(self, t: Trajectory) -> bool:
        """``t``'s context is larger than the whole host tier (lock held): the
        blocks it has, or the context its hint announced (``context_tokens``
        over the tokens per block the plugin's ``plan_blocks`` calls tell), so a
        plugin that writes a context a batch at a time is known from its first."""
        frames = self.shared.host_frames
        if not frames:
            return False
        tpb = self.shared.tokens_per_block
        expected = int(t.context_tokens / tpb) if tpb > 0 else 0
        return max(len(t.keys), expected) > frames

    def _release_running(self, t: Trajectory, no: int, limit: int) -> int:
        """Demote up to ``limit`` host-frame blocks of ``t`` (the context's end
        first), running since its resume ``no`` (its KV is the engine's
        meanwhile), in slices yielding to engine loads; stops if it pauses.
        Returns the blocks it asked the store to move down."""
        with self._lock:
            keys = list(t.keys)
        in_host = self.io.host_tail(keys, limit)
        if len(in_host) < limit:    # none left in host frames after this: not looked at again while it runs
            with self._lock:
                self._released[t.tid] = (no, len(keys))
        step = self.io.slice()
        for lo in range(0, len(in_host), step):
            self.io.yield_to_engine()
            with self._lock:
                if t.pause_no != no or t.paused_at is not None:
                    break
            t0 = time.perf_counter()
            self.store.demote(in_host[lo:lo + step])
            self.io.log("release", t.tid, len(in_host[lo:lo + step]), t0)
        if in_host:
            self.counters["released_blocks"] += len(in_host)
            self.shared.event(t, "release", f"{len(in_host)} blocks of a running trajectory host -> nvme")
        return len(in_host)

    def demote(self, t: Trajectory, why: str, *, limit: int | None = None) -> int:
        """Host -> NVMe: all of ``t``'s blocks, or (``limit``: a victim making room
        for that many) only its last ``limit`` blocks in host frames, so a pause
        gives up no more DRAM than another needs.  Callers hold ``_io``, so no two
        moves of one trajectory overlap."""
        with self._lock:
            if t.where is None or t.paused_at is None:
                return 0
            keys, no = list(t.keys), t.pause_no
        keys = self.io.host_tail(keys, limit)   # only blocks in host frames: an NVMe plan's are mostly below already
        n, step, done = 0, self.io.slice(), True
        for lo in range(0, len(keys), step):
            self.io.yield_to_engine()
            if not self.shared.current(t, no):
                done = False        # resumed meanwhile: the rest stays in host frames
                break
            t0 = time.perf_counter()
            got = self.store.demote(keys[lo:lo + step])
            self.io.log("demote", t.tid, got, t0)
            n += got
        if done and limit is not None:   # a victim's prefix may stay in host frames
            with self._lock:
                rest = list(t.keys)
            done = not any(self.host_mask(rest))
        with self._lock:
            if done and t.pause_no == no and t.paused_at is not None:
                t.where = Tier.NVME
        self.counters["demoted_blocks"] += n
        self.counters["demotions"] += 1
        self.shared.event(t, "demote", f"{n} blocks host -> nvme ({why})")
        return n

    def drop(self, t: Trajectory, why: str) -> None:
        with self._lock:
            if t.paused_at is None:
                return
            keys, no = list(t.keys), t.pause_no
        t0 = time.perf_counter()
        n = self.store.drop(keys)
        self.io.log("drop", t.tid, n, t0)
        with self._lock:
            if t.pause_no == no and t.paused_at is not None:
                t.where = None
        self.counters["dropped_blocks"] += n
        self.shared.event(t, "drop", f"{n} blocks ({why})")

    def stage(self, t: Trajectory) -> None:
        """NVMe -> host frames for ``t``'s blocks not in host frames now: room is
        made first (victims expected back later than ``t``, also for a context
        larger than the host tier, see docs/engines.md), then the
        store's two-phase load promotes what fits into free frames (it evicts
        nothing), a slice of at most the free frames at a time, yielding to
        engine loads; no free frame, or ``t`` resumed, ends it (a block read
        with no frame to land in would be read for nothing)."""
        with self._lock:
            if t.where not in (Tier.NVME, Tier.HOST) or t.paused_at is None:
                return
            keys, no = list(t.keys), t.pause_no
        below = [k for k, h in zip(keys, self.host_mask(keys)) if not h]
        if below and not self.make_room(len(below), t.tid):
            self.counters["stage_short"] += 1      # what fits is staged; the rest loads from NVMe
        step, lo = self.io.slice(), 0
        while lo < len(below):
            self.io.yield_to_engine()
            if not self.shared.current(t, no):
                break
            free = self.io.free_frames()
            if not free:
                break               # no free frame: nothing is read that could not land in one
            part = below[lo:lo + min(step, free)]
            lo += len(part)
            t0 = time.perf_counter()
            res = self.store.prepare_load(part)
            self.store.complete_load(res.handle)
            got = sum(1 for s in res.slots if s.tier == Tier.NVME)
            self.io.log("stage", t.tid, got, t0)
            if len(res.slots) < len(part) or not self.store.host_mask(part[-1:])[0]:
                break               # a block gone, or the frames were taken meanwhile: the rest loads from NVMe
        mask = self.host_mask(below)
        still = mask.count(False)
        self.payoff.staged(t.tid, no, [k for k, h in zip(below, mask) if h])
        with self._lock:
            if t.paused_at is not None and t.where in (Tier.NVME, Tier.HOST) and t.pause_no == no:
                t.where = Tier.HOST if not still else t.where
                self._retry_later(t, still)
        self.shared.wake()
        staged = len(below) - still
        self.counters["staged_blocks"] += staged
        if below:
            self.counters["stagings"] += 1
            self.shared.event(t, "stage", f"{staged}/{len(below)} blocks nvme -> host")

    def _retry_later(self, t: Trajectory, still: int) -> None:
        """A staging left ``still`` blocks below host frames: try again in
        ``restage_every_s`` (frames come free as others resume, finish or are
        released), up to ``restage_tries`` times per pause.  Lock held."""
        tries = self._restage.get(t.tid)
        if not still or (tries is not None and tries[0] != t.pause_no):
            self._restage.pop(t.tid, None)
            tries = None
        if not still:
            return
        n = 0 if tries is None else tries[1]
        if n >= self.restage_tries:
            return
        self._restage[t.tid] = (t.pause_no, n + 1)
        self._reg.schedule(self.shared.clock.now() + self.restage_every_s, t, Event.STAGE)

    def host_mask(self, keys: list[bytes]) -> list[bool]:
        """Which of ``keys`` are in host frames (no lock held; steps aside for engine loads)."""
        return self.io.host_mask(keys)

    def _restore(self, demotions: int) -> None:
        """Bring back host pauses that lost frames, the one expected back soonest
        first, each displacing only pauses expected back later (:meth:`make_room`):

        * pushed out by the store's LRU (another's host write took their
          frames; the controller was not asked), on a tick after the store
          demoted something: a pause counts as pushed out when its first
          block (written first, so the LRU's first victim) is not in host frames;
        * displaced by a staging (:meth:`make_room` records them), on a tick
          after a pause or a demotion, while the schedule still wants them in
          host frames (:meth:`~.schedules.Schedule.wants_host`) and a paused
          holder of host frames is now expected back later than them: the
          staging's trajectory resumed and paused again on a longer tool (on
          the Mooncake trace, a 1,893-block context expected back in 0.1 s
          displaces a 1,296-block one at trace s 33, then pauses on a 63 s
          ``test``; the 1,296-block context's five resumes follow within 4 s).
        """
        pauses = self.counters["pauses"]
        if demotions == self._seen_demotions and pauses == self._seen_pauses:
            return
        pushed = demotions != self._seen_demotions
        self._seen_demotions, self._seen_pauses = demotions, pauses
        with self._lock:
            now = self.shared.clock.now()
            lru = [(t, t.keys[0]) for t in self._reg.paused(Tier.HOST) if pushed and t.keys
                   and t.plan is not None and t.plan.tier is Tier.HOST]
            displaced = self._displaced_now()
        firsts = self.host_mask([k for _, k in lru]) if lru else []
        out = [t for (t, _), h in zip(lru, firsts) if not h]
        if not out and not displaced:
            return
        with self._lock:   # each candidate's key once: the forecast is the dear part
            keyed = {t.tid: (self.shared.key(t, now), t) for t in out}
            if displaced:
                top = max((self.shared.key(h, now) for h in self._reg.paused(Tier.HOST)), default=-math.inf)
                for t in displaced:
                    if t.tid not in keyed:
                        k = self.shared.key(t, now)
                        if k < top:          # a paused holder of host frames is expected back later
                            keyed[t.tid] = (k, t)
            picked = [t for _, t in sorted(keyed.values(), key=lambda kt: kt[0])[:self.restore_per_tick]]
            # not before the schedule's restage time (its timer brings them back then)
            picked = [t for t in picked if (at := self.shared.restage_at(t, now)) is not None and at <= now]
        for t in picked:
            if not self.payoff.allow():
                self.counters["stagings_skipped"] += 1
                continue
            self.counters["restores"] += 1
            before = self.counters["staged_blocks"]
            self.stage(t)
            with self._lock:
                back = t.paused_at is not None and t.where is Tier.HOST
                if self._displaced.get(t.tid) == t.pause_no and (back or self.counters["staged_blocks"] == before):
                    del self._displaced[t.tid]   # back whole, or no room came free: its retries go on as any staging's

    def _displaced_now(self) -> list[Trajectory]:
        """Staging victims still in the pause they were displaced in, which the
        schedule wants in host frames (lock held); forgets the rest."""
        out = []
        for tid, no in list(self._displaced.items()):
            t = self._reg.get(tid)
            if t is None or t.paused_at is None or t.pause_no != no or not self.schedule.wants_host(t):
                del self._displaced[tid]
            else:
                out.append(t)
        return out

    def _check_payoff(self) -> None:
        """Which blocks staged for trajectories that resumed since were still in host frames."""
        tracked = self.payoff.tracked()
        if not tracked:
            return
        with self._lock:
            pause_of = {tid: None if (t := self._reg.get(tid)) is None else t.pause_no for tid in tracked}
        for _, keys in self.payoff.due(pause_of):
            kept = sum(self.host_mask(keys))
            self.payoff.resumed(len(keys), kept)
            self.counters["staged_checked_blocks"] += len(keys)
            self.counters["staged_kept_blocks"] += kept

    def watermarks(self) -> None:
        """Every tick: refresh the host fill the policy is shown, bring back host
        pauses the store pushed out (:meth:`_restore`), the schedule's watermarks,
        then forget idle trajectories (``pruner``, when due)."""
        try:
            f = self.store.host_frames()
        except Exception:
            return
        total = int(f.total)
        self.shared.note_fill(total, int(f.used))
        self._check_payoff()
        if self.schedule.watermarks is None:
            self._restore(int(f.demotions))
        wm = self.schedule.watermarks
        if wm is not None and total and f.used > wm[0] * total:
            self.counters["watermark_runs"] += 1
            self.make_room(total - int(wm[1] * total), None, any_victim=True)
        if self.pruner is not None:
            self.pruner.run(self)
