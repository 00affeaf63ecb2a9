"""Read or recompute at a resume: what an engine's lookup answers for a chunk kept only on NVMe.

A resume either reads its paused context back from kvtier's tiers or prefills it again.  A chunk in
host frames (or the remote) is read; a chunk kept only on NVMe is read only where the policy prices
the read (NVMe -> host, overlapping host -> device) at or below its prefill
(:meth:`kvtier.tiering.model.decision.Policy.reads`).  Otherwise the lookup answers "not stored"
from that chunk on, and the engine prefills the rest: both engines stop a prefix hit at its first
miss (vLLM's ``_maximal_prefix_lookup``, SGLang's ``batch_exists``).

Decided once per engine and chunk size (the answer depends on the model, the node and the chunk's
tokens, none of which change while the engine runs).  Pure functions; the store is thread-safe.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

from kvtier.util.tiers import Tier

NVME_ONLY = frozenset({Tier.NVME})


def reads_nvme(policy: Any, tokens_per_chunk: int, contain: Callable[[str, BaseException], Any]) -> bool:
    """Whether a resume reads a chunk of ``tokens_per_chunk`` tokens kept only on NVMe: the
    policy's ``reads``.  True without a policy or a chunk size, and when the policy raises
    (``contain(where, exc)`` is told; the engine then reads as a plain tier does)."""
    if policy is None or tokens_per_chunk <= 0:
        return True
    try:
        return bool(policy.reads(Tier.NVME, tokens_per_chunk))
    except Exception as exc:
        contain("reads", exc)
        return True


def read_prefix(store: Any, keys: Sequence[bytes], stored: int) -> int:
    """Of the ``stored`` leading ``keys`` the store holds, how many a resume reads when a chunk
    kept only on NVMe is recomputed: up to the first such chunk.  Raises what ``store.where`` raises."""
    return next((i for i, k in enumerate(keys[:stored]) if store.where(k) == NVME_ONLY), stored)
