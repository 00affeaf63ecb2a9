"""Block arithmetic of paged KV allocation (reference text 004).

Paging vs contiguous reservation (004, Worked Example 1)::

    request lengths  47        612              130       1900
    paged (B=16)     [###]     [#######...39]   [##..9]   [######...119]   170 blocks = 2,720 slots
    naive            [2048]    [2048]           [2048]    [2048]           8,192 slots

Prefix sharing (004, Worked Example 2): a P-token prefix common to R
requests, each with a U-token private suffix::

    without sharing   R x ( ceil(P/B) + ceil(U/B) )      every request stores the prefix
    with sharing      ceil(P/B) + R x ceil(U/B)          prefix blocks stored once

The "with sharing" count pads the prefix to a block boundary so each suffix
starts a fresh block (the accounting of Worked Examples 2 and A5).  Without
padding only *full* prefix blocks can be shared (004, A3): floor(P/B) blocks,
and the straddling block is private to each request; ``strict_*`` fields give
that count.  Pure functions; bad input raises ValueError.
"""
from __future__ import annotations

from dataclasses import dataclass


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _check_pos(name: str, v: int) -> None:
    if not (isinstance(v, int) and not isinstance(v, bool) and v > 0):
        raise ValueError(f"{name} must be a positive integer, got {v!r}")


@dataclass(frozen=True)
class RequestBlocks:
    length: int
    blocks: int
    slots: int
    waste: int


@dataclass(frozen=True)
class PagingResult:
    """Paged vs naive (contiguous, max_seq_len per request) allocation of one batch.

    Fragmentation percentages are (reserved - used) / reserved * 100; the
    memory reduction factor is naive_slots / paged_slots; block_table_entries
    is the total number of blocks (one table entry each).
    """

    block_size: int
    max_seq_len: int
    requests: tuple[RequestBlocks, ...]
    total_actual_tokens: int
    paged_slots: int
    naive_slots: int
    paged_fragmentation_pct: float
    naive_fragmentation_pct: float
    memory_reduction_factor: float

    @property
    def block_table_entries(self) -> int:
        return sum(r.blocks for r in self.requests)


def paged_vs_naive(lengths: list[int] | tuple[int, ...], block_size: int, max_seq_len: int) -> PagingResult:
    """004's ``paged_vs_naive`` without rounding (pure).

    Raises ValueError for an empty batch, non-positive sizes, or a request
    longer than ``max_seq_len`` (the naive reservation could not hold it).
    """
    if not lengths:
        raise ValueError("give at least one request length")
    _check_pos("block size", block_size)
    _check_pos("max sequence length", max_seq_len)
    reqs = []
    for n in lengths:
        _check_pos("request length", n)
        if n > max_seq_len:
            raise ValueError(f"request length {n} exceeds the max sequence length {max_seq_len}")
        blocks = _ceil_div(n, block_size)
        reqs.append(RequestBlocks(length=n, blocks=blocks, slots=blocks * block_size, waste=blocks * block_size - n))
    actual = sum(r.length for r in reqs)
    paged = sum(r.slots for r in reqs)
    naive = max_seq_len * len(reqs)
    return PagingResult(
        block_size=block_size, max_seq_len=max_seq_len, requests=tuple(reqs), total_actual_tokens=actual,
        paged_slots=paged, naive_slots=naive,
        paged_fragmentation_pct=(paged - actual) / paged * 100.0,
        naive_fragmentation_pct=(naive - actual) / naive * 100.0,
        memory_reduction_factor=naive / paged,
    )


@dataclass(frozen=True)
class SharingResult:
    """Blocks for R requests sharing a P-token prefix, each with a U-token suffix.

    prefix_blocks:           ceil(P/B), stored once when shared.
    suffix_blocks:           ceil(U/B) per request.
    without_sharing_blocks:  R * (prefix_blocks + suffix_blocks).
    with_sharing_blocks:     prefix_blocks + R * suffix_blocks (prefix padded to a block boundary).
    shareable_prefix_blocks: floor(P/B): full prefix blocks, shareable even unpadded (004, A3).
    strict_with_sharing_blocks: floor(P/B) + R * ceil((P mod B + U) / B): sharing full blocks only.
    prefill_tokens_saved:    (R - 1) * P: prefill skipped by every request after the first.
    """

    prefix_tokens: int
    suffix_tokens: int
    requests: int
    block_size: int
    prefix_blocks: int
    suffix_blocks: int
    without_sharing_blocks: int
    with_sharing_blocks: int
    shareable_prefix_blocks: int
    strict_with_sharing_blocks: int

    @property
    def reduction_factor(self) -> float:
        return self.without_sharing_blocks / self.with_sharing_blocks

    @property
    def shareable_prefix_tokens(self) -> int:
        return self.shareable_prefix_blocks * self.block_size

    @property
    def shareable_prefix_pct(self) -> float:
        return self.shareable_prefix_tokens / self.prefix_tokens * 100.0

    @property
    def prefill_tokens_saved(self) -> int:
        return (self.requests - 1) * self.prefix_tokens


def prefix_sharing(prefix_tokens: int, suffix_tokens: int, requests: int, block_size: int) -> SharingResult:
    """004's Worked Example 2 arithmetic (pure).  Raises ValueError on non-positive input."""
    _check_pos("prefix tokens", prefix_tokens)
    _check_pos("suffix tokens", suffix_tokens)
    _check_pos("requests", requests)
    _check_pos("block size", block_size)
    pb = _ceil_div(prefix_tokens, block_size)
    sb = _ceil_div(suffix_tokens, block_size)
    full = prefix_tokens // block_size
    tail = prefix_tokens % block_size
    return SharingResult(
        prefix_tokens=prefix_tokens, suffix_tokens=suffix_tokens, requests=requests, block_size=block_size,
        prefix_blocks=pb, suffix_blocks=sb,
        without_sharing_blocks=requests * (pb + sb),
        with_sharing_blocks=pb + requests * sb,
        shareable_prefix_blocks=full,
        strict_with_sharing_blocks=full + requests * _ceil_div(tail + suffix_tokens, block_size),
    )
