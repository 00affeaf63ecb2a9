"""The served model's KV geometry and the node's speeds, from the engine itself.

This is the one place an engine plugin reads model geometry from: a Hugging
Face config's KV shape (:func:`kv_shape`: the transformers hook), vLLM's
config (:func:`facts_from_vllm`, or :func:`facts_from_vllm_spec` with the
offloading spec alone) and SGLang's host pool (:func:`facts_from_sglang_pool`).

The policy prices a pause in bytes and seconds: the KV bytes per token, the
parameters a recompute runs through, the host link and the prefill speed.
Engines know the first two exactly (vLLM's model and KV-cache spec, SGLang's
host pool); this module turns what they know into kvtier's
:class:`~kvtier.tiering.model.costmodel.ModelGeometry`, so any model gets the
forecast.  The ``model``/``node`` presets of the plugin config stay as
what-if overrides (:func:`resolve`).

Parameters come from the model's Hugging Face config (the engine's own, or
read from the model's local folder): embeddings, attention, MLP (MoE experts
and the active share), norms and the LM head.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping

from kvtier.tiering.model.costmodel import GB, TFLOP, HardwareProfile, ModelGeometry

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
    device: "cpu", "cuda", ... (the engine's platform).
    nvme_read_bps / nvme_write_bps / link_bps / host_bytes: measured on this
    node (:func:`measure_node`) or known from the tier (its host frames); None:
    the device class's figures (:meth:`node`)."""
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
    nvme_read_bps: float | None = None
    nvme_write_bps: float | None = None
    link_bps: float | None = None
    host_bytes: float | None = None

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
        link = self.link_bps or (CPU_LINK_BPS if cpu else GPU_LINK_BPS)
        hw = HardwareProfile(hbm_bytes=pool, link_h2d_bps=link, link_d2h_bps=link,
                             prefill_flops=CPU_PREFILL_FLOPS if cpu else GPU_PREFILL_FLOPS)
        measured = {k: v for k, v in (("nvme_read_bps", self.nvme_read_bps), ("nvme_write_bps", self.nvme_write_bps),
                                      ("host_bytes", self.host_bytes)) if v}
        return replace(hw, **measured) if measured else hw

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
        for k in ("nvme_read_bps", "nvme_write_bps", "link_bps", "host_bytes"):
            v = getattr(f, k)
            if v is not None and not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"engine facts: {k} must be positive or absent, got {v!r}")
        return f


PROBE_BYTES = 4 << 20
PROBE_FILE = ".kvtier-speed-probe"


def _aligned(nbytes: int) -> memoryview:
    import mmap
    return memoryview(mmap.mmap(-1, nbytes))   # page-aligned, as O_DIRECT wants


def measure_disk_bps(folder: Path, *, nbytes: int = PROBE_BYTES, chunk: int = 1 << 20) -> tuple[float, float]:
    """(read, write) bytes per second of the file system under ``folder``, as
    the store uses it: ``nbytes`` written in ``chunk`` pieces and synced, then
    read back, with O_DIRECT where the file system takes it (else buffered,
    the pages dropped from the page cache first).  The probe file is removed.
    Raises OSError when the folder cannot be written."""
    chunk = max(4096, chunk // 4096 * 4096)
    nbytes = max(chunk, nbytes // chunk * chunk)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / PROBE_FILE
    buf = _aligned(chunk)
    buf[:] = os.urandom(chunk)
    flags = os.O_RDWR | os.O_CREAT | os.O_TRUNC
    direct = getattr(os, "O_DIRECT", 0)
    try:
        try:
            fd = os.open(path, flags | direct)
        except OSError:
            fd, direct = os.open(path, flags), 0
        try:
            t0 = time.perf_counter()
            for off in range(0, nbytes, chunk):
                os.pwrite(fd, buf, off)
            os.fsync(fd)
            t_write = time.perf_counter() - t0
            if not direct and hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fd, 0, nbytes, os.POSIX_FADV_DONTNEED)
            t0 = time.perf_counter()
            for off in range(0, nbytes, chunk):
                os.preadv(fd, [buf], off)
            t_read = time.perf_counter() - t0
        finally:
            os.close(fd)
    finally:
        path.unlink(missing_ok=True)
    return nbytes / max(t_read, 1e-9), nbytes / max(t_write, 1e-9)


def measure_copy_bps(*, nbytes: int = PROBE_BYTES, repeats: int = 3) -> float:
    """Bytes per second of a host memory copy (the CPU platform's "link":
    engine KV tensors and host frames are both host memory); the best of
    ``repeats`` copies of ``nbytes``."""
    import numpy as np
    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.empty_like(src)
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return nbytes / max(best, 1e-9)


def measure_node(facts: EngineFacts, folder: Path, *, host_bytes: float | None = None,
                 chunk: int = 1 << 20, nvme_cap_bps: float | None = None) -> EngineFacts:
    """``facts`` with this node's measured speeds: the read and write rate of
    the file system under ``folder`` (where the store's NVMe tier lives) in
    pieces of ``chunk`` bytes (the store's block), on
    the CPU platform also a host memory copy's rate as the link, and the host
    tier's size ``host_bytes`` when given.  ``nvme_cap_bps``: the store's
    throttle (``StoreConfig.nvme_throttle_gbps``), which caps both NVMe rates.  A failed disk probe leaves the
    device class's NVMe figures (the store reports its own errors).  About
    0.1 s on a VM disk; call it once, at start."""
    out = replace(facts, host_bytes=float(host_bytes) if host_bytes else facts.host_bytes)
    try:
        read, write = measure_disk_bps(folder, chunk=chunk)
        out = replace(out, nvme_read_bps=read, nvme_write_bps=write)
    except OSError:
        pass
    if nvme_cap_bps:
        out = replace(out, nvme_read_bps=min(out.nvme_read_bps or nvme_cap_bps, nvme_cap_bps),
                      nvme_write_bps=min(out.nvme_write_bps or nvme_cap_bps, nvme_cap_bps))
    if facts.device == "cpu":
        out = replace(out, link_bps=measure_copy_bps())
    return out


@dataclass(frozen=True)
class KvShape:
    """A decoder's KV per token, whole model: layers, KV heads, head size."""
    layers: int
    kv_heads: int
    head_dim: int


def text_config(config: Any) -> Any:
    """The decoder's part of a Hugging Face config (a multimodal model's text
    config; the config itself for a plain decoder)."""
    get = getattr(config, "get_text_config", None)     # transformers' own accessor, where it has one
    if callable(get):
        return get(decoder=True)
    return getattr(config, "text_config", None) or config


def kv_shape(config: Any) -> KvShape:
    """Layers, KV heads and head size of a Hugging Face decoder config (grouped-query
    heads and an explicit ``head_dim`` honoured).  Raises AttributeError or
    TypeError for a config without heads, layers or hidden size."""
    cfg = text_config(config)
    heads = int(cfg.num_attention_heads)
    return KvShape(layers=int(cfg.num_hidden_layers),
                   kv_heads=int(getattr(cfg, "num_key_value_heads", None) or heads),
                   head_dim=int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads))


def layer_types(config: Any) -> tuple[str, ...]:
    """Each decoder layer's attention kind ("full_attention", "sliding_attention",
    ...) where a Hugging Face config names them; () where it does not (all full)."""
    return tuple(getattr(text_config(config), "layer_types", None) or ())


def facts_from_vllm(vllm_config: Any, kv_cache_config: Any = None, *, device: str) -> EngineFacts:
    """The served model's geometry from vLLM's own config (``device``: vLLM's
    platform).  Raises ValueError (or AttributeError on an unexpected config)
    when it cannot."""
    mc, pc = vllm_config.model_config, vllm_config.parallel_config
    hf = getattr(mc, "hf_text_config", None) or mc.hf_config
    params, active = params_of(hf)
    layers = int(mc.get_num_layers(pc))
    kv_heads = int(mc.get_total_num_kv_heads())
    cache_dtype = getattr(vllm_config.cache_config, "cache_dtype", "auto")
    db = dtype_bytes(mc.dtype if cache_dtype in (None, "auto") else cache_dtype)
    pool = 0
    if kv_cache_config is not None:
        pool = sum(int(getattr(t, "size", 0)) for t in getattr(kv_cache_config, "kv_cache_tensors", ()) or ())
    return EngineFacts(name=str(mc.model), layers=layers * int(pc.pipeline_parallel_size), kv_heads=kv_heads,
                       head_dim=int(mc.get_head_size()), dtype_bytes=db, params=params, active_params=active,
                       kv_pool_bytes=pool * int(pc.tensor_parallel_size), device=device)


def facts_from_vllm_spec(spec_cfg: Any, *, token_bytes: int | None, device: str) -> EngineFacts | None:
    """Facts from vLLM's normalized offloading config plus the model's local
    HF config (the offloading spec used without kvtier's connector); None when
    unreadable."""
    try:
        name = spec_cfg.model.name
        hf = hf_config_of(name)
        if hf is None:
            return None
        params, active = params_of(hf)
        shape = kv_shape(hf)
        return EngineFacts(name=name, layers=sum(len(g.layer_names) for g in spec_cfg.groups),
                           kv_heads=shape.kv_heads, head_dim=shape.head_dim,
                           dtype_bytes=dtype_bytes(spec_cfg.model.dtype), params=params, active_params=active,
                           token_bytes=token_bytes, device=device)
    except Exception:
        return None


def facts_from_sglang_pool(model_name: str, pool: Any, *, tp: int, dtype: Any, page_bytes: int,
                           page_size: int) -> EngineFacts:
    """Facts from SGLang's host KV pool (one rank's layers and heads; ``tp``
    ranks) and the model's local config (parameters).  Raises ValueError when
    the local config cannot be read."""
    hf = hf_config_of(model_name)
    if hf is None:
        raise ValueError(f"no local model config for {model_name!r}")
    params, active = params_of(hf)
    return EngineFacts(name=model_name or "model", layers=int(pool.layer_num),
                       kv_heads=int(getattr(pool, "head_num", 1)) * tp, head_dim=int(getattr(pool, "head_dim", 1)),
                       dtype_bytes=dtype_bytes(dtype), params=params, active_params=active,
                       token_bytes=page_bytes * tp // max(page_size, 1))


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
    from kvtier.tiering.model.presets import get_node, get_preset
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
        from kvtier.tiering.model.presets import DEFAULT_NODE
        hw = get_node(DEFAULT_NODE)
    return Pricing(geo, hw, source)
