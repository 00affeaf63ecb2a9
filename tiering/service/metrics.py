"""Prometheus metrics of one service instance, on its own CollectorRegistry.

Nothing is registered on prometheus-client's global registry, so two apps in
one process (tests, a restart within a test) never collide and nothing needs
patching.  Labels are low-cardinality by construction: actions and tiers are
closed sets; tool names (user-controlled) never become labels.

A process that embeds the service beside a store shows the store's remote
tier here too: ``app.state.metrics.watch_remote(source, backend)``, where
``source()`` returns ``kvtier.store.remote.remote_gauges(store.stats().remote)``
(read at scrape time; this module imports nothing of the store).
"""
from __future__ import annotations

import logging
from typing import Callable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from kvtier.util.tiers import Tier

log = logging.getLogger(__name__)

ACTIONS = ("retain", "offload_host", "offload_nvme", "recompute")
# the tiers the service counts, by the label its clients see (its metrics' and stats' ``tier``)
TIER_LABELS: dict[Tier, str] = {Tier.DEVICE: "hbm", Tier.HOST: "host", Tier.NVME: "nvme"}
CONTENT_TYPE = CONTENT_TYPE_LATEST

# |ln(actual / predicted p50)|: 0.1 is ~10% off, 0.69 is 2x off, 2.3 is 10x off.
_LOG_ERROR_BUCKETS = (0.05, 0.1, 0.2, 0.35, 0.7, 1.0, 1.6, 2.3, 3.5, 4.6, 7.0)
_STALL_BUCKETS = (0.0, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class ServiceMetrics:
    """The service's metrics.  Mutates only its own registry; thread-safe
    (prometheus-client metrics lock internally)."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.decisions = Counter("kvtier_decisions", "pause decisions by action", ["action"], registry=r)
        self.observations = Counter("kvtier_tool_observations", "tool durations learned", registry=r)
        self.forecast_log_error = Histogram(
            "kvtier_forecast_abs_log_error", "|ln(actual wait / forecast p50)| at resume",
            buckets=_LOG_ERROR_BUCKETS, registry=r)
        self.forecast_in_p10_p90 = Counter(
            "kvtier_forecast_within_p10_p90", "resumes whose wait fell inside the forecast p10..p90", registry=r)
        self.forecast_checked = Counter(
            "kvtier_forecast_checked", "resumes whose wait was compared with a forecast", registry=r)
        self.bytes_moved = Counter("kvtier_bytes_moved", "KV bytes moved per tier as decided "
                                   "(out: offloaded into the tier; in: reloaded from it)",
                                   ["tier", "direction"], registry=r)
        self.occupancy_bytes = Gauge("kvtier_tier_occupancy_bytes",
                                     "KV bytes of paused trajectories by tier they were placed in",
                                     ["tier"], registry=r)
        self.occupancy_trajectories = Gauge("kvtier_tier_occupancy_trajectories",
                                            "paused trajectories by tier", ["tier"], registry=r)
        self.paused = Gauge("kvtier_paused_trajectories", "trajectories currently paused", registry=r)
        self.resume_stall = Histogram("kvtier_resume_stall_seconds",
                                      "resume stall reported by engines (state not back when the tool returned)",
                                      buckets=_STALL_BUCKETS, registry=r)
        self.lost = Counter("kvtier_trajectories_lost", "paused trajectories lost across a restart", registry=r)
        self.restored = Counter("kvtier_trajectories_restored",
                                "paused trajectories restored across a restart", registry=r)
        # Touch every labelled child so the series exist (at 0) from the start.
        for a in ACTIONS:
            self.decisions.labels(action=a)
        for t in TIER_LABELS.values():
            self.occupancy_bytes.labels(tier=t)
            self.occupancy_trajectories.labels(tier=t)
            for d in ("out", "in"):
                self.bytes_moved.labels(tier=t, direction=d)

    def watch_remote(self, source: Callable[[], Mapping[str, float]], backend: str,
                     help_text: Mapping[str, str] | None = None) -> None:
        """Publish a remote tier's gauges (``kvtier_<name>{backend=...}``),
        read from ``source()`` at every scrape.  ``source`` must be cheap and
        thread-safe; if it raises, that scrape omits the gauges (logged)."""
        self.registry.register(_RemoteCollector(source, backend, dict(help_text or {})))

    def render(self) -> bytes:
        """The text exposition format of every metric."""
        return generate_latest(self.registry)


class _RemoteCollector:
    """A prometheus-client collector over a gauges callable (see ``watch_remote``)."""

    def __init__(self, source: Callable[[], Mapping[str, float]], backend: str, help_text: dict) -> None:
        self._source, self._backend, self._help = source, backend, help_text

    def describe(self):
        return []          # names are known only at scrape time (auto_describe must not call source)

    def collect(self):
        try:
            values = dict(self._source())
        except Exception as exc:       # a store closing under a scrape must not fail /metrics
            log.debug("remote gauges unavailable: %s", exc)
            return
        for name, v in sorted(values.items()):
            g = GaugeMetricFamily(f"kvtier_{name}", self._help.get(name, name.replace("_", " ")),
                                  labels=["backend"])
            g.add_metric([self._backend], float(v))
            yield g
