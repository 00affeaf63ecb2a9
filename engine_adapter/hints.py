"""Tool-wait hints as engines carry them, validated where they enter.

A request (vLLM ``kv_transfer_params``, a vLLM ``kv_hints`` action, SGLang's
``HiCacheStorageExtraInfo.extra_info``) may carry a ``kvtier`` hint::

    {"kvtier": {"tool": "pytest", "trajectory_id": "t-7",
                "context_tokens": 12000, "expected_wait_s": 40.0}}

Everything in it comes from a client, so every field is checked here against
the limits the predictor and the policy enforce (:data:`LIMITS`); a hint that
fails is dropped whole, counted and logged at most once a minute
(:class:`HintReader`), and the request goes on as an unhinted one.  Nothing
in this module raises on what a request sends.

The trajectory a request belongs to is the hint's ``trajectory_id``, else
vLLM's session keys (``session_id``, ``conversation_id``, ``kv_session_id``, at
the top level of ``kv_transfer_params`` or inside the ``kvtier`` object), held
to the same limits.

A router that forecast a request's tool and then parsed the true one from
the response sends a *retag*: a tiny request of its own (one prompt token,
``max_tokens`` 1) whose hint says so::

    {"kvtier": {"retag": true, "trajectory_id": "conv-...", "tool": "pytest",
                "forecast": "edit"}}          # forecast: the tool it was told (absent: none)

:class:`HintReader` reads it as :class:`Retag` and nothing else: the request
names no trajectory, so it never becomes a pause of its own; the plugin
passes it to its lifecycle (``Lifecycle.retag``).  A malformed retag is
dropped like a bad hint.
"""
from __future__ import annotations

import logging
import math
import threading
from dataclasses import dataclass
from typing import Any, Mapping

from kvtier.engine_adapter.firewall import RateLimitedLog, shorten
from kvtier.tiering.forecasting.features import MAX_TOOL_NAME, check_tool, check_wait

log = logging.getLogger("kvtier.engine")

HINT_KEY = "kvtier"                    # the key under which engines carry our hint
HINT_ACTION_TYPE = "kvtier.tool_wait"  # vLLM kv_hints action_type
SESSION_KEYS = ("session_id", "conversation_id", "kv_session_id")   # vLLM's session-lifecycle keys
MAX_TRAJECTORY_ID = 256
MAX_CONTEXT_TOKENS = 10_000_000
MAX_EXPECTED_WAIT_S = 1e7
LIMITS = {"tool": f"a printable string of 1..{MAX_TOOL_NAME} characters",
          "trajectory_id": f"a printable string (or int) of 1..{MAX_TRAJECTORY_ID} characters",
          "context_tokens": f"an integer in 0..{MAX_CONTEXT_TOKENS}",
          "expected_wait_s": f"a finite number of seconds in 0..{MAX_EXPECTED_WAIT_S:g}"}


class HintError(ValueError):
    """A hint field outside :data:`LIMITS` (the message names the field, never echoes its value whole)."""


@dataclass(frozen=True)
class ToolHint:
    """A tool-wait hint attached to one request.

    tool:            the tool the agent is about to wait on (required).
    trajectory_id:   the agent trajectory (optional; the service tracks pauses by it).
    context_tokens:  tokens of context at the pause (optional; the plugin may know better).
    expected_wait_s: the caller's own estimate (optional; used as a feature, not trusted blindly).
    """

    tool: str
    trajectory_id: str | None = None
    context_tokens: int | None = None
    expected_wait_s: float | None = None

    @classmethod
    def validate(cls, obj: Any) -> "ToolHint | None":
        """The hint in ``obj`` (a mapping holding ``{"kvtier": {...}}`` or the
        inner ``{...}``), None when it holds none.  Raises HintError for a hint
        with a field outside :data:`LIMITS`."""
        if not isinstance(obj, Mapping):
            return None
        if HINT_KEY in obj:
            obj = obj[HINT_KEY]
            if not isinstance(obj, Mapping):
                raise HintError(f"the {HINT_KEY!r} hint must be an object, got {type(obj).__name__}")
        if "tool" not in obj:
            return None
        try:
            tool = check_tool(obj["tool"])
        except ValueError as exc:
            raise HintError(f"tool: {exc}") from None
        tid, ctx, wait = obj.get("trajectory_id"), obj.get("context_tokens"), obj.get("expected_wait_s")
        return cls(tool=tool, trajectory_id=None if tid is None else _trajectory_id(tid, "trajectory_id"),
                   context_tokens=None if ctx is None else _context_tokens(ctx),
                   expected_wait_s=None if wait is None else _wait(wait))

    @classmethod
    def parse(cls, obj: Any) -> "ToolHint | None":
        """:meth:`validate` that answers None for a bad hint instead of raising
        (a :class:`HintReader` counts and logs those)."""
        try:
            return cls.validate(obj)
        except HintError:
            return None

    @classmethod
    def from_kv_hints(cls, envelope: Any) -> "ToolHint | None":
        """The first ``kvtier.tool_wait`` action of a vLLM ``KvHintsEnvelope``
        (duck-typed: ``.actions[i].action_type`` / ``.payload``).  Raises HintError
        for a bad payload or envelope."""
        actions = getattr(envelope, "actions", None)
        if actions is None:
            return None
        if not isinstance(actions, (list, tuple)):
            raise HintError(f"kv_hints actions must be a list, got {type(actions).__name__}")
        for action in actions[:64]:
            if getattr(action, "action_type", None) == HINT_ACTION_TYPE:
                return cls.validate(getattr(action, "payload", None))
        return None


def _trajectory_id(v: Any, name: str) -> str:
    if isinstance(v, bool) or not isinstance(v, (str, int)):
        raise HintError(f"{name} must be a string or an integer, got {type(v).__name__}")
    if isinstance(v, int) and abs(v) >= 10 ** MAX_TRAJECTORY_ID:
        raise HintError(f"{name} must be {LIMITS['trajectory_id']}")
    s = str(v)
    if not s.strip() or len(s) > MAX_TRAJECTORY_ID or any(ord(c) < 32 or ord(c) == 127 for c in s):
        raise HintError(f"{name} must be {LIMITS['trajectory_id']} (got {len(s)} characters)")
    return s


def _context_tokens(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or isinstance(v, float) and not math.isfinite(v) \
            or not 0 <= v <= MAX_CONTEXT_TOKENS or int(v) != v:
        raise HintError(f"context_tokens must be {LIMITS['context_tokens']}")
    return int(v)


def _wait(v: Any) -> float:
    try:
        return check_wait(v, MAX_EXPECTED_WAIT_S)
    except ValueError as exc:
        raise HintError(f"expected_wait_s: {exc}") from None


def session_of(params: Any) -> str | None:
    """vLLM's session keys in ``kv_transfer_params`` (top level, then inside the
    ``kvtier`` object).  Raises HintError for a present key outside the limits."""
    if not isinstance(params, Mapping):
        return None
    for where in (params, params.get(HINT_KEY)):
        if isinstance(where, Mapping):
            for k in SESSION_KEYS:
                v = where.get(k)
                if v is not None and v != "":
                    return _trajectory_id(v, k)
    return None


@dataclass(frozen=True)
class Retag:
    """A router's late word on trajectory ``trajectory_id``'s pause: it waits on
    ``tool``, not on ``forecast``, the tool the hint told (None: the hint named
    none, so the plugin's ``default_tool``)."""

    trajectory_id: str
    tool: str
    forecast: str | None = None

    @classmethod
    def validate(cls, obj: Mapping) -> "Retag":
        """The retag in a ``kvtier`` object that has ``"retag": true``.  Raises
        HintError for a field outside :data:`LIMITS` or a missing one."""
        if obj.get("retag") is not True:
            raise HintError("retag must be true")
        tid, tool, fc = obj.get("trajectory_id"), obj.get("tool"), obj.get("forecast")
        if tid is None or tool is None:
            raise HintError("a retag names its trajectory_id and tool")
        try:
            return cls(_trajectory_id(tid, "trajectory_id"), check_tool(tool), None if fc is None else check_tool(fc))
        except HintError:
            raise
        except ValueError as exc:
            raise HintError(f"retag: {exc}") from None


@dataclass(frozen=True)
class RequestHint:
    """What a request said: its hint (None: none, or a bad one) and trajectory;
    ``ends``: no tool follows it (``{"kvtier": {"tool": null, ...}}``), so no
    pause starts when it finishes; ``retag``: it is a router's :class:`Retag`
    (then it names no trajectory and no hint)."""
    hint: ToolHint | None
    trajectory: str | None = None
    ends: bool = False
    retag: Retag | None = None


class HintReader:
    """Reads a request's hint and trajectory at the engine boundary: a bad
    hint is dropped (the request goes on unhinted), counted in ``rejected`` and
    logged at most once a minute.  Never raises.  Thread-safe."""

    def __init__(self, logger: logging.Logger = log, every_s: float = 60.0) -> None:
        self._log = RateLimitedLog(logger, every_s)
        self._lock = threading.Lock()
        self.rejected = 0

    def _reject(self, exc: Exception) -> None:
        with self._lock:
            self.rejected += 1
        self._log.warn("hint", "dropped a malformed hint (%s); the request goes on without it", shorten(exc, 160))

    def _retag(self, obj: Mapping) -> RequestHint:
        """A retag request: its :class:`Retag`, or (a bad one) nothing at all."""
        try:
            return RequestHint(None, retag=Retag.validate(obj))
        except Exception as exc:   # HintError, and whatever a hostile mapping raises
            self._reject(exc)
            return RequestHint(None)

    def read(self, params: Any, kv_hints: Any = None) -> RequestHint:
        """The hint of ``params`` (``kv_transfer_params``/``extra_info``), else the
        first kvtier action of ``kv_hints``; and the trajectory it names (a
        retag: its :class:`Retag` alone)."""
        try:
            if _retags(params):
                return self._retag(params[HINT_KEY])
            if _ends(params):
                tid = params[HINT_KEY].get("trajectory_id")
                return RequestHint(None, _trajectory_id(tid, "trajectory_id") if tid is not None else session_of(params),
                                   ends=True)
            hint = ToolHint.validate(params)
            if hint is None and kv_hints is not None:
                hint = ToolHint.from_kv_hints(kv_hints)
        except Exception as exc:   # HintError, and whatever a hostile object's __getattr__/__eq__ raises
            self._reject(exc)
            hint = None
        if hint is not None and hint.trajectory_id:
            return RequestHint(hint, hint.trajectory_id)
        try:
            return RequestHint(hint, session_of(params))
        except Exception as exc:
            self._reject(exc)
            return RequestHint(hint, None)


def _ends(params: Any) -> bool:
    """Whether the request's hint says no tool follows it (``{"kvtier": {"tool": null}}``)."""
    if not isinstance(params, Mapping):
        return False
    obj = params.get(HINT_KEY)
    return isinstance(obj, Mapping) and "tool" in obj and obj["tool"] is None


def _retags(params: Any) -> bool:
    """Whether the request is a retag (``{"kvtier": {"retag": ...}}``, any value: a bad one is dropped)."""
    if not isinstance(params, Mapping):
        return False
    obj = params.get(HINT_KEY)
    return isinstance(obj, Mapping) and "retag" in obj
