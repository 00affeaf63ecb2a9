"""vLLM's prefix-cache block hashes, computed outside the engine.

A full block of ``block_size`` tokens hashes as vLLM's ``hash_block_tokens`` does::

    h_0 = H((NONE_HASH, tokens[0:B], None))          NONE_HASH = H(seed)
    h_k = H((h_{k-1}, tokens[kB:(k+1)B], None))

``H`` is the engine's ``--prefix-caching-hash-algo`` (``sha256``: SHA-256 of the pickled
tuple, vLLM's default; ``sha256_cbor``: of its canonical CBOR; the ``xxhash`` pair: XXH3-128).
``seed`` is vLLM's fixed ``"vllm-none-hash"`` unless the engine runs with ``PYTHONHASHSEED``
(then that value); vLLM seeds the xxhash algorithms randomly per process unless
``PYTHONHASHSEED`` is set, so they need the seed given.  The trailing partial block has no hash.
A request's ``cache_salt`` goes into its first block's hash as vLLM puts it there (extra keys
``(("cache_salt", salt),)``, vLLM >= 0.32's ``generate_block_hash_extra_keys``).  Requests with
a LoRA adapter, multimodal inputs or prompt embeddings carry other extra keys in vLLM's hash:
their hashes here differ from the engine's, which reads as a miss.

Hashes are returned in the form KV events carry with ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``,
the low 64 bits as an unsigned int (:func:`external`), so bytes and int events key alike.
Pure functions and an immutable hasher (thread-safe).
"""
from __future__ import annotations

import hashlib
import pickle
from typing import Any, Callable, Sequence

HASH_ALGOS: tuple[str, ...] = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")
DEFAULT_SEED = "vllm-none-hash"
MASK64 = (1 << 64) - 1


def external(h: bytes | int) -> int:
    """A block hash as the directory keys it: bytes -> their low 64 bits, big-endian (vLLM's
    ``maybe_convert_block_hash``); an int -> itself masked to 64 bits.  Raises ValueError."""
    if isinstance(h, (bytes, bytearray, memoryview)):
        b = bytes(h)
        if not b:
            raise ValueError("an empty block hash")
        return int.from_bytes(b[-8:], "big")
    if isinstance(h, int) and not isinstance(h, bool):
        return h & MASK64
    raise ValueError(f"a block hash must be bytes or int, got {type(h).__name__}")


def _pickled(x: Any) -> bytes:
    return pickle.dumps(x, protocol=pickle.HIGHEST_PROTOCOL)


def _cbor(x: Any) -> bytes:
    import cbor2
    return cbor2.dumps(x, canonical=True)


def _xxh(data: bytes) -> bytes:
    import xxhash
    return xxhash.xxh3_128_digest(data)


_FNS: dict[str, Callable[[Any], bytes]] = {
    "sha256": lambda x: hashlib.sha256(_pickled(x)).digest(),
    "sha256_cbor": lambda x: hashlib.sha256(_cbor(x)).digest(),
    "xxhash": lambda x: _xxh(_pickled(x)),
    "xxhash_cbor": lambda x: _xxh(_cbor(x)),
}


class BlockHasher:
    """The engines' block hash function.  Raises ValueError for an unknown algorithm, an
    xxhash algorithm without ``seed`` (vLLM's would be random per process), or a CBOR one
    without the ``cbor2`` package."""

    def __init__(self, algo: str = "sha256", seed: str | None = None) -> None:
        if algo not in _FNS:
            raise ValueError(f"unknown hash algorithm {algo!r}; known: {', '.join(HASH_ALGOS)}")
        if algo.startswith("xxhash") and seed is None:
            raise ValueError(f"{algo}: vLLM seeds it randomly per process unless PYTHONHASHSEED is set; "
                             "start the engines with one PYTHONHASHSEED and give the same value as the seed")
        if algo.endswith("_cbor"):
            try:
                import cbor2  # noqa: F401
            except ImportError:
                raise ValueError(f"{algo} needs the 'cbor2' package (vLLM installs it): pip install cbor2") from None
        self.algo = algo
        self.seed = DEFAULT_SEED if seed is None else seed
        self._fn = _FNS[algo]
        self._none = self._fn(self.seed)

    def hashes(self, tokens: Sequence[int], block_size: int, *, salt: str | None = None) -> list[int]:
        """The 64-bit hashes of the full blocks of ``tokens``, root first; ``salt``: the request's
        ``cache_salt`` (None or empty: none).  Raises ValueError for a block size < 1 or a salt
        that is not a string."""
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if salt is not None and not isinstance(salt, str):
            raise ValueError(f"a cache_salt is a string, got {type(salt).__name__}")
        out: list[int] = []
        parent = self._none
        extra = (("cache_salt", salt),) if salt else None
        for i in range(0, len(tokens) - block_size + 1, block_size):
            parent = self._fn((parent, tuple(tokens[i:i + block_size]), extra))
            extra = None
            out.append(int.from_bytes(parent[-8:], "big"))
        return out
