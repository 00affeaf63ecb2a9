"""The replay's vLLM: ``TieringOffloadingManager`` built by vLLM's own specs,
driven the way its scheduler drives it (``kvtier.engine_adapter.vllm_driver``).

Two set-ups on the same bytes: kvtier as the secondary tier
(``KvtierOffloadingSpec``; policies breakeven, lru, ttl), and vLLM's own
file-system tier (``TieringOffloadingSpec`` with ``secondary_tiers: [{"type":
"fs"}]``).  vLLM's CPU primary tier is kept small (``primary_chunks``), so
resumes come through the secondary tier.  The GPU worker's copies (CUDA only)
are the driver writing/reading the primary rows where the worker would.

What the policy is told about this engine (:meth:`VllmReplay.set_clock`,
:meth:`VllmReplay.begin`):

* its KV pool holds no paused context: the replayed vLLM frees a finished
  request's blocks (no connector holds them), so a pause's ``hbm_pressure`` is
  the pool's real use by pauses, 0, not the paused trajectories' KV over a
  preset node's pool;
* a session's last round (no tool follows) ends its trajectory: no pause is
  priced at its finish.  vLLM's request parameters have no field for "no pause
  follows", so the replay's client says it through the lifecycle's ``hint``
  (tool None).  Sent as a plain unhinted request it would be priced as a pause
  of the ``default_tool`` that never resumes, its context staged into and held
  in host frames ahead of the sessions that do come back.
"""
from __future__ import annotations

import time
import uuid
from pathlib import Path

import numpy as np

from kvtier.engine_adapter.vllm_version import manager_lock

from .workload import Geometry, Step, payload

BLOCK_TOKENS = 16
BATCH = 128           # chunks per store/load step: half the primary tier (which must hold one batch),
                      # as vLLM's scheduler loads a request's matched chunks in one step where they fit.
                      # (at 32 a 1,200-chunk resume took 190 ms from DRAM, 109 ms at 128, with the
                      # driver's event-driven fetch; interleaved runs, a loaded machine)


def _offloading_config(geo: Geometry, primary_chunks: int, extra: dict):
    from vllm.v1.kv_offload.config import (OffloadingCacheConfig, OffloadingConfig, OffloadingGroupConfig,
                                           OffloadingModelConfig, OffloadingParallelConfig)
    bpc = geo.chunk_tokens // BLOCK_TOKENS
    return OffloadingConfig(
        groups=(OffloadingGroupConfig(tokens_per_block=BLOCK_TOKENS, layer_names=("l0",), group_id=0),),
        worker_kv_bytes_per_block=geo.bytes_per_token * BLOCK_TOKENS, enable_kv_cache_events=False,
        extra_config={"cpu_bytes_to_use": primary_chunks * geo.chunk_bytes, **extra},
        engine_id=uuid.uuid4().hex, model=OffloadingModelConfig(name="replay", dtype="bfloat16"),
        cache=OffloadingCacheConfig(tokens_per_hash=BLOCK_TOKENS, blocks_per_chunk=bpc),
        parallel=OffloadingParallelConfig(rank=0, world_size=1, tp_size=1, pp_size=1, pcp_size=1, dcp_size=1,
                                          data_parallel_index=0, data_parallel_size=1,
                                          data_parallel_rank_local=None, is_parallelism_agnostic=True))


def _no_paused_kv() -> float:
    """The replayed vLLM's KV pool use by paused contexts: none (it frees a finished request's blocks)."""
    return 0.0


class VllmReplay:
    """One policy's vLLM.  ``kvtier_opts`` None: vLLM's fs tier instead of kvtier."""

    def __init__(self, geo: Geometry, data_dir: Path, *, kvtier_opts: dict | None, primary_chunks: int,
                 hints: bool) -> None:
        from vllm.v1.kv_offload.base import make_offload_key
        from kvtier.engine_adapter.vllm_driver import SchedulerDriver
        self.geo, self.hints = geo, hints
        self._mk = make_offload_key
        if kvtier_opts is None:
            from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec
            spec = TieringOffloadingSpec(_offloading_config(
                geo, primary_chunks, {"secondary_tiers": [{"type": "fs", "root_dir": str(data_dir)}]}))
        else:
            import kvtier.engine_adapter.vllm as kv
            spec = kv.KvtierOffloadingSpec(_offloading_config(geo, primary_chunks,
                                                              {"kvtier": {"data_dir": str(data_dir), **kvtier_opts}}))
        self.drv = SchedulerDriver(spec)
        self.tier = self.drv.tiers[0]
        self.kvtier = kvtier_opts is not None
        self._ctx: dict[str, object] = {}
        self._fs_written = self._fs_read = 0     # vLLM's fs tier keeps no byte counters: counted here

    def _lifecycle(self):
        """kvtier's lifecycle (a ``Lifecycle`` or ``NoLifecycle``); None for vLLM's fs tier."""
        return getattr(self.tier, "lifecycle", None) if self.kvtier else None

    def set_clock(self, clock) -> None:
        """The lifecycle controller (if any) runs on the replay's trace clock and
        reads this engine's pool use by pauses: none (see the module doc)."""
        lc = self._lifecycle()
        if lc is not None:
            lc.replay_on(clock)
            ctl = getattr(lc, "controller", None)     # NoLifecycle: nothing is priced
            if ctl is not None:
                ctl.pool_usage = _no_paused_kv

    def _key(self, cid: bytes):
        return self._mk(cid, 0)

    def _params(self, step: Step) -> dict | None:
        if not self.hints:
            return None
        p: dict = {"session_id": step.session}
        if step.tool is not None:
            p["kvtier"] = {"tool": step.tool, "trajectory_id": step.session, "context_tokens": step.context_tokens}
        return p

    def begin(self, step: Step) -> None:
        """A request of the round arrives (vLLM's on_new_request); a round no tool
        follows ends its session, so no pause is priced at its finish (see the module doc)."""
        self._ctx[step.session] = self.drv.new_request(f"{step.session}#{step.round}", self._params(step))
        lc = self._lifecycle()
        if self.hints and step.tool is None and lc is not None:
            lc.hint(step.session, None)

    def served_from(self, step: Step) -> tuple[str, int]:
        """Where the resume's chunks are now: "host" (vLLM's CPU tier or kvtier
        host frames), "nvme" (kvtier NVMe or vLLM's fs tier), "miss"; and how
        many of them are in DRAM."""
        from vllm.v1.kv_offload.base import LookupResult
        ctx = self._ctx[step.session]
        mgr = self.drv.mgr
        worst, in_host = "host", 0
        with manager_lock(mgr):
            for cid in step.resume_chunks:
                k = self._key(cid)
                if mgr.primary_tier.lookup(k, ctx) is LookupResult.HIT:
                    in_host += 1
                    continue
                if not self.kvtier:
                    worst = "nvme"
                    self._fs_read += self.geo.chunk_bytes
                    continue
                w = self.tier.store.where(self.tier._keys([k])[0])
                if not w:
                    return "miss", in_host
                if "host" not in {str(t) for t in w}:
                    worst = "nvme"
                else:
                    in_host += 1
        return worst, in_host

    def resume(self, step: Step) -> tuple[bool, bool, float]:
        """Load the context's chunks through vLLM; (all found, bytes equal, load seconds).
        A batch is looked up until settled (promotions from the secondary tier
        run meanwhile), then loaded under one hold of the manager's lock into the
        resume's "GPU" blocks (host memory allocated before, as a GPU's KV cache
        is); a chunk evicted from the small CPU tier in between is fetched
        again.  Only vLLM's calls are timed -- lookups, promotions from the
        secondary tier until they land in the CPU tier, prepare/complete_load --
        not the worker's copy into the "GPU" blocks (on a GPU an asynchronous
        DMA at tens of GB/s; here a memcpy at this machine's speed, the same
        bytes for every policy).  The bytes are compared afterwards."""
        from vllm.v1.kv_offload.base import LookupResult
        ctx = self._ctx[step.session]
        found, load_s, loaded = True, 0.0, []
        cids = list(step.resume_chunks)
        gpu = np.ones((len(cids), self.geo.chunk_bytes), dtype=np.uint8)
        rows = {}
        for i, c in enumerate(cids):
            rows.setdefault(self._key(c), gpu[i])
        for lo in range(0, len(cids), BATCH):
            want = {self._key(c): c for c in cids[lo:lo + BATCH]}
            todo = list(want)
            for _ in range(8):
                t0, c0 = time.perf_counter(), self.drv.copy_s
                res = self.drv.fetch(ctx, todo)
                hit = [k for k, r in zip(todo, res) if r is LookupResult.HIT]
                got = self.drv.read_hits(ctx, hit, rows)
                load_s += time.perf_counter() - t0 - (self.drv.copy_s - c0)
                missing = len(todo) - len(hit)
                loaded.extend((want[k], d) for k, d in got.items())
                todo = [k for k in hit if k not in got]
                if missing:
                    found = False
                if not todo:
                    break
            else:
                found = False
        exact = all(np.array_equal(d, payload(c, self.geo.chunk_bytes)) for c, d in loaded)
        return found, exact, load_s

    def moves(self) -> list:
        """The lifecycle's store moves so far, ``(t0, t1, kind, tid, blocks)`` (perf_counter seconds)."""
        lc = self._lifecycle()
        return lc.moves() if lc is not None else []

    def store(self, step: Step) -> None:
        """The round's context chunks go GPU -> CPU tier -> secondary (cascade)."""
        ctx = self._ctx[step.session]
        cids = list(step.store_chunks)
        for lo in range(0, len(cids), BATCH):
            part = cids[lo:lo + BATCH]
            keys = [self._key(c) for c in part]
            data = {self._key(c): payload(c, self.geo.chunk_bytes) for c in part}
            self._fs_written += len(self.drv.offload(ctx, keys, data)) * self.geo.chunk_bytes
            self.drv.settle()

    def finish(self, step: Step) -> None:
        """The request ends (vLLM's on_request_finished): the pause starts."""
        self.drv.finish(self._ctx.pop(step.session))

    def stats(self) -> dict:
        if not self.kvtier:
            return {}
        return self.tier.stats()

    def io_bytes(self) -> tuple[int, int]:
        """(bytes written to, read from the secondary tier)."""
        if self.kvtier:
            s = self.tier.stats()
            return s["bytes_written"], s["bytes_read"]
        return self._fs_written, self._fs_read

    def close(self) -> None:
        self.drv.settle()
        self.drv.shutdown()
