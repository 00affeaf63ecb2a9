"""Content-addressed block keys.

A block key is a chained blake2b digest::

    key_0 = H(ROOT,   namespace, tokens[0:B])
    key_i = H(key_{i-1}, namespace, tokens[i*B:(i+1)*B])

where ``namespace`` identifies everything that changes the bytes of a KV
block for the same tokens (model id, dtype, layout, tensor-parallel rank).
Equal token prefixes under the same namespace give equal keys, so a second
pause re-offloads only blocks added since the first, and branches share
their common prefix.  Never Python ``hash()`` (salted per process).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cached_property
from typing import Sequence

import numpy as np

KEY_BYTES = 16                      # 128-bit keys
ROOT_KEY = bytes(KEY_BYTES)         # parent of a sequence's first block
_PERSON = b"kvtier.block.v1"        # blake2b personalisation (<= 16 bytes)


@dataclass(frozen=True)
class Namespace:
    """What makes two equal token prefixes produce different KV bytes."""

    model_id: str
    dtype: str
    layout: str = "paged"
    tp_rank: int = 0

    def __post_init__(self) -> None:
        if not self.model_id:
            raise ValueError("Namespace.model_id must be non-empty")
        if not isinstance(self.tp_rank, int) or self.tp_rank < 0:
            raise ValueError(f"Namespace.tp_rank must be a non-negative int, got {self.tp_rank!r}")

    @cached_property
    def digest(self) -> bytes:
        """16 bytes that stand for this namespace inside every key."""
        text = "\x1f".join((self.model_id, self.dtype, self.layout, str(self.tp_rank)))
        return hashlib.blake2b(text.encode(), digest_size=16, person=b"kvtier.ns.v1").digest()

    @cached_property
    def tag(self) -> bytes:
        """8-byte tag recorded in the index next to each block."""
        return self.digest[:8]


def _token_bytes(token_ids: Sequence[int] | np.ndarray) -> bytes:
    arr = np.asarray(token_ids)
    if arr.ndim != 1:
        raise ValueError(f"token ids must be one-dimensional, got shape {arr.shape}")
    if arr.size and arr.dtype.kind not in "iu":
        raise ValueError(f"token ids must be integers, got dtype {arr.dtype}")
    if arr.size and (arr.min() < 0 or arr.max() >= 2**32):
        raise ValueError("token ids must be in [0, 2**32)")
    return arr.astype("<u4", copy=False).tobytes()


def block_key(parent: bytes | None, token_ids: Sequence[int] | np.ndarray, namespace: Namespace) -> bytes:
    """Key of one block given its parent's key (``None`` for the first block).

    Pure function; raises ``ValueError`` for a bad parent or bad token ids.
    """
    parent = ROOT_KEY if parent is None else parent
    if not isinstance(parent, (bytes, bytearray)) or len(parent) != KEY_BYTES:
        raise ValueError(f"parent key must be {KEY_BYTES} bytes")
    toks = _token_bytes(token_ids)
    h = hashlib.blake2b(digest_size=KEY_BYTES, person=_PERSON)
    h.update(bytes(parent))
    h.update(namespace.digest)
    h.update(len(toks).to_bytes(8, "little"))
    h.update(toks)
    return h.digest()


def chain_keys(token_ids: Sequence[int] | np.ndarray, block_tokens: int, namespace: Namespace,
               parent: bytes | None = None, *, partial: bool = False) -> list[bytes]:
    """Keys of consecutive blocks of ``block_tokens`` tokens.

    Only full blocks get keys unless ``partial`` (then a trailing short block
    gets one too).  ``parent`` continues an earlier chain.
    """
    if block_tokens <= 0:
        raise ValueError(f"block_tokens must be > 0, got {block_tokens}")
    arr = np.asarray(token_ids)
    n_full = len(arr) // block_tokens
    stops = [(i + 1) * block_tokens for i in range(n_full)]
    if partial and len(arr) % block_tokens:
        stops.append(len(arr))
    keys, start = [], 0
    for stop in stops:
        parent = block_key(parent, arr[start:stop], namespace)
        keys.append(parent)
        start = stop
    return keys
