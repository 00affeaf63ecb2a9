"""Wait forecasts: the distribution a predictor hands to the policies, and the Predictor contract.

A :class:`WaitForecast` carries the predicted wait distribution discretised
into probability bins (``BIN_EDGES``), each point the conditional mean of its
bin.  Policies read :attr:`WaitForecast.distribution` (a
:class:`WaitDistribution`: points, cumulative weights and masses), never the
forecast's private arrays.  Everything here is immutable and thread-safe.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Mapping, Protocol, runtime_checkable

import numpy as np

from kvtier.tiering.model.decision import Forecast
from kvtier.tiering.forecasting.sketch import MIN_S, SketchSnapshot

_ND = NormalDist()

# Probability edges of the bins a forecast is discretised into (finer in the tail,
# where holding cost lives).  Policies price actions over these bins.
BIN_EDGES = np.concatenate((np.linspace(0.0, 0.96, 49), [0.98, 0.99, 0.995, 0.999, 1.0]))
BIN_WEIGHTS = np.diff(BIN_EDGES)
_BIN_ROOF = np.maximum.accumulate(BIN_WEIGHTS[::-1])[::-1].tolist()   # sparse_tail's weight_roof of the bins
_Z_EDGES = np.array([-np.inf] + [_ND.inv_cdf(float(q)) for q in BIN_EDGES[1:-1]] + [np.inf])
REPORTED_QUANTILES = (0.10, 0.25, 0.50, 0.75, 0.90, 0.95, 0.99)
_Z_REPORTED = np.array([_ND.inv_cdf(q) for q in REPORTED_QUANTILES])
_Q_KEYS = tuple(f"p{int(round(q * 100))}" for q in REPORTED_QUANTILES)
_Z_EDGE_LIST = [float(z) for z in _Z_EDGES]
_INV_SQRT2 = math.sqrt(0.5)


@runtime_checkable
class Predictor(Protocol):
    """What a learning policy needs from a wait predictor.

    ``observe`` learns one real wait (mutates; raises ValueError on bad input,
    state untouched); ``forecast`` answers without changing what was learned
    (raises ValueError for an invalid tool name or features).  Implementations
    say their own thread safety (:class:`~kvtier.tiering.forecasting.predictor.ToolWaitPredictor`:
    thread-safe; the baselines: one owner).
    """

    def observe(self, tool: str, seconds: float, features: Mapping[str, str] | None = None) -> None: ...

    def forecast(self, tool: str, features: Mapping[str, str] | None = None) -> Forecast: ...


@dataclass(frozen=True)
class WaitDistribution:
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
    # per point L = v_j, built once (the optimisers' hot path reads them; see pricing.best_lease):
    # rows E[min(W, L)], P(W > L), E[(W - L)+]
    lease_terms: np.ndarray = field(default=None, repr=False, compare=False)   # type: ignore[assignment]
    # the lower envelope of the lease table (see lease_envelope), built with a forecast's bins
    lease_hull: "LeaseHull | None" = field(default=None, repr=False, compare=False)
    # k as a list, and stall_weight * k per stall weight (best_prefetch's hot path)
    k_list: list = field(default=(), repr=False, compare=False)
    # (gap_floor, weight_roof), built with a forecast's bins (see sparse_tail): the prefetch
    # optimiser's one-step proof that its cost falls where the points lie far apart
    sparse: "tuple[list, list] | None" = field(default=None, repr=False, compare=False)
    _swk: dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.lists:
            object.__setattr__(self, "lists", (self.points.tolist(), self.cum_w.tolist(), self.cum_m.tolist()))
        if not self.k_list:
            object.__setattr__(self, "k_list", self.k.tolist())
        # sw_k at the default stall weight, here rather than on first use in a decision: 1.0 * k
        # is k, float for float
        self._swk.setdefault(1.0, self.k)

    def sw_k(self, sw: float) -> np.ndarray:
        """``sw * k``, kept per stall weight (a policy has one)."""
        v = self._swk.get(sw)
        if v is None:
            v = self._swk[sw] = sw * self.k
        return v

    def lease_table(self) -> np.ndarray:
        """Rows E[min(W, L)], P(W > L), E[(W - L)+] at each point L, built on first use and kept
        (a forecast's distribution is priced many times; a conditioned one once or twice)."""
        lt = self.lease_terms
        if lt is None:
            pts, cw, cm = self.points, self.cum_w, self.cum_m
            surv = 1.0 - cw[1:]
            lt = np.stack((cm[1:] + pts * surv, surv, (cm[-1] - cm[1:]) - pts * surv))
            object.__setattr__(self, "lease_terms", lt)
        return lt

    @classmethod
    def of_bins(cls, points: np.ndarray, weights: np.ndarray, mean: float) -> "WaitDistribution":
        """The distribution of bin ``points`` with probabilities ``weights`` (sorted points)."""
        cw = np.concatenate(([0.0], np.cumsum(weights)))
        cm = np.concatenate(([0.0], np.cumsum(weights * points)))
        # K_j = v_j * P(W < v_j) - E[W; W < v_j]: the prefetch optimiser's per-point constant
        d = cls(points, cw, cm, points * cw[:-1] - cm[:-1], float(mean))
        # built with the forecast (the learning path), not by decide
        object.__setattr__(d, "lease_hull", LeaseHull.of(d.lease_table()))
        object.__setattr__(d, "sparse", sparse_tail(points, weights))
        return d

    @classmethod
    def remaining(cls, fc: WaitForecast, elapsed: float) -> "WaitDistribution":
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


def sparse_tail(points: np.ndarray, weights: np.ndarray) -> tuple[list, list]:
    """(gap_floor, weight_roof) of sorted ``points``: gap_floor[j] = min over k >= j of
    v_k - v_(k-1) (inf for k = 0), nondecreasing in j; weight_roof[j] = max over k >= j of the
    weight of point k.  So from the first j with gap_floor[j] > r on, no window (x, x + r] of
    candidates j' >= j holds more than one point, nor more weight than weight_roof[j].  Pure."""
    if len(points) < 2:
        floor = [math.inf] * len(points)
    else:
        floor = np.minimum.accumulate((points[1:] - points[:-1])[::-1])[::-1].tolist()
        floor.insert(0, floor[0])
    if weights is BIN_WEIGHTS:
        return floor, _BIN_ROOF
    return floor, np.maximum.accumulate(weights[::-1])[::-1].tolist()


class LeaseHull:
    """The lower envelope of the lines ``A_j + lam * B_j`` (A = E[min(W, L_j)], B = P(W > L_j),
    rows 0 and 1 of a lease table) over lam >= 0: ``best_lease``'s argmin over the points in
    O(log K) instead of O(K) vector work.

    ``verts`` are the point indices on the envelope (increasing), ``brk[k]`` the lam at which
    ``verts[k + 1]`` takes over from ``verts[k]`` (increasing); ``rows`` the table's three rows
    as lists.  Of lines equal in slope and intercept the first index is kept (numpy argmin's
    tie rule).  Immutable after construction."""

    __slots__ = ("verts", "brk", "rows")

    def __init__(self, verts: list, brk: list, rows: tuple) -> None:
        self.verts, self.brk, self.rows = verts, brk, rows

    @classmethod
    def of(cls, table: np.ndarray) -> "LeaseHull":
        a, b, c = table[0].tolist(), table[1].tolist(), table[2].tolist()
        verts: list = []
        brk: list = []
        va = vb = 0.0                        # the last vertex's intercept and slope
        for j, aj, bj in zip(range(len(a)), a, b):
            if verts and bj >= vb:
                # the same slope (b never grows): keep the lower intercept, the first on a tie
                if aj >= va:
                    continue
                verts.pop()
                if brk:
                    brk.pop()
            while verts:
                v = verts[-1]
                x = (aj - a[v]) / (b[v] - bj)    # where line j crosses the last line
                if (brk and x <= brk[-1]) or (not brk and x < 0.0):
                    verts.pop()                  # the last line is never the lowest
                    if brk:
                        brk.pop()
                    continue
                brk.append(x)
                break
            verts.append(j)
            va, vb = aj, bj
        return cls(verts, brk, (a, b, c))


def _phi_edges_shifted(sigma: float) -> np.ndarray:
    """Phi(z - sigma) at every bin edge z (exact, via math.erfc)."""
    erfc, c = math.erfc, _INV_SQRT2
    return np.array([0.5 * erfc((sigma - z) * c) for z in _Z_EDGE_LIST])


@dataclass(frozen=True, eq=False)
class WaitForecast(Forecast):
    """A :class:`Forecast` that carries the real predicted distribution.

    ``quantile``/``cdf``/``survival`` answer from the blended distribution;
    ``points``/``weights`` are its discretisation into probability bins
    (``BIN_EDGES``), each point the conditional mean of its bin, so
    ``sum(points * weights) == mean_s``.  Policies price actions over them.
    Immutable; safe to share between threads.
    """

    n_eff: float = 0.0
    mu_log: float = 0.0
    sigma_log: float = 1.0
    sketch_weight: float = 0.0
    points: np.ndarray = field(default=None, repr=False, compare=False)      # type: ignore[assignment]
    weights: np.ndarray = field(default=None, repr=False, compare=False)     # type: ignore[assignment]
    sketch: SketchSnapshot | None = field(default=None, repr=False, compare=False)

    distribution: WaitDistribution = field(init=False, repr=False, compare=False)
    """What policies price actions over: the bins with cumulative weights and masses
    (O(log K) expectations), mean ``mean_s``.  Built once with the forecast."""

    def __post_init__(self) -> None:
        order_ok = self.points is not None and len(self.points) == len(self.weights)
        if not order_ok:
            raise ValueError("WaitForecast needs points and weights of equal length")
        object.__setattr__(self, "distribution", WaitDistribution.of_bins(self.points, self.weights, self.mean_s))

    def quantile(self, q: float) -> float:
        if not (0.0 < q < 1.0):
            raise ValueError(f"quantile level must be in (0, 1), got {q!r}")
        qp = math.exp(self.mu_log + self.sigma_log * _ND.inv_cdf(q))
        if self.sketch is None or self.sketch_weight <= 0.0:
            return qp
        return (1.0 - self.sketch_weight) * qp + self.sketch_weight * self.sketch.quantile(q)

    def cdf(self, x: float) -> float:
        """P(W <= x)."""
        if x <= 0:
            return 0.0
        if self.sketch is None or self.sketch_weight <= 0.0:
            return _ND.cdf((math.log(x) - self.mu_log) / self.sigma_log)
        lo, hi = 1e-9, 1.0 - 1e-9
        if self.quantile(lo) >= x:
            return 0.0
        if self.quantile(hi) <= x:
            return 1.0
        for _ in range(40):
            mid = 0.5 * (lo + hi)
            if self.quantile(mid) <= x:
                lo = mid
            else:
                hi = mid
        return 0.5 * (lo + hi)

    def survival(self, x: float) -> float:
        """P(W > x)."""
        return 1.0 - self.cdf(x)

    @property
    def mean(self) -> float:
        return self.mean_s

    def to_dict(self) -> dict:
        """The service's JSON shape: tool, n, mean_s, quantiles, source (+ n_eff)."""
        return {"tool": self.tool, "n": self.n, "mean_s": self.mean_s,
                "quantiles": dict(self.quantiles), "source": self.source, "n_eff": self.n_eff}

    @classmethod
    def point_mass(cls, tool: str, wait_s: float) -> "WaitForecast":
        """A degenerate forecast: the wait is known (the oracle's view)."""
        w = max(float(wait_s), 0.0)
        return cls(tool=tool, n=1, mean_s=w, quantiles={k: w for k in _Q_KEYS}, source="known",
                   n_eff=math.inf, mu_log=math.log(max(w, MIN_S)), sigma_log=1e-9,
                   points=np.array([w]), weights=np.array([1.0]))


def build_forecast(tool: str, source: str, n: int, n_eff: float, mu: float, sigma: float,
                    snap: SketchSnapshot | None, sketch_k: float) -> WaitForecast:
    sigma = max(sigma, 1e-3)
    ws = 0.0 if snap is None else n_eff / (n_eff + sketch_k)
    # Parametric part: exact conditional bin means of the log-normal.
    mean_p = math.exp(mu + 0.5 * sigma * sigma) if sigma < 20 else math.inf
    shifted = _phi_edges_shifted(sigma)
    pts = mean_p * (shifted[1:] - shifted[:-1]) / BIN_WEIGHTS
    q_rep = np.exp(mu + sigma * _Z_REPORTED)
    mean = mean_p
    if ws > 0.0:
        pm = snap.partial_mass(BIN_EDGES)
        sk_pts = (pm[1:] - pm[:-1]) / BIN_WEIGHTS
        pts = (1.0 - ws) * pts + ws * sk_pts
        q_rep = (1.0 - ws) * q_rep + ws * snap.quantiles(np.array(REPORTED_QUANTILES))
        mean = (1.0 - ws) * mean_p + ws * snap.mean
    # Floating-point noise can break monotonicity by an ulp in flat regions.
    pts = np.maximum.accumulate(pts)
    quantiles = {k: float(v) for k, v in zip(_Q_KEYS, q_rep)}
    return WaitForecast(tool=tool, n=n, mean_s=float(mean), quantiles=quantiles, source=source,
                        n_eff=float(n_eff), mu_log=mu, sigma_log=sigma, sketch_weight=ws,
                        points=pts, weights=BIN_WEIGHTS, sketch=snap if ws > 0 else None)
