"""Tool names, waits and features: input checks and the coarse features of a tool call.

Pure functions (thread-safe).  The predictor keys its back-off chain on
``tool`` + the canonical feature suffixes of :func:`feature_chain`.
"""
from __future__ import annotations

import math
import os
import re
import shlex
from typing import Any, Mapping

import numpy as np

MAX_TOOL_NAME = 128
MAX_FEATURES = 8
MAX_FEATURE_LEN = 64
SEP = "\x1f"  # key separator; control characters are rejected in names, so it cannot collide


def check_tool(tool: Any) -> str:
    """Return ``tool`` if it is a valid tool name, else raise ValueError."""
    if not isinstance(tool, str):
        raise ValueError(f"tool name must be a string, got {type(tool).__name__}")
    if not tool or not tool.strip():
        raise ValueError("tool name must not be empty")
    if len(tool) > MAX_TOOL_NAME:
        raise ValueError(f"tool name is {len(tool)} characters; at most {MAX_TOOL_NAME} allowed")
    if any(ord(c) < 32 or ord(c) == 127 for c in tool):
        raise ValueError("tool name must not contain control characters")
    return tool


def check_wait(seconds: Any, max_wait_s: float = 1e7) -> float:
    """Return ``seconds`` as float if it is a plausible wait, else raise ValueError."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float, np.floating, np.integer)):
        raise ValueError(f"wait must be a number of seconds, got {type(seconds).__name__}")
    s = float(seconds)
    if math.isnan(s) or math.isinf(s):
        raise ValueError(f"wait must be finite, got {s}")
    if s < 0:
        raise ValueError(f"wait must be >= 0 seconds, got {s}")
    if s > max_wait_s:
        raise ValueError(f"wait of {s:.3g} s is absurd (limit {max_wait_s:.3g} s)")
    return s


def feature_chain(features: Mapping[str, str] | None) -> list[str]:
    """Canonical feature suffixes, coarse to fine (``cmd`` first, then the rest by name)."""
    if not features:
        return []
    if not isinstance(features, Mapping):
        raise ValueError(f"features must be a mapping of str to str, got {type(features).__name__}")
    if len(features) > MAX_FEATURES:
        raise ValueError(f"at most {MAX_FEATURES} features allowed, got {len(features)}")
    items = []
    for k, v in features.items():
        for part, what in ((k, "name"), (v, "value")):
            if not isinstance(part, str) or not part or len(part) > MAX_FEATURE_LEN or \
                    any(ord(c) < 32 or ord(c) == 127 or c == "=" for c in part):
                raise ValueError(f"feature {what} must be a non-empty string of at most {MAX_FEATURE_LEN} "
                                 f"printable characters without '=', got {part!r}")
        items.append((k, v))
    items.sort(key=lambda kv: (kv[0] != "cmd", kv[0]))
    chain, acc = [], ""
    for k, v in items:
        acc += f"{SEP}{k}={v}"
        chain.append(acc)
    return chain


_ENV_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_SKIP_WORDS = {"sudo", "env", "time", "nice", "nohup", "exec", "command", "xargs"}


def tool_features(command: str | None = None, arg_chars: int | None = None) -> dict[str, str]:
    """Coarse features of a tool call: the command head and an argument-size bucket.

    ``tool_features("cd /repo && python -m pytest -x", 120)`` ->
    ``{"cmd": "pytest", "arg": "<256"}``.  For ``cd X && Y`` the head of Y is
    used; environment assignments, ``sudo``/``env``/``timeout N`` and
    ``python -m`` wrappers are skipped.  Pure; never raises on odd commands.
    """
    out: dict[str, str] = {}
    if command:
        head = _command_head(command)
        if head:
            out["cmd"] = head
    if arg_chars is not None and arg_chars >= 0:
        bound = 64
        while arg_chars >= bound and bound < 65536:
            bound *= 4
        out["arg"] = f"<{bound}" if arg_chars < bound else f">={bound}"
    return out


def _command_head(command: str) -> str:
    segments = re.split(r"&&|\|\||;|\|", command)
    for seg in segments:
        try:
            words = shlex.split(seg, posix=True)
        except ValueError:
            words = seg.split()
        i = 0
        while i < len(words):
            w = words[i]
            if _ENV_ASSIGN.match(w) or w in _SKIP_WORDS:
                i += 1
                continue
            if w == "timeout":
                i += 2 if i + 1 < len(words) and not words[i + 1].startswith("-") else 1
                continue
            break
        if i >= len(words):
            continue
        head = os.path.basename(words[i]).lower()
        if head in ("cd", "pushd", "popd", "source", ".", "export", "set"):
            continue
        if re.fullmatch(r"python[0-9.]*", head) and i + 2 < len(words) and words[i + 1] == "-m":
            head = words[i + 2].lower()
        return head[:MAX_FEATURE_LEN].replace("=", "_")
    return ""
