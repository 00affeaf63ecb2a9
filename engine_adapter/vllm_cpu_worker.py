"""kvtier's transfer worker for vLLM's CPU platform: engine KV blocks <-> the
CPU tier's shared region, by :mod:`kvtier.dma.paged_rows`.

vLLM's own ``CPUOffloadingWorker`` drives CUDA/XPU streams and refuses the CPU
platform; the spec (``KvtierOffloadingSpec.get_worker``) hands this one in its
place there and keeps vLLM's on GPUs.  It maps the same shared region with the
same per-worker layout (``SharedOffloadRegion.create_next_worker_view`` once per
engine tensor, in order), so the scheduler side and kvtier's secondary tier see
the rows exactly where vLLM's worker would have put them.

Threads: vLLM's worker thread calls every method.  A transfer runs to the end
inside ``submit_*`` (the "device" is host memory: there is nothing to overlap
with), so ``get_finished`` returns each job once, in submission order, and
``wait`` has nothing to wait for.
"""
from __future__ import annotations

import time
from typing import Any

import torch

from kvtier.dma.paged_rows import plan_rows, run_copies

from vllm.v1.kv_offload.base import (BlockIDsLoadStoreSpec, CanonicalKVCaches, GPULoadStoreSpec,
                                     OffloadingWorker, TransferResult)


class CpuRowWorker(OffloadingWorker):
    """An ``OffloadingWorker`` whose "GPU" tensors are CPU tensors.

    ``region``: the worker's ``SharedOffloadRegion`` (owned from construction
    on; released by ``shutdown``).  Raises ValueError for the canonical layout
    (not supported here) or tensors that are not on the CPU."""

    def __init__(self, kv_caches: CanonicalKVCaches, *, blocks_per_chunk: int, region: Any) -> None:
        self._region = region
        self._bpc = int(blocks_per_chunk)
        self._engine: list[torch.Tensor] = []
        self._host: list[torch.Tensor] = []
        for t in kv_caches.tensors:
            if t.tensor.device.type != "cpu":
                raise ValueError(f"kvtier's CPU worker needs CPU KV tensors, got {t.tensor.device}")
            page = int(t.page_size_bytes)
            self._engine.append(t.tensor.view(torch.int8).view(-1, page))
            self._host.append(region.create_next_worker_view(page * self._bpc).view(-1, self._bpc, page))
        self._groups = [[(r.tensor_idx, int(r.page_size_bytes)) for r in refs] for refs in kv_caches.group_data_refs]
        self._finished: list[TransferResult] = []

    def _run(self, job_id: int, gpu: GPULoadStoreSpec, cpu: BlockIDsLoadStoreSpec, *, to_host: bool) -> bool:
        t0 = time.perf_counter()
        copies = plan_rows(gpu.block_ids, cpu.block_ids, group_sizes=gpu.group_sizes,
                           block_indices=gpu.block_indices, blocks_per_chunk=self._bpc, group_tensors=self._groups)
        n = run_copies(copies, self._engine, self._host, to_host=to_host)
        self._finished.append(TransferResult(job_id=job_id, success=True, transfer_size=n,
                                             transfer_time=time.perf_counter() - t0))
        return True

    def submit_store(self, job_id: int, src_spec: GPULoadStoreSpec, dst_spec: Any) -> bool:
        """Engine blocks -> CPU-tier chunk rows, now."""
        return self._run(job_id, src_spec, dst_spec, to_host=True)

    def submit_load(self, job_id: int, src_spec: Any, dst_spec: GPULoadStoreSpec) -> bool:
        """CPU-tier chunk rows -> engine blocks, now."""
        return self._run(job_id, dst_spec, src_spec, to_host=False)

    def get_finished(self) -> list[TransferResult]:
        out, self._finished = self._finished, []
        return out

    def wait(self, job_ids: set[int]) -> None:
        return None

    def shutdown(self) -> None:
        self._engine.clear()
        self._host.clear()
        if self._region is not None:
            self._region.cleanup()
            self._region = None


def make_cpu_worker(spec: Any, kv_caches: CanonicalKVCaches) -> CpuRowWorker:
    """The worker for a ``TieringOffloadingSpec`` on the CPU platform: its
    shared region mapped for this rank, as vLLM's ``create_worker`` maps it.
    Raises ValueError for the canonical layout."""
    from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion
    if getattr(spec.config, "canonical_layout", False):
        raise ValueError("kvtier: the canonical KV layout is not supported on vLLM's CPU platform")
    rank = 0 if spec.replicated_layout else spec.config.parallel.rank
    region = SharedOffloadRegion(engine_id=spec.config.engine_id, num_chunks=spec.num_chunks, rank=rank,
                                 kv_bytes_per_chunk=spec.kv_bytes_per_chunk,
                                 cpu_page_size=spec.cpu_page_size_per_worker)
    try:
        return CpuRowWorker(kv_caches, blocks_per_chunk=spec.blocks_per_chunk, region=region)
    except Exception:
        region.cleanup()
        raise


def worker_for(spec: Any, kv_caches: CanonicalKVCaches, vllm_worker: Any) -> OffloadingWorker:
    """The worker a ``TieringOffloadingSpec`` subclass's ``get_worker`` returns:
    ``vllm_worker(kv_caches)`` (vLLM's own) where the platform has a GPU/XPU,
    else one :class:`CpuRowWorker`, made once and kept as ``spec._worker``."""
    from vllm.platforms import current_platform
    if current_platform.is_cuda_alike() or current_platform.is_xpu():
        return vllm_worker(kv_caches)
    if spec._worker is None:
        spec._worker = make_cpu_worker(spec, kv_caches)
    return spec._worker
