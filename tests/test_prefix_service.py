"""Prefix routing over real HTTP: a real uvicorn server on loopback, events in vLLM's
schema from a real TieredStore, then the route the directory gives."""
from __future__ import annotations

import hashlib

import httpx
import numpy as np
import pytest

from kvtier.store import StoreConfig, TieredStore
from kvtier.store.events import BlockStored, EventLog
from kvtier.tiering.prefix.chunks import chunk_hashes
from kvtier.tiering.service.app import create_app
from kvtier.tiering.service.server import ServiceServer
from kvtier.tiering.service.app import ServiceConfig

TOKEN = "t0k3n-for-prefix-tests-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def http(tmp_path):
    srv = ServiceServer(create_app(ServiceConfig.make(tmp_path / "data", token=TOKEN, max_body_bytes=4 << 20)),
                        token=TOKEN)
    srv.start()
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            yield c
    finally:
        srv.stop()


def as_json(ev: BlockStored) -> dict:
    return {"type": "BlockStored", "block_hashes": [h.hex() for h in ev.block_hashes], "medium": ev.medium}


def test_store_events_feed_the_directory_and_route_figure_7(http, tmp_path):
    tokens = [(i * 7919) % 50_000 for i in range(40_000)]
    chain = chunk_hashes(tokens, 16)
    # worker w1's store holds the first 2,000 chunks (its host tier); its events go to the service
    log = EventLog()
    cfg = StoreConfig(root=tmp_path / "store", host_bytes=2_048 * 4096, nvme_bytes=0, block_bytes=4096)
    with TieredStore.open(cfg) as st:
        st.events.subscribe(log)
        st.put_many(chain[:2_000], [np.zeros(4096, np.uint8)] * 2_000)
        batches = log.take()
        events = [as_json(e) for b in batches for e in b.events]
        assert sum(len(e["block_hashes"]) for e in events) == 2_000
        out = np.empty(4096, np.uint8)
        assert all(st.get(h, out) for e in events for h in map(bytes.fromhex, e["block_hashes"]))
    # an unauthenticated POST is refused
    assert http.post("/v1/prefix/events", json={"worker": "w1", "events": events}).status_code == 401
    r = http.post("/v1/prefix/events", json={"worker": "w1", "ts": 1.0, "events": events}, headers=AUTH)
    assert r.status_code == 200, r.text
    assert r.json() == {"applied": len(events), "hashes": 2_000}
    # the prompt as tokens, three workers of equal load: w1 wins with an 80 % hit
    body = {"tokens": tokens, "workers": [{"worker": w, "load": 3} for w in ("w0", "w1", "w2")],
            "mu": 0.5, "gamma": 1.0}
    r = http.post("/v1/prefix/route", json=body, headers=AUTH)
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["worker"] == "w1" and got["matched_tokens"] == 32_000 and got["skipped_chunks"] == 2_000
    assert got["prefill_tokens"] == 8_000 and got["hit"] == pytest.approx(0.8)
    # the same by chunk hashes; w1 overloaded and a small mu: the idle worker wins
    body = {"chunk_hashes": [h.hex() for h in chain], "prompt_tokens": 40_000, "mu": 0.2,
            "workers": [{"worker": "w0", "load": 0}, {"worker": "w1", "load": 9}]}
    got = http.post("/v1/prefix/route", json=body, headers=AUTH).json()
    assert got["worker"] == "w0" and got["matches"] == {"w0": 0, "w1": 32_000}
    # removal withdraws the blocks
    r = http.post("/v1/prefix/events", headers=AUTH, json={"worker": "w1", "events": [
        {"type": "BlockRemoved", "block_hashes": [chain[1000].hex()], "medium": "CPU"}]})
    assert r.status_code == 200
    got = http.post("/v1/prefix/route", json={**body, "mu": 0.9}, headers=AUTH).json()
    assert got["matches"]["w1"] == 1_000 * 16
    s = http.get("/v1/prefix/stats").json()
    assert s["workers"] == ["w1"] and s["hashes"] == 1_999


def test_bad_route_requests_are_422(http):
    w = [{"worker": "w0", "load": 1}]
    for body in ({"workers": w},                                              # no prompt
                 {"tokens": [1] * 32, "chunk_hashes": ["00"], "workers": w},  # both
                 {"chunk_hashes": ["abc"], "workers": w},                     # odd hex
                 {"tokens": [1] * 32, "workers": w + w},                      # a worker twice
                 {"tokens": [1] * 32, "workers": w, "mu": 2.0},
                 {"chunk_hashes": ["00", "01"], "prompt_tokens": 5, "workers": w}):
        r = http.post("/v1/prefix/route", json=body, headers=AUTH)
        assert r.status_code == 422, (body, r.text)
