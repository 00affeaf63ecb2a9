"""The replay's SGLang: ``KvtierStorage`` loaded by SGLang's own
``StorageBackendFactory`` (as ``--hicache-storage-backend dynamic`` does),
over a ``page_first`` host pool (SGLang's L2).

A round's pages are written into the pool and backed up with
``batch_set_v1``; a resume asks ``batch_exists`` and loads with
``batch_get_v1`` into other pool slots (SGLang's L2 is taken to have evicted
them: the replay measures the L3 path), then compares the pool's bytes.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from .workload import Geometry, Step, payload

LAYERS, HEADS = 2, 1


class SglangReplay:
    """One policy's SGLang storage backend (kvtier, with ``kvtier_opts``)."""

    def __init__(self, geo: Geometry, data_dir: Path, *, kvtier_opts: dict, max_pages: int, hints: bool) -> None:
        import torch
        from kvtier.bench.bench_sglang import PageFirstHostPool
        import kvtier.engine_adapter.sglang as ks
        from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig, HiCacheStorageExtraInfo
        from sglang.srt.mem_cache.storage import StorageBackendFactory
        self.torch, self.ks, self.geo, self.hints = torch, ks, geo, hints
        self.Extra = HiCacheStorageExtraInfo
        head_dim = geo.bytes_per_token // (2 * LAYERS * HEADS * 2)      # K and V, fp16
        if head_dim * 2 * LAYERS * HEADS * 2 != geo.bytes_per_token:
            raise ValueError(f"bytes_per_token {geo.bytes_per_token} is not a multiple of {2 * LAYERS * HEADS * 2}")
        self.page = geo.chunk_tokens
        self.pool = PageFirstHostPool((max_pages + 1) * self.page, self.page, LAYERS, HEADS, head_dim,
                                      torch.float16)
        extra = {"backend_name": "kvtier", "module_path": "kvtier.engine_adapter.sglang",
                 "class_name": "KvtierStorage", "interface_v1": 1, "data_dir": str(data_dir), **kvtier_opts}
        cfg = HiCacheStorageConfig(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
                                   is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
                                   model_name="replay", extra_config=extra)
        self.b = StorageBackendFactory.create_backend("dynamic", cfg, self.pool)
        self.b.register_mem_pool_host(self.pool)
        if self.b.store.config.block_bytes != geo.chunk_bytes:
            raise ValueError("page bytes differ from the replay's chunk bytes")

    def _extra(self, step: Step, tool: str | None) -> object | None:
        if not self.hints or tool is None:
            return None
        return self.Extra(extra_info={"kvtier": {"tool": tool, "trajectory_id": step.session,
                                                 "context_tokens": step.context_tokens}})

    @staticmethod
    def _hex(cids) -> list[str]:
        return [c.hex() for c in cids]

    def _idx(self, n: int):
        return self.torch.arange(0, n * self.page)

    def set_clock(self, clock) -> None:
        """The lifecycle controller (if any) runs on the replay's trace clock."""
        self.b.lifecycle.replay_on(clock)

    def moves(self) -> list:
        """The lifecycle's store moves so far, ``(t0, t1, kind, tid, blocks)`` (perf_counter seconds)."""
        return self.b.lifecycle.moves()

    def begin(self, step: Step) -> None:
        pass

    def served_from(self, step: Step) -> tuple[str, int]:
        """Where the resume's pages are now: ("host" | "nvme" | "miss", pages in host frames)."""
        worst, in_host = "host", 0
        for sk in self.b.store_keys(self._hex(step.resume_chunks)):
            w = {str(t) for t in self.b.store.where(sk)}
            if not w:
                return "miss", in_host
            if "host" not in w:
                worst = "nvme"
            else:
                in_host += 1
        return worst, in_host

    def resume(self, step: Step) -> tuple[bool, bool, float]:
        """SGLang's prefetch of the context: ``batch_exists`` then
        ``batch_get_v1`` (timed: the load), then the pool's bytes compared
        (not timed).  Returns (all found, bytes equal, load seconds)."""
        keys = self._hex(step.resume_chunks)
        extra = self._extra(step, step.prev_tool)
        t0 = time.perf_counter()
        n = self.b.batch_exists(keys, extra)
        got = self.b.batch_get_v1(keys[:n], self._idx(n), extra) if n else []
        load_s = time.perf_counter() - t0
        ok = sum(got)
        exact = True
        buf = self.pool.kv_buffer
        for i, cid in enumerate(step.resume_chunks[:ok]):
            page = buf[:, i * self.page:(i + 1) * self.page].contiguous().view(self.torch.uint8).numpy()
            exact &= np.array_equal(page.reshape(-1), _as_page(payload(cid, self.geo.chunk_bytes)))
        return ok == len(keys), exact, load_s

    def store(self, step: Step) -> None:
        cids = step.store_chunks
        buf = self.pool.kv_buffer
        for i, cid in enumerate(cids):
            src = self.torch.from_numpy(_as_page(payload(cid, self.geo.chunk_bytes)).copy())
            buf[:, i * self.page:(i + 1) * self.page].copy_(src.view(self.torch.float16).reshape(
                buf[:, i * self.page:(i + 1) * self.page].shape))
        self.b.batch_set_v1(self._hex(cids), self._idx(len(cids)), self._extra(step, step.tool))

    def finish(self, step: Step) -> None:
        pass

    def stats(self) -> dict:
        return self.b.kvtier_stats()

    def io_bytes(self) -> tuple[int, int]:
        s = self.b.kvtier_stats()
        return s["bytes_written"], s["bytes_read"]

    def close(self) -> None:
        self.b.close()


def _as_page(p: np.ndarray) -> np.ndarray:
    return p
