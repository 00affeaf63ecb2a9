"""Named model geometries and serving nodes.

Model presets carry the published geometry of each model's Hugging Face
``config.json`` (``num_hidden_layers``, ``num_key_value_heads``, ``head_dim``
or ``hidden_size / num_attention_heads``, ``hidden_size``) and the parameter
count from its model card.  KV storage is 16-bit (``dtype_bytes=2``) unless
overridden; FP8 KV is ``geom.with_dtype(1)``.

``gqa-70b`` is the reference texts' 70B grouped-query model (80 layers, 8 KV
heads of 128, 70.6e9 parameters as in Napkin Math 0.1/0.6).  Napkin Math 0.7
and figure 10 round it to 70e9: pass that explicitly (``--params 70e9``).

MoE models set ``active_params`` (what a prefill token actually computes with);
``params`` stays the total (what the weights occupy).  DeepSeek-V3 uses MLA:
one latent of kv_lora_rank 512 + qk_rope_head_dim 64 = 576 values per layer
per token, so its ``kv_heads``/``head_dim`` are nominal (1 x 576) and
``mla_latent_dim`` decides the footprint.

Node presets are node-wide :class:`HardwareProfile` figures; see each entry.
Lookups are by case-insensitive name; an unknown name raises ``ValueError``
listing the known ones.
"""
from __future__ import annotations

import difflib
from typing import Mapping, TypeVar

from kvtier.tiering.model.costmodel import GB, TFLOP, HardwareProfile, ModelGeometry

GiB = 1024 ** 3


def _dense(name: str, layers: int, kv_heads: int, head_dim: int, d_model: int, params: float,
           active_params: float | None = None) -> ModelGeometry:
    return ModelGeometry(name=name, layers=layers, kv_heads=kv_heads, head_dim=head_dim,
                         dtype_bytes=2, params=params, d_model=d_model, active_params=active_params)


_MODELS: tuple[ModelGeometry, ...] = (
    # The texts' example model (000: "80 layers, 8 key-value heads of dimension 128").
    _dense("gqa-70b", 80, 8, 128, 8192, 70.6e9),
    # Meta Llama 3.x
    _dense("llama-3.2-1b", 16, 8, 64, 2048, 1.24e9),
    _dense("llama-3.2-3b", 28, 8, 128, 3072, 3.21e9),
    _dense("llama-3.1-8b", 32, 8, 128, 4096, 8.03e9),
    _dense("llama-3.1-70b", 80, 8, 128, 8192, 70.6e9),
    _dense("llama-3.3-70b", 80, 8, 128, 8192, 70.6e9),
    # Mistral
    _dense("mistral-7b", 32, 8, 128, 4096, 7.25e9),
    # Qwen 2.5
    _dense("qwen2.5-0.5b", 24, 2, 64, 896, 0.49e9),
    _dense("qwen2.5-1.5b", 28, 2, 128, 1536, 1.54e9),
    _dense("qwen2.5-3b", 36, 2, 128, 2048, 3.09e9),
    _dense("qwen2.5-7b", 28, 4, 128, 3584, 7.61e9),
    _dense("qwen2.5-14b", 48, 8, 128, 5120, 14.7e9),
    _dense("qwen2.5-32b", 64, 8, 128, 5120, 32.5e9),
    _dense("qwen2.5-72b", 80, 8, 128, 8192, 72.7e9),
    # Qwen 3 (head_dim is 128 in config.json, independent of hidden_size)
    _dense("qwen3-0.6b", 28, 8, 128, 1024, 0.6e9),
    _dense("qwen3-4b", 36, 8, 128, 2560, 4.0e9),
    _dense("qwen3-8b", 36, 8, 128, 4096, 8.2e9),
    _dense("qwen3-14b", 40, 8, 128, 5120, 14.8e9),
    _dense("qwen3-32b", 64, 8, 128, 5120, 32.8e9),
    _dense("qwen3-30b-a3b", 48, 4, 128, 2048, 30.5e9, active_params=3.3e9),
    # DeepSeek-V3: MLA, 61 layers, latent 512 + 64 rope = 576; 671B total, 37B active.
    ModelGeometry(name="deepseek-v3", layers=61, kv_heads=1, head_dim=576, dtype_bytes=2,
                  params=671e9, mla_latent_dim=576, d_model=7168, active_params=37e9),
)

PRESETS: Mapping[str, ModelGeometry] = {g.name: g for g in _MODELS}
"""Model geometry presets by name."""

_NODES: Mapping[str, HardwareProfile] = {
    # The texts' eight-accelerator node (000, Napkin Math 0.1 and 0.6): 8 x 80 GiB
    # = 687.2 GB of HBM, 20 GB runtime reserve, one 64 GB/s host link per
    # accelerator (512 GB/s node-wide each way), prefill at 45% of peak
    # (3,560 TFLOP/s sustained).  NVMe figures: the profile defaults.
    "h100x8": HardwareProfile(hbm_bytes=8 * 80 * GiB, link_h2d_bps=512 * GB, link_d2h_bps=512 * GB,
                              prefill_flops=3560 * TFLOP, runtime_bytes=20 * GB),
    # One PCIe Gen5 x16 link at 50 GB/s sustained and 400 TFLOP/s sustained
    # prefill: the setting of figure 10 and the "Keeping paused state
    # resident" pitfall in 000.  HBM: one 80 GiB accelerator.
    "pcie5-x16": HardwareProfile(hbm_bytes=80 * GiB, link_h2d_bps=50 * GB, link_d2h_bps=50 * GB,
                                 prefill_flops=400 * TFLOP),
    # The slower-link node of the live benchmark's scale model (docs/live.md): the same
    # accelerator as "pcie5-x16" (80 GiB, 400 TFLOP/s sustained prefill) on one PCIe Gen4 x16
    # link at 25 GB/s sustained, with a Gen3-class NVMe at half the profile defaults'
    # 7/5 GB/s: 3.5 GB/s read, 2.5 GB/s write.
    "pcie4": HardwareProfile(hbm_bytes=80 * GiB, link_h2d_bps=25 * GB, link_d2h_bps=25 * GB,
                             prefill_flops=400 * TFLOP, nvme_read_bps=3.5 * GB, nvme_write_bps=2.5 * GB),
}
NODES: Mapping[str, HardwareProfile] = _NODES
"""Hardware (node) presets by name."""

DEFAULT_NODE = "h100x8"

T = TypeVar("T")


def _lookup(table: Mapping[str, T], name: str, kind: str) -> T:
    key = name.strip().lower()
    if key in table:
        return table[key]
    close = difflib.get_close_matches(key, list(table), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ValueError(f"unknown {kind} preset {name!r}{hint}; known: {', '.join(table)}")


def get_preset(name: str) -> ModelGeometry:
    """The model geometry called ``name``.  Raises ValueError naming the known presets."""
    return _lookup(PRESETS, name, "model")


def get_node(name: str) -> HardwareProfile:
    """The hardware profile called ``name``.  Raises ValueError naming the known presets."""
    return _lookup(NODES, name, "node")
