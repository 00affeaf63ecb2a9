"""The cluster prefix directory: which worker holds which chunk hash, in which medium.

Fed by KV events in vLLM's schema, from the engines (medium ``"GPU"``) and
from kvtier's stores (``"CPU"``, ``"DISK"``, ``"REMOTE"``; kvtier.store.events)::

    worker A ──KVEventBatch──┐
    worker B ──KVEventBatch──┼──> PrefixDirectory ──> match(worker, hashes) ──> score.choose
    store    ──KVEventBatch──┘      hash -> {worker: {medium}}

A block advertised with medium ``"REMOTE"`` sits in the shared tier: every
worker can load it, so it counts for every worker's match.  Events are read by
their fields (objects with ``block_hashes``/``medium`` attributes, or dicts
with a ``"type"`` key, as a JSON relay sends them); a hash is bytes, an int (vLLM's
own hashes) or a hex string (read as bytes).

Bounded: at most ``max_hashes`` hashes; past that the least recently
advertised are forgotten (a forgotten block is a miss, never a wrong route).
Not thread-safe: one owner feeds and queries it (the service wraps it in a lock).
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from kvtier.tiering.prefix.score import Choice, Weights, choose

SHARED_MEDIUM = "REMOTE"
SHARED = "*shared*"             # the holder name of blocks in the shared tier
DEFAULT_MAX_HASHES = 1_000_000

Hash = bytes | int


def norm_hash(h) -> Hash:
    """A hash as the directory keys it.  Raises ValueError for another type or bad hex."""
    if isinstance(h, (bytes, bytearray, memoryview)):
        return bytes(h)
    if isinstance(h, bool):
        raise ValueError("a block hash cannot be a bool")
    if isinstance(h, int):
        return h
    if isinstance(h, str):
        try:
            return bytes.fromhex(h)
        except ValueError:
            raise ValueError(f"a string block hash must be hex, got {h[:40]!r}") from None
    raise ValueError(f"a block hash must be bytes, int or hex str, got {type(h).__name__}")


def _field(ev, name: str, default=None):
    return ev.get(name, default) if isinstance(ev, Mapping) else getattr(ev, name, default)


def _kind(ev) -> str:
    return str(ev.get("type", "")) if isinstance(ev, Mapping) else type(ev).__name__


@dataclass(frozen=True)
class Route:
    """The winner of :meth:`PrefixDirectory.route` and what it holds."""

    worker: str
    matched_chunks: int
    matched_tokens: int
    prompt_tokens: int
    prefill_tokens: int
    skipped_chunks: int
    hit: float
    scores: dict[str, float]
    matches: dict[str, int]


class PrefixDirectory:
    """See the module docstring."""

    def __init__(self, max_hashes: int = DEFAULT_MAX_HASHES) -> None:
        if max_hashes < 1:
            raise ValueError(f"max_hashes must be >= 1, got {max_hashes}")
        self.max_hashes = max_hashes
        self._held: OrderedDict[Hash, dict[str, set[str]]] = OrderedDict()
        self._by_worker: dict[str, set[Hash]] = {}
        self.events_applied = 0
        self.forgotten = 0

    # ------------------------------------------------------------ feeding
    def apply(self, worker: str, batch) -> int:
        """Apply one KVEventBatch (or a bare list of events) sent by ``worker``.  Returns the
        events applied; unknown event types are skipped.  Raises ValueError for a bad hash."""
        events = _field(batch, "events", None) if not isinstance(batch, (list, tuple)) else batch
        n = 0
        for ev in events or ():
            kind = _kind(ev)
            if kind == "BlockStored":
                self.stored(worker, _field(ev, "block_hashes", ()), _field(ev, "medium") or "GPU")
            elif kind == "BlockRemoved":
                self.removed(worker, _field(ev, "block_hashes", ()), _field(ev, "medium") or "GPU")
            elif kind == "AllBlocksCleared":
                self.cleared(worker)
            else:
                continue
            n += 1
        self.events_applied += n
        return n

    def stored(self, worker: str, hashes: Iterable, medium: str) -> None:
        holder = SHARED if medium == SHARED_MEDIUM else worker
        for h in map(norm_hash, hashes):
            d = self._held.get(h)
            if d is None:
                d = self._held[h] = {}
            else:
                self._held.move_to_end(h)
            d.setdefault(holder, set()).add(medium)
            self._by_worker.setdefault(holder, set()).add(h)
        while len(self._held) > self.max_hashes:
            h, d = self._held.popitem(last=False)
            for w in d:
                self._by_worker.get(w, set()).discard(h)
            self.forgotten += 1

    def removed(self, worker: str, hashes: Iterable, medium: str) -> None:
        holder = SHARED if medium == SHARED_MEDIUM else worker
        for h in map(norm_hash, hashes):
            d = self._held.get(h)
            if d is None or holder not in d:
                continue
            d[holder].discard(medium)
            if not d[holder]:
                del d[holder]
                self._by_worker.get(holder, set()).discard(h)
            if not d:
                del self._held[h]

    def cleared(self, worker: str) -> None:
        """Every block ``worker`` advertised is gone (AllBlocksCleared)."""
        for h in self._by_worker.pop(worker, set()):
            d = self._held.get(h)
            if d is not None:
                d.pop(worker, None)
                if not d:
                    del self._held[h]

    # ------------------------------------------------------------ queries
    def __len__(self) -> int:
        return len(self._held)

    def workers(self) -> list[str]:
        return sorted(w for w, hs in self._by_worker.items() if hs and w != SHARED)

    def mediums(self, worker: str, h) -> frozenset[str]:
        """Where ``worker`` can get hash ``h`` from (its own mediums, plus the shared tier)."""
        d = self._held.get(norm_hash(h), {})
        return frozenset(d.get(worker, set()) | d.get(SHARED, set()))

    def match(self, worker: str, hashes: Sequence) -> int:
        """Chunks of ``hashes`` (a chain, root first) that ``worker`` can get, counted from the
        left up to the first it cannot (its own mediums or the shared tier)."""
        n = 0
        for h in hashes:
            d = self._held.get(norm_hash(h))
            if d is None or (worker not in d and SHARED not in d):
                break
            n += 1
        return n

    def route(self, hashes: Sequence, loads: Mapping[str, float], *, chunk_tokens: int,
              prompt_tokens: int | None = None, weights: Weights = Weights(),
              load_max: float | None = None) -> Route:
        """Score the workers of ``loads`` (name -> load) for a prompt whose chunk chain is
        ``hashes``; ``prompt_tokens`` defaults to ``len(hashes) * chunk_tokens``.
        Raises ValueError for no workers or a prompt shorter than its chunks."""
        if not loads:
            raise ValueError("no candidate workers")
        s = len(hashes) * chunk_tokens if prompt_tokens is None else int(prompt_tokens)
        if s < len(hashes) * chunk_tokens:
            raise ValueError(f"prompt_tokens {s} is shorter than its {len(hashes)} chunks of {chunk_tokens}")
        names = list(loads)
        chunks = [self.match(w, hashes) for w in names]
        c: Choice = choose([k * chunk_tokens for k in chunks], [float(loads[w]) for w in names], s,
                           weights, load_max)
        win = names[c.index]
        return Route(win, chunks[c.index], c.match_tokens, s, c.prefill_tokens, chunks[c.index], c.hit,
                     dict(zip(names, c.scores)), {w: k * chunk_tokens for w, k in zip(names, chunks)})
