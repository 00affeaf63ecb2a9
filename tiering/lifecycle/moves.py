"""The lifecycle controller's moves on the store: demote, drop, stage, make room.

A mixin of :class:`~.controller.LifecycleController` (it uses the
controller's ``store``, ``schedule``, ``clock``, ``_reg``, ``_lock``,
``counters`` and helpers).  Every method here does store I/O: callers hold the
controller's ``_io`` lock (one move at a time) and never its ``_lock`` across
a store call.  Called from kvtier threads only (the lifecycle timer, the
plugin's I/O pool), never from an engine thread.
"""
from __future__ import annotations

import logging

from .registry import Trajectory, Where

log = logging.getLogger("kvtier.lifecycle")


class StoreMoves:
    """Demotion, staging, eviction by forecast and watermarks (see the module doc)."""

    def _free_frames(self) -> int | None:
        try:
            s = self.store.stats()
        except Exception as exc:
            log.debug("kvtier: stats failed: %s", exc)
            return None
        total, used = int(s.host_frames_total), int(s.host_frames_used)
        self._note_fill(total, used)
        return total - used

    def _make_room(self, n_blocks: int, for_tid: str | None, *, any_victim: bool = False) -> bool:
        free = self._free_frames()
        if free is None:
            return False
        if n_blocks <= free:
            return True
        with self._lock:
            now = self.clock.now()
            own = self._reg.get(for_tid) if for_tid else None
            # a running trajectory being admitted may displace anyone; a paused one being
            # staged only those the forecast wants back later than it
            own_key = None if own is None or any_victim or own.paused_at is None else self._key(own, now)
            cands = [(self._key(t, now), t) for t in self._reg.paused(Where.HOST) if t is not own]
            cands = sorted(((k, t) for k, t in cands if own_key is None or k > own_key), key=lambda kt: -kt[0])
            if own_key is not None and sum(len(t.keys) for _, t in cands) < n_blocks - free:
                return False      # a staging that cannot get its room moves nobody
        for _, t in cands:
            self._demote(t, "victim")
            self._plan_return(t)
            free = self._free_frames()
            if free is None:
                return False
            if n_blocks <= free:
                return True
        return False

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
            for at, ev in timers:
                self._reg.schedule(t.paused_at + at, t, ev)
        if timers:
            self._wake()

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
        if below and not self._make_room(len(below), t.tid):
            self.counters["stage_short"] += 1      # what fits is staged; the rest loads from NVMe
        if below:
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
        self._note_fill(total, int(s.host_frames_used))
        if total and s.host_frames_used > wm[0] * total:
            self.counters["watermark_runs"] += 1
            self._make_room(total - int(wm[1] * total), None, any_victim=True)

    def _note_fill(self, total: int, used: int) -> None:
        self._host_free_share = (total - used) / total if total > 0 else 0.0
