"""``kvtier serve`` fed by engines' own KV event streams: a real ZMQ PUB on loopback (vLLM's
schema, vLLM's block hashes) -> the service's prefix directory -> ``POST /v1/prefix/route``
with the request's vLLM hashes as ``chunk_hashes``."""
from __future__ import annotations

import subprocess
import sys
import time

import httpx
import msgspec
import pytest
import zmq

from kvtier.tiering.routing.events import BlockStored
from kvtier.tiering.routing.hashing import BlockHasher
from kvtier.tiering.service.app import ServiceConfig, create_app
from kvtier.tiering.service.prefix_api import subscribe_engines
from kvtier.tiering.service.server import ServiceServer

PUB = "tcp://127.0.0.1:28671"
TOKEN = "t0k3n-for-routing-serve-0123456789"


def test_engine_streams_feed_the_services_prefix_route(tmp_path):
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.bind(PUB)
    app = create_app(ServiceConfig.make(tmp_path / "data", token=TOKEN))
    sub = subscribe_engines(app, {"w1": PUB})
    srv = ServiceServer(app, token=TOKEN)
    srv.start()
    try:
        seq = 0

        def send(*events) -> None:
            nonlocal seq
            pub.send_multipart([b"", seq.to_bytes(8, "big"), msgspec.msgpack.encode([time.time(), list(events)])])
            seq += 1
        while sub.stats["w1"].batches == 0:      # a SUB misses what came before it joined
            send()
            time.sleep(0.02)
            assert seq < 1000
        tokens = [(i * 31) % 1000 for i in range(160)]
        hashes = BlockHasher().hashes(tokens, 16)
        # w1 holds the first 8 of the prompt's 10 blocks: 4 in HBM, 4 in a shared tier
        send(BlockStored(hashes[:4], None, 16, "GPU"), BlockStored(hashes[4:8], None, 16, "STORAGE", "REMOTE"))
        body = {"chunk_hashes": hashes, "chunk_tokens": 16, "mu": 0.5,
                "workers": [{"worker": "w0", "load": 1}, {"worker": "w1", "load": 1}]}
        with httpx.Client(base_url=srv.url, timeout=30, headers={"Authorization": f"Bearer {TOKEN}"}) as c:
            end = time.monotonic() + 20
            while (r := c.post("/v1/prefix/route", json=body).json())["matched_chunks"] != 8:
                assert time.monotonic() < end, r
                time.sleep(0.02)
            assert r["worker"] == "w1" and r["matched_tokens"] == 128 and r["prompt_tokens"] == 160
            # the shared blocks count for w0 too, its own chain breaks at block 0 though
            assert r["matches"] == {"w0": 0, "w1": 128}
            assert c.get("/v1/prefix/stats").json()["workers"] == ["w1"]
    finally:
        srv.stop()
        sub.stop()
        pub.close(0)
        ctx.term()


@pytest.mark.parametrize("flag, message", [
    ("w1", "--engine-events wants NAME=ZMQ_ENDPOINT"),
    ("w1=http://x:1", "an events endpoint is tcp://HOST:PORT or ipc://PATH"),
    ("w 1=tcp://127.0.0.1:1", "--engine-events wants NAME=ZMQ_ENDPOINT"),
])
def test_serve_refuses_bad_engine_event_flags(tmp_path, flag, message):
    r = subprocess.run([sys.executable, "-m", "kvtier", "serve", "--port", "0", "--data-dir", str(tmp_path / "d"),
                        "--engine-events", flag], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.startswith("kvtier serve: error: ") and message in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
