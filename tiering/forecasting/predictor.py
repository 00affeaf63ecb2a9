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
* a decayed log-bucket quantile sketch (:mod:`kvtier.tiering.forecasting.sketch`) that captures
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

Bounded memory
--------------
Whatever names clients invent, at most ``config.max_nodes`` tool and
tool+feature nodes are kept (LRU by observation).  A node pushed out is
folded into its class's prior: the root ("global" / "global:human") has
already learned every observation it saw, so an evicted tool is forecast
from its root, exactly like a tool never seen.  ``folded`` counts them; the
name caches are bounded by the same cap.  Forecasts of unseen tools are not
cached per name.

Bad input (negative, NaN, infinite or absurd waits; empty, over-long or
control-character tool names; malformed features) raises ``ValueError`` and
leaves the learned state untouched.  Thread-safe: one lock guards all state.

Rooms: :mod:`~kvtier.tiering.forecasting.forecast` (WaitForecast, the Predictor Protocol),
:mod:`~kvtier.tiering.forecasting.features` (input checks, tool_features),
:mod:`~kvtier.tiering.forecasting.predictor_nodes` (priors, config, per-key statistics),
:mod:`~kvtier.tiering.forecasting.predictor_baselines` (point-forecast baselines); this module
is the predictor itself.
"""
from __future__ import annotations

import json
import logging
import math
import os
import re
import threading
from collections import OrderedDict
from dataclasses import replace
from typing import Any, Mapping

from kvtier.tiering.forecasting.features import (MAX_FEATURE_LEN, MAX_FEATURES, MAX_TOOL_NAME, SEP, check_tool, check_wait,
                                     feature_chain, tool_features)
from kvtier.tiering.forecasting.forecast import (BIN_EDGES, BIN_WEIGHTS, REPORTED_QUANTILES, Predictor, WaitDistribution,
                                     WaitForecast, build_forecast)
from kvtier.tiering.forecasting.predictor_baselines import GlobalMedianPredictor, RunningMeanPredictor
from kvtier.tiering.forecasting.predictor_nodes import (HUMAN_TOOL_PATTERN, TRACELAB_HUMAN_PRIOR, TRACELAB_TOOL_PRIOR,
                                            LogNormalPrior, NodePrior, PredictorConfig, StatNode)
from kvtier.tiering.forecasting.sketch import MIN_S

__all__ = ["ToolWaitPredictor", "WaitForecast", "WaitDistribution", "Predictor", "PredictorConfig",
           "LogNormalPrior", "TRACELAB_TOOL_PRIOR", "TRACELAB_HUMAN_PRIOR", "HUMAN_TOOL_PATTERN",
           "RunningMeanPredictor", "GlobalMedianPredictor", "tool_features", "check_tool", "check_wait",
           "BIN_EDGES", "BIN_WEIGHTS", "REPORTED_QUANTILES", "MAX_TOOL_NAME", "MAX_FEATURES",
           "MAX_FEATURE_LEN", "STATE_VERSION", "build_forecast"]

log = logging.getLogger(__name__)

STATE_VERSION = 1
_build_forecast = build_forecast      # old private name (tests, callers of 0.x)


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
        self._nodes: OrderedDict[str, StatNode] = OrderedDict()   # least recently observed first
        self.folded = 0                   # nodes forgotten past max_nodes (folded into their root)
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

    def _make_root_prior(self, p: LogNormalPrior) -> NodePrior:
        self._stamp[0] += 1
        # The prior's own predictive spread equals the fit: sigma * sqrt(1 + 1/k) == p.sigma.
        within = p.sigma / math.sqrt(1.0 + 1.0 / p.strength)
        return NodePrior(p.mu, within, p.strength, p.strength, self._stamp[0])

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
        nodes: OrderedDict[str, StatNode] = OrderedDict()
        with self._env.begin() as txn:
            cur = txn.cursor()
            if cur.set_range(self._PREFIX):
                for k, v in cur:
                    if not k.startswith(self._PREFIX):
                        break
                    key = k[len(self._PREFIX):].decode("utf-8", "replace")
                    try:
                        state = json.loads(v.decode("utf-8"))
                        nodes[key] = StatNode.from_state(key, state, self._decay)
                    except (ValueError, UnicodeDecodeError) as exc:
                        self.load_errors += 1
                        log.warning("predictor: ignoring corrupt record %r: %s", key, exc)
        with self._lock:
            self._nodes = nodes

    def _write(self, nodes: list[StatNode], *, replace_all: bool = False, drop: tuple[str, ...] = ()) -> None:
        """Write ``nodes`` in one LMDB transaction (``replace_all``: and delete every other
        record of ours in the same transaction).  On a full map it grows the map once and
        retries the whole transaction.  Raises lmdb.Error when the write fails: nothing of
        it is on disk then."""
        if self._env is None:
            return
        import lmdb
        recs = [(self._PREFIX + n.key.encode("utf-8"), json.dumps(n.to_state()).encode("utf-8")) for n in nodes]
        gone = [self._PREFIX + k.encode("utf-8") for k in drop]
        try:
            self._write_txn(recs, replace_all, gone)
        except lmdb.MapFullError:
            info = self._env.info()
            self._env.set_mapsize(info["map_size"] * 2)
            self._write_txn(recs, replace_all, gone)

    def _write_txn(self, recs: list[tuple[bytes, bytes]], replace_all: bool, gone: list[bytes] = ()) -> None:
        with self._env.begin(write=True) as txn:
            for k in gone:
                txn.delete(k)
            if replace_all:
                cur = txn.cursor()
                if cur.set_range(self._PREFIX):
                    while cur.key().startswith(self._PREFIX):
                        if not cur.delete():
                            break
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
        """Replace learned state with ``state``, all or nothing: with LMDB attached the records
        are replaced on disk in one transaction first, and memory only once that committed.

        Raises ValueError if ``state`` is malformed, lmdb.Error if the disk write fails (memory
        and disk then both keep the previous state)."""
        if not isinstance(state, Mapping) or state.get("version") != STATE_VERSION:
            raise ValueError(f"predictor state must be a mapping with version {STATE_VERSION}")
        raw = state.get("nodes")
        if not isinstance(raw, Mapping):
            raise ValueError("predictor state has no 'nodes' mapping")
        nodes = OrderedDict((str(k), StatNode.from_state(str(k), v, self._decay)) for k, v in raw.items())
        with self._lock:
            self._write(list(nodes.values()), replace_all=True)
            self._nodes = nodes

    # -- keys ---------------------------------------------------------------
    def _root_key(self, tool: str) -> str:
        c = self._class_cache.get(tool)
        if c is None:
            c = "g:human" if self._human_re.search(tool) else "g"
            if len(self._class_cache) < self.config.max_nodes:
                self._class_cache[tool] = c
        return c

    def _chain_keys(self, tool: str, features: Mapping[str, str] | None) -> list[tuple[str, str]]:
        if not features:
            keys = self._chain_cache.get(tool) if type(tool) is str else None
            if keys is None:
                check_tool(tool)
                keys = [(self._root_key(tool), "global"), ("t:" + tool, "tool")]
                if len(self._chain_cache) < self.config.max_nodes:
                    self._chain_cache[tool] = keys
            return keys
        check_tool(tool)
        keys = [(self._root_key(tool), "global"), ("t:" + tool, "tool")]
        for suffix in feature_chain(features):
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
            chain: list[StatNode] = []
            prior = self._root_priors[keys[0][0]]
            parent: StatNode | None = None
            for key, level in keys:
                node = self._nodes.get(key)
                if node is None:
                    node = self._nodes[key] = StatNode(key, level, d)
                else:
                    self._nodes.move_to_end(key)
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
            self._write(chain, drop=self._fold_excess())

    def _fold_excess(self) -> tuple[str, ...]:
        """Forget the least recently observed non-root nodes past ``max_nodes``
        (caller holds the lock).  Returns their keys."""
        excess = len(self._nodes) - len(self._root_priors) - self.config.max_nodes
        if excess <= 0:
            return ()
        gone = []
        for key in self._nodes:
            if len(gone) == excess:
                break
            if key not in self._root_priors:
                gone.append(key)
        for key in gone:
            del self._nodes[key]
            tool = key[2:].split(SEP)[0]
            self._chain_cache.pop(tool, None)
            self._class_cache.pop(tool, None)
        self.folded += len(gone)
        return tuple(gone)

    def forget(self, tool: str) -> bool:
        """Fold ``tool``'s node into its class prior now, as ``max_nodes`` does
        for the least recently observed (its root has learned every observation
        it saw); its tool+feature nodes age out on their own.  Returns whether
        a node was held.  Persisted when LMDB is attached (raises lmdb.Error if
        that write fails; memory is then unchanged)."""
        key = "t:" + tool
        with self._lock:
            if key not in self._nodes:
                return False
            self._write([], drop=(key,))
            del self._nodes[key]
            self._chain_cache.pop(tool, None)
            self._class_cache.pop(tool, None)
            self.folded += 1
            return True

    def __len__(self) -> int:
        """Nodes held (roots included): at most ``config.max_nodes`` + 2."""
        with self._lock:
            return len(self._nodes)

    # -- forecasting --------------------------------------------------------
    def forecast(self, tool: str, features: Mapping[str, str] | None = None) -> WaitForecast:
        """Predicted wait distribution of ``tool`` (never mutates learned state).

        Answers from the most specific level that has observations; an unseen
        tool gets its root's forecast (``source`` "global", or "prior" when
        nothing at all was observed).  Raises ValueError for invalid names.
        """
        keys = self._chain_keys(tool, features)   # validates tool and features
        with self._lock:
            nodes = self._nodes
            best: StatNode | None = None
            for key, _level in keys:
                node = nodes.get(key)
                if node is None:
                    break
                best = node
            if best is None:
                return self._prior_forecast(tool, keys[0][0])
            fc = best._fc
            if fc is None or self.config.outdated(best.n, best._fc_n):
                # stale: rebuild under the prior its ancestors hand down now (the walk;
                # a fresh forecast, the usual case, is served without it, as _node_forecast's
                # lazy read would serve it)
                fc = self._node_forecast(best, self._walk_prior(keys, best), lazy=True)
        if fc.tool != tool:
            fc = replace(fc, tool=tool)
        return fc

    def _walk_prior(self, keys: list[tuple[str, str]], best: StatNode) -> NodePrior:
        """The prior handed to ``best`` down the chain ``keys`` (caller holds the lock)."""
        prior = self._root_priors[keys[0][0]]
        for key, _level in keys:
            node = self._nodes[key]
            if node is best:
                return prior
            prior = node.child_prior(prior, self.config, self._stamp)
        return prior  # pragma: no cover (best is on the chain)

    def _node_forecast(self, node: StatNode, prior: NodePrior, *, lazy: bool = False) -> WaitForecast:
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
        if fc is not None and not cfg.outdated(node.n, node._fc_n):
            if node._fc_stamp == prior.stamp or lazy:
                return fc
            mu, sigma = node.posterior(prior)
            if abs(mu - fc.mu_log) <= 0.01 and abs(sigma - fc.sigma_log) <= 0.01 * fc.sigma_log:
                node._fc_stamp = prior.stamp
                return fc
        mu, sigma = node.posterior(prior)
        tool = node.key[2:].split(SEP)[0] if node.level != "global" else node.key
        fc = build_forecast(tool, node.level, node.n, node.w, mu, sigma,
                             node.sketch.snapshot(), cfg.sketch_k)
        node._fc, node._fc_n, node._fc_stamp = fc, node.n, prior.stamp
        return fc

    def refresh(self) -> int:
        """Rebuild every stale cached forecast now (e.g. from a background timer).

        Returns how many were rebuilt.  Does not change what was learned.
        """
        rebuilt = 0
        with self._lock:
            for key in sorted(self._nodes, key=lambda k: (k.count(SEP), not k.startswith("g"), k)):
                node = self._nodes[key]
                before = node._fc
                self._node_forecast(node, self._prior_of(key))
                rebuilt += node._fc is not before
        return rebuilt

    def _prior_of(self, key: str) -> NodePrior:
        """The prior a node currently gets from its ancestors (walks the chain)."""
        if key.startswith("g"):
            return self._root_priors[key]
        tool = key[2:].split(SEP)[0]
        parts = key[2:].split(SEP)[1:] if key.startswith("f:") else []
        chain = [self._root_key(tool), "t:" + tool]
        acc = "f:" + tool
        for part in parts:
            acc += SEP + part
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
            fc = self._prior_cache[root_key] = build_forecast(root_key, "prior", 0, 0.0, mu, sigma, None,
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
