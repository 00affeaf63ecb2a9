"""The transformers hook's per-trajectory state, and its one owner.

:class:`Trajectories` holds one :class:`HFTrajectory` record per agent
trajectory of an :class:`~kvtier.engine_adapter.hf.AgentSession`; the
session's collaborators (the device transfers, the lifecycle hooks) are handed
records, never the session.  What the lifecycle tells the hook to do with a
pause is an :class:`Order`; a paused cache's way back to the device is a
:class:`Reload`; each lease end while the tool ran is a :class:`Demotion`.

Threads: the session's public methods (one caller thread) create and mutate
records; the lifecycle's thread (lease ends, reloads) mutates a paused
record's ``action``, ``reload``, ``cache`` and ``demotions`` holding its
``lock``, which the session's ``pause`` and ``resume`` hold too.  A ``Reload``
is started once (its ``started`` event, set under the transfers' job lock) and
resolved through its ``ready`` future.
"""
from __future__ import annotations

import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Mapping

from kvtier.tiering.lifecycle import Plan
from kvtier.tiering.model.decision import Action, Decision
from kvtier.tiering.model.tiers import Tier

OFFLOADS = (Action.OFFLOAD_HOST, Action.OFFLOAD_NVME)
_ACTION_OF_TIER = {None: Action.RECOMPUTE, Tier.HOST: Action.OFFLOAD_HOST, Tier.NVME: Action.OFFLOAD_NVME,
                   Tier.DEVICE: Action.RETAIN}


class SessionError(ValueError):
    """Bad use of a session (unknown trajectory, wrong state, geometry mismatch); state is unchanged."""


@dataclass(frozen=True)
class Order:
    """What the lifecycle asks of one pause's device cache: the policy's decision
    (:meth:`of`), or, under a schedule that asks no policy (TTL), its plan's tier."""

    action: Action
    reason: str = ""
    prefetch_at_s: float | None = None     # the device reload, seconds after the pause (None: at the resume)
    demote_at_s: float | None = None       # the lease, seconds after the pause (None: none)
    costs: Mapping[str, float] = field(default_factory=dict)   # the decision's per-action costs, if it gave them

    @classmethod
    def of(cls, plan: Plan, decision: Decision | None) -> "Order":
        """The order of a pause the controller planned (``decision``: the policy's, None: none)."""
        if decision is None:
            return cls(_ACTION_OF_TIER[plan.tier], plan.reason)
        return cls(Action(decision.action), decision.reason, decision.prefetch_at_s, decision.demote_at_s,
                   dict(decision.extra))


@dataclass(frozen=True)
class Demotion:
    """One lease end while the tool ran: the placement stepped from ``from_action`` to ``to_action``."""

    at_s: float                    # the lease time, seconds after the pause
    from_action: Action
    to_action: Action              # == from_action: the lease was renewed
    bytes_moved: int               # bytes written by the step (D2H + store, or host -> NVMe)
    reason: str


@dataclass
class Reload:
    """One paused trajectory's store -> frames -> device reload (started once: by its
    ``Event.RELOAD`` timer at ``at_s`` after the pause, or by the resume)."""

    keys: tuple[bytes, ...]
    seq_len: int
    at_s: float | None = None      # the prefetch time it is timed for (None: on resume)
    started: threading.Event = field(default_factory=threading.Event)
    ready: Future = field(default_factory=Future)   # -> (HFLayout, h2d Completion) or None on a miss
    missing: tuple[bytes, ...] = ()
    bytes_loaded: int = 0


@dataclass
class HFTrajectory:
    """One trajectory: its tokens, its device cache and, while paused, its pause."""

    tid: str
    tokens: list[int]
    cache: Any | None                 # transformers DynamicCache while on the device
    cached_len: int                   # tokens[:cached_len] have KV in the cache (or stored)
    pending: list[int]                # tokens to feed at the next forward
    paused: bool = False
    tool: str = ""
    t_pause: float = 0.0
    order: Order | None = None        # what the lifecycle asked at the pause
    action: Action | None = None      # where the KV is now (after a fallback or a lease step)
    reload: Reload | None = None
    reload_waits: list[float] | None = None   # filled while the first forward waits on layer groups
    lock: threading.RLock = field(default_factory=threading.RLock)   # pause state vs lease steps
    keys: tuple[bytes, ...] = ()              # content keys of the context at the pause
    kv_bytes: int = 0                         # device KV bytes at the pause
    features: Mapping[str, str] | None = None
    true_wait: float | None = None            # passed to the policy (the oracle reads it)
    scripted_wait: float | None = None        # the tool's known wait (scripted tools), else None
    demotions: list[Demotion] = field(default_factory=list)

    def lease_at(self) -> float | None:
        """The pause's lease time if it can expire: a placement with a lease that was
        carried out as ordered, before a scripted return."""
        o = self.order
        if o is None or o.demote_at_s is None or self.action != o.action \
                or self.action not in (Action.RETAIN, Action.OFFLOAD_HOST):
            return None
        return None if self.scripted_wait is not None and o.demote_at_s >= self.scripted_wait else o.demote_at_s


class Trajectories:
    """A session's trajectories by id (the one owner of the records).

    ``add``, ``get`` and ``active`` are the session's (its caller thread);
    ``find`` is also called from the lifecycle's thread (a dict read)."""

    def __init__(self) -> None:
        self._by_id: dict[str, HFTrajectory] = {}

    def add(self, tr: HFTrajectory) -> None:
        """Raises SessionError for a duplicate id."""
        if tr.tid in self._by_id:
            raise SessionError(f"trajectory {tr.tid!r} already exists")
        self._by_id[tr.tid] = tr

    def find(self, tid: str) -> HFTrajectory | None:
        return self._by_id.get(tid)

    def get(self, tid: str) -> HFTrajectory:
        """Raises SessionError for an unknown id."""
        tr = self._by_id.get(tid)
        if tr is None:
            raise SessionError(f"unknown trajectory {tid!r}")
        return tr

    def active(self, tid: str) -> HFTrajectory:
        """Raises SessionError for an unknown or a paused trajectory."""
        tr = self.get(tid)
        if tr.paused:
            raise SessionError(f"trajectory {tid!r} is paused for {tr.tool!r}; resume it first")
        return tr

    def all(self) -> list[HFTrajectory]:
        return list(self._by_id.values())
