"""kvtier inside vLLM's multi-tier KV offloading, driven by vLLM's own classes.

Runs against the real ``vllm`` 0.33.0 package (installed with ``pip install
--no-deps -r ci/requirements-engines.txt``; torch stays 2.13.0 CPU): vLLM's
``TieringOffloadingManager`` is built by ``KvtierOffloadingSpec`` (the spec
vLLM loads by ``spec_module_path``), its CPU primary tier lives in vLLM's
shared-memory region, and vLLM's ``SecondaryTierFactory`` loads our tier by
``module_path``.  Keys are vLLM block hashes (``hash_block_tokens`` with
``sha256_cbor``) packed with ``make_offload_key``.

What cannot run here: vLLM's GPU-side worker (``CPUOffloadingWorker`` needs
CUDA), so the GPU -> CPU copy that precedes ``complete_store`` is done by the
test writing into the primary tier's rows, exactly where the worker would.
"""
from __future__ import annotations

import logging
import uuid

import numpy as np
import pytest

from engines import need_engine

need_engine("vllm")

import kvtier.engine_adapter.vllm as kv  # noqa: E402
from kvtier.engine_adapter.plugin_common import store_key  # noqa: E402
from kvtier.engine_adapter.vllm_driver import SchedulerDriver  # noqa: E402
from kvtier.engine_adapter.vllm_io import load_rows  # noqa: E402
from kvtier.store import StoreConfig, Tier, TieredStore  # noqa: E402
from remote_servers import redis_server  # noqa: E402,F401 (fixture)
from vllm.utils.hashing import sha256_cbor  # noqa: E402
from vllm.v1.core.kv_cache_utils import hash_block_tokens, init_none_hash  # noqa: E402
from vllm.v1.kv_offload.base import LookupResult, make_offload_key  # noqa: E402
from vllm.v1.kv_offload.config import (OffloadingCacheConfig, OffloadingConfig, OffloadingGroupConfig,  # noqa: E402
                                       OffloadingModelConfig, OffloadingParallelConfig)
from vllm.v1.kv_offload.tiering.base import TransferJob  # noqa: E402

BLOCK_TOKENS, BLOCKS_PER_CHUNK, WORKER_BLOCK_BYTES = 16, 4, 4096
CHUNK_BYTES = BLOCKS_PER_CHUNK * WORKER_BLOCK_BYTES      # 16 KiB per offloaded chunk
N_CHUNKS = 8                                             # primary (CPU) tier capacity


def offloading_config(extra: dict) -> OffloadingConfig:
    return OffloadingConfig(
        groups=(OffloadingGroupConfig(tokens_per_block=BLOCK_TOKENS, layer_names=("l0", "l1"), group_id=0),),
        worker_kv_bytes_per_block=WORKER_BLOCK_BYTES, enable_kv_cache_events=False,
        extra_config={"cpu_bytes_to_use": N_CHUNKS * CHUNK_BYTES, **extra},
        engine_id=uuid.uuid4().hex,
        model=OffloadingModelConfig(name="Qwen/Qwen3-0.6B", dtype="bfloat16"),
        cache=OffloadingCacheConfig(tokens_per_hash=BLOCK_TOKENS, blocks_per_chunk=BLOCKS_PER_CHUNK),
        parallel=OffloadingParallelConfig(rank=0, world_size=1, tp_size=1, pp_size=1, pcp_size=1, dcp_size=1,
                                          data_parallel_index=0, data_parallel_size=1,
                                          data_parallel_rank_local=None, is_parallelism_agnostic=True))


def chunk_keys(tokens: list[int]) -> list:
    """vLLM's offload keys: one per chunk, the hash of the chunk's last block."""
    init_none_hash(sha256_cbor)
    parent, hashes = None, []
    for i in range(0, len(tokens) - BLOCK_TOKENS + 1, BLOCK_TOKENS):
        parent = hash_block_tokens(sha256_cbor, parent, tokens[i:i + BLOCK_TOKENS])
        hashes.append(parent)
    return [make_offload_key(h, 0) for h in hashes[BLOCKS_PER_CHUNK - 1::BLOCKS_PER_CHUNK]]


class Engine(SchedulerDriver):
    """vLLM's scheduler-side offloading calls over KvtierOffloadingSpec (see
    kvtier.engine_adapter.vllm_driver), with kvtier as the only secondary tier."""

    def __init__(self, data_dir, **kvtier_opts) -> None:
        super().__init__(kv.KvtierOffloadingSpec(offloading_config(
            {"spec_name": "KvtierOffloadingSpec", "spec_module_path": "kvtier.engine_adapter.vllm",
             "kvtier": {"data_dir": str(data_dir), "nvme_gb": 0.02, **kvtier_opts}})))
        self.tier = self.tiers[0]


def payload_for(keys: list, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {k: rng.integers(0, 256, CHUNK_BYTES, dtype=np.uint8) for k in keys}


def test_chunks_cascade_to_kvtier_and_come_back_after_restart(tmp_path):
    keys = chunk_keys(list(range(6 * BLOCKS_PER_CHUNK * BLOCK_TOKENS)))   # 6 chunks
    data = payload_for(keys, 1)
    # 1. a request offloads 6 chunks: vLLM's CPU tier takes them and cascades to kvtier
    e = Engine(tmp_path)
    ctx = e.new_request("r1")
    e.offload(ctx, keys, data)
    e.settle()
    assert e.tier.stats()["chunks_stored"] == 6
    assert all(e.tier.lookup(k, ctx) is LookupResult.HIT for k in keys)
    e.finish(ctx)
    # 2. the engine restarts: the CPU tier is empty, kvtier's NVMe tier is not
    e.shutdown()
    e = Engine(tmp_path)
    ctx = e.new_request("r2")
    # 3. lookup misses the CPU tier, hits kvtier and starts a promotion
    assert [e.lookup(ctx, k) for k in keys] == [LookupResult.HIT_PENDING] * 6
    e.settle()                                    # the promotion job runs and completes
    assert [e.lookup(ctx, k) for k in keys] == [LookupResult.HIT] * 6
    # 4. the bytes the worker would copy to the GPU are the ones offloaded before the restart
    assert e.read(ctx, keys) == [data[k].tobytes() for k in keys]
    s = e.tier.stats()
    assert s["chunks_loaded"] == 6 and s["bytes_read"] == 6 * CHUNK_BYTES and s["load_failures"] == 0
    e.tier.store.check_integrity()
    e.finish(ctx)
    e.shutdown()


def test_tool_hint_in_kv_transfer_params_reaches_the_policy(tmp_path):
    keys = chunk_keys(list(range(2 * BLOCKS_PER_CHUNK * BLOCK_TOKENS)))
    other = chunk_keys(list(range(5000, 5000 + 2 * BLOCKS_PER_CHUNK * BLOCK_TOKENS)))
    e = Engine(tmp_path, policy="recompute", model="qwen3-0.6b")
    # a request paused on a tool, with a policy that recomputes: nothing goes below DRAM
    hinted = e.new_request("agent", {"kvtier": {"tool": "pytest", "trajectory_id": "t-1"}})
    e.offload(hinted, keys, payload_for(keys, 2))
    # an ordinary request (no hint) is stored in the default tier
    plain = e.new_request("chat")
    e.offload(plain, other, payload_for(other, 3))
    e.settle()
    assert [e.tier.lookup(k, hinted) for k in keys] == [LookupResult.MISS] * 2
    assert [e.tier.lookup(k, plain) for k in other] == [LookupResult.HIT] * 2
    s = e.tier.stats()
    assert s["chunks_skipped"] == 2 and s["chunks_stored"] == 2
    assert s["decisions"] == {"recompute": 1, "default:nvme": 1}
    # the CPU tier still serves the hinted request's chunks
    assert [e.lookup(hinted, k) for k in keys] == [LookupResult.HIT] * 2
    e.finish(hinted)
    e.finish(plain)
    e.shutdown()


def test_offload_nvme_hint_and_host_tier(tmp_path):
    keys = chunk_keys(list(range(BLOCKS_PER_CHUNK * BLOCK_TOKENS)))
    e = Engine(tmp_path, policy="offload_host", model="qwen3-0.6b", host_gb=0.001)
    ctx = e.new_request("agent", {"kvtier": {"tool": "web_search"}})
    e.offload(ctx, keys, payload_for(keys, 4))
    e.settle()
    sk = store_key(e.tier._ns, keys[0])
    assert sorted(str(t) for t in e.tier.store.where(sk)) == ["host"]
    e.finish(ctx)
    e.shutdown()


def test_a_host_placement_larger_than_the_host_tier_goes_to_nvme(tmp_path):
    # regression (the live benchmark's host-tier sweep): with host frames for 2 chunks, a job of 4
    # chunks placed in host was refused whole and nothing was stored, although NVMe had room
    keys = chunk_keys(list(range(4 * BLOCKS_PER_CHUNK * BLOCK_TOKENS)))
    e = Engine(tmp_path, policy="offload_host", model="qwen3-0.6b", host_gb=2 * CHUNK_BYTES / 1e9)
    assert e.tier.store.host_frames().total == 2
    ctx = e.new_request("agent", {"kvtier": {"tool": "web_search"}})
    e.offload(ctx, keys, payload_for(keys, 6))
    e.settle()
    assert e.tier.stats()["chunks_stored"] == 4 and e.tier.stats()["stored_by_tier"] == {"nvme": 4}
    for k in keys:
        assert sorted(str(t) for t in e.tier.store.where(store_key(e.tier._ns, k))) == ["nvme"]
    e.finish(ctx)
    e.shutdown()


def test_faults_fail_the_job_not_the_scheduler(tmp_path, caplog):
    keys = chunk_keys(list(range(3 * BLOCKS_PER_CHUNK * BLOCK_TOKENS)))
    data = payload_for(keys, 5)
    e = Engine(tmp_path)
    ctx = e.new_request("r1")
    e.offload(ctx, keys, data)
    e.settle()
    tier, rows = e.tier, e.rows
    # a load of three chunks where the middle one is unknown: only it fails
    ghost = chunk_keys(list(range(9000, 9000 + BLOCKS_PER_CHUNK * BLOCK_TOKENS)))[0]
    rows[5][:] = 0
    tier.submit_load(TransferJob(job_id=10_001, keys=[keys[0], ghost, keys[2]],
                                 chunk_ids=np.array([4, 5, 6], dtype=np.int32), is_promotion=True, req_context=ctx))
    tier.drain_jobs()
    (res,) = tier.get_finished_jobs()
    assert res.job_id == 10_001 and res.success is False and list(res.successful_keys) == [keys[0], keys[2]]
    assert rows[4].tobytes() == data[keys[0]].tobytes() and rows[6].tobytes() == data[keys[2]].tobytes()
    assert not rows[5].any()                            # the missing chunk's slot is untouched
    # mismatched keys / chunk ids: the job fails and is reported, the scheduler goes on
    caplog.set_level(logging.WARNING, logger="kvtier.vllm")
    tier.submit_store(TransferJob(job_id=10_002, keys=[keys[0]], chunk_ids=np.array([1, 2], dtype=np.int32),
                                  is_promotion=False, req_context=ctx))
    tier.drain_jobs()
    assert [(r.job_id, r.success) for r in tier.get_finished_jobs()] == [(10_002, False)]
    assert any("chunk ids" in r.getMessage() for r in caplog.records)
    # a corrupt block on disk: the load fails for that chunk, bad bytes never reach the CPU tier
    path, off = tier.store.locate(store_key(tier._ns, keys[1]))
    with open(path, "r+b") as f:
        f.seek(off + 10)
        f.write(b"\x00\xff" * 4)
    rows[3][:] = 7
    tier.submit_load(TransferJob(job_id=10_003, keys=[keys[1]], chunk_ids=np.array([3], dtype=np.int32),
                                 is_promotion=True, req_context=ctx))
    tier.drain_jobs()
    (res,) = tier.get_finished_jobs()
    assert res.success is False and list(res.successful_keys) == []
    assert not rows[3].any()                                  # zeroed: neither stale nor corrupt bytes
    assert tier.lookup(keys[1], ctx) is LookupResult.MISS     # dropped, recomputable
    e.finish(ctx)
    # after shutdown (store closed) a lookup is a miss and a job reports failure
    e.shutdown()
    assert tier.lookup(keys[0], ctx) is LookupResult.MISS
    tier.submit_load(TransferJob(job_id=10_004, keys=[keys[0]], chunk_ids=np.array([0], dtype=np.int32),
                                 is_promotion=True, req_context=ctx))
    assert [(r.job_id, r.success) for r in tier.get_finished_jobs()] == [(10_004, False)]


def test_config_errors_are_clear(tmp_path):
    with pytest.raises(ValueError, match="kvtier"):
        kv.KvtierOffloadingSpec(offloading_config({"spec_name": "KvtierOffloadingSpec"}))
    with pytest.raises(ValueError, match="unknown option"):
        kv.KvtierOffloadingSpec(offloading_config({"kvtier": {"data_dir": str(tmp_path), "nvme_gbs": 1}}))
    # the options are validated when vLLM builds the spec, before any manager or store exists
    with pytest.raises(ValueError, match="data_dir"):
        kv.KvtierOffloadingSpec(offloading_config({"kvtier": {"nvme_gb": 1}}))
    # the forecast needs no preset (the engine's geometry prices it); a preset that does not exist is an error
    with pytest.raises(ValueError, match="unknown model preset"):
        kv.KvtierOffloadingSpec(offloading_config({"kvtier": {"data_dir": str(tmp_path), "model": "no-such-model"}}))
    with pytest.raises(ValueError, match="lifecycle"):
        kv.KvtierOffloadingSpec(offloading_config({"kvtier": {"data_dir": str(tmp_path), "policy": "off",
                                                              "lifecycle": "forecast"}}))


def test_side_by_side_benchmark_with_vllm_fs_tier(tmp_path, capsys):
    import json

    from kvtier.bench.bench_vllm import main
    # a tiny run: vLLM's own fs tier and kvtier behind the same real manager, every chunk read back
    assert main(["--data-dir", str(tmp_path), "--chunks", "3", "--batch", "2", "--repeat", "1", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    for name in ("vllm_fs", "kvtier", "kvtier_nosync"):
        assert doc[name]["hits"] == 3 and doc[name]["bit_exact"] is True
        assert doc[name]["store_gbps"] > 0 and doc[name]["load_gbps"] > 0
        assert 0 < doc[name]["lookup_us"] < float("inf")          # the tier's own per-chunk lookup, timed
    # the fs tier's durable figure (store + os.sync) cannot be faster than its store alone
    assert 0 < doc["vllm_fs"]["store_synced_gbps"] <= doc["vllm_fs"]["store_gbps"]
    assert doc["limits"]["raw_write_fresh_file"] is True and doc["limits"]["raw_write_overwrite_gbps"] > 0
    # like for like: the raw baseline moves vLLM's own CPU-tier rows, paired per round with the tiers
    assert doc["limits"]["raw_memory"] == "engine" and doc["limits"]["raw_distinct_buffers"] is True
    (rnd,) = doc["rounds"]
    assert set(rnd) == {"raw", "vllm_fs", "kvtier", "kvtier_nosync"} and rnd["raw"]["read_gbps"] > 0
    assert rnd["kvtier"]["prepare_wait_s"] >= 0
    assert doc["ratios_paired_median"]["kvtier_lookup_time_vs_fs"] == pytest.approx(
        rnd["kvtier"]["lookup_us"] / rnd["vllm_fs"]["lookup_us"])
    assert doc["ratios_paired_median"]["kvtier_store_vs_raw_write"] == pytest.approx(
        rnd["kvtier"]["store_gbps"] / rnd["raw"]["write_gbps"])
    # the durable ceiling of the round (a flushed overwrite) is reported and paired with the fs tier
    assert rnd["raw"]["write_overwrite_gbps"] > 0
    assert doc["ratios_paired_median"]["vllm_fs_store_vs_raw_write_overwrite"] == pytest.approx(
        rnd["vllm_fs"]["store_gbps"] / rnd["raw"]["write_overwrite_gbps"])
    assert not (tmp_path / "bench_vllm").exists()
    assert main(["--data-dir", str(tmp_path), "--chunks", "0"]) == 2


def test_tier_prepares_its_slab_slots_and_stays_durable(tmp_path):
    """The vLLM tier's store zeroes its new slab's free slots in idle time (first fills
    overwrite written extents); what was stored reads back exact after a restart."""
    keys = chunk_keys(list(range(6 * BLOCKS_PER_CHUNK * BLOCK_TOKENS)))
    data = payload_for(keys, 5)
    e = Engine(tmp_path)
    assert e.tier.store.config.prepare_slots is True
    ctx = e.new_request("r")
    e.offload(ctx, keys[:2], data)
    e.settle()
    assert e.tier.store.wait_prepared(30.0) and e.tier.store._nvme.prep.prepared_slots > 0
    e.offload(ctx, keys[2:], data)
    e.settle()
    e.finish(ctx)
    e.shutdown()
    e = Engine(tmp_path)
    ctx = e.new_request("back")
    assert e.fetch(ctx, keys) == [LookupResult.HIT] * len(keys)
    assert e.read(ctx, keys) == [data[k].tobytes() for k in keys]
    e.tier.store.check_integrity()
    e.finish(ctx)
    e.shutdown()


def test_connector_by_module_path_resolves_to_kvtier():
    from vllm.config.kv_transfer import KVTransferConfig
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1
    from vllm.v1.kv_offload.factory import OffloadingSpecFactory

    # vLLM's connector factory loads our connector by kv_connector_module_path
    cfg = KVTransferConfig(kv_connector="KvtierConnector", kv_connector_module_path="kvtier.engine_adapter.vllm",
                           kv_role="kv_both", kv_connector_extra_config={"cpu_bytes_to_use": 1 << 20,
                                                                         "kvtier": {"data_dir": "x"}})
    cls = KVConnectorFactory.get_connector_class(cfg)
    assert cls is kv.KvtierConnector and issubclass(cls, KVConnectorBase_V1)
    # the extra config it hands vLLM's spec factory names kvtier's spec
    extra = kv.KvtierConnector.with_kvtier_spec(dict(cfg.kv_connector_extra_config))
    assert OffloadingSpecFactory.get_spec_cls(extra) is kv.KvtierOffloadingSpec
    # a user's own spec choice is kept; a missing kvtier object is a clear error
    assert kv.KvtierConnector.with_kvtier_spec({"kvtier": {}, "spec_name": "X"})["spec_name"] == "X"
    with pytest.raises(ValueError, match="kvtier"):
        kv.KvtierConnector.with_kvtier_spec({"cpu_bytes_to_use": 1})


def test_connector_by_name_through_vllms_plugin_loader(tmp_path):
    """``"kv_connector": "KvtierConnector"`` with no module path: vLLM's own
    ``load_general_plugins`` runs kvtier's ``vllm.general_plugins`` entry point
    (pyproject.toml).  In a fresh interpreter, so vLLM's load-once flag is its own."""
    import subprocess
    import sys
    code = """
import os
os.environ["VLLM_PLUGINS"] = "kvtier"
from vllm.config.kv_transfer import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
cfg = KVTransferConfig(kv_connector="KvtierConnector", kv_role="kv_both",
                       kv_connector_extra_config={"kvtier": {"data_dir": "x"}})
try:
    KVConnectorFactory.get_connector_class(cfg)
    print("before: found")
except ValueError:
    print("before: unknown")
from vllm.plugins import load_general_plugins
load_general_plugins()
load_general_plugins()        # vLLM may load plugins again: harmless
cls = KVConnectorFactory.get_connector_class(cfg)
print("after:", cls.__module__ + "." + cls.__name__)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.split("\n")
    assert "before: unknown" in lines
    assert "after: kvtier.engine_adapter.vllm.KvtierConnector" in lines


def test_get_stats_reports_every_activity_and_skips_quiet_steps(tmp_path):
    keys = chunk_keys(list(range(2 * BLOCKS_PER_CHUNK * BLOCK_TOKENS)))
    e = Engine(tmp_path)
    try:
        ctx = e.new_request("r1")
        e.offload(ctx, keys, payload_for(keys, 3))
        e.settle()
        e.tier.get_stats()
        assert e.tier.get_stats() is None                  # a quiet step: nothing rebuilt, nothing new
        e.tier.lookup(keys[0], ctx)                        # the tier's own activity: the next step reports it
        _, values = e.tier.get_stats().metric_sections()
        assert values["vllm:kvtier_lookups"] == {(): 1} and values["vllm:kvtier_lookup_hits"] == {(): 1}
    finally:
        e.shutdown()


def test_shutdown_lets_go_of_the_primary_tiers_rows(tmp_path):
    # vLLM unmaps its shared CPU-tier region after the tiers shut down: no part of the tier
    # (its parts, its metrics) may keep a view of it alive
    import gc
    import weakref
    e = Engine(tmp_path)
    rows = weakref.ref(e.tier._rows)
    e.shutdown()
    gc.collect()
    assert rows() is None


class WhereCountingStore(TieredStore):
    """A real store that counts its ``where`` calls."""

    def __init__(self, config: StoreConfig) -> None:
        super().__init__(config)
        self.where_calls = 0

    def where(self, key):
        self.where_calls += 1
        return super().where(key)


def test_a_load_labels_each_chunk_with_the_tier_that_served_it(tmp_path, redis_server):
    keys = chunk_keys(list(range(4 * BLOCKS_PER_CHUNK * BLOCK_TOKENS)))
    data = payload_for(keys, 8)
    e = Engine(tmp_path, host_gb=0.001, remote_url=redis_server.url)
    tier, st = e.tier, e.tier.store
    assert st.remote is not None and st.remote.wait_ready(15)
    sk = [store_key(tier._ns, k) for k in keys]
    st.put_many(sk[:1], [data[keys[0]]], tier=Tier.HOST)
    st.put_many(sk[1:2], [data[keys[1]]], tier=Tier.NVME)
    assert st.put_many(sk[2:3], [data[keys[2]]], tier="remote") == 1    # on the remote only
    assert st.where(sk[0]) == {Tier.HOST} and st.where(sk[1]) == {Tier.NVME} and st.where(sk[2]) == frozenset()
    ctx = e.new_request("r1")
    tier.submit_load(TransferJob(job_id=10_010, keys=keys, chunk_ids=np.array([4, 5, 6, 7], dtype=np.int32),
                                 is_promotion=True, req_context=ctx))
    tier.drain_jobs()
    (res,) = tier.get_finished_jobs()
    assert res.success is False and list(res.successful_keys) == keys[:3]      # the fourth is nowhere
    assert [e.rows[4 + i].tobytes() for i in range(3)] == [data[k].tobytes() for k in keys[:3]]
    s = tier.stats()
    assert s["loaded_by_tier"] == {"host": 1, "nvme": 1, "remote": 1}
    assert s["chunks_loaded"] == 3 and s["load_failures"] == 1
    e.finish(ctx)
    e.shutdown()


def test_the_load_path_reads_without_asking_where_first(tmp_path):
    block = 4096
    cfg = StoreConfig(root=tmp_path / "s", host_bytes=4 * block, nvme_bytes=16 * block, block_bytes=block,
                      slab_bytes=8 * block, io_engine="threads")
    rows = np.zeros((4, block), np.uint8)
    data = [np.full(block, i + 1, np.uint8) for i in range(3)]
    with WhereCountingStore.open(cfg) as st:
        assert type(st) is WhereCountingStore
        st.put_many([b"k0"], data[:1], tier=Tier.HOST)
        st.put_many([b"k1"], data[1:2], tier=Tier.NVME)
        res = load_rows(st, [b"k1", b"k0", b"gone"], rows, [0, 1, 2])
        assert res.served == (Tier.NVME, Tier.HOST, None) and res.blocks == 2
        assert rows[0].tobytes() == data[1].tobytes() and rows[1].tobytes() == data[0].tobytes()
        assert st.where_calls == 0
        st.where(b"k0")
        assert st.where_calls == 1                      # the count is live


def test_a_request_that_says_no_tool_follows_starts_no_pause(tmp_path):
    keys = chunk_keys(list(range(2 * BLOCKS_PER_CHUNK * BLOCK_TOKENS)))
    e = Engine(tmp_path, policy="breakeven", model="qwen3-0.6b")
    first = e.new_request("turn-1", {"kvtier": {"tool": "pytest", "trajectory_id": "t-1"}})
    e.offload(first, keys, payload_for(keys, 2))
    e.settle()
    e.finish(first)
    last = e.new_request("turn-2", {"kvtier": {"tool": None, "trajectory_id": "t-1"}})   # the trajectory's last turn
    e.finish(last)
    lc = e.tier.stats()["lifecycle"]
    assert lc["pauses"] == 1 and lc["resumes"] == 1          # the first turn's pause; none after the last
    assert e.tier.lifecycle.controller.plan_for("t-1") is None
    assert e.tier.stats()["hint_rejections"] == 0
    e.shutdown()


@pytest.mark.parametrize("node,served", [("h100x8", False), ("pcie4", True)])
def test_a_chunk_kept_only_on_nvme_is_recomputed_where_its_read_costs_more_than_its_prefill(tmp_path, node, served):
    # the seed's 70B: on 8 x H100 one 7 GB/s drive reads a chunk slower than the node prefills it
    keys = chunk_keys(list(range(2 * BLOCKS_PER_CHUNK * BLOCK_TOKENS)))
    host = chunk_keys(list(range(7000, 7000 + BLOCKS_PER_CHUNK * BLOCK_TOKENS)))
    e = Engine(tmp_path, policy="breakeven", model="llama-3.1-70b", node=node, host_gb=0.001)
    assert e.tier._parts.reads_nvme is served
    plain = e.new_request("chat")                         # no hint: the default tier, NVMe
    e.offload(plain, keys, payload_for(keys, 7))
    e.settle()
    for k in keys:
        assert e.tier.store.where(store_key(e.tier._ns, k)) == frozenset({Tier.NVME})
    e.tier.store.put(store_key(e.tier._ns, host[0]), payload_for(host, 8)[host[0]], namespace=e.tier._ns,
                     tier=Tier.HOST)
    want = LookupResult.HIT if served else LookupResult.MISS
    assert [e.tier.lookup(k, plain) for k in keys] == [want] * 2
    assert e.tier.lookup(host[0], plain) is LookupResult.HIT      # a host copy is always read
    s = e.tier.stats()
    assert s["read_skips"] == (0 if served else 2) and s["lookup_hits"] == (3 if served else 1)
    e.finish(plain)
    e.shutdown()
