"""Tool-wait predictor: per-tool forecasts of how long a paused agent is away.

What it learns
--------------
One node of statistics per key, in a back-off chain (most specific first)::

    tool + cmd=pytest + arg=<4k   ->   tool + cmd=pytest   ->   tool   ->   root
                                                                       ("global", or
                                                                        "global:human" for
                                                                        approval-like tools)

Each node holds, for log-waits x = ln(max(wait, 100 us)):

* decayed sufficient statistics (weight, sum x, sum x^2): a log-normal whose
  mean and variance are shrunk towards the parent's (a conjugate-style
  update with a pseudo-count prior taken from the parent), and
* a decayed log-bucket quantile sketch (:mod:`kvtier.tiering.sketch`) that captures
  shapes a log-normal cannot (bimodal tools, hard floors, ...).

The forecast blends the two by averaging quantile functions (Vincentisation):
``Q(q) = (1 - w) Q_lognormal(q) + w Q_sketch(q)`` with ``w = n_eff / (n_eff +
sketch_k)``, so a new tool leans on the parametric shrinkage estimate and a
well-observed tool on its own empirical distribution.  Decay (half-life in
observations of that key) tracks drift.

Cold start
----------
Root priors are log-normal fits of the TraceLab aggregate statistics of
432,510 real coding-agent tool calls (``../shared/traces/tracelab``,
session_timing_distribution.tex): tool calls p50 0.3 s, p90 13.6 s, p99 3.6
min (fit: mu = ln 0.3, sigma = 2.86; its mean 17.9 s vs 18.4 s reported) and
human-input waits p50 1.4 min, p90 20.6 min, p99 13.9 h (mu = ln 84 s, sigma
= 2.60).  A tool never seen gets its root's forecast, not an error.

Persistence
-----------
``ToolWaitPredictor(path=DIR)`` keeps every node in an LMDB environment at DIR
(write-through, one transaction per ``observe``); reopening restores what was
learned.  ``ToolWaitPredictor.open(env)`` shares an already-open
``lmdb.Environment`` (records live under the key prefix ``pred/``).
``state_dict()`` / ``load_state_dict()`` give the same state as plain data.

Bad input (negative, NaN, infinite or absurd waits; empty, over-long or
control-character tool names; malformed features) raises ``ValueError`` and
leaves the learned state untouched.  Thread-safe: one lock guards all state.
"""
from __future__ import annotations

import json
import logging
import math
import os
import re
import shlex
import threading
from dataclasses import dataclass, field, replace
from statistics import NormalDist
from typing import Any, Mapping

import numpy as np

from kvtier.tiering.decision import Forecast
from kvtier.tiering.sketch import MIN_S, SketchSnapshot, WaitSketch

log = logging.getLogger(__name__)

_ND = NormalDist()
STATE_VERSION = 1
MAX_TOOL_NAME = 128
MAX_FEATURES = 8
MAX_FEATURE_LEN = 64
_SEP = "\x1f"  # key separator; control characters are rejected in names, so it cannot collide

# Probability edges of the bins a forecast is discretised into (finer in the tail,
# where holding cost lives).  Policies price actions over these bins.
BIN_EDGES = np.concatenate((np.linspace(0.0, 0.96, 49), [0.98, 0.99, 0.995, 0.999, 1.0]))
BIN_WEIGHTS = np.diff(BIN_EDGES)
_Z_EDGES = np.array([-np.inf] + [_ND.inv_cdf(float(q)) for q in BIN_EDGES[1:-1]] + [np.inf])
REPORTED_QUANTILES = (0.10, 0.25, 0.50, 0.75, 0.90, 0.95, 0.99)
_Z_REPORTED = np.array([_ND.inv_cdf(q) for q in REPORTED_QUANTILES])
_Q_KEYS = tuple(f"p{int(round(q * 100))}" for q in REPORTED_QUANTILES)


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

    def __post_init__(self) -> None:
        for f in ("half_life_obs", "sketch_k", "child_mean_strength", "child_var_strength",
                  "default_within_sigma", "max_wait_s"):
            v = getattr(self, f)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"predictor config: {f} must be a positive number, got {v!r}")
        if not (0.0 <= self.refresh_fraction < 1.0):
            raise ValueError(f"predictor config: refresh_fraction must be in [0, 1), got {self.refresh_fraction!r}")
        re.compile(self.human_pattern)

    @property
    def decay(self) -> float:
        return 0.5 ** (1.0 / self.half_life_obs)

    def to_dict(self) -> dict:
        return {"half_life_obs": self.half_life_obs, "sketch_k": self.sketch_k,
                "child_mean_strength": self.child_mean_strength, "child_var_strength": self.child_var_strength,
                "default_within_sigma": self.default_within_sigma, "refresh_fraction": self.refresh_fraction,
                "max_wait_s": self.max_wait_s}


# --------------------------------------------------------------------------- forecast type
_Z_EDGE_LIST = [float(z) for z in _Z_EDGES]
_INV_SQRT2 = math.sqrt(0.5)


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

    # cumulative arrays for O(log K) expectations; filled by __post_init__
    def __post_init__(self) -> None:
        order_ok = self.points is not None and len(self.points) == len(self.weights)
        if not order_ok:
            raise ValueError("WaitForecast needs points and weights of equal length")
        object.__setattr__(self, "_cum_w", np.concatenate(([0.0], np.cumsum(self.weights))))
        cum_m = np.concatenate(([0.0], np.cumsum(self.weights * self.points)))
        object.__setattr__(self, "_cum_m", cum_m)
        # K_j = v_j * P(W < v_j) - E[W; W < v_j]: the prefetch optimiser's per-point constant
        object.__setattr__(self, "_k", self.points * self._cum_w[:-1] - cum_m[:-1])

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


def _build_forecast(tool: str, source: str, n: int, n_eff: float, mu: float, sigma: float,
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


# --------------------------------------------------------------------------- nodes
@dataclass(frozen=True)
class _Prior:
    """What a parent hands its children: mean and within-child sigma (log space)."""

    mu: float
    sigma: float
    mean_strength: float
    var_strength: float
    stamp: int  # changes whenever the prior is refreshed


class _Node:
    """Learned statistics of one key.  Owned by the predictor; guarded by its lock."""

    __slots__ = ("key", "level", "n", "w", "s1", "s2", "rw", "rs2", "sketch",
                 "_cp", "_cp_n", "_fc", "_fc_n", "_fc_stamp")

    def __init__(self, key: str, level: str, decay: float) -> None:
        self.key, self.level = key, level
        self.n = 0
        self.w = self.s1 = self.s2 = 0.0      # decayed weight, sum x, sum x^2 of log-waits
        self.rw = self.rs2 = 0.0              # children's one-step log residuals (pooled within-child spread)
        self.sketch = WaitSketch(decay)
        self._cp: _Prior | None = None
        self._cp_n = -1
        self._fc: WaitForecast | None = None
        self._fc_n = -1
        self._fc_stamp = -1

    def posterior(self, prior: _Prior) -> tuple[float, float]:
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

    def child_prior(self, own_prior: _Prior, cfg: PredictorConfig, stamp_counter: list) -> _Prior:
        """The prior this node hands to its children (refreshed as the node moves)."""
        cp = self._cp
        if cp is None or self.n - self._cp_n >= max(1.0, cfg.refresh_fraction * self.n) or \
                cp.stamp < own_prior.stamp:
            mu, _ = self.posterior(own_prior)
            v0 = 4.0
            sigma = math.sqrt((v0 * cfg.default_within_sigma ** 2 + self.rs2) / (v0 + self.rw))
            stamp_counter[0] += 1
            cp = _Prior(mu, sigma, cfg.child_mean_strength, cfg.child_var_strength, stamp_counter[0])
            self._cp, self._cp_n = cp, self.n
        return cp

    def to_state(self) -> dict:
        return {"level": self.level, "n": self.n, "w": self.w, "s1": self.s1, "s2": self.s2,
                "rw": self.rw, "rs2": self.rs2, "sketch": self.sketch.to_state()}

    @classmethod
    def from_state(cls, key: str, state: Mapping, decay: float) -> "_Node":
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
        if node.n < 0 or node.w < 0 or node.rw < 0 or node.rs2 < 0 or node.level not in _LEVELS:
            raise ValueError(f"malformed predictor record {key!r}")
        return node


_LEVELS = ("global", "tool", "tool+features")


# --------------------------------------------------------------------------- input checks
def check_tool(tool: Any) -> str:
    """Return ``tool`` if it is a valid tool name, else raise ValueError."""
    if not isinstance(tool, str):
        raise ValueError(f"tool name must be a string, got {type(tool).__name__}")
    if not tool or not tool.strip():
        raise ValueError("tool name must not be empty")
    if len(tool) > MAX_TOOL_NAME:
        raise ValueError(f"tool name is {len(tool)} characters; at most {MAX_TOOL_NAME} allowed")
    if any(ord(c) < 32 or ord(c) == 127 for c in tool):
        raise ValueError("tool name must not contain control characters")
    return tool


def check_wait(seconds: Any, max_wait_s: float = 1e7) -> float:
    """Return ``seconds`` as float if it is a plausible wait, else raise ValueError."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float, np.floating, np.integer)):
        raise ValueError(f"wait must be a number of seconds, got {type(seconds).__name__}")
    s = float(seconds)
    if math.isnan(s) or math.isinf(s):
        raise ValueError(f"wait must be finite, got {s}")
    if s < 0:
        raise ValueError(f"wait must be >= 0 seconds, got {s}")
    if s > max_wait_s:
        raise ValueError(f"wait of {s:.3g} s is absurd (limit {max_wait_s:.3g} s)")
    return s


def _feature_chain(features: Mapping[str, str] | None) -> list[str]:
    """Canonical feature suffixes, coarse to fine (``cmd`` first, then the rest by name)."""
    if not features:
        return []
    if not isinstance(features, Mapping):
        raise ValueError(f"features must be a mapping of str to str, got {type(features).__name__}")
    if len(features) > MAX_FEATURES:
        raise ValueError(f"at most {MAX_FEATURES} features allowed, got {len(features)}")
    items = []
    for k, v in features.items():
        for part, what in ((k, "name"), (v, "value")):
            if not isinstance(part, str) or not part or len(part) > MAX_FEATURE_LEN or \
                    any(ord(c) < 32 or ord(c) == 127 or c == "=" for c in part):
                raise ValueError(f"feature {what} must be a non-empty string of at most {MAX_FEATURE_LEN} "
                                 f"printable characters without '=', got {part!r}")
        items.append((k, v))
    items.sort(key=lambda kv: (kv[0] != "cmd", kv[0]))
    chain, acc = [], ""
    for k, v in items:
        acc += f"{_SEP}{k}={v}"
        chain.append(acc)
    return chain


_ENV_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_SKIP_WORDS = {"sudo", "env", "time", "nice", "nohup", "exec", "command", "xargs"}


def tool_features(command: str | None = None, arg_chars: int | None = None) -> dict[str, str]:
    """Coarse features of a tool call: the command head and an argument-size bucket.

    ``tool_features("cd /repo && python -m pytest -x", 120)`` ->
    ``{"cmd": "pytest", "arg": "<256"}``.  For ``cd X && Y`` the head of Y is
    used; environment assignments, ``sudo``/``env``/``timeout N`` and
    ``python -m`` wrappers are skipped.  Pure; never raises on odd commands.
    """
    out: dict[str, str] = {}
    if command:
        head = _command_head(command)
        if head:
            out["cmd"] = head
    if arg_chars is not None and arg_chars >= 0:
        bound = 64
        while arg_chars >= bound and bound < 65536:
            bound *= 4
        out["arg"] = f"<{bound}" if arg_chars < bound else f">={bound}"
    return out


def _command_head(command: str) -> str:
    segments = re.split(r"&&|\|\||;|\|", command)
    for seg in segments:
        try:
            words = shlex.split(seg, posix=True)
        except ValueError:
            words = seg.split()
        i = 0
        while i < len(words):
            w = words[i]
            if _ENV_ASSIGN.match(w) or w in _SKIP_WORDS:
                i += 1
                continue
            if w == "timeout":
                i += 2 if i + 1 < len(words) and not words[i + 1].startswith("-") else 1
                continue
            break
        if i >= len(words):
            continue
        head = os.path.basename(words[i]).lower()
        if head in ("cd", "pushd", "popd", "source", ".", "export", "set"):
            continue
        if re.fullmatch(r"python[0-9.]*", head) and i + 2 < len(words) and words[i + 1] == "-m":
            head = words[i + 2].lower()
        return head[:MAX_FEATURE_LEN].replace("=", "_")
    return ""


# --------------------------------------------------------------------------- the predictor
class ToolWaitPredictor:
    """Online per-tool wait distributions with back-off, decay and LMDB persistence.

    ``observe`` mutates (and writes through to LMDB when attached);
    ``forecast`` never changes what was learned (it only refreshes caches).
    """

    _PREFIX = b"pred/"

    def __init__(self, path: str | os.PathLike | None = None, *, config: PredictorConfig | None = None,
                 map_size: int = 64 << 20, sync: bool = True) -> None:
        self.config = config or PredictorConfig()
        self._decay = self.config.decay
        self._human_re = re.compile(self.config.human_pattern, re.IGNORECASE)
        self._lock = threading.RLock()
        self._nodes: dict[str, _Node] = {}
        self._class_cache: dict[str, str] = {}
        self._prior_cache: dict[str, WaitForecast] = {}
        self._chain_cache: dict[str, list[tuple[str, str]]] = {}  # validated tool -> chain (no features)
        self._stamp = [0]
        self._root_priors = {
            "g": self._make_root_prior(self.config.tool_prior),
            "g:human": self._make_root_prior(self.config.human_prior),
        }
        self._env = None
        self._owns_env = False
        self.load_errors = 0
        if path is not None:
            import lmdb
            os.makedirs(path, exist_ok=True)
            self._env = lmdb.open(os.fspath(path), map_size=map_size, subdir=True, sync=sync,
                                  metasync=False, max_dbs=0)
            self._owns_env = True
            self._load_from_env()

    def _make_root_prior(self, p: LogNormalPrior) -> _Prior:
        self._stamp[0] += 1
        # The prior's own predictive spread equals the fit: sigma * sqrt(1 + 1/k) == p.sigma.
        within = p.sigma / math.sqrt(1.0 + 1.0 / p.strength)
        return _Prior(p.mu, within, p.strength, p.strength, self._stamp[0])

    # -- persistence -------------------------------------------------------
    @classmethod
    def open(cls, env_or_dir: Any, *, config: PredictorConfig | None = None) -> "ToolWaitPredictor":
        """Attach to an ``lmdb.Environment`` (shared, not closed by us) or a directory."""
        if isinstance(env_or_dir, (str, os.PathLike)):
            return cls(env_or_dir, config=config)
        self = cls(None, config=config)
        self._env = env_or_dir
        self._load_from_env()
        return self

    def _load_from_env(self) -> None:
        nodes: dict[str, _Node] = {}
        with self._env.begin() as txn:
            cur = txn.cursor()
            if cur.set_range(self._PREFIX):
                for k, v in cur:
                    if not k.startswith(self._PREFIX):
                        break
                    key = k[len(self._PREFIX):].decode("utf-8", "replace")
                    try:
                        state = json.loads(v.decode("utf-8"))
                        nodes[key] = _Node.from_state(key, state, self._decay)
                    except (ValueError, UnicodeDecodeError) as exc:
                        self.load_errors += 1
                        log.warning("predictor: ignoring corrupt record %r: %s", key, exc)
        with self._lock:
            self._nodes = nodes

    def _write(self, nodes: list[_Node]) -> None:
        if self._env is None:
            return
        import lmdb
        recs = [(self._PREFIX + n.key.encode("utf-8"), json.dumps(n.to_state()).encode("utf-8")) for n in nodes]
        try:
            with self._env.begin(write=True) as txn:
                for k, v in recs:
                    txn.put(k, v)
        except lmdb.MapFullError:
            info = self._env.info()
            self._env.set_mapsize(info["map_size"] * 2)
            with self._env.begin(write=True) as txn:
                for k, v in recs:
                    txn.put(k, v)

    def flush(self) -> None:
        """Force learned state to disk (no-op without LMDB)."""
        if self._env is not None:
            self._env.sync(True)

    def close(self) -> None:
        """Flush and close the LMDB environment if this predictor opened it.  Idempotent."""
        with self._lock:
            if self._env is not None and self._owns_env:
                self._env.sync(True)
                self._env.close()
            self._env = None

    def __enter__(self) -> "ToolWaitPredictor":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def state_dict(self) -> dict:
        """Everything learned, as JSON-serialisable plain data."""
        with self._lock:
            return {"version": STATE_VERSION, "config": self.config.to_dict(),
                    "nodes": {k: n.to_state() for k, n in self._nodes.items()}}

    def load_state_dict(self, state: Mapping) -> None:
        """Replace learned state with ``state`` (all or nothing).  Raises ValueError if malformed."""
        if not isinstance(state, Mapping) or state.get("version") != STATE_VERSION:
            raise ValueError(f"predictor state must be a mapping with version {STATE_VERSION}")
        raw = state.get("nodes")
        if not isinstance(raw, Mapping):
            raise ValueError("predictor state has no 'nodes' mapping")
        nodes = {str(k): _Node.from_state(str(k), v, self._decay) for k, v in raw.items()}
        with self._lock:
            self._nodes = nodes
            if self._env is not None:
                with self._env.begin(write=True) as txn:
                    cur = txn.cursor()
                    if cur.set_range(self._PREFIX):
                        while cur.key().startswith(self._PREFIX):
                            if not cur.delete():
                                break
                self._write(list(nodes.values()))

    # -- keys ---------------------------------------------------------------
    def _root_key(self, tool: str) -> str:
        c = self._class_cache.get(tool)
        if c is None:
            c = "g:human" if self._human_re.search(tool) else "g"
            if len(self._class_cache) < 100_000:
                self._class_cache[tool] = c
        return c

    def _chain_keys(self, tool: str, features: Mapping[str, str] | None) -> list[tuple[str, str]]:
        if not features:
            keys = self._chain_cache.get(tool) if type(tool) is str else None
            if keys is None:
                check_tool(tool)
                keys = [(self._root_key(tool), "global"), ("t:" + tool, "tool")]
                if len(self._chain_cache) < 100_000:
                    self._chain_cache[tool] = keys
            return keys
        check_tool(tool)
        keys = [(self._root_key(tool), "global"), ("t:" + tool, "tool")]
        for suffix in _feature_chain(features):
            keys.append(("f:" + tool + suffix, "tool+features"))
        return keys

    # -- learning -----------------------------------------------------------
    def observe(self, tool: str, seconds: float, features: Mapping[str, str] | None = None) -> None:
        """Learn one real wait of ``tool``.  Raises ValueError on bad input (state untouched)."""
        check_tool(tool)
        s = check_wait(seconds, self.config.max_wait_s)
        keys = self._chain_keys(tool, features)  # validates features before any mutation
        x = math.log(max(s, MIN_S))
        d = self._decay
        with self._lock:
            chain: list[_Node] = []
            prior = self._root_priors[keys[0][0]]
            parent: _Node | None = None
            for key, level in keys:
                node = self._nodes.get(key)
                if node is None:
                    node = self._nodes[key] = _Node(key, level, d)
                if parent is not None and node.w >= 1.0:
                    mu, _ = node.posterior(prior)
                    parent.add_child_residual(x - mu, d)
                next_prior = node.child_prior(prior, self.config, self._stamp)
                chain.append(node)
                parent, prior = node, next_prior
            for node in chain:
                node.observe(x, s, d)
            # Refresh the forecasts this observation made stale (when due), so the
            # decision path finds them ready: learning pays, deciding reads.
            prior = self._root_priors[keys[0][0]]
            for node in chain:
                self._node_forecast(node, prior)
                prior = node.child_prior(prior, self.config, self._stamp)
            self._write(chain)

    # -- forecasting --------------------------------------------------------
    def forecast(self, tool: str, features: Mapping[str, str] | None = None) -> WaitForecast:
        """Predicted wait distribution of ``tool`` (never mutates learned state).

        Answers from the most specific level that has observations; an unseen
        tool gets its root's forecast (``source`` "global", or "prior" when
        nothing at all was observed).  Raises ValueError for invalid names.
        """
        keys = self._chain_keys(tool, features)   # validates tool and features
        with self._lock:
            prior = self._root_priors[keys[0][0]]
            best: _Node | None = None
            best_prior = prior
            for key, _level in keys:
                node = self._nodes.get(key)
                if node is None:
                    break
                best, best_prior = node, prior
                prior = node.child_prior(prior, self.config, self._stamp)
            if best is None:
                return self._prior_forecast(tool, keys[0][0])
            fc = self._node_forecast(best, best_prior, lazy=True)
        if fc.tool != tool:
            fc = replace(fc, tool=tool)
        return fc

    def _node_forecast(self, node: _Node, prior: _Prior, *, lazy: bool = False) -> WaitForecast:
        """The node's cached forecast, rebuilt when it is stale.

        Stale means: ``refresh_fraction`` of its observations are new, or the
        prior handed down by its parent moved its posterior (mu or sigma of
        the log-wait) by more than 1%.  With ``lazy`` (the read path) a
        forecast that is stale only because the parent moved is served as
        is; the node's next observation (or :meth:`refresh`) rebuilds it.
        So deciding never pays for a rebuild that learning caused elsewhere.
        """
        fc = node._fc
        cfg = self.config
        if fc is not None and node.n - node._fc_n < max(1.0, cfg.refresh_fraction * node.n):
            if node._fc_stamp == prior.stamp or lazy:
                return fc
            mu, sigma = node.posterior(prior)
            if abs(mu - fc.mu_log) <= 0.01 and abs(sigma - fc.sigma_log) <= 0.01 * fc.sigma_log:
                node._fc_stamp = prior.stamp
                return fc
        mu, sigma = node.posterior(prior)
        tool = node.key[2:].split(_SEP)[0] if node.level != "global" else node.key
        fc = _build_forecast(tool, node.level, node.n, node.w, mu, sigma,
                             node.sketch.snapshot(), cfg.sketch_k)
        node._fc, node._fc_n, node._fc_stamp = fc, node.n, prior.stamp
        return fc

    def refresh(self) -> int:
        """Rebuild every stale cached forecast now (e.g. from a background timer).

        Returns how many were rebuilt.  Does not change what was learned.
        """
        rebuilt = 0
        with self._lock:
            for key in sorted(self._nodes, key=lambda k: (k.count(_SEP), not k.startswith("g"), k)):
                node = self._nodes[key]
                before = node._fc
                self._node_forecast(node, self._prior_of(key))
                rebuilt += node._fc is not before
        return rebuilt

    def _prior_of(self, key: str) -> _Prior:
        """The prior a node currently gets from its ancestors (walks the chain)."""
        if key.startswith("g"):
            return self._root_priors[key]
        tool = key[2:].split(_SEP)[0]
        parts = key[2:].split(_SEP)[1:] if key.startswith("f:") else []
        chain = [self._root_key(tool), "t:" + tool]
        acc = "f:" + tool
        for part in parts:
            acc += _SEP + part
            chain.append(acc)
        prior = self._root_priors[chain[0]]
        for k in chain:
            if k == key:
                return prior
            node = self._nodes.get(k)
            if node is None:
                return prior
            prior = node.child_prior(prior, self.config, self._stamp)
        return prior

    def _prior_forecast(self, tool: str, root_key: str) -> WaitForecast:
        fc = self._prior_cache.get(root_key)
        if fc is None:
            p = self._root_priors[root_key]
            mu, sigma = p.mu, p.sigma * math.sqrt(1.0 + 1.0 / p.mean_strength)
            fc = self._prior_cache[root_key] = _build_forecast(root_key, "prior", 0, 0.0, mu, sigma, None,
                                                               self.config.sketch_k)
        return fc

    # -- introspection ------------------------------------------------------
    def tools(self) -> dict[str, int]:
        """Observed tools and their observation counts."""
        with self._lock:
            return {k[2:]: n.n for k, n in self._nodes.items() if n.level == "tool"}

    @property
    def n_observations(self) -> int:
        with self._lock:
            return sum(n.n for k, n in self._nodes.items() if n.level == "global")


# --------------------------------------------------------------------------- baselines
def _point_forecast(tool: str, value: float, n: int, source: str) -> Forecast:
    return Forecast(tool=tool, n=n, mean_s=value, quantiles={k: value for k in _Q_KEYS}, source=source)


class RunningMeanPredictor:
    """Continuum's predictor: the running mean of each tool's waits (a point forecast).

    Unknown tools get the running mean over all tools, or the TraceLab mean
    (18.4 s) before anything was observed.  Same API as ToolWaitPredictor.
    """

    PRIOR_MEAN_S = 18.4

    def __init__(self) -> None:
        self._sum: dict[str, float] = {}
        self._n: dict[str, int] = {}
        self._gsum = 0.0
        self._gn = 0

    def observe(self, tool: str, seconds: float, features: Mapping[str, str] | None = None) -> None:
        check_tool(tool)
        s = check_wait(seconds)
        self._sum[tool] = self._sum.get(tool, 0.0) + s
        self._n[tool] = self._n.get(tool, 0) + 1
        self._gsum += s
        self._gn += 1

    def forecast(self, tool: str, features: Mapping[str, str] | None = None) -> Forecast:
        check_tool(tool)
        n = self._n.get(tool, 0)
        if n:
            return _point_forecast(tool, self._sum[tool] / n, n, "tool")
        if self._gn:
            return _point_forecast(tool, self._gsum / self._gn, self._gn, "global")
        return _point_forecast(tool, self.PRIOR_MEAN_S, 0, "prior")


class GlobalMedianPredictor:
    """The median of every wait seen so far, whatever the tool (a point forecast)."""

    PRIOR_MEDIAN_S = 0.3

    def __init__(self) -> None:
        self._sorted: list[float] = []

    def observe(self, tool: str, seconds: float, features: Mapping[str, str] | None = None) -> None:
        import bisect
        check_tool(tool)
        bisect.insort(self._sorted, check_wait(seconds))

    def forecast(self, tool: str, features: Mapping[str, str] | None = None) -> Forecast:
        check_tool(tool)
        v = self._sorted
        if not v:
            return _point_forecast(tool, self.PRIOR_MEDIAN_S, 0, "prior")
        m = len(v) // 2
        med = v[m] if len(v) % 2 else 0.5 * (v[m - 1] + v[m])
        return _point_forecast(tool, med, len(v), "global")
