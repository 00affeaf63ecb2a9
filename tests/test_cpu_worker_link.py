"""kvtier's CPU copy worker and its link (the scale model's DMA engine): a job's
bytes are copied at submit, its result is held back until a link of the given
speed would have carried it, then reported once, in order per direction.

Real engine tensors, vLLM's real ``SharedOffloadRegion`` (in /dev/shm) and
vLLM's transfer specs; the link runs on a manual clock (no timing assertions).
"""
from __future__ import annotations

import uuid

import pytest
import torch

from engines import need_engine

need_engine("vllm")

from kvtier.engine_adapter.vllm_cpu_worker import CpuRowWorker, InstantLink, TimedLink, link_for  # noqa: E402
from vllm.v1.kv_offload.base import (BlockIDsLoadStoreSpec, CanonicalKVCacheRef, CanonicalKVCaches,  # noqa: E402
                                     CanonicalKVCacheTensor, GPULoadStoreSpec)
from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion  # noqa: E402

PAGE, BPC, BLOCKS, CHUNKS = 4096, 2, 8, 4      # a block's page, blocks per chunk, engine blocks, host chunks
CHUNK_BYTES = PAGE * BPC                       # 8 KiB a chunk: one store of 2 blocks moves 8192 bytes


class Clock:
    """Manual time: ``sleep`` moves it (what ``wait`` slept is recorded)."""

    def __init__(self) -> None:
        self.t, self.slept = 100.0, []

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.t += s


@pytest.fixture
def engine():
    t = torch.arange(BLOCKS * PAGE, dtype=torch.int64).remainder(251).to(torch.int8).view(BLOCKS, PAGE).clone()
    for b in range(BLOCKS):
        t[b, 0] = b                            # each block's first byte names it
    return t


@pytest.fixture
def region():
    r = SharedOffloadRegion(engine_id=uuid.uuid4().hex, num_chunks=CHUNKS, rank=0, kv_bytes_per_chunk=CHUNK_BYTES,
                            cpu_page_size=CHUNK_BYTES)
    yield r
    r.cleanup()


def worker(engine, region, link, clock) -> CpuRowWorker:
    caches = CanonicalKVCaches(tensors=[CanonicalKVCacheTensor(tensor=engine, page_size_bytes=PAGE)],
                               group_data_refs=[[CanonicalKVCacheRef(tensor_idx=0, page_size_bytes=PAGE)]])
    return CpuRowWorker(caches, blocks_per_chunk=BPC, region=region, link=link, clock=clock, sleep=clock.sleep)


def gpu(*blocks: int) -> GPULoadStoreSpec:
    return GPULoadStoreSpec(list(blocks), group_sizes=[len(blocks)], block_indices=[0])


def test_a_timed_link_holds_each_result_until_due_and_reports_it_once_in_order(engine, region):
    clock = Clock()
    w = worker(engine, region, TimedLink(CHUNK_BYTES / 1e9), clock)   # one chunk (8 KiB) a second each way
    before = engine.clone()
    # store blocks [0,1] -> chunk 0 and [2,3] -> chunk 1 at t=100: due at 101 and 102 (one queue)
    assert w.submit_store(1, gpu(0, 1), BlockIDsLoadStoreSpec([0]))
    assert w.submit_store(2, gpu(2, 3), BlockIDsLoadStoreSpec([1]))
    # load chunk 0 -> blocks [6,7] at t=100: the other direction, due at 101 as well
    assert w.submit_load(3, BlockIDsLoadStoreSpec([0]), gpu(6, 7))
    assert torch.equal(engine[6:8], before[0:2])                      # copied at submit, not at completion
    assert w.get_finished() == []                                    # nothing due at t=100
    clock.t = 100.5
    assert w.get_finished() == []
    clock.t = 101.0
    done = w.get_finished()
    assert [r.job_id for r in done] == [1, 3]                         # the first store and the load
    assert all(r.success and r.transfer_size == CHUNK_BYTES for r in done)
    assert [r.transfer_time for r in done] == [pytest.approx(1.0), pytest.approx(1.0)]
    assert w.get_finished() == []                                    # reported once
    clock.t = 105.0
    done = w.get_finished()
    assert [r.job_id for r in done] == [2] and done[0].transfer_time == pytest.approx(2.0)   # queued behind job 1
    assert w.get_finished() == []
    w.shutdown()


def test_a_store_submitted_after_the_link_idled_starts_at_its_submit(engine, region):
    clock = Clock()
    w = worker(engine, region, TimedLink(CHUNK_BYTES / 1e9), clock)
    w.submit_store(1, gpu(0, 1), BlockIDsLoadStoreSpec([0]))         # due 101
    clock.t = 110.0
    w.submit_store(2, gpu(2, 3), BlockIDsLoadStoreSpec([1]))         # the link is free: due 111, not 102
    assert [r.job_id for r in w.get_finished()] == [1]
    clock.t = 110.9
    assert w.get_finished() == []
    clock.t = 111.0
    assert [r.job_id for r in w.get_finished()] == [2]
    w.shutdown()


def test_wait_sleeps_until_the_named_jobs_are_due_and_they_are_then_reported(engine, region):
    clock = Clock()
    w = worker(engine, region, TimedLink(CHUNK_BYTES / 1e9), clock)
    w.submit_store(1, gpu(0, 1), BlockIDsLoadStoreSpec([0]))
    w.submit_store(2, gpu(2, 3), BlockIDsLoadStoreSpec([1]))
    w.wait({1})                                                       # a preemption flushes job 1 only
    assert clock.slept == [pytest.approx(1.0)] and clock.t == pytest.approx(101.0)
    assert [r.job_id for r in w.get_finished()] == [1]
    w.wait({1, 99})                                                   # done or unknown: no sleep
    assert len(clock.slept) == 1
    w.wait({2})
    assert clock.t == pytest.approx(102.0)
    assert [r.job_id for r in w.get_finished()] == [2]
    w.shutdown()


def test_the_bytes_round_trip_through_the_region_under_a_link(engine, region):
    clock = Clock()
    w = worker(engine, region, TimedLink(1.0), clock)
    want = engine[[3, 5]].clone()
    w.submit_store(1, gpu(3, 5), BlockIDsLoadStoreSpec([2]))          # blocks 3 and 5 -> chunk 2
    engine[0:2] = 0
    w.submit_load(2, BlockIDsLoadStoreSpec([2]), gpu(0, 1))           # chunk 2 -> blocks 0 and 1
    assert torch.equal(engine[0:2], want) and engine[0, 0] == 3 and engine[1, 0] == 5
    clock.t += 1.0
    assert sorted(r.job_id for r in w.get_finished()) == [1, 2]
    w.shutdown()


def test_without_a_link_every_job_is_finished_at_once(engine, region):
    clock = Clock()
    w = worker(engine, region, None, clock)
    w.submit_store(1, gpu(0, 1), BlockIDsLoadStoreSpec([0]))
    w.submit_load(2, BlockIDsLoadStoreSpec([0]), gpu(4, 5))
    assert [r.job_id for r in w.get_finished()] == [1, 2]             # no time passed
    w.wait({1, 2})
    assert clock.slept == [] and w.get_finished() == []
    w.shutdown()


class _Spec:
    def __init__(self, extra: dict) -> None:
        self.extra_config = extra


def test_the_link_comes_from_the_kvtier_options_or_the_cpu_tier_config(tmp_path):
    kvtier = _Spec({"kvtier": {"data_dir": str(tmp_path), "link_gbps": 2.5}})
    assert isinstance(link_for(kvtier), TimedLink) and link_for(kvtier).bytes_per_s == 2.5e9
    assert isinstance(link_for(_Spec({"kvtier": {"data_dir": str(tmp_path)}})), InstantLink)
    assert link_for(_Spec({"cpu_bytes_to_use": 1, "link_gbps": 0.5})).bytes_per_s == 0.5e9   # vLLM's CPU tier alone
    assert isinstance(link_for(_Spec({"cpu_bytes_to_use": 1})), InstantLink)
    with pytest.raises(ValueError, match="link_gbps"):
        link_for(_Spec({"link_gbps": 0}))
