"""Two live engines, one shared tier, kvtier's router in front (issue 51).

Two vLLM OpenAI servers (the CPU build, the tiny model, each started by its PID on
127.0.0.1 at an explicit port), each with kvtier's connector on its own data dir
and one real ``redis-server`` as the shared tier (written through), each
publishing vLLM's KV event stream on its own ZMQ endpoint; ``kvtier route`` (a
subprocess, stopped by its PID) reads both streams and both ``/metrics``.

* Engine B serves a prefix engine A stored, from the shared tier: B's
  ``vllm:kvtier_blocks_loaded_total{tier="remote"}`` grows, its answer counts the
  prompt's blocks as cached, and its greedy output equals A's.
* Through the router, a trajectory's next turn goes to the engine that holds its
  prefix in its own cache (a device hit outweighs the other engine's shared-tier
  copy), unless that engine's queue is long: then the idle one takes it.
"""
from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from kvtier.bench.live.server_metrics import samples
from remote_servers import RedisServer, free_port, redis_binary
from vllm_server import start_api_server, wait_healthy

BLOCK = 32
MAX_LEN = 1216


def _post(url: str, body: dict, timeout: float = 120) -> tuple[dict, dict]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read()), dict(r.headers)


def _metric(base: str, name: str, **labels: str) -> float:
    with urllib.request.urlopen(base + "/metrics", timeout=30) as r:
        text = r.read().decode()
    return sum(v for n, lab, v in samples(text) if n == name and all(lab.get(k) == w for k, w in labels.items()))


def _stop(proc: subprocess.Popen | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=90)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=30)


class Cluster:
    """Two engines on one Redis tier, and the router in front."""

    def __init__(self, model: str, root: Path) -> None:
        self.model, self.root = model, root
        self.redis = RedisServer(root / "redis")
        self.engines: dict[str, str] = {}
        self.events: dict[str, str] = {}
        self.procs: list[subprocess.Popen] = []
        self.logs: list = []
        self.router: str | None = None

    def start(self) -> "Cluster":
        self.redis.start()
        started = []
        for name in ("a", "b"):
            port = free_port()
            events = f"ipc://{self.root / (name + '.events')}"
            cfg = {"kv_connector": "KvtierConnector", "kv_role": "kv_both",
                   "kv_connector_extra_config": {"cpu_bytes_to_use": 512 << 10, "kvtier": {
                       "data_dir": str(self.root / f"kvtier-{name}"), "nvme_gb": 0.05, "host_gb": 0,
                       "remote_url": self.redis.url, "remote_write": "through"}}}
            log = open(self.root / f"engine-{name}.log", "w")
            self.logs.append(log)
            ev = json.dumps({"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": events})
            proc = start_api_server(self.model, port, cfg, log, blocks=40, max_model_len=MAX_LEN,
                                    extra=("--enable-prompt-tokens-details", "--kv-events-config", ev))
            self.procs.append(proc)
            self.engines[name], self.events[name] = f"http://127.0.0.1:{port}", events
            started.append((proc, self.engines[name], self.root / f"engine-{name}.log"))
        for proc, base, path in started:
            wait_healthy(proc, base, path, 300)
        port = free_port()
        log = open(self.root / "router.log", "w")
        self.logs.append(log)
        args = [sys.executable, "-m", "kvtier", "route", "--port", str(port), "--block-size", str(BLOCK),
                "--poll-interval", "0.2", "--log-level", "warning"]
        for name in ("a", "b"):
            args += ["--engine", f"{self.engines[name]}={self.events[name]}"]
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(proc)
        self.router = f"http://127.0.0.1:{port}"
        wait_healthy(proc, self.router, self.root / "router.log", 60)
        return self

    def name_of(self, header: str) -> str:
        """The engine (a or b) the router's ``x-kvtier-engine`` header names."""
        return next(n for n, url in self.engines.items() if url.endswith(header))

    def stop(self) -> None:
        for proc in reversed(self.procs):
            _stop(proc)
        self.redis.stop()
        for log in self.logs:
            log.close()
        shutil.rmtree(self.root / "redis", ignore_errors=True)


@pytest.fixture(scope="module")
def cluster(tiny_model, tmp_path_factory):
    if redis_binary() is None:
        pytest.skip("redis-server is not installed (ci/test.sh installs it as root)")
    c = Cluster(tiny_model, tmp_path_factory.mktemp("cluster"))
    try:
        yield c.start()
    finally:
        c.stop()


def completion(model: str, prompt: list[int], max_tokens: int = 4, **extra) -> dict:
    return {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            **extra}


def _settle(base: str, name: str, **labels: str) -> float:
    """``name``'s value once it stops moving (the server folds kvtier's counters in with its steps)."""
    last, same = -1.0, 0
    for _ in range(60):
        v = _metric(base, name, **labels)
        same = same + 1 if v == last else 0
        if same >= 3 and v > 0:
            return v
        last = v
        time.sleep(0.5)
    return last


def test_engine_b_serves_engine_a_prefix_from_the_shared_tier(cluster, tiny_model):
    import random
    rng = random.Random(7)
    prompt = [rng.randrange(3, 1000) for _ in range(6 * BLOCK + 5)]
    a, b = cluster.engines["a"], cluster.engines["b"]
    ra, _ = _post(a + "/v1/completions", completion(tiny_model, prompt))
    stored = _settle(a, "vllm:kvtier_blocks_stored_total")
    assert stored > 0
    assert cluster.redis.client().dbsize() > 0                       # written through to the shared tier

    before = _metric(b, "vllm:kvtier_blocks_loaded_total", tier="remote")
    rb, _ = _post(b + "/v1/completions", completion(tiny_model, prompt))
    assert rb["choices"][0]["text"] == ra["choices"][0]["text"]       # greedy outputs equal
    assert rb["usage"]["prompt_tokens_details"]["cached_tokens"] >= 6 * BLOCK - BLOCK
    loaded = _settle(b, "vllm:kvtier_blocks_loaded_total", tier="remote")
    assert loaded > before                                            # B loaded A's blocks from Redis


def test_the_router_keeps_a_trajectory_on_its_engine_unless_that_engine_is_busy(cluster, tiny_model):
    import random
    rng = random.Random(11)
    r = cluster.router
    prompt = [rng.randrange(3, 1000) for _ in range(8 * BLOCK)]
    first, h = _post(r + "/v1/completions", completion(tiny_model, prompt, max_tokens=8))
    home = cluster.name_of(h["x-kvtier-engine"])
    other = "b" if home == "a" else "a"
    time.sleep(1.0)                                                   # its blocks' events reach the router

    prompt = prompt + [rng.randrange(3, 1000) for _ in range(BLOCK)]
    nxt, h = _post(r + "/v1/completions", completion(tiny_model, prompt, max_tokens=8))
    assert cluster.name_of(h["x-kvtier-engine"]) == home              # the engine that holds the prefix
    assert nxt["usage"]["prompt_tokens_details"]["cached_tokens"] >= 8 * BLOCK - BLOCK

    # the home engine gets a long queue (requests sent to it directly, not through the router)
    busy = [threading.Thread(target=_post, args=(cluster.engines[home] + "/v1/completions",
                                                 completion(tiny_model, [rng.randrange(3, 1000) for _ in range(64)],
                                                            max_tokens=400), 600), daemon=True)
            for _ in range(12)]
    for t in busy:
        t.start()
    deadline = time.monotonic() + 60
    while _metric(cluster.engines[home], "vllm:num_requests_running") + \
            _metric(cluster.engines[home], "vllm:num_requests_waiting") < 8:
        assert time.monotonic() < deadline, "the home engine never got busy"
        time.sleep(0.2)
    time.sleep(1.0)                                                   # the router's /metrics poll sees it
    prompt = prompt + [rng.randrange(3, 1000) for _ in range(BLOCK)]
    _, h = _post(r + "/v1/completions", completion(tiny_model, prompt, max_tokens=4), timeout=600)
    assert cluster.name_of(h["x-kvtier-engine"]) == other             # the queue outweighs the prefix
    for t in busy:
        t.join(timeout=600)
