"""Arithmetic of KV state: footprint, reload vs recompute, hold cost, break-even.

No torch, no store: bytes, seconds and FLOP/s only.  Units: bytes (int),
seconds (float), bandwidth in bytes per second, compute in FLOP/s.
GB means 10**9 bytes throughout (the reference texts' convention).

This module is the contract other packages code against (policy, simulator,
service).  Names and signatures here are stable; add around them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

GB = 1e9
TFLOP = 1e12


@dataclass(frozen=True)
class ModelGeometry:
    """Shape of a model's KV cache.

    ``dtype_bytes`` is bytes per stored KV element (2 for bf16/fp16, 1 for FP8).
    ``params`` is the parameter count (for recompute FLOPs, 2*params per token).
    ``mla_latent_dim``: for MLA models (DeepSeek-V3) the per-layer cached latent
    width (kv_lora_rank + rope head dim); then one latent vector per layer per
    token is stored instead of K and V per KV head.
    ``d_model`` is only needed for the optional quadratic attention term.
    ``active_params`` (MoE models) is the parameter count a token actually
    computes with; recompute FLOPs use it when set, weights use ``params``.
    """

    name: str
    layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: float
    params: float
    mla_latent_dim: int | None = None
    d_model: int | None = None
    active_params: float | None = None

    def __post_init__(self) -> None:
        for field in ("layers", "kv_heads", "head_dim", "dtype_bytes", "params"):
            v = getattr(self, field)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"model geometry: {field} must be a positive number, got {v!r}")
        if self.mla_latent_dim is not None and self.mla_latent_dim <= 0:
            raise ValueError(f"model geometry: mla_latent_dim must be positive, got {self.mla_latent_dim!r}")
        if self.d_model is not None and self.d_model <= 0:
            raise ValueError(f"model geometry: d_model must be positive, got {self.d_model!r}")
        if self.active_params is not None and not (0 < self.active_params <= self.params):
            raise ValueError(f"model geometry: active_params must be in (0, params], got {self.active_params!r}")
        if self.token_bytes < 1:
            # e.g. dtype_bytes=1e-9: every byte count and bandwidth ratio downstream would be 0
            raise ValueError(f"model geometry: {self.name!r} stores less than one byte of KV per token "
                             f"(layers x heads x head_dim x dtype_bytes too small)")

    @property
    def compute_params(self) -> float:
        """Parameters a prefill token computes with (active ones for MoE)."""
        return self.params if self.active_params is None else self.active_params

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

    def weights_bytes(self, bytes_per_param: float = 2.0) -> float:
        """Node-wide weight footprint N_params * b_weight (equation 4 with TP = PP = 1)."""
        if not (bytes_per_param > 0):
            raise ValueError(f"bytes per parameter must be positive, got {bytes_per_param!r}")
        return self.params * bytes_per_param


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


def t_nvme_roundtrip(nbytes: float, hw: HardwareProfile) -> float:
    """HBM -> host -> NVMe and back, serially: egress + NVMe write + NVMe read + ingress."""
    return t_offload(nbytes, hw) + t_nvme_write(nbytes, hw) + t_nvme_read(nbytes, hw) + t_reload(nbytes, hw)


def t_recompute(geom: ModelGeometry, tokens: int, hw: HardwareProfile, *, quadratic: bool = False) -> float:
    """Prefill time to rebuild ``tokens`` of state: 2*P*S FLOPs (+ 4*L*S^2*d_model if ``quadratic``).

    P is ``geom.compute_params`` (the active parameters of an MoE model).
    Raises ValueError for a negative token count, or for ``quadratic`` without d_model.
    """
    if tokens < 0:
        raise ValueError(f"token count must be >= 0, got {tokens}")
    flops = 2.0 * geom.compute_params * tokens
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


# ---------------------------------------------------------------------------
# One pause priced, and the point-estimate decision rule.

RETAIN, OFFLOAD_HOST, OFFLOAD_NVME, RECOMPUTE = "retain", "offload_host", "offload_nvme", "recompute"
"""Action names; equal to ``kvtier.tiering.model.decision.Action`` values (kept as strings
so this module never imports the policy layer)."""

DEFAULT_NVME_MAX_SHARE = 0.01
"""offload_nvme needs its serial round trip to be at most this share of the wait."""


@dataclass(frozen=True)
class PausePrice:
    """The transfer and rebuild times of one paused trajectory (immutable).

    ``t_nvme_roundtrip_s`` is None when the NVMe tier is not considered.
    """

    context_tokens: int
    kv_bytes: int
    t_reload_s: float
    t_roundtrip_s: float
    t_recompute_s: float
    breakeven_wait_s: float
    t_nvme_roundtrip_s: float | None = None
    nvme_max_share: float = DEFAULT_NVME_MAX_SHARE
    stall_s: float = 0.0

    @property
    def reload_speedup(self) -> float:
        """How many times faster reloading (one way) is than recomputing."""
        return self.t_recompute_s / self.t_reload_s if self.t_reload_s > 0 else math.inf

    @property
    def recompute_beats_roundtrip(self) -> bool:
        return self.t_recompute_s <= self.t_roundtrip_s

    @property
    def retain_until_s(self) -> float:
        """The longest wait for which retain is chosen.

        The seed's break-even (offload's alternative) unless recompute is the
        cheaper way out, then the recompute time plus the tolerated stall
        (the same comparison with recompute in place of the round trip).
        """
        if self.recompute_beats_roundtrip:
            return self.t_recompute_s + self.stall_s
        return self.breakeven_wait_s

    def action(self, wait_s: float) -> str:
        """The point-estimate rule for a known wait (pure; raises ValueError for wait < 0).

        1. ``wait <= retain_until_s``        -> retain (moving or rebuilding cannot pay back).
        2. ``t_recompute <= t_roundtrip``    -> recompute (rebuilding beats moving).
        3. NVMe considered, its serial round trip ``<= nvme_max_share * wait``
           and shorter than recompute       -> offload_nvme (frees host DRAM too).
        4. otherwise                         -> offload_host.
        """
        if not (wait_s >= 0 and math.isfinite(wait_s)):
            raise ValueError(f"wait must be a finite number >= 0 seconds, got {wait_s!r}")
        if wait_s <= self.retain_until_s:
            return RETAIN
        if self.recompute_beats_roundtrip:
            return RECOMPUTE
        nv = self.t_nvme_roundtrip_s
        if nv is not None and nv <= self.nvme_max_share * wait_s and nv < self.t_recompute_s:
            return OFFLOAD_NVME
        return OFFLOAD_HOST

    def offload_nvme_from_s(self) -> float | None:
        """The shortest wait that gets offload_nvme, or None if no wait does."""
        nv = self.t_nvme_roundtrip_s
        if nv is None or self.recompute_beats_roundtrip or nv >= self.t_recompute_s:
            return None
        return max(self.retain_until_s, nv / self.nvme_max_share)


def price_pause(geom: ModelGeometry, tokens: int, hw: HardwareProfile, *, mu_hbm: float = 1.0,
                mu_dram: float = 0.0, stall_s: float = 0.0, quadratic: bool = False,
                nvme: bool = False, nvme_max_share: float = DEFAULT_NVME_MAX_SHARE) -> PausePrice:
    """Price a pause at ``tokens`` of context on ``hw`` (pure).

    Raises ValueError for tokens <= 0, bad shadow prices or stall (see
    :func:`breakeven_wait`), or ``nvme_max_share`` outside (0, 1].
    """
    if tokens <= 0:
        raise ValueError(f"context must be a positive number of tokens, got {tokens}")
    if not (0 < nvme_max_share <= 1):
        raise ValueError(f"nvme_max_share must be in (0, 1], got {nvme_max_share}")
    nbytes = geom.kv_bytes(tokens)
    return PausePrice(
        context_tokens=int(tokens),
        kv_bytes=nbytes,
        t_reload_s=t_reload(nbytes, hw),
        t_roundtrip_s=t_roundtrip(nbytes, hw),
        t_recompute_s=t_recompute(geom, tokens, hw, quadratic=quadratic),
        breakeven_wait_s=breakeven_wait(nbytes, hw, mu_hbm=mu_hbm, mu_dram=mu_dram, stall_s=stall_s),
        t_nvme_roundtrip_s=t_nvme_roundtrip(nbytes, hw) if nvme else None,
        nvme_max_share=nvme_max_share,
        stall_s=stall_s,
    )
