"""kvtier as a vLLM KV-offloading tier, loaded by module path (pinned: vLLM 0.33.0).

vLLM's ``OffloadingConnector`` moves KV blocks GPU <-> a pinned CPU tier and,
with ``TieringOffloadingSpec``, cascades them on to *secondary tiers* (and
promotes them back on a hit).  kvtier plugs in there, so vLLM keeps doing the
GPU DMA and kvtier owns everything below DRAM (NVMe, durable, checksummed),
guided by tool-wait hints.  Three ways to name it, none needs a fork:

1. The spec, by ``spec_module_path``: ``KvtierOffloadingSpec`` is vLLM's
   ``TieringOffloadingSpec`` with kvtier installed as its secondary tier::

       vllm serve M --kv-transfer-config '{"kv_connector": "OffloadingConnector",
         "kv_role": "kv_both", "kv_connector_extra_config": {
           "spec_name": "KvtierOffloadingSpec", "spec_module_path": "kvtier.engine_adapter.vllm",
           "cpu_bytes_to_use": 8000000000,
           "kvtier": {"data_dir": "/nvme/kvtier", "nvme_gb": 200}}}'

2. The tier alone, inside vLLM's own multi-tier spec (next to other tiers)::

       "spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": 8000000000,
       "secondary_tiers": [{"type": "KvtierTier", "module_path": "kvtier.engine_adapter.vllm",
                            "data_dir": "/nvme/kvtier", "nvme_gb": 200}]

3. The connector, by ``kv_connector_module_path``: ``KvtierConnector`` is
   vLLM's ``OffloadingConnector`` (a ``KVConnectorBase_V1``) with
   ``KvtierOffloadingSpec`` preselected; GPU <-> CPU transfers stay vLLM's own::

       --kv-transfer-config '{"kv_connector": "KvtierConnector",
         "kv_connector_module_path": "kvtier.engine_adapter.vllm", "kv_role": "kv_both",
         "kv_connector_extra_config": {"cpu_bytes_to_use": 8000000000,
                                       "kvtier": {"data_dir": "/nvme/kvtier"}}}'

Keys are vLLM's offload keys (block hash || KV-cache group index) folded with
a namespace (model, KV dtype, tokens per chunk, world size) into store keys;
one store per engine (``data_dir/<model>-w<world>[-dp<i>]``), since the
secondary tier runs in the scheduler process and sees every worker's bytes of
a chunk in one primary-tier row.

Hints.  A request's ``kv_transfer_params`` may carry
``{"kvtier": {"tool": "pytest", "trajectory_id": "t-7"}}`` (or a ``kv_hints``
action of type ``kvtier.tool_wait``); with ``policy`` (+ ``model``) or
``service_url`` configured, each cascade of that request is placed by the
policy: host tier, NVMe tier, or not stored at all (recompute).

Faults.  A miss, a corrupt block, a full disk or a closed store fail the job
(vLLM then recomputes / keeps the block only in DRAM); nothing raises into
the scheduler.  Bad tier config raises ``ValueError`` at start-up.
"""
from __future__ import annotations

import logging
import math
import re
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Iterable

import numpy as np

from kvtier.engine_adapter.plugin_common import EngineErrorLog, PlacementAdvisor, ToolHint, store_key
from kvtier.store import Namespace, StoreConfig, StoreError, TieredStore

try:
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import OffloadingConnector
    from vllm.v1.kv_offload.base import (LookupResult, Medium, OffloadKey, ReqContext,
                                         RequestOffloadingContext)
    from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager, TransferJob
    from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec
except ImportError as exc:  # pragma: no cover - depends on the optional install
    raise ImportError(f"kvtier.engine_adapter.vllm needs vllm==0.33.0 (pip install --no-deps -r "
                      f"ci/requirements-engines.txt): {exc}") from exc

log = logging.getLogger("kvtier.vllm")

VLLM_VERSION = "0.33.0"
GB = 10**9
TIER_TYPE = "KvtierTier"
_OPTIONS = ("data_dir", "nvme_gb", "host_gb", "io_engine", "direct_io", "durable", "policy", "model",
            "node", "service_url", "default_tier", "io_threads", "locality")


def _gb(name: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise ValueError(f"kvtier: {name} must be a number of GB >= 0, got {v!r}")
    return int(v * GB)


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", s).strip("-") or "model"


@dataclass(frozen=True)
class _Hint:
    """Per-request state kept in vLLM's ReqContext (keyed by type)."""
    hint: ToolHint | None


class KvtierTier(SecondaryTierManager, EngineErrorLog):
    """A vLLM secondary tier backed by kvtier's ``TieredStore``.

    All vLLM calls arrive under the tiering manager's lock (never
    concurrently); transfers run on a small thread pool and report through
    ``get_finished_jobs``.  The finished-job queue and counters are guarded
    by ``_lock``; the store is thread-safe.
    """

    _log = log  # EngineErrorLog reports through this engine's logger

    medium: ClassVar[Medium] = Medium.STORAGE

    def __init__(self, offloading_spec: Any, primary_kv_view: memoryview, tier_type: str,
                 backpressure_detector: Any = None, *, data_dir: str | None = None,
                 nvme_gb: float = 64, host_gb: float = 0, io_engine: str = "auto",
                 direct_io: str = "auto", durable: bool = True, policy: str | None = None,
                 model: str | None = None, node: str | None = None, service_url: str | None = None,
                 default_tier: str = "nvme", io_threads: int = 2, locality: str | None = None) -> None:
        super().__init__(offloading_spec=offloading_spec, primary_kv_view=primary_kv_view,
                         tier_type=tier_type, backpressure_detector=backpressure_detector)
        if not isinstance(data_dir, str) or not data_dir:
            raise ValueError("kvtier: the tier config needs \"data_dir\" (the store directory)")
        if not isinstance(io_threads, int) or isinstance(io_threads, bool) or not 1 <= io_threads <= 64:
            raise ValueError(f"kvtier: io_threads must be an int in 1..64, got {io_threads!r}")
        nvme_bytes, host_bytes = _gb("nvme_gb", nvme_gb), _gb("host_gb", host_gb)
        if nvme_bytes == 0 and host_bytes == 0:
            raise ValueError("kvtier: nvme_gb and host_gb are both 0: nowhere to store blocks")
        if (policy or service_url) and not model:
            raise ValueError("kvtier: policy/service_url need \"model\" (a model preset name)")
        if policy and service_url:
            raise ValueError("kvtier: give either policy or service_url, not both")
        if default_tier not in ("host", "nvme"):
            raise ValueError(f"kvtier: default_tier must be 'host' or 'nvme', got {default_tier!r}")

        cfg = getattr(offloading_spec, "config", None)
        model_name = getattr(getattr(cfg, "model", None), "name", None) or "model"
        kv_dtype = str(getattr(getattr(cfg, "model", None), "dtype", "unknown"))
        par = getattr(cfg, "parallel", None)
        world = int(getattr(par, "world_size", 1) or 1)
        dp = int(getattr(par, "data_parallel_index", 0) or 0)
        tokens = getattr(offloading_spec, "tokens_per_block", ())
        bpc = int(getattr(offloading_spec, "blocks_per_chunk", 1) or 1)
        self._tokens_per_chunk = int(tokens[0]) * bpc if tokens else 0
        self._ns = Namespace(model_id=model_name, dtype=kv_dtype,
                             layout=f"vllm:chunk{bpc}x{','.join(map(str, tokens))}:w{world}",
                             tp_rank=0)
        self.root = Path(data_dir) / "-".join([_slug(model_name), f"w{world}"] + ([f"dp{dp}"] if dp else []))
        self._rows = np.frombuffer(primary_kv_view, dtype=np.uint8).reshape(-1, self.block_size_bytes) \
            if primary_kv_view.contiguous else None
        if self._rows is None:
            raise ValueError("kvtier: the primary tier's KV view must be contiguous")
        store_cfg = StoreConfig.from_env(self.root, host_bytes=host_bytes, nvme_bytes=nvme_bytes,
                                         block_bytes=self.block_size_bytes, io_engine=io_engine,
                                         direct_io=direct_io, durable=bool(durable))
        host = host_bytes > 0
        if policy:
            from kvtier.tiering import make_policy
            from kvtier.tiering.presets import DEFAULT_NODE, get_node, get_preset
            adv = PlacementAdvisor(default_tier if host else "nvme",
                                   policy=make_policy(policy, geometry=get_preset(model),
                                                      hardware=get_node(node or DEFAULT_NODE)),
                                   host_available=host)
        elif service_url:
            from kvtier.tiering.client import KvtierClient
            adv = PlacementAdvisor(default_tier if host else "nvme", client=KvtierClient(service_url),
                                   model=model, host_available=host)
        else:
            adv = PlacementAdvisor(default_tier if host else "nvme", host_available=host)
        self.advisor = adv
        self.store = TieredStore.open(store_cfg)
        self._pool = ThreadPoolExecutor(max_workers=io_threads, thread_name_prefix="kvtier-io")
        self._lock = threading.Lock()
        self._finished: deque[JobResult] = deque()
        self._inflight: dict[int, Future] = {}
        self._warned: set[str] = set()
        self.counters = dict(chunks_stored=0, chunks_skipped=0, chunks_loaded=0, load_failures=0,
                             bytes_written=0, bytes_read=0, lookups=0, lookup_hits=0, errors=0)
        log.info("kvtier: tier %s at %s, chunk %d bytes, %d NVMe slots, %d host frames",
                 tier_type, self.root, self.block_size_bytes, store_cfg.nvme_slots, store_cfg.host_frames)

    # ------------------------------------------------------------ helpers
    def _count(self, **kw: int) -> None:
        with self._lock:
            for k, v in kw.items():
                self.counters[k] += v

    def _done(self, res: JobResult) -> None:
        with self._lock:
            self._finished.append(res)
            self._inflight.pop(res.job_id, None)

    def _submit(self, job: TransferJob, fn) -> None:
        def run() -> None:
            try:
                res = fn(job)
            except Exception as exc:  # a job never dies silently: it reports failure
                self._warn(f"job {job.job_id}", exc)
                res = JobResult(job_id=job.job_id, success=False)
            self._done(res)
        with self._lock:
            self._inflight[job.job_id] = None  # type: ignore[assignment]
        try:
            fut = self._pool.submit(run)
        except RuntimeError as exc:  # pool shut down
            self._warn("submit", exc)
            self._done(JobResult(job_id=job.job_id, success=False))
            return
        with self._lock:
            if job.job_id in self._inflight:
                self._inflight[job.job_id] = fut

    def _keys(self, keys: Iterable[OffloadKey]) -> list[bytes]:
        return [store_key(self._ns, k) for k in keys]

    @staticmethod
    def hint_of(req_context: Any) -> ToolHint | None:
        """The kvtier hint a request carries (kv_transfer_params or kv_hints)."""
        st = req_context.get_state(_Hint) if hasattr(req_context, "get_state") else None
        if st is not None:
            return st.hint
        return (ToolHint.parse(getattr(req_context, "kv_transfer_params", None))
                or ToolHint.from_kv_hints(getattr(req_context, "kv_hints", None)))

    # ------------------------------------------------------------ SecondaryTierManager
    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        """Parse the request's hint once and keep it in its context."""
        req_context.set_state(_Hint(self.hint_of(req_context)))
        return RequestOffloadingContext()

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        """HIT if the chunk is stored and readable; MISS otherwise (also on a
        closed store or a bad key)."""
        try:
            hit = self.store.contains(store_key(self._ns, key))
        except (StoreError, ValueError) as exc:
            self._warn("lookup", exc)
            hit = False
        self._count(lookups=1, lookup_hits=int(hit))
        return LookupResult.HIT if hit else LookupResult.MISS

    def submit_store(self, job_metadata: TransferJob) -> None:
        """Primary chunks ``chunk_ids`` -> the store, on the I/O pool."""
        self._submit(job_metadata, self._store_job)

    def _store_job(self, job: TransferJob) -> JobResult:
        keys = list(job.keys)
        ids = [int(c) for c in job.chunk_ids]
        if len(keys) != len(ids):
            raise ValueError(f"{len(keys)} keys but {len(ids)} chunk ids")
        hint = self.hint_of(job.req_context)
        n_tokens = self._tokens_per_chunk
        place = self.advisor.place(hint, kv_bytes=len(keys) * self.block_size_bytes,
                                   context_tokens=len(keys) * n_tokens)
        if place.tier is None:   # recompute: do not keep this request's blocks below DRAM
            self._count(chunks_skipped=len(keys))
            return JobResult(job_id=job.job_id, success=False)
        tier = place.tier
        if tier == "host" and not self.store.config.host_frames:
            tier = "nvme"
        t0 = _now()
        # O_DIRECT straight from vLLM's CPU-tier rows (page-aligned shared memory):
        # no staging copy; blocks already stored are skipped by the store
        n = self.store.put_many(self._keys(keys), [self._rows[c] for c in ids], namespace=self._ns, tier=tier)
        self._count(chunks_stored=n, bytes_written=n * self.block_size_bytes)
        return JobResult(job_id=job.job_id, success=True, transfer_time=_now() - t0,
                         transfer_bytes=n * self.block_size_bytes)

    def submit_load(self, job_metadata: TransferJob) -> None:
        """The store -> primary chunks ``chunk_ids``, on the I/O pool."""
        self._submit(job_metadata, self._load_job)

    def _load_job(self, job: TransferJob) -> JobResult:
        keys = list(job.keys)
        ids = [int(c) for c in job.chunk_ids]
        if len(keys) != len(ids):
            raise ValueError(f"{len(keys)} keys but {len(ids)} chunk ids")
        t0 = _now()
        # read straight into the promotion's primary rows (O_DIRECT, checksums
        # verified); a block that misses or fails its checksum reads as False and
        # its row is zeroed -- never served: the job reports it as not loaded
        res = self.store.get_many(self._keys(keys), [self._rows[c] for c in ids])
        ok = [k for k, good in zip(keys, res) if good]
        nbytes = len(ok) * self.block_size_bytes
        self._count(chunks_loaded=len(ok), load_failures=len(keys) - len(ok), bytes_read=nbytes)
        if len(ok) == len(keys):
            return JobResult(job_id=job.job_id, success=True, transfer_time=_now() - t0, transfer_bytes=nbytes)
        return JobResult(job_id=job.job_id, success=False, successful_keys=ok,
                         transfer_time=_now() - t0, transfer_bytes=nbytes)

    def get_finished_jobs(self) -> Iterable[JobResult]:
        with self._lock:
            out = list(self._finished)
            self._finished.clear()
        return out

    def has_pending_work(self) -> bool:
        with self._lock:
            return bool(self._inflight)

    def drain_jobs(self) -> None:
        """Wait for every submitted job (their results stay queued)."""
        while True:
            with self._lock:
                futs = [f for f in self._inflight.values() if f is not None]
                pending = bool(self._inflight)
            if not pending:
                return
            for f in futs:
                try:
                    f.result()
                except Exception:  # run() never raises; be safe anyway
                    pass
            if not futs:
                threading.Event().wait(0.001)

    def shutdown(self) -> None:
        """Finish in-flight jobs, then close the store.  Idempotent."""
        self.drain_jobs()
        self._pool.shutdown(wait=True)
        self.store.close()
        self._rows = None   # release the view of vLLM's shared region (it unmaps it next)

    def stats(self) -> dict:
        """Chunks/bytes moved, lookups and hits, decisions taken."""
        with self._lock:
            out: dict[str, Any] = dict(self.counters)
        out["decisions"] = self.advisor.counts()
        return out


def _now() -> float:
    import time
    return time.monotonic()


class KvtierOffloadingSpec(TieringOffloadingSpec):
    """vLLM's ``TieringOffloadingSpec`` with kvtier as its (last) secondary tier.

    Name it with ``spec_name: "KvtierOffloadingSpec", spec_module_path:
    "kvtier.engine_adapter.vllm"``; the tier's options go under ``"kvtier"`` in
    ``kv_connector_extra_config`` (see :class:`KvtierTier`).  Any
    ``secondary_tiers`` already configured are kept in front of it.
    """

    def __init__(self, config: Any) -> None:
        extra = dict(config.extra_config)
        opts = extra.get("kvtier")
        if not isinstance(opts, dict):
            raise ValueError("kvtier: kv_connector_extra_config needs a \"kvtier\" object "
                             "(at least {\"data_dir\": ...})")
        unknown = sorted(set(opts) - set(_OPTIONS))
        if unknown:
            raise ValueError(f"kvtier: unknown option(s) {unknown}; known: {list(_OPTIONS)}")
        tiers = [dict(t) for t in extra.get("secondary_tiers", []) if isinstance(t, dict)]
        tiers.append({"type": TIER_TYPE, "module_path": __name__, **opts})
        extra["secondary_tiers"] = tiers
        import dataclasses
        super().__init__(dataclasses.replace(config, extra_config=extra))


class KvtierConnector(OffloadingConnector):
    """vLLM's ``OffloadingConnector`` with ``KvtierOffloadingSpec`` preselected,
    for ``kv_connector_module_path``::

        --kv-transfer-config '{"kv_connector": "KvtierConnector",
          "kv_connector_module_path": "kvtier.engine_adapter.vllm", "kv_role": "kv_both",
          "kv_connector_extra_config": {"cpu_bytes_to_use": 8000000000,
                                        "kvtier": {"data_dir": "/nvme/kvtier"}}}'

    Everything else (GPU <-> CPU transfers, scheduling) is vLLM's own connector.
    """

    @staticmethod
    def with_kvtier_spec(extra: dict) -> dict:
        """``extra`` (mutated in place and returned) naming kvtier's spec unless
        the user named another one.  Raises ValueError without a ``kvtier`` object."""
        if not isinstance(extra.get("kvtier"), dict):
            raise ValueError("kvtier: kv_connector_extra_config needs a \"kvtier\" object "
                             "(at least {\"data_dir\": ...})")
        extra.setdefault("spec_name", "KvtierOffloadingSpec")
        extra.setdefault("spec_module_path", __name__)
        return extra

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any) -> None:
        self.with_kvtier_spec(vllm_config.kv_transfer_config.kv_connector_extra_config)
        super().__init__(vllm_config, role, kv_cache_config)
