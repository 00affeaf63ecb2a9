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

3. The connector by name: ``KvtierConnector`` is vLLM's ``OffloadingConnector``
   (a ``KVConnectorBase_V1``) with ``KvtierOffloadingSpec`` preselected; GPU <-> CPU
   transfers stay vLLM's own.  kvtier registers it through vLLM's
   ``vllm.general_plugins`` entry point (:mod:`kvtier.engine_adapter.vllm_plugin`),
   so no module path is needed::

       --kv-transfer-config '{"kv_connector": "KvtierConnector", "kv_role": "kv_both",
         "kv_connector_extra_config": {"cpu_bytes_to_use": 8000000000,
                                       "kvtier": {"data_dir": "/nvme/kvtier"}}}'

Keys are vLLM's offload keys (block hash || KV-cache group index) folded with
a namespace (model, KV dtype, tokens per chunk, world size) into store keys;
one store per engine (``data_dir/<model>-w<world>[-dp<i>]``), since the
secondary tier runs in the scheduler process and sees every worker's bytes of
a chunk in one primary-tier row.

Hints and the lifecycle.  A request's ``kv_transfer_params`` may carry
``{"kvtier": {"tool": "pytest", "trajectory_id": "t-7"}}`` (or a ``kv_hints``
action of type ``kvtier.tool_wait``; the trajectory may also be named by
vLLM's ``session_id``/``conversation_id``/``kv_session_id``).  With ``policy``
(+ ``model``) or ``service_url`` configured, the lifecycle controller
(:mod:`kvtier.tiering.lifecycle`) takes it from there: ``on_new_request``
reads the hint (and ends the trajectory's previous pause: the observed wait
goes to the predictor), the first cascade of the request asks the policy once
(host frames, NVMe, or nothing written: recompute), ``on_request_finished``
starts the pause, and the controller's thread demotes at the lease end and
stages NVMe -> host frames before the predicted return.  Options: see
:mod:`kvtier.engine_adapter.config`.

Faults.  A miss, a corrupt block, a full disk or a closed store fail the job
(vLLM then recomputes / keeps the block only in DRAM); nothing raises into
the scheduler.  Bad tier config raises ``ValueError`` at start-up.
"""
from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import Counter, deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Iterable

import numpy as np

from kvtier.engine_adapter.config import PluginConfig, slug
from kvtier.engine_adapter.plugin_common import (EngineErrorLog, KeyMemo, ToolHint, remote_gauge_values,
                                                 store_key, trajectory_of)
from kvtier.engine_adapter.vllm_io import load_rows, store_rows
from kvtier.engine_adapter.wiring import make_advisor, make_lifecycle, make_policy
from kvtier.store import Namespace, StoreConfig, StoreError, TieredStore
from kvtier.store.protocol import BlockStore

try:
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import OffloadingConnectorStats
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import OffloadingConnector
    from vllm.v1.kv_offload.base import (LookupResult, Medium, OffloadingCounterMetadata, OffloadingGaugeMetadata,
                                         OffloadKey,
                                         ReqContext, RequestOffloadingContext)
    from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager, TransferJob
    from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec
except ImportError as exc:  # pragma: no cover - depends on the optional install
    raise ImportError(f"kvtier.engine_adapter.vllm needs vllm==0.33.0 (pip install --no-deps -r "
                      f"ci/requirements-engines.txt): {exc}") from exc

log = logging.getLogger("kvtier.vllm")

VLLM_VERSION = "0.33.0"
TIER_TYPE = "KvtierTier"
METRIC_PREFIX = "vllm:kvtier_"
_METRICS = {   # counter -> (documentation, label names)
    "decisions": ("kvtier lifecycle decisions by policy action", ("action",)),
    "blocks_stored": ("chunks kvtier wrote, by tier", ("tier",)),
    "blocks_loaded": ("chunks kvtier loaded back", ()),
    "load_failures": ("chunks kvtier could not load (miss or corrupt)", ()),
    "demoted_blocks": ("chunks the lifecycle demoted host -> NVMe", ()),
    "staged_blocks": ("chunks the lifecycle staged NVMe -> host before a predicted return", ()),
    "skipped_blocks": ("chunks not written: the policy chose recompute", ()),
    "forgotten_sessions": ("sessions the lifecycle forgot (idle, nothing in host frames; or past its cap)", ()),
}


@dataclass(frozen=True)
class _Hint:
    """Per-request state kept in vLLM's ReqContext (keyed by type)."""
    hint: ToolHint | None
    trajectory: str | None = None


class KvtierTier(SecondaryTierManager, EngineErrorLog):
    """A vLLM secondary tier backed by a kvtier ``BlockStore`` (a ``TieredStore``).

    All vLLM calls arrive under the tiering manager's lock (never
    concurrently) and do no I/O; transfers run on a small thread pool
    ("kvtier-io") and report through ``get_finished_jobs``; the lifecycle's
    timers run on its own thread ("kvtier-lifecycle").  The finished-job
    queue and counters are guarded by ``_lock``, except ``lookup``'s two,
    which only vLLM's calls (serialised by its manager's lock) write; the
    store is thread-safe.
    Options: :class:`kvtier.engine_adapter.config.PluginConfig` (``ValueError`` on a bad one).
    """

    _log = log  # EngineErrorLog reports through this engine's logger

    medium: ClassVar[Medium] = Medium.STORAGE

    def __init__(self, offloading_spec: Any, primary_kv_view: memoryview, tier_type: str,
                 backpressure_detector: Any = None, **options: Any) -> None:
        super().__init__(offloading_spec=offloading_spec, primary_kv_view=primary_kv_view,
                         tier_type=tier_type, backpressure_detector=backpressure_detector)
        options.pop("module_path", None)
        self.cfg = cfg = PluginConfig.parse(options, engine="vllm")
        spec_cfg = getattr(offloading_spec, "config", None)
        model_name = getattr(getattr(spec_cfg, "model", None), "name", None) or "model"
        kv_dtype = str(getattr(getattr(spec_cfg, "model", None), "dtype", "unknown"))
        par = getattr(spec_cfg, "parallel", None)
        world = int(getattr(par, "world_size", 1) or 1)
        dp = int(getattr(par, "data_parallel_index", 0) or 0)
        tokens = getattr(offloading_spec, "tokens_per_block", ())
        bpc = int(getattr(offloading_spec, "blocks_per_chunk", 1) or 1)
        self._tokens_per_chunk = int(tokens[0]) * bpc if tokens else 0
        self._ns = ns = Namespace(model_id=model_name, dtype=kv_dtype,
                                  layout=f"vllm:chunk{bpc}x{','.join(map(str, tokens))}:w{world}", tp_rank=0)
        # a chunk is looked up, then loaded (or stored): its store key is hashed once
        self._memo = KeyMemo(lambda k, ns=ns: store_key(ns, k))
        self.root = Path(cfg.data_dir) / "-".join([slug(model_name), f"w{world}"] + ([f"dp{dp}"] if dp else []))
        if not primary_kv_view.contiguous:
            raise ValueError("kvtier: the primary tier's KV view must be contiguous")
        self._rows = np.frombuffer(primary_kv_view, dtype=np.uint8).reshape(-1, self.block_size_bytes)
        store_cfg = StoreConfig.from_env(self.root, host_bytes=cfg.host_bytes, nvme_bytes=cfg.nvme_bytes,
                                         block_bytes=self.block_size_bytes, io_engine=cfg.io_engine,
                                         direct_io=cfg.direct_io, durable=cfg.durable,
                                         prepare_slots=True)   # first fills overwrite (store/slotprep.py)
        self.policy = make_policy(cfg)
        self.advisor = make_advisor(cfg, self.policy)
        self.store: BlockStore = TieredStore.open(store_cfg)
        self._host_frames, self._nvme_slots = store_cfg.host_frames, store_cfg.nvme_slots
        self.lifecycle = make_lifecycle(cfg, self.policy, self.store, self.block_size_bytes)
        # a lookup is part of a resume (most of a vLLM resume is its per-chunk lookups, between and
        # before the load jobs): the lifecycle's background moves step aside after one as after a load
        self._touch = self.lifecycle.foreground.touch if self.lifecycle is not None else None
        self._pool = ThreadPoolExecutor(max_workers=cfg.io_threads, thread_name_prefix="kvtier-io")
        self._lock = threading.Lock()
        self._finished: deque[JobResult] = deque()
        self._inflight: dict[int, Future] = {}
        self._warned: set[str] = set()
        self.counters = dict(chunks_stored=0, chunks_skipped=0, chunks_loaded=0, load_failures=0,
                             bytes_written=0, bytes_read=0, lookups=0, lookup_hits=0, errors=0)
        self._lookups = self._lookup_hits = 0      # lookup()'s counters (see there), in stats() as above
        self._by_tier: Counter[str] = Counter()
        self._reported: Counter[tuple[str, tuple]] = Counter()
        log.info("kvtier: tier %s at %s, chunk %d bytes, %d NVMe slots, %d host frames, lifecycle %s",
                 tier_type, self.root, self.block_size_bytes, store_cfg.nvme_slots, store_cfg.host_frames,
                 cfg.lifecycle)

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
        return self._memo(keys)

    @staticmethod
    def _state_of(req_context: Any) -> _Hint:
        st = req_context.get_state(_Hint) if hasattr(req_context, "get_state") else None
        if st is not None:
            return st
        params = getattr(req_context, "kv_transfer_params", None)
        hint = ToolHint.parse(params) or ToolHint.from_kv_hints(getattr(req_context, "kv_hints", None))
        return _Hint(hint, trajectory_of(params, hint))

    @classmethod
    def hint_of(cls, req_context: Any) -> ToolHint | None:
        """The kvtier hint a request carries (kv_transfer_params or kv_hints)."""
        return cls._state_of(req_context).hint

    # ------------------------------------------------------------ SecondaryTierManager
    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        """Parse the request's hint once and keep it in its context; a request
        of a paused trajectory ends that pause (cheap: no I/O)."""
        st = self._state_of(req_context)
        req_context.set_state(st)
        if self.lifecycle is not None and st.trajectory is not None:
            h = st.hint
            self.lifecycle.controller.hint(st.trajectory, h.tool if h else None,
                                           context_tokens=h.context_tokens if h else None)
        return RequestOffloadingContext()

    def on_request_finished(self, req_context: ReqContext) -> None:
        """The request is done: its trajectory's pause starts now (timers armed)."""
        st = self._state_of(req_context)
        if self.lifecycle is not None and st.trajectory is not None:
            self.lifecycle.controller.pause(st.trajectory)

    def on_schedule_end(self, context: Any) -> None:
        """Wake the lifecycle thread (due timers run there, not here)."""
        if self.lifecycle is not None:
            self.lifecycle.poke()

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        """HIT if the chunk is stored and readable; MISS otherwise (also on a
        closed store or a bad key).  Marks engine activity for the lifecycle's
        moves (``Foreground.touch``)."""
        if self._touch is not None:
            self._touch()
        try:
            hit = self.store.contains(self._memo.one(key))
        except (StoreError, ValueError) as exc:
            self._warn("lookup", exc)
            hit = False
        # vLLM's calls never overlap (its manager's lock), so these two need no lock of ours: a
        # reader (stats) may see one lookup late (the lock and dict update were 1.7 of 7.9 us here)
        self._lookups += 1
        self._lookup_hits += hit
        return LookupResult.HIT if hit else LookupResult.MISS

    def submit_store(self, job_metadata: TransferJob) -> None:
        """Primary chunks ``chunk_ids`` -> the store, on the I/O pool."""
        self._submit(job_metadata, self._store_job)

    def _tier_for(self, job: TransferJob, skeys: list[bytes]) -> str | None:
        """Where this job's chunks go (None: nowhere).  Runs on an I/O thread."""
        st = self._state_of(job.req_context)
        ctl = self.lifecycle.controller if self.lifecycle is not None else None
        if ctl is not None and st.trajectory is not None:
            ctl.add_blocks(st.trajectory, skeys)
            n_tok = ctl.block_count(st.trajectory) * self._tokens_per_chunk
            plan = ctl.plan_for(st.trajectory, context_tokens=n_tok)
            if plan is not None:
                # a host write takes its frames as the store makes room (LRU); the controller
                # moves paused trajectories by forecast afterwards (leases, staging)
                return self.cfg.fallback_tier(plan.tier, host_frames=self._host_frames, nvme_slots=self._nvme_slots)
        place = self.advisor.place(st.hint, kv_bytes=len(skeys) * self.block_size_bytes,
                                   context_tokens=len(skeys) * self._tokens_per_chunk)
        return self.cfg.fallback_tier(place.tier, host_frames=self._host_frames, nvme_slots=self._nvme_slots)

    def _store_job(self, job: TransferJob) -> JobResult:
        keys = list(job.keys)
        ids = [int(c) for c in job.chunk_ids]
        if len(keys) != len(ids):
            raise ValueError(f"{len(keys)} keys but {len(ids)} chunk ids")
        skeys = self._keys(keys)
        tier = self._tier_for(job, skeys)
        if tier is None:   # recompute: do not keep this request's blocks below DRAM
            self._count(chunks_skipped=len(keys))
            return JobResult(job_id=job.job_id, success=False)
        t0 = time.monotonic()
        n = store_rows(self.store, skeys, self._rows, ids, namespace=self._ns, tier=tier).blocks
        self._count(chunks_stored=n, bytes_written=n * self.block_size_bytes)
        with self._lock:
            self._by_tier[tier] += n
        return JobResult(job_id=job.job_id, success=True, transfer_time=time.monotonic() - t0,
                         transfer_bytes=n * self.block_size_bytes)

    def submit_load(self, job_metadata: TransferJob) -> None:
        """The store -> primary chunks ``chunk_ids``, on the I/O pool."""
        self._submit(job_metadata, self._load_job)

    def _load_job(self, job: TransferJob) -> JobResult:
        keys = list(job.keys)
        ids = [int(c) for c in job.chunk_ids]
        if len(keys) != len(ids):
            raise ValueError(f"{len(keys)} keys but {len(ids)} chunk ids")
        t0 = time.monotonic()
        lc = self.lifecycle
        with lc.loading() if lc is not None else contextlib.nullcontext():   # lifecycle moves step aside
            res = load_rows(self.store, self._keys(keys), self._rows, ids).ok
        ok = [k for k, good in zip(keys, res) if good]
        nbytes = len(ok) * self.block_size_bytes
        self._count(chunks_loaded=len(ok), load_failures=len(keys) - len(ok), bytes_read=nbytes)
        if len(ok) == len(keys):
            return JobResult(job_id=job.job_id, success=True, transfer_time=time.monotonic() - t0,
                             transfer_bytes=nbytes)
        return JobResult(job_id=job.job_id, success=False, successful_keys=ok,
                         transfer_time=time.monotonic() - t0, transfer_bytes=nbytes)

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
        """Finish in-flight jobs, stop the lifecycle thread, close the store.  Idempotent."""
        self.drain_jobs()
        self._pool.shutdown(wait=True)
        if self.lifecycle is not None:
            self.lifecycle.close()
        close = getattr(self.policy, "close", None)
        if close is not None:
            close()
        self.store.close()
        self._rows = None   # release the view of vLLM's shared region (it unmaps it next)

    # ------------------------------------------------------------ what a user sees
    def stats(self) -> dict:
        """Chunks/bytes moved (and by tier), lookups and hits, decisions, lifecycle counters."""
        with self._lock:
            out: dict[str, Any] = dict(self.counters)
            out["stored_by_tier"] = dict(self._by_tier)
        out["lookups"], out["lookup_hits"] = self._lookups, self._lookup_hits
        out["decisions"] = decisions = self.advisor.counts()
        if self.lifecycle is not None:
            out["lifecycle"] = lc = self.lifecycle.stats()
            for k, n in lc.items():
                if k.startswith("decision:"):
                    decisions[k.split(":", 1)[1]] = decisions.get(k.split(":", 1)[1], 0) + n
        return out

    def _metric_values(self) -> dict[tuple[str, tuple], float]:
        s = self.stats()
        lc = s.get("lifecycle", {})
        vals: dict[tuple[str, tuple], float] = {
            ("blocks_loaded", ()): s["chunks_loaded"], ("load_failures", ()): s["load_failures"],
            ("skipped_blocks", ()): s["chunks_skipped"],
            ("demoted_blocks", ()): lc.get("demoted_blocks", 0), ("staged_blocks", ()): lc.get("staged_blocks", 0),
            ("forgotten_sessions", ()): lc.get("forgotten", 0)}
        for tier, n in s["stored_by_tier"].items():
            vals[("blocks_stored", (tier,))] = n
        for k, n in lc.items():
            if k.startswith("decision:"):
                vals[("decisions", (k.split(":", 1)[1],))] = n
        return vals

    @classmethod
    def build_metric_definitions(cls, extra_config: dict[str, Any]) -> dict:
        """The Prometheus counters this tier reports (``vllm:kvtier_*``)."""
        from kvtier.store.remote.gauges import REMOTE_GAUGES
        defs = {METRIC_PREFIX + name: OffloadingCounterMetadata(documentation=doc, labelnames=labels)
                for name, (doc, labels) in _METRICS.items()}
        defs.update({METRIC_PREFIX + name: OffloadingGaugeMetadata(documentation=doc)   # set only with
                     for name, doc in REMOTE_GAUGES.items()})                          # KVTIER_REMOTE_URL
        return defs

    def get_stats(self) -> OffloadingConnectorStats | None:
        """Counter increases since the last call (vLLM folds them into ``/metrics``)."""
        stats = OffloadingConnectorStats()
        vals = self._metric_values()            # takes self._lock itself (stats()): not under it
        with self._lock:
            for (name, labels), v in vals.items():
                inc = v - self._reported[(name, labels)]
                if inc > 0:
                    stats.increase_counter(METRIC_PREFIX + name, inc, labels)
                    self._reported[(name, labels)] = v
        for name, v in remote_gauge_values(self.store).items():   # {} without a remote tier
            stats.set_gauge(METRIC_PREFIX + name, v)
        return None if stats.is_empty() else stats


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
        PluginConfig.parse(opts, engine="vllm")   # fail here, with the option named, not deep in vLLM
        tiers = [dict(t) for t in extra.get("secondary_tiers", []) if isinstance(t, dict)]
        tiers.append({"type": TIER_TYPE, "module_path": __name__, **opts})
        extra["secondary_tiers"] = tiers
        import dataclasses
        super().__init__(dataclasses.replace(config, extra_config=extra))


class KvtierConnector(OffloadingConnector):
    """vLLM's ``OffloadingConnector`` with ``KvtierOffloadingSpec`` preselected,
    registered by name through the ``vllm.general_plugins`` entry point::

        --kv-transfer-config '{"kv_connector": "KvtierConnector", "kv_role": "kv_both",
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
