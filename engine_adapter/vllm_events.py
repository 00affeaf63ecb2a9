"""kvtier's tiers in vLLM's own KV event stream (``KvtierTier.take_events``).

vLLM's tiering manager yields each secondary tier's ``take_events()`` beside
its CPU tier's; with ``--kv-events-config`` the offloading connector turns
them into ``BlockStored`` / ``BlockRemoved`` on the engine's ZMQ stream, with
vLLM's block hashes, ``medium``, ``locality`` and ``ownership``.  This module
turns the store's own events (:mod:`kvtier.store.events`: store keys) back
into vLLM's offload keys::

    I/O thread    store job ──> note(offload keys)     (store key -> offload key)
    store thread  EventHub ──> _on_batch ──┐            (under the store's lock)
    scheduler     lookup miss, failed load ┴─> queue ──> take() ──> OffloadingEvent
                                                (bounded)    (vLLM's scheduler thread)

    kvtier tier   medium    locality   ownership
    host          CPU       LOCAL      "<tier type>:host"
    nvme          STORAGE   LOCAL      "<tier type>:nvme"
    remote        STORAGE   REMOTE     "<tier type>:remote"

Promises:

- Keys are vLLM's offload keys, one per chunk (``tokens_per_chunk`` tokens):
  exactly what the tier's ``lookup`` answers and a load job moves, so nothing
  is advertised at a finer grain than it can be loaded.
- ``stored`` once the block is retrievable from that tier (the store sends
  its event after the bytes are readable there); ``removed`` when the store
  says it left that tier, or when a lookup or a load finds it missing: the
  shared tier's values can vanish behind kvtier's back (the server's own
  eviction, a restart, another client's delete), and the first miss withdraws
  every tier the key was advertised on.
- Each tier has its own ``ownership``: vLLM's event tracker keeps a chunk's
  payload per (medium, ownership) residency, so NVMe and the shared tier
  (both ``STORAGE``) are withdrawn one by one.  Events set
  ``removal_expected``: every advertised residency is withdrawn by an event.
- Only what this tier stored is advertised (a store key cannot be turned
  back into an offload key): blocks left by an earlier run, or published to
  the shared tier by another engine, are not.

Bounds: at most ``cap`` keys advertised and ``queue_cap`` store events
waiting for ``take``; past either, a store is not advertised (counted in
``dropped``), never a removal lost (a removal only follows an advertised
store, so the queue stays under ``queue_cap + 3 * cap``).  The store's thread
never waits on vLLM: the listener only appends under this module's lock, a
leaf lock (nothing is called while holding it).

:class:`NoTierEvents` is the tier's events when vLLM publishes none (KV events
off): every call does nothing.
"""
from __future__ import annotations

import threading
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

from kvtier.store.events import MEDIUM_OF_TIER, AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch
from kvtier.util.tiers import Tier

from vllm.v1.kv_offload.base import Locality, Medium, OffloadingEvent

__all__ = ["EventCounts", "NoTierEvents", "OffloadingEvent", "TierEvents"]

TIER_OF_MEDIUM: dict[str, Tier] = {m: t for t, m in MEDIUM_OF_TIER.items()}
_WHERE: dict[Tier, tuple[Medium, Locality]] = {
    Tier.HOST: (Medium.CPU, Locality.LOCAL),
    Tier.NVME: (Medium.STORAGE, Locality.LOCAL),
    Tier.REMOTE: (Medium.STORAGE, Locality.REMOTE),
}
_BIT: dict[Tier, int] = {Tier.HOST: 1, Tier.NVME: 2, Tier.REMOTE: 4}


@dataclass(frozen=True)
class EventCounts:
    """What the tier's events did so far.  stored/removed: keys sent to vLLM as
    stored / removed; dropped: stores not advertised (a bound was reached);
    unmapped: stores of blocks this tier did not store (no offload key known);
    advertised: keys advertised now (on at least one tier)."""

    stored: int = 0
    removed: int = 0
    dropped: int = 0
    unmapped: int = 0
    advertised: int = 0


class NoTierEvents:
    """KV events are off in vLLM: nothing is recorded, ``take`` yields nothing."""

    def note(self, okeys: Sequence[bytes], skeys: Sequence[bytes]) -> None:
        return None

    def missing(self, okeys: Iterable[bytes]) -> None:
        return None

    def take(self) -> list[OffloadingEvent]:
        return []

    def counts(self) -> EventCounts:
        return EventCounts()

    def close(self) -> None:
        return None


class TierEvents:
    """vLLM's offloading events for one store's tiers (see the module doc).

    ``hub``: the store's :class:`~kvtier.store.events.EventHub` (subscribed
    here, until :meth:`close`); ``store_key``: offload key -> store key (the
    tier's memo); ``owner``: the tier's type, the prefix of each event's
    ``ownership``.  Thread-safe: ``note`` runs on I/O threads, the listener on
    whichever thread changed the store, ``missing`` and ``take`` on vLLM's
    scheduler or I/O threads.  No method raises for a key it does not know."""

    def __init__(self, hub: Any, store_key: Callable[[bytes], bytes], owner: str, *,
                 cap: int = 1 << 17, queue_cap: int = 1 << 16) -> None:
        if cap < 1 or queue_cap < 1:
            raise ValueError(f"cap and queue_cap must be >= 1 (got {cap}, {queue_cap})")
        self._store_key, self._cap, self._queue_cap = store_key, cap, queue_cap
        self._owner = {t: f"{owner}:{t.value}" for t in _BIT}
        self._lock = threading.Lock()
        self._noted: OrderedDict[bytes, bytes] = OrderedDict()   # store key -> offload key (FIFO, <= cap)
        self._live: dict[bytes, tuple[bytes, int]] = {}          # advertised: store key -> (offload key, tier bits)
        self._queue: deque[tuple[Tier, bool, bytes]] = deque()   # (tier, removed, offload key), oldest first
        self._stores_queued = 0                                  # stored entries in the queue
        self._n = {"stored": 0, "removed": 0, "dropped": 0, "unmapped": 0}
        self._unsubscribe = hub.subscribe(self._on_batch)

    @classmethod
    def of(cls, offloading_spec: Any, store: Any, store_key: Callable[[bytes], bytes],
           owner: str) -> "TierEvents | NoTierEvents":
        """The tier's events: :class:`TierEvents` when vLLM publishes KV events
        (``kv_events_config.enable_kv_cache_events`` on its offloading spec) and
        the store has an event hub, else :class:`NoTierEvents`."""
        cfg = getattr(offloading_spec, "kv_events_config", None)
        hub = getattr(store, "events", None)
        if not getattr(cfg, "enable_kv_cache_events", False) or hub is None:
            return NoTierEvents()
        return cls(hub, store_key, owner)

    # ------------------------------------------------------------ recording
    def note(self, okeys: Sequence[bytes], skeys: Sequence[bytes]) -> None:
        """A job is about to store or load these offload keys, whose store keys
        are ``skeys`` (an I/O thread): the store's events about them can now be
        named back (a load may keep a shared-tier hit in host frames)."""
        with self._lock:
            noted = self._noted
            for sk, ok in zip(skeys, okeys):
                if sk in self._live:
                    continue
                noted[sk] = bytes(ok)
                noted.move_to_end(sk)
            while len(noted) > self._cap:
                noted.popitem(last=False)

    def missing(self, okeys: Iterable[bytes]) -> None:
        """A lookup or a load found these offload keys nowhere: withdraw every
        tier they were advertised on (the scheduler or an I/O thread)."""
        live, sks = self._live, []
        for k in okeys:
            try:
                sk = self._store_key(k)
            except ValueError:             # not an offload key: never advertised
                continue
            if sk in live:                 # a miss of a key never advertised costs no lock
                sks.append(sk)
        if not sks:
            return
        with self._lock:
            for sk in sks:
                self._withdraw(sk, tuple(_BIT))

    def _on_batch(self, batch: KVEventBatch) -> None:
        """The store's listener (its thread, under its lock): update and queue, nothing else."""
        with self._lock:
            for ev in batch.events:
                if isinstance(ev, BlockStored):
                    tier = TIER_OF_MEDIUM.get(ev.medium or "")
                    if tier is not None:
                        for sk in ev.block_hashes:
                            self._advertise(sk, tier)
                elif isinstance(ev, BlockRemoved):
                    tier = TIER_OF_MEDIUM.get(ev.medium or "")
                    if tier is not None:
                        for sk in ev.block_hashes:
                            self._withdraw(sk, (tier,))
                elif isinstance(ev, AllBlocksCleared):
                    for sk in list(self._live):
                        self._withdraw(sk, tuple(_BIT))

    def _advertise(self, sk: bytes, tier: Tier) -> None:      # lock held
        cur = self._live.get(sk)
        bit = _BIT[tier]
        if cur is not None and cur[1] & bit:
            return                                            # already advertised there
        ok = cur[0] if cur is not None else self._noted.pop(sk, None)
        if ok is None:
            self._n["unmapped"] += 1
            return
        if (cur is None and len(self._live) >= self._cap) or self._stores_queued >= self._queue_cap:
            self._n["dropped"] += 1
            if cur is None:
                self._noted[sk] = ok                          # a later tier may still advertise it
            return
        self._live[sk] = (ok, (cur[1] if cur is not None else 0) | bit)
        self._queue.append((tier, False, ok))
        self._stores_queued += 1

    def _withdraw(self, sk: bytes, tiers: tuple[Tier, ...]) -> None:   # lock held
        cur = self._live.get(sk)
        if cur is None:
            return
        ok, bits = cur
        for t in tiers:
            if bits & _BIT[t]:
                bits &= ~_BIT[t]
                self._queue.append((t, True, ok))
        if bits:
            self._live[sk] = (ok, bits)
        else:
            del self._live[sk]

    # ------------------------------------------------------------ vLLM's side
    def take(self) -> list[OffloadingEvent]:
        """The events since the last call, oldest first, one ``OffloadingEvent``
        per run of keys with the same tier and kind (vLLM's scheduler thread)."""
        with self._lock:
            if not self._queue:
                return []
            items, self._queue = list(self._queue), deque()
            self._stores_queued = 0
            self._n["stored"] += sum(not removed for _, removed, _ in items)
            self._n["removed"] += sum(removed for _, removed, _ in items)
        out: list[OffloadingEvent] = []
        run: list[bytes] = []
        for i, (tier, removed, ok) in enumerate(items):
            run.append(ok)
            nxt = items[i + 1] if i + 1 < len(items) else None
            if nxt is None or nxt[0] is not tier or nxt[1] is not removed:
                medium, locality = _WHERE[tier]
                out.append(OffloadingEvent(keys=run, medium=medium, removed=removed, locality=locality,
                                           ownership=self._owner[tier], removal_expected=True))
                run = []
        return out

    def counts(self) -> EventCounts:
        with self._lock:
            return EventCounts(advertised=len(self._live), **self._n)

    def close(self) -> None:
        """Stop listening to the store (idempotent); what is queued can still be taken."""
        self._unsubscribe()
