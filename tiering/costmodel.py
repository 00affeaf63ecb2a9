"""Arithmetic of KV state: footprint, reload vs recompute, hold cost, break-even.

No torch, no store: bytes, seconds and FLOP/s only.  Units: bytes (int),
seconds (float), bandwidth in bytes per second, compute in FLOP/s.
GB means 10**9 bytes throughout (the reference texts' convention).

This module is the contract other packages code against (policy, simulator,
service).  Names and signatures here are stable; add around them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

GB = 1e9


@dataclass(frozen=True)
class ModelGeometry:
    """Shape of a model's KV cache.

    ``dtype_bytes`` is bytes per stored KV element (2 for bf16/fp16, 1 for FP8).
    ``params`` is the parameter count (for recompute FLOPs, 2*params per token).
    ``mla_latent_dim``: for MLA models (DeepSeek-V3) the per-layer cached latent
    width (kv_lora_rank + rope head dim); then one latent vector per layer per
    token is stored instead of K and V per KV head.
    ``d_model`` is only needed for the optional quadratic attention term.
    """

    name: str
    layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: float
    params: float
    mla_latent_dim: int | None = None
    d_model: int | None = None

    def __post_init__(self) -> None:
        for field in ("layers", "kv_heads", "head_dim", "dtype_bytes", "params"):
            v = getattr(self, field)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"model geometry: {field} must be a positive number, got {v!r}")
        if self.mla_latent_dim is not None and self.mla_latent_dim <= 0:
            raise ValueError(f"model geometry: mla_latent_dim must be positive, got {self.mla_latent_dim!r}")

    @property
    def token_bytes(self) -> int:
        """m_token: KV bytes per token across all layers (equation 1; MLA: one latent per layer)."""
        if self.mla_latent_dim is not None:
            return int(round(self.layers * self.mla_latent_dim * self.dtype_bytes))
        return int(round(2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes))

    def kv_bytes(self, tokens: int) -> int:
        """M_KV = S * m_token."""
        if tokens < 0:
            raise ValueError(f"token count must be >= 0, got {tokens}")
        return int(tokens) * self.token_bytes

    def with_dtype(self, dtype_bytes: float) -> "ModelGeometry":
        return replace(self, dtype_bytes=dtype_bytes)


@dataclass(frozen=True)
class HardwareProfile:
    """A serving node (all figures node-wide, i.e. summed over its accelerators).

    link_*: host<->device DMA bandwidth each way, bytes/s.
    nvme_*: NVMe tier bandwidth, bytes/s.  prefill_flops: sustained FLOP/s.
    """

    hbm_bytes: float
    link_h2d_bps: float
    link_d2h_bps: float
    prefill_flops: float
    nvme_read_bps: float = 7 * GB
    nvme_write_bps: float = 5 * GB
    host_bytes: float = 1024 * GB
    nvme_bytes: float = 8000 * GB
    weights_bytes: float = 0.0
    runtime_bytes: float = 0.0

    def __post_init__(self) -> None:
        for field in ("hbm_bytes", "link_h2d_bps", "link_d2h_bps", "prefill_flops",
                      "nvme_read_bps", "nvme_write_bps"):
            v = getattr(self, field)
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"hardware profile: {field} must be a positive number, got {v!r}")
        for field in ("host_bytes", "nvme_bytes", "weights_bytes", "runtime_bytes"):
            v = getattr(self, field)
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"hardware profile: {field} must be >= 0, got {v!r}")

    @property
    def kv_pool_bytes(self) -> float:
        """Equation 5: HBM left for the paged KV pool."""
        return self.hbm_bytes - self.weights_bytes - self.runtime_bytes


def t_offload(nbytes: float, hw: HardwareProfile) -> float:
    """Device -> host egress time (T_egress)."""
    return nbytes / hw.link_d2h_bps


def t_reload(nbytes: float, hw: HardwareProfile) -> float:
    """Host -> device ingress time (T_ingress = M_KV / B)."""
    return nbytes / hw.link_h2d_bps


def t_roundtrip(nbytes: float, hw: HardwareProfile) -> float:
    """Out and back over the host link (2 M_KV / B for a symmetric link)."""
    return t_offload(nbytes, hw) + t_reload(nbytes, hw)


def t_nvme_write(nbytes: float, hw: HardwareProfile) -> float:
    return nbytes / hw.nvme_write_bps


def t_nvme_read(nbytes: float, hw: HardwareProfile) -> float:
    return nbytes / hw.nvme_read_bps


def t_recompute(geom: ModelGeometry, tokens: int, hw: HardwareProfile, *, quadratic: bool = False) -> float:
    """Prefill time to rebuild ``tokens`` of state: 2*P*S FLOPs (+ 4*L*S^2*d_model if ``quadratic``)."""
    flops = 2.0 * geom.params * tokens
    if quadratic:
        if geom.d_model is None:
            raise ValueError(f"model {geom.name!r} has no d_model; the quadratic attention term needs it")
        flops += 4.0 * geom.layers * float(tokens) ** 2 * geom.d_model
    return flops / hw.prefill_flops


def hold_gb_s(nbytes: float, wait_s: float) -> float:
    """Tool-wait memory tax C_hold = M_KV * T_wait, in GB*s."""
    return nbytes / GB * wait_s


def breakeven_wait(nbytes: float, hw: HardwareProfile, *, mu_hbm: float = 1.0,
                   mu_dram: float = 0.0, stall_s: float = 0.0) -> float:
    """The seed's break-even wait: T* = 2 M/B * mu_hbm/(mu_hbm - mu_dram) + dT_stall.

    Uses the round trip over the host link (egress + ingress).  Requires
    mu_hbm > mu_dram >= 0 (holding in HBM must cost more than in DRAM).
    """
    if not (mu_hbm > mu_dram >= 0):
        raise ValueError(f"shadow prices need mu_hbm > mu_dram >= 0, got {mu_hbm}, {mu_dram}")
    if stall_s < 0:
        raise ValueError(f"tolerated stall must be >= 0, got {stall_s}")
    return t_roundtrip(nbytes, hw) * (mu_hbm / (mu_hbm - mu_dram)) + stall_s
