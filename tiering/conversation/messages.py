"""What an OpenAI chat completion says about tools, read defensively.

A request of an agent that uses tools looks like::

    messages: [system, user, assistant{tool_calls: [{id, function: {name}}]},
               tool{tool_call_id, content}, ..., assistant{...}, tool{...}]

The tool calls of the last assistant message are the pause that ended when
this request arrived; the ``role: "tool"`` messages after it are their
results.  A response (non-streaming JSON) carries the next tool calls in
``choices[0].message.tool_calls`` (or the legacy ``function_call``).

Everything here comes from a client: every function raises
:class:`ConversationError` (a ValueError naming what is wrong, never echoing
a value whole) for a shape it cannot read, and never anything else.  Pure
functions; thread-safe.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from kvtier.tiering.forecasting.features import check_tool

MAX_MESSAGES = 100_000     # a longer conversation is not an agent's (or is an attack)
MAX_TOOL_CALLS = 256       # tool calls read from one message; more are ignored
MAX_CALL_ID = 256


class ConversationError(ValueError):
    """A request or response this package cannot read (the message says which part)."""


@dataclass(frozen=True)
class ToolCall:
    """One call of a tool: its ``name`` (a valid tool name) and ``id`` (None: none given)."""

    name: str
    id: str | None = None


@dataclass(frozen=True)
class ChatRequest:
    """What a request says.

    messages:  the request's messages (the caller's list, not copied).
    answered:  the calls of the last assistant message whose results follow it
               (matched by ``tool_call_id``; all of them when no result names
               one); empty: this request carries no tool results (a first turn,
               or a user's turn).
    """

    messages: Sequence[Mapping[str, object]]
    answered: tuple[ToolCall, ...] = ()

    @property
    def last_tool(self) -> str | None:
        """The tool whose results this request carries (the first answered call's), if any."""
        return self.answered[0].name if self.answered else None


def _call_id(v: object) -> str | None:
    if v is None:
        return None
    if not isinstance(v, str) or len(v) > MAX_CALL_ID:
        raise ConversationError(f"a tool call id must be a string of at most {MAX_CALL_ID} characters")
    return v


def _name(v: object) -> str:
    try:
        return check_tool(v)
    except ValueError as exc:
        raise ConversationError(f"tool call name: {exc}") from None


def tool_calls_of(message: object) -> tuple[ToolCall, ...]:
    """The tool calls of one assistant message (``tool_calls``, else the legacy
    ``function_call``); empty when it calls none.  Raises ConversationError for
    a malformed call or an invalid tool name."""
    if not isinstance(message, Mapping):
        raise ConversationError(f"a message must be an object, got {type(message).__name__}")
    calls = message.get("tool_calls")
    if calls is None:
        fc = message.get("function_call")
        if fc is None:
            return ()
        if not isinstance(fc, Mapping):
            raise ConversationError("function_call must be an object")
        return (ToolCall(_name(fc.get("name"))),)
    if not isinstance(calls, list):
        raise ConversationError(f"tool_calls must be a list, got {type(calls).__name__}")
    out = []
    for c in calls[:MAX_TOOL_CALLS]:
        if not isinstance(c, Mapping) or not isinstance(c.get("function"), Mapping):
            raise ConversationError("each tool call must be an object with a 'function' object")
        out.append(ToolCall(_name(c["function"].get("name")), _call_id(c.get("id"))))
    return tuple(out)


def read_request(body: object) -> ChatRequest:
    """The chat request ``body`` (the parsed JSON) as a :class:`ChatRequest`.
    Raises ConversationError unless ``messages`` is a non-empty list of objects
    with a string ``role`` (at most :data:`MAX_MESSAGES`)."""
    if not isinstance(body, Mapping):
        raise ConversationError(f"a chat request must be an object, got {type(body).__name__}")
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise ConversationError("a chat request needs a non-empty 'messages' list")
    if len(msgs) > MAX_MESSAGES:
        raise ConversationError(f"{len(msgs)} messages; at most {MAX_MESSAGES} are read")
    for m in msgs:
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
            raise ConversationError("each message must be an object with a string 'role'")
    last = next((i for i in range(len(msgs) - 1, -1, -1) if msgs[i]["role"] == "assistant"), None)
    if last is None:
        return ChatRequest(msgs)
    results = [m for m in msgs[last + 1:] if m["role"] == "tool"]
    if not results:
        return ChatRequest(msgs)
    calls = tool_calls_of(msgs[last])
    ids = {m.get("tool_call_id") for m in results}
    answered = tuple(c for c in calls if c.id is None or c.id in ids)
    return ChatRequest(msgs, answered or calls)      # results that name no call answer them all


def tool_calls_of_response(body: object) -> tuple[ToolCall, ...]:
    """The tool calls of a non-streaming chat completion (its first choice);
    empty: the response calls no tool.  Raises ConversationError for a
    response without a readable first choice."""
    if not isinstance(body, Mapping):
        raise ConversationError(f"a chat completion must be an object, got {type(body).__name__}")
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
        raise ConversationError("a chat completion needs a non-empty 'choices' list of objects")
    msg = choices[0].get("message")
    if msg is None:
        return ()
    return tool_calls_of(msg)


def usage_tokens(body: object) -> int | None:
    """``usage.total_tokens`` of a chat completion or a stream's last chunk (None: absent or not a count)."""
    usage = body.get("usage") if isinstance(body, Mapping) else None
    n = usage.get("total_tokens") if isinstance(usage, Mapping) else None
    return n if isinstance(n, int) and not isinstance(n, bool) and 0 <= n <= 10_000_000 else None
