"""Service mode never blocks the engine: vLLM's tier over a real ``kvtier serve``,
over a dead one, and over a hung one (a real loopback socket that accepts and
never answers).

The bound (docs/engines.md): an engine-side call costs the local policy's
``decide`` plus a dict lookup; the service is asked on kvtier's own thread,
each fetch bounded by ``service_timeout_s``, and after ``failures``
consecutive failures the circuit breaker stops asking for its cooldown.
"""
from __future__ import annotations

import socket
import threading
import time

import pytest

from engines import need_engine  # noqa: E402

need_engine("vllm")
pytest.importorskip("httpx", reason="the client extra is not installed")

from test_vllm_tier import BLOCK_TOKENS, BLOCKS_PER_CHUNK, Engine, chunk_keys, payload_for  # noqa: E402

from kvtier.tiering.lifecycle.service_policy import ServicePolicy  # noqa: E402
from kvtier.util.breaker import CircuitBreaker  # noqa: E402

TOOL_HINT = {"kvtier": {"tool": "pytest", "trajectory_id": "t-1"}}


class HungServer:
    """Accepts TCP connections on 127.0.0.1 and never sends a byte."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.conns: list[socket.socket] = []
        self._t = threading.Thread(target=self._accept, daemon=True)
        self._t.start()

    def _accept(self) -> None:
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(c)

    def close(self) -> None:
        self.sock.close()
        for c in self.conns:
            c.close()


def wait_for(cond, timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


def test_service_answers_arrive_in_the_background_and_place_later_pauses(tmp_path):
    from kvtier.tiering.service.client import KvtierClient
    from kvtier.tiering.service.app import create_app
    from kvtier.tiering.service.server import ServiceServer
    from kvtier.tiering.service.app import ServiceConfig

    keys = chunk_keys(list(range(4 * BLOCKS_PER_CHUNK * BLOCK_TOKENS)))
    with ServiceServer(create_app(ServiceConfig.make(tmp_path / "svc")), token=None) as srv:
        e = Engine(tmp_path / "a", service_url=srv.url, model="qwen3-0.6b", host_gb=0.001)
        pol = e.tier.policy
        assert isinstance(pol, ServicePolicy)
        # 1. the first pause of a tool: nothing cached, the local policy answers, a fetch is queued
        ctx = e.new_request("r1", TOOL_HINT)
        e.offload(ctx, keys[:2], payload_for(keys, 1))
        e.settle()
        e.finish(ctx)
        assert pol.counters["local"] == 1
        assert wait_for(lambda: pol.counters["fetches"] >= 1)
        # 2. another trajectory pausing on the same tool (same size class): the service's answer
        ctx = e.new_request("r2", {"kvtier": {"tool": "pytest", "trajectory_id": "t-2"}})
        e.offload(ctx, keys[2:], payload_for(keys, 2))
        e.settle()
        e.finish(ctx)
        assert pol.counters["service"] == 1
        with KvtierClient(srv.url) as c:
            action = c.decide("pytest", 2 * BLOCKS_PER_CHUNK * BLOCK_TOKENS, "qwen3-0.6b").decision.action
        assert e.tier.stats()["decisions"].get(str(action), 0) >= 1
        e.shutdown()


def test_a_hung_service_costs_the_engine_nothing(tmp_path):
    hung = HungServer()
    try:
        keys = chunk_keys(list(range(2 * BLOCKS_PER_CHUNK * BLOCK_TOKENS)))
        timeout_s = 5.0
        e = Engine(tmp_path, service_url=hung.url, model="qwen3-0.6b", service_timeout_s=timeout_s)
        t0 = time.monotonic()
        ctx = e.new_request("r1", TOOL_HINT)
        e.offload(ctx, keys, payload_for(keys, 3))     # scheduler calls + the store job that decides
        e.settle()
        e.finish(ctx)
        took = time.monotonic() - t0
        # the blocks were placed by the local policy while the service's fetch still hangs:
        # a design that waited on HTTP would have taken the fetch's whole time limit
        assert wait_for(lambda: len(hung.conns) >= 1, 10)
        assert e.tier.policy.counters["fetches"] == 0 and e.tier.policy.counters["local"] == 1
        s = e.tier.stats()
        assert s["chunks_stored"] + s["chunks_skipped"] == 2 and sum(s["decisions"].values()) == 1
        assert took < timeout_s
        e.shutdown()
    finally:
        hung.close()


def test_circuit_breaker_stops_asking_a_dead_service(tmp_path):
    from kvtier.tiering import make_policy
    from kvtier.tiering.model.decision import PauseContext
    from kvtier.tiering.model.presets import get_node, get_preset
    hung = HungServer()
    try:
        local = make_policy("breakeven", geometry=get_preset("qwen3-0.6b"), hardware=get_node("h100x8"))
        pol = ServicePolicy(hung.url, "qwen3-0.6b", local=local, timeout_s=0.2, ttl_s=5.0,
                            breaker=CircuitBreaker(threshold=2, base_s=60.0, max_s=60.0))
        ctx = PauseContext(tool="pytest", kv_bytes=1 << 20, context_tokens=1000)
        for tool in ("a", "b", "c"):                   # three tools: three fetches queued
            pol.decide(PauseContext(tool=tool, kv_bytes=1 << 20, context_tokens=1000))
        assert wait_for(lambda: pol.breaker.state == "down", 10)
        assert pol.counters["fetch_failures"] >= 2 and pol.breaker.trips == 1
        # down: decisions are local and no fetch is attempted
        before = len(hung.conns)
        d = pol.decide(ctx)
        assert d.action == local.decide(ctx).action and pol.counters["breaker_skips"] >= 1
        time.sleep(0.3)
        assert len(hung.conns) == before
        # the fetch queued before the breaker went down was dropped, not sent: only the two
        # failures that took it down ever reached the dead service
        assert len(hung.conns) == 2
        pol.close()
    finally:
        hung.close()
