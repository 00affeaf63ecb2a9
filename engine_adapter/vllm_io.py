"""The vLLM tier's block I/O path: primary-tier rows <-> the store.

Kept apart from the tier's bookkeeping (``vllm.py``) so the data path can be
read, benchmarked (``bench/bench_vllm.py``) and changed on its own.  Both
functions run on the tier's I/O threads, never on vLLM's scheduler thread.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np

if TYPE_CHECKING:
    from kvtier.store.protocol import BlockStore


@dataclass(frozen=True)
class Moved:
    """What one job moved: blocks newly stored / loaded, and which keys loaded."""
    blocks: int
    ok: tuple[bool, ...] = ()


def store_rows(store: "BlockStore", skeys: Sequence[bytes], rows: np.ndarray, chunk_ids: Sequence[int], *,
               namespace, tier: str) -> Moved:
    """Write primary rows ``chunk_ids`` under ``skeys`` to ``tier``.  O_DIRECT
    straight from vLLM's CPU-tier rows (page-aligned shared memory): no staging
    copy; blocks already stored are skipped by the store.  Raises StoreError."""
    n = store.put_many(list(skeys), [rows[c] for c in chunk_ids], namespace=namespace, tier=tier)
    return Moved(n)


def load_rows(store: "BlockStore", skeys: Sequence[bytes], rows: np.ndarray, chunk_ids: Sequence[int]) -> Moved:
    """Read ``skeys`` into primary rows ``chunk_ids`` (checksums verified).  A
    block that misses or fails its checksum reads as False and its row is
    zeroed -- never served.  Raises StoreError."""
    res = store.get_many(list(skeys), [rows[c] for c in chunk_ids])
    return Moved(sum(res), tuple(bool(r) for r in res))
