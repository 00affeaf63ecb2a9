"""Request and response bodies of the HTTP API (pydantic v2), every field bounded.

Names and shapes follow DESIGN.md ("HTTP"); fields beyond those are additive.
Bounds exist so that no well-formed request can make the service do
unbounded work or store unbounded data: strings are length-capped and
pattern-checked, numbers are finite and range-checked, maps are size-capped.
Unknown fields are refused (``extra="forbid"``) so typos surface as 422s, and
request bodies are strictly typed (no ``"1"`` -> 1.0, no ``true`` -> 1).
"""
from __future__ import annotations

from typing import Annotated, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

# Tool names and trajectory ids travel in URL paths and become LMDB keys
# (never file names): printable, no slash, no whitespace.
NAME_PATTERN = r"^[A-Za-z0-9_.:@+\-]{1,128}$"
MAX_WAIT_S = 30 * 24 * 3600.0        # a month: longer than any human-in-the-loop wait worth tracking
MAX_CONTEXT_TOKENS = 16_000_000
MAX_FEATURES = 8          # as kvtier.tiering.forecasting.predictor accepts

Name = Annotated[str, StringConstraints(pattern=NAME_PATTERN)]
# Feature names and values: 1-64 printable characters, no "=" (the predictor's key syntax).
FeatureKey = Annotated[str, StringConstraints(pattern=r"^[^\x00-\x1f\x7f=]{1,64}$")]
FeatureValue = FeatureKey
Features = Annotated[dict[FeatureKey, FeatureValue], Field(max_length=MAX_FEATURES)]
WaitS = Annotated[float, Field(ge=0.0, le=MAX_WAIT_S, allow_inf_nan=False)]

ActionName = Literal["retain", "offload_host", "offload_nvme", "recompute"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class _Request(_Strict):
    """A request body: strict types, so ``"1"`` or ``true`` is not a number and ``2.0`` is not an
    integer (an int is still a valid float).  Every model a client sends derives from this."""
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)


class ObservationIn(_Request):
    """A completed tool call's duration, reported by a harness."""
    wait_s: WaitS = Field(description="how long the tool ran, seconds")
    features: Optional[Features] = Field(default=None, description="coarse tool features (command head, ...)")


class ObservationOut(_Strict):
    tool: str
    n: int = Field(description="observations of this tool after this one")


class Quantiles(_Strict):
    p10: float
    p50: float
    p90: float
    p99: float


class ForecastOut(_Strict):
    tool: str
    n: int = Field(ge=0, description="observations behind the forecast")
    mean_s: float
    quantiles: Quantiles
    source: str = Field(description='which level answered: "tool+features", "tool", "global" or "prior"')


class GeometryIn(_Request):
    """A model's KV geometry (alternative to a preset name)."""
    name: Annotated[str, StringConstraints(max_length=128)] = "custom"
    layers: int = Field(ge=1, le=1024)
    kv_heads: int = Field(ge=1, le=1024)
    head_dim: int = Field(ge=1, le=4096)
    dtype_bytes: float = Field(ge=0.25, le=8.0, description="bytes per stored KV element (0.5 for FP4)")
    params: float = Field(gt=0.0, le=1e14, description="parameter count")
    mla_latent_dim: Optional[int] = Field(default=None, ge=1, le=65536)
    d_model: Optional[int] = Field(default=None, ge=1, le=1_000_000)
    active_params: Optional[float] = Field(default=None, gt=0.0, le=1e14,
                                           description="MoE: parameters a token computes with (<= params)")


class HardwareIn(_Request):
    """Override of the server's node profile for one decision (GB = 1e9 bytes)."""
    hbm_gb: float = Field(gt=0.0, le=1e6)
    link_gbps: float = Field(gt=0.0, le=1e5, description="host->device GB/s (and device->host unless given)")
    link_d2h_gbps: Optional[float] = Field(default=None, gt=0.0, le=1e5)
    prefill_tflops: float = Field(gt=0.0, le=1e7)
    nvme_gbps: float = Field(default=7.0, gt=0.0, le=1e5, description="NVMe read GB/s (and write unless given)")
    nvme_write_gbps: Optional[float] = Field(default=None, gt=0.0, le=1e5)
    host_gb: float = Field(default=1024.0, ge=0.0, le=1e9)
    nvme_gb: float = Field(default=8000.0, ge=0.0, le=1e12)
    weights_gb: float = Field(default=0.0, ge=0.0, le=1e6)
    runtime_gb: float = Field(default=0.0, ge=0.0, le=1e6)


ModelField = Union[Annotated[str, StringConstraints(pattern=NAME_PATTERN)], GeometryIn]
HardwareField = Union[Annotated[str, StringConstraints(pattern=NAME_PATTERN)], HardwareIn]


class DecisionIn(_Request):
    """One pause to price.  ``model`` is a preset name or a geometry."""
    tool: Name
    context_tokens: int = Field(ge=0, le=MAX_CONTEXT_TOKENS)
    model: ModelField
    stored_tokens: int = Field(default=0, ge=0, le=MAX_CONTEXT_TOKENS,
                               description="prefix tokens already in a lower tier (not moved again)")
    hbm_pressure: float = Field(default=0.0, ge=0.0, le=1.0)
    host_free_bytes: Optional[int] = Field(default=None, ge=0, le=2**62)
    nvme_free_bytes: Optional[int] = Field(default=None, ge=0, le=2**62)
    hardware: Optional[HardwareField] = Field(default=None, description="node preset name or a profile; default: the server's")
    policy: Optional[Name] = Field(default=None, description="policy name; default: the server's")
    features: Optional[Features] = None


class DecisionOut(_Strict):
    action: ActionName
    prefetch_at_s: Optional[float] = Field(description="seconds after the pause to start the reload; null: "
                                           "nothing to reload, or reload when the tool returns (see prefetch_reason)")
    prefetch_reason: Optional[str] = Field(default=None, description="why an offload has no prefetch time")
    expected_cost: float
    demote_at_s: Optional[float] = None
    kv_bytes: int
    policy: str
    reason: str = ""
    forecast: Optional[ForecastOut] = None


class PauseIn(_Request):
    """A trajectory pauses for ``tool``.  With ``context_tokens`` and ``model``
    the service also decides (the answer carries the decision)."""
    tool: Name
    context_tokens: Optional[int] = Field(default=None, ge=0, le=MAX_CONTEXT_TOKENS)
    model: Optional[ModelField] = None
    stored_tokens: int = Field(default=0, ge=0, le=MAX_CONTEXT_TOKENS)
    hbm_pressure: float = Field(default=0.0, ge=0.0, le=1.0)
    host_free_bytes: Optional[int] = Field(default=None, ge=0, le=2**62)
    nvme_free_bytes: Optional[int] = Field(default=None, ge=0, le=2**62)
    hardware: Optional[HardwareField] = Field(default=None, description="node preset name or a profile; default: the server's")
    policy: Optional[Name] = None
    features: Optional[Features] = None


class PauseOut(_Strict):
    trajectory_id: str
    tool: str
    paused_at: float = Field(description="server wall clock, seconds since the epoch")
    decision: Optional[DecisionOut] = None


class ResumeIn(_Request):
    """The tool returned.  ``wait_s`` overrides the server-measured wait (a
    harness that timed the tool itself knows better); ``stall_s`` is the
    resume stall the engine saw (state not back in time)."""
    wait_s: Optional[WaitS] = None
    stall_s: Optional[WaitS] = None


class ResumeOut(_Strict):
    trajectory_id: str
    tool: str
    wait_s: float
    action: Optional[ActionName] = None
    restored: bool = Field(description="paused before a service restart and restored from disk")
    forecast_p50_s: Optional[float] = None


class LeaseIn(_Request):
    """The decision's lease (``demote_at_s``) expired with the tool still running."""
    elapsed_s: Optional[WaitS] = Field(default=None, description="seconds since the pause; default: server clock")


class LeaseOut(_Strict):
    trajectory_id: str
    action: ActionName = Field(description="the placement now (changed or kept)")
    changed: bool = Field(description="the placement moved (e.g. host -> NVMe): move the KV accordingly")
    elapsed_s: float
    prefetch_at_s: Optional[float] = Field(description="seconds after the pause")
    demote_at_s: Optional[float] = Field(description="the next lease expiry, seconds after the pause")
    reason: str = ""


class TierStats(_Strict):
    trajectories: int
    bytes: int


class StatsOut(_Strict):
    boot: int = Field(description="service start counter (persisted)")
    uptime_s: float
    tools: int = Field(description="distinct tool names kept (at most max_tools)")
    tools_folded: int = Field(0, description="tools folded into their class prior past max_tools")
    observations: int
    paused: int
    restored_after_restart: int
    lost_after_restart: int
    decisions: dict[str, int]
    tiers: dict[str, TierStats]
    policy: str
    predictor: str


class LostOut(_Strict):
    trajectory_id: str
    tool: Optional[str] = None
    reason: str


class HealthOut(_Strict):
    status: Literal["ok"]
    boot: int
