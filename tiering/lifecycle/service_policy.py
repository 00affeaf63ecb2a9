"""A policy that asks the ``kvtier serve`` service without ever making its caller wait.

Engine threads call :meth:`ServicePolicy.decide`; it answers at once, from a
cached service decision when one is fresh, else from the local policy, and
queues a fetch on its own thread ("kvtier-service").  So::

    engine call cost = a dict lookup + the local policy's decide (+ queueing a fetch)

whatever the service does: an engine thread never waits on HTTP.  Fetches are
cached per (tool, context size class) for ``ttl_s`` seconds; at most one fetch
per key is in flight.  Each fetch is bounded by ``timeout_s``; after 3
consecutive failed or timed-out calls the :class:`~kvtier.util.breaker.CircuitBreaker`
goes ``down`` and no call is attempted for 10 s; then the next call is the
retry (success: ``up``; failure: the wait doubles, at most 60 s).  A dead
service therefore costs the engine nothing, and costs kvtier one blocked
fetch thread for at most ``3 * timeout_s`` before it stops trying.

Feedback (``observe``) goes to the local policy at once and to the service
in the background (dropped while the breaker is not up).

Bounded under any input: the background work is a :class:`BoundedWork`
(fetches coalesce per key, observations per tool in batches of at most
``per_tool`` -- oldest dropped --, at most ``max_jobs`` keys waiting, the
oldest dropped; all counted in ``stats()``), and the decision cache keeps the
``max_cached`` most recently fetched keys.
"""
from __future__ import annotations

import logging
import math
import threading
import time
from collections import Counter, OrderedDict
from typing import Any, Callable, Mapping

from kvtier.tiering.model.decision import Action, Decision, PauseContext, Policy
from kvtier.tiering.model.tiers import Tier
from kvtier.util.breaker import CircuitBreaker

from .bounded_work import BoundedWork

log = logging.getLogger("kvtier.service_policy")


def service_breaker(clock: Callable[[], float] = time.monotonic) -> CircuitBreaker:
    """The service's breaker: down after 3 consecutive failures, the caller's next
    call after 10 s (doubling to 60 s while it fails) is the retry; no probe thread."""
    return CircuitBreaker(threshold=3, base_s=10.0, max_s=60.0, name="service", clock=clock)


def _size_class(tokens: int) -> int:
    return int(math.log2(tokens)) if tokens > 0 else 0


class ServicePolicy(Policy):
    """See the module doc.  ``local`` answers whenever the cache cannot (and
    handles leases and victim order); ``client`` defaults to a
    ``KvtierClient(url, timeout_s=timeout_s)``, which :meth:`close` closes (a client passed
    in is its caller's to close); ``breaker`` to :func:`service_breaker`."""

    name = "service"

    def __init__(self, url: str, model: Any, *, local: Policy, ttl_s: float = 5.0, timeout_s: float = 1.0,
                 breaker: CircuitBreaker | None = None, client: Any = None,
                 clock: Callable[[], float] = time.monotonic, max_cached: int = 4096,
                 max_jobs: int = 256, per_tool: int = 32) -> None:
        self._owns_client = client is None     # a client passed in is its caller's to close
        if client is None:
            from kvtier.tiering.service.client import KvtierClient
            client = KvtierClient(url, timeout_s=timeout_s)
        self.client, self.model, self.local = client, model, local
        self.ttl_s, self.timeout_s = float(ttl_s), float(timeout_s)
        self.breaker = breaker or service_breaker(clock)
        self._clock = clock
        self._lock = threading.Lock()
        self._cache: OrderedDict[tuple[str, int], tuple[float, Decision]] = OrderedDict()
        self._pending: set[tuple[str, int]] = set()
        self.max_cached = max_cached
        self.counters: Counter[str] = Counter()
        self._work = BoundedWork("kvtier-service", max_jobs=max_jobs, per_key=per_tool,
                                 on_drop=self._dropped)

    # -- Policy
    def decide(self, ctx: PauseContext) -> Decision:
        key = (ctx.tool, _size_class(ctx.context_tokens))
        now = self._clock()
        with self._lock:
            hit = self._cache.get(key)
            fresh = hit is not None and now - hit[0] < self.ttl_s
            fetch = not fresh and key not in self._pending
            if fetch:
                self._pending.add(key)
        if fetch:
            if self.breaker.would_allow():
                self._work.submit(("fetch", key),
                                  lambda items, key=key: self._fetch(key, ctx.tool, items[-1]),
                                  ctx.context_tokens)
            else:
                with self._lock:
                    self._pending.discard(key)
                self.counters["breaker_skips"] += 1
        if fresh:
            self.counters["service"] += 1
            return hit[1]
        self.counters["local"] += 1
        return self.local.decide(ctx)

    def observe(self, tool: str, wait_s: float, features: Mapping[str, str] | None = None) -> None:
        self.local.observe(tool, wait_s, features)
        if self.breaker.would_allow():
            self._work.submit(("observe", tool), self._send_observes, (tool, wait_s, features))

    def on_lease_expiry(self, ctx: PauseContext, elapsed_s: float, current: Decision) -> Decision | None:
        return self.local.on_lease_expiry(ctx, elapsed_s, current)

    def victim_priority(self, ctx: PauseContext, elapsed_s: float) -> float:
        return self.local.victim_priority(ctx, elapsed_s)

    def victim_action(self, ctx: PauseContext) -> Action:
        return self.local.victim_action(ctx)

    def reads(self, tier: Tier, tokens: int) -> bool:
        return self.local.reads(tier, tokens)

    # -- the fetch thread
    def _fetch(self, key: tuple[str, int], tool: str, tokens: int) -> None:
        if not self.breaker.allow():   # queued before the breaker went down: do not ask a dead service
            self.counters["breaker_skips"] += 1
            with self._lock:
                self._pending.discard(key)
            return
        try:
            ans = self.client.decide(tool, max(int(tokens), 0), self.model)
        except Exception as exc:
            self.breaker.failure(type(exc).__name__)
            self.counters["fetch_failures"] += 1
            log.debug("kvtier: service decide(%r) failed: %s", tool, exc)
        else:
            self.breaker.success()
            self.counters["fetches"] += 1
            with self._lock:
                self._cache[key] = (self._clock(), ans.decision)
                self._cache.move_to_end(key)
                while len(self._cache) > self.max_cached:
                    self._cache.popitem(last=False)
                    self.counters["cache_evicted"] += 1
        finally:
            with self._lock:
                self._pending.discard(key)

    def _send_observes(self, items: list) -> None:
        for tool, wait_s, features in items:
            if not self.breaker.allow():
                self.counters["observe_dropped"] += 1
                continue
            try:
                self.client.observe(tool, wait_s, features)
                self.breaker.success()
            except Exception as exc:
                self.breaker.failure(type(exc).__name__)
                log.debug("kvtier: service observe(%r) failed: %s", tool, exc)

    def _dropped(self, job_key) -> None:
        """A waiting job was dropped (queue full or closing): a fetch may be asked again."""
        if job_key[0] == "fetch":
            with self._lock:
                self._pending.discard(job_key[1])

    def stats(self) -> dict:
        with self._lock:
            cached = len(self._cache)
        work = {f"work_{k}": v for k, v in self._work.stats().items()}
        return {**self.counters, **work, "cached": cached, "breaker": self.breaker.state,
                "breaker_trips": self.breaker.trips}

    def close(self) -> None:
        """Stop the fetch thread (queued fetches are dropped; one in flight ends
        within ``timeout_s``).  Idempotent."""
        self._work.close()
        if self._owns_client:
            self.client.close()
