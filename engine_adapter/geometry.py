"""The served model's KV geometry and the node's speeds, from the engine itself.

The policy prices a pause in bytes and seconds: the KV bytes per token, the
parameters a recompute runs through, the host link and the prefill speed.
Engines know the first two exactly (vLLM's model and KV-cache spec, SGLang's
host pool); this module turns what they know into kvtier's
:class:`~kvtier.tiering.costmodel.ModelGeometry`, so any model gets the
forecast.  The ``model``/``node`` presets of the plugin config stay as
what-if overrides (:func:`resolve`).

Parameters come from the model's Hugging Face config (the engine's own, or
read from the model's local folder): embeddings, attention, MLP (MoE experts
and the active share), norms and the LM head.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from kvtier.tiering.costmodel import GB, TFLOP, HardwareProfile, ModelGeometry

DTYPE_BYTES = {"float32": 4, "float": 4, "fp32": 4, "float16": 2, "half": 2, "fp16": 2, "bfloat16": 2,
               "bf16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1,
               "uint8": 1, "int8": 1}

# What a node's link and prefill run at when the engine says only which device it is:
# CPU: memcpy-class copies between the engine's KV tensors and the host tier, fp32 GEMMs on a
# few cores; CUDA: one PCIe Gen5 x16 link and a datacenter GPU's sustained prefill.
CPU_LINK_BPS = 10 * GB
CPU_PREFILL_FLOPS = 0.05 * TFLOP
GPU_LINK_BPS = 50 * GB
GPU_PREFILL_FLOPS = 400 * TFLOP


def dtype_bytes(dtype: Any) -> float:
    """Bytes per element of a torch dtype or its name ("bfloat16", "torch.float16", "auto" -> 2).
    Raises ValueError for an unknown name."""
    itemsize = getattr(dtype, "itemsize", None)
    if isinstance(itemsize, int) and itemsize > 0:
        return float(itemsize)
    name = str(dtype).replace("torch.", "").lower()
    if name == "auto":
        return 2.0
    if name not in DTYPE_BYTES:
        raise ValueError(f"unknown KV dtype {dtype!r}")
    return float(DTYPE_BYTES[name])


def _get(cfg: Any, *names: str, default: Any = None) -> Any:
    for n in names:
        v = cfg.get(n) if isinstance(cfg, Mapping) else getattr(cfg, n, None)
        if v is not None:
            return v
    return default


def params_of(hf_config: Any) -> tuple[float, float | None]:
    """(parameters, active parameters or None) of a decoder-only transformer's
    Hugging Face config (its text config for multimodal ones).  Raises ValueError
    when the config lacks the hidden size, layer count or vocabulary."""
    cfg = _get(hf_config, "text_config", default=hf_config)
    h, layers, vocab = _get(cfg, "hidden_size", "d_model"), _get(cfg, "num_hidden_layers", "n_layer"), \
        _get(cfg, "vocab_size")
    if not all(isinstance(v, int) and v > 0 for v in (h, layers, vocab)):
        raise ValueError("the model config has no hidden_size / num_hidden_layers / vocab_size")
    heads = _get(cfg, "num_attention_heads", default=max(h // 128, 1))
    kv_heads = _get(cfg, "num_key_value_heads", default=heads)
    hd = _get(cfg, "head_dim", default=h // heads) or h // heads
    inter = _get(cfg, "intermediate_size", default=4 * h)
    attn = h * heads * hd * 2 + h * kv_heads * hd * 2
    experts = _get(cfg, "num_local_experts", "num_experts", "n_routed_experts", default=0) or 0
    tied = bool(_get(cfg, "tie_word_embeddings", default=False))
    embed = vocab * h * (1 if tied else 2)
    if experts:
        moe_inter = _get(cfg, "moe_intermediate_size", default=inter)
        per_tok = _get(cfg, "num_experts_per_tok", "moe_topk", default=2)
        shared = _get(cfg, "n_shared_experts", default=0) or 0
        mlp_all = 3 * h * moe_inter * (experts + shared) + h * experts
        mlp_active = 3 * h * moe_inter * (per_tok + shared) + h * experts
        total = embed + layers * (attn + mlp_all + 2 * h)
        active = embed + layers * (attn + mlp_active + 2 * h)
        return float(total), float(active)
    return float(embed + layers * (attn + 3 * h * inter + 2 * h) + h), None


@dataclass(frozen=True)
class EngineFacts:
    """What an engine says about the model it serves (one rank's view made whole).

    token_bytes: KV bytes per token across all layers and ranks, as stored.
    kv_pool_bytes: the engine's KV cache (device memory) across ranks, or 0 unknown.
    device: "cpu", "cuda", ... (the engine's platform)."""
    name: str
    layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: float
    params: float
    active_params: float | None = None
    token_bytes: int | None = None
    kv_pool_bytes: int = 0
    device: str = "cuda"

    def geometry(self) -> ModelGeometry:
        """The cost model's geometry; where the engine's stored bytes per token
        differ from 2 x layers x heads x head_dim x dtype (padding, MLA, hybrid
        layers), the head dimension is scaled so the bytes match what is stored."""
        hd = float(self.head_dim)
        if self.token_bytes:
            hd = self.token_bytes / (2 * self.layers * self.kv_heads * self.dtype_bytes)
        return ModelGeometry(name=self.name, layers=self.layers, kv_heads=self.kv_heads, head_dim=hd,
                             dtype_bytes=self.dtype_bytes, params=self.params, active_params=self.active_params)

    def node(self) -> HardwareProfile:
        """A node profile for the engine's device: its KV pool as the memory a
        pause holds, the device class's link and prefill speed."""
        cpu = self.device == "cpu"
        pool = float(self.kv_pool_bytes) if self.kv_pool_bytes > 0 else 80 * 2**30
        link = CPU_LINK_BPS if cpu else GPU_LINK_BPS
        return HardwareProfile(hbm_bytes=pool, link_h2d_bps=link, link_d2h_bps=link,
                               prefill_flops=CPU_PREFILL_FLOPS if cpu else GPU_PREFILL_FLOPS)

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "EngineFacts":
        """Raises ValueError for a missing or bad field."""
        try:
            f = cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})
        except TypeError as exc:
            raise ValueError(f"engine facts: {exc}") from None
        for k in ("layers", "kv_heads", "head_dim", "dtype_bytes", "params"):
            v = getattr(f, k)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"engine facts: {k} must be positive, got {v!r}")
        return f


def hf_config_of(model: str) -> Any | None:
    """The Hugging Face config of a model the engine loaded (a local folder or
    the local cache only: nothing is downloaded), or None."""
    try:
        from transformers import AutoConfig
        return AutoConfig.from_pretrained(model, local_files_only=True, trust_remote_code=False)
    except Exception:
        return None


@dataclass(frozen=True)
class Pricing:
    """What the policy prices pauses with, and where it came from ("engine" or "preset")."""
    geometry: ModelGeometry
    node: HardwareProfile
    source: str


def resolve(*, model: str | None, node: str | None, facts: EngineFacts | None) -> Pricing:
    """The geometry and node to price with: the ``model``/``node`` presets when
    given (what-ifs), else the engine's facts.  Raises ValueError when neither
    names the model (or for an unknown preset)."""
    from kvtier.tiering.presets import get_node, get_preset
    if model is not None:
        geo, source = get_preset(model), "preset"
    elif facts is not None:
        geo, source = facts.geometry(), "engine"
    else:
        raise ValueError("the engine did not describe its model and no \"model\" preset was given")
    if node is not None:
        hw = get_node(node)
    elif facts is not None:
        hw = facts.node()
    else:
        from kvtier.tiering.presets import DEFAULT_NODE
        hw = get_node(DEFAULT_NODE)
    return Pricing(geo, hw, source)
