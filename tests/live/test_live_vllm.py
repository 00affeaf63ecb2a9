"""kvtier inside a running vLLM engine (vLLM's CPU build, in this process).

Every test drives real requests through ``LLM.generate`` with
``KvtierConnector``: vLLM schedules, its CPU tier holds what kvtier's copy
worker moved out of the engine's KV cache, and kvtier's tier stores, loads
and prices pauses.  The engine cache (40 blocks of 32 tokens) and vLLM's CPU
tier (512 KiB: 16 chunks) are far smaller than the sessions' contexts, so a
resumed session's blocks come back from kvtier.  Greedy outputs are compared
with an engine without kvtier: a wrong KV block changes them.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kvtier.engine_adapter.agent_sessions import Script, run_script
from kvtier.engine_adapter.vllm_inprocess import EngineSpec, LiveEngine

SCRIPT = Script(sessions=4, turns=3, first_tokens=300, tool_tokens=60, output_tokens=8)
ENGINE_BLOCKS = 40
CPU_BYTES = 512 << 10


def kvtier_spec(model: str, data_dir: Path, **opts) -> EngineSpec:
    return EngineSpec(model=model, engine_blocks=ENGINE_BLOCKS, offload="kvtier", cpu_bytes=CPU_BYTES,
                      kvtier={"data_dir": str(data_dir), "nvme_gb": 0.05, "host_gb": 0.002, **opts})


def run(spec: EngineSpec, hints: str = "tool", **kw):
    with LiveEngine(spec) as eng:
        res = run_script(eng, SCRIPT, hints=hints, **kw)
        eng.settle()
        stats = eng.kvtier_stats()
    return res, stats


def tokens(results) -> list:
    return [r.tokens for r in results]


@pytest.fixture(scope="module")
def reference(tiny_model):
    """The outputs of an engine without kvtier (vLLM's own prefix cache only)."""
    res, _ = run(EngineSpec(model=tiny_model, engine_blocks=ENGINE_BLOCKS), hints="none")
    return tokens(res)


@pytest.mark.parametrize("hints", ["tool", "session", "none"])
def test_sessions_resume_from_kvtier_with_outputs_equal(tiny_model, reference, tmp_path, hints):
    res, s = run(kvtier_spec(tiny_model, tmp_path), hints=hints)
    assert tokens(res) == reference                                  # greedy outputs equal, every turn
    assert s["chunks_stored"] > 0 and s["chunks_loaded"] > 0         # kvtier stored and served blocks
    assert sum(s["loaded_by_tier"].values()) == s["chunks_loaded"]
    assert s["load_failures"] == 0 and s["contained_errors"] == 0 and s["hint_rejections"] == 0
    # a model kvtier has no preset for is priced with the engine's own geometry: the forecast runs
    assert s["policy"] == "breakeven" and s["priced_by"] == "engine"
    lc = s["lifecycle"]
    assert lc["pauses"] >= SCRIPT.sessions * (SCRIPT.turns - 1)
    assert sum(n for k, n in lc.items() if k.startswith("decision:")) >= SCRIPT.sessions
    assert lc["resumes"] >= SCRIPT.sessions * (SCRIPT.turns - 1)    # every comeback ended a pause
    if hints == "none":                                              # trajectories found by prefix
        assert s["prefix_started"] == SCRIPT.sessions
        assert s["prefix_joined"] == SCRIPT.sessions * (SCRIPT.turns - 1)
    # the served prompt tokens include blocks kvtier loaded (more than vLLM's caches alone kept)
    assert sum(r.cached_tokens for r in res) > 0


def test_restart_on_the_same_data_dir_serves_from_disk(tiny_model, reference, tmp_path):
    # no host frames: every block kvtier keeps is on NVMe (host frames do not outlive the process)
    run(kvtier_spec(tiny_model, tmp_path, host_gb=0))
    res, s = run(kvtier_spec(tiny_model, tmp_path, host_gb=0))       # a new engine, the same store
    assert tokens(res) == reference
    assert s["loaded_by_tier"].get("nvme", 0) > 0
    assert res[0].cached_tokens > 0                                  # the very first request found its prefix


def test_a_damaged_slab_is_a_miss_and_the_output_stays_right(tiny_model, reference, tmp_path):
    run(kvtier_spec(tiny_model, tmp_path, host_gb=0))
    slabs = [p for p in tmp_path.rglob("*") if p.is_file() and p.name.startswith("slab")]
    assert slabs, "no slab file written"
    for p in slabs:                                                  # every stored payload damaged
        with open(p, "r+b") as f:
            size = p.stat().st_size
            for off in range(8192, size, 4096):
                f.seek(off)
                f.write(b"\xff" * 64)
    res, s = run(kvtier_spec(tiny_model, tmp_path, host_gb=0))
    assert tokens(res) == reference                                  # recomputed, never served wrong
    assert res[0].cached_tokens == 0                                  # the damaged prefix was not served


HOSTILE = {
    "tool of 129 characters": {"kvtier": {"tool": "t" * 129, "trajectory_id": "{sid}"}},
    "tool of 1 MB": {"kvtier": {"tool": "t" * 1_000_000}},
    "control characters": {"kvtier": {"tool": "py\x00test\x1b[2J", "trajectory_id": "{sid}"}},
    "whitespace tool": {"kvtier": {"tool": " \t "}},
    "tool of the wrong type": {"kvtier": {"tool": {"nested": [1, 2, 3]}}},
    # (vLLM itself refuses integers past 64 bits in the request, before kvtier sees them)
    "absurd context_tokens": {"kvtier": {"tool": "pytest", "context_tokens": 2 ** 63 - 1, "trajectory_id": "{sid}"}},
    "float context_tokens": {"kvtier": {"tool": "pytest", "context_tokens": 1e300}},
    "NaN expected wait": {"kvtier": {"tool": "pytest", "expected_wait_s": float("nan")}},
    "negative context": {"kvtier": {"tool": "pytest", "context_tokens": -7}},
    "hint not an object": {"kvtier": ["pytest"]},
    "session id of the wrong type": {"session_id": {"a": 1}},
    "trajectory id of 100k characters": {"kvtier": {"tool": "pytest", "trajectory_id": "x" * 100_000}},
}


def test_hostile_hints_leave_every_request_completing(tiny_model, reference, tmp_path):
    cases = sorted(HOSTILE)

    def params(sid, turn, tool):
        case = cases[(int(sid[1:]) * SCRIPT.turns + turn) % len(cases)]
        return _fill(HOSTILE[case], sid)

    res, s = run(kvtier_spec(tiny_model, tmp_path), params=params)
    assert tokens(res) == reference                                  # every request completed, right
    assert s["hint_rejections"] == len(res)                          # every hostile hint dropped, counted
    assert s["contained_errors"] == 0                                # dropped at the door: nothing raised inside


def _fill(obj, sid):
    if isinstance(obj, dict):
        return {k: _fill(v, sid) for k, v in obj.items()}
    return obj.replace("{sid}", sid) if isinstance(obj, str) and "{sid}" in obj else obj


def test_remote_tier_on_a_real_redis_server_serves_a_fresh_node(tiny_model, reference, tmp_path):
    from remote_servers import RedisServer, redis_binary
    if redis_binary() is None:
        pytest.skip("redis-server is not installed")
    srv = RedisServer(tmp_path / "redis").start()
    try:
        remote = {"remote_url": srv.url, "remote_write": "through", "host_gb": 0}
        run(kvtier_spec(tiny_model, tmp_path / "node-a", **remote))
        res, s = run(kvtier_spec(tiny_model, tmp_path / "node-b", **remote))   # empty local store, same remote
        assert tokens(res) == reference
        assert s["loaded_by_tier"].get("remote", 0) > 0
        assert s["remote"]["remote_up"] == 1
    finally:
        srv.stop()
        shutil.rmtree(tmp_path / "redis", ignore_errors=True)


def test_kvtier_events_advertise_only_blocks_a_lookup_then_retrieves(tiny_model, tmp_path):
    """The store's KV events (vLLM's event shape, for a prefix directory or a router) in a live engine:
    every block advertised as stored and not since removed is retrievable, with the tier it names."""
    import numpy as np

    from kvtier.store.events import BlockRemoved, BlockStored, EventLog
    with LiveEngine(kvtier_spec(tiny_model, tmp_path)) as eng:
        tier = eng.kvtier()
        log = EventLog()
        tier.store.events.subscribe(log)
        run_script(eng, SCRIPT, hints="tool")
        eng.settle()
        held: dict[bytes, set[str]] = {}
        for batch in log.take():
            for ev in batch.events:
                for h in ev.block_hashes:
                    if isinstance(ev, BlockStored):
                        held.setdefault(h, set()).add(ev.medium)
                    elif isinstance(ev, BlockRemoved):
                        held.get(h, set()).discard(ev.medium)
        advertised = [h for h, media in held.items() if media]
        assert advertised, "no block was advertised"
        buf = np.empty(tier.block_size_bytes, dtype=np.uint8)
        tier_of = {"CPU": "host", "DISK": "nvme"}
        for h in advertised:
            where = {str(t) for t in tier.store.where(h)}
            assert {tier_of[m] for m in held[h]} <= where            # held where the events say
            assert tier.store.get(h, buf), "an advertised block could not be retrieved"
