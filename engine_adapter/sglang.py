"""kvtier as an SGLang HiCache storage backend (L3), loaded without a fork.

Enable it with SGLang's dynamic backend loader (pinned and tested: sglang 0.5.23)::

    python -m sglang.launch_server --model-path M --enable-hierarchical-cache \\
        --hicache-mem-layout page_first --hicache-storage-backend dynamic \\
        --hicache-storage-backend-extra-config '{"backend_name": "kvtier",
            "module_path": "kvtier.engine_adapter.sglang", "class_name": "KvtierStorage",
            "interface_v1": 1, "data_dir": "/nvme/kvtier", "nvme_gb": 200}'

SGLang then calls ``KvtierStorage(storage_config, kwargs)``, registers its
host KV pool (``register_mem_pool_host``) and moves pages between that pool
(its L2) and us (L3):

* ``interface_v1: 1`` (recommended): ``batch_set_v1`` / ``batch_get_v1``
  over host-pool indices -- each page is copied straight between the pool and
  a store slot (one copy; NVMe I/O coalesced across the batch).
* otherwise the generic path: ``batch_set(keys, flat_pages)`` /
  ``batch_get(keys, dummy_pages)`` with flat page tensors.
* ``batch_exists(keys)`` answers the longest stored prefix (one lookup).

Page bytes.  A page is stored as SGLang's own flat data page
(``host_pool.get_data_page(i, flat=True)``: for the MHA ``page_first`` layout
``[K: page_size x layers x heads x dim][V: same]``), so both paths and every
reopen agree byte for byte.  The store's block size is the page size in
bytes, taken from the host pool at registration (or ``page_bytes`` in the
extra config, which must then match).

Keys.  SGLang's page hashes (hex SHA-256 chained over the page tokens) are
folded with a namespace (model, dtype, layout, page size, TP rank) into store
keys (:func:`kvtier.engine_adapter.plugin_common.store_key`).  Every TP/PP/DP rank is
its own process, so each opens its own store under
``data_dir/<model>-tp<r>of<n>[...]`` (a store root is single-writer).

Extra config (besides SGLang's ``backend_name``/``module_path``/``class_name``/``interface_v1``):
:class:`kvtier.engine_adapter.config.PluginConfig` -- ``data_dir`` (required),
``nvme_gb``, ``host_gb`` (default 0: SGLang's pool is the DRAM tier), ``policy``
+ ``model`` (+ ``node``) or ``service_url``, ``default_tier``, ``lifecycle``,
``page_bytes`` (an expected page size, checked at registration), ``io_engine``,
``direct_io``, ``durable``.

Hints and the lifecycle: ``HiCacheStorageExtraInfo.extra_info = {"kvtier":
{"tool": ..., "trajectory_id": ...}}`` (see :mod:`kvtier.engine_adapter.plugin_common`).
A ``batch_set_v1`` carrying a trajectory's hint is its pause: the policy is
asked once (host frames, NVMe, or nothing written: recompute) and the
lifecycle controller's thread then demotes at the lease end and stages NVMe ->
host frames before the predicted return.  The trajectory's next
``batch_exists``/``batch_get_v1`` with its hint is the resume (the observed
wait goes to the predictor).

Faults.  Nothing here raises into SGLang's storage threads: an unknown key,
a wrong page size, a closed or failing store, a full disk are logged and
answered as misses / ``False`` (the page is recomputed).  Only construction
with a bad config raises (``ValueError``), which SGLang reports at attach.

What is not supported: MLA models with TP > 1 (SGLang writes those pages
from one rank only; a per-process store cannot share them), and the v2
multi-pool interface (hybrid Mamba/SWA sidecar pools).
"""
from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any, List

from kvtier.engine_adapter.config import PluginConfig, slug
from kvtier.engine_adapter.firewall import Firewall, guarded
from kvtier.engine_adapter.geometry import facts_from_sglang_pool
from kvtier.engine_adapter.hints import HintReader, ToolHint
from kvtier.engine_adapter.plugin_common import KeyMemo, Placement, store_key
from kvtier.engine_adapter.resume_reads import read_prefix, reads_nvme
from kvtier.engine_adapter.switch_interval import lower_switch_interval
from kvtier.engine_adapter.sglang_pages import PageIO, Staging, tensor_bytes
from kvtier.engine_adapter.sglang_shim import SGLANG_VERSION, import_sglang_storage
from kvtier.engine_adapter.wiring import Lifecycle, NoLifecycle, make_advisor, make_policy, open_store, pricing_for
from kvtier.store import Namespace, StoreConfig, StoreError, TieredStore
from kvtier.util.tiers import Tier

log = logging.getLogger("kvtier.sglang")

SGLANG_BATCH_PAGES = 128    # sglang's STORAGE_BATCH_SIZE: pages per storage call
__all__ = ["KvtierStorage", "PluginConfig", "SGLANG_VERSION", "import_sglang_storage", "rank_dir"]

_hs = import_sglang_storage()   # registers SGLang's CPU-safe storage modules (see sglang_shim)
HiCacheStorage = _hs.HiCacheStorage
HiCacheStorageConfig = _hs.HiCacheStorageConfig
HiCacheStorageExtraInfo = getattr(_hs, "HiCacheStorageExtraInfo", None)


def rank_dir(cfg: Any) -> str:
    """Per-process store directory name from a HiCacheStorageConfig."""
    parts = [slug(cfg.model_name or "model"), f"tp{cfg.tp_rank}of{cfg.tp_size}"]
    if getattr(cfg, "pp_size", 1) > 1:
        parts.append(f"pp{cfg.pp_rank}of{cfg.pp_size}")
    if getattr(cfg, "attn_cp_size", 1) > 1:
        parts.append(f"cp{cfg.attn_cp_rank}of{cfg.attn_cp_size}")
    if getattr(cfg, "dp_rank", 0):
        parts.append(f"dp{cfg.dp_rank}")
    return "-".join(parts)


def _misses(keys: Any, *args: Any, **kwargs: Any) -> list[bool]:
    """A batch call's answer when it was contained: every key failed."""
    return [False] * len(keys)


def _nones(keys: Any, *args: Any, **kwargs: Any) -> list[None]:
    return [None] * len(keys)


class KvtierStorage(HiCacheStorage):
    """SGLang ``HiCacheStorage`` backed by a kvtier ``TieredStore``.  See the module doc.

    Threading: SGLang calls in from its prefetch and backup threads at once;
    the store is thread-safe, and this class's own mutable state (the store
    handle, counters) is guarded by ``_lock``.
    """

    def __init__(self, storage_config: Any, kwargs: dict | None = None) -> None:
        self.storage_config = storage_config
        self.cfg = PluginConfig.parse(getattr(storage_config, "extra_config", None), engine="sglang")
        lower_switch_interval(self.cfg.switch_interval_ms)
        if getattr(storage_config, "is_mla_model", False) and getattr(storage_config, "tp_size", 1) > 1:
            raise ValueError("kvtier: MLA models with tp_size > 1 are not supported "
                             "(SGLang writes their pages from one rank; each rank's store is private)")
        self.root = Path(self.cfg.data_dir) / rank_dir(storage_config)
        self.firewall = Firewall(log)
        self.hints = HintReader(log)
        # priced with the engine's geometry once the host pool is registered; a preset
        # (what-if) prices from the start
        self.pricing = pricing_for(self.cfg, None) if self.cfg.model is not None else None
        self.policy = make_policy(self.cfg, self.pricing)
        self.advisor = make_advisor(self.cfg, self.policy)
        self.lifecycle: Lifecycle | NoLifecycle = NoLifecycle(self.advisor)   # the real one comes with the store
        self._lock = threading.Lock()
        self._store: TieredStore | None = None
        self._io: PageIO | None = None
        self._ns: Namespace | None = None
        self._memo: KeyMemo | None = None      # engine key -> store key under _ns (made with the store)
        self._closed = False
        self._reads_nvme = True      # batch_exists counts a page kept only on NVMe (:mod:`.resume_reads`)
        self._stagings: dict[str, Staging] = {}
        self._samples = _new_samples()
        self.counters = dict(pages_set=0, pages_set_skipped=0, pages_get_hit=0, pages_get_miss=0,
                             bytes_written=0, bytes_read=0, read_skips=0)

    # ------------------------------------------------------------ lifecycle
    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        """SGLang hands us its host KV pool; the store opens with its page size.
        Raises ValueError if ``page_bytes`` was configured and disagrees."""
        super().register_mem_pool_host(mem_pool_host)
        io = PageIO(mem_pool_host)
        if self.cfg.page_bytes is not None and self.cfg.page_bytes != io.page_bytes:
            raise ValueError(f"kvtier: page_bytes={self.cfg.page_bytes} but SGLang's host pool pages "
                             f"are {io.page_bytes} bytes")
        layout = str(getattr(mem_pool_host, "layout", "unknown"))
        dtype = str(io.dtype).replace("torch.", "")
        with self._lock:
            self._io = io
            self._stagings = {}   # sized for the previous pool's pages
            old, self._store = self._store, None
        if old is not None:
            old.close()
        self._open(io.page_bytes, dtype=dtype, layout=layout, page_size=io.page_size)

    def _open(self, page_bytes: int, *, dtype: str, layout: str, page_size: int) -> None:
        c = self.storage_config
        ns = Namespace(model_id=c.model_name or "model", dtype=dtype,
                       layout=f"sglang:{layout}:page{page_size}:tp{c.tp_size}:pp{getattr(c, 'pp_rank', 0)}",
                       tp_rank=int(c.tp_rank))
        cfg = StoreConfig.from_env(self.root, block_bytes=page_bytes, **self.cfg.store_options())
        self._price_with_engine(page_bytes, page_size)
        store, lifecycle = open_store(self.cfg, cfg, self.policy, self.pricing, self.advisor)
        reads = reads_nvme(self.policy, page_size, self.firewall.contain)
        with self._lock:
            self._store, self._ns, self._reads_nvme = store, ns, reads
            self._memo = KeyMemo(lambda k, ns=ns: store_key(ns, k))
            old, self.lifecycle = self.lifecycle, lifecycle
        old.close()
        log.info("kvtier: store at %s, page %d bytes, %d host frames, %d NVMe slots, lifecycle %s",
                 self.root, page_bytes, cfg.host_frames, cfg.nvme_slots, self.cfg.lifecycle)

    def _price_with_engine(self, page_bytes: int, page_size: int) -> None:
        """Without a ``model`` preset, price pauses with the registered pool's
        geometry and the model's local config (parameters); the forecast is off,
        with one WARNING, when the config cannot be read."""
        if self.pricing is not None or not (self.cfg.policy or self.cfg.service_url):
            return
        c = self.storage_config
        try:
            facts = facts_from_sglang_pool(c.model_name or "", self._io.pool, tp=int(getattr(c, "tp_size", 1) or 1),
                                           dtype=self._io.dtype, page_bytes=page_bytes, page_size=page_size)
            self.pricing = pricing_for(self.cfg, facts)
        except Exception as exc:
            log.warning("kvtier: cannot price pauses from SGLang's pool (%s); the forecast is off "
                        "(plain tiering). Name a \"model\" preset to price pauses.", exc)
            return
        old = self.policy
        self.policy = make_policy(self.cfg, self.pricing)
        self.advisor = make_advisor(self.cfg, self.policy)
        if old is not None:
            old.close()

    def close(self) -> None:
        """Close the store (SGLang calls this on detach).  Idempotent; every
        later call answers misses / False."""
        with self._lock:
            store, self._store, self._closed = self._store, None, True
            lifecycle, self.lifecycle = self.lifecycle, NoLifecycle(self.advisor)
        lifecycle.close()
        if store is not None:
            store.close()
        if self.policy is not None:
            self.policy.close()

    @property
    def store(self) -> TieredStore | None:
        return self._store

    def store_keys(self, keys: List[str]) -> list[bytes]:
        """The store keys of SGLang page hashes ``keys`` under this backend's
        namespace (for tools: ``store.where``).  Raises ValueError for a bad key
        or before a host pool is registered."""
        ns = self._ns
        if ns is None:
            raise ValueError("no host pool registered yet")
        return [store_key(ns, k) for k in keys]

    # ------------------------------------------------------------ helpers
    def _ready(self, what: str) -> tuple[TieredStore, Namespace] | None:
        st, ns = self._store, self._ns
        if st is None or st.closed or ns is None:
            self.firewall.error(what, "store is closed" if self._closed else "no host pool registered yet")
            return None
        return st, ns

    def _keys(self, ns: Namespace, keys: List[str]) -> list[bytes] | None:
        memo = self._memo
        try:
            return memo(keys) if memo is not None and ns is self._ns else [store_key(ns, k) for k in keys]
        except ValueError as exc:
            self.firewall.error("bad key", exc)
            return None

    def _count(self, **kw: int) -> None:
        with self._lock:
            for k, v in kw.items():
                self.counters[k] += v

    def _hint(self, extra_info: Any) -> ToolHint | None:
        return self.hints.read(getattr(extra_info, "extra_info", None)).hint if extra_info is not None else None

    def _trajectory(self, hint: ToolHint | None) -> str | None:
        """The trajectory this call names (None: none; the null lifecycle tracks nothing)."""
        return hint.trajectory_id if hint is not None else None

    def _placement(self, st: TieredStore, extra_info: Any, skeys: list[bytes]) -> tuple[Placement, str | None]:
        """(placement, trajectory) for a backup of ``skeys``, decided once on the
        store's tiers (its tier None: write nothing).  A tracked trajectory is
        asked once per pause; others are placed one-shot."""
        n = len(skeys)
        page_size = self._io.page_size if self._io is not None else 0
        tokens = (n + len(getattr(extra_info, "prefix_keys", None) or ())) * page_size
        hint = self._hint(extra_info)
        tid = self._trajectory(hint)
        if tid is not None:
            self.lifecycle.hint(tid, hint.tool, context_tokens=hint.context_tokens, resume=False)
        place = self.lifecycle.place(tid, hint, skeys, tokens_per_block=page_size, block_bytes=st.config.block_bytes,
                                     context_tokens=tokens)
        # a host write takes its frames as the store makes room (LRU); the controller moves
        # paused trajectories by forecast afterwards (leases, staging)
        return place, tid

    def _loading(self) -> Any:
        """Context marking an engine load: the lifecycle's background moves wait meanwhile."""
        return self.lifecycle.loading()

    def _resume(self, extra_info: Any) -> None:
        """A prefetch of a tracked trajectory: its pause is over."""
        tid = self._trajectory(self._hint(extra_info))
        if tid is not None:
            self.lifecycle.resume(tid)

    def _page_indices(self, host_indices: Any, n: int) -> list[int] | None:
        io = self._io
        if io is None:
            self.firewall.error("v1 call", "no host pool registered")
            return None
        try:
            total = int(host_indices.numel())
        except AttributeError:
            total = len(host_indices)
        if total != n * io.page_size:
            self.firewall.error("v1 call", f"{n} keys but {total} host indices (page size {io.page_size})")
            return None
        try:   # each page's first token index (a tensor slice: not every token's index through Python)
            return [int(x) for x in host_indices[::io.page_size].tolist()]
        except (AttributeError, TypeError):
            return [int(host_indices[i * io.page_size]) for i in range(n)]

    # ------------------------------------------------------------ v1: host-pool indices
    def _staging(self, which: str, n_pages: int) -> "Staging":
        """The staging area for one direction ("set"/"get"), made on first use
        with room for a whole SGLang batch (128 pages) up to MAX_BYTES."""
        with self._lock:
            stg = self._stagings.get(which)
            if stg is None:
                cap = Staging.max_pages(self._io.page_bytes)
                stg = Staging(self._io.page_bytes, min(cap, max(n_pages, SGLANG_BATCH_PAGES)))
                self._stagings[which] = stg
            return stg

    @guarded(factory=_misses)
    def batch_set_v1(self, keys: List[str], host_indices: Any, extra_info: Any = None) -> List[bool]:
        """Store pages ``keys[i]`` from host-pool token index ``host_indices[i*page_size]``.
        Returns per-key success; pages already stored count as success.

        Pages are gathered into a reusable pre-faulted aligned staging area and
        written with ``put_many`` (contiguous NVMe slots, O_DIRECT straight
        from the staging memory)."""
        n = len(keys)
        ready = self._ready("batch_set_v1")
        idx = self._page_indices(host_indices, n) if ready else None
        skeys = self._keys(ready[1], keys) if idx is not None else None
        if skeys is None:
            return [False] * n
        st, ns = ready
        place, tid = self._placement(st, extra_info, skeys)
        tier = place.tier
        if tier is None:   # the policy chose recompute: nothing is written
            self._count(pages_set_skipped=n)
            if tid is not None:
                self.lifecycle.pause(tid)
            return [False] * n
        try:
            return self._write_pages(st, ns, skeys, idx, tier)
        finally:
            if tid is not None:
                self.lifecycle.pause(tid)

    def _write_pages(self, st: TieredStore, ns: Namespace, skeys: list[bytes], idx: list[int],
                     tier: Tier) -> List[bool]:
        """Pool pages ``idx`` -> the store under ``skeys`` (the backup I/O path), in
        groups a host tier can take (no overflow: a full tier fails the pages it could not take)."""
        n = len(skeys)
        stored = 0
        t0 = time.perf_counter()
        try:
            todo = [i for i in range(n) if not st.contains(skeys[i])]
            stg = self._staging("set", len(todo))
            # one put_many may not exceed the host tier (the store refuses a batch it cannot hold)
            step = stg.n if tier is not Tier.HOST else max(1, min(stg.n, st.config.host_frames // 2))
            with stg.lock:
                for lo in range(0, len(todo), step):
                    group = todo[lo:lo + step]
                    self._io.read_pages([idx[i] for i in group], stg)
                    stored += st.put_many([skeys[i] for i in group], [stg.view(j) for j in range(len(group))],
                                          namespace=ns, tier=tier)
        except (StoreError, ValueError, RuntimeError) as exc:
            self.firewall.error("batch_set_v1", exc)
            self._count(pages_set=stored, bytes_written=stored * st.config.block_bytes)
            try:
                return [st.contains(k) for k in skeys]
            except StoreError:
                return [False] * n
        self._count(pages_set=stored, bytes_written=stored * st.config.block_bytes)
        self._sample("backup", stored, stored * st.config.block_bytes, time.perf_counter() - t0)
        return [True] * n

    @guarded(factory=_misses)
    def batch_get_v1(self, keys: List[str], host_indices: Any, extra_info: Any = None) -> List[bool]:
        """Load the longest stored prefix of ``keys`` into the host pool at
        ``host_indices``.  Returns per-key success (True for the prefix, False after).
        A page that misses or fails its checksum ends the prefix; the pool's
        bytes for it and every later page are left untouched.  A tracked
        trajectory's hint in ``extra_info`` ends its pause.  The whole call is
        marked as an engine load (the lifecycle's moves step aside meanwhile)."""
        with self._loading():
            return self._get_v1(keys, host_indices, extra_info)

    def _get_v1(self, keys: List[str], host_indices: Any, extra_info: Any) -> List[bool]:
        n = len(keys)
        self._resume(extra_info)
        ready = self._ready("batch_get_v1")
        idx = self._page_indices(host_indices, n) if ready else None
        skeys = self._keys(ready[1], keys) if idx is not None else None
        if skeys is None:
            return [False] * n
        st = ready[0]
        ok = 0
        t0 = time.perf_counter()
        try:
            want = st.lookup(skeys)
            stg = self._staging("get", want)
            with stg.lock:
                for lo in range(0, want, stg.n):
                    hi = min(want, lo + stg.n)
                    res = st.get_many(skeys[lo:hi], [stg.view(j) for j in range(hi - lo)])
                    good = res.index(False) if False in res else len(res)
                    self._io.write_pages(idx[lo:lo + good], stg)   # the loaded prefix only
                    ok += good
                    if good < len(res):
                        break
        except (StoreError, ValueError, RuntimeError) as exc:
            self.firewall.error("batch_get_v1", exc)
        self._count(pages_get_hit=ok, pages_get_miss=n - ok, bytes_read=ok * st.config.block_bytes)
        self._sample("prefetch", ok, ok * st.config.block_bytes, time.perf_counter() - t0)
        return [i < ok for i in range(n)]

    # ------------------------------------------------------------ generic: flat page tensors
    @guarded(None)
    def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> Any:
        """Read page ``key`` into ``target_location`` (a flat CPU tensor of one
        page).  Returns the tensor, or None on a miss or bad input."""
        return self.batch_get([key], [target_location])[0]

    @guarded(factory=_nones)
    def batch_get(self, keys: List[str], target_locations: Any = None, target_sizes: Any = None) -> List[Any]:
        """Per key: the filled tensor or None (miss, wrong size, closed store)."""
        n = len(keys)
        ready = self._ready("batch_get")
        targets = list(target_locations) if target_locations is not None else [None] * n
        if ready is None or len(targets) != n:
            if ready is not None:
                self.firewall.error("batch_get", f"{n} keys but {len(targets)} targets")
            return [None] * n
        st, ns = ready
        result: list[Any] = [None] * n
        todo = []
        for i, (k, t) in enumerate(zip(keys, targets)):
            arr = tensor_bytes(t)
            if arr is None or arr.nbytes != st.config.block_bytes:
                self.firewall.error("batch_get", f"target for {k!r} is not a contiguous CPU page of "
                           f"{st.config.block_bytes} bytes")
                continue
            try:
                todo.append((i, store_key(ns, k), arr))
            except ValueError as exc:
                self.firewall.error("bad key", exc)
        if todo:
            try:
                ok = st.get_many([k for _, k, _ in todo], [a for _, _, a in todo])
            except StoreError as exc:
                self.firewall.error("batch_get", exc)
                ok = [False] * len(todo)
            for (i, _, _), good in zip(todo, ok):
                if good:
                    result[i] = targets[i]
        hits = sum(r is not None for r in result)
        self._count(pages_get_hit=hits, pages_get_miss=n - hits, bytes_read=hits * st.config.block_bytes)
        return result

    @guarded(False)
    def set(self, key: str, value: Any = None, target_location: Any = None, target_sizes: Any = None) -> bool:
        """Store one flat page tensor.  True if stored (or already stored)."""
        return self.batch_set([key], [value])

    @guarded(False)
    def batch_set(self, keys: List[str], values: Any = None, target_locations: Any = None,
                  target_sizes: Any = None) -> bool:
        """Store flat page tensors.  True only if every page is stored (or was already)."""
        n = len(keys)
        ready = self._ready("batch_set")
        vals = list(values) if values is not None else []
        if ready is None:
            return False
        if len(vals) != n:
            self.firewall.error("batch_set", f"{n} keys but {len(vals)} values")
            return False
        st, ns = ready
        arrs = [tensor_bytes(v) for v in vals]
        for k, a in zip(keys, arrs):
            if a is None or a.nbytes != st.config.block_bytes:
                self.firewall.error("batch_set", f"value for {k!r} is not a contiguous CPU page of "
                           f"{st.config.block_bytes} bytes")
                return False
        skeys = self._keys(ns, keys)
        if skeys is None:
            return False
        tier = self.lifecycle.tiers.tier(self.cfg.effective_default_tier)
        try:
            stored = st.put_many(skeys, arrs, namespace=ns, tier=tier)
        except StoreError as exc:
            self.firewall.error("batch_set", exc)
            return False
        self._count(pages_set=stored, bytes_written=stored * st.config.block_bytes)
        return True

    # ------------------------------------------------------------ queries
    @guarded(False)
    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    @guarded(0)
    def batch_exists(self, keys: List[str], extra_info: Any = None) -> int:
        """How many leading ``keys`` are stored (0 on any trouble).  A tracked
        trajectory's hint in ``extra_info`` ends its pause (the prefetch of its next turn).
        Marked as an engine load, like ``batch_get_v1``."""
        with self._loading():
            return self._exists(keys, extra_info)

    def _exists(self, keys: List[str], extra_info: Any) -> int:
        self._resume(extra_info)
        ready = self._ready("batch_exists")
        skeys = self._keys(ready[1], keys) if ready else None
        if skeys is None:
            return 0
        try:
            n = ready[0].lookup(skeys)
            if not self._reads_nvme:   # a page kept only on NVMe is prefilled again, from there on
                m, n = n, read_prefix(ready[0], skeys, n)
                self._count(read_skips=int(m > n))
            return n
        except StoreError as exc:
            self.firewall.error("batch_exists", exc)
            return 0

    @guarded(None)
    def clear(self) -> None:
        """SGLang's ``/clear_hicache_storage``.  Pages are content-addressed and
        recomputable, so kvtier keeps them (they age out by LRU); this only logs."""
        log.info("kvtier: clear() keeps stored pages (content-addressed; evicted by LRU when full)")

    @guarded(None)
    def get_stats(self) -> Any:
        """SGLang's storage metrics hook (``--enable-storage-metrics``): the pages
        and GB/s of each prefetch/backup batch since the last call, as SGLang's
        ``StorageMetrics`` -- or None where that class cannot be imported (CPU-only
        installs), which SGLang treats as "no samples".  Always drains the samples."""
        samples = self.take_samples()
        try:
            from sglang.srt.observability.metrics_collector import StorageMetrics
        except Exception:
            return None
        m = StorageMetrics()
        for name, values in samples.items():
            getattr(m, name).extend(values)
        return m

    def take_samples(self) -> dict[str, list]:
        """The prefetch/backup samples since the last call (pages per batch and
        GB/s per batch: what ``get_stats`` hands SGLang), drained."""
        with self._lock:
            samples, self._samples = self._samples, _new_samples()
        return samples

    def _sample(self, kind: str, pages: int, nbytes: int, seconds: float) -> None:
        if pages <= 0:
            return
        with self._lock:
            self._samples[f"{kind}_pgs"].append(pages)
            self._samples[f"{kind}_bandwidth"].append(nbytes / seconds / 1e9 if seconds > 0 else 0.0)

    def kvtier_stats(self) -> dict:
        """What a user sees: pages/bytes moved, hits, decisions, store occupancy."""
        with self._lock:
            out: dict[str, Any] = dict(self.counters)
        out.update(self.firewall.counts())
        out["hint_rejections"] = self.hints.rejected
        out["decisions"] = decisions = self.advisor.counts()
        lcs = self.lifecycle.stats()      # {}: no lifecycle
        if lcs:
            out["lifecycle"] = lcs
            for k, n in lcs.items():
                if k.startswith("decision:"):
                    decisions[k.split(":", 1)[1]] = decisions.get(k.split(":", 1)[1], 0) + n
        st = self._store
        if st is not None and not st.closed:
            try:
                s = st.stats()
                out.update(host_blocks=s.host_blocks, nvme_blocks=s.nvme_blocks,
                           io_engine=s.io_engine, direct_io=s.direct_io)
            except StoreError:
                pass
        return out


def _new_samples() -> dict[str, list]:
    return {"prefetch_pgs": [], "backup_pgs": [], "prefetch_bandwidth": [], "backup_bandwidth": []}
