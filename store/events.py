"""KV events: what a store tells subscribers it holds, in vLLM's KV-event shape.

The event types mirror vLLM's ``vllm/distributed/kv_events.py`` field for
field (``BlockStored``, ``BlockRemoved``, ``AllBlocksCleared``, batched in a
``KVEventBatch``), so one consumer (a prefix directory, a router) reads the
engine's GPU events and kvtier's offloaded-tier events alike::

    put / complete_store ──> BlockStored(medium="CPU"|"DISK")
    demote (host -> NVMe) ──> BlockStored(medium="DISK")
    host frame released   ──> BlockRemoved(medium="CPU")      (the NVMe copy stays)
    NVMe slot evicted     ──> BlockRemoved(medium="DISK")     (the host copy stays)
    drop / evict / corrupt ─> BlockRemoved for every tier the block was in

``medium`` is vLLM's storage medium string; kvtier's tiers map as
:data:`MEDIUM_OF_TIER` (host -> ``"CPU"``, nvme -> ``"DISK"``, remote ->
``"REMOTE"``; the engine's own blocks are ``"GPU"``).  A store knows bytes,
not tokens: its events carry ``token_ids=()``, ``block_size=0`` and
``parent_block_hash=None``; ``block_hashes`` are the store's block keys
(bytes), which kvtier derives as chained hashes (``store/keys.py``).

Promise: a ``BlockStored`` is sent only once the block is visible to
``get``/``lookup`` in that tier (after its bytes are durable where the index
says), never for a write that failed; removal is sent when the block stops
being served from that tier.  Listeners run on the store's thread, under its
lock: they must be quick and must not call the store (append to a queue, as
:class:`EventLog` does).  A listener that raises is logged and skipped; it
never fails a store operation.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from kvtier.util.tiers import Tier

log = logging.getLogger(__name__)

MEDIUM_OF_TIER: dict[Tier, str] = {Tier.HOST: "CPU", Tier.NVME: "DISK", Tier.REMOTE: "REMOTE"}
MEDIUMS: tuple[str, ...] = ("GPU", "CPU", "DISK", "REMOTE")


@dataclass(frozen=True)
class BlockStored:
    """Blocks now retrievable from ``medium`` (vLLM's field names)."""

    block_hashes: tuple[bytes, ...]
    parent_block_hash: bytes | None = None
    token_ids: tuple[int, ...] = ()
    block_size: int = 0
    lora_id: int | None = None
    medium: str | None = None


@dataclass(frozen=True)
class BlockRemoved:
    """Blocks no longer retrievable from ``medium``."""

    block_hashes: tuple[bytes, ...]
    medium: str | None = None


@dataclass(frozen=True)
class AllBlocksCleared:
    """Every block of the sender is gone (every medium)."""


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True)
class KVEventBatch:
    """Events of one store operation, in order; ``ts`` is wall-clock seconds."""

    ts: float
    events: tuple[KVEvent, ...]
    data_parallel_rank: int | None = None


Listener = Callable[[KVEventBatch], None]


class EventHub:
    """The store's listener list.  With no listener every ``emit_*`` returns at once.
    Thread-safe (subscribe/unsubscribe under its own lock; emit reads a snapshot)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._listeners: tuple[Listener, ...] = ()

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener(batch)`` for every later event batch.  Returns a function that
        unsubscribes it (idempotent).  Events before the call are not replayed."""
        with self._lock:
            self._listeners = self._listeners + (listener,)

        def unsubscribe() -> None:
            with self._lock:
                self._listeners = tuple(x for x in self._listeners if x is not listener)
        return unsubscribe

    def emit_stored(self, keys: Sequence[bytes], tier: Tier) -> None:
        if self._listeners and keys:
            self._send(BlockStored(tuple(keys), medium=MEDIUM_OF_TIER[tier]))

    def emit_removed(self, keys: Sequence[bytes], tier: Tier) -> None:
        if self._listeners and keys:
            self._send(BlockRemoved(tuple(keys), medium=MEDIUM_OF_TIER[tier]))

    def _send(self, event: KVEvent) -> None:
        batch = KVEventBatch(time.time(), (event,))
        for fn in self._listeners:
            try:
                fn(batch)
            except Exception:          # a listener never fails the store
                log.exception("KV event listener %r raised; event skipped for it", fn)


@dataclass
class EventLog:
    """A listener that keeps batches until :meth:`take` (thread-safe)."""

    _batches: list[KVEventBatch] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, batch: KVEventBatch) -> None:
        with self._lock:
            self._batches.append(batch)

    def take(self) -> list[KVEventBatch]:
        """The batches received since the last call, oldest first."""
        with self._lock:
            out, self._batches = self._batches, []
        return out
