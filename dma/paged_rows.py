"""Paged row copies: an engine's paged KV tensors <-> a host tier of chunk rows,
planned as data and executed with plain tensor indexing (any device torch has).

An engine keeps each KV tensor as ``(num_blocks, page_bytes)`` (int8 view);
the host tier keeps it as ``(num_chunks, blocks_per_chunk * page_bytes)``,
one chunk row holding ``blocks_per_chunk`` consecutive blocks of a request::

    engine tensor t            host tensor t (one row = one chunk)
    +--------+                 +--------+--------+--------+--------+
    | blk 7  |  ---+           | sub 0  | sub 1  | sub 2  | sub 3  |  chunk 5
    | blk 2  |     +---------> |        | blk 7  | blk 2  |        |  (first sub-block
    | ...    |                 +--------+--------+--------+--------+   skipped: skip=1)

A transfer is a list of :class:`RowCopy` (one per engine tensor a KV-cache
group uses): which engine rows, which (chunk, sub-block) cells, how many bytes
of each page.  :func:`plan_rows` makes it from the engine's block ids, the
host chunk ids and each group's first logical block (unaligned first chunks
skip ``block_index % blocks_per_chunk`` sub-blocks), and :func:`run_copies`
executes it.  Nothing here knows which engine asked.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch


@dataclass(frozen=True)
class RowCopy:
    """Copy ``nbytes`` of each page between engine rows and host cells of tensor ``tensor``.

    ``engine_rows[i]`` pairs with host cell (``chunks[i]``, ``subs[i]``)."""
    tensor: int
    engine_rows: np.ndarray
    chunks: np.ndarray
    subs: np.ndarray
    nbytes: int


def plan_rows(engine_blocks: Sequence[int], host_chunks: Sequence[int], *, group_sizes: Sequence[int],
              block_indices: Sequence[int], blocks_per_chunk: int,
              group_tensors: Sequence[Sequence[tuple[int, int]]]) -> list[RowCopy]:
    """The copies of one transfer.

    ``group_sizes[g]`` engine blocks of group g (in order in ``engine_blocks``)
    start at logical block ``block_indices[g]``; their host chunks follow each
    other in ``host_chunks``.  ``group_tensors[g]`` lists (tensor index, page
    bytes) of the tensors group g uses.  Raises ValueError when the ids do not
    add up (a chunk list too short or too long for the groups)."""
    if blocks_per_chunk < 1:
        raise ValueError(f"blocks_per_chunk must be >= 1, got {blocks_per_chunk}")
    if not (len(group_sizes) == len(block_indices) == len(group_tensors)):
        raise ValueError("group_sizes, block_indices and group_tensors differ in length")
    blocks = np.asarray(engine_blocks, dtype=np.int64)
    chunks = np.asarray(host_chunks, dtype=np.int64)
    out: list[RowCopy] = []
    b_off = c_off = 0
    for size, first, tensors in zip(group_sizes, block_indices, group_tensors):
        if size == 0:
            continue
        skip = int(first) % blocks_per_chunk
        n_chunks = -(-(size + skip) // blocks_per_chunk)
        g_blocks = blocks[b_off:b_off + size]
        g_chunks = chunks[c_off:c_off + n_chunks]
        if len(g_blocks) != size or len(g_chunks) != n_chunks:
            raise ValueError(f"a group of {size} blocks (skip {skip}) needs {n_chunks} chunks and {size} "
                             f"blocks; got {len(g_chunks)} and {len(g_blocks)}")
        cells = (g_chunks[:, None] * blocks_per_chunk + np.arange(blocks_per_chunk)).ravel()[skip:skip + size]
        for t, nbytes in tensors:
            out.append(RowCopy(int(t), g_blocks, cells // blocks_per_chunk, cells % blocks_per_chunk, int(nbytes)))
        b_off += size
        c_off += n_chunks
    if b_off != len(blocks) or c_off != len(chunks):
        raise ValueError(f"{len(blocks)} blocks and {len(chunks)} chunks given, the groups use {b_off} and {c_off}")
    return out


_WORDS = ((8, torch.int64), (4, torch.int32), (2, torch.int16))


def _as_words(engine: torch.Tensor, host: torch.Tensor, nbytes: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The two int8 tensors viewed as the widest integer words that divide
    ``nbytes`` and both pages, and ``nbytes`` in those words: torch's CPU
    index kernels copy element by element, so int64 words move a page about
    five times faster than int8 ones.  The int8 views themselves when no
    width fits (or a view refuses: an unaligned storage offset)."""
    for width, dtype in _WORDS:
        if nbytes % width or engine.shape[-1] % width or host.shape[-1] % width:
            continue
        try:
            return engine.view(dtype), host.view(dtype), nbytes // width
        except RuntimeError:
            continue
    return engine, host, nbytes


def run_copies(copies: Sequence[RowCopy], engine: Sequence[torch.Tensor], host: Sequence[torch.Tensor], *,
               to_host: bool) -> int:
    """Execute ``copies``: engine tensors ``(blocks, page)`` and host tensors
    ``(chunks, blocks_per_chunk, page)`` (int8 views).  Returns the bytes copied.

    Between two CPU tensors the rows move through numpy views (one memcpy a
    row, on the calling thread); elsewhere through torch's index kernels on
    the widest integer words that fit.  torch's CPU index kernels run an
    OpenMP region per call: on a machine whose cores are busy that region
    waits for them (measured: a 1.4 MiB copy 44 ms at 2 threads on a loaded
    2-core machine, 0.09 ms through numpy)."""
    moved = 0
    for c in copies:
        e, h = engine[c.tensor], host[c.tensor]
        if e.device.type == "cpu" and h.device.type == "cpu":
            _copy_numpy(c, e.numpy(), h.numpy(), to_host=to_host)
        else:
            _copy_torch(c, e, h, to_host=to_host)
        moved += len(c.engine_rows) * c.nbytes
    return moved


def _copy_numpy(c: RowCopy, e: np.ndarray, h: np.ndarray, *, to_host: bool) -> None:
    n = c.nbytes
    if n == e.shape[-1] == h.shape[-1]:
        if to_host:
            h[c.chunks, c.subs] = e[c.engine_rows]
        else:
            e[c.engine_rows] = h[c.chunks, c.subs]
    elif to_host:
        h[c.chunks, c.subs, :n] = e[c.engine_rows, :n]
    else:
        e[c.engine_rows, :n] = h[c.chunks, c.subs, :n]


def _copy_torch(c: RowCopy, e: torch.Tensor, h: torch.Tensor, *, to_host: bool) -> None:
    e, h, n = _as_words(e, h, c.nbytes)
    rows = torch.from_numpy(c.engine_rows).to(e.device)
    ch, sb = torch.from_numpy(c.chunks).to(h.device), torch.from_numpy(c.subs).to(h.device)
    if to_host:
        h[ch, sb, :n] = e[rows, :n].to(h.device)
    else:
        e[rows, :n] = h[ch, sb, :n].to(e.device)
