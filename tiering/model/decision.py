"""Plain data shared by every policy, the simulator, the engine hooks and the service.

A policy sees a :class:`PauseContext` (bytes, seconds, pressure; never
tensors) and returns a :class:`Decision`.  Baselines and kvtier's own
expected-cost policy implement the same :class:`Policy` interface so the
simulator and the engines can swap them by name.

This file is a contract: keep the names; add fields with defaults.
"""
from __future__ import annotations

import enum
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Mapping

from kvtier.tiering.model.tiers import Tier


class Action(str, enum.Enum):
    RETAIN = "retain"              # keep KV in HBM through the wait
    OFFLOAD_HOST = "offload_host"  # DMA to pinned host DRAM, prefetch back
    OFFLOAD_NVME = "offload_nvme"  # DMA to host, then on to the NVMe tier
    RECOMPUTE = "recompute"        # drop; rebuild by prefill on resume

    def __str__(self) -> str:  # so f"{action}" prints "retain"
        return self.value

    @property
    def tier(self) -> Tier | None:
        """Where this action keeps the KV through the wait (None: nowhere, recompute);
        see :mod:`kvtier.tiering.model.tiers`."""
        if self is Action.RECOMPUTE:
            return None
        return Tier.DEVICE if self is Action.RETAIN else Tier.HOST if self is Action.OFFLOAD_HOST else Tier.NVME


@dataclass(frozen=True)
class PauseContext:
    """Everything a policy may know when a trajectory pauses for a tool.

    kv_bytes:       the trajectory's whole KV state (what retain holds in HBM).
    new_bytes:      bytes not already stored in a lower tier (what an offload
                    must move; prefix blocks stored earlier don't move again).
    context_tokens: tokens of context (what recompute must prefill).
    hbm_pressure:   KV pool utilisation U_KV in [0, 1] at the pause.
    host_free_bytes / nvme_free_bytes: room left in the lower tiers.
    now_s:          simulation or wall clock at the pause.
    true_wait_s:    the real wait; set only for the oracle (None otherwise).
    features:       coarse tool features (command head, argument size, ...).
    evictable:      the holder evicts paused HBM-resident state when it needs the
                    room (asking victim_priority / victim_action), so a retained
                    pause can be made to leave later; False: a retained pause
                    stays until its tool returns or its lease expires.
    write_through:  the holder writes every host DRAM copy through to NVMe in
                    the background, so a host copy is a droppable cache entry:
                    when host room is needed it is dropped (the holder asks
                    victim_priority for the order) and the state reloads from
                    NVMe.  False: a host copy is the only copy.
    host_droppable_bytes: the part of ``host_free_bytes`` that is held by
                    droppable copies (already durable on NVMe, or duplicates of
                    HBM-resident state): room at no data loss, but occupied.
    admission_waiting_bytes: KV bytes of new work the holder has queued for
                    admission right now (0: nothing waits).  Non-zero means room
                    freed in HBM is taken at once, so evicting a retained pause
                    later is on the critical path of waiting work.
    link_out_queue_s: seconds a copy-out started now would wait behind transfers
                    already queued on the device -> host link (its backlog).
    link_in_queue_s: expected queue wait of a reload on the host -> device link
                    (e.g. the recent mean wait there).
    nvme_write_queue_s / nvme_read_queue_s: the same for the NVMe servers.
    link_utilisation: recent busy fraction of the host link in [0, 1] (the
                    busier direction); policies may price link time with it.
    All five default to 0 (a holder that does not know its queues).
    eviction_rate_per_s: how often, recently, the holder has evicted a paused
                    HBM-resident trajectory, per such trajectory and second
                    (victims taken over trajectory-seconds of evictable residence):
                    the hazard that a retained pause is made to leave.  None: the
                    holder does not measure it.
    admission_wait_s: how long new work has recently waited for admission: the
                    larger of the queue head's wait so far and the mean wait of
                    recent admissions (a holder's own decayed mean).  Short means
                    the node is not overloaded.  None: the holder does not measure it.
    """

    tool: str
    kv_bytes: int
    context_tokens: int
    new_bytes: int | None = None
    hbm_pressure: float = 0.0
    host_free_bytes: float = math.inf
    nvme_free_bytes: float = math.inf
    now_s: float = 0.0
    true_wait_s: float | None = None
    features: Mapping[str, str] | None = None
    trajectory_id: str | None = None
    evictable: bool = False
    write_through: bool = False
    host_droppable_bytes: float = 0.0
    admission_waiting_bytes: float = 0.0
    link_out_queue_s: float = 0.0
    link_in_queue_s: float = 0.0
    nvme_write_queue_s: float = 0.0
    nvme_read_queue_s: float = 0.0
    link_utilisation: float = 0.0
    eviction_rate_per_s: float | None = None
    admission_wait_s: float | None = None

    def __post_init__(self) -> None:
        if self.kv_bytes < 0 or self.context_tokens < 0:
            raise ValueError("kv_bytes and context_tokens must be >= 0")
        if self.new_bytes is not None and not (0 <= self.new_bytes <= self.kv_bytes):
            raise ValueError("new_bytes must be within [0, kv_bytes]")
        if not (0.0 <= self.hbm_pressure <= 1.0):
            raise ValueError(f"hbm_pressure must be in [0, 1], got {self.hbm_pressure}")
        for name in ("link_out_queue_s", "link_in_queue_s", "nvme_write_queue_s", "nvme_read_queue_s"):
            v = getattr(self, name)
            if not (v >= 0.0 and math.isfinite(v)):
                raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")
        if not (0.0 <= self.link_utilisation <= 1.0):
            raise ValueError(f"link_utilisation must be in [0, 1], got {self.link_utilisation}")
        h = self.eviction_rate_per_s
        if h is not None and not (h >= 0.0 and math.isfinite(h)):
            raise ValueError(f"eviction_rate_per_s must be None or a finite number >= 0, got {h!r}")
        w = self.admission_wait_s
        if w is not None and not (w >= 0.0 and math.isfinite(w)):
            raise ValueError(f"admission_wait_s must be None or a finite number >= 0, got {w!r}")

    @property
    def bytes_to_move(self) -> int:
        return self.kv_bytes if self.new_bytes is None else self.new_bytes


@dataclass(frozen=True)
class Decision:
    """What to do with a paused trajectory.

    prefetch_at_s: seconds after the pause at which to start reloading
                   (None for retain and recompute: nothing to reload).
    demote_at_s:   lease expiry: seconds after the pause at which, if the tool
                   has not returned, the holder re-asks the policy (HBM -> host,
                   host -> NVMe).  None: no lease.
    expected_cost: the policy's own objective value (seconds-equivalent).
    stage_at_s:    for state on NVMe: seconds after the pause at which to copy
                   it NVMe -> host DRAM ahead of the return (staging), so the
                   final reload (``prefetch_at_s``, or on resume) crosses only
                   the host link.  None: no staging.  Holders without a
                   staging step may ignore it.
    """

    action: Action
    prefetch_at_s: float | None = None
    demote_at_s: float | None = None
    expected_cost: float = 0.0
    reason: str = ""
    extra: Mapping[str, float] = field(default_factory=dict)
    stage_at_s: float | None = None



_new_object, _set_attr = object.__new__, object.__setattr__


def make_decision(action: Action, prefetch_at_s: float | None, demote_at_s: float | None, expected_cost: float,
                  reason: str, extra: Mapping[str, float], stage_at_s: float | None) -> Decision:
    """``Decision(...)`` with every field given, built without the frozen dataclass's per-field
    ``object.__setattr__`` (a third of a cheap policy's decide).  The same object: equal to,
    and replaceable and picklable as, one built by the constructor.  No checks: for policies'
    hot paths, which pass every field with its proper type.  Pure."""
    d = _new_object(Decision)
    _set_attr(d, "__dict__", {"action": action, "prefetch_at_s": prefetch_at_s, "demote_at_s": demote_at_s,
                              "expected_cost": expected_cost, "reason": reason, "extra": extra,
                              "stage_at_s": stage_at_s})
    return d

class Policy(ABC):
    """A pause policy.  Implementations must be cheap: decide() is on the hot path.

    decide() must not mutate learned state; observe() feeds back the real wait
    after a resume.  on_lease_expiry() is called when a Decision's demote_at_s
    passes with the tool still running; return a new Decision (e.g. demote to
    NVMe) or None to keep the current placement.
    """

    name: str = "abstract"   # the registry name (``make_policy``), for logs and stats
    plan_victims: bool = False   # True: :meth:`victim_decision` plans a victim's way back, for the holder to arm

    @abstractmethod
    def decide(self, ctx: PauseContext) -> Decision: ...

    def observe(self, tool: str, wait_s: float, features: Mapping[str, str] | None = None) -> None:
        """Feedback after a resume; default: learn nothing."""

    def on_lease_expiry(self, ctx: PauseContext, elapsed_s: float, current: Decision) -> Decision | None:
        """Re-decide when a lease expires; default: keep the current placement."""
        return None

    def victim_priority(self, ctx: PauseContext, elapsed_s: float) -> float:
        """Eviction order under memory pressure: the engine evicts the paused,
        HBM-resident trajectory with the highest priority first.  ``elapsed_s``
        is how long it has been paused.  Default: the longest-paused first
        (recency, as LRU).  Pure."""
        return elapsed_s

    def victim_action(self, ctx: PauseContext) -> Action:
        """What to do with a paused, HBM-resident trajectory the engine must
        evict under memory pressure.  Default: drop and recompute (vLLM)."""
        return Action.RECOMPUTE

    def victim_decision(self, ctx: PauseContext, elapsed_s: float) -> Decision:
        """:meth:`victim_action` as a pause's decision, ``elapsed_s`` into the pause, with
        its way back (times in seconds after the pause) where :attr:`plan_victims` is True.
        Default: the action alone.  Pure."""
        return Decision(self.victim_action(ctx))

    def restage_at(self, ctx: PauseContext, elapsed_s: float) -> float | None:
        """When to bring a paused copy kept in host DRAM back there after the
        holder's store pushed it down to NVMe (an engine's host tier is a cache
        its writes share), ``elapsed_s`` into the pause: seconds after the
        pause, at least ``elapsed_s``; None: leave it on NVMe (the resume reads
        it there).  Default: at once.  Pure."""
        return elapsed_s

    def reads(self, tier: Tier, tokens: int) -> bool:
        """Whether a resume should read ``tokens`` of a paused context kept only in
        ``tier`` (its lower copies: ``Tier.NVME``, ``Tier.REMOTE``) rather than
        prefill them again.  Default: True (read whatever is kept, as a plain
        tier does).  Pure."""
        return True

    def forecast(self, ctx: PauseContext) -> "Forecast | None":
        """The predicted wait of this pause, a
        :class:`~kvtier.tiering.forecasting.forecast.WaitForecast` (the holder ranks
        host-frame victims by its expected remaining wait), or None: this policy does not
        forecast (the default; the holder ranks by :meth:`victim_priority`).  Does not mutate.

        Raises:
            ValueError: an invalid tool name or features.
        """
        return None

    def close(self) -> None:
        """Release what the policy holds (threads, connections).  Idempotent; the policy
        must not be used afterwards.  Default: nothing to release."""


@dataclass(frozen=True)
class Forecast:
    """A predicted distribution of one tool's wait (seconds).

    ``quantiles`` holds at least the keys "p10", "p50", "p90", "p99".
    ``source`` says which level answered: "tool+features", "tool", "global"
    or "prior" (cold start).  The predictor implements ``quantile``,
    ``survival`` and ``cdf`` on the concrete distribution it carries; this
    base form answers from the stored quantiles by log-linear interpolation,
    which is enough for callers that only hold the plain data (the service
    client, the simulator's reports).
    """

    tool: str
    n: int
    mean_s: float
    quantiles: Mapping[str, float]
    source: str = "prior"

    def quantile(self, q: float) -> float:
        pts = sorted((float(k[1:]) / 100.0, v) for k, v in self.quantiles.items())
        if q <= pts[0][0]:
            return pts[0][1]
        if q >= pts[-1][0]:
            return pts[-1][1]
        for (q0, v0), (q1, v1) in zip(pts, pts[1:]):
            if q0 <= q <= q1:
                a = (q - q0) / (q1 - q0)
                lo, hi = math.log(max(v0, 1e-9)), math.log(max(v1, 1e-9))
                return math.exp(lo + a * (hi - lo))
        return pts[-1][1]  # pragma: no cover
