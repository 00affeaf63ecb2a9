"""The predictor's learned statistics: cold-start priors, its config, and one node per key.

A node holds, for log-waits x = ln(max(wait, 100 us)), decayed sufficient
statistics (weight, sum x, sum x^2) shrunk towards its parent's prior, and a
decayed log-bucket quantile sketch.  Nodes are owned by
:class:`~kvtier.tiering.forecasting.predictor.ToolWaitPredictor` and guarded by its lock.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from statistics import NormalDist
from typing import Mapping

from kvtier.tiering.forecasting.forecast import WaitForecast
from kvtier.tiering.forecasting.sketch import WaitSketch

_ND = NormalDist()


@dataclass(frozen=True)
class LogNormalPrior:
    """A cold-start prior: log-normal with ``mu`` (ln seconds) and ``sigma``, worth ``strength`` observations."""

    mu: float
    sigma: float
    strength: float = 2.0
    source: str = ""

    @classmethod
    def from_quantiles(cls, p50: float, p90: float, p99: float, *, strength: float = 2.0,
                       source: str = "") -> "LogNormalPrior":
        """Least-squares log-normal through a median, p90 and p99 (seconds)."""
        mu = math.log(p50)
        z = (_ND.inv_cdf(0.90), _ND.inv_cdf(0.99))
        d = (math.log(p90) - mu, math.log(p99) - mu)
        sigma = (z[0] * d[0] + z[1] * d[1]) / (z[0] ** 2 + z[1] ** 2)
        return cls(mu=mu, sigma=sigma, strength=strength, source=source)


# TraceLab (uw-syfi/TraceLab, session_timing_distribution.tex, "Per individual latency").
TRACELAB_TOOL_PRIOR = LogNormalPrior.from_quantiles(
    0.3, 13.6, 3.6 * 60, source="TraceLab tool execution: p50 0.3 s, p90 13.6 s, p99 3.6 min (432,510 calls)")
TRACELAB_HUMAN_PRIOR = LogNormalPrior.from_quantiles(
    1.4 * 60, 20.6 * 60, 13.9 * 3600, source="TraceLab human input: p50 1.4 min, p90 20.6 min, p99 13.9 h")

HUMAN_TOOL_PATTERN = r"human|approv|ask.?user|user.?input|confirm|clarif"


@dataclass(frozen=True)
class PredictorConfig:
    """Knobs of :class:`ToolWaitPredictor` (validated once)."""

    half_life_obs: float = 200.0        # decay: an observation's weight halves after this many more of its key
    sketch_k: float = 10.0              # sketch blend weight n_eff / (n_eff + sketch_k)
    child_mean_strength: float = 1.0    # pseudo-observations of the parent's mean in a child's posterior
    child_var_strength: float = 1.0     # ... and of the parent's pooled within-child variance
    default_within_sigma: float = 1.5   # within-tool log-sd assumed before any child residual is seen
    refresh_fraction: float = 0.02      # rebuild a cached forecast after this fraction of new observations
    #                                     (exact below 50 observations; 0 = always exact; Forecast.n says
    #                                     how many observations the served forecast was built from)
    max_wait_s: float = 1e7             # larger observations are rejected as absurd (~116 days)
    tool_prior: LogNormalPrior = TRACELAB_TOOL_PRIOR
    human_prior: LogNormalPrior = TRACELAB_HUMAN_PRIOR
    human_pattern: str = HUMAN_TOOL_PATTERN
    max_nodes: int = 2048               # tool and tool+feature nodes kept (~30 KB each); the least recently observed
    #                                     beyond it are forgotten (their class's root already holds
    #                                     every observation they saw: they fold into that prior)

    def __post_init__(self) -> None:
        if not isinstance(self.max_nodes, int) or isinstance(self.max_nodes, bool) or self.max_nodes < 1:
            raise ValueError(f"predictor config: max_nodes must be an int >= 1, got {self.max_nodes!r}")
        for f in ("half_life_obs", "sketch_k", "child_mean_strength", "child_var_strength",
                  "default_within_sigma", "max_wait_s"):
            v = getattr(self, f)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"predictor config: {f} must be a positive number, got {v!r}")
        if not (0.0 <= self.refresh_fraction < 1.0):
            raise ValueError(f"predictor config: refresh_fraction must be in [0, 1), got {self.refresh_fraction!r}")
        re.compile(self.human_pattern)

    def outdated(self, n: float, built_at_n: float) -> bool:
        """True when a cache built at ``built_at_n`` observations is due a rebuild at ``n``
        (``refresh_fraction`` of them, and at least one, are new).  Pure."""
        return n - built_at_n >= max(1.0, self.refresh_fraction * n)

    @property
    def decay(self) -> float:
        return 0.5 ** (1.0 / self.half_life_obs)

    def to_dict(self) -> dict:
        return {"half_life_obs": self.half_life_obs, "sketch_k": self.sketch_k,
                "child_mean_strength": self.child_mean_strength, "child_var_strength": self.child_var_strength,
                "default_within_sigma": self.default_within_sigma, "refresh_fraction": self.refresh_fraction,
                "max_wait_s": self.max_wait_s, "max_nodes": self.max_nodes}


@dataclass(frozen=True)
class NodePrior:
    """What a parent hands its children: mean and within-child sigma (log space)."""

    mu: float
    sigma: float
    mean_strength: float
    var_strength: float
    stamp: int  # changes whenever the prior is refreshed


class StatNode:
    """Learned statistics of one key.  Owned by the predictor; guarded by its lock."""

    __slots__ = ("key", "level", "n", "w", "s1", "s2", "rw", "rs2", "sketch",
                 "_cp", "_cp_n", "_fc", "_fc_n", "_fc_stamp")

    def __init__(self, key: str, level: str, decay: float) -> None:
        self.key, self.level = key, level
        self.n = 0
        self.w = self.s1 = self.s2 = 0.0      # decayed weight, sum x, sum x^2 of log-waits
        self.rw = self.rs2 = 0.0              # children's one-step log residuals (pooled within-child spread)
        self.sketch = WaitSketch(decay)
        self._cp: NodePrior | None = None
        self._cp_n = -1
        self._fc: WaitForecast | None = None
        self._fc_n = -1
        self._fc_stamp = -1

    def posterior(self, prior: NodePrior) -> tuple[float, float]:
        """(mu, predictive sigma) of log-wait under ``prior``.  Pure."""
        k0, v0 = prior.mean_strength, prior.var_strength
        w = self.w
        if w <= 0.0:
            return prior.mu, prior.sigma * math.sqrt(1.0 + 1.0 / k0)
        xbar = self.s1 / w
        ss = max(self.s2 - self.s1 * xbar, 0.0)
        mu = (k0 * prior.mu + w * xbar) / (k0 + w)
        var = (v0 * prior.sigma ** 2 + ss) / (v0 + w)
        return mu, math.sqrt(var * (1.0 + 1.0 / (k0 + w)))

    def observe(self, x: float, seconds: float, decay: float) -> None:
        self.n += 1
        self.w = self.w * decay + 1.0
        self.s1 = self.s1 * decay + x
        self.s2 = self.s2 * decay + x * x
        self.sketch.add(seconds)

    def add_child_residual(self, r: float, decay: float) -> None:
        self.rw = self.rw * decay + 1.0
        self.rs2 = self.rs2 * decay + r * r

    def child_prior(self, own_prior: NodePrior, cfg: PredictorConfig, stamp_counter: list) -> NodePrior:
        """The prior this node hands to its children (refreshed as the node moves)."""
        cp = self._cp
        if cp is None or cfg.outdated(self.n, self._cp_n) or \
                cp.stamp < own_prior.stamp:
            mu, _ = self.posterior(own_prior)
            v0 = 4.0
            sigma = math.sqrt((v0 * cfg.default_within_sigma ** 2 + self.rs2) / (v0 + self.rw))
            stamp_counter[0] += 1
            cp = NodePrior(mu, sigma, cfg.child_mean_strength, cfg.child_var_strength, stamp_counter[0])
            self._cp, self._cp_n = cp, self.n
        return cp

    def to_state(self) -> dict:
        return {"level": self.level, "n": self.n, "w": self.w, "s1": self.s1, "s2": self.s2,
                "rw": self.rw, "rs2": self.rs2, "sketch": self.sketch.to_state()}

    @classmethod
    def from_state(cls, key: str, state: Mapping, decay: float) -> "StatNode":
        """Raises ValueError on malformed or non-finite state."""
        try:
            node = cls(key, str(state["level"]), decay)
            node.n = int(state["n"])
            for f in ("w", "s1", "s2", "rw", "rs2"):
                v = float(state[f])
                if not math.isfinite(v):
                    raise ValueError(f"{f} is not finite")
                setattr(node, f, v)
            node.sketch = WaitSketch.from_state(state["sketch"])
            node.sketch.decay = decay
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"malformed predictor record {key!r}: {exc}") from exc
        if node.n < 0 or node.w < 0 or node.rw < 0 or node.rs2 < 0 or node.level not in LEVELS:
            raise ValueError(f"malformed predictor record {key!r}")
        return node


LEVELS = ("global", "tool", "tool+features")
