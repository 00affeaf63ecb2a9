"""Pause policies: kvtier's expected-cost policy, the oracle, and the baselines.

Every policy implements :class:`kvtier.tiering.decision.Policy` and is built by name::

    policy = make_policy("breakeven", geometry=geom, hardware=hw)
    d = policy.decide(PauseContext(tool="pytest", kv_bytes=..., context_tokens=...))
    ... tool returns after w seconds ...
    policy.observe("pytest", w)

The expected-cost model (all costs in seconds-equivalent)
---------------------------------------------------------
For a pause holding G GB in HBM, of which Gm GB must move (prefix blocks
stored earlier don't move again), and a wait W with predicted distribution F:

* holding prices (seconds of cost per GB-second), rising with pressure::

      hbm(U)   = phi(U) / G_ref      phi = floor + (1-floor)(U/tau)^3 below the admission
                                     ceiling tau = 0.88; 1 + slope (U-tau)/(1-U+0.02) above
      dram(f)  = dram_ratio (1 + fill_slope f^4) / G_ref       f = host tier fill
      nvme     = nvme_ratio / G_ref

  G_ref is the KV of ``ref_tokens`` (32,768) of the model: holding one
  typical agent context for one second at the admission ceiling costs one
  second (another trajectory's worth of service).
* retain:        hbm*G*E[W]
* offload_host:  hbm*G*t_out + dram*Gm*E[W] + prefetch(r = t_reload)
                 (on a write-through holder, ``PauseContext.write_through``, the host
                 copy is also on NVMe and droppable: dram is then only the fill term
                 of copies that cannot be dropped, see host_hold_price)
* offload_nvme:  hbm*G*t_out + dram*Gm*t_write + io*(t_write + t_read)
                 + nvme*Gm*E[W] + prefetch(r = max(t_read, t_reload))  (chunked reload:
                 NVMe -> host and host -> GPU overlap)
* recompute:     (stall_weight + compute_weight * max(1, phi(U))) * t_recompute
                 (past the ceiling the saturated node's prefill is as scarce as its HBM)
* prefetch(r):   min over start times t of  stall_weight*E[stall(t)] + hbm*G*E[(W-t)+]
                 where stall(t) = r if W < t, t+r-W if t <= W < t+r, else 0
                 (a quantile trade-off; "never" = reload on resume is a candidate).

With a point-mass forecast and the texts' assumptions this reduces exactly to
their break-even rule T* = 2M/B * mu_hbm/(mu_hbm - mu_dram) (tested).

Leases: retain and offload_host carry ``demote_at_s`` = the forecast's
``lease_quantile`` (p90).  When the tool outlives it, ``on_lease_expiry``
re-prices the options against the wait distribution *conditioned on having
already waited that long* (heavy tails make the remaining wait grow), from
the current placement (HBM -> host/NVMe, host -> NVMe), and returns the new
decision (or the same action with a renewed lease).

Conventions for holders (simulator, engine hooks, service):
``prefetch_at_s`` is None for an offload means "reload when the tool
returns".  ``demote_at_s`` is only set when it comes before the prefetch.
Times are seconds after the pause.
"""
from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Mapping

import numpy as np

from kvtier.tiering.costmodel import (GB, HardwareProfile, ModelGeometry, PausePrice, breakeven_wait,
                               t_nvme_read, t_nvme_roundtrip, t_nvme_write, t_offload, t_recompute,
                               t_reload, t_roundtrip)
from kvtier.tiering.decision import Action, Decision, PauseContext, Policy
from kvtier.tiering.predictor import RunningMeanPredictor, ToolWaitPredictor, WaitForecast

_ACTIONS = {a.value: a for a in Action}
MAX_KV_BYTES = 1e15          # 1 PB: anything larger is a unit mistake
MAX_CONTEXT_TOKENS = 100_000_000


def check_context(ctx: PauseContext) -> None:
    """Reject absurd pauses (PauseContext already rejects negatives).  Raises ValueError."""
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


# --------------------------------------------------------------------------- prices
@dataclass(frozen=True)
class CostPrices:
    """Shadow prices and weights of the expected-cost model (see module doc)."""

    ref_tokens: int = 32768
    admission_ceiling: float = 0.88     # tau_high of the texts
    hbm_floor: float = 0.05             # phi(0): HBM is never quite free
    overload_slope: float = 10.0        # how fast phi explodes past the ceiling
    dram_ratio: float = 0.01            # DRAM price / HBM price at the ceiling
    dram_fill_slope: float = 10.0
    dram_fill_power: float = 4.0        # DRAM price = dram_ratio (1 + fill_slope fill^power)
    nvme_ratio: float = 2e-5
    stall_weight: float = 1.0           # cost of one second of resume stall
    compute_weight: float = 1.0         # extra cost of one second of recompute (GPU taken from others)
    io_weight: float = 0.1              # cost of one second of NVMe transfer (shared disk bandwidth)
    stall_tolerance_s: float = 0.0      # dT_stall of the texts (point mode only)

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


# --------------------------------------------------------------------------- prefetch timing
def best_prefetch(dist: "_Dist", reload_s: float, hold_rate: float, stall_weight: float,
                  t_min: float = 0.0) -> tuple[float | None, float]:
    """Start time of the reload minimising stall_weight*E[stall] + hold_rate*E[(W - t)+].

    ``dist`` is the discretised wait distribution (sorted points v_j with
    cumulative weights A and masses B).  Returns (t, expected cost), t None
    meaning "reload when the tool returns".  Waits shorter than ``t_min``
    (the state has not left HBM yet) never stall.

    The cost is piecewise linear in t; its candidates are "just in time for
    point j" (t_j = v_j - r), t_min, and never.  For t_j >= t_min, with
    p = A(t_j), m = B(t_j) (mass below t_j) and K_j = v_j A_j - B_j::

        cost_j = sw K_j + (sw - h)(m - t_j p) - h t_j + h M - sw r P(W < t_min)

    (stall sums t + r - W over t <= W < t + r and r below t; hold sums W - t
    above t).  Pure.
    """
    r, h, sw = reload_s, hold_rate, stall_weight
    pts, cw, cm = dist.points, dist.cum_w, dist.cum_m
    plist, cwl, cml = dist.lists
    total = cml[-1]
    p_min = cwl[bisect_left(plist, t_min)] if t_min > 0.0 else 0.0
    c = pts - r
    i = pts.searchsorted(c)
    cost = sw * dist.k + (sw - h) * (cm[i] - c * cw[i]) - h * c
    if t_min > 0.0 or c[0] < 0.0:
        cost[c < t_min] = np.inf
    j = int(cost.argmin())
    best_t, best_c = float(c[j]), float(cost[j]) + h * total - sw * r * p_min
    # the clipped candidate t = t_min (general formula, scalars)
    t0 = t_min
    i0, i1 = bisect_left(plist, t0), bisect_left(plist, t0 + r)
    p0, m0, p1, m1 = cwl[i0], cml[i0], cwl[i1], cml[i1]
    c0 = sw * (r * (p0 - p_min) + (t0 + r) * (p1 - p0) - (m1 - m0)) + h * ((total - m0) - t0 * (1.0 - p0))
    if c0 <= best_c:
        best_t, best_c = t0, c0
    never = sw * r * (1.0 - p_min)
    if never <= best_c + 1e-12 * abs(never) or best_t >= pts[-1]:
        return None, never
    return best_t, best_c


def best_lease(dist: "_Dist", hold_rate: float, after: float, tail_rate: float) -> tuple[float | None, float]:
    """Lease L for a retained pause minimising
    hold_rate*E[min(W, L)] + P(W > L)*after + tail_rate*E[(W - L)+].

    ``after`` is the one-off cost of leaving HBM at L (copy-out + reload),
    ``tail_rate`` the lower tier's holding rate after that.  L ranges over the
    distribution's points; the last point means no lease (returned as None).
    Returns (L or None, expected cost).  Pure.
    """
    pts, cw, cm = dist.points, dist.cum_w, dist.cum_m
    surv = 1.0 - cw[1:]
    total = cm[-1]
    cost = hold_rate * (cm[1:] + pts * surv) + surv * after + tail_rate * ((total - cm[1:]) - pts * surv)
    j = int(cost.argmin())
    if surv[j] <= 1e-12:
        return None, float(cost[j])
    return float(pts[j]), float(cost[j])


def expected_remaining(dist: "_Dist", elapsed: float) -> float:
    """E[W - e | W > e] for e = ``elapsed``; e itself past the distribution's tail (Lindy).  Pure."""
    plist, cwl, cml = dist.lists
    i = bisect_right(plist, elapsed)
    surv = 1.0 - cwl[i]
    if surv <= 1e-9:
        return max(elapsed, 0.0)
    return max(((cml[-1] - cml[i]) - elapsed * surv) / surv, 0.0)


@dataclass(frozen=True)
class _Dist:
    """A discretised wait distribution (possibly conditioned on survival).

    points sorted; cum_w/cum_m cumulative weights/masses (length K+1);
    k: the prefetch optimiser's per-point constant K_j = v_j A_j - B_j (see best_prefetch).
    """

    points: np.ndarray
    cum_w: np.ndarray
    cum_m: np.ndarray
    k: np.ndarray
    mean: float
    lists: tuple = field(default=(), repr=False, compare=False)   # (points, cum_w, cum_m) as lists

    def __post_init__(self) -> None:
        if not self.lists:
            object.__setattr__(self, "lists", (self.points.tolist(), self.cum_w.tolist(), self.cum_m.tolist()))

    @classmethod
    def of(cls, fc: WaitForecast) -> "_Dist":
        d = fc.__dict__.get("_dist")
        if d is None:   # built once per forecast, then shared (forecasts are immutable)
            d = cls(fc.points, fc._cum_w, fc._cum_m, fc._k, fc.mean_s)  # type: ignore[attr-defined]
            object.__setattr__(fc, "_dist", d)
        return d

    @classmethod
    def remaining(cls, fc: WaitForecast, elapsed: float) -> "_Dist":
        """Distribution of W - elapsed given W > elapsed (Lindy fallback past the forecast's tail)."""
        pts, w = fc.points, fc.weights
        mask = pts > elapsed
        mass = float(w[mask].sum())
        if mass < 1e-9:
            e = max(elapsed, 1e-3)
            rp, rw = np.array([0.25 * e, e, 4.0 * e]), np.array([0.3, 0.4, 0.3])
        else:
            rp, rw = pts[mask] - elapsed, w[mask] / mass
        cw = np.concatenate(([0.0], np.cumsum(rw)))
        cm = np.concatenate(([0.0], np.cumsum(rw * rp)))
        return cls(rp, cw, cm, rp * cw[:-1] - cm[:-1], float(cm[-1]))

    def quantile(self, q: float) -> float:
        i = int(np.searchsorted(self.cum_w[1:], q, side="left"))
        return float(self.points[min(i, len(self.points) - 1)])


# --------------------------------------------------------------------------- kvtier's policy
class BreakEvenPolicy(Policy):
    """Minimise expected cost over the predicted wait distribution (module doc).

    ``mode="expected"`` (default) prices every action over the forecast;
    ``mode="point"`` applies the texts' break-even rule to a point estimate
    (the forecast's mean, or ``point_stat="p50"``), exactly as
    :class:`kvtier.tiering.costmodel.PausePrice` does.

    decide() and on_lease_expiry() read the predictor and never mutate it;
    observe() feeds it.  Raises ValueError on an absurd PauseContext.
    """

    name = "breakeven"

    def __init__(self, geometry: ModelGeometry, hardware: HardwareProfile,
                 predictor: ToolWaitPredictor | None = None, *, prices: CostPrices | None = None,
                 mode: str = "expected", point_stat: str = "mean", lease_quantile: float = 0.9,
                 nvme: bool = True, lease: str = "priced", staging: bool = True,
                 victim_order: str = "remaining", revocable: bool = True, cache_pricing: bool = True,
                 **price_overrides: Any) -> None:
        if mode not in ("expected", "point"):
            raise ValueError(f"mode must be 'expected' or 'point', got {mode!r}")
        if point_stat not in ("mean", "p50"):
            raise ValueError(f"point_stat must be 'mean' or 'p50', got {point_stat!r}")
        if lease not in ("priced", "quantile"):
            raise ValueError(f"lease must be 'priced' or 'quantile', got {lease!r}")
        if victim_order not in ("remaining", "recency"):
            raise ValueError(f"victim_order must be 'remaining' or 'recency', got {victim_order!r}")
        if not all(isinstance(v, bool) for v in (staging, revocable, cache_pricing)):
            raise ValueError(f"staging, revocable and cache_pricing must be true or false, "
                             f"got {staging!r}, {revocable!r}, {cache_pricing!r}")
        if not (0.0 < lease_quantile < 1.0):
            raise ValueError(f"lease_quantile must be in (0, 1), got {lease_quantile!r}")
        if prices is None:
            known = {f.name for f in fields(CostPrices)}
            bad = sorted(set(price_overrides) - known)
            if bad:
                raise ValueError(f"unknown option(s) {bad} for policy {self.name!r}; "
                                 f"price options: {sorted(known)}")
            prices = CostPrices(**price_overrides)
        elif price_overrides:
            raise ValueError("pass either prices=CostPrices(...) or individual price options, not both")
        self.geometry, self.hardware = geometry, hardware
        self.predictor = predictor if predictor is not None else ToolWaitPredictor()
        self.prices = prices
        self.mode, self.point_stat = mode, point_stat
        self.lease_quantile = lease_quantile
        self._lease_key = f"p{round(lease_quantile * 100)}" if abs(lease_quantile * 100 - round(lease_quantile * 100)) < 1e-9 else ""
        self.nvme = nvme
        self.lease, self.staging, self.victim_order = lease, staging, victim_order
        self.revocable = revocable
        self.cache_pricing = cache_pricing
        self._ref_gb = geometry.kv_bytes(prices.ref_tokens) / GB

    # -- Policy API ---------------------------------------------------------
    def observe(self, tool: str, wait_s: float, features: Mapping[str, str] | None = None) -> None:
        self.predictor.observe(tool, wait_s, features)

    def forecast(self, ctx: PauseContext) -> WaitForecast:
        return self.predictor.forecast(ctx.tool, ctx.features)

    def decide(self, ctx: PauseContext) -> Decision:
        check_context(ctx)
        fc = self.forecast(ctx)
        if self.mode == "point":
            w = fc.mean_s if self.point_stat == "mean" else fc.quantiles["p50"]
            return self._decide_point(ctx, w)
        return self._decide_expected(ctx, _Dist.of(fc), fc, from_tier=Action.RETAIN, elapsed=0.0)

    def decide_for_wait(self, ctx: PauseContext, wait_s: float) -> Decision:
        """Decide as if the wait were known to be ``wait_s`` (no predictor involved).

        ``mode="point"``: the texts' break-even rule on ``wait_s``; expected
        mode: the expected-cost minimum over a point mass at ``wait_s`` (what
        the oracle does).  Pure; raises ValueError on bad input.
        """
        check_context(ctx)
        if not (isinstance(wait_s, (int, float)) and math.isfinite(wait_s) and wait_s >= 0):
            raise ValueError(f"wait_s must be a finite number >= 0, got {wait_s!r}")
        if self.mode == "point":
            return self._decide_point(ctx, float(wait_s))
        fc = WaitForecast.point_mass(ctx.tool, wait_s)
        return self._decide_expected(ctx, _Dist.of(fc), fc, from_tier=Action.RETAIN, elapsed=0.0)

    def on_lease_expiry(self, ctx: PauseContext, elapsed_s: float, current: Decision) -> Decision | None:
        """Re-decide with the wait conditioned on W > elapsed_s, from ``current``'s tier.

        Returns a Decision whose times are seconds after the *pause* (same
        action = stay, with a renewed lease), or None when nothing can be
        demoted further (offload_nvme, recompute).
        """
        check_context(ctx)
        if not (math.isfinite(elapsed_s) and elapsed_s >= 0):
            raise ValueError(f"elapsed_s must be a finite number >= 0, got {elapsed_s!r}")
        if current.action in (Action.OFFLOAD_NVME, Action.RECOMPUTE):
            return None
        fc = self.forecast(ctx)
        dist = _Dist.remaining(fc, elapsed_s)
        return self._decide_expected(ctx, dist, None, from_tier=current.action, elapsed=elapsed_s)

    # -- pricing ------------------------------------------------------------
    def hbm_price(self, u: float) -> float:
        """Seconds of cost per GB-second held in HBM at pool utilisation u."""
        return self.prices.hbm_pressure_factor(u) / self._ref_gb

    def dram_price(self, ctx: PauseContext) -> float:
        fill = 0.0
        if math.isfinite(ctx.host_free_bytes) and self.hardware.host_bytes > 0:
            fill = min(max(1.0 - ctx.host_free_bytes / self.hardware.host_bytes, 0.0), 1.0)
        return self.prices.dram_factor(fill) / self._ref_gb

    def host_hold_price(self, ctx: PauseContext) -> float:
        """Seconds of cost per GB-second for holding a host copy through a wait.

        Normally :meth:`dram_price`.  On a write-through holder
        (``ctx.write_through``, option ``cache_pricing``) a host copy is also on
        NVMe and is dropped for free when the room is wanted (longest expected
        remaining wait first, :meth:`victim_priority`), so it only pays the fill
        term dram_ratio * fill_slope * f^power, f = the fill of the tier by copies
        that cannot be dropped (droppable ones are room, ``host_free_bytes``
        counts them): near zero while the tier holds mostly droppable copies.
        What this leaves out: a copy dropped before its return reloads from NVMe
        (the victim order makes that the copies expected back last).  Pure."""
        if not (ctx.write_through and self.cache_pricing):
            return self.dram_price(ctx)
        pr, hb = self.prices, self.hardware.host_bytes
        fill = 0.0
        if math.isfinite(ctx.host_free_bytes) and hb > 0:
            fill = min(max(1.0 - ctx.host_free_bytes / hb, 0.0), 1.0)
        return pr.dram_ratio * pr.dram_fill_slope * fill ** pr.dram_fill_power / self._ref_gb

    def victim_priority(self, ctx: PauseContext, elapsed_s: float) -> float:
        """Evict first the paused trajectory expected to stay away longest: its
        expected remaining wait E[W - e | W > e] after ``elapsed_s`` = e (the
        oracle: the true remaining wait).  Past the forecast's tail the remaining
        wait is taken as e (Lindy).  ``victim_order="recency"``: e itself.  Pure."""
        e = float(elapsed_s)
        if self.victim_order == "recency":
            return e
        if isinstance(self, OraclePolicy) and ctx.true_wait_s is not None:
            return max(ctx.true_wait_s - e, 0.0)
        return expected_remaining(_Dist.of(self.forecast(ctx)), e)

    def victim_action(self, ctx: PauseContext) -> Action:
        """The engine must evict this paused, HBM-resident trajectory: the cheapest way out
        (host, NVMe or recompute) over the forecast.  Pure; raises ValueError on bad input."""
        check_context(ctx)
        if isinstance(self, OraclePolicy) and ctx.true_wait_s is not None:
            fc = WaitForecast.point_mass(ctx.tool, ctx.true_wait_s)
        else:
            fc = self.forecast(ctx)
        d = self._decide_expected(ctx, _Dist.of(fc), fc, from_tier=Action.RETAIN, elapsed=0.0,
                                  allow_retain=False)
        return d.action

    def _decide_expected(self, ctx: PauseContext, dist: _Dist, fc: WaitForecast | None,
                         from_tier: Action, elapsed: float, allow_retain: bool = True) -> Decision:
        pr, hw = self.prices, self.hardware
        kv, move = ctx.kv_bytes, ctx.bytes_to_move
        g, gm = kv / GB, move / GB
        c_h = self.hbm_price(ctx.hbm_pressure) * g
        ew = dist.mean
        sw = pr.stall_weight
        in_hbm = from_tier is Action.RETAIN
        t_out = move / hw.link_d2h_bps if in_hbm else 0.0     # t_offload
        r_h = kv / hw.link_h2d_bps                              # t_reload
        t_rc = t_recompute(self.geometry, ctx.context_tokens, hw)

        # Recompute takes the prefill engine for t_rc.  Past the admission ceiling the node is
        # saturated: its prefill is as scarce as its memory, so the compute price rises with the
        # same pressure factor as HBM (otherwise a big context's copy-out hold at an exploding
        # HBM price makes dropping look cheap exactly when the engine can least afford a redo).
        phi = pr.hbm_pressure_factor(ctx.hbm_pressure)
        costs: dict[str, float] = {"recompute": (sw + pr.compute_weight * (phi if phi > 1.0 else 1.0)) * t_rc}
        host_ok = not in_hbm or move <= ctx.host_free_bytes
        nvme_ok = self.nvme and move <= ctx.nvme_free_bytes
        dram = self.dram_price(ctx)
        hold = self.host_hold_price(ctx)          # = dram unless the host copy is droppable
        lease_at = None
        if in_hbm and allow_retain:
            if self.lease == "quantile" or (fc is not None and fc.source == "known"):
                costs["retain"] = c_h * ew
            else:
                # Retain with a priced lease L: hold HBM for min(W, L); if the tool outlives L,
                # copy out then and reload on resume.  L ranges over the forecast's points (the
                # last one = no lease), so heavy tails no longer price retention at E[W].
                u, tau = ctx.hbm_pressure, pr.admission_ceiling
                c_tau = self.hbm_price(tau) * g
                if host_ok:
                    leave = sw * r_h
                    tail_rate = hold * gm
                elif nvme_ok:
                    leave = pr.io_weight * 2.0 * move / hw.nvme_write_bps + sw * max(kv / hw.nvme_read_bps, r_h)
                    tail_rate = pr.nvme_ratio / self._ref_gb * gm
                else:
                    leave, tail_rate = costs["recompute"], 0.0
                copy_out = t_out if (host_ok or nvme_ok) else 0.0
                lease_at, costs["retain"] = best_lease(dist, c_h, c_h * copy_out + leave, tail_rate)
                if self.revocable and ctx.evictable and u <= tau and not ctx.admission_waiting_bytes:
                    # Below the ceiling a retained pause is an eviction victim: when the room is
                    # wanted it leaves (copy-out at the ceiling price, reload or rebuild later).
                    # So the pressure part of the HBM price buys one possible eviction, not every
                    # second of the wait; only the floor is paid per second.
                    press = (1.0 - pr.hbm_floor) * (u / tau) ** 3
                    l2, c2 = best_lease(dist, pr.hbm_floor / self._ref_gb * g, c_h * copy_out + leave, tail_rate)
                    c2 += press * (c_tau * copy_out + leave)
                    if c2 < costs["retain"]:
                        lease_at, costs["retain"] = l2, c2
        best = min(costs.values())
        # Each offload costs lb + prefetch with 0 <= prefetch <= sw * r: price the
        # prefetch exactly only for offloads whose lower bound can still win.
        if host_ok:
            lb_h = c_h * t_out + hold * gm * ew
            if ctx.write_through and self.cache_pricing and hold * gm * ew > 0.0:
                # A droppable copy is held only until the room is wanted; then the state
                # reloads from NVMe (the extra read, plus the disk's time) and lies there at the
                # NVMe price.  Price the hold as the best such drop time over the forecast.
                extra = sw * max(kv / hw.nvme_read_bps - r_h, 0.0) + pr.io_weight * kv / hw.nvme_read_bps
                lb_h = c_h * t_out + best_lease(dist, hold * gm, extra, pr.nvme_ratio / self._ref_gb * gm)[1]
            best = min(best, lb_h + sw * r_h)
        if nvme_ok:
            t_w = move / hw.nvme_write_bps
            t_rd = kv / hw.nvme_read_bps
            r_n = max(t_rd, r_h)   # chunked: NVMe -> host and host -> GPU overlap
            lb_n = c_h * t_out + dram * gm * t_w + pr.io_weight * (t_w + t_rd) \
                + pr.nvme_ratio / self._ref_gb * gm * ew
            best = min(best, lb_n + sw * r_n)
        t_host = t_nvme = stage = None
        if host_ok and lb_h <= best:
            t_host, pf = best_prefetch(dist, r_h, c_h, sw, t_out)
            costs["offload_host"] = lb_h + pf
            best = min(best, lb_h + pf)
        if nvme_ok and lb_n <= best:
            t0 = t_out + t_w
            t_nvme, pf = best_prefetch(dist, r_n, c_h, sw, t0)
            costs["offload_nvme"] = lb_n + pf
        name = min(costs, key=costs.__getitem__)
        action = _ACTIONS[name]
        if action is Action.OFFLOAD_NVME:
            # The action is chosen; now plan its way back.
            if self.staging and r_n > r_h and kv <= ctx.host_free_bytes:
                # Staged: NVMe -> host at s (host DRAM held from s at the DRAM price; a return
                # before the staging lands pays the NVMe read), then host -> HBM at t (or on resume).
                s, c_s = best_prefetch(dist, r_n - r_h, hold * g, sw, t0)
                if s is not None:
                    t_p, c_p = best_prefetch(dist, r_h, c_h, sw, s + t_rd)
                    plist, cwl, _ = dist.lists
                    early = cwl[bisect_left(plist, s + t_rd)] - cwl[bisect_left(plist, t0)]
                    c_st = c_s + c_p + sw * r_h * early
                    if c_st < pf:
                        stage, t_nvme, pf = s, t_p, c_st
                        costs["offload_nvme"] = lb_n + pf
        prefetch = t_host if action is Action.OFFLOAD_HOST else t_nvme if action is Action.OFFLOAD_NVME else None
        demote = None
        if action is Action.RETAIN and self.lease == "priced":
            demote = lease_at
        elif (action is Action.RETAIN or action is Action.OFFLOAD_HOST) and (fc is None or fc.source != "known"):
            if fc is None:
                lease = dist.quantile(self.lease_quantile)
            else:
                lease = fc.quantiles.get(self._lease_key) or fc.quantile(self.lease_quantile)
            if prefetch is None or lease < prefetch:
                demote = lease
        if elapsed:
            prefetch = None if prefetch is None else prefetch + elapsed
            demote = None if demote is None else demote + elapsed
            stage = None if stage is None else stage + elapsed
        return Decision(action=action, prefetch_at_s=prefetch, demote_at_s=demote,
                        expected_cost=costs[name], reason="min expected cost", extra=costs,
                        stage_at_s=stage)

    def _decide_point(self, ctx: PauseContext, wait_s: float) -> Decision:
        """The texts' rule (via costmodel.PausePrice) on a point estimate of the wait."""
        pr, hw = self.prices, self.hardware
        kv, move = ctx.kv_bytes, ctx.bytes_to_move
        mu_h = self.hbm_price(ctx.hbm_pressure)
        mu_d = self.dram_price(ctx)
        if mu_h > mu_d:
            if move == kv:
                t_star = breakeven_wait(kv, hw, mu_hbm=mu_h, mu_dram=mu_d, stall_s=pr.stall_tolerance_s)
            else:
                t_star = (t_offload(move, hw) + t_reload(kv, hw)) * mu_h / (mu_h - mu_d) + pr.stall_tolerance_s
        else:
            t_star = math.inf
        price = PausePrice(context_tokens=ctx.context_tokens, kv_bytes=kv, t_reload_s=t_reload(kv, hw),
                           t_roundtrip_s=t_roundtrip(kv, hw),
                           t_recompute_s=t_recompute(self.geometry, ctx.context_tokens, hw),
                           breakeven_wait_s=t_star,
                           t_nvme_roundtrip_s=t_nvme_roundtrip(kv, hw) if self.nvme else None,
                           stall_s=pr.stall_tolerance_s)
        action = Action(price.action(wait_s))
        if action == Action.OFFLOAD_HOST and move > ctx.host_free_bytes:
            action = Action.OFFLOAD_NVME if self.nvme and move <= ctx.nvme_free_bytes else Action.RECOMPUTE
        elif action == Action.OFFLOAD_NVME and move > ctx.nvme_free_bytes:
            action = Action.OFFLOAD_HOST if move <= ctx.host_free_bytes else Action.RECOMPUTE
        prefetch = None
        if action == Action.OFFLOAD_HOST:
            prefetch = max(t_offload(move, hw), wait_s - price.t_reload_s)
        elif action == Action.OFFLOAD_NVME:
            prefetch = max(t_offload(move, hw) + t_nvme_write(move, hw),
                           wait_s - price.t_reload_s - t_nvme_read(kv, hw))
        return Decision(action=action, prefetch_at_s=prefetch, expected_cost=0.0,
                        reason=f"point estimate {wait_s:.3g}s vs break-even {t_star:.3g}s",
                        extra={"wait_s": wait_s, "breakeven_wait_s": t_star})


class OraclePolicy(BreakEvenPolicy):
    """Per-pause clairvoyant: knows the true wait (``ctx.true_wait_s``).

    For each pause it prices every action on the *known* wait W with the same
    prices as :class:`BreakEvenPolicy` (retain holds HBM for W; an offload
    pays its copy-out and lower-tier holding and starts the reload at
    max(copy-out done, W - t_reload) so it finishes exactly when the tool
    returns; recompute pays the rebuild), picks the cheapest, never needs a
    lease, and evicts victims knowing their remaining wait.  So it bounds what
    any per-pause decision rule can do *under this cost model* (breakeven
    differs from it only by not knowing W).  It is not a global optimum of a
    queueing node: it does not plan jointly across pauses, so when the prices
    misjudge the node's bottleneck a fixed rule can come out a hair ahead.

    Raises ValueError when ``true_wait_s`` is missing.
    """

    name = "oracle"

    def decide(self, ctx: PauseContext) -> Decision:
        check_context(ctx)
        if ctx.true_wait_s is None:
            raise ValueError("the oracle policy needs PauseContext.true_wait_s")
        return self.decide_for_wait(ctx, ctx.true_wait_s)

    def on_lease_expiry(self, ctx: PauseContext, elapsed_s: float, current: Decision) -> Decision | None:
        return None  # it knew the wait; its plan stands

    def observe(self, tool: str, wait_s: float, features: Mapping[str, str] | None = None) -> None:
        pass


# --------------------------------------------------------------------------- baselines
class RetainPolicy(Policy):
    """Keep KV in HBM through every pause; under pressure the engine drops victims (vLLM)."""

    name = "retain"

    def decide(self, ctx: PauseContext) -> Decision:
        check_context(ctx)
        return Decision(Action.RETAIN, reason="always retain")


class RecomputePolicy(Policy):
    """vLLM's behaviour for a finished request: free the blocks, prefill again on resume."""

    name = "recompute"

    def decide(self, ctx: PauseContext) -> Decision:
        check_context(ctx)
        return Decision(Action.RECOMPUTE, reason="always recompute")


class OffloadHostPolicy(Policy):
    """Always swap to host DRAM, reload when the tool returns (no prediction).

    Falls back to NVMe, then recompute, when the host tier has no room.
    """

    name = "offload_host"

    def decide(self, ctx: PauseContext) -> Decision:
        check_context(ctx)
        move = ctx.bytes_to_move
        if move <= ctx.host_free_bytes:
            return Decision(Action.OFFLOAD_HOST, reason="always offload to host")
        if move <= ctx.nvme_free_bytes:
            return Decision(Action.OFFLOAD_NVME, reason="host tier full")
        return Decision(Action.RECOMPUTE, reason="host and NVMe tiers full")


class LRUPolicy(RetainPolicy):
    """HiCache-like: keep everything, and when the engine needs room, swap the
    least recently used paused trajectory to host instead of dropping it."""

    name = "lru"

    def decide(self, ctx: PauseContext) -> Decision:
        check_context(ctx)
        return Decision(Action.RETAIN, reason="retain; swap to host on pressure")

    def victim_action(self, ctx: PauseContext) -> Action:
        return Action.OFFLOAD_HOST if ctx.bytes_to_move <= ctx.host_free_bytes else Action.RECOMPUTE


class TTLPolicy(Policy):
    """Continuum: pin the KV in HBM for a time-to-live, then evict.

    ``per_tool=False``: a fixed ``ttl_s``.  ``per_tool=True`` (registry name
    ``ttl_cdf``): per tool, the TTL maximising P(W <= tau) * benefit -
    hold_price * E[min(W, tau)] over the tool's empirical wait CDF (from the
    predictor), where benefit is the resume cost avoided (recompute, or reload
    when ``evict_to="offload_host"``).  On expiry the state is evicted to
    ``evict_to``.
    """

    name = "ttl"

    def __init__(self, geometry: ModelGeometry, hardware: HardwareProfile,
                 predictor: ToolWaitPredictor | None = None, *, ttl_s: float = 5.0, per_tool: bool = False,
                 evict_to: str = "recompute", prices: CostPrices | None = None) -> None:
        if not (math.isfinite(ttl_s) and ttl_s >= 0):
            raise ValueError(f"ttl_s must be a finite number >= 0, got {ttl_s!r}")
        if evict_to not in ("recompute", "offload_host"):
            raise ValueError(f"evict_to must be 'recompute' or 'offload_host', got {evict_to!r}")
        self.geometry, self.hardware = geometry, hardware
        self.ttl_s, self.per_tool = float(ttl_s), per_tool
        self.evict_to = Action(evict_to)
        self.predictor = predictor if predictor is not None else (ToolWaitPredictor() if per_tool else None)
        self.prices = prices or CostPrices()
        self._ref_gb = geometry.kv_bytes(self.prices.ref_tokens) / GB
        if per_tool:
            self.name = "ttl_cdf"

    def observe(self, tool: str, wait_s: float, features: Mapping[str, str] | None = None) -> None:
        if self.predictor is not None:
            self.predictor.observe(tool, wait_s, features)

    def _evict(self, ctx: PauseContext) -> Action:
        if self.evict_to == Action.OFFLOAD_HOST and ctx.bytes_to_move <= ctx.host_free_bytes:
            return Action.OFFLOAD_HOST
        return Action.RECOMPUTE

    def ttl_for(self, ctx: PauseContext) -> float:
        if not self.per_tool:
            return self.ttl_s
        fc = self.predictor.forecast(ctx.tool, ctx.features)
        pts, cw, cm = fc.points, fc._cum_w, fc._cum_m  # type: ignore[attr-defined]
        hw, pr = self.hardware, self.prices
        if self._evict(ctx) == Action.OFFLOAD_HOST:
            benefit = pr.stall_weight * t_reload(ctx.kv_bytes, hw)
        else:
            benefit = (pr.stall_weight + pr.compute_weight) * t_recompute(self.geometry, ctx.context_tokens, hw)
        c_h = pr.hbm_pressure_factor(ctx.hbm_pressure) / self._ref_gb * ctx.kv_bytes / GB
        # tau at each point: P(W <= tau) = cw[i+1]; E[min(W, tau)] = cm[i+1] + tau * (1 - cw[i+1])
        taus = pts
        p_le = cw[1:]
        e_min = cm[1:] + taus * (1.0 - p_le)
        util = p_le * benefit - c_h * e_min
        j = int(np.argmax(util))
        return float(taus[j]) if util[j] > 0 else 0.0

    def decide(self, ctx: PauseContext) -> Decision:
        check_context(ctx)
        ttl = self.ttl_for(ctx)
        if ttl <= 0:
            return Decision(self._evict(ctx), reason="ttl 0: evict now")
        return Decision(Action.RETAIN, demote_at_s=ttl, reason=f"pin for ttl {ttl:.3g}s")

    def on_lease_expiry(self, ctx: PauseContext, elapsed_s: float, current: Decision) -> Decision | None:
        if current.action != Action.RETAIN:
            return None
        return Decision(self._evict(ctx), reason="ttl expired")


class MinWastePolicy(Policy):
    """InferCept's min-waste rule on a point prediction (running mean per tool).

    Memory waste in GB-seconds of each choice for a paused request of G GB
    while the rest of the batch holds G_other = U * kv_pool:
    preserve = T_pred * G; discard = t_recompute * (G + G_other) (the
    recompute stalls the batch); swap = 2 * t_reload * (G + G_other)
    (swap out and in, not overlapped).  The smallest waste wins.
    """

    name = "min_waste"

    def __init__(self, geometry: ModelGeometry, hardware: HardwareProfile,
                 predictor: Any = None) -> None:
        self.geometry, self.hardware = geometry, hardware
        self.predictor = predictor if predictor is not None else RunningMeanPredictor()

    def observe(self, tool: str, wait_s: float, features: Mapping[str, str] | None = None) -> None:
        self.predictor.observe(tool, wait_s, features)

    def decide(self, ctx: PauseContext) -> Decision:
        check_context(ctx)
        hw = self.hardware
        t_pred = self.predictor.forecast(ctx.tool, ctx.features).mean_s
        g = ctx.kv_bytes / GB
        g_other = ctx.hbm_pressure * max(hw.kv_pool_bytes, 0.0) / GB
        waste = {
            Action.RETAIN: t_pred * g,
            Action.RECOMPUTE: t_recompute(self.geometry, ctx.context_tokens, hw) * (g + g_other),
        }
        if ctx.bytes_to_move <= ctx.host_free_bytes:
            waste[Action.OFFLOAD_HOST] = 2.0 * t_reload(ctx.kv_bytes, hw) * (g + g_other)
        action = min(waste, key=waste.__getitem__)
        return Decision(action, expected_cost=waste[action], reason=f"min waste (T_pred {t_pred:.3g}s)",
                        extra={a.value: w for a, w in waste.items()})


# --------------------------------------------------------------------------- registry
def _breakeven(geometry, hardware, predictor, **o):
    return BreakEvenPolicy(geometry, hardware, predictor, **o)


def _breakeven_point(geometry, hardware, predictor, **o):
    p = BreakEvenPolicy(geometry, hardware, predictor, mode="point", **o)
    p.name = "breakeven_point"
    return p


def _simple(cls):
    def make(geometry, hardware, predictor, **o):
        return cls(**o)
    return make


_REGISTRY: dict[str, Callable[..., Policy]] = {
    "breakeven": _breakeven,
    "oracle": lambda geometry, hardware, predictor, **o: OraclePolicy(geometry, hardware, predictor, **o),
    "retain": _simple(RetainPolicy),
    "recompute": _simple(RecomputePolicy),
    "offload_host": _simple(OffloadHostPolicy),
    "lru": _simple(LRUPolicy),
    "ttl": lambda geometry, hardware, predictor, **o: TTLPolicy(geometry, hardware, predictor, **o),
    "ttl_cdf": lambda geometry, hardware, predictor, **o: TTLPolicy(geometry, hardware, predictor,
                                                                   per_tool=True, **o),
    "min_waste": lambda geometry, hardware, predictor, **o: MinWastePolicy(geometry, hardware, predictor, **o),
    "breakeven_point": _breakeven_point,
}

POLICY_NAMES: tuple[str, ...] = tuple(_REGISTRY)
"""Every registered policy name."""


def make_policy(name: str, *, geometry: ModelGeometry, hardware: HardwareProfile,
                predictor: ToolWaitPredictor | None = None, **options: Any) -> Policy:
    """Build the policy registered as ``name``.

    ``predictor`` is used by the learning policies (breakeven, ttl_cdf,
    min_waste takes any object with observe/forecast); a fresh one is made
    when omitted.  Don't share one predictor between several policies that
    are all fed observe(): each would count every wait.
    Raises ValueError for an unknown name or option.
    """
    try:
        factory = _REGISTRY[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown policy {name!r}; known policies: {', '.join(POLICY_NAMES)}") from None
    if not isinstance(geometry, ModelGeometry) or not isinstance(hardware, HardwareProfile):
        raise ValueError("make_policy needs geometry=ModelGeometry and hardware=HardwareProfile")
    try:
        return factory(geometry, hardware, predictor, **options)
    except TypeError as exc:
        raise ValueError(f"bad option for policy {name!r}: {exc}") from None
