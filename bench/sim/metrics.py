"""What one simulation run counts, and the JSON-ready summary of it.

``jct`` is session completion minus arrival.  ``resume stall`` of a resumed
round is what the placement of its state costs it: the time from the tool's
return until its context is resident again in HBM (waiting for room,
reloading from host or NVMe), plus, when the state was dropped, the prefill
time of the context it must recompute.  ``resume delay`` (extra) is wider:
tool return to the end of the round's prefill, minus the prefill of its new
tokens alone, so it also holds queueing behind other prefills.
``recomputed_tokens`` counts context prefilled again because state was
dropped.  ``hbm_idle_gb_s`` integrates HBM bytes held by paused trajectories
over time.
"""
from __future__ import annotations

import math
from typing import Sequence

from kvtier.tiering.model.costmodel import GB

from kvtier.bench.sim.attribution import Attribution
from kvtier.bench.sim.transfers import Leg


ADMISSION_TAU_S = 300.0     # time constant of the recent admission wait (PauseContext.admission_wait_s)


class RecentMean:
    """The mean of recent samples, each weighted exp(-age / ``ADMISSION_TAU_S``) at the time
    of the last one (so it holds still while no sample comes).  One owner, not thread-safe."""

    __slots__ = ("w", "n", "t")

    def __init__(self) -> None:
        self.w = self.n = self.t = 0.0

    def add(self, now: float, value: float) -> None:
        d = math.exp(-(now - self.t) / ADMISSION_TAU_S)
        self.w = self.w * d + value
        self.n = self.n * d + 1.0
        self.t = now

    def mean(self) -> float | None:
        """The decayed mean (None before the first sample)."""
        return self.w / self.n if self.n > 0.0 else None

    def merge(self, other: "RecentMean") -> None:
        """Take in another node's samples (a cluster's counters), both as of the later time."""
        t = max(self.t, other.t)
        a, b = math.exp(-(t - self.t) / ADMISSION_TAU_S), math.exp(-(t - other.t) / ADMISSION_TAU_S)
        self.w, self.n, self.t = self.w * a + other.w * b, self.n * a + other.n * b, t


class SimCounters:
    """Counters and samples of one run (mutable, owned by one simulator; not thread-safe)."""

    def __init__(self) -> None:
        self.jcts: list[float] = []
        self.stalls: list[float] = []
        self.delays: list[float] = []
        self.admit_waits: list[float] = []
        self.admit_recent = RecentMean()      # the same waits, recent ones weighted most
        self.round_log: list = []
        self.recomputed = 0
        self.prompt_tokens = 0                # every round's prompt (shared + context + new)
        self.prefilled_tokens = 0             # ... of which prefilled (not served from a cache)
        self.out_tokens = 0
        self.idle_blocks_s = 0.0
        self.actions: dict[str, int] = {}
        self.victims: dict[str, int] = {}
        self.lease_redecisions = 0
        self.fallbacks = 0
        self.emergency = 0
        self.queue_preempted = 0
        self.rejected = 0
        self.prefetch_deferred = 0
        self.staged = 0
        self.stage_skipped = 0
        self.clean_dropped = 0
        self.wt_dropped = 0
        self.wt_written_blocks = 0
        self.wt_skipped = 0
        self.peak_used = 0
        self.above_ceiling_s = 0.0
        self.attr = Attribution()

    def count(self, table: dict[str, int], key: str) -> None:
        table[key] = table.get(key, 0) + 1

    def close_record(self, x) -> None:
        """Session ``x``'s last pause is over (it paused again, finished, was rejected or moved
        on): count its attribution record and clear it."""
        if x.rec is not None:
            self.attr.close(x.rec)
            x.rec = None


def summary(c: SimCounters, *, first_arrival: float, last_done: float, hbm_total: int, block_bytes: int,
            write_through: bool, moved_bytes: Sequence[int], events: int, wall: float) -> dict:
    """The DESIGN.md metrics and extras of one run (JSON-ready)."""
    j = sorted(c.jcts)
    st = sorted(c.stalls)
    dl = sorted(c.delays)
    span = max(1e-9, last_done - first_arrival)
    bb = block_bytes
    return {
        "jct_mean_s": mean(j),
        "jct_p99_s": quantile(j, 0.99),
        "resume_stall_p50_s": quantile(st, 0.50),
        "resume_stall_p99_s": quantile(st, 0.99),
        "throughput_tokens_per_s": c.out_tokens / span,
        "recomputed_tokens": int(c.recomputed),
        "prefix_hit_rate": (1.0 - c.prefilled_tokens / c.prompt_tokens) if c.prompt_tokens else 0.0,
        "hbm_idle_gb_s": c.idle_blocks_s * bb / GB,
        # extras
        "jct_p50_s": quantile(j, 0.50),
        "resume_stall_mean_s": mean(st),
        "resume_delay_p50_s": quantile(dl, 0.50),
        "resume_delay_p99_s": quantile(dl, 0.99),
        "sessions_done": len(j),
        "sessions_rejected": c.rejected,
        "resumes": len(st),
        "admission_wait_mean_s": mean(c.admit_waits),
        "hbm_peak_util": c.peak_used / hbm_total,
        "time_above_ceiling_frac": c.above_ceiling_s / span,
        "actions": dict(sorted(c.actions.items())),
        "victims": dict(sorted(c.victims.items())),
        "lease_redecisions": c.lease_redecisions,
        "offload_fallbacks": c.fallbacks,
        "emergency_preemptions": c.emergency,
        "resume_queue_preemptions": c.queue_preempted,
        "prefetch_deferred": c.prefetch_deferred,
        "staged_to_host": c.staged,
        "staging_skipped": c.stage_skipped,
        "host_clean_copies_dropped": c.clean_dropped,
        "write_through": {"on": write_through, "written_gb": c.wt_written_blocks * bb / GB,
                          "host_copies_dropped": c.wt_dropped, "skipped_nvme_full": c.wt_skipped},
        "moved_gb": {"d2h": moved_bytes[Leg.D2H] / GB, "h2d": moved_bytes[Leg.H2D] / GB,
                     "nvme": (moved_bytes[Leg.NVME_WRITE] + moved_bytes[Leg.NVME_READ]) / GB},
        "attribution": c.attr.summary(),
        "makespan_s": span,
        "events": events,
        "sim_wall_s": wall,
    }


def mean(xs: Sequence[float]) -> float:
    return float(sum(xs) / len(xs)) if xs else 0.0


def quantile(sorted_xs: Sequence[float], p: float) -> float:
    """The ceil(p n)-th smallest of ``sorted_xs`` (0.0 when empty): kvtier.util.stats.percentile."""
    from kvtier.util.stats import percentile
    return percentile(sorted_xs, p, presorted=True, empty=0.0)
