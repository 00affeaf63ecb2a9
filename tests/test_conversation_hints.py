"""ConversationHints: learning tool waits from chat traffic, forecasting the next tool, the hint a
router forwards (read back by the engine plugin's own HintReader), and bad input."""
from __future__ import annotations

import json

import pytest

from kvtier.engine_adapter.hints import HintReader
from kvtier.tiering.conversation import ConversationHints, NextToolForecaster, make_hint
from kvtier.tiering.forecasting.predictor import ToolWaitPredictor

TOOLS = [{"type": "function", "function": {"name": n}} for n in ("ls", "pytest", "edit")]


class Agent:
    """One agent's conversation as a router sees it: requests and responses on a trace clock."""

    def __init__(self, hints: ConversationHints, task: str = "fix it", system: str = "agent") -> None:
        self.hints, self.now = hints, 0.0
        self.msgs: list[dict] = [{"role": "system", "content": system}, {"role": "user", "content": task}]
        self.n = 0

    def request(self):
        return self.hints.on_request({"model": "m", "messages": list(self.msgs), "tools": TOOLS}, self.now)

    def respond(self, tid: str, tool: str | None, *, stream: bool = False, gen_s: float = 1.0):
        self.now += gen_s
        self.n += 1
        cid = f"call_{self.n}"
        call = {"id": cid, "type": "function", "function": {"name": tool, "arguments": "{}"}}
        if stream:
            w = self.hints.stream(tid)
            head = {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, **call}]}}]}
            named = w.feed(b"data: " + json.dumps(head).encode() + b"\n\n") if tool else ()
            started = w.end(self.now)
            assert not tool or named == (tool,)
        else:
            msg = {"role": "assistant", "content": None, **({"tool_calls": [call]} if tool else {})}
            started = self.hints.on_response(tid, {"choices": [{"index": 0, "message": msg}]}, self.now)
        if tool:
            self.msgs += [{"role": "assistant", "content": None, "tool_calls": [call]},
                          {"role": "tool", "tool_call_id": cid, "content": "out"}]
        return started

    def run(self, tool: str, wait_s: float, **kw):
        fwd = self.request()
        self.respond(fwd.trajectory_id, tool, **kw)
        self.now += wait_s
        return fwd


def test_a_tools_wait_is_learned_from_the_end_of_the_response_to_the_request_with_its_results():
    pred = ToolWaitPredictor()
    hints = ConversationHints(pred)
    a = Agent(hints)
    # turn 1: no tool results yet, nothing learned
    first = a.run("pytest", 42.0)
    assert first.observed is None
    # turn 2 carries pytest's results, 42 s after turn 1's response ended
    second = a.run("ls", 0.25, stream=True)
    assert second.trajectory_id == first.trajectory_id
    assert second.observed.tool == "pytest" and second.observed.wait_s == pytest.approx(42.0)
    third = a.request()
    assert third.observed.tool == "ls" and third.observed.wait_s == pytest.approx(0.25)
    # the predictor learned each wait under its true tool
    assert pred.tools() == {"pytest": 1, "ls": 1}
    assert hints.stats()["observations"] == 2


def test_the_hint_forecasts_the_next_tool_from_learned_transitions():
    hints = ConversationHints(ToolWaitPredictor())
    # the agent always runs ls -> edit -> pytest -> ls ...: learned from a first run
    a = Agent(hints, task="task 1")
    for tool in ("ls", "edit", "pytest", "ls", "edit", "pytest"):
        a.run(tool, 1.0)
    # a new run of the same agent (another task): the first move and every transition are known
    b = Agent(hints, task="task 2")
    told = []
    for tool in ("ls", "edit", "pytest", "ls"):
        fwd = b.run(tool, 1.0)
        told.append((fwd.forecast.tool, fwd.forecast.source))
    assert told == [("ls", "transition"), ("edit", "transition"), ("pytest", "transition"), ("ls", "transition")]


def test_forecast_falls_back_from_transition_to_trajectory_to_agent_to_none():
    f = NextToolForecaster()
    assert f.forecast("agent", "t1", None).source == "none"
    f.observe("agent", "t1", None, "ls")
    f.observe("agent", "t1", "ls", "ls")
    f.observe("agent", "t2", None, "edit")
    f.observe("agent", "t2", "edit", "edit")
    f.observe("agent", "t2", "edit", "edit")
    assert f.forecast("agent", "t1", "ls").tool == "ls"                     # transition
    assert f.forecast("agent", "t1", "pytest") == f.forecast("agent", "t1", "pytest")
    assert f.forecast("agent", "t1", "pytest").source == "trajectory"         # t1's own most frequent
    assert (f.forecast("agent", "t1", "pytest").tool, f.forecast("agent", "t3", "pytest").source) == ("ls", "agent")
    assert f.forecast("agent", "t3", "pytest").tool == "edit"                 # the agent's most frequent
    assert f.forecast("other agent", "t9", "ls").source == "none"


def test_the_forwarded_hint_is_what_the_engine_plugin_reads():
    hints = ConversationHints(ToolWaitPredictor())
    a = Agent(hints)
    cold = a.run("pytest", 5.0)
    # no forecast yet: only the trajectory, so the engine uses its unhinted class
    st = HintReader().read(cold.body["kv_transfer_params"])
    assert st.hint is None and st.trajectory == cold.trajectory_id and not st.ends
    a.run("pytest", 5.0)
    warm = a.request()
    st = HintReader().read(warm.body["kv_transfer_params"])
    assert st.hint.tool == "pytest" and st.trajectory == warm.trajectory_id
    assert st.hint.context_tokens is None or st.hint.context_tokens >= 0
    assert warm.hint == make_hint("pytest", warm.trajectory_id)
    # the caller's body is not changed in place
    assert "kv_transfer_params" not in a.msgs[0]


def test_an_agent_that_sends_its_own_hint_is_forwarded_untouched_and_still_learned():
    pred = ToolWaitPredictor()
    hints = ConversationHints(pred)
    a = Agent(hints)
    a.run("edit", 2.0)
    own = {"model": "m", "messages": list(a.msgs), "tools": TOOLS,
           "kv_transfer_params": {"kvtier": {"tool": "pytest", "trajectory_id": "mine"}}}
    fwd = hints.on_request(own, a.now)
    assert fwd.body is own and fwd.hint is None
    assert fwd.observed.tool == "edit" and pred.tools() == {"edit": 1}


def test_a_forecast_that_names_the_wrong_tool_still_learns_the_true_one():
    pred = ToolWaitPredictor()
    hints = ConversationHints(pred)
    a = Agent(hints)
    a.run("ls", 1.0)
    a.run("ls", 1.0)
    told = a.run("pytest", 30.0)               # the hint said ls, the response called pytest
    assert told.forecast.tool == "ls"
    back = a.request()
    assert back.observed.tool == "pytest" and back.observed.forecast == "ls" and not back.observed.correct
    assert pred.tools()["pytest"] == 1


@pytest.mark.parametrize("body", [None, 7, "text", [], {}, {"messages": []}, {"messages": [1, 2]},
                                  {"messages": [{"role": "user", "content": float("inf")}]},
                                  {"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "x" * 10**5}}]},
                                                {"role": "tool", "tool_call_id": "1"}]}])
def test_bad_requests_pass_through_untouched_and_counted(body):
    hints = ConversationHints(ToolWaitPredictor())
    fwd = hints.on_request(body, 0.0)
    assert fwd.body is body and fwd.trajectory_id is None and fwd.hint is None
    st = hints.stats()
    assert st["rejected:request"] == 1 and st["last_error"]
    assert len(st["last_error"]) < 300                   # never echoes a huge value


def test_bad_responses_and_streams_never_raise():
    hints = ConversationHints(ToolWaitPredictor())
    a = Agent(hints)
    fwd = a.request()
    assert hints.on_response(fwd.trajectory_id, {"choices": "no"}, 1.0).tool is None
    assert hints.on_response("unknown", {"choices": []}, 1.0) is None
    assert hints.on_response(None, None) is None
    w = hints.stream(fwd.trajectory_id)
    assert w.feed(12345) == () and w.feed(b"\xff\xfe garbage\n\n") == ()
    assert w.end(2.0) is not None and w.end(3.0) is None
    assert hints.stats()["rejected:response"] >= 2


def test_thousands_of_distinct_tools_and_conversations_keep_memory_bounded():
    pred = ToolWaitPredictor()
    hints = ConversationHints(pred, forecaster=NextToolForecaster(max_agents=4, max_rows=16, max_next=4,
                                                                  max_trajectories=50), max_trajectories=50)
    for i in range(300):
        a = Agent(hints, task=f"task {i}", system=f"agent {i % 7}")
        for j in range(8):
            a.run(f"tool_{i}_{j}", 0.5)
        a.request()
    st = hints.stats()
    assert st["observations"] == 300 * 8
    assert st["trajectories"] <= 50
    assert st["forecaster_agents"] <= 4 and st["forecaster_rows"] <= 4 * 16 and st["forecaster_trajectories"] <= 50
    assert st["forecaster_names"] <= 4 * 4 + 4 * 16 * 4 + 50 * 4
    assert len(pred) <= pred.config.max_nodes + 2 and pred.folded > 0


def test_a_retried_request_learns_no_second_wait():
    pred = ToolWaitPredictor()
    hints = ConversationHints(pred)
    a = Agent(hints)
    a.run("pytest", 10.0)
    body = {"model": "m", "messages": list(a.msgs), "tools": TOOLS}
    first = hints.on_request(body, a.now)
    # the engine failed: the response ended with an error, and the client sends the same request again
    hints.on_response(first.trajectory_id, {"error": {"message": "overloaded"}}, a.now + 1)
    again = hints.on_request(body, a.now + 5)
    assert first.observed.tool == "pytest" and again.observed is None
    assert again.trajectory_id == first.trajectory_id
    assert pred.tools() == {"pytest": 1} and hints.stats()["retries"] == 1


def test_agents_on_many_threads_each_learn_their_own_waits():
    import threading
    pred = ToolWaitPredictor()
    hints = ConversationHints(pred)
    errors: list[BaseException] = []

    def agent(i: int) -> None:
        try:
            a = Agent(hints, task=f"task {i}")
            for j in range(20):
                fwd = a.run("pytest" if j % 2 else "ls", 1.0 + i, stream=bool(j % 3))
                assert j == 0 or fwd.observed.wait_s == pytest.approx(1.0 + i)
        except BaseException as exc:      # reported below, not lost in the thread
            errors.append(exc)

    threads = [threading.Thread(target=agent, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:1]
    assert hints.stats()["observations"] == 8 * 19 and hints.stats()["trajectories"] == 8
    assert pred.tools() == {"ls": 8 * 10, "pytest": 8 * 9}     # the last pytest of each is never answered


def test_a_parsed_tool_other_than_the_forecast_asks_for_one_retag_the_engine_reads():
    hints = ConversationHints()
    a = Agent(hints)
    # turn 1: nothing learned, no forecast (the hint names the trajectory only): pytest corrects "none"
    fwd = a.request()
    assert fwd.hint["kvtier"].get("tool") is None
    assert hints.retag(fwd.trajectory_id) is None              # nothing parsed yet
    a.respond(fwd.trajectory_id, "pytest", stream=True)
    r = hints.retag(fwd.trajectory_id)
    assert (r.trajectory_id, r.tool, r.forecast) == (fwd.trajectory_id, "pytest", None)
    assert hints.retag(fwd.trajectory_id) is None              # once per turn
    # the engine plugin reads the retag request's hint as that correction, naming no trajectory
    body = r.body("m")
    assert body["prompt"] == [0] and body["max_tokens"] == 1 and body["model"] == "m"
    st = HintReader().read(body["kv_transfer_params"])
    assert st.retag.trajectory_id == fwd.trajectory_id and st.retag.tool == "pytest" and st.retag.forecast is None
    assert st.trajectory is None and st.hint is None
    a.now += 5.0
    # turn 2 (after pytest): nothing learned after pytest yet, so the trajectory's pytest is forecast; edit comes
    fwd = a.request()
    assert fwd.hint["kvtier"]["tool"] == "pytest"
    a.respond(fwd.trajectory_id, "edit")
    r = hints.retag(fwd.trajectory_id)
    assert (r.tool, r.forecast) == ("edit", "pytest")
    assert HintReader().read(r.body("m")["kv_transfer_params"]).retag.forecast == "pytest"
    a.now += 5.0
    # turn 3: a right forecast needs no retag
    hints2 = ConversationHints()
    b = Agent(hints2, task="other")
    b.run("ls", 1.0)
    b.run("ls", 1.0)
    fwd = b.request()
    assert fwd.hint["kvtier"]["tool"] == "ls"
    b.respond(fwd.trajectory_id, "ls")
    assert hints2.retag(fwd.trajectory_id) is None
    assert hints.stats()["retags"] == 2 and "retags" not in hints2.stats()


def test_no_retag_for_a_turn_the_client_hinted_or_one_already_followed_by_its_next_request():
    hints = ConversationHints()
    a = Agent(hints)
    own = {"model": "m", "messages": list(a.msgs), "tools": TOOLS, "kv_transfer_params": make_hint("edit", "mine")}
    fwd = hints.on_request(own, 0.0)
    a.respond(fwd.trajectory_id, "pytest")
    assert hints.retag(fwd.trajectory_id) is None              # the agent's own hint is not the router's to correct
    a.now += 1.0
    fwd = a.request()                                          # the next request came first: its turn has no name yet
    assert hints.retag(fwd.trajectory_id) is None
    assert hints.retag(None) is None and hints.retag("conv-unknown") is None
