"""Prices of the expected-cost model and the optimisers that price a pause over a forecast.

Pure functions and frozen data (thread-safe).  :class:`CostPrices` holds the
shadow prices and weights (see :mod:`kvtier.tiering.policy.policies` for the model);
:func:`best_prefetch`, :func:`best_lease` and :func:`expected_remaining`
answer over a :class:`~kvtier.tiering.forecasting.forecast.WaitDistribution` in O(K) or
O(log K) scalar work (numpy for lease tables without an envelope);
:func:`best_prefetch` lives in :mod:`kvtier.tiering.policy.prefetch`.
"""
from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, fields


from kvtier.tiering.model.decision import PauseContext
from kvtier.tiering.forecasting.forecast import WaitDistribution
from kvtier.tiering.policy.prefetch import best_prefetch

__all__ = ["CostPrices", "best_lease", "best_prefetch", "check_context", "check_elapsed", "expected_remaining",
           "expected_stall", "MAX_CONTEXT_TOKENS", "MAX_KV_BYTES"]

MAX_KV_BYTES = 1e15          # 1 PB: anything larger is a unit mistake
MAX_CONTEXT_TOKENS = 100_000_000


def check_context(ctx: PauseContext) -> None:
    """Reject absurd pauses (PauseContext already rejects negatives).  Raises ValueError."""
    if type(ctx) is PauseContext:
        # the usual sane pause in one test (NaN fails every comparison, so it takes the checks below)
        tw = ctx.true_wait_s
        if ctx.kv_bytes <= MAX_KV_BYTES and ctx.context_tokens <= MAX_CONTEXT_TOKENS \
                and ctx.host_free_bytes >= 0 and ctx.nvme_free_bytes >= 0 and (tw is None or 0 <= tw < math.inf):
            return
    if not isinstance(ctx, PauseContext):
        raise ValueError(f"decide() needs a PauseContext, got {type(ctx).__name__}")
    if not (math.isfinite(ctx.kv_bytes) and ctx.kv_bytes <= MAX_KV_BYTES):
        raise ValueError(f"kv_bytes {ctx.kv_bytes!r} is absurd (limit {MAX_KV_BYTES:.0e} bytes)")
    if ctx.context_tokens > MAX_CONTEXT_TOKENS:
        raise ValueError(f"context_tokens {ctx.context_tokens} is absurd (limit {MAX_CONTEXT_TOKENS})")
    if math.isnan(ctx.host_free_bytes) or math.isnan(ctx.nvme_free_bytes) or \
            ctx.host_free_bytes < 0 or ctx.nvme_free_bytes < 0:
        raise ValueError("host_free_bytes and nvme_free_bytes must be >= 0")
    if ctx.true_wait_s is not None and not (math.isfinite(ctx.true_wait_s) and ctx.true_wait_s >= 0):
        raise ValueError(f"true_wait_s must be a finite number >= 0, got {ctx.true_wait_s!r}")


def check_elapsed(elapsed_s: float) -> None:
    """Reject a time into a pause that is not a finite number >= 0.  Raises ValueError."""
    if not (math.isfinite(elapsed_s) and elapsed_s >= 0):
        raise ValueError(f"elapsed_s must be a finite number >= 0, got {elapsed_s!r}")


# --------------------------------------------------------------------------- prices
@dataclass(frozen=True)
class CostPrices:
    """Shadow prices and weights of the expected-cost model (see module doc)."""

    ref_tokens: int = 32768
    admission_ceiling: float = 0.88     # tau_high of the texts
    hbm_floor: float = 0.05             # phi(0): HBM is never quite free
    overload_slope: float = 10.0        # how fast phi explodes past the ceiling
    # DRAM price = dram_ratio (1 + fill_slope fill^power), relative to HBM at the ceiling: nearly
    # free while the tier is mostly empty (room nobody wants), 0.1 of HBM when full, steep past
    # ~75% fill (1e-5 + 0.1 f^16; docs/policy.md, "Why it is this way", has the values tried)
    dram_ratio: float = 1e-5
    dram_fill_slope: float = 1e4
    dram_fill_power: float = 16.0
    nvme_ratio: float = 2e-5
    stall_weight: float = 1.0           # cost of one second of resume stall
    compute_weight: float = 1.0         # extra cost of one second of recompute (GPU taken from others)
    queued_compute_weight: float = 3.0  # the same while new work waits for admission (prefill is its critical path)
    io_weight: float = 0.1              # cost of one second of NVMe transfer (shared disk bandwidth)
    stall_tolerance_s: float = 0.0      # dT_stall of the texts (point mode only)
    link_weight: float = 1.0            # shadow price of link time: link_weight * stall_weight * rho/(1-rho)
    revocable_floor: float = 0.0        # per-second HBM price of a revocable retention (was hbm_floor, 0.05)

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"cost prices: {f.name} must be a finite number >= 0, got {v!r}")
        if not (0 < self.admission_ceiling < 1):
            raise ValueError(f"cost prices: admission_ceiling must be in (0, 1), got {self.admission_ceiling}")
        if self.ref_tokens <= 0:
            raise ValueError("cost prices: ref_tokens must be positive")

    def hbm_pressure_factor(self, u: float) -> float:
        """phi(U): 1 at the admission ceiling, ``hbm_floor`` at 0, steep beyond the ceiling."""
        tau = self.admission_ceiling
        if u <= tau:
            return self.hbm_floor + (1.0 - self.hbm_floor) * (u / tau) ** 3
        return 1.0 + self.overload_slope * (u - tau) / (1.0 - u + 0.02)

    def dram_factor(self, fill: float) -> float:
        return self.dram_ratio * (1.0 + self.dram_fill_slope * fill ** self.dram_fill_power)


def best_lease(dist: WaitDistribution, hold_rate: float, after: float, tail_rate: float) -> tuple[float | None, float]:
    """Lease L for a retained pause minimising
    hold_rate*E[min(W, L)] + P(W > L)*after + tail_rate*E[(W - L)+].

    ``after`` is the one-off cost of leaving HBM at L (copy-out + reload),
    ``tail_rate`` the lower tier's holding rate after that.  L ranges over the
    distribution's points; the last point means no lease (returned as None).
    Returns (L or None, expected cost).  Pure.
    """
    hull = dist.lease_hull
    if hull is not None and hold_rate > tail_rate and after >= 0.0:
        return _best_lease_on(hull, dist.lists[0], hold_rate, after, tail_rate)
    lt = dist.lease_table()                       # E[min(W, L)], P(W > L), E[(W - L)+] per point L
    cost = hold_rate * lt[0] + after * lt[1]
    if tail_rate:
        cost += tail_rate * lt[2]
    j = int(cost.argmin())
    if lt[1, j] <= 1e-12:
        return None, float(cost[j])
    return float(dist.points[j]), float(cost[j])


def _best_lease_on(hull, plist: list, hold_rate: float, after: float, tail_rate: float) -> tuple[float | None, float]:
    """best_lease over the lease table's lower envelope: the cost is
    (hold - tail) * (A_j + lam * B_j) + tail * E[W] (C = E[W] - A), lam = after / (hold - tail);
    the envelope's vertex for lam and its two neighbours are priced exactly (the vector
    formula's floats, first index on a tie)."""
    verts = hull.verts
    k = bisect_left(hull.brk, after / (hold_rate - tail_rate))
    a, b, c = hull.rows
    best_j, best = -1, math.inf
    for v in verts[max(k - 1, 0):k + 2]:
        cost = hold_rate * a[v] + after * b[v]
        if tail_rate:
            cost += tail_rate * c[v]
        if cost < best or (cost == best and v < best_j):
            best_j, best = v, cost
    if b[best_j] <= 1e-12:
        return None, best
    return plist[best_j], best


def expected_remaining(dist: WaitDistribution, elapsed: float) -> float:
    """E[W - e | W > e] for e = ``elapsed``; e itself past the distribution's tail (Lindy).  Pure."""
    plist, cwl, cml = dist.lists
    i = bisect_right(plist, elapsed)
    surv = 1.0 - cwl[i]
    if surv <= 1e-9:
        return max(elapsed, 0.0)
    return max(((cml[-1] - cml[i]) - elapsed * surv) / surv, 0.0)


def expected_stall(dist: WaitDistribution, start: float | None, reload_s: float, t_min: float = 0.0) -> float:
    """E[stall] of a reload of ``reload_s`` seconds started at ``start`` after the pause (None:
    when the tool returns): r if W < start, start + r - W if start <= W < start + r, else 0;
    waits shorter than ``t_min`` (the state has not left HBM yet) never stall.  Pure."""
    plist, cwl, cml = dist.lists
    r = reload_s
    p_min = cwl[bisect_left(plist, t_min)] if t_min > 0.0 else 0.0
    if start is None:
        return r * (1.0 - p_min)
    i0, i1 = bisect_left(plist, start), bisect_left(plist, start + r)
    p0, m0, p1, m1 = cwl[i0], cml[i0], cwl[i1], cml[i1]
    return r * max(p0 - p_min, 0.0) + (start + r) * (p1 - p0) - (m1 - m0)
