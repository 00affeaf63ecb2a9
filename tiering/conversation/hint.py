"""The kvtier hint a router forwards on a chat request.

vLLM reads ``kv_transfer_params`` from an OpenAI request body; kvtier's
plugin reads its hint there (``kvtier.engine_adapter.hints``)::

    {"kv_transfer_params": {"kvtier": {"tool": "pytest", "trajectory_id": "conv-...",
                                       "context_tokens": 12000}}}

With no tool to forecast the hint names only the trajectory (as vLLM's
``session_id``), so the engine tracks the pause under its unhinted class
(``default_tool``).  A router never forwards ``"tool": null`` on a forecast:
null says no pause follows, and a wrong null would leave a pause unplanned.

A request that already carries a ``kvtier`` hint (an agent that sends its
own) is forwarded as it is: the agent knows its next tool, the router only
guesses it.

When the response names another tool than the forecast, the router tells the
engine that served it with a *retag* (:class:`Retag`): a completion request
of one prompt token and one output token whose hint the plugin reads as a
correction of that trajectory's pause, never as a pause of its own::

    {"model": ..., "prompt": [0], "max_tokens": 1,
     "kv_transfer_params": {"kvtier": {"retag": true, "trajectory_id": "conv-...",
                                       "tool": "pytest", "forecast": "edit"}}}

Pure functions and frozen values; thread-safe.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from kvtier.tiering.forecasting.features import check_tool

HINT_KEY = "kvtier"                  # as kvtier.engine_adapter.hints.HINT_KEY
PARAMS_KEY = "kv_transfer_params"    # vLLM's request field


def make_hint(tool: str | None, trajectory_id: str, context_tokens: int | None = None) -> dict:
    """The ``{"kvtier": {...}}`` object for a request of ``trajectory_id`` whose
    coming pause is forecast to wait on ``tool`` (None: no forecast).  Raises
    ValueError for an invalid tool name."""
    inner: dict[str, object] = {"tool": check_tool(tool), "trajectory_id": trajectory_id} if tool is not None \
        else {"session_id": trajectory_id}
    if context_tokens is not None:
        inner["context_tokens"] = int(context_tokens)
    return {HINT_KEY: inner}


def carries_hint(body: Mapping[str, object]) -> bool:
    """Whether the request already carries a kvtier hint of its own."""
    params = body.get(PARAMS_KEY)
    return isinstance(params, Mapping) and HINT_KEY in params


def with_hint(body: Mapping[str, object], hint: Mapping[str, object]) -> dict:
    """A shallow copy of ``body`` whose ``kv_transfer_params`` holds ``hint``
    beside what the client put there (a non-object ``kv_transfer_params`` is
    left for the engine to refuse: the body comes back unchanged)."""
    out = dict(body)
    params = out.get(PARAMS_KEY)
    if params is None:
        out[PARAMS_KEY] = dict(hint)
    elif isinstance(params, Mapping):
        out[PARAMS_KEY] = {**params, **hint}
    return out


RETAG_PATH = "/v1/completions"       # where a retag goes (every OpenAI-compatible vLLM server has it)


@dataclass(frozen=True)
class Retag:
    """The engine's pause of ``trajectory_id`` waits on ``tool``, not on ``forecast``
    (the hint's tool; None: the hint named none)."""

    trajectory_id: str
    tool: str
    forecast: str | None

    def body(self, model: object) -> dict:
        """The retag request for an engine serving ``model`` (the request's own
        ``model`` field): one prompt token, one output token, the correction as hint."""
        inner: dict[str, object] = {"retag": True, "trajectory_id": self.trajectory_id, "tool": self.tool}
        if self.forecast is not None:
            inner["forecast"] = self.forecast
        return {"model": model, "prompt": [0], "max_tokens": 1, "stream": False, PARAMS_KEY: {HINT_KEY: inner}}
