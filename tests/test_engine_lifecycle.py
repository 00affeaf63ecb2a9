"""The lifecycle controller inside the real engine classes, on a hand-driven clock.

vLLM: ``KvtierOffloadingSpec`` -> vLLM's ``TieringOffloadingManager`` with
``KvtierTier``, driven the way vLLM's scheduler drives it.  SGLang:
``KvtierStorage`` loaded by SGLang's ``StorageBackendFactory``.  The policy is
the real ``breakeven`` policy; its predictor is given the history a server
would have learned online, and the controller runs on a ``ManualClock``
(``set_clock``) so each timer is reached by moving the clock, then ``tick``.
"""
from __future__ import annotations

import hashlib
import random

import pytest

from engines import need_engine  # noqa: E402

need_engine("vllm")

from test_vllm_tier import BLOCK_TOKENS, BLOCKS_PER_CHUNK, Engine, chunk_keys, payload_for  # noqa: E402

from kvtier.tiering.model.decision import PauseContext  # noqa: E402
from kvtier.tiering.lifecycle import ManualClock  # noqa: E402
from kvtier.util.tiers import Tier  # noqa: E402
from vllm.v1.kv_offload.base import LookupResult  # noqa: E402

LONG = "long_build"


def learned(policy, tool: str, median_s: float, n: int = 40, sigma: float = 0.3) -> None:
    rng = random.Random(7)
    for _ in range(n):
        policy.observe(tool, median_s * rng.lognormvariate(0.0, sigma))


def tiers_of(e, keys) -> set[str]:
    return {str(t) for k in keys for t in e.tier.store.where(e.tier._keys([k])[0])}


def fill_host_frames(store, ctl, leave: int) -> int:
    """Other blocks take kvtier's host frames up to ``leave`` free ones (DRAM gets its price);
    a tick shows the controller the new fill.  Returns the blocks put."""
    s = store.stats()
    n = int(s.host_frames_total) - int(s.host_frames_used) - leave
    for i in range(n):
        assert store.put(hashlib.blake2b(b"filler %d" % i, digest_size=32).digest(),
                         bytes(store.config.block_bytes), tier="host")
    ctl.tick()
    return n


def test_vllm_long_pause_leaves_host_frames_and_is_staged_back_before_its_return(tmp_path):
    keys = chunk_keys(list(range(4 * BLOCKS_PER_CHUNK * BLOCK_TOKENS)))
    e = Engine(tmp_path, policy="breakeven", model="llama-3.1-8b", node="pcie5-x16", host_gb=0.001)
    ctl = e.tier.lifecycle.controller
    clock = ManualClock(1000.0)
    ctl.set_clock(clock)
    learned(e.tier.policy, "grep", 0.5)
    learned(e.tier.policy, LONG, 100.0)
    # 1. a short tool: the pause is held in kvtier's host frames
    ctx = e.new_request("r1", {"kvtier": {"tool": "grep", "trajectory_id": "t", "context_tokens": 30000}})
    e.offload(ctx, keys[:2], payload_for(keys, 1))
    e.settle()
    e.finish(ctx)
    ctl.tick()
    assert ctl.where("t") is Tier.HOST and tiers_of(e, keys[:2]) == {"host"}
    assert fill_host_frames(e.tier.store, ctl, leave=6) > 0       # ~87-90% full: DRAM has its price
    clock.advance(0.5)
    # 2. back from the tool; the next turn ends in a long build while kvtier's host frames are
    #    nearly full (the policy: NVMe, staged back)
    ctx = e.new_request("r2", {"kvtier": {"tool": LONG, "trajectory_id": "t", "context_tokens": 30000}})
    e.offload(ctx, keys, payload_for(keys, 1))
    e.settle()
    e.finish(ctx)
    plan = ctl.plan_for("t")
    assert plan.tier == "nvme" and plan.action == "offload_nvme"
    ((stage_at, _),) = plan.timers
    ctl.tick()                                           # the host lease ends now: all blocks to NVMe
    assert ctl.where("t") is Tier.NVME and tiers_of(e, keys) == {"nvme"}
    fc = e.tier.policy.forecast(PauseContext(tool=LONG, kv_bytes=1, context_tokens=30000))
    back_at = fc.quantiles["p90"]                         # the tool returns late in its forecast
    assert 0 < stage_at < back_at                         # staged ahead of the predicted return
    clock.advance(stage_at - 0.01)
    ctl.tick()
    assert tiers_of(e, keys) == {"nvme"}                 # not yet
    clock.advance(0.02)
    ctl.tick()                                           # NVMe -> host frames
    assert ctl.where("t") is Tier.HOST and "host" in tiers_of(e, keys)
    # 3. the tool returns: the resume is served from host frames, and the wait is learned
    clock.advance(back_at - stage_at - 0.01)
    n_before = fc.n
    ctx = e.new_request("r3", {"session_id": "t"})
    assert all(r.name == "HIT" for r in e.fetch(ctx, keys))
    assert e.read(ctx, keys) == [payload_for(keys, 1)[k].tobytes() for k in keys]
    e.finish(ctx)
    after = e.tier.policy.forecast(PauseContext(tool=LONG, kv_bytes=1, context_tokens=30000))
    assert ctl.stats()["resumes"] == 2 and after.n == n_before + 1      # the observed wait was learned
    s = e.tier.stats()
    assert s["lifecycle"]["staged_blocks"] >= 4 and s["lifecycle"]["demoted_blocks"] >= 2
    e.tier.store.check_integrity()
    e.shutdown()


def test_vllm_recompute_class_pause_writes_nothing(tmp_path):
    keys = chunk_keys(list(range(2 * BLOCKS_PER_CHUNK * BLOCK_TOKENS)))
    e = Engine(tmp_path, policy="breakeven", model="qwen3-0.6b")
    learned(e.tier.policy, "human_review", 600.0)
    ctx = e.new_request("r1", {"kvtier": {"tool": "human_review", "trajectory_id": "t"}})
    e.offload(ctx, keys, payload_for(keys, 2))
    e.settle()
    e.finish(ctx)
    s = e.tier.stats()
    assert s["decisions"] == {"recompute": 1}
    assert s["chunks_stored"] == 0 and s["chunks_skipped"] == 2 and s["bytes_written"] == 0
    assert e.tier.store.stats().nvme_blocks == 0 and e.tier.store.stats().host_blocks == 0
    assert e.tier.lifecycle.controller.where("t") is None
    e.shutdown()


def test_vllm_step_metrics_carry_the_lifecycle_counters_and_leave_its_thread_asleep(tmp_path):
    keys = chunk_keys(list(range(2 * BLOCKS_PER_CHUNK * BLOCK_TOKENS)))
    e = Engine(tmp_path, policy="breakeven", model="qwen3-0.6b")
    try:
        learned(e.tier.policy, "human_review", 600.0)
        ctx = e.new_request("r1", {"kvtier": {"tool": "human_review", "trajectory_id": "t"}})
        e.offload(ctx, keys, payload_for(keys, 2))
        e.settle()
        e.finish(ctx)
        wake, sets = e.tier.lifecycle.timer._wake, []
        wake.set = lambda: sets.append(1)                  # what a wake of the lifecycle's thread calls
        for _ in range(3):
            e.tier.on_schedule_end(None)                   # engine steps: the lifecycle's thread sleeps on
        assert sets == []
        _, values = e.tier.get_stats().metric_sections()   # the step's metrics, read without stats()
        s = e.tier.stats()
        assert values["vllm:kvtier_pauses"] == {(): s["lifecycle"]["pauses"]} == {(): 1}
        assert values["vllm:kvtier_decisions"] == {(a,): n for a, n in s["decisions"].items()} == {("recompute",): 1}
    finally:
        e.shutdown()


def _sglang(tmp_path, **kw):
    torch = pytest.importorskip("torch")
    need_engine("sglang")
    from test_sglang_storage import PAGE, PageFirstHostPool, attach, kvtier_extra
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageExtraInfo as Extra
    pool = PageFirstHostPool(64)
    pool.fill_random(5)
    return torch, PAGE, Extra, attach(kvtier_extra(tmp_path, **kw), pool)


def test_sglang_pause_and_resume_through_extra_info(tmp_path):
    torch, PAGE, Extra, b = _sglang(tmp_path, policy="breakeven", model="llama-3.1-8b", node="pcie5-x16",
                                    host_gb=0.001)
    ctl = b.lifecycle.controller
    clock = ManualClock(0.0)
    ctl.set_clock(clock)
    learned(b.policy, LONG, 100.0)
    assert fill_host_frames(b.store, ctl, leave=6) > 0              # DRAM nearly full: it has its price
    keys = [f"{i:064x}" for i in range(1, 5)]
    hint = Extra(extra_info={"kvtier": {"tool": LONG, "trajectory_id": "s", "context_tokens": 30000}})
    assert b.batch_set_v1(keys, torch.arange(0, 4 * PAGE), hint) == [True] * 4      # the pause
    ctl.tick()
    skeys = b.store_keys(keys)
    assert ctl.where("s") is Tier.NVME and {str(t) for k in skeys for t in b.store.where(k)} == {"nvme"}
    ((stage_at, _),) = ctl.plan_for("s").timers
    clock.advance(stage_at + 0.01)
    ctl.tick()
    assert {str(t) for k in skeys for t in b.store.where(k)} >= {"host"}
    clock.advance(50.0)
    assert b.batch_exists(keys, hint) == 4                                          # the resume
    assert ctl.where("s") is None and ctl.stats()["resumes"] == 1
    b.close()


def test_sglang_recompute_class_pause_writes_nothing(tmp_path):
    torch, page, Extra, b = _sglang(tmp_path, policy="breakeven", model="qwen3-0.6b")
    learned(b.policy, "human_review", 600.0)
    keys = [f"{i:064x}" for i in range(1, 5)]
    hint = Extra(extra_info={"kvtier": {"tool": "human_review", "trajectory_id": "s"}})
    assert b.batch_set_v1(keys, torch.arange(0, 4 * page), hint) == [False] * 4     # the pause
    s = b.kvtier_stats()
    assert s["decisions"] == {"recompute": 1}
    assert s["pages_set_skipped"] == 4 and s["pages_set"] == 0 and s["bytes_written"] == 0
    assert b.store.stats().nvme_blocks == 0 and b.store.stats().host_blocks == 0
    assert b.lifecycle.controller.where("s") is None
    assert b.batch_exists(keys, hint) == 0                                          # the resume recomputes
    assert b.lifecycle.controller.where("s") is None
    b.close()


def test_sglang_hung_service_costs_a_backup_nothing(tmp_path):
    pytest.importorskip("httpx", reason="the client extra is not installed")
    import time
    from test_engine_service import HungServer, wait_for
    hung = HungServer()
    try:
        timeout_s = 5.0
        torch, page, Extra, b = _sglang(tmp_path, service_url=hung.url, model="qwen3-0.6b",
                                        service_timeout_s=timeout_s)
        keys = [f"{i:064x}" for i in range(1, 5)]
        hint = Extra(extra_info={"kvtier": {"tool": "pytest", "trajectory_id": "s"}})
        t0 = time.monotonic()
        stored = b.batch_set_v1(keys, torch.arange(0, 4 * page), hint)            # decided locally
        assert b.batch_exists(keys, hint) == sum(stored)                           # the resume
        took = time.monotonic() - t0
        assert wait_for(lambda: len(hung.conns) >= 1, 10)      # the fetch went out and hangs
        assert b.policy.counters["fetches"] == 0 and b.policy.counters["local"] == 1
        assert sum(b.kvtier_stats()["decisions"].values()) == 1
        assert took < timeout_s    # waiting on the hung fetch would have taken its whole time limit
        b.close()
    finally:
        hung.close()


def test_vllm_lookup_marks_engine_activity_for_the_lifecycle_moves(tmp_path):
    # vLLM's lookups run between and before the load jobs: the moves wait after one as after a load
    keys = chunk_keys(list(range(2 * BLOCKS_PER_CHUNK * BLOCK_TOKENS)))
    e = Engine(tmp_path, policy="breakeven", model="llama-3.1-8b", node="pcie5-x16")
    fg = e.tier.lifecycle.foreground
    fg.quiet_s = 30.0
    assert fg.idle()
    ctx = e.new_request("r", None)
    e.lookup(ctx, keys[0])                        # a miss in vLLM's CPU tier: kvtier is asked
    assert not fg.idle() and not fg.busy()
    fg.quiet_s = 0.0
    assert fg.idle()
    e.shutdown()


def test_vllm_a_finished_session_is_forgotten_its_chunks_still_load(tmp_path):
    # a session that never comes back leaves the registry once idle (forget_after_s) with
    # nothing in host frames; its chunks stay in the store, and a request finds them
    keys = chunk_keys(list(range(2 * BLOCKS_PER_CHUNK * BLOCK_TOKENS)))
    e = Engine(tmp_path, policy="breakeven", model="qwen3-0.6b", forget_after_s=30.0, max_trajectories=100)
    ctl = e.tier.lifecycle.controller
    assert (ctl.moves.pruner.forget_after_s, ctl.moves.pruner.max_trajectories) == (30.0, 100)
    clock = ManualClock()
    ctl.set_clock(clock)
    learned(e.tier.policy, LONG, 300.0)
    ctx = e.new_request("r1", {"kvtier": {"tool": LONG, "trajectory_id": "done"}})
    e.offload(ctx, keys, payload_for(keys, 3))
    e.settle()
    e.finish(ctx)
    # back (vLLM's session key), then never heard of again: the request is dropped unfinished (a finished
    # request without a hint would start a pause of the default tool class, which the cap alone forgets)
    e.new_request("r2", {"session_id": "done"})
    clock.set(10.0)
    ctl.tick()
    assert ctl.block_count("done") == 2
    clock.set(100.0)
    ctl.tick()
    assert ctl.block_count("done") == 0 and ctl.stats()["forgotten"] == 1
    _, values = e.tier.get_stats().metric_sections()     # what vLLM folds into /metrics
    assert values["vllm:kvtier_forgotten_sessions"] == {(): 1}
    ctx = e.new_request("r3")
    assert e.fetch(ctx, keys) == [LookupResult.HIT] * 2
    e.shutdown()


@pytest.mark.parametrize("mode", ["on", "off", "auto"])
def test_vllm_prefill_steps_hold_the_lifecycle_moves_where_asked(tmp_path, mode):
    from vllm.platforms import current_platform
    from vllm.v1.kv_offload.base import ScheduleEndContext
    e = Engine(tmp_path, policy="breakeven", model="qwen3-0.6b", yield_to_prefill=mode)
    try:
        on = mode == "on" or mode == "auto" and current_platform.device_type == "cpu"
        fg = e.tier.lifecycle.foreground
        fg.quiet_s = 0.0
        wake, sets = e.tier.lifecycle.timer._wake, []
        wake.set = lambda: sets.append(1)
        e.tier.on_schedule_end(ScheduleEndContext(new_req_ids=["r1"], preempted_req_ids=()))   # r1's prefill
        assert fg.idle() is not on
        e.tier.on_schedule_end(ScheduleEndContext(new_req_ids=(), preempted_req_ids=()))      # a decode step
        assert fg.idle()
        assert fg.stats()["prefill_steps"] == (1 if on else 0)
        assert sets == []                          # the lifecycle's thread slept through both steps
    finally:
        e.shutdown()


def test_vllm_yield_to_prefill_rejects_an_unknown_mode(tmp_path):
    with pytest.raises(ValueError, match="yield_to_prefill"):
        Engine(tmp_path, policy="breakeven", model="qwen3-0.6b", yield_to_prefill="sometimes")
