"""What the SGLang and vLLM plugins share: engine keys -> store keys, tool-wait
hints, and the placement advisor that turns a hint into a store tier.

Neither engine is imported here (the plugins import theirs); this module only
needs ``store`` and ``tiering``, so it is cheap and testable anywhere.

Keys.  Engines hand the plugins their own content hashes: SGLang a hex
SHA-256 per page (chained over the page's tokens and its parent), vLLM a
block hash (bytes) plus a KV-cache group index.  Those already identify the
tokens; what they do not identify is *whose* bytes they are (model, dtype,
layout, tensor-parallel rank).  :func:`store_key` folds a
:class:`store.Namespace` into the engine key::

    store_key = blake2b-128(person="kvtier.engine", ns.digest || engine_key)

so two ranks or two models sharing one data directory never read each
other's pages, and the same engine key under the same namespace is always the
same store key (reopening the store finds it again).

Hints (:mod:`kvtier.engine_adapter.hints`).  A hint with a
trajectory goes to the lifecycle controller (:mod:`kvtier.tiering.lifecycle`:
admission, lease, demotion, staging).  A hint without one is placed once by
:class:`PlacementAdvisor`: ``offload_host``/``retain`` -> host tier,
``offload_nvme`` -> NVMe tier, ``recompute`` -> do not store.  Without a hint
the configured default tier is used.
"""
from __future__ import annotations

import hashlib
import logging
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from kvtier.engine_adapter.firewall import RateLimitedLog
from kvtier.engine_adapter.hints import ToolHint
from kvtier.store import Namespace, StoreFull
from kvtier.store.keys import KEY_BYTES
from kvtier.tiering.model.decision import Action, PauseContext, Policy
from kvtier.util.tiers import Tier

log = logging.getLogger("kvtier.engine")

_PERSON = b"kvtier.engine"
TIERS = (Tier.HOST, Tier.NVME)   # the tiers a plugin writes


def store_key(ns: Namespace, engine_key: bytes | str) -> bytes:
    """The store key of one engine page/block under namespace ``ns``.

    ``engine_key``: SGLang's hex page hash (str) or vLLM's offload key
    (bytes).  Raises ``ValueError`` for an empty or non-str/bytes key.
    """
    if isinstance(engine_key, str):
        raw = engine_key.encode("utf-8")
    elif isinstance(engine_key, (bytes, bytearray, memoryview)):
        raw = bytes(engine_key)
    else:
        raise ValueError(f"engine keys are str or bytes, got {type(engine_key).__name__}")
    if not raw:
        raise ValueError("empty engine key")
    # blake2b(ns.digest + raw): the namespace's part hashed once, copied per key (vLLM calls this in
    # every per-chunk lookup on its scheduler thread: 2.7 -> 1.3 us here)
    d = ns.digest
    h = _PREFIXES.get(d)
    if h is None:
        if len(_PREFIXES) >= 64:           # namespaces are a handful per process; never grows unbounded
            _PREFIXES.clear()
        h = _PREFIXES[d] = hashlib.blake2b(d, digest_size=KEY_BYTES, person=_PERSON)
    h = h.copy()
    h.update(raw)
    return h.digest()


_PREFIXES: dict[bytes, Any] = {}   # ns.digest -> a blake2b fed with it and never updated after (copies only)


@dataclass(frozen=True)
class Stored:
    """What one placed write did: the tier the blocks went to, and how many were new."""
    tier: Tier
    blocks: int


@dataclass(frozen=True)
class Placement:
    """Where one batch of blocks goes: decided once, and carried out by :meth:`write`.

    tier:     ``Tier.HOST`` or ``Tier.NVME`` (a tier the store has: see
              :meth:`StoreTiers.resolve`); None means "do not store" (the policy chose recompute).
    action:   the policy's action, or None when no hint was given (default tier) or
              the lifecycle's plan placed it.
    source:   "default", "policy", "lifecycle" (who decided), or "fallback" after an error.
    overflow: where the batch goes instead when ``tier`` cannot take it whole
              (host frames full: NVMe, where the store has it); None: nowhere else.
    """

    tier: Tier | None
    action: Action | None = None
    source: str = "default"
    overflow: Tier | None = None

    def write(self, put: Callable[[Tier], int]) -> Stored:
        """Store the batch by ``put(tier) -> blocks newly stored``: at :attr:`tier`,
        or, when that raises ``StoreFull`` (a put is all or nothing), at
        :attr:`overflow`.  Raises ValueError for a placement that stores nothing
        (``tier`` None), and what ``put`` raises (StoreFull without an overflow)."""
        if self.tier is None:
            raise ValueError("a recompute placement stores nothing")
        try:
            return Stored(self.tier, put(self.tier))
        except StoreFull:
            if self.overflow is None:
                raise
            return Stored(self.overflow, put(self.overflow))


@dataclass(frozen=True)
class StoreTiers:
    """The local tiers a plugin's store has (host frames, NVMe slots): what a
    placement may name (with both, every placement stays as decided)."""

    host: bool
    nvme: bool

    @classmethod
    def of(cls, host_frames: int, nvme_slots: int) -> "StoreTiers":
        return cls(host=host_frames > 0, nvme=nvme_slots > 0)

    def tier(self, tier: Tier | None) -> Tier | None:
        """``tier`` where the store has it, else the other local tier (None stays None)."""
        if tier is Tier.HOST and not self.host:
            return Tier.NVME
        if tier is Tier.NVME and not self.nvme:
            return Tier.HOST
        return tier

    def resolve(self, p: Placement) -> Placement:
        """``p`` on the tiers the store has, with its overflow (host -> NVMe)."""
        tier = self.tier(p.tier)
        overflow = Tier.NVME if tier is Tier.HOST and self.nvme else None
        return Placement(tier, p.action, p.source, overflow)


class PlacementAdvisor:
    """Maps a :class:`ToolHint` to a :class:`Placement` (one-shot: blocks of a
    hinted request that names no trajectory; trajectories go through the
    lifecycle controller, :mod:`kvtier.tiering.lifecycle`).

    ``policy``: an in-process policy (``tiering.make_policy(...)``, or the
    service-backed :class:`kvtier.tiering.lifecycle.service_policy.ServicePolicy`,
    which never blocks on HTTP); without one every batch goes to
    ``default_tier``.  ``host_available`` False maps host placements to NVMe
    (a store without a host tier).

    ``place`` never raises: a policy failure is logged (at most once a minute
    per kind) and answers ``default_tier`` with source "fallback".
    Thread-safe (the counters are guarded by a lock; the policy's ``decide``
    must be read-only, as the Policy contract says).
    """

    def __init__(self, default_tier: str = "nvme", *, policy: Policy | None = None,
                 host_available: bool = True) -> None:
        if default_tier not in TIERS:
            raise ValueError(f"default_tier must be one of {tuple(t.value for t in TIERS)}, got {default_tier!r}")
        self.default_tier = Tier(default_tier)
        self.policy = policy
        self.host_available = host_available
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self._log = RateLimitedLog(log)

    def _tier_of(self, action: Action) -> Tier | None:
        """The action's tier as the store holds it (retain: host frames), NVMe without a host tier."""
        tier = Action(action).tier
        if tier is None:
            return None
        return tier.stored if self.host_available else Tier.NVME

    def place(self, hint: ToolHint | None, *, kv_bytes: int, context_tokens: int) -> Placement:
        """Decide where a batch of ``kv_bytes`` (a request with ``context_tokens``
        tokens of context) goes.  Never raises."""
        if hint is None or self.policy is None:
            p = Placement(self.default_tier)
        else:
            ctx_tokens = hint.context_tokens if hint.context_tokens is not None else context_tokens
            try:
                d = self.policy.decide(PauseContext(tool=hint.tool, kv_bytes=max(0, int(kv_bytes)),
                                                    context_tokens=max(0, int(ctx_tokens)),
                                                    trajectory_id=hint.trajectory_id))
                p = Placement(self._tier_of(d.action), d.action, "policy")
            except Exception as exc:  # policy trouble must never reach the engine
                self._log.warn(f"place:{type(exc).__name__}",
                               "placement for tool %r failed (%s: %s); using the default tier %s",
                               hint.tool, type(exc).__name__, exc, self.default_tier)
                p = Placement(self.default_tier, None, "fallback")
        with self._lock:
            self._counts[str(p.action) if p.action is not None else f"default:{p.tier}"] += 1
        return p

    def counts(self) -> dict[str, int]:
        """Decisions taken so far, by action ("offload_nvme", ...) or "default:<tier>"."""
        with self._lock:
            return dict(self._counts)


def remote_gauge_values(store) -> dict[str, float]:
    """The remote tier's gauges of a plugin's store, by name (``remote_up``,
    ``remote_breaker_open``, ``remote_hits``, ...; see
    ``kvtier.store.remote.gauges``), or {} when it has no remote tier or is
    closed.  The plugins publish them as gauges (vLLM: ``vllm:kvtier_<name>``
    with ``OffloadingGaugeMetadata`` + ``set_gauge``).  Never raises."""
    from kvtier.store.remote.gauges import remote_gauges
    try:
        if store.remote is None:      # no remote tier: no store.stats() per vLLM step
            return {}
        return remote_gauges(store.stats().remote)
    except Exception:       # a closed store, a store without stats(): no gauges, never an engine error
        return {}


class KeyMemo:
    """Store keys of engine keys, remembered (bounded): SGLang's page hashes
    (str) and vLLM's offload keys (bytes).

    One SGLang resume asks ``batch_exists`` and then ``batch_get_v1`` for the
    same pages (and again per batch of 128); vLLM's manager looks every chunk
    up, then loads it.  So each key (a blake2b over namespace + engine key)
    was computed twice or more per resume.  Holds at most ``cap`` keys and
    starts over when full (a miss only costs the hash again).  Other key types
    (bytearray, memoryview) are hashed every time.  Thread-safe by the GIL's
    atomic dict operations: SGLang's prefetch and backup threads, vLLM's
    scheduler and I/O threads may share it."""

    def __init__(self, make: Any, cap: int = 1 << 16) -> None:
        self._make, self._cap = make, cap
        self._d: dict = {}

    def one(self, k: Any) -> bytes:
        """The store key of ``k``.  Raises what ``make`` raises (ValueError for a bad key)."""
        d = self._d
        sk = d.get(k) if type(k) is str or type(k) is bytes else None
        if sk is None:
            sk = self._make(k)
            if type(k) is str or type(k) is bytes:
                if len(d) >= self._cap:
                    d = self._d = {}
                d[k] = sk
        return sk

    def __call__(self, keys: Iterable[Any]) -> list[bytes]:
        """Store keys of ``keys``.  Raises what ``make`` raises (ValueError for a bad key)."""
        one = self.one
        return [one(k) for k in keys]
