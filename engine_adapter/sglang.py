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

    data_dir      store root (required)
    nvme_gb       NVMe tier capacity, GB = 1e9 bytes (default 64)
    host_gb       kvtier host tier in front of NVMe (default 0: SGLang's pool is the DRAM tier,
                  so every page goes straight to durable NVMe)
    page_bytes    expected page size in bytes (optional check)
    io_engine, direct_io, durable   passed to store.StoreConfig
    policy        a tiering policy name (e.g. "breakeven") deciding host/NVMe/skip per
                  hinted batch; needs "model" (a preset) and optionally "node" (hardware preset)
    service_url   ask a running ``kvtier serve`` instead of a local policy (needs "model")
    default_tier  "nvme" (default) or "host": where unhinted pages go

Hints: ``HiCacheStorageExtraInfo.extra_info = {"kvtier": {"tool": ..., ...}}``
(see :mod:`kvtier.engine_adapter.plugin_common`).

Faults.  Nothing here raises into SGLang's storage threads: an unknown key,
a wrong page size, a closed or failing store, a full disk are logged and
answered as misses / ``False`` (the page is recomputed).  Only construction
with a bad config raises (``ValueError``), which SGLang reports at attach.

What is not supported: MLA models with TP > 1 (SGLang writes those pages
from one rank only; a per-process store cannot share them), and the v2
multi-pool interface (hybrid Mamba/SWA sidecar pools).
"""
from __future__ import annotations

import importlib
import importlib.util
import logging
import math
import mmap
import re
import sys
import threading
import time
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List

import numpy as np

from kvtier.engine_adapter.plugin_common import EngineErrorLog, PlacementAdvisor, ToolHint, store_key
from kvtier.store import Namespace, StoreConfig, StoreError, TieredStore

log = logging.getLogger("kvtier.sglang")

SGLANG_VERSION = "0.5.23"   # the version this backend is written and tested against
GB = 10**9
SGLANG_BATCH_PAGES = 128    # sglang's STORAGE_BATCH_SIZE: pages per storage call


def import_sglang_storage() -> types.ModuleType:
    """Import ``sglang.srt.mem_cache.hicache_storage``.

    Inside an SGLang server ``sglang`` is already imported and this is a plain
    import.  Elsewhere (CPU-only tests and benchmarks) ``import sglang`` runs
    the package's front-end ``__init__`` (HF patches, multimodal processors,
    torchvision), which a CPU-only install cannot satisfy; the storage modules
    themselves do not need it.  In that case the ``sglang`` package is
    registered without running its ``__init__`` and the storage modules are
    imported from the installed files as they are.  Raises ``ImportError``
    when sglang is not installed.
    """
    try:
        return importlib.import_module("sglang.srt.mem_cache.hicache_storage")
    except ImportError:
        if "sglang" in sys.modules and getattr(sys.modules["sglang"], "__kvtier_bare__", False):
            raise
    except Exception as exc:  # the front-end __init__ failed for another reason
        log.debug("import sglang failed (%s); importing its storage modules only", exc)
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("sglang is not installed (pip install --no-deps sglang==%s)" % SGLANG_VERSION)
    for name in [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]:
        del sys.modules[name]   # drop what the failed import left half-initialised
    pkg = types.ModuleType("sglang")
    pkg.__path__ = list(spec.submodule_search_locations)
    pkg.__file__ = spec.origin
    pkg.__spec__ = spec
    pkg.__kvtier_bare__ = True
    sys.modules["sglang"] = pkg
    return importlib.import_module("sglang.srt.mem_cache.hicache_storage")


_hs = import_sglang_storage()
HiCacheStorage = _hs.HiCacheStorage
HiCacheStorageConfig = _hs.HiCacheStorageConfig
HiCacheStorageExtraInfo = getattr(_hs, "HiCacheStorageExtraInfo", None)


@dataclass(frozen=True)
class PluginConfig:
    """The kvtier part of SGLang's extra config, validated once."""

    data_dir: str
    nvme_bytes: int = 64 * GB
    host_bytes: int = 0
    page_bytes: int | None = None
    io_engine: str = "auto"
    direct_io: str = "auto"
    durable: bool = True
    policy: str | None = None
    model: str | None = None
    node: str | None = None
    service_url: str | None = None
    default_tier: str = "nvme"

    _KNOWN = ("data_dir", "nvme_gb", "host_gb", "page_bytes", "io_engine", "direct_io", "durable",
              "policy", "model", "node", "service_url", "default_tier")
    _SGLANG = ("backend_name", "module_path", "class_name", "interface_v1", "prefetch_threshold",
               "enable_metadata_cache", "metadata_ttl")

    @classmethod
    def from_extra(cls, extra: dict | None) -> "PluginConfig":
        """Parse SGLang's ``extra_config``.  Raises ValueError naming the bad or
        unknown key (unknown keys are an error: a typo must not silently fall back)."""
        extra = dict(extra or {})
        unknown = sorted(k for k in extra if k not in cls._KNOWN and k not in cls._SGLANG)
        if unknown:
            raise ValueError(f"kvtier: unknown extra config key(s) {unknown}; known: {list(cls._KNOWN)}")
        data_dir = extra.get("data_dir")
        if not isinstance(data_dir, str) or not data_dir:
            raise ValueError("kvtier: extra config needs \"data_dir\" (the store directory)")

        def gb(name: str, default: float) -> int:
            v = extra.get(name, default)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ValueError(f"kvtier: {name} must be a number of GB >= 0, got {v!r}")
            return int(v * GB)

        page_bytes = extra.get("page_bytes")
        if page_bytes is not None and (isinstance(page_bytes, bool) or not isinstance(page_bytes, int)
                                       or page_bytes <= 0):
            raise ValueError(f"kvtier: page_bytes must be a positive int, got {page_bytes!r}")
        durable = extra.get("durable", True)
        if not isinstance(durable, bool):
            raise ValueError(f"kvtier: durable must be true or false, got {durable!r}")
        cfg = cls(data_dir=data_dir, nvme_bytes=gb("nvme_gb", 64), host_bytes=gb("host_gb", 0),
                  page_bytes=page_bytes, io_engine=str(extra.get("io_engine", "auto")),
                  direct_io=str(extra.get("direct_io", "auto")), durable=durable,
                  policy=extra.get("policy"), model=extra.get("model"), node=extra.get("node"),
                  service_url=extra.get("service_url"), default_tier=str(extra.get("default_tier", "nvme")))
        if cfg.nvme_bytes == 0 and cfg.host_bytes == 0:
            raise ValueError("kvtier: nvme_gb and host_gb are both 0: nowhere to store pages")
        if (cfg.policy or cfg.service_url) and not cfg.model:
            raise ValueError("kvtier: policy/service_url need \"model\" (a model preset name)")
        if cfg.policy and cfg.service_url:
            raise ValueError("kvtier: give either policy or service_url, not both")
        return cfg

    def make_advisor(self) -> PlacementAdvisor:
        """The placement advisor this config describes.  Raises ValueError for
        an unknown policy/model/node name."""
        host = self.host_bytes > 0
        default = self.default_tier if (host or self.default_tier == "nvme") else "nvme"
        if self.policy:
            from kvtier.tiering import make_policy
            from kvtier.tiering.presets import DEFAULT_NODE, get_node, get_preset
            pol = make_policy(self.policy, geometry=get_preset(self.model),
                              hardware=get_node(self.node or DEFAULT_NODE))
            return PlacementAdvisor(default, policy=pol, host_available=host)
        if self.service_url:
            from kvtier.tiering.client import KvtierClient
            return PlacementAdvisor(default, client=KvtierClient(self.service_url), model=self.model,
                                    host_available=host)
        return PlacementAdvisor(default, host_available=host)


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", s).strip("-") or "model"


def rank_dir(cfg: Any) -> str:
    """Per-process store directory name from a HiCacheStorageConfig."""
    parts = [_slug(cfg.model_name or "model"), f"tp{cfg.tp_rank}of{cfg.tp_size}"]
    if getattr(cfg, "pp_size", 1) > 1:
        parts.append(f"pp{cfg.pp_rank}of{cfg.pp_size}")
    if getattr(cfg, "attn_cp_size", 1) > 1:
        parts.append(f"cp{cfg.attn_cp_rank}of{cfg.attn_cp_size}")
    if getattr(cfg, "dp_rank", 0):
        parts.append(f"dp{cfg.dp_rank}")
    return "-".join(parts)


class _PrefixEnd(Exception):
    """Internal: a page of a prefetch missed; the loaded prefix ends here."""


class _Staging:
    """A reusable, pre-faulted, 4096-aligned area of page slots.

    Fresh memory costs a page fault per 4 KiB on first touch (measured here:
    copies into fresh memory ran at 0.6 GB/s, into warm memory at 4-6 GB/s),
    so pages are gathered into this area, which lives as long as the backend.
    ``lock`` is held by the one thread using it (SGLang's backup and prefetch
    threads each get their own area)."""

    MAX_BYTES = 256 << 20   # one put_many (one fdatasync) per SGLang batch of <= 128 pages up to 2 MiB each

    @staticmethod
    def max_pages(page_bytes: int) -> int:
        return max(1, _Staging.MAX_BYTES // _round4k(page_bytes))

    def __init__(self, page_bytes: int, n: int) -> None:
        self.page_bytes, self.slot, self.n = page_bytes, _round4k(page_bytes), n
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)
        self._mm = mmap.mmap(-1, self.n * self.slot, flags=flags)
        self._mv = memoryview(self._mm)
        self.lock = threading.Lock()

    def view(self, j: int) -> memoryview:
        return self._mv[j * self.slot: j * self.slot + self.page_bytes]


def _round4k(n: int) -> int:
    return -(-n // 4096) * 4096


class _PageIO:
    """Copies one page between SGLang's host pool and a store buffer.

    Uses ``get_data_page(i, flat=False)`` when it is a view into the pool
    (MHA/MLA pools slice their buffer): bytes move with one strided numpy copy
    (contiguous runs coalesce to memcpy).  Otherwise falls back to the pool's
    flat-page methods (one extra copy)."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.page_size = int(pool.page_size)
        flat = pool.get_dummy_flat_data_page()
        self.page_bytes = int(flat.numel() * flat.element_size())
        self.dtype = flat.dtype
        buf = getattr(pool, "kv_buffer", None)
        self._lo = self._hi = 0
        if buf is not None and hasattr(buf, "untyped_storage"):
            st = buf.untyped_storage()
            self._lo, self._hi = st.data_ptr(), st.data_ptr() + st.nbytes()

    def _view(self, index: int) -> np.ndarray | None:
        t = self.pool.get_data_page(index, flat=False)
        nbytes = t.numel() * t.element_size()
        if nbytes != self.page_bytes or not (self._lo <= t.data_ptr() < self._hi):
            return None
        try:
            return t.view(torch_uint8()).numpy()
        except (RuntimeError, TypeError):
            return None

    def read_page(self, index: int, dst: memoryview) -> None:
        """Pool page at token index ``index`` -> ``dst`` (writable, page_bytes)."""
        out = np.frombuffer(dst, dtype=np.uint8)
        v = self._view(index)
        if v is not None:
            np.copyto(out.reshape(v.shape), v)
        else:
            flat = self.pool.get_data_page(index, flat=True).contiguous()
            np.copyto(out, flat.view(torch_uint8()).numpy())

    def write_page(self, index: int, src: memoryview) -> None:
        """``src`` (page_bytes) -> pool page at token index ``index``."""
        inp = np.frombuffer(src, dtype=np.uint8)
        v = self._view(index)
        if v is not None:
            np.copyto(v, inp.reshape(v.shape))
        else:
            import torch
            t = torch.empty(self.page_bytes, dtype=torch.uint8)
            t.numpy()[:] = inp
            self.pool.set_from_flat_data_page(index, t.view(self.dtype))


def torch_uint8():
    import torch
    return torch.uint8


def _tensor_bytes(t: Any) -> np.ndarray | None:
    """A flat uint8 numpy view of a CPU tensor (None if it is not one)."""
    try:
        if t is None or t.device.type != "cpu" or not t.is_contiguous():
            return None
        return t.view(-1).view(torch_uint8()).numpy()
    except (AttributeError, RuntimeError, TypeError):
        return None


class KvtierStorage(HiCacheStorage, EngineErrorLog):
    """SGLang ``HiCacheStorage`` backed by a kvtier ``TieredStore``.  See the module doc.

    Threading: SGLang calls in from its prefetch and backup threads at once;
    the store is thread-safe, and this class's own mutable state (the store
    handle, counters) is guarded by ``_lock``.
    """

    _log = log  # EngineErrorLog reports through this engine's logger

    def __init__(self, storage_config: Any, kwargs: dict | None = None) -> None:
        self.storage_config = storage_config
        self.cfg = PluginConfig.from_extra(getattr(storage_config, "extra_config", None))
        if getattr(storage_config, "is_mla_model", False) and getattr(storage_config, "tp_size", 1) > 1:
            raise ValueError("kvtier: MLA models with tp_size > 1 are not supported "
                             "(SGLang writes their pages from one rank; each rank's store is private)")
        self.root = Path(self.cfg.data_dir) / rank_dir(storage_config)
        self.advisor = self.cfg.make_advisor()
        self._lock = threading.Lock()
        self._store: TieredStore | None = None
        self._io: _PageIO | None = None
        self._ns: Namespace | None = None
        self._closed = False
        self._warned: set[str] = set()
        self._stagings: dict[str, _Staging] = {}
        self._samples = _new_samples()
        self.counters = dict(pages_set=0, pages_set_skipped=0, pages_get_hit=0, pages_get_miss=0,
                             bytes_written=0, bytes_read=0, errors=0)

    # ------------------------------------------------------------ lifecycle
    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        """SGLang hands us its host KV pool; the store opens with its page size.
        Raises ValueError if ``page_bytes`` was configured and disagrees."""
        super().register_mem_pool_host(mem_pool_host)
        io = _PageIO(mem_pool_host)
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
        cfg = StoreConfig.from_env(self.root, host_bytes=self.cfg.host_bytes, nvme_bytes=self.cfg.nvme_bytes,
                                   block_bytes=page_bytes, io_engine=self.cfg.io_engine,
                                   direct_io=self.cfg.direct_io, durable=self.cfg.durable)
        store = TieredStore.open(cfg)
        with self._lock:
            self._store, self._ns = store, ns
        log.info("kvtier: store at %s, page %d bytes, %d host frames, %d NVMe slots",
                 self.root, page_bytes, cfg.host_frames, cfg.nvme_slots)

    def close(self) -> None:
        """Close the store (SGLang calls this on detach).  Idempotent; every
        later call answers misses / False."""
        with self._lock:
            store, self._store, self._closed = self._store, None, True
        if store is not None:
            store.close()

    @property
    def store(self) -> TieredStore | None:
        return self._store

    # ------------------------------------------------------------ helpers
    def _ready(self, what: str) -> tuple[TieredStore, Namespace] | None:
        st, ns = self._store, self._ns
        if st is None or st.closed or ns is None:
            self._warn(what, "store is closed" if self._closed else "no host pool registered yet")
            return None
        return st, ns

    def _keys(self, ns: Namespace, keys: List[str]) -> list[bytes] | None:
        try:
            return [store_key(ns, k) for k in keys]
        except ValueError as exc:
            self._warn("bad key", exc)
            return None

    def _count(self, **kw: int) -> None:
        with self._lock:
            for k, v in kw.items():
                self.counters[k] += v

    def _placement(self, extra_info: Any, n_pages: int):
        hint = ToolHint.parse(getattr(extra_info, "extra_info", None)) if extra_info is not None else None
        page_bytes = self._io.page_bytes if self._io is not None else 0
        tokens = n_pages * (self._io.page_size if self._io is not None else 0)
        if extra_info is not None and getattr(extra_info, "prefix_keys", None):
            tokens += len(extra_info.prefix_keys) * (self._io.page_size if self._io else 0)
        return self.advisor.place(hint, kv_bytes=n_pages * page_bytes, context_tokens=tokens)

    def _tier(self, st: TieredStore, placement) -> str | None:
        t = placement.tier
        if t == "host" and not st.config.host_frames:
            t = "nvme"
        if t == "nvme" and not st.config.nvme_slots:
            t = "host"
        return t

    def _page_indices(self, host_indices: Any, n: int) -> list[int] | None:
        io = self._io
        if io is None:
            self._warn("v1 call", "no host pool registered")
            return None
        try:
            total = int(host_indices.numel())
        except AttributeError:
            total = len(host_indices)
        if total != n * io.page_size:
            self._warn("v1 call", f"{n} keys but {total} host indices (page size {io.page_size})")
            return None
        flat = host_indices.tolist() if hasattr(host_indices, "tolist") else list(host_indices)
        return [int(flat[i * io.page_size]) for i in range(n)]

    # ------------------------------------------------------------ v1: host-pool indices
    def _staging(self, which: str, n_pages: int) -> "_Staging":
        """The staging area for one direction ("set"/"get"), made on first use
        with room for a whole SGLang batch (128 pages) up to MAX_BYTES."""
        with self._lock:
            stg = self._stagings.get(which)
            if stg is None:
                cap = _Staging.max_pages(self._io.page_bytes)
                stg = _Staging(self._io.page_bytes, min(cap, max(n_pages, SGLANG_BATCH_PAGES)))
                self._stagings[which] = stg
            return stg

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
        placement = self._placement(extra_info, n)
        tier = self._tier(st, placement)
        if tier is None:   # the policy chose recompute: nothing is written
            self._count(pages_set_skipped=n)
            return [False] * n
        stored = 0
        t0 = time.perf_counter()
        try:
            todo = [i for i in range(n) if not st.contains(skeys[i])]
            stg = self._staging("set", len(todo))
            with stg.lock:
                for lo in range(0, len(todo), stg.n):
                    group = todo[lo:lo + stg.n]
                    for j, i in enumerate(group):
                        self._io.read_page(idx[i], stg.view(j))
                    stored += st.put_many([skeys[i] for i in group], [stg.view(j) for j in range(len(group))],
                                          namespace=ns, tier=tier)
        except (StoreError, ValueError, RuntimeError) as exc:
            self._warn("batch_set_v1", exc)
            self._count(pages_set=stored, bytes_written=stored * st.config.block_bytes)
            try:
                return [st.contains(k) for k in skeys]
            except StoreError:
                return [False] * n
        self._count(pages_set=stored, bytes_written=stored * st.config.block_bytes)
        self._sample("backup", stored, stored * st.config.block_bytes, time.perf_counter() - t0)
        return [True] * n

    def batch_get_v1(self, keys: List[str], host_indices: Any, extra_info: Any = None) -> List[bool]:
        """Load the longest stored prefix of ``keys`` into the host pool at
        ``host_indices``.  Returns per-key success (True for the prefix, False after).
        A page that misses or fails its checksum ends the prefix; the pool's
        bytes for it and every later page are left untouched."""
        n = len(keys)
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
                    group = range(lo, min(want, lo + stg.n))
                    res = st.get_many([skeys[i] for i in group], [stg.view(j) for j in range(len(group))])
                    for j, i in enumerate(group):
                        if not res[j]:
                            raise _PrefixEnd
                        self._io.write_page(idx[i], stg.view(j))
                        ok += 1
        except _PrefixEnd:
            pass
        except (StoreError, ValueError, RuntimeError) as exc:
            self._warn("batch_get_v1", exc)
        self._count(pages_get_hit=ok, pages_get_miss=n - ok, bytes_read=ok * st.config.block_bytes)
        self._sample("prefetch", ok, ok * st.config.block_bytes, time.perf_counter() - t0)
        return [i < ok for i in range(n)]

    # ------------------------------------------------------------ generic: flat page tensors
    def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> Any:
        """Read page ``key`` into ``target_location`` (a flat CPU tensor of one
        page).  Returns the tensor, or None on a miss or bad input."""
        return self.batch_get([key], [target_location])[0]

    def batch_get(self, keys: List[str], target_locations: Any = None, target_sizes: Any = None) -> List[Any]:
        """Per key: the filled tensor or None (miss, wrong size, closed store)."""
        n = len(keys)
        ready = self._ready("batch_get")
        targets = list(target_locations) if target_locations is not None else [None] * n
        if ready is None or len(targets) != n:
            if ready is not None:
                self._warn("batch_get", f"{n} keys but {len(targets)} targets")
            return [None] * n
        st, ns = ready
        result: list[Any] = [None] * n
        todo = []
        for i, (k, t) in enumerate(zip(keys, targets)):
            arr = _tensor_bytes(t)
            if arr is None or arr.nbytes != st.config.block_bytes:
                self._warn("batch_get", f"target for {k!r} is not a contiguous CPU page of "
                           f"{st.config.block_bytes} bytes")
                continue
            try:
                todo.append((i, store_key(ns, k), arr))
            except ValueError as exc:
                self._warn("bad key", exc)
        if todo:
            try:
                ok = st.get_many([k for _, k, _ in todo], [a for _, _, a in todo])
            except StoreError as exc:
                self._warn("batch_get", exc)
                ok = [False] * len(todo)
            for (i, _, _), good in zip(todo, ok):
                if good:
                    result[i] = targets[i]
        hits = sum(r is not None for r in result)
        self._count(pages_get_hit=hits, pages_get_miss=n - hits, bytes_read=hits * st.config.block_bytes)
        return result

    def set(self, key: str, value: Any = None, target_location: Any = None, target_sizes: Any = None) -> bool:
        """Store one flat page tensor.  True if stored (or already stored)."""
        return self.batch_set([key], [value])

    def batch_set(self, keys: List[str], values: Any = None, target_locations: Any = None,
                  target_sizes: Any = None) -> bool:
        """Store flat page tensors.  True only if every page is stored (or was already)."""
        n = len(keys)
        ready = self._ready("batch_set")
        vals = list(values) if values is not None else []
        if ready is None:
            return False
        if len(vals) != n:
            self._warn("batch_set", f"{n} keys but {len(vals)} values")
            return False
        st, ns = ready
        arrs = [_tensor_bytes(v) for v in vals]
        for k, a in zip(keys, arrs):
            if a is None or a.nbytes != st.config.block_bytes:
                self._warn("batch_set", f"value for {k!r} is not a contiguous CPU page of "
                           f"{st.config.block_bytes} bytes")
                return False
        skeys = self._keys(ns, keys)
        if skeys is None:
            return False
        tier = self._tier(st, self._placement(None, n))
        if tier is None:
            self._count(pages_set_skipped=n)
            return False
        try:
            stored = st.put_many(skeys, arrs, namespace=ns, tier=tier)
        except StoreError as exc:
            self._warn("batch_set", exc)
            return False
        self._count(pages_set=stored, bytes_written=stored * st.config.block_bytes)
        return True

    # ------------------------------------------------------------ queries
    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def batch_exists(self, keys: List[str], extra_info: Any = None) -> int:
        """How many leading ``keys`` are stored (0 on any trouble)."""
        ready = self._ready("batch_exists")
        skeys = self._keys(ready[1], keys) if ready else None
        if skeys is None:
            return 0
        try:
            return ready[0].lookup(skeys)
        except StoreError as exc:
            self._warn("batch_exists", exc)
            return 0

    def clear(self) -> None:
        """SGLang's ``/clear_hicache_storage``.  Pages are content-addressed and
        recomputable, so kvtier keeps them (they age out by LRU); this only logs."""
        log.info("kvtier: clear() keeps stored pages (content-addressed; evicted by LRU when full)")

    def get_stats(self) -> Any:
        """SGLang's storage metrics hook (``--enable-storage-metrics``): the pages
        and GB/s of each prefetch/backup batch since the last call, as SGLang's
        ``StorageMetrics`` -- or None where that class cannot be imported (CPU-only
        installs), which SGLang treats as "no samples".  Always drains the samples."""
        with self._lock:
            samples, self._samples = self._samples, _new_samples()
        try:
            from sglang.srt.observability.metrics_collector import StorageMetrics
        except Exception:
            return None
        m = StorageMetrics()
        for name, values in samples.items():
            getattr(m, name).extend(values)
        return m

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
        out["decisions"] = self.advisor.counts()
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
