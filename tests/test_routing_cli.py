"""``kvtier route`` from the command line: bad engines and flags are one line and exit 2;
``--dry-run`` prints the tier weights; a real router process in front of a small engine
(explicit loopback ports) answers, and stops on SIGTERM by its PID."""
from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

from kvtier.tiering.service.server import ServiceServer

ROUTER_PORT, ENGINE_PORT = 28660, 28661


def kvtier(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvtier", *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("args, message", [
    (["--engine", "127.0.0.1:8000"], "--engine '127.0.0.1:8000': an engine URL is http(s)://HOST[:PORT]"),
    (["--engine", "http://h:8000?x=1"], "an engine URL takes no query, fragment or credentials"),
    (["--engine", "http://h:8000=tcp://*:5557"], "that is where the engine binds; connect to its host"),
    (["--engine", "http://h:8000/=tcp://h"], "an events endpoint is tcp://HOST:PORT or ipc://PATH"),
    (["--engine", "http://h:99999"], "is not a URL: Port out of range"),
    (["--engine", "http://h:1", "--engine", "http://h:1/v1"], "engine h:1 is given twice"),
    (["--engine", "http://h:1", "--mu", "2"], "argument --mu: expected a probability in [0, 1], got '2'"),
    (["--engine", "http://h:1", "--medium-weight", "CPU"], "--medium-weight wants MEDIUM=W with W in [0, 1]"),
    (["--engine", "http://h:1", "--hash-algo", "md5"], "unknown hash algorithm 'md5'"),
    (["--engine", "http://h:1", "--port", "70000"], "--port must be in 0..65535, got 70000"),
    ([], "the following arguments are required: --engine"),
])
def test_bad_engines_and_flags_are_one_line_and_exit_2(args, message):
    r = kvtier("route", *args, "--dry-run")
    assert r.returncode == 2 and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvtier route: error: ") and message in lines[0], r.stderr


def test_dry_run_prints_the_engines_and_the_priced_tier_weights():
    r = kvtier("route", "--engine", "http://127.0.0.1:8001/v1=tcp://127.0.0.1:5557", "--engine",
               "http://127.0.0.1:8002", "--model", "gqa-70b", "--node", "pcie4", "--medium-weight", "tape=0.1",
               "--dry-run", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["engines"] == [{"engine": "127.0.0.1:8001", "url": "http://127.0.0.1:8001",
                               "events": "tcp://127.0.0.1:5557"},
                              {"engine": "127.0.0.1:8002", "url": "http://127.0.0.1:8002", "events": None}]
    w = doc["tier_weights"]
    assert w["GPU"] == 1.0 and w["TAPE"] == 0.1 and 1.0 > w["CPU"] > w["REMOTE"] > w["STORAGE/DISK"] > 0
    assert doc["tier_weights_basis"] == "gqa-70b on pcie4, remote 25 GB/s"
    assert doc["score"] == {"mu": 0.5, "gamma": 1.0, "load_max": None}


def engine_app() -> Starlette:
    async def metrics(_: Request):
        return PlainTextResponse("vllm:num_requests_waiting 0\nvllm:num_requests_running 1\n")

    async def tokenize(request: Request):
        return JSONResponse({"tokens": list(json.dumps((await request.json())["messages"]).encode())})

    async def chat(request: Request):
        body = await request.json()
        return JSONResponse({"object": "chat.completion", "choices": [{"message": {"content": body["messages"][-1]
                                                                                   ["content"].upper()}}]})
    return Starlette(routes=[Route("/metrics", metrics), Route("/tokenize", tokenize, methods=["POST"]),
                             Route("/v1/chat/completions", chat, methods=["POST"])])


def test_a_router_process_answers_and_stops_on_sigterm():
    engine = ServiceServer(engine_app(), port=ENGINE_PORT)
    engine.start()
    proc = subprocess.Popen([sys.executable, "-m", "kvtier", "route", "--engine", f"http://127.0.0.1:{ENGINE_PORT}",
                             "--port", str(ROUTER_PORT), "--json", "--log-level", "warning"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=lambda: lines.put(proc.stdout.readline()), daemon=True).start()
        info = json.loads(lines.get(timeout=60))
        assert info["url"] == f"http://127.0.0.1:{ROUTER_PORT}" and info["pid"] == proc.pid
        with httpx.Client(base_url=info["url"], timeout=30) as c:
            r = c.post("/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
            assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "HI"
            assert r.headers["x-kvtier-engine"] == f"127.0.0.1:{ENGINE_PORT}"
            health = c.get("/health").json()
            assert health["engines"][0]["up"] is True and health["engines"][0]["load"] == 1
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()
        engine.stop()
