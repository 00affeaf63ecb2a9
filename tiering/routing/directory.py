"""Which engine holds which block hash, on which medium: the router's view of the engines' caches.

Fed by the engines' own KV event streams (:mod:`.events`), keyed by vLLM's block hashes in
their 64-bit form (:func:`.hashing.external`)::

    hash -> {(publisher, shared): {medium: count}}

``count``: vLLM's offloading events announce a hash once per chunk that holds it and expect
consumers to count (``offloading/events.py``), so a hash stays held on a medium until as many
``BlockRemoved`` as ``BlockStored`` have come for it.  A block published with locality
``REMOTE`` or medium ``REMOTE`` sits in a shared tier: it counts for every engine's match.
``AllBlocksCleared`` (and a publisher restart, :meth:`clear`) forget what that engine published
locally; its shared blocks stay (the shared tier outlives an engine).

A request's match on engine E is the longest chain of its block hashes, root first, that E can
get (its own media or a shared one); each block of the chain counts ``block_size`` tokens times
the weight of the best medium it is on (:class:`.weights.TierWeights`)::

    saved_tokens(E) = sum over the chain of block_size * max_medium weight(medium)

Bounded: at most ``max_hashes`` hashes; past that the least recently stored are forgotten (a
forgotten block is a miss, never a wrong route).  Thread-safe: one lock guards every field;
the subscriber's thread applies, the proxy's event loop matches.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Iterable, Sequence

from .events import AllBlocksCleared, BlockRemoved, BlockStored, Event
from .hashing import external
from .weights import TierWeights

DEFAULT_MAX_HASHES = 2_000_000

Holder = tuple[str, bool]          # (publishing engine, shared)


@dataclass(frozen=True)
class Match:
    """One engine's match for a request: ``blocks`` of the chain it can get, ``tokens`` they
    cover, ``saved_tokens`` the tier-weighted tokens a hit there saves."""

    blocks: int
    tokens: int
    saved_tokens: float


def _shared(medium: str | None, locality: str | None) -> bool:
    return (locality or "").upper() == "REMOTE" or (medium or "").upper() == "REMOTE"


class BlockDirectory:
    """See the module docstring.  Raises ValueError for ``max_hashes`` < 1."""

    def __init__(self, weights: TierWeights, max_hashes: int = DEFAULT_MAX_HASHES) -> None:
        if max_hashes < 1:
            raise ValueError(f"max_hashes must be >= 1, got {max_hashes}")
        self.weights = weights
        self.max_hashes = max_hashes
        self._lock = threading.Lock()
        self._held: OrderedDict[int, dict[Holder, dict[str, int]]] = OrderedDict()
        self._by_holder: dict[Holder, set[int]] = {}
        self._block_size: dict[str, int] = {}
        self.events_applied = 0
        self.forgotten = 0

    # ------------------------------------------------------------------ feeding
    def apply(self, engine: str, events: Iterable[Event]) -> int:
        """Apply one engine's events in order.  Returns how many applied.  Raises ValueError for a
        bad hash (the events before it stay applied)."""
        n = 0
        with self._lock:
            for ev in events:
                if isinstance(ev, BlockStored):
                    self._stored(engine, ev)
                elif isinstance(ev, BlockRemoved):
                    self._removed(engine, ev.block_hashes, (ev.medium or "GPU").upper(),
                                  _shared(ev.medium, ev.locality))
                elif isinstance(ev, AllBlocksCleared):
                    self._clear(engine)
                else:
                    continue
                n += 1
            self.events_applied += n
        return n

    def clear(self, engine: str) -> None:
        """Forget what ``engine`` published locally (its shared blocks stay)."""
        with self._lock:
            self._clear(engine)

    def _stored(self, engine: str, ev: BlockStored) -> None:
        medium = (ev.medium or "GPU").upper()
        holder = (engine, _shared(ev.medium, ev.locality))
        if ev.block_size > 0 and medium == "GPU" and not holder[1]:
            self._block_size[engine] = ev.block_size
        mine = self._by_holder.setdefault(holder, set())
        for h in map(external, ev.block_hashes):
            d = self._held.get(h)
            if d is None:
                d = self._held[h] = {}
            else:
                self._held.move_to_end(h)
            m = d.setdefault(holder, {})
            m[medium] = m.get(medium, 0) + 1
            mine.add(h)
        while len(self._held) > self.max_hashes:
            h, d = self._held.popitem(last=False)
            for who in d:
                self._by_holder.get(who, set()).discard(h)
            self.forgotten += 1

    def _removed(self, engine: str, hashes: Iterable, medium: str, shared: bool) -> None:
        holder = (engine, shared)
        for h in map(external, hashes):
            d = self._held.get(h)
            m = d.get(holder) if d is not None else None
            if m is None or medium not in m:
                continue
            m[medium] -= 1
            if m[medium] <= 0:
                del m[medium]
            if not m:
                del d[holder]
                self._by_holder.get(holder, set()).discard(h)
            if not d:
                del self._held[h]

    def _clear(self, engine: str) -> None:
        holder = (engine, False)
        for h in self._by_holder.pop(holder, set()):
            d = self._held.get(h)
            if d is not None:
                d.pop(holder, None)
                if not d:
                    del self._held[h]

    # ------------------------------------------------------------------ queries
    def match(self, engine: str, hashes: Sequence[int], block_size: int) -> Match:
        """``engine``'s match for a request whose block hashes (64-bit, root first) are
        ``hashes``, ``block_size`` tokens each.  Pure (no LRU touch)."""
        w = self.weights
        blocks, saved = 0, 0.0
        with self._lock:
            for h in hashes:
                d = self._held.get(h)
                if d is None:
                    break
                best = -1.0
                for (pub, shared), media in d.items():
                    if shared or pub == engine:
                        for medium in media:
                            best = max(best, w.weight(medium, "REMOTE" if shared else None))
                if best < 0:
                    break
                blocks += 1
                saved += best * block_size
        return Match(blocks, blocks * block_size, saved)

    def block_size(self, engine: str) -> int | None:
        """The block size ``engine``'s GPU events carry (None before the first)."""
        with self._lock:
            return self._block_size.get(engine)

    def __len__(self) -> int:
        with self._lock:
            return len(self._held)

    def held_by(self, engine: str) -> int:
        """Hashes ``engine`` published locally (any medium)."""
        with self._lock:
            return len(self._by_holder.get((engine, False), ()))

    def check_integrity(self) -> None:
        """Every hash's holders are indexed under them and vice versa, counts positive.
        Raises AssertionError naming the first inconsistency."""
        with self._lock:
            seen: dict[Holder, set[int]] = {}
            for h, d in self._held.items():
                assert d, f"hash {h:x} is held by nobody"
                for holder, media in d.items():
                    assert media and all(c > 0 for c in media.values()), f"hash {h:x} {holder}: {media}"
                    seen.setdefault(holder, set()).add(h)
            for holder, hs in self._by_holder.items():
                assert hs == seen.get(holder, set()), f"index of {holder} disagrees"
            for holder in seen:
                assert holder in self._by_holder, f"{holder} not indexed"
