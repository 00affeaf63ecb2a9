"""Reading a harness request log (JSON Lines) into the doctor.

One call a line::

    {"trajectory_id": str, "request": {chat-completions body: "messages", optional "tools"},
     "tool_wait_s": float (optional), "ts": float (optional)}

or ``"tokens": [int, ...]`` instead of ``"request"``.  The trajectory field's
name is configurable (``id_field``).  A malformed line raises with its line number.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from kvtier.tiering.prefix.doctor import PrefixDoctor


class LogError(ValueError):
    """A malformed log line; the message starts with ``line N:``."""


def _num(v, what: str, no: int) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or v < 0:
        raise LogError(f"line {no}: {what} must be a number >= 0, got {v!r}")
    return float(v)


def replay(path: str | Path, doctor: PrefixDoctor, *, id_field: str = "trajectory_id",
           progress: Callable[[int], None] | None = None) -> int:
    """Feed every line of ``path`` to ``doctor``; returns the number of calls read.
    Raises LogError for a malformed line, OSError if the file cannot be read."""
    n = 0
    with open(path, "r", encoding="utf-8") as fh:
        for no, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError as exc:
                raise LogError(f"line {no}: not JSON ({exc})") from None
            if not isinstance(obj, dict):
                raise LogError(f"line {no}: a log line must be a JSON object")
            tid = obj.get(id_field)
            if not isinstance(tid, (str, int)) or isinstance(tid, bool):
                raise LogError(f"line {no}: {id_field!r} must be a string")
            req, toks = obj.get("request"), obj.get("tokens")
            if (req is None) == (toks is None):
                raise LogError(f"line {no}: give exactly one of 'request' and 'tokens'")
            if toks is not None and not (isinstance(toks, list) and all(
                    isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 2 ** 32 for t in toks)):
                raise LogError(f"line {no}: 'tokens' must be a list of token ids")
            if req is not None and not isinstance(req, dict):
                raise LogError(f"line {no}: 'request' must be an object")
            try:
                doctor.observe(str(tid), req, tokens=toks, tool_wait_s=_num(obj.get("tool_wait_s"), "tool_wait_s", no),
                               ts=_num(obj.get("ts"), "ts", no))
            except ValueError as exc:
                raise LogError(f"line {no}: {exc}") from None
            n += 1
            if progress is not None:
                progress(n)
    return n
