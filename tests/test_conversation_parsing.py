"""Reading tool calls from chat requests, JSON responses and SSE streams (tiering/conversation)."""
from __future__ import annotations

import json

import pytest

from kvtier.tiering.conversation import ConversationError, ToolCall, ToolCallStream, read_request, \
    tool_calls_of_response


def _sse(*chunks: dict, done: bool = True) -> bytes:
    out = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks)
    return out + (b"data: [DONE]\n\n" if done else b"")


def _delta(calls: list | None = None, finish: str | None = None, **delta) -> dict:
    if calls is not None:
        delta["tool_calls"] = calls
    return {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


# ----------------------------------------------------------------------------- requests
def test_a_request_names_the_tools_whose_results_it_carries():
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "pytest", "arguments": "{}"}},
                {"id": "c2", "type": "function", "function": {"name": "grep", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "3 passed"},
            {"role": "tool", "tool_call_id": "c2", "content": "foo.py:3"}]
    req = read_request({"messages": msgs})
    assert req.answered == (ToolCall("pytest", "c1"), ToolCall("grep", "c2"))
    assert req.last_tool == "pytest"
    # a first turn, and a user's turn after an answer, carry no tool results
    assert read_request({"messages": msgs[:2]}).answered == ()
    assert read_request({"messages": msgs[:2] + [{"role": "assistant", "content": "hi"},
                                                 {"role": "user", "content": "more"}]}).last_tool is None


@pytest.mark.parametrize("body, match", [
    ([], "must be an object"),
    ({"messages": []}, "non-empty 'messages'"),
    ({"messages": "hi"}, "non-empty 'messages'"),
    ({"messages": [{"content": "no role"}]}, "string 'role'"),
    ({"messages": [{"role": "user"}, {"role": "assistant", "tool_calls": "x"},
                   {"role": "tool", "tool_call_id": "1"}]}, "tool_calls must be a list"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"id": "1", "function": {"name": "x" * 500}}]},
                   {"role": "tool", "tool_call_id": "1"}]}, "at most 128"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"id": "1", "function": {"name": "a\nb"}}]},
                   {"role": "tool", "tool_call_id": "1"}]}, "control characters"),
])
def test_malformed_requests_are_clear_errors(body, match):
    with pytest.raises(ConversationError, match=match):
        read_request(body)


# ----------------------------------------------------------------------------- JSON responses
def test_the_tool_calls_of_a_json_response():
    body = {"choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": None,
        "tool_calls": [{"id": "call_9", "type": "function", "function": {"name": "edit", "arguments": "{}"}}]}}]}
    assert tool_calls_of_response(body) == (ToolCall("edit", "call_9"),)
    # the legacy function_call, and a final answer that calls no tool
    legacy = {"choices": [{"message": {"role": "assistant", "function_call": {"name": "ls", "arguments": ""}}}]}
    assert tool_calls_of_response(legacy) == (ToolCall("ls"),)
    assert tool_calls_of_response({"choices": [{"message": {"role": "assistant", "content": "done"}}]}) == ()
    with pytest.raises(ConversationError, match="choices"):
        tool_calls_of_response({"error": "overloaded"})


# ----------------------------------------------------------------------------- SSE streams
def test_a_streamed_name_is_known_before_the_stream_ends_whatever_the_byte_pieces():
    data = _sse(_delta(role="assistant"),
                _delta([{"index": 0, "id": "call_1", "type": "function", "function": {"name": "pyt", "arguments": ""}}]),
                _delta([{"index": 0, "function": {"name": "est"}}]),
                _delta([{"index": 0, "function": {"arguments": "{\"k\": "}}]),
                _delta([{"index": 0, "function": {"arguments": "1}"}}]),
                _delta(finish="tool_calls"))
    line_end = data.index(b"\n", data.index(b'{\\"k\\"')) + 1    # the end of the line where arguments start
    for piece in (1, 3, 17, len(data)):
        s = ToolCallStream()
        seen_at = None
        for j in range(0, len(data), piece):
            if s.feed(data[j:j + piece]):
                seen_at = j + piece
        # the name "pytest" (two fragments joined) is reported once, as soon as the arguments start
        assert s.named() == (ToolCall("pytest", "call_1"),) and s.done
        assert seen_at is not None and seen_at < line_end + piece
        if piece < 20:
            assert seen_at < len(data) - 100            # well before the stream ends
        assert s.skipped == 0


def test_parallel_calls_each_complete_when_the_next_starts():
    s = ToolCallStream()
    first = s.feed(_sse(_delta([{"index": 0, "id": "a", "function": {"name": "grep", "arguments": ""}}]), done=False))
    assert first == ()                          # "grep" may still grow
    second = s.feed(_sse(_delta([{"index": 1, "id": "b", "function": {"name": "ls", "arguments": ""}}]), done=False))
    assert second == ("grep",)
    assert s.feed(b"data: [DONE]\n\n") == ("ls",)
    assert [c.name for c in s.calls()] == ["grep", "ls"]


def test_a_hostile_stream_is_skipped_line_by_line_and_bounded():
    s = ToolCallStream(max_line=1000)
    s.feed(b"data: " + b"x" * 5000)             # an endless line: dropped, not buffered
    s.feed(b"y" * 5000 + b"\n")
    s.feed(b"data: {not json}\n\ndata: [1, 2]\n\n: a comment\nevent: ping\n\n")
    s.feed(_sse(_delta([{"index": 0, "function": {"name": "n" * 300, "arguments": "{}"}}]), done=False))
    s.feed(_sse(_delta([{"index": 10 ** 9, "function": {"name": "big", "arguments": "{}"}}]), done=False))
    s.feed(_sse(_delta([{"index": 1, "function": {"name": "ok", "arguments": "{}"}}])))
    assert s.skipped >= 2 and len(s._buf) <= 1000
    # the over-long name and the absurd index are left out; the readable call is kept
    assert s.named() == (ToolCall("ok"),) and s.done


def test_results_that_name_no_call_answer_every_call_of_the_last_assistant_message():
    msgs = [{"role": "user", "content": "u"},
            {"role": "assistant", "tool_calls": [{"id": "c1", "function": {"name": "ls"}}]},
            {"role": "tool", "content": "a.py"}]                       # no tool_call_id
    assert read_request({"messages": msgs}).last_tool == "ls"
