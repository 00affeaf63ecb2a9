"""The remote tier's state as Prometheus gauges: one mapping for every exporter.

``stats().remote`` (a :class:`~kvtier.store.remote.tier.RemoteStats` dict) is
what the store knows; :func:`remote_gauges` turns it into numbers under
stable names, which the engine plugins (``vllm:kvtier_remote_*``) and the
service's ``/metrics`` (``kvtier_remote_*``) publish.  Labels: ``backend``
only ("redis", "mooncake"): never the URL, so no host, user or password
reaches a scrape.  Pure functions; no import beyond the standard library.
"""
from __future__ import annotations

from typing import Mapping

# name (without prefix) -> help text
REMOTE_GAUGES: dict[str, str] = {
    "remote_up": "1 while the remote tier answers (its circuit breaker is closed)",
    "remote_breaker_open": "1 while the breaker is open: remote calls are skipped (misses) until a probe succeeds",
    "remote_auth_failed": "1 while the remote server rejects the credentials (password or ACL user)",
    "remote_breaker_trips": "times the remote tier's breaker opened",
    "remote_consecutive_failures": "failed remote calls and probes since the tier was last up",
    "remote_hits": "blocks read from the remote tier and verified",
    "remote_misses": "blocks asked of the remote tier and not served (absent, corrupt, or tier down)",
    "remote_put_failures": "blocks the remote tier did not accept (full, refused, or tier down)",
    "remote_corrupt_dropped": "remote values that failed verification (deleted, served as misses)",
    "remote_skipped_while_down": "blocks answered without a call because the remote tier was down",
    "remote_bytes_in": "payload bytes read from the remote tier",
    "remote_bytes_out": "payload bytes published to the remote tier",
}

_FROM_STATS = {"remote_breaker_trips": "trips", "remote_consecutive_failures": "consecutive_failures",
               "remote_hits": "hits", "remote_misses": "misses", "remote_put_failures": "put_failures",
               "remote_corrupt_dropped": "corrupt_dropped", "remote_skipped_while_down": "skipped_while_down",
               "remote_bytes_in": "bytes_read", "remote_bytes_out": "bytes_put"}


def remote_gauges(remote: Mapping | None) -> dict[str, float]:
    """The gauge values of one remote tier's stats dict ({} without a remote
    tier).  Missing fields read as 0; never raises on a well-typed dict."""
    if not remote:
        return {}
    state = remote.get("state")
    out = {"remote_up": float(state == "up"),
           "remote_breaker_open": float(state in ("down", "connecting", "auth_failed")),
           "remote_auth_failed": float(state == "auth_failed")}
    for name, field in _FROM_STATS.items():
        out[name] = float(remote.get(field) or 0)
    return out
