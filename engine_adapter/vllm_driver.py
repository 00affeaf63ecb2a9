"""The calls vLLM's offloading scheduler makes on an offloading manager, as a
small driver for tests and benchmarks on machines without a GPU.

vLLM's ``OffloadingConnectorScheduler`` (vllm 0.33.0,
``distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py``) calls,
under ``manager.lock``: ``on_new_request``; per chunk ``lookup``;
``prepare_load``/``complete_load`` around the worker's CPU -> GPU copy;
``prepare_store``/``complete_store`` around the worker's GPU -> CPU copy;
``on_schedule_end`` once per step; ``on_request_finished``.  The GPU worker
(``CPUOffloadingWorker``) needs CUDA, so :meth:`SchedulerDriver.offload`
writes the CPU-tier rows where that worker's copy would land.

Nothing here decides anything; it only sequences vLLM's own calls.
"""
from __future__ import annotations

import mmap
import time
from typing import Any, Mapping, Sequence

import numpy as np

from kvtier.engine_adapter.vllm_version import manager_lock
from vllm.v1.kv_offload.base import LookupResult, ReqContext, ScheduleEndContext

_END = ScheduleEndContext(new_req_ids=(), preempted_req_ids=())


class SchedulerDriver:
    """Drives ``spec.get_manager()`` (a ``TieringOffloadingManager``) the way
    vLLM's scheduler does.  ``rows`` is the CPU tier as (chunks, bytes)."""

    def __init__(self, spec: Any) -> None:
        self.spec = spec
        self.mgr = spec.get_manager()
        self.lock = manager_lock(self.mgr)
        self.tiers = list(getattr(self.mgr, "secondary_tiers", ()))
        self.copy_s = 0.0        # seconds of the worker's CPU -> "GPU" copies in read_hits
        view = self.mgr.primary_tier.get_kv_memoryview()
        self.rows = np.frombuffer(view, dtype=np.uint8).reshape(view.shape[0], -1)
        # vLLM's GPU workers pre-fault (and pin) their shards of this shared region at start
        # (SharedOffloadRegion populate_shard); with no worker here, the driver does: one
        # write per page, so no tier's timed I/O pays the first touch of the CPU tier's memory
        flat = np.frombuffer(view, dtype=np.uint8)
        flat[::mmap.PAGESIZE] = 0

    def new_request(self, req_id: str, kv_transfer_params: Mapping | None = None) -> ReqContext:
        ctx = ReqContext(req_id=req_id, kv_transfer_params=dict(kv_transfer_params) if kv_transfer_params else None)
        with self.lock:
            self.mgr.on_new_request(ctx)
        return ctx

    def offload(self, ctx: ReqContext, keys: Sequence, payload: Mapping) -> list:
        """prepare_store -> the worker's GPU -> CPU copy (``payload[key]`` into the
        chunk's row) -> complete_store, which cascades to the secondary tiers.
        Returns the keys that were newly stored in the CPU tier."""
        with self.lock:
            out = self.mgr.prepare_store(list(keys), ctx)
        if out is None:
            raise RuntimeError("the CPU tier cannot take these chunks")
        if not out.keys_to_store:     # all already in the CPU tier: the scheduler stores nothing
            return []
        for k, c in zip(out.keys_to_store, out.store_spec.chunk_ids):
            self.rows[c] = payload[k]
        with self.lock:
            self.mgr.complete_store(out.keys_to_store, ctx)
        return list(out.keys_to_store)

    def step(self) -> None:
        with self.lock:
            self.mgr.on_schedule_end(_END)

    def settle(self, timeout_s: float = 60.0) -> None:
        """Step until no tier has work in flight (jobs drained and processed)."""
        deadline = time.monotonic() + timeout_s
        while True:
            for t in self.tiers:
                t.drain_jobs()
            self.step()
            with self.lock:
                busy = self.mgr.has_pending_work()
            if not busy:
                return
            if time.monotonic() > deadline:
                raise TimeoutError("offloading manager still busy")
            time.sleep(0.001)

    def lookup(self, ctx: ReqContext, key) -> LookupResult:
        with self.lock:
            return self.mgr.lookup(key, ctx)

    def fetch(self, ctx: ReqContext, keys: Sequence, timeout_s: float = 60.0) -> list[LookupResult]:
        """Look every key up until it is no longer RETRY / HIT_PENDING (promotions
        from secondary tiers run and complete meanwhile).  Returns the final results.

        Event-driven, in vLLM's order: a round of lookups queues promotions,
        the step (``on_schedule_end``) submits them, the tiers' jobs are waited
        for (their futures), and the next round's first lookup takes the
        finished jobs in.  It sleeps (0.5 ms) only after a round in which
        nothing settled and no tier had a job to wait for (a tier answering
        RETRY while busy elsewhere)."""
        deadline = time.monotonic() + timeout_s
        final: dict[int, LookupResult] = {}
        while True:
            settled = len(final)
            for i, k in enumerate(keys):
                if i not in final:
                    r = self.lookup(ctx, k)
                    if r in (LookupResult.HIT, LookupResult.MISS):
                        final[i] = r
            if len(final) == len(keys):
                return [final[i] for i in range(len(keys))]
            self.step()                 # submits the promotions the lookups queued
            waited = any(t.has_pending_work() for t in self.tiers)
            for t in self.tiers:
                t.drain_jobs()
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(keys) - len(final)} lookups still pending")
            if not waited and len(final) == settled:
                time.sleep(0.0005)

    def read(self, ctx: ReqContext, keys: Sequence) -> list[bytes]:
        """prepare_load -> the worker's CPU -> GPU copy (returned) -> complete_load."""
        with self.lock:
            spec = self.mgr.prepare_load(list(keys), ctx)
        data = [self.rows[c].tobytes() for c in spec.chunk_ids]
        with self.lock:
            self.mgr.complete_load(list(keys), ctx)
        return data

    def read_hits(self, ctx: ReqContext, keys: Sequence, out: Mapping | None = None) -> dict:
        """Under one hold of the manager's lock (as the scheduler's step does):
        load the ``keys`` the CPU tier holds now -- prepare_load, the worker's
        copy, complete_load.  (The CPU tier's own lookup: the manager's would
        start promotions, which can evict a key just found.)  Returns {key: bytes},
        or with ``out`` ({key: a writable uint8 row of the chunk's size}: the GPU
        KV cache's blocks, allocated before) the copies land in those rows, as
        the worker's DMA lands in preallocated GPU blocks, and it returns {key: row}.
        ``copy_s`` adds up the seconds the worker's copies took (a caller timing
        vLLM's calls can leave out what a GPU would do as an asynchronous DMA)."""
        with self.lock:
            hit = [k for k in keys if self.mgr.primary_tier.lookup(k, ctx) is LookupResult.HIT]
            if not hit:
                return {}
            spec = self.mgr.prepare_load(hit, ctx)
            t0 = time.perf_counter()
            if out is None:
                data = {k: self.rows[c].tobytes() for k, c in zip(hit, spec.chunk_ids)}
            else:
                data = {}
                for k, c in zip(hit, spec.chunk_ids):
                    dst = data[k] = out[k]
                    np.copyto(dst, self.rows[c])
            self.copy_s += time.perf_counter() - t0
            self.mgr.complete_load(hit, ctx)
        return data

    def finish(self, ctx: ReqContext) -> None:
        with self.lock:
            self.mgr.on_request_finished(ctx)

    def shutdown(self) -> None:
        self.rows = None   # release our view of vLLM's shared region before it unmaps it
        self.mgr.shutdown()
