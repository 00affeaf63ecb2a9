"""The engine boundary: whatever kvtier's lifecycle, policy or store raises on an
engine thread, every plugin entry point answers as plain tiering would (a miss,
a failed job, nothing stored) and counts it; nothing reaches the engine.

Faults are injected by swapping a plugin's collaborator (its store, its
lifecycle controller, its policy) for an object whose every call raises: the
thing under test is the boundary, which runs for real in vLLM's and SGLang's
own classes."""
from __future__ import annotations

import numpy as np
import pytest
from engines import need_engine


class Exploding:
    """Every attribute is a callable that raises (a store, controller or policy gone wrong)."""

    closed = False          # looks open, so the plugin goes on to call it

    def __init__(self, what: str) -> None:
        self._what = what

    def __getattr__(self, name):
        def boom(*a, **k):
            raise RuntimeError(f"{self._what}.{name} exploded")
        return boom


# ------------------------------------------------------------------ vLLM
@pytest.fixture
def vllm_engine(tmp_path):
    need_engine("vllm")
    from test_vllm_tier import Engine, chunk_keys, payload_for
    e = Engine(tmp_path, host_gb=0.001, model="qwen3-0.6b")
    yield e, chunk_keys, payload_for
    e.shutdown()


def test_vllm_tier_entry_points_contain_store_and_lifecycle_faults(vllm_engine):
    e, chunk_keys, payload_for = vllm_engine
    tier = e.tier
    keys = chunk_keys(list(range(2 * 4 * 16)))
    # healthy first: a hinted request stores its chunks
    ctx = e.new_request("r1", {"kvtier": {"tool": "pytest", "trajectory_id": "t"}})
    e.offload(ctx, keys, payload_for(keys, 1))
    e.settle()
    e.finish(ctx)
    assert tier.stats()["contained_errors"] == 0
    # the lifecycle controller and the store start raising
    real_store, real_ctl = tier.store, tier.lifecycle.controller
    try:
        _explode_vllm(e, tier, keys)
    finally:
        tier.store, tier.lifecycle.controller = real_store, real_ctl


def _explode_vllm(e, tier, keys):
    from vllm.v1.kv_offload.base import LookupResult
    from vllm.v1.kv_offload.tiering.base import TransferJob
    tier.lifecycle.controller = Exploding("controller")
    tier.store = Exploding("store")
    ctx2 = e.new_request("r2", {"kvtier": {"tool": "pytest", "trajectory_id": "t"}})   # on_new_request
    assert tier.lookup(keys[0], ctx2) is LookupResult.MISS                             # lookup: a miss
    tier.on_schedule_end(None)
    tier.submit_store(TransferJob(job_id=991, keys=keys[:1], chunk_ids=np.array([0]), is_promotion=False,
                                  req_context=ctx2))
    tier.submit_load(TransferJob(job_id=992, keys=keys[:1], chunk_ids=np.array([0]), is_promotion=True,
                                 req_context=ctx2))
    tier.drain_jobs()
    done = {r.job_id: r.success for r in tier.get_finished_jobs()}
    assert done == {991: False, 992: False}                                            # failed jobs, reported
    tier.on_request_finished(ctx2)
    tier.get_stats()                                                                   # never raises
    s = tier.stats()
    assert s["contained:on_new_request"] == 1 and s["contained:on_request_finished"] == 1
    assert s["contained_errors"] >= 2


def test_vllm_spec_and_connector_refuse_bad_config_at_start_only(tmp_path):
    need_engine("vllm")
    import kvtier.engine_adapter.vllm as kv
    from test_vllm_tier import offloading_config
    with pytest.raises(ValueError, match="kvtier"):
        kv.KvtierOffloadingSpec(offloading_config({}))
    with pytest.raises(ValueError, match="kvtier"):
        kv.KvtierConnector.with_kvtier_spec({"kvtier": "not an object"})


# ------------------------------------------------------------------ SGLang
def test_sglang_batch_entry_points_contain_faults(tmp_path):
    need_engine("sglang")
    from test_sglang_storage import PAGE, PageFirstHostPool, attach, kvtier_extra
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageExtraInfo
    pool = PageFirstHostPool(16 * PAGE)
    b = attach(kvtier_extra(tmp_path, policy="breakeven", model="qwen2.5-0.5b", host_gb=0.001), pool)
    keys = [f"{i:064x}" for i in range(4)]
    idx = list(range(0, 4 * PAGE))
    info = HiCacheStorageExtraInfo(extra_info={"kvtier": {"tool": "pytest", "trajectory_id": "t"}})
    assert b.batch_set_v1(keys, idx, info) == [True] * 4
    real = b._store
    b.lifecycle.controller = Exploding("controller")
    b._store = Exploding("store")
    assert b.batch_set_v1(keys, idx, info) == [False] * 4
    assert b.batch_get_v1(keys, idx, info) == [False] * 4
    assert b.batch_exists(keys, info) == 0
    assert b.exists(keys[0]) is False
    assert b.batch_get(keys) == [None] * 4
    assert b.batch_set(keys, [None] * 4) is False
    s = b.firewall.counts()
    assert s["contained:batch_set_v1"] == 1 and s["contained:batch_get_v1"] == 1
    assert s["contained:batch_exists"] == 2                      # batch_exists, and exists (which calls it)
    b._store = real
    b.close()


def test_vllm_connector_hooks_contain_prefix_faults(vllm_engine):
    # what KvtierConnector hands the tier on vLLM's scheduler thread (a new request's block hashes, a
    # finished request's tail) never raises, whatever the prefix bookkeeping does
    e, chunk_keys, payload_for = vllm_engine
    tier = e.tier
    real = tier.prefix
    tier.prefix = Exploding("prefix")
    try:
        tier.propose_trajectory("r1", [b"a", b"b"])
        tier.request_tail("r1", [b"a", b"b"])
        ctx = e.new_request("r1", None)                      # on_new_request adopts: contained too
        e.finish(ctx)
    finally:
        tier.prefix = real
    s = tier.stats()
    assert s["contained:propose_trajectory"] == 1 and s["contained:request_tail"] == 1
    assert s["contained:on_new_request"] == 1
