"""Python client of the kvtier control plane (``kvtier serve``), sync and async.

Engine plugins and agent harnesses use it to report tool calls and ask for
forecasts and pause decisions::

    with KvtierClient("http://127.0.0.1:8731", token=...) as kv:
        kv.pause("traj-7", "bash", context_tokens=12_000, model="llama-3.1-8b")
        ...                                   # the tool runs
        kv.resume("traj-7")                   # records the wait, feeds the predictor

``AsyncKvtierClient`` has the same methods as coroutines.  Both are thin:
requests are built and answers parsed by the same module-level functions, so
the two can never drift apart.  Every non-2xx answer raises a
:class:`KvtierError` subclass carrying the HTTP status and the server's
one-line message; transport failures raise ``httpx`` errors unchanged.
The token defaults to ``$KVTIER_TOKEN``.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Mapping, Union
from urllib.parse import quote

import httpx

from kvtier.tiering.model.costmodel import GB, HardwareProfile, ModelGeometry
from kvtier.tiering.model.decision import Action, Decision, Forecast

__all__ = [
    "KvtierClient", "AsyncKvtierClient", "KvtierError", "KvtierAuthError", "KvtierNotFound",
    "KvtierConflict", "KvtierGone", "KvtierBadRequest", "DecisionAnswer", "PauseAnswer", "ResumeAnswer",
    "LeaseAnswer",
]

ModelSpec = Union[str, ModelGeometry, Mapping[str, Any]]
HardwareSpec = Union[str, HardwareProfile, Mapping[str, Any], None]


# ----------------------------------------------------------------------------- errors
class KvtierError(Exception):
    """The server refused a request.  ``status``: HTTP status; ``detail``: its message."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"HTTP {status}: {detail}")
        self.status = status
        self.detail = detail


class KvtierBadRequest(KvtierError):
    """400/413/422: the request was malformed or out of bounds."""


class KvtierAuthError(KvtierError):
    """401: missing or wrong bearer token."""


class KvtierNotFound(KvtierError):
    """404: e.g. resuming a trajectory that is not paused."""


class KvtierConflict(KvtierError):
    """409: e.g. pausing a trajectory that is already paused."""


class KvtierGone(KvtierError):
    """410: the trajectory was paused before a service restart and lost."""


_BY_STATUS = {400: KvtierBadRequest, 413: KvtierBadRequest, 422: KvtierBadRequest, 401: KvtierAuthError,
              404: KvtierNotFound, 409: KvtierConflict, 410: KvtierGone}


# ----------------------------------------------------------------------------- answers
@dataclass(frozen=True)
class DecisionAnswer:
    decision: Decision
    kv_bytes: int
    policy: str
    forecast: Forecast | None


@dataclass(frozen=True)
class PauseAnswer:
    trajectory_id: str
    tool: str
    paused_at: float
    decision: DecisionAnswer | None


@dataclass(frozen=True)
class ResumeAnswer:
    trajectory_id: str
    tool: str
    wait_s: float
    action: Action | None
    restored: bool
    forecast_p50_s: float | None


@dataclass(frozen=True)
class LeaseAnswer:
    trajectory_id: str
    action: Action             # the placement now
    changed: bool              # moved (e.g. host -> NVMe): the engine moves the KV accordingly
    elapsed_s: float
    prefetch_at_s: float | None
    demote_at_s: float | None  # the next lease expiry (seconds after the pause)


# ----------------------------------------------------------------------------- request building
@dataclass(frozen=True)
class _Req:
    method: str
    path: str
    json: Any = None
    mutating: bool = False


def _seg(s: str) -> str:
    return quote(str(s), safe="")


def _model_json(model: ModelSpec) -> Any:
    if isinstance(model, str):
        return model
    if isinstance(model, ModelGeometry):
        return {k: v for k, v in dataclasses.asdict(model).items() if v is not None}
    return dict(model)


def _hardware_json(hw: HardwareSpec) -> Any:
    if hw is None or isinstance(hw, str):
        return hw
    if isinstance(hw, HardwareProfile):
        return {"hbm_gb": hw.hbm_bytes / GB, "link_gbps": hw.link_h2d_bps / GB,
                "link_d2h_gbps": hw.link_d2h_bps / GB, "prefill_tflops": hw.prefill_flops / 1e12,
                "nvme_gbps": hw.nvme_read_bps / GB, "nvme_write_gbps": hw.nvme_write_bps / GB,
                "host_gb": hw.host_bytes / GB, "nvme_gb": hw.nvme_bytes / GB,
                "weights_gb": hw.weights_bytes / GB, "runtime_gb": hw.runtime_bytes / GB}
    return dict(hw)


def _pause_fields(context_tokens: int | None, model: ModelSpec | None, stored_tokens: int,
                  hbm_pressure: float, host_free_bytes: int | None, nvme_free_bytes: int | None,
                  hardware: HardwareSpec, policy: str | None, features: Mapping[str, str] | None) -> dict:
    body: dict[str, Any] = {}
    if context_tokens is not None:
        body["context_tokens"] = int(context_tokens)
    if model is not None:
        body["model"] = _model_json(model)
    if stored_tokens:
        body["stored_tokens"] = int(stored_tokens)
    if hbm_pressure:
        body["hbm_pressure"] = float(hbm_pressure)
    if host_free_bytes is not None:
        body["host_free_bytes"] = int(host_free_bytes)
    if nvme_free_bytes is not None:
        body["nvme_free_bytes"] = int(nvme_free_bytes)
    if hardware is not None:
        body["hardware"] = _hardware_json(hardware)
    if policy is not None:
        body["policy"] = policy
    if features:
        body["features"] = dict(features)
    return body


# ----------------------------------------------------------------------------- answer parsing
def _raise_for(resp: httpx.Response) -> None:
    if resp.is_success:
        return
    try:
        detail = str(resp.json().get("detail", resp.text))
    except ValueError:
        detail = resp.text.strip()[:500] or resp.reason_phrase
    raise _BY_STATUS.get(resp.status_code, KvtierError)(resp.status_code, detail)


def _forecast(d: Mapping[str, Any]) -> Forecast:
    return Forecast(tool=d["tool"], n=int(d["n"]), mean_s=float(d["mean_s"]),
                    quantiles={k: float(v) for k, v in d["quantiles"].items()}, source=d.get("source", "prior"))


def _decision(d: Mapping[str, Any]) -> DecisionAnswer:
    dec = Decision(action=Action(d["action"]), prefetch_at_s=d.get("prefetch_at_s"),
                   demote_at_s=d.get("demote_at_s"), expected_cost=float(d["expected_cost"]),
                   reason=d.get("reason", ""))
    fc = d.get("forecast")
    return DecisionAnswer(decision=dec, kv_bytes=int(d["kv_bytes"]), policy=d["policy"],
                          forecast=None if fc is None else _forecast(fc))


def _pause(d: Mapping[str, Any]) -> PauseAnswer:
    dec = d.get("decision")
    return PauseAnswer(trajectory_id=d["trajectory_id"], tool=d["tool"], paused_at=float(d["paused_at"]),
                       decision=None if dec is None else _decision(dec))


def _resume(d: Mapping[str, Any]) -> ResumeAnswer:
    a = d.get("action")
    return ResumeAnswer(trajectory_id=d["trajectory_id"], tool=d["tool"], wait_s=float(d["wait_s"]),
                        action=None if a is None else Action(a), restored=bool(d["restored"]),
                        forecast_p50_s=d.get("forecast_p50_s"))


def _lease(d: Mapping[str, Any]) -> LeaseAnswer:
    return LeaseAnswer(trajectory_id=d["trajectory_id"], action=Action(d["action"]), changed=bool(d["changed"]),
                       elapsed_s=float(d["elapsed_s"]), prefetch_at_s=d.get("prefetch_at_s"),
                       demote_at_s=d.get("demote_at_s"))


class _Api:
    """Request builders shared by both clients (no I/O here)."""

    @staticmethod
    def observe(tool: str, wait_s: float, features: Mapping[str, str] | None) -> _Req:
        body: dict[str, Any] = {"wait_s": float(wait_s)}
        if features:
            body["features"] = dict(features)
        return _Req("POST", f"/v1/tools/{_seg(tool)}/observations", body, True)

    @staticmethod
    def forecast(tool: str) -> _Req:
        return _Req("GET", f"/v1/tools/{_seg(tool)}/forecast")

    @staticmethod
    def decide(tool: str, context_tokens: int, model: ModelSpec, **kw: Any) -> _Req:
        body = {"tool": tool, **_pause_fields(context_tokens, model, **kw)}
        return _Req("POST", "/v1/decisions", body, True)

    @staticmethod
    def pause(trajectory_id: str, tool: str, context_tokens: int | None, model: ModelSpec | None,
              **kw: Any) -> _Req:
        body = {"tool": tool, **_pause_fields(context_tokens, model, **kw)}
        return _Req("POST", f"/v1/trajectories/{_seg(trajectory_id)}/pause", body, True)

    @staticmethod
    def resume(trajectory_id: str, wait_s: float | None, stall_s: float | None) -> _Req:
        body: dict[str, Any] = {}
        if wait_s is not None:
            body["wait_s"] = float(wait_s)
        if stall_s is not None:
            body["stall_s"] = float(stall_s)
        return _Req("POST", f"/v1/trajectories/{_seg(trajectory_id)}/resume", body, True)

    @staticmethod
    def lease(trajectory_id: str, elapsed_s: float | None) -> _Req:
        body = {} if elapsed_s is None else {"elapsed_s": float(elapsed_s)}
        return _Req("POST", f"/v1/trajectories/{_seg(trajectory_id)}/lease", body, True)


def _defaults(stored_tokens: int = 0, hbm_pressure: float = 0.0, host_free_bytes: int | None = None,
              nvme_free_bytes: int | None = None, hardware: HardwareSpec = None, policy: str | None = None,
              features: Mapping[str, str] | None = None) -> dict:
    return dict(stored_tokens=stored_tokens, hbm_pressure=hbm_pressure, host_free_bytes=host_free_bytes,
                nvme_free_bytes=nvme_free_bytes, hardware=hardware, policy=policy, features=features)


def _headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


# ----------------------------------------------------------------------------- clients
class KvtierClient:
    """Blocking client.  Thread-safe as far as ``httpx.Client`` is (one
    connection pool shared by threads).  Context manager; or call close()."""

    def __init__(self, base_url: str = "http://127.0.0.1:8731", *, token: str | None = None,
                 timeout_s: float = 10.0, transport: httpx.BaseTransport | None = None) -> None:
        token = token if token is not None else os.environ.get("KVTIER_TOKEN") or None
        self._http = httpx.Client(base_url=base_url, headers=_headers(token), timeout=timeout_s,
                                  transport=transport)

    def _call(self, r: _Req) -> Any:
        resp = self._http.request(r.method, r.path, json=r.json)
        _raise_for(resp)
        return resp.json() if resp.headers.get("content-type", "").startswith("application/json") else resp.text

    def healthz(self) -> dict:
        return self._call(_Req("GET", "/healthz"))

    def observe(self, tool: str, wait_s: float, features: Mapping[str, str] | None = None) -> int:
        """Report a finished tool call; returns how many durations of it the service has seen."""
        return int(self._call(_Api.observe(tool, wait_s, features))["n"])

    def forecast(self, tool: str) -> Forecast:
        return _forecast(self._call(_Api.forecast(tool)))

    def decide(self, tool: str, context_tokens: int, model: ModelSpec, **kw: Any) -> DecisionAnswer:
        """Price one pause.  Keywords: stored_tokens, hbm_pressure, host_free_bytes,
        nvme_free_bytes, hardware, policy, features."""
        return _decision(self._call(_Api.decide(tool, context_tokens, model, **_defaults(**kw))))

    def pause(self, trajectory_id: str, tool: str, *, context_tokens: int | None = None,
              model: ModelSpec | None = None, **kw: Any) -> PauseAnswer:
        """Register a pause; with context_tokens and model the answer carries a decision."""
        return _pause(self._call(_Api.pause(trajectory_id, tool, context_tokens, model, **_defaults(**kw))))

    def resume(self, trajectory_id: str, *, wait_s: float | None = None,
               stall_s: float | None = None) -> ResumeAnswer:
        return _resume(self._call(_Api.resume(trajectory_id, wait_s, stall_s)))

    def lease_expired(self, trajectory_id: str, *, elapsed_s: float | None = None) -> LeaseAnswer:
        """The decision's demote_at_s passed with the tool still running: re-decide."""
        return _lease(self._call(_Api.lease(trajectory_id, elapsed_s)))

    def lost(self) -> list[dict]:
        return self._call(_Req("GET", "/v1/trajectories/lost"))

    def stats(self) -> dict:
        return self._call(_Req("GET", "/v1/stats"))

    def metrics_text(self) -> str:
        return self._call(_Req("GET", "/metrics"))

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "KvtierClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncKvtierClient:
    """The same API as :class:`KvtierClient`, as coroutines (``httpx.AsyncClient``)."""

    def __init__(self, base_url: str = "http://127.0.0.1:8731", *, token: str | None = None,
                 timeout_s: float = 10.0, transport: httpx.AsyncBaseTransport | None = None,
                 limits: httpx.Limits | None = None) -> None:
        token = token if token is not None else os.environ.get("KVTIER_TOKEN") or None
        self._http = httpx.AsyncClient(base_url=base_url, headers=_headers(token), timeout=timeout_s,
                                       transport=transport, limits=limits or httpx.Limits())

    async def _call(self, r: _Req) -> Any:
        resp = await self._http.request(r.method, r.path, json=r.json)
        _raise_for(resp)
        return resp.json() if resp.headers.get("content-type", "").startswith("application/json") else resp.text

    async def healthz(self) -> dict:
        return await self._call(_Req("GET", "/healthz"))

    async def observe(self, tool: str, wait_s: float, features: Mapping[str, str] | None = None) -> int:
        return int((await self._call(_Api.observe(tool, wait_s, features)))["n"])

    async def forecast(self, tool: str) -> Forecast:
        return _forecast(await self._call(_Api.forecast(tool)))

    async def decide(self, tool: str, context_tokens: int, model: ModelSpec, **kw: Any) -> DecisionAnswer:
        return _decision(await self._call(_Api.decide(tool, context_tokens, model, **_defaults(**kw))))

    async def pause(self, trajectory_id: str, tool: str, *, context_tokens: int | None = None,
                    model: ModelSpec | None = None, **kw: Any) -> PauseAnswer:
        return _pause(await self._call(_Api.pause(trajectory_id, tool, context_tokens, model, **_defaults(**kw))))

    async def resume(self, trajectory_id: str, *, wait_s: float | None = None,
                     stall_s: float | None = None) -> ResumeAnswer:
        return _resume(await self._call(_Api.resume(trajectory_id, wait_s, stall_s)))

    async def lease_expired(self, trajectory_id: str, *, elapsed_s: float | None = None) -> LeaseAnswer:
        return _lease(await self._call(_Api.lease(trajectory_id, elapsed_s)))

    async def lost(self) -> list[dict]:
        return await self._call(_Req("GET", "/v1/trajectories/lost"))

    async def stats(self) -> dict:
        return await self._call(_Req("GET", "/v1/stats"))

    async def metrics_text(self) -> str:
        return await self._call(_Req("GET", "/metrics"))

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> "AsyncKvtierClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
