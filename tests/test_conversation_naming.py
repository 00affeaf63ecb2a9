"""Naming a conversation's trajectory from its OpenAI chat requests (tiering/conversation/naming.py)."""
from __future__ import annotations

import pytest

from kvtier.tiering.conversation import ConversationError, TrajectoryNamer, read_request

TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
SYS = {"role": "system", "content": "You are a coding agent."}


def _name(namer: TrajectoryNamer, messages: list, tools=TOOLS, **extra):
    body = {"model": "m", "messages": messages, "tools": tools, **extra}
    return namer.name(body, read_request(body).messages)


def _call(cid: str, tool: str = "bash") -> dict:
    return {"role": "assistant", "content": None,
            "tool_calls": [{"id": cid, "type": "function", "function": {"name": tool, "arguments": "{}"}}]}


def _result(cid: str, text: str = "ok") -> dict:
    return {"role": "tool", "tool_call_id": cid, "content": text}


def test_the_next_turn_of_a_conversation_keeps_its_id():
    n = TrajectoryNamer()
    user = {"role": "user", "content": "fix the bug in foo.py"}
    # turn 1 -> a new trajectory
    first = _name(n, [SYS, user])
    assert first.trajectory_id.startswith("conv-") and len(first.trajectory_id) <= 40
    # turn 2 extends turn 1's messages -> the same id
    second = _name(n, [SYS, user, _call("c1"), _result("c1")])
    assert second.trajectory_id == first.trajectory_id
    # a retry of turn 2 (the same messages) -> the same id
    assert _name(n, [SYS, user, _call("c1"), _result("c1")]).trajectory_id == first.trajectory_id
    assert len(n) == 1


def test_key_order_and_whitespace_of_json_do_not_change_the_name():
    a, b = TrajectoryNamer(), TrajectoryNamer()
    tools_reordered = [{"function": {"parameters": {"type": "object"}, "name": "bash"}, "type": "function"}]
    user = {"role": "user", "content": "task"}
    assert _name(a, [SYS, user]).trajectory_id == _name(b, [SYS, user], tools=tools_reordered).trajectory_id


def test_different_conversations_get_different_ids():
    n = TrajectoryNamer()
    ids = {_name(n, [SYS, {"role": "user", "content": f"task {i}"}]).trajectory_id for i in range(3)}
    # another system prompt, other tools, another client: other trajectories
    ids.add(_name(n, [{"role": "system", "content": "other"}, {"role": "user", "content": "task 0"}]).trajectory_id)
    ids.add(_name(n, [SYS, {"role": "user", "content": "task 0"}], tools=[]).trajectory_id)
    ids.add(_name(n, [SYS, {"role": "user", "content": "task 0"}], user="client-b").trajectory_id)
    assert len(ids) == 6


def test_a_second_run_of_the_same_task_is_its_own_branch():
    n = TrajectoryNamer()
    user = {"role": "user", "content": "same task"}
    run1 = _name(n, [SYS, user]).trajectory_id
    run1_t2 = _name(n, [SYS, user, _call("a1"), _result("a1", "out A")]).trajectory_id
    # run 2 starts while run 1 is further on: its [S, U] does not extend run 1's last request
    run2 = _name(n, [SYS, user]).trajectory_id
    run2_t2 = _name(n, [SYS, user, _call("b1", "ls"), _result("b1", "out B")]).trajectory_id
    run1_t3 = _name(n, [SYS, user, _call("a1"), _result("a1", "out A"), _call("a2"), _result("a2")]).trajectory_id
    assert run1 == run1_t2 == run1_t3
    assert run2 == run2_t2 != run1 and run2.startswith(run1 + ".")
    # the agent is the same in both runs (system prompt and tools)
    assert _name(n, [SYS, user]).agent == _name(n, [SYS, {"role": "user", "content": "x"}]).agent


def test_the_namer_is_bounded_by_roots_and_branches():
    n = TrajectoryNamer(max_roots=10, max_branches=2)
    for i in range(1000):
        _name(n, [SYS, {"role": "user", "content": f"task {i}"}])
    for i in range(50):   # 50 runs of one task, each a new branch
        _name(n, [SYS, {"role": "user", "content": "one"}, _call(f"c{i}"), _result(f"c{i}")])
    assert len(n) <= 10 * 2


def test_content_that_is_not_json_data_is_a_clear_error():
    n = TrajectoryNamer()
    body = {"messages": [{"role": "user", "content": float("nan")}]}
    with pytest.raises(ConversationError, match="not JSON"):
        n.name(body, body["messages"])
    with pytest.raises(ValueError):
        TrajectoryNamer(max_roots=0)
