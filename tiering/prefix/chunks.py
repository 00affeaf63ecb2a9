"""Chained chunk hashes: a prompt's prefix fingerprint (figure 7, stage 1).

::

    tokens  [t0 .. t15][t16 .. t31] ... [t(16k) ..]   (a trailing partial chunk is not hashed)
    hashes   h1 = H(h0 || c1)   h2 = H(h1 || c2)  ...  h0 = H(seed)

Equal hashes at position k mean equal prompts up to the end of chunk k, so the
longest run of held hashes from the left is the reusable prefix.  ``H`` is
blake2b-128 over the parent hash and the chunk's token ids (4-byte little
endian); ``seed`` namespaces the chain (model, dtype, lora: hashes of two
namespaces never meet).
"""
from __future__ import annotations

import hashlib
import struct
from typing import Sequence

DEFAULT_CHUNK_TOKENS = 16
DIGEST_BYTES = 16


def root_hash(seed: bytes = b"") -> bytes:
    """``h0``: the chain's root for namespace ``seed``."""
    return hashlib.blake2b(b"kvtier-prefix\x00" + seed, digest_size=DIGEST_BYTES).digest()


def chunk_hashes(tokens: Sequence[int], chunk_tokens: int = DEFAULT_CHUNK_TOKENS, *,
                 seed: bytes = b"") -> list[bytes]:
    """The hashes ``h_1..h_n`` of the full chunks of ``tokens``.  Pure.
    Raises ValueError for ``chunk_tokens < 1`` or a token outside [0, 2**32)."""
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    out: list[bytes] = []
    h = root_hash(seed)
    fmt = f"<{chunk_tokens}I"
    for i in range(0, len(tokens) - chunk_tokens + 1, chunk_tokens):
        try:
            body = struct.pack(fmt, *tokens[i:i + chunk_tokens])
        except struct.error:
            raise ValueError(f"token ids must be integers in [0, 2**32) (chunk at {i})") from None
        h = hashlib.blake2b(h + body, digest_size=DIGEST_BYTES).digest()
        out.append(h)
    return out


def common_prefix(a: Sequence, b: Sequence) -> int:
    """Length of the longest common prefix of two sequences."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
