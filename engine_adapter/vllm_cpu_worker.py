"""kvtier's transfer worker for vLLM's CPU platform: engine KV blocks <-> the
CPU tier's shared region, by :mod:`kvtier.dma.paged_rows`.

vLLM's own ``CPUOffloadingWorker`` drives CUDA/XPU streams and refuses the CPU
platform; the spec (``KvtierOffloadingSpec.get_worker``) hands this one in its
place there and keeps vLLM's on GPUs.  It maps the same shared region with the
same per-worker layout (``SharedOffloadRegion.create_next_worker_view`` once per
engine tensor, in order), so the scheduler side and kvtier's secondary tier see
the rows exactly where vLLM's worker would have put them.

The link (the scale model, docs/live.md).  On the CPU platform the "device" is
host memory and a copy is nearly free.  With a :class:`TimedLink` the copy still
runs at submit (the bytes are right whenever vLLM reads them), but the job is
reported finished only once a link of that speed would have carried it: one
queue per direction, as a DMA engine has::

    store (engine -> CPU tier)   |--job 1--|--job 3------|
    load  (CPU tier -> engine)   |--job 2--|
                                 submit    due = max(submit, direction free) + bytes / link

The engine keeps stepping while a job is "in flight"; vLLM makes a request
wait for its load's completion, and ``wait`` (a preemption's flush of stores)
sleeps until the named jobs are due.  :class:`InstantLink` (the default)
reports every job at once, as a plain copy worker does.

Threads: vLLM's worker thread calls every method.  ``get_finished`` returns
each job once: the due ones, in submission order within each direction (a
store and a load are independent queues, as on a GPU's two copy engines).
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable

import torch

from kvtier.dma.paged_rows import plan_rows, run_copies

from vllm.v1.kv_offload.base import (BlockIDsLoadStoreSpec, CanonicalKVCaches, GPULoadStoreSpec,
                                     OffloadingWorker, TransferResult)

GB = 1e9


class InstantLink:
    """No link: a job is finished when its copy returns (the CPU platform as it is)."""

    def due(self, to_host: bool, nbytes: int, now: float) -> float:
        """When a job of ``nbytes`` submitted at ``now`` completes: ``now``.  Pure."""
        return now


class TimedLink:
    """A link of ``gbps`` GB/s (1e9 bytes/s) each way, one queue per direction:
    a job completes at max(its submit, its direction's free time) + bytes/link.
    Mutated by ``due`` (the direction's free time moves); one caller thread.
    Raises ValueError for a speed that is not a positive number."""

    def __init__(self, gbps: float) -> None:
        if not (gbps > 0 and gbps != float("inf")):
            raise ValueError(f"link_gbps must be a positive number, got {gbps!r}")
        self.bytes_per_s = float(gbps) * GB
        self._free = {True: float("-inf"), False: float("-inf")}

    def due(self, to_host: bool, nbytes: int, now: float) -> float:
        """The completion time of a job of ``nbytes`` submitted at ``now`` in
        direction ``to_host`` (True: engine -> CPU tier); the direction is busy until then."""
        done = max(now, self._free[to_host]) + nbytes / self.bytes_per_s
        self._free[to_host] = done
        return done


@dataclass(frozen=True)
class _InFlight:
    due: float
    result: TransferResult


class CpuRowWorker(OffloadingWorker):
    """An ``OffloadingWorker`` whose "GPU" tensors are CPU tensors.

    ``region``: the worker's ``SharedOffloadRegion`` (owned from construction
    on; released by ``shutdown``).  ``link``: when a job counts as finished
    (module doc; default :class:`InstantLink`); ``clock``/``sleep``: the time
    the link runs on (seconds, monotonic) and how ``wait`` waits.  Raises
    ValueError for tensors that are not on the CPU."""

    def __init__(self, kv_caches: CanonicalKVCaches, *, blocks_per_chunk: int, region: Any,
                 link: InstantLink | TimedLink | None = None, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self._region = region
        self._bpc = int(blocks_per_chunk)
        self._link = link if link is not None else InstantLink()
        self._clock, self._sleep = clock, sleep
        self._engine: list[torch.Tensor] = []
        self._host: list[torch.Tensor] = []
        for t in kv_caches.tensors:
            if t.tensor.device.type != "cpu":
                raise ValueError(f"kvtier's CPU worker needs CPU KV tensors, got {t.tensor.device}")
            page = int(t.page_size_bytes)
            self._engine.append(t.tensor.view(torch.int8).view(-1, page))
            self._host.append(region.create_next_worker_view(page * self._bpc).view(-1, self._bpc, page))
        self._groups = [[(r.tensor_idx, int(r.page_size_bytes)) for r in refs] for refs in kv_caches.group_data_refs]
        self._queues: dict[bool, deque[_InFlight]] = {True: deque(), False: deque()}

    def _run(self, job_id: int, gpu: GPULoadStoreSpec, cpu: BlockIDsLoadStoreSpec, *, to_host: bool) -> bool:
        submit = self._clock()
        t0 = time.perf_counter()
        copies = plan_rows(gpu.block_ids, cpu.block_ids, group_sizes=gpu.group_sizes,
                           block_indices=gpu.block_indices, blocks_per_chunk=self._bpc, group_tensors=self._groups)
        n = run_copies(copies, self._engine, self._host, to_host=to_host)
        copy_s = time.perf_counter() - t0
        due = self._link.due(to_host, n, submit)
        self._queues[to_host].append(_InFlight(due, TransferResult(
            job_id=job_id, success=True, transfer_size=n, transfer_time=max(copy_s, due - submit))))
        return True

    def submit_store(self, job_id: int, src_spec: GPULoadStoreSpec, dst_spec: Any) -> bool:
        """Engine blocks -> CPU-tier chunk rows: copied now, finished when the link says."""
        return self._run(job_id, src_spec, dst_spec, to_host=True)

    def submit_load(self, job_id: int, src_spec: Any, dst_spec: GPULoadStoreSpec) -> bool:
        """CPU-tier chunk rows -> engine blocks: copied now, finished when the link says."""
        return self._run(job_id, dst_spec, src_spec, to_host=False)

    def get_finished(self) -> list[TransferResult]:
        """The jobs due by now, each once: stores then loads, each direction in submission order."""
        now = self._clock()
        out: list[TransferResult] = []
        for q in self._queues.values():
            while q and q[0].due <= now:
                out.append(q.popleft().result)
        return out

    def wait(self, job_ids: set[int]) -> None:
        """Sleep until every job in ``job_ids`` still in flight is due (they are
        then reported by the next ``get_finished``); unknown ids are done already."""
        due = [j.due for q in self._queues.values() for j in q if j.result.job_id in job_ids]
        if due:
            left = max(due) - self._clock()
            if left > 0:
                self._sleep(left)

    def shutdown(self) -> None:
        self._engine.clear()
        self._host.clear()
        if self._region is not None:
            self._region.cleanup()
            self._region = None


def link_for(spec: Any) -> InstantLink | TimedLink:
    """The link a spec's config asks for: ``link_gbps`` of its ``kvtier`` object
    (kvtier's options, over the settings layer) or, for a spec without one
    (vLLM's CPU tier alone), of ``kv_connector_extra_config`` itself.  Raises
    ValueError for a bad value."""
    extra = getattr(spec, "extra_config", None) or {}
    if isinstance(extra.get("kvtier"), dict):
        from kvtier.engine_adapter.config import PluginConfig
        gbps = PluginConfig.parse(extra["kvtier"], engine="vllm").link_gbps
    else:
        gbps = extra.get("link_gbps")
    return InstantLink() if gbps is None else TimedLink(float(gbps))


def make_cpu_worker(spec: Any, kv_caches: CanonicalKVCaches) -> CpuRowWorker:
    """The worker for a ``TieringOffloadingSpec`` on the CPU platform: its
    shared region mapped for this rank, as vLLM's ``create_worker`` maps it, and
    the spec's link (:func:`link_for`).  Raises ValueError for the canonical
    layout or a bad ``link_gbps``."""
    from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion
    if getattr(spec.config, "canonical_layout", False):
        raise ValueError("kvtier: the canonical KV layout is not supported on vLLM's CPU platform")
    link = link_for(spec)
    rank = 0 if spec.replicated_layout else spec.config.parallel.rank
    region = SharedOffloadRegion(engine_id=spec.config.engine_id, num_chunks=spec.num_chunks, rank=rank,
                                 kv_bytes_per_chunk=spec.kv_bytes_per_chunk,
                                 cpu_page_size=spec.cpu_page_size_per_worker)
    try:
        return CpuRowWorker(kv_caches, blocks_per_chunk=spec.blocks_per_chunk, region=region, link=link)
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
