"""The router forwards conversation hints and retags a late tool, over real HTTP.

One OpenAI-shaped engine (uvicorn on 127.0.0.1, an explicit port) records every body it gets
and answers chat requests with a tool call, as JSON or as an SSE stream whose tool name
arrives in two fragments; ``kvtier route``'s proxy (RouterApp) sits in front of it.  No timing
assertions: every wait is for a condition, with a deadline."""
from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.routing import Route

from kvtier.engine_adapter.hints import HintReader, Retag
from kvtier.tiering.routing.config import RouterConfig, parse_engine
from kvtier.tiering.routing.proxy import RouterApp
from kvtier.tiering.service.server import ServiceServer

ROUTER_PORT, ENGINE_PORT = 28674, 28675
TOOLS = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}} for n in ("ls", "pytest")]


def until(cond, what: str, timeout_s: float = 20.0) -> None:
    end = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.01)


class Engine:
    """Records each body by path; a chat answer calls ``self.tool`` (``gate``: a stream holds after
    its tool name until the test lets it go on)."""

    def __init__(self) -> None:
        self.bodies: list[tuple[str, dict]] = []
        self.tool = "pytest"
        self.gate = threading.Event()
        self.gate.set()
        self.server: ServiceServer | None = None

    def seen(self, path: str) -> list[dict]:
        return [b for p, b in list(self.bodies) if p == path]

    def app(self) -> Starlette:
        async def metrics(_: Request):
            return PlainTextResponse("vllm:num_requests_waiting 0\nvllm:num_requests_running 0\n")

        async def tokenize(request: Request):
            return JSONResponse({"tokens": list(json.dumps((await request.json()).get("messages")).encode())})

        async def completions(request: Request):
            self.bodies.append(("/v1/completions", await request.json()))
            return JSONResponse({"object": "text_completion", "choices": [{"index": 0, "text": "."}]})

        async def chat(request: Request):
            body = await request.json()
            self.bodies.append(("/v1/chat/completions", body))
            tool = self.tool
            if not body.get("stream"):
                call = {"id": "c1", "type": "function", "function": {"name": tool, "arguments": "{}"}}
                return JSONResponse({"object": "chat.completion", "usage": {"total_tokens": 321},
                                     "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                                         "role": "assistant", "content": None, "tool_calls": [call]}}]})

            async def sse():
                def ev(delta, finish=None):
                    return "data: " + json.dumps({"choices": [{"index": 0, "delta": delta,
                                                               "finish_reason": finish}]}) + "\n\n"
                yield ev({"tool_calls": [{"index": 0, "id": "c1", "type": "function",
                                          "function": {"name": tool[:2], "arguments": ""}}]})
                yield ev({"tool_calls": [{"index": 0, "function": {"name": tool[2:]}}]})
                yield ev({"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]})
                end = time.monotonic() + 30
                while not self.gate.is_set() and time.monotonic() < end:
                    await asyncio.sleep(0.01)
                yield ev({}, "tool_calls")
                yield "data: [DONE]\n\n"
            return StreamingResponse(sse(), media_type="text/event-stream")

        return Starlette(routes=[Route("/metrics", metrics), Route("/tokenize", tokenize, methods=["POST"]),
                                 Route("/v1/completions", completions, methods=["POST"]),
                                 Route("/v1/chat/completions", chat, methods=["POST"])])


@pytest.fixture
def setup():
    eng = Engine()
    eng.server = ServiceServer(eng.app(), port=ENGINE_PORT)
    eng.server.start()
    app = RouterApp(RouterConfig((parse_engine(f"http://127.0.0.1:{ENGINE_PORT}"),), poll_interval_s=0.1))
    srv = ServiceServer(app, port=ROUTER_PORT)
    srv.start()
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            yield eng, app, c
    finally:
        eng.gate.set()
        srv.stop()
        eng.server.stop()


def chat(*extra: dict, **kw) -> dict:
    msgs = [{"role": "system", "content": "a coding agent"}, {"role": "user", "content": "fix the bug"}, *extra]
    return {"model": "m", "messages": msgs, "tools": TOOLS, **kw}


def kvtier_hint(body: dict) -> dict:
    return body["kv_transfer_params"]["kvtier"]


def test_the_router_adds_the_hint_reads_the_tool_and_retags_the_engine_json_and_sse(setup):
    eng, app, c = setup
    # turn 1 (JSON): the router names the trajectory; nothing forecast yet, so the hint names it only
    r = c.post("/v1/chat/completions", json=chat())
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "pytest"
    sent = eng.seen("/v1/chat/completions")[-1]
    tid = kvtier_hint(sent)["session_id"]
    assert tid.startswith("conv-") and "tool" not in kvtier_hint(sent)
    # the answer named pytest, which the engine was not told: a retag request reaches the engine that served it
    until(lambda: eng.seen("/v1/completions"), "the retag of turn 1")
    retag = eng.seen("/v1/completions")[0]
    assert retag["max_tokens"] == 1 and retag["prompt"] == [0] and retag["model"] == "m"
    st = HintReader().read(retag["kv_transfer_params"])       # what the vLLM plugin reads
    assert st.retag == Retag(tid, "pytest", None) and st.trajectory is None
    # turn 2 (SSE) carries pytest's results: the hint now forecasts pytest (the trajectory's tool) with the
    # context the last answer reported; the engine calls ls instead
    call = {"id": "c1", "type": "function", "function": {"name": "pytest", "arguments": "{}"}}
    body2 = chat({"role": "assistant", "content": None, "tool_calls": [call]},
                 {"role": "tool", "tool_call_id": "c1", "content": "1 failed"}, stream=True)
    eng.tool = "ls"
    eng.gate.clear()
    with c.stream("POST", "/v1/chat/completions", json=body2) as resp:
        it = resp.iter_raw()
        first = next(it)
        assert first.startswith(b"data: ")
        # the name was parsed mid-stream: the retag is sent while the engine still holds the answer's end
        until(lambda: len(eng.seen("/v1/completions")) == 2, "the retag of turn 2, before the answer ended")
        assert not eng.gate.is_set()
        eng.gate.set()
        rest = b"".join(it)
    assert rest.endswith(b"data: [DONE]\n\n")
    sent = eng.seen("/v1/chat/completions")[-1]
    assert kvtier_hint(sent) == {"tool": "pytest", "trajectory_id": tid, "context_tokens": 321}
    assert {k: v for k, v in sent.items() if k != "kv_transfer_params"} == body2   # the rest as the client sent it
    st = HintReader().read(eng.seen("/v1/completions")[1]["kv_transfer_params"])
    assert st.retag == Retag(tid, "ls", "pytest")
    m = c.get("/metrics").text
    assert "kvtier_router_conversation_hints_added_total 2" in m
    until(lambda: "kvtier_router_conversation_retags_sent_total 2" in c.get("/metrics").text, "retags counted")


def test_requests_without_tools_or_with_their_own_hint_pass_unchanged_and_bad_answers_fail_nothing(setup):
    eng, app, c = setup
    plain = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert c.post("/v1/chat/completions", json=plain).status_code == 200
    assert eng.seen("/v1/chat/completions")[-1] == plain                 # no tools: untouched
    own = chat(kv_transfer_params={"kvtier": {"tool": "edit", "trajectory_id": "mine"}})
    assert c.post("/v1/chat/completions", json=own).status_code == 200
    assert eng.seen("/v1/chat/completions")[-1] == own                   # the agent's own hint wins
    # the answer is read after the client has all of it
    until(lambda: app.conversation.counters["answers_read"] == 1, "the answer read")
    # and is not the router's to retag (retags are asked for before the client's answer ends)
    assert "retags" not in app.conversation.hints.stats() and eng.seen("/v1/completions") == []
    # the conversation component failing inside never fails the request
    def boom(*a, **k):
        raise RuntimeError("broken hints")
    app.conversation.hints.on_request = boom
    app.conversation.hints.on_response = boom
    r = c.post("/v1/chat/completions", json=chat())
    assert r.status_code == 200 and eng.seen("/v1/chat/completions")[-1] == chat()
    m = c.get("/metrics").text
    assert "kvtier_router_conversation_errors_total 1\n" in m, [x for x in m.splitlines() if "conversation" in x]
