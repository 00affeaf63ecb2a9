"""The router's configuration: its engines (``URL[=ZMQ_ENDPOINT]``) and its knobs, checked once.

An engine is named by its URL's ``host:port``.  Its URL is the base of its OpenAI server
(``http://10.0.0.5:8000``; a trailing ``/`` or ``/v1`` is dropped); its events endpoint is where
its ``--kv-events-config`` publisher binds, as a subscriber connects to it
(``tcp://10.0.0.5:5557``, ``ipc:///run/vllm-events``).  Immutable (thread-safe).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from kvtier.tiering.prefix.score import Weights

from .hashing import HASH_ALGOS
from .policies import POLICIES
from .weights import TierWeights

_HOST = re.compile(r"^([A-Za-z0-9_.\-]+|[0-9a-fA-F:.]+)$")
_ZMQ = re.compile(r"^(tcp://[^\s/:]+(:\d{1,5})|tcp://\[[0-9a-fA-F:.]+\]:\d{1,5}|ipc://\S+|inproc://\S+)$")


@dataclass(frozen=True)
class EngineSpec:
    """One engine: ``name`` (host:port), ``url`` (no trailing slash), ``events`` (ZMQ or None)."""

    name: str
    url: str
    events: str | None = None


def check_events_endpoint(events: str) -> str:
    """``events`` if it is a ZMQ endpoint a subscriber can connect to.  Raises ValueError."""
    if events.startswith("tcp://*"):
        raise ValueError(f"{events!r}: that is where the engine binds; connect to its host (tcp://HOST:PORT)")
    if not _ZMQ.match(events):
        raise ValueError(f"{events!r}: an events endpoint is tcp://HOST:PORT or ipc://PATH "
                         "(the engine's --kv-events-config endpoint, as a subscriber connects to it)")
    if events.startswith("tcp://") and int(events.rsplit(":", 1)[1]) > 65535:
        raise ValueError(f"{events!r}: port out of range")
    return events


def parse_engine(text: str) -> EngineSpec:
    """``URL[=ZMQ_ENDPOINT]`` -> EngineSpec.  Raises ValueError saying what is wrong."""
    url, events = text, None
    i = text.find("=")
    if i >= 0 and "://" in text[i + 1:]:
        url, events = text[:i], text[i + 1:]
    try:
        u = urlsplit(url)
        port = u.port
    except ValueError as exc:
        raise ValueError(f"{url!r} is not a URL: {exc}") from None
    if u.scheme not in ("http", "https") or not u.hostname:
        raise ValueError(f"{url!r}: an engine URL is http(s)://HOST[:PORT], e.g. http://127.0.0.1:8000")
    if not _HOST.match(u.hostname):
        raise ValueError(f"{url!r}: {u.hostname!r} is not a host name or address")
    if u.query or u.fragment or u.username or u.password:
        raise ValueError(f"{url!r}: an engine URL takes no query, fragment or credentials")
    path = u.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[:-3]
    host = f"[{u.hostname}]" if ":" in u.hostname else u.hostname
    port = port if port is not None else (443 if u.scheme == "https" else 80)
    if events is not None:
        check_events_endpoint(events)
    return EngineSpec(f"{host}:{port}", f"{u.scheme}://{host}:{port}{path}", events)


@dataclass(frozen=True)
class RouterConfig:
    """Everything ``kvtier route`` decides once.  Raises ValueError for a bad value.

    ``block_size``: the tokens per block hashed when an engine's events have not told its own
    (vLLM's GPU events carry it).  ``load_max``: the score's L_max (None: the largest candidate
    load, at least 1).  ``poll_interval_s``/``poll_timeout_s``: the ``/metrics`` polls.
    ``max_body_bytes``: the largest request body taken.  ``policy``: the routing policy's name
    (:data:`.policies.POLICIES`; ``weights`` and ``load_max`` are prefix-load's)."""

    engines: tuple[EngineSpec, ...]
    weights: Weights = Weights()
    tiers: TierWeights = field(default_factory=TierWeights)
    load_max: float | None = None
    block_size: int = 16
    hash_algo: str = "sha256"
    hash_seed: str | None = None
    poll_interval_s: float = 1.0
    poll_timeout_s: float = 2.0
    max_body_bytes: int = 16 << 20
    max_hashes: int = 2_000_000
    policy: str = "prefix-load"

    def __post_init__(self) -> None:
        if not self.engines:
            raise ValueError("give at least one engine")
        names = [e.name for e in self.engines]
        dup = next((n for n in names if names.count(n) > 1), None)
        if dup is not None:
            raise ValueError(f"engine {dup} is given twice")
        if self.load_max is not None and not (math.isfinite(self.load_max) and self.load_max > 0):
            raise ValueError(f"load_max must be a positive number, got {self.load_max!r}")
        if not (1 <= self.block_size <= 1 << 16):
            raise ValueError(f"block_size must be in 1..65536, got {self.block_size}")
        if self.hash_algo not in HASH_ALGOS:
            raise ValueError(f"unknown hash algorithm {self.hash_algo!r}; known: {', '.join(HASH_ALGOS)}")
        for name in ("poll_interval_s", "poll_timeout_s"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"{name} must be a positive number, got {v!r}")
        if self.max_body_bytes < 1024:
            raise ValueError(f"max_body_bytes must be >= 1024, got {self.max_body_bytes}")
        if self.policy not in POLICIES:
            raise ValueError(f"unknown routing policy {self.policy!r}; known: {', '.join(POLICIES)}")
        if self.max_hashes < 1:
            raise ValueError(f"max_hashes must be >= 1, got {self.max_hashes}")
