"""The trajectory registry: what the lifecycle controller knows about each agent.

A trajectory is an agent conversation (vLLM ``session_id``/``conversation_id``/
``kv_session_id`` or a kvtier ``trajectory_id``).  It alternates between
running (the engine holds its KV) and paused (waiting on a tool; its blocks
live in kvtier).  The registry keeps, per trajectory, the tool it waits on,
its block keys, where its blocks are, the pause's plan and its pending timers.

Threading: a :class:`Registry` is owned by one :class:`LifecycleController`
and mutated only under the controller's lock; it takes no lock itself.
"""
from __future__ import annotations

import enum
import heapq
import itertools
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Mapping

from kvtier.tiering.model.decision import Decision
from kvtier.tiering.model.tiers import Tier


class Event(str, enum.Enum):
    """Timer kinds (seconds after the pause)."""
    LEASE = "lease"       # the host lease ends: re-ask the policy (demote or renew)
    DEMOTE = "demote"     # host -> NVMe unconditionally (fixed demotion age)
    STAGE = "stage"       # NVMe -> host frames: ahead of the predicted return, a host pause's older blocks, a retry
    EXPIRE = "expire"     # idle TTL: forget the blocks
    RELOAD = "reload"     # the plugin's own reload to the device (DeviceHooks.reload: the HF prefetch)

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Plan:
    """What a schedule wants for one pause: the tier blocks are written to
    (None: write nothing; a tier name is taken as its :class:`Tier`) and
    timers as (seconds after the pause, event)."""

    tier: Tier | None
    timers: tuple[tuple[float, Event], ...] = ()
    action: str | None = None      # the policy's action name, for logs and stats
    reason: str = ""

    def __post_init__(self) -> None:
        if self.tier is not None and type(self.tier) is not Tier:
            object.__setattr__(self, "tier", Tier(self.tier))


@dataclass
class Trajectory:
    """One agent trajectory.  ``keys``: its store block keys, in context order
    (deduplicated); ``pause_no`` counts pauses (a timer of an older pause is stale)."""

    tid: str
    tool: str | None = None
    features: Mapping[str, str] | None = None
    keys: list[bytes] = field(default_factory=list)
    key_set: set[bytes] = field(default_factory=set)
    context_tokens: int = 0
    where: Tier | None = None        # where kvtier placed its blocks while paused (None: running, or
                                     # a recompute-class pause: nothing below DRAM); DEVICE: still in the
                                     # plugin's device memory (the HF hook's retain), moved by its DeviceHooks
    plan: Plan | None = None
    decision: Decision | None = None  # the policy's decision for this pause (None: a schedule without a policy)
    paused_at: float | None = None
    resumed_at: float | None = None  # when its current run began (None: never paused, or paused now)
    pause_no: int = 0
    reuses: int = 0                  # resumes seen (vLLM's heat is (n-1)/n over uses)
    last_wait_s: float | None = None
    seen_at: float = 0.0             # clock time of its last hint, block, pause or resume (pruning.py)
    retagged: int = -1               # the pause number its tool was last corrected in (retag.py)

    def add_keys(self, keys) -> int:
        """Append keys not seen before; returns how many were new."""
        n = 0
        for k in keys:
            if k not in self.key_set:
                self.key_set.add(k)
                self.keys.append(k)
                n += 1
        return n

    @property
    def heat(self) -> float:
        n = self.reuses + 1
        return (n - 1) / n


class Registry:
    """Trajectories by id, plus a heap of pending timers ``(t, seq, tid, pause_no, event)``."""

    def __init__(self) -> None:
        self._by_id: dict[str, Trajectory] = {}
        self._timers: list[tuple[float, int, str, int, Event]] = []
        self._seq = itertools.count()

    def get(self, tid: str) -> Trajectory | None:
        return self._by_id.get(tid)

    def get_or_create(self, tid: str) -> Trajectory:
        t = self._by_id.get(tid)
        if t is None:
            t = self._by_id[tid] = Trajectory(tid)
        return t

    def forget(self, tids: "str | Iterable[str]") -> None:
        """Drop the trajectories ``tids`` (an id or ids), and their pending timers:
        an id that comes back is a new trajectory, whose pause numbers start again."""
        if isinstance(tids, str):
            tids = (tids,)
        gone = {tid for tid in tids if self._by_id.pop(tid, None) is not None}
        if gone:
            self._timers = [x for x in self._timers if x[2] not in gone]
            heapq.heapify(self._timers)

    def __iter__(self) -> Iterator[Trajectory]:
        return iter(list(self._by_id.values()))

    def __len__(self) -> int:
        return len(self._by_id)

    def paused(self, where: Tier | None = None) -> list[Trajectory]:
        """The paused trajectories (in ``where`` only, when given)."""
        return [t for t in self._by_id.values() if t.paused_at is not None
                and (where is None or t.where is where)]

    # -- timers
    def schedule(self, at: float, traj: Trajectory, event: Event) -> None:
        heapq.heappush(self._timers, (at, next(self._seq), traj.tid, traj.pause_no, event))

    def schedule_after_pause(self, traj: Trajectory, timers: Iterable[tuple[float, Event]]) -> None:
        """Schedule ``timers`` (seconds after ``traj``'s pause, event)."""
        for dt, ev in timers:
            self.schedule(traj.paused_at + dt, traj, ev)

    def cancel(self, traj: Trajectory) -> int:
        """Drop the pending timers of ``traj``'s current pause; returns how many."""
        keep = [x for x in self._timers if not (x[2] == traj.tid and x[3] == traj.pause_no)]
        n = len(self._timers) - len(keep)
        if n:
            self._timers = keep
            heapq.heapify(self._timers)
        return n

    def pending(self) -> list[tuple[float, str, int, Event]]:
        """The pending timers as (due at, tid, pause number, event), in no particular order."""
        return [(at, tid, no, ev) for at, _, tid, no, ev in self._timers]

    def next_due(self) -> float | None:
        return self._timers[0][0] if self._timers else None

    def pop_event(self, traj: Trajectory, event: Event, before: float) -> float | None:
        """Remove and return the time of ``traj``'s earliest current ``event`` timer due before
        ``before`` (None if there is none)."""
        best = None
        for i, (at, _, tid, no, ev) in enumerate(self._timers):
            if tid == traj.tid and no == traj.pause_no and ev is event and at < before \
                    and (best is None or at < self._timers[best][0]):
                best = i
        if best is None:
            return None
        at = self._timers.pop(best)[0]
        heapq.heapify(self._timers)
        return at

    def pop_due(self, now: float) -> list[tuple[Trajectory, Event, float]]:
        """Timers due at ``now`` whose pause is still current, in time order."""
        out = []
        while self._timers and self._timers[0][0] <= now:
            at, _, tid, no, ev = heapq.heappop(self._timers)
            t = self._by_id.get(tid)
            if t is not None and t.pause_no == no and t.paused_at is not None:
                out.append((t, ev, at))
        return out
