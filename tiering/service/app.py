"""The HTTP control plane: FastAPI app factory.

    harness ──POST observations / pause / resume──▶ ┌─────────────┐
    engine plugin ──POST decisions, GET forecast──▶ │ ServiceState│── LMDB (data dir)
    operator ──GET stats, /metrics, /docs─────────▶ └─────────────┘

``create_app(config)`` builds an app whose state (LMDB, predictor, policies)
opens at lifespan start-up and closes, flushed, at shutdown.  With a token
configured every POST needs ``Authorization: Bearer <token>``; GETs are open
(they reveal forecasts and counters, never anything a client stored).  Request
bodies are capped (413).  Every refusal is a 4xx JSON ``{"detail": message}``.
"""
from __future__ import annotations

import math
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, AsyncIterator, Optional

from fastapi import Depends, FastAPI, Path as PathParam, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from kvtier import __version__
from kvtier.tiering.model.costmodel import GB, HardwareProfile, ModelGeometry
from kvtier.tiering.model.decision import Action, Forecast

from . import models as M
from .metrics import CONTENT_TYPE, ServiceMetrics
from .security import BodyLimitMiddleware, check_token, token_matches
from .state import DecideRequest, DecisionResult, ServiceError, ServiceState, StateConfig, Unprocessable

_BIG = 1e300  # JSON has no infinity: an unbounded cost is reported as this


@dataclass(frozen=True)
class ServiceConfig:
    """Everything the app needs.  ``state.data_dir`` must be validated already."""

    state: StateConfig
    token: Optional[str] = None
    max_body_bytes: int = 64 * 1024
    state_kwargs: dict = field(default_factory=dict, compare=False)  # factories for ServiceState

    def __post_init__(self) -> None:
        if self.max_body_bytes < 1024:
            raise ValueError("max_body_bytes must be >= 1024")
        check_token(self.token)   # a padded or blank token would lock every client out

    @classmethod
    def make(cls, data_dir: str | Path, *, token: str | None = None, max_body_bytes: int = 64 * 1024,
             **state: Any) -> "ServiceConfig":
        return cls(state=StateConfig(data_dir=Path(data_dir), **state), token=token or None,
                   max_body_bytes=max_body_bytes)


Tool = Annotated[str, PathParam(pattern=M.NAME_PATTERN, description="tool name")]
TrajId = Annotated[str, PathParam(pattern=M.NAME_PATTERN, description="trajectory id")]


_bearer = HTTPBearer(auto_error=False, description="required on POSTs when the server has a token")


class _Unauthorized(Exception):
    pass


def create_app(config: ServiceConfig, **state_kwargs: Any) -> FastAPI:
    """A new app with its own metrics registry and state (opened at start-up).

    ``state_kwargs`` go to :class:`ServiceState` (predictor/policy factories,
    model resolver, clock) for embedding and tests.
    """
    metrics = ServiceMetrics()
    holder: dict[str, ServiceState] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        st = ServiceState(config.state, metrics=metrics, **{**config.state_kwargs, **state_kwargs})
        holder["state"] = st
        app.state.kvtier = st
        try:
            yield
        finally:
            st.close()

    app = FastAPI(title="kvtier control plane", version=__version__, lifespan=lifespan,
                  description="Tool-wait forecasts and KV offload decisions for agent serving.")
    app.state.metrics = metrics

    def state() -> ServiceState:
        return holder["state"]

    async def require_token(request: Request,
                            creds: Optional[HTTPAuthorizationCredentials] = Depends(_bearer)) -> None:
        if config.token is None:
            return
        if not token_matches(request.headers.get("authorization"), config.token):
            raise _Unauthorized()

    auth = [Depends(require_token)]
    errors = {400: {"description": "malformed request"}, 401: {"description": "missing or wrong bearer token"},
              413: {"description": "body too large"}, 422: {"description": "invalid field"}}

    # ------------------------------------------------------------------ errors
    @app.exception_handler(ServiceError)
    async def _service_error(request: Request, exc: ServiceError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=exc.status)

    @app.exception_handler(_Unauthorized)
    async def _unauth(request: Request, exc: _Unauthorized) -> JSONResponse:
        return JSONResponse({"detail": "missing or wrong bearer token"}, status_code=401,
                            headers={"WWW-Authenticate": "Bearer"})

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errs = [{"loc": [str(p) for p in e.get("loc", ())], "msg": str(e.get("msg", "")),
                 "type": str(e.get("type", ""))} for e in exc.errors()]
        if any(e["type"] == "json_invalid" for e in errs):
            return JSONResponse({"detail": "malformed JSON body", "errors": errs}, status_code=400)
        first = errs[0] if errs else {"loc": [], "msg": "invalid request"}
        where = ".".join(p for p in first["loc"] if p not in ("body",)) or "request"
        return JSONResponse({"detail": f"{where}: {first['msg']}", "errors": errs}, status_code=422)

    # ------------------------------------------------------------------ tools
    @app.post("/v1/tools/{tool}/observations", response_model=M.ObservationOut, dependencies=auth,
              responses=errors, tags=["tools"])
    async def observe(tool: Tool, body: M.ObservationIn) -> M.ObservationOut:
        """Record one completed tool call's duration."""
        n = state().observe(tool, body.wait_s, body.features)
        return M.ObservationOut(tool=tool, n=n)

    @app.get("/v1/tools/{tool}/forecast", response_model=M.ForecastOut, responses=errors, tags=["tools"])
    async def forecast(tool: Tool) -> M.ForecastOut:
        """The predicted distribution of the tool's next wait."""
        return _forecast_out(state().forecast(tool))

    # ------------------------------------------------------------------ decisions
    @app.post("/v1/decisions", response_model=M.DecisionOut, dependencies=auth, responses=errors,
              tags=["decisions"])
    async def decide(body: M.DecisionIn) -> M.DecisionOut:
        """Price one pause: retain, offload to host or NVMe, or recompute; and when to prefetch."""
        return _decision_out(state().decide(_decide_request(body, body.context_tokens, body.model)))

    # ------------------------------------------------------------------ trajectories
    @app.post("/v1/trajectories/{trajectory_id}/pause", response_model=M.PauseOut, dependencies=auth,
              responses={**errors, 409: {"description": "already paused"}}, tags=["trajectories"])
    async def pause(trajectory_id: TrajId, body: M.PauseIn) -> M.PauseOut:
        """A trajectory pauses for a tool; with context_tokens and model, decide too."""
        if (body.context_tokens is None) != (body.model is None):
            raise ServiceError("context_tokens and model go together: give both (to decide) or neither")
        req = None if body.model is None else _decide_request(body, body.context_tokens or 0, body.model)
        res = state().pause(trajectory_id, body.tool, req, body.features)
        return M.PauseOut(trajectory_id=trajectory_id, tool=body.tool, paused_at=res.record.paused_at,
                          decision=None if res.decision is None else _decision_out(res.decision))

    @app.post("/v1/trajectories/{trajectory_id}/resume", response_model=M.ResumeOut, dependencies=auth,
              responses={**errors, 404: {"description": "not paused"},
                         410: {"description": "lost across a restart"}}, tags=["trajectories"])
    async def resume(trajectory_id: TrajId, body: Optional[M.ResumeIn] = None) -> M.ResumeOut:
        """The tool returned: records the wait (server-measured unless given) and feeds the predictor."""
        b = body or M.ResumeIn()
        res = state().resume(trajectory_id, wait_s=b.wait_s, stall_s=b.stall_s)
        return M.ResumeOut(trajectory_id=trajectory_id, tool=res.record.tool, wait_s=res.wait_s,
                           action=res.record.action, restored=res.restored,
                           forecast_p50_s=_finite_or_none(res.record.forecast_p50))

    @app.post("/v1/trajectories/{trajectory_id}/lease", response_model=M.LeaseOut, dependencies=auth,
              responses={**errors, 404: {"description": "not paused"}}, tags=["trajectories"])
    async def lease(trajectory_id: TrajId, body: Optional[M.LeaseIn] = None) -> M.LeaseOut:
        """The lease (demote_at_s) ran out with the tool still running: re-decide from the current
        placement with the wait conditioned on having lasted this long (HBM -> host -> NVMe)."""
        b = body or M.LeaseIn()
        res = state().lease_expired(trajectory_id, b.elapsed_s)
        r = res.record
        return M.LeaseOut(trajectory_id=trajectory_id, action=r.action, changed=res.changed,
                          elapsed_s=res.elapsed_s, prefetch_at_s=r.prefetch_at_s, demote_at_s=r.demote_at_s,
                          reason="" if res.decision is None else str(res.decision.reason or ""))

    @app.get("/v1/trajectories/lost", response_model=list[M.LostOut], tags=["trajectories"])
    async def lost() -> list[M.LostOut]:
        """Trajectories paused before a restart and not restored, with the reason."""
        return [M.LostOut(trajectory_id=k, tool=v.get("tool"), reason=v.get("reason", ""))
                for k, v in state().lost().items()]

    # ------------------------------------------------------------------ operations
    @app.get("/v1/stats", response_model=M.StatsOut, tags=["operations"])
    async def stats() -> M.StatsOut:
        return M.StatsOut(**state().stats())

    @app.get("/metrics", tags=["operations"], response_class=Response,
             responses={200: {"content": {CONTENT_TYPE.split(";")[0]: {}}, "description": "Prometheus text"}})
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/healthz", response_model=M.HealthOut, tags=["operations"])
    async def healthz() -> M.HealthOut:
        return M.HealthOut(status="ok", boot=state().boot)

    from .prefix_api import register as register_prefix
    register_prefix(app, auth, errors)

    app.add_middleware(BodyLimitMiddleware, max_bytes=config.max_body_bytes)
    return app


# ----------------------------------------------------------------------------- conversions
def _decide_request(body: Any, context_tokens: int, model: Any) -> DecideRequest:
    geometry: str | ModelGeometry
    if isinstance(model, M.GeometryIn):
        try:
            geometry = ModelGeometry(**model.model_dump())
        except ValueError as exc:
            raise Unprocessable(str(exc)) from None
        if geometry.token_bytes <= 0:
            raise Unprocessable(f"model geometry {geometry.name!r} stores 0 bytes per token")
    else:
        geometry = model
    hw: str | HardwareProfile | None = None
    if isinstance(body.hardware, str):
        hw = body.hardware
    elif body.hardware is not None:
        h = body.hardware
        try:
            hw = HardwareProfile(hbm_bytes=h.hbm_gb * GB, link_h2d_bps=h.link_gbps * GB,
                                 link_d2h_bps=(h.link_d2h_gbps or h.link_gbps) * GB,
                                 prefill_flops=h.prefill_tflops * 1e12, nvme_read_bps=h.nvme_gbps * GB,
                                 nvme_write_bps=(h.nvme_write_gbps or h.nvme_gbps) * GB,
                                 host_bytes=h.host_gb * GB, nvme_bytes=h.nvme_gb * GB,
                                 weights_bytes=h.weights_gb * GB, runtime_bytes=h.runtime_gb * GB)
        except ValueError as exc:
            raise Unprocessable(str(exc)) from None
    return DecideRequest(
        tool=body.tool, context_tokens=context_tokens, model=geometry, stored_tokens=body.stored_tokens,
        hbm_pressure=body.hbm_pressure,
        host_free_bytes=math.inf if body.host_free_bytes is None else float(body.host_free_bytes),
        nvme_free_bytes=math.inf if body.nvme_free_bytes is None else float(body.nvme_free_bytes),
        hardware=hw, policy=body.policy, features=body.features)


def _finite_or_none(x: Optional[float]) -> Optional[float]:
    return None if x is None or not math.isfinite(x) else float(x)


def _bounded(x: float) -> float:
    if math.isnan(x):
        return _BIG
    return max(-_BIG, min(_BIG, float(x)))


def _forecast_out(fc: Forecast) -> M.ForecastOut:
    q = fc.quantiles
    return M.ForecastOut(tool=fc.tool, n=int(fc.n), mean_s=_bounded(fc.mean_s),
                         quantiles=M.Quantiles(**{k: _bounded(q[k]) for k in ("p10", "p50", "p90", "p99")}),
                         source=str(fc.source))


def _decision_out(r: DecisionResult) -> M.DecisionOut:
    d = r.decision
    return M.DecisionOut(action=Action(d.action).value, prefetch_at_s=_finite_or_none(d.prefetch_at_s),
                         demote_at_s=_finite_or_none(d.demote_at_s), expected_cost=_bounded(d.expected_cost),
                         kv_bytes=r.kv_bytes, policy=r.policy, reason=str(d.reason or ""),
                         prefetch_reason=r.prefetch_reason,
                         forecast=None if r.forecast is None else _forecast_out(r.forecast))
