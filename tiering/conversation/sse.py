"""The tool calls of a streamed chat completion, read as its bytes pass.

An OpenAI-compatible server streams server-sent events, one JSON chunk per
``data:`` line, ending with ``data: [DONE]``.  A tool call's function name
arrives in the first delta of that call (later deltas carry its arguments)::

    data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1",
           "type":"function","function":{"name":"pytest","arguments":""}}]}}]}
    data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,
           "function":{"arguments":"{\\"path\\": ..."}}]}}]}
    data: [DONE]

:meth:`ToolCallStream.feed` takes the bytes in whatever pieces the proxy
gets them and answers the tool names that became complete in that piece, so
a name is known long before the response ends.  Name fragments of one call
are joined (a server may split them); a name is complete once its call's
arguments start, a later call starts, the choice finishes or the stream ends.
Only the first choice is read.

Bounded whatever the stream holds: a line longer than ``max_line`` bytes is
skipped whole (counted in ``skipped``), at most ``MAX_TOOL_CALLS`` calls are
tracked, a name past ``MAX_TOOL_NAME`` characters makes that call unreadable
(it is left out of :meth:`calls`).  Never raises on the stream's content.
Not thread-safe (one stream, one reader).
"""
from __future__ import annotations

import json
from typing import Mapping

from kvtier.tiering.forecasting.features import MAX_TOOL_NAME, check_tool

from .messages import MAX_CALL_ID, MAX_TOOL_CALLS, ToolCall, usage_tokens


class ToolCallStream:
    """See the module doc."""

    def __init__(self, *, max_line: int = 1 << 20) -> None:
        self.max_line = int(max_line)
        self._buf = bytearray()
        self._skipping = False          # inside a line longer than max_line
        self._names: dict[int, str] = {}
        self._ids: dict[int, str] = {}
        self._reported: set[int] = set()
        self.done = False               # data: [DONE] seen
        self.skipped = 0                # lines skipped: too long, not JSON, not a chunk
        self.usage_tokens: int | None = None

    def feed(self, data: bytes) -> tuple[str, ...]:
        """Read ``data`` (any piece of the stream); the tool names first readable in it."""
        new: list[str] = []
        self._buf += data
        while True:
            nl = self._buf.find(b"\n")
            if nl < 0:
                if len(self._buf) > self.max_line:
                    self._buf.clear()
                    if not self._skipping:
                        self.skipped += 1
                    self._skipping = True
                return tuple(new)
            line = bytes(self._buf[:nl])
            del self._buf[:nl + 1]
            if self._skipping:
                self._skipping = False
                continue
            if len(line) > self.max_line:
                self.skipped += 1
                continue
            self._line(line.strip(), new)

    def _line(self, line: bytes, new: list[str]) -> None:
        if not line.startswith(b"data:"):
            return                      # event:, id:, retry:, comments, blank separators
        payload = line[5:].strip()
        if payload == b"[DONE]":
            self.done = True
            self._complete(MAX_TOOL_CALLS, new)
            return
        try:
            chunk = json.loads(payload)
            self._chunk(chunk, new)
        except (ValueError, TypeError, AttributeError, RecursionError):
            self.skipped += 1

    def _chunk(self, chunk: object, new: list[str]) -> None:
        n = usage_tokens(chunk)
        if n is not None:
            self.usage_tokens = n
        choices = chunk.get("choices") if isinstance(chunk, Mapping) else None
        if not isinstance(choices, list):
            return
        for choice in choices:
            if not isinstance(choice, Mapping) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta")
            if isinstance(delta, Mapping):
                self._delta(delta, new)
            if choice.get("finish_reason") is not None:
                self._complete(MAX_TOOL_CALLS, new)

    def _delta(self, delta: Mapping, new: list[str]) -> None:
        calls = delta.get("tool_calls")
        if calls is None and isinstance(delta.get("function_call"), Mapping):
            calls = [{"index": 0, "function": delta["function_call"]}]
        if not isinstance(calls, list):
            return
        for pos, c in enumerate(calls):
            if isinstance(c, Mapping):
                self._call(c, pos, new)

    def _call(self, c: Mapping, pos: int, new: list[str]) -> None:
        i = c.get("index", pos)
        if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < MAX_TOOL_CALLS:
            return
        cid = c.get("id")
        if isinstance(cid, str) and cid and len(cid) <= MAX_CALL_ID:
            self._ids.setdefault(i, cid)
        self._complete(i, new)          # a call starting completes the calls before it
        fn = c.get("function")
        if not isinstance(fn, Mapping):
            return
        part = fn.get("name")
        if isinstance(part, str) and part and i not in self._reported:
            self._names[i] = (self._names.get(i, "") + part)[:MAX_TOOL_NAME + 1]
        args = fn.get("arguments")
        if isinstance(args, str) and args:
            self._complete(i + 1, new)

    def _complete(self, below: int, new: list[str]) -> None:
        """The names of calls with an index below ``below`` are complete: report the new ones."""
        for i, name in self._names.items():
            if i < below and i not in self._reported:
                self._reported.add(i)
                if _valid(name):
                    new.append(name)

    def calls(self) -> tuple[ToolCall, ...]:
        """The readable tool calls so far, in call order (a name not yet complete as joined so far)."""
        return tuple(ToolCall(self._names[i], self._ids.get(i)) for i in sorted(self._names)
                     if _valid(self._names[i]))

    def named(self) -> tuple[ToolCall, ...]:
        """The tool calls whose names are complete, in call order."""
        return tuple(ToolCall(self._names[i], self._ids.get(i)) for i in sorted(self._reported)
                     if i in self._names and _valid(self._names[i]))


def _valid(name: str) -> bool:
    try:
        check_tool(name)
        return True
    except ValueError:
        return False
