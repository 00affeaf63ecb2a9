"""Engine KV layouts and the canonical stored frame.

A stored frame holds every layer of one block, layer-major, so a reload can
be consumed layer by layer (the bytes of layers [l0, l1) are one contiguous
range of the frame)::

    frame (one block, T tokens, H kv heads, D head dim, L layers)
    +----------------------+----------------------+-----+------------------------+
    | layer 0: K[T,H,D]    | layer 0: V[T,H,D]    | ... | layer L-1: K | V       |
    +----------------------+----------------------+-----+------------------------+
    shape [L, 2, T, H, D], contiguous; layer_bytes = 2*T*H*D*itemsize

Engine layouts (what :class:`KVLayout` subclasses address):

    vllm              per layer  [2, num_blocks, block_size, H, D]   (vLLM FlashAttention)
    cross_layer       one tensor [num_blocks, L, 2, block_size, H, D] (blocks first)
    sglang_page_first one tensor [2, tokens, L, H, D], page = T tokens (SGLang host pool)
    hf                per layer keys/values [batch, H, seq, D] (transformers DynamicCache);
                      block b of batch row r = tokens [b*T, (b+1)*T); the last block may be
                      partial: only its valid tokens move, the frame's tail is zero.

``gather`` and ``scatter`` move whole blocks between a layout and a stack of
frames ``[n, L, 2, T, H, D]`` (on the layout's device: the batched path) and
are vectorised per layout; ``block_views`` gives the per-block, per-layer
views used by the per-block copy path.  No layout ever decides anything.
"""
from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Sequence

import torch


@dataclass(frozen=True)
class FrameFormat:
    """Geometry of one stored block frame (see the module diagram)."""

    layers: int
    block_tokens: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype = torch.float32

    def __post_init__(self) -> None:
        for name in ("layers", "block_tokens", "kv_heads", "head_dim"):
            v = getattr(self, name)
            if not (isinstance(v, int) and v > 0):
                raise ValueError(f"frame format: {name} must be a positive int, got {v!r}")

    @property
    def shape(self) -> tuple[int, int, int, int, int]:
        return (self.layers, 2, self.block_tokens, self.kv_heads, self.head_dim)

    @property
    def itemsize(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()

    @property
    def layer_bytes(self) -> int:
        return 2 * self.block_tokens * self.kv_heads * self.head_dim * self.itemsize

    @property
    def frame_bytes(self) -> int:
        return self.layers * self.layer_bytes

    def layer_groups(self, groups: int) -> list[range]:
        """Split the layers into ``groups`` consecutive, near-equal ranges (fewer if L < groups)."""
        if groups < 1:
            raise ValueError(f"layer groups must be >= 1, got {groups}")
        groups = min(groups, self.layers)
        step = math.ceil(self.layers / groups)
        return [range(s, min(s + step, self.layers)) for s in range(0, self.layers, step)]


class KVLayout(ABC):
    """Addresses the KV blocks of one engine cache (device tensors).

    Contract: ``gather``/``scatter`` never allocate engine memory and never
    change which blocks exist; they raise ValueError for a block id out of
    range or a frame stack of the wrong shape/dtype.  Not thread-safe: one
    mover thread touches a layout at a time (the mover owns the copy stream).
    """

    name: str = "abstract"

    def __init__(self, fmt: FrameFormat, num_blocks: int, device: torch.device) -> None:
        self.fmt = fmt
        self.num_blocks = int(num_blocks)
        self.device = torch.device(device)

    # -- geometry -----------------------------------------------------------
    def valid_tokens(self, block_id: int) -> int:
        """Tokens of ``block_id`` that hold state (block_tokens except a partial tail)."""
        return self.fmt.block_tokens

    def check_block_ids(self, block_ids: Sequence[int]) -> None:
        bad = [b for b in block_ids if not (0 <= b < self.num_blocks)]
        if bad:
            raise ValueError(f"layout {self.name!r}: block ids {bad[:5]} out of range [0, {self.num_blocks})")

    def check_frames(self, frames: torch.Tensor, n: int) -> None:
        want = (n, *self.fmt.shape)
        if tuple(frames.shape) != want or frames.dtype != self.fmt.dtype:
            raise ValueError(f"layout {self.name!r}: frames must be {want} {self.fmt.dtype}, "
                             f"got {tuple(frames.shape)} {frames.dtype}")

    # -- movement -----------------------------------------------------------
    @abstractmethod
    def block_views(self, block_id: int, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(K, V) views ``[valid_tokens, H, D]`` of one block in one layer (may be strided)."""

    def gather(self, block_ids: Sequence[int], out: torch.Tensor, layers: range | None = None) -> None:
        """Copy blocks into ``out[i, l] (i-th block, layer l)``; mutates ``out`` only."""
        layers = range(self.fmt.layers) if layers is None else layers
        self.check_block_ids(block_ids)
        self.check_frames(out, len(block_ids))
        for i, b in enumerate(block_ids):
            t = self.valid_tokens(b)
            for l in layers:
                k, v = self.block_views(b, l)
                out[i, l, 0, :t].copy_(k)
                out[i, l, 1, :t].copy_(v)
                if t < self.fmt.block_tokens:
                    out[i, l, :, t:].zero_()

    def scatter(self, frames: torch.Tensor, block_ids: Sequence[int], layers: range | None = None) -> None:
        """Copy ``frames[i, l]`` into block ``block_ids[i]``, layer l; mutates the engine cache."""
        layers = range(self.fmt.layers) if layers is None else layers
        self.check_block_ids(block_ids)
        self.check_frames(frames, len(block_ids))
        for i, b in enumerate(block_ids):
            t = self.valid_tokens(b)
            for l in layers:
                k, v = self.block_views(b, l)
                k.copy_(frames[i, l, 0, :t])
                v.copy_(frames[i, l, 1, :t])

    def _index(self, block_ids: Sequence[int]) -> torch.Tensor:
        return torch.as_tensor(list(block_ids), dtype=torch.long, device=self.device)


class VllmLayout(KVLayout):
    """vLLM per-layer cache: ``tensors[l]`` is ``[2, num_blocks, T, H, D]``."""

    name = "vllm"

    def __init__(self, tensors: Sequence[torch.Tensor], fmt: FrameFormat) -> None:
        if len(tensors) != fmt.layers:
            raise ValueError(f"vllm layout: {len(tensors)} layer tensors for a {fmt.layers}-layer format")
        nb = tensors[0].shape[1]
        for t in tensors:
            if tuple(t.shape) != (2, nb, fmt.block_tokens, fmt.kv_heads, fmt.head_dim) or t.dtype != fmt.dtype:
                raise ValueError(f"vllm layout: layer tensor {tuple(t.shape)} {t.dtype} does not match {fmt}")
        super().__init__(fmt, nb, tensors[0].device)
        self.tensors = list(tensors)

    @classmethod
    def allocate(cls, fmt: FrameFormat, num_blocks: int, device="cpu") -> "VllmLayout":
        return cls([torch.zeros(2, num_blocks, fmt.block_tokens, fmt.kv_heads, fmt.head_dim,
                                dtype=fmt.dtype, device=device) for _ in range(fmt.layers)], fmt)

    def block_views(self, block_id, layer):
        t = self.tensors[layer]
        return t[0, block_id], t[1, block_id]

    def gather(self, block_ids, out, layers=None):
        layers = range(self.fmt.layers) if layers is None else layers
        self.check_block_ids(block_ids)
        self.check_frames(out, len(block_ids))
        idx = self._index(block_ids)
        for l in layers:
            out[:, l].copy_(self.tensors[l].index_select(1, idx).transpose(0, 1))

    def scatter(self, frames, block_ids, layers=None):
        layers = range(self.fmt.layers) if layers is None else layers
        self.check_block_ids(block_ids)
        self.check_frames(frames, len(block_ids))
        idx = self._index(block_ids)
        for l in layers:
            self.tensors[l].index_copy_(1, idx, frames[:, l].transpose(0, 1))


class CrossLayerLayout(KVLayout):
    """Blocks-first cache of all layers: ``[num_blocks, L, 2, T, H, D]`` (a block is one frame)."""

    name = "cross_layer"

    def __init__(self, tensor: torch.Tensor, fmt: FrameFormat) -> None:
        if tuple(tensor.shape[1:]) != fmt.shape or tensor.dtype != fmt.dtype:
            raise ValueError(f"cross_layer layout: tensor {tuple(tensor.shape)} {tensor.dtype} does not match {fmt}")
        super().__init__(fmt, tensor.shape[0], tensor.device)
        self.tensor = tensor

    @classmethod
    def allocate(cls, fmt: FrameFormat, num_blocks: int, device="cpu") -> "CrossLayerLayout":
        return cls(torch.zeros(num_blocks, *fmt.shape, dtype=fmt.dtype, device=device), fmt)

    def block_views(self, block_id, layer):
        return self.tensor[block_id, layer, 0], self.tensor[block_id, layer, 1]

    def gather(self, block_ids, out, layers=None):
        layers = range(self.fmt.layers) if layers is None else layers
        self.check_block_ids(block_ids)
        self.check_frames(out, len(block_ids))
        sl = slice(layers.start, layers.stop)
        out[:, sl].copy_(self.tensor[:, sl].index_select(0, self._index(block_ids)))

    def scatter(self, frames, block_ids, layers=None):
        layers = range(self.fmt.layers) if layers is None else layers
        self.check_block_ids(block_ids)
        self.check_frames(frames, len(block_ids))
        sl = slice(layers.start, layers.stop)
        self.tensor[:, sl].index_copy_(0, self._index(block_ids), frames[:, sl])


class SglangPageFirstLayout(KVLayout):
    """SGLang host pool, ``page_first``: ``[2, tokens, L, H, D]``; page b = tokens [b*T, (b+1)*T)."""

    name = "sglang_page_first"

    def __init__(self, tensor: torch.Tensor, fmt: FrameFormat) -> None:
        two, size, L, H, D = tensor.shape
        if (two, L, H, D) != (2, fmt.layers, fmt.kv_heads, fmt.head_dim) or tensor.dtype != fmt.dtype \
                or size % fmt.block_tokens:
            raise ValueError(f"sglang_page_first layout: tensor {tuple(tensor.shape)} {tensor.dtype} "
                             f"does not match {fmt} (token count must be a multiple of the page size)")
        super().__init__(fmt, size // fmt.block_tokens, tensor.device)
        self.tensor = tensor

    @classmethod
    def allocate(cls, fmt: FrameFormat, num_blocks: int, device="cpu") -> "SglangPageFirstLayout":
        return cls(torch.zeros(2, num_blocks * fmt.block_tokens, fmt.layers, fmt.kv_heads, fmt.head_dim,
                               dtype=fmt.dtype, device=device), fmt)

    def block_views(self, block_id, layer):
        T = self.fmt.block_tokens
        s = slice(block_id * T, (block_id + 1) * T)
        return self.tensor[0, s, layer], self.tensor[1, s, layer]

    def _token_index(self, block_ids):
        T = self.fmt.block_tokens
        idx = self._index(block_ids)
        return (idx[:, None] * T + torch.arange(T, device=self.device)).reshape(-1)

    def gather(self, block_ids, out, layers=None):
        layers = range(self.fmt.layers) if layers is None else layers
        self.check_block_ids(block_ids)
        self.check_frames(out, len(block_ids))
        n, T = len(block_ids), self.fmt.block_tokens
        sl = slice(layers.start, layers.stop)
        g = self.tensor[:, :, sl].index_select(1, self._token_index(block_ids))   # [2, n*T, l, H, D]
        g = g.view(2, n, T, len(layers), self.fmt.kv_heads, self.fmt.head_dim)
        out[:, sl].copy_(g.permute(1, 3, 0, 2, 4, 5))

    def scatter(self, frames, block_ids, layers=None):
        layers = range(self.fmt.layers) if layers is None else layers
        self.check_block_ids(block_ids)
        self.check_frames(frames, len(block_ids))
        n, T = len(block_ids), self.fmt.block_tokens
        sl = slice(layers.start, layers.stop)
        src = frames[:, sl].permute(2, 0, 3, 1, 4, 5).reshape(2, n * T, len(layers),
                                                              self.fmt.kv_heads, self.fmt.head_dim)
        self.tensor[:, :, sl].index_copy_(1, self._token_index(block_ids), src)


class HFLayout(KVLayout):
    """transformers cache of one batch row: ``keys[l]``/``values[l]`` are ``[B, H, S, D]``.

    Block b holds tokens [b*T, min((b+1)*T, S)); the last block may be partial.
    """

    name = "hf"

    def __init__(self, keys: Sequence[torch.Tensor], values: Sequence[torch.Tensor],
                 fmt: FrameFormat, row: int = 0) -> None:
        if len(keys) != fmt.layers or len(values) != fmt.layers:
            raise ValueError(f"hf layout: {len(keys)} layers of keys for a {fmt.layers}-layer format")
        B, H, S, D = keys[0].shape
        for t in (*keys, *values):
            if tuple(t.shape) != (B, fmt.kv_heads, S, fmt.head_dim) or t.dtype != fmt.dtype:
                raise ValueError(f"hf layout: cache tensor {tuple(t.shape)} {t.dtype} does not match "
                                 f"[batch, {fmt.kv_heads}, seq, {fmt.head_dim}] {fmt.dtype}")
        if not (0 <= row < B):
            raise ValueError(f"hf layout: batch row {row} out of range [0, {B})")
        super().__init__(fmt, math.ceil(S / fmt.block_tokens), keys[0].device)
        self.keys, self.values, self.row, self.seq_len = list(keys), list(values), row, S

    @classmethod
    def allocate(cls, fmt: FrameFormat, seq_len: int, device="cpu") -> "HFLayout":
        mk = lambda: torch.zeros(1, fmt.kv_heads, seq_len, fmt.head_dim, dtype=fmt.dtype, device=device)
        return cls([mk() for _ in range(fmt.layers)], [mk() for _ in range(fmt.layers)], fmt)

    def valid_tokens(self, block_id):
        T = self.fmt.block_tokens
        return max(0, min(T, self.seq_len - block_id * T))

    def block_views(self, block_id, layer):
        T = self.fmt.block_tokens
        s = slice(block_id * T, block_id * T + self.valid_tokens(block_id))
        return (self.keys[layer][self.row, :, s].transpose(0, 1),
                self.values[layer][self.row, :, s].transpose(0, 1))
