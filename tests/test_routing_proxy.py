"""``kvtier route``'s proxy over real HTTP: two small OpenAI-shaped engines (uvicorn on loopback,
explicit ports), their KV events on real ZMQ PUB sockets, and the router in front of them.

The engines tokenize one token per UTF-8 byte (``/tokenize``), answer chat completions as JSON
or as an SSE stream, and report a queue on ``/metrics`` the test sets.  No timing assertions:
every wait is for a condition, with a deadline."""
from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import msgspec
import pytest
import zmq
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.routing import Route

from kvtier.tiering.prefix.score import Weights
from kvtier.tiering.routing.config import RouterConfig, parse_engine
from kvtier.tiering.routing.events import BlockStored
from kvtier.tiering.routing.hashing import BlockHasher
from kvtier.tiering.routing.proxy import RouterApp
from kvtier.tiering.routing.weights import TierWeights
from kvtier.tiering.service.server import ServiceServer

ROUTER_PORT = 28650
PORT_A, PORT_B = 28651, 28652
ZMQ_A, ZMQ_B = "tcp://127.0.0.1:28653", "tcp://127.0.0.1:28654"
A, B = f"127.0.0.1:{PORT_A}", f"127.0.0.1:{PORT_B}"


def until(cond, what: str, timeout_s: float = 20.0) -> None:
    end = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.01)


def tokens_of(body: dict) -> list[int]:
    """The fake engines' tokenizer: one token per UTF-8 byte of the rendered prompt."""
    if "messages" in body:
        return list(json.dumps(body["messages"], sort_keys=True).encode())
    return list(body["prompt"].encode())


class FakeEngine:
    """An OpenAI-shaped engine on 127.0.0.1:port (started and stopped by its uvicorn thread)."""

    def __init__(self, name: str, port: int) -> None:
        self.name, self.port = name, port
        self.waiting = 0
        self.seen: list[dict] = []
        self.release = threading.Event()      # lets a "hold" request finish
        self.cancelled = threading.Event()    # set when a client went away mid-answer
        self.server: ServiceServer | None = None

    async def _wait_release(self, request: Request | None = None) -> bool:
        end = time.monotonic() + 30
        while not self.release.is_set() and time.monotonic() < end:
            if request is not None and await request.is_disconnected():
                return False
            await asyncio.sleep(0.01)
        return self.release.is_set()

    def app(self) -> Starlette:
        async def metrics(_: Request):
            return PlainTextResponse(
                "# TYPE vllm:num_requests_waiting gauge\n"
                f'vllm:num_requests_waiting{{engine="0",model_name="m"}} {self.waiting}\n'
                f'vllm:num_requests_running{{engine="0",model_name="m"}} 0\n')

        async def tokenize(request: Request):
            return JSONResponse({"count": 0, "max_model_len": 4096, "tokens": tokens_of(await request.json())})

        async def models(_: Request):
            return JSONResponse({"object": "list", "data": [{"id": "m", "object": "model"}]})

        async def chat(request: Request):
            body = await request.json()
            self.seen.append(body)
            if body.get("model") == "nope":
                return JSONResponse({"error": {"message": "The model `nope` does not exist.",
                                               "type": "NotFoundError", "code": 404}}, status_code=404)
            if body.get("hold"):
                if not await self._wait_release(request):
                    self.cancelled.set()
                    return JSONResponse({}, status_code=499)
            if not body.get("stream"):
                return JSONResponse({"object": "chat.completion", "model": body.get("model"),
                                     "choices": [{"index": 0, "message": {"role": "assistant",
                                                                          "content": f"hi from {self.name}"}}]})

            async def sse():
                done = False
                try:
                    for i in range(3):
                        yield f'data: {{"choices": [{{"delta": {{"content": "{self.name}-{i}"}}}}]}}\n\n'
                        if i == 0 and body.get("hold_stream"):
                            if not await self._wait_release():
                                yield "data: released too late\n\n"
                    yield "data: [DONE]\n\n"
                    done = True
                finally:
                    if not done:
                        self.cancelled.set()
            return StreamingResponse(sse(), media_type="text/event-stream")

        return Starlette(routes=[Route("/metrics", metrics), Route("/tokenize", tokenize, methods=["POST"]),
                                 Route("/v1/models", models), Route("/v1/chat/completions", chat, methods=["POST"]),
                                 Route("/v1/completions", chat, methods=["POST"])])

    def start(self) -> None:
        self.server = ServiceServer(self.app(), port=self.port)
        self.server.start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None


@pytest.fixture
def engines():
    a, b = FakeEngine("A", PORT_A), FakeEngine("B", PORT_B)
    a.start()
    b.start()
    yield a, b
    for e in (a, b):
        e.release.set()
        e.stop()


@pytest.fixture
def pubs():
    ctx = zmq.Context()
    socks = {}
    for name, ep in ((A, ZMQ_A), (B, ZMQ_B)):
        s = ctx.socket(zmq.PUB)
        s.setsockopt(zmq.LINGER, 0)
        s.bind(ep)
        socks[name] = s
    yield socks
    for s in socks.values():
        s.close(0)
    ctx.term()


class Published:
    """Sends vLLM-schema batches on an engine's PUB socket, numbering them."""

    def __init__(self, sock) -> None:
        self.sock, self.seq = sock, 0

    def send(self, *events) -> None:
        self.sock.send_multipart([b"", self.seq.to_bytes(8, "big"),
                                  msgspec.msgpack.encode([time.time(), list(events)])])
        self.seq += 1


def router(poll_s: float = 0.1, events: bool = True, **kw) -> tuple[RouterApp, ServiceServer]:
    specs = (parse_engine(f"http://{A}" + (f"={ZMQ_A}" if events else "")),
             parse_engine(f"http://{B}/v1" + (f"={ZMQ_B}" if events else "")))
    cfg = RouterConfig(specs, Weights(0.5, 1.0), TierWeights(host=0.9, nvme=0.5, remote=0.7),
                       poll_interval_s=poll_s, **kw)
    app = RouterApp(cfg)
    srv = ServiceServer(app, port=ROUTER_PORT)
    srv.start()
    return app, srv


def joined(app: RouterApp, pubs: dict[str, object]) -> dict[str, Published]:
    """Publish empty batches until the router's subscriber has one from each engine."""
    out = {name: Published(s) for name, s in pubs.items()}
    for name, p in out.items():
        while app.subscriber.stats[name].batches == 0:
            p.send()
            time.sleep(0.02)
            assert p.seq < 1000, "the subscriber never joined"
    return out


CHAT = {"model": "m", "messages": [{"role": "system", "content": "You are a careful coding agent. " * 8},
                                   {"role": "user", "content": "List the files."}]}


def hold_prefix(pub: Published, app: RouterApp, engine: str, body: dict, medium: str = "GPU") -> int:
    """Engine ``engine`` announces the full blocks of ``body``'s prompt; returns their count."""
    hashes = BlockHasher().hashes(tokens_of(body), 16)
    pub.send(BlockStored(hashes, None, 16, medium))
    until(lambda: app.directory.match(engine, hashes, 16).blocks == len(hashes), f"{engine}'s blocks applied")
    return len(hashes)


def load_seen(app: RouterApp, engine: str, load: float) -> None:
    until(lambda: app.pool[engine].load == load, f"the router sees {engine}'s queue at {load}")


# ------------------------------------------------------------------------------ tests
def test_the_engine_holding_the_prefix_wins_unless_its_queue_is_long(engines, pubs):
    a, b = engines
    app, srv = router()
    try:
        pub = joined(app, pubs)
        blocks = hold_prefix(pub[B], app, B, CHAT)
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            # B holds the prompt's blocks: B answers, A never sees the request
            r = c.post("/v1/chat/completions", json=CHAT)
            assert r.status_code == 200 and r.headers["x-kvtier-engine"] == B
            assert r.json()["choices"][0]["message"]["content"] == "hi from B"
            assert b.seen == [CHAT] and a.seen == []
            # B's queue grows to 20: its prefix no longer pays for the wait, A answers
            b.waiting = 20
            load_seen(app, B, 20)
            r = c.post("/v1/chat/completions", json=CHAT)
            assert r.headers["x-kvtier-engine"] == A and a.seen == [CHAT]
            # B's queue drains: back to B
            b.waiting = 0
            load_seen(app, B, 0)
            assert c.post("/v1/chat/completions", json=CHAT).headers["x-kvtier-engine"] == B
            # the router's counters: what it routed and how much prefix the winners held
            m = c.get("/metrics").text
            assert f'kvtier_router_requests_total{{engine="{B}"}} 2' in m
            assert f'kvtier_router_requests_total{{engine="{A}"}} 1' in m
            assert f"kvtier_router_matched_tokens_total {2 * 16 * blocks}" in m
    finally:
        srv.stop()


def test_a_prefix_on_a_slower_tier_weighs_less_than_one_in_hbm(engines, pubs):
    a, b = engines
    app, srv = router()
    try:
        pub = joined(app, pubs)
        # A holds the prompt on NVMe (weight 0.5), B in HBM; A's queue is 2, B's 3 (of L_max 3)
        hold_prefix(pub[A], app, A, CHAT, "STORAGE")
        hold_prefix(pub[B], app, B, CHAT, "GPU")
        a.waiting, b.waiting = 2, 3
        load_seen(app, A, 2)
        load_seen(app, B, 3)
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            # A: 0.5 * 0.5 * hit - 0.5 * 2/3 ; B: 0.5 * hit - 0.5: B's hit outweighs its queue
            assert c.post("/v1/chat/completions", json=CHAT).headers["x-kvtier-engine"] == B
    finally:
        srv.stop()


def test_json_and_sse_pass_through_unchanged_and_chunk_by_chunk(engines, pubs):
    fake = dict(zip((A, B), engines))
    app, srv = router(events=False)
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            # no events and equal loads: ties go to the engines in turn; each answer is compared
            # with the same request sent straight to the engine that served it
            for body in (CHAT, {**CHAT, "stream": True}):
                via = c.post("/v1/chat/completions", json=body)
                name = via.headers["x-kvtier-engine"]
                with httpx.Client(base_url=f"http://{name}", timeout=30) as d:
                    direct = d.post("/v1/chat/completions", json=body)
                assert (via.status_code, via.headers["content-type"], via.content) == \
                    (direct.status_code, direct.headers["content-type"], direct.content)
                tag = "A" if name == A else "B"
                assert (f'"{tag}-2"' if body.get("stream") else f"hi from {tag}").encode() in via.content
            assert via.content.endswith(b"data: [DONE]\n\n")
            # the engine's errors pass through: status and body
            via = c.post("/v1/chat/completions", json={**CHAT, "model": "nope"})
            with httpx.Client(base_url=f"http://{via.headers['x-kvtier-engine']}", timeout=30) as d:
                direct = d.post("/v1/chat/completions", json={**CHAT, "model": "nope"})
            assert via.status_code == direct.status_code == 404 and via.content == direct.content
            # /v1/models is forwarded
            assert c.get("/v1/models").json()["data"][0]["id"] == "m"
            # chunk by chunk: the first event arrives while the engine still holds the rest
            with c.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True, "hold_stream": True}) as r:
                eng = fake[r.headers["x-kvtier-engine"]]
                tag = "A" if eng is engines[0] else "B"
                it = r.iter_raw()
                first = next(it)
                assert first.startswith(b"data: ") and f"{tag}-0".encode() in first and not eng.release.is_set()
                eng.release.set()
                rest = b"".join(it)
            assert f"{tag}-2".encode() in rest and rest.endswith(b"data: [DONE]\n\n")
    finally:
        srv.stop()


def test_a_client_that_goes_cancels_the_upstream_request(engines):
    fake = dict(zip((A, B), engines))
    app, srv = router(events=False)
    try:
        # a stream: the client reads one event and hangs up
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            with c.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True, "hold_stream": True}) as r:
                eng = fake[r.headers["x-kvtier-engine"]]
                assert b"-0" in next(r.iter_raw())
        until(eng.cancelled.is_set, "the engine saw its client go")
        # a JSON answer the engine is still computing: the client gives up waiting
        for e in engines:
            e.cancelled.clear()
        with httpx.Client(base_url=srv.url, timeout=httpx.Timeout(30, read=0.5)) as c:
            with pytest.raises(httpx.ReadTimeout):
                c.post("/v1/chat/completions", json={**CHAT, "hold": True})
        until(lambda: any(e.cancelled.is_set() for e in engines), "the engine saw the JSON request's client go")
        until(lambda: app.counters.client_disconnects == 2, "the router counted both")
        assert not any(e.release.is_set() for e in engines)
    finally:
        srv.stop()


def test_a_refused_engine_is_taken_out_and_the_request_goes_to_the_next(engines, pubs):
    a, b = engines
    app, srv = router(poll_s=3600)       # one poll at start-up: only the failed connection takes B out
    try:
        pub = joined(app, pubs)
        hold_prefix(pub[B], app, B, CHAT)
        b.stop()
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            r = c.post("/v1/chat/completions", json=CHAT)
            assert r.status_code == 200 and r.headers["x-kvtier-engine"] == A
            health = {e["engine"]: e for e in c.get("/health").json()["engines"]}
            assert health[B]["up"] is False and "ConnectError" in health[B]["last_error"]
            assert "kvtier_router_retries_total 1" in c.get("/metrics").text
    finally:
        srv.stop()


def test_a_dead_engine_is_taken_out_and_put_back_when_it_answers(engines, pubs):
    a, b = engines
    app, srv = router(poll_s=0.1)
    try:
        pub = joined(app, pubs)
        hold_prefix(pub[B], app, B, CHAT)
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            b.stop()
            until(lambda: not app.pool[B].up, "B taken out by the poll")
            assert c.post("/v1/chat/completions", json=CHAT).headers["x-kvtier-engine"] == A
            a.stop()
            until(lambda: not app.pool[A].up, "A taken out by the poll")
            r = c.get("/health")
            assert r.status_code == 503 and r.json()["status"] == "unavailable"
            r = c.post("/v1/chat/completions", json=CHAT)
            assert r.status_code == 503 and r.json()["error"]["message"] == "no engine is up"
            b.start()
            until(lambda: app.pool[B].up, "B put back")
            assert c.post("/v1/chat/completions", json=CHAT).headers["x-kvtier-engine"] == B
            assert c.get("/health").status_code == 200
            assert f'kvtier_router_engine_put_back_total{{engine="{B}"}} 1' in c.get("/metrics").text
    finally:
        srv.stop()


def test_bad_requests_get_clear_4xx_and_never_reach_an_engine(engines):
    a, b = engines
    app, srv = router(events=False, max_body_bytes=4096)
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            cases = [
                (c.post("/v1/chat/completions", content=b"{not json"), 400, "the body is not JSON"),
                (c.post("/v1/chat/completions", json=[1, 2]), 400, "must be a JSON object, got list"),
                (c.post("/v1/chat/completions", json={"model": "m"}), 400, "'messages' must be a non-empty list"),
                (c.post("/v1/chat/completions", json={"messages": ["hi"]}), 400, "'messages' must be"),
                (c.post("/v1/completions", json={"model": "m", "prompt": 5}), 400, "'prompt' must be a string"),
                (c.post("/v1/chat/completions", content=b"x" * 5000), 413, "request body over 4096 bytes"),
                (c.get("/v1/chat/completions"), 405, "takes POST"),
                (c.post("/metrics"), 405, "takes GET"),
                (c.get("/v2/nothing"), 404, "no route /v2/nothing"),
            ]
            for r, status, text in cases:
                assert r.status_code == status, (status, r.text)
                err = r.json()["error"]
                assert err["code"] == status and text in err["message"], (text, err)
            assert a.seen == [] and b.seen == []
            assert "kvtier_router_bad_requests_total 6" in c.get("/metrics").text
            # a completion with a string prompt is routed (and tokenized by the engine)
            r = c.post("/v1/completions", json={"model": "m", "prompt": "hello"})
            assert r.status_code == 200 and a.seen[-1]["prompt"] == "hello"
    finally:
        srv.stop()
