"""The vLLM tier's block I/O path: primary-tier rows <-> the store.

Kept apart from the tier's bookkeeping (``vllm.py``) so the data path can be
read, benchmarked (``bench/bench_vllm.py``) and changed on its own.  Both
functions run on the tier's I/O threads, never on vLLM's scheduler thread.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np

from kvtier.util.tiers import Tier

if TYPE_CHECKING:
    from kvtier.store.protocol import BlockStore


@dataclass(frozen=True)
class Moved:
    """What one store job moved: blocks newly stored."""
    blocks: int


@dataclass(frozen=True)
class Loaded:
    """What one load job read: per key, the tier that served it (None: a miss or a failed checksum)."""
    served: tuple[Tier | None, ...]

    @property
    def blocks(self) -> int:
        return sum(t is not None for t in self.served)


def store_rows(store: "BlockStore", skeys: Sequence[bytes], rows: np.ndarray, chunk_ids: Sequence[int], *,
               namespace, tier: str) -> Moved:
    """Write primary rows ``chunk_ids`` under ``skeys`` to ``tier``.  O_DIRECT
    straight from vLLM's CPU-tier rows (page-aligned shared memory): no staging
    copy; blocks already stored are skipped by the store.  Raises StoreError."""
    n = store.put_many(list(skeys), [rows[c] for c in chunk_ids], namespace=namespace, tier=tier)
    return Moved(n)


def load_rows(store: "BlockStore", skeys: Sequence[bytes], rows: np.ndarray, chunk_ids: Sequence[int]) -> Loaded:
    """Read ``skeys`` into primary rows ``chunk_ids`` (checksums verified), with
    the tier each key was served from (the store's ``get_many_served``: the tier
    of this read, not a query made before it).  A block that misses or fails its
    checksum reads as None and its row is zeroed -- never served.  Raises StoreError."""
    served = store.get_many_served(list(skeys), [rows[c] for c in chunk_ids])
    return Loaded(tuple(served))
