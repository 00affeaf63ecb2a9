"""The engine plugins' one configuration: parsed and validated once, frozen.

vLLM passes the ``"kvtier"`` object of ``kv_connector_extra_config`` (or a
``secondary_tiers`` entry), SGLang its ``--hicache-storage-backend-extra-config``;
both become a :class:`PluginConfig` through :meth:`PluginConfig.parse`, which
raises ``ValueError`` naming the one bad key (an unknown key is an error: a
typo must not silently fall back to a default).

Options (GB = 1e9 bytes)::

    data_dir       store root (required)
    nvme_gb        NVMe tier capacity (default 64)
    host_gb        kvtier host frames in front of NVMe (default 0)
    io_engine, direct_io, durable      passed to kvtier.store.StoreConfig
    policy         the tiering policy that decides every pause: "breakeven" (default:
                   the forecast), another policy name, or "off" (plain tiering: every
                   block to default_tier, no lifecycle)
    model, node    what-if overrides: price pauses as this model preset / on this node
                   preset instead of the engine's own geometry and device (optional)
    service_url    ask a running ``kvtier serve`` (asynchronously, cached per tool,
                   behind a circuit breaker; engine calls never wait on it)
    service_timeout_s, service_ttl_s   one fetch's time limit (1.0) and how long an
                   answer is reused (5.0); see kvtier.tiering.lifecycle.service_policy
    default_tier   "nvme" (default) or "host": where unhinted blocks go
    remote_url     a shared remote tier below host and NVMe (redis://, rediss://, redis+cluster://,
                   mooncake://; see kvtier.store.remote); KVTIER_REMOTE_URL overrides it
    remote_write   "explicit" (default: blocks go remote when the lifecycle publishes them) or
                   "through" (every block written locally is also published)
    remote_key_file  a file holding the remote domain's secret (>= 16 bytes): values are
                   authenticated and named from it (KVTIER_REMOTE_KEY / _FILE when unset)
    remote_encrypt true: write remote values encrypted (needs a key); unset:
                   KVTIER_REMOTE_ENCRYPT decides (docs/reliability.md, trust model)
    default_tool   the tool class of a pause whose request carries no hint ("unhinted"):
                   its waits are learned online like any tool's
    prefix_trajectories  a request naming no trajectory joins the one whose context it
                   extends (by its prompt's block hashes; default true)
    lifecycle      "forecast" (default with a policy or service: lease, demote, stage),
                   "ttl" (vLLM's fixed-timer session lifecycle: every pause to host,
                   demoted after ttl_demote_after_s, forgotten after ttl_idle_s, host
                   watermarks 0.9/0.7) or "off" (placement at store time only)
    ttl_idle_s, ttl_demote_after_s     the "ttl" lifecycle's timers (300, 30)
    forget_after_s, max_trajectories   the lifecycle forgets a running trajectory untouched
                   this long with nothing in host frames (600 s), and keeps at most this
                   many (20000); see kvtier.tiering.lifecycle.pruning
    time_scale     run the lifecycle's timers on trace seconds = wall seconds / time_scale
                   (replays only; default 1)
    vLLM only:     io_threads (1..64, default 2)
    SGLang only:   page_bytes (an expected page size, checked at registration)

With no host tier (``host_gb: 0``) a host placement falls back to NVMe, and
``default_tier: "host"`` means NVMe.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Mapping

from kvtier.tiering.features import check_tool

GB = 10**9
TIERS = ("host", "nvme")
LIFECYCLES = ("forecast", "ttl", "off")

_COMMON = ("data_dir", "nvme_gb", "host_gb", "io_engine", "direct_io", "durable", "policy", "model", "node",
           "service_url", "service_timeout_s", "service_ttl_s", "default_tier", "lifecycle", "ttl_idle_s",
           "ttl_demote_after_s", "time_scale", "forget_after_s", "max_trajectories", "default_tool",
           "prefix_trajectories", "remote_url", "remote_write", "remote_key_file", "remote_encrypt")
_ENGINE_ONLY = {"vllm": ("io_threads", "locality"), "sglang": ("page_bytes",)}
# keys SGLang's own loader reads from the same extra config
SGLANG_KEYS = ("backend_name", "module_path", "class_name", "interface_v1", "prefetch_threshold",
               "enable_metadata_cache", "metadata_ttl")


def slug(s: str) -> str:
    """A file-name-safe form of a model name ("Qwen/Qwen3-8B" -> "Qwen-Qwen3-8B")."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", s).strip("-") or "model"


def _gb(opts: Mapping, name: str, default: float) -> int:
    v = opts.get(name, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise ValueError(f"kvtier: {name} must be a number of GB >= 0, got {v!r}")
    return int(v * GB)


def _pos(opts: Mapping, name: str, default: float, *, zero_ok: bool = False) -> float:
    v = opts.get(name, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 \
            or (v == 0 and not zero_ok):
        raise ValueError(f"kvtier: {name} must be a finite number {'>=' if zero_ok else '>'} 0, got {v!r}")
    return float(v)


def _str(opts: Mapping, name: str, default: str | None = None) -> str | None:
    v = opts.get(name, default)
    if v is not None and (not isinstance(v, str) or not v):
        raise ValueError(f"kvtier: {name} must be a non-empty string, got {v!r}")
    return v


@dataclass(frozen=True)
class PluginConfig:
    """One engine plugin's kvtier settings (see the module doc)."""

    data_dir: str
    nvme_bytes: int = 64 * GB
    host_bytes: int = 0
    io_engine: str = "auto"
    direct_io: str = "auto"
    durable: bool = True
    policy: str | None = "breakeven"
    model: str | None = None
    node: str | None = None
    service_url: str | None = None
    service_timeout_s: float = 1.0
    service_ttl_s: float = 5.0
    default_tier: str = "nvme"
    lifecycle: str = "off"
    ttl_idle_s: float = 300.0
    ttl_demote_after_s: float = 30.0
    time_scale: float = 1.0
    forget_after_s: float = 600.0
    max_trajectories: int = 20_000
    io_threads: int = 2
    page_bytes: int | None = None
    default_tool: str = "unhinted"
    prefix_trajectories: bool = True
    remote_url: str | None = None
    remote_write: str = "explicit"
    remote_key_file: str | None = None
    remote_encrypt: bool | None = None

    @classmethod
    def parse(cls, opts: Mapping[str, Any] | None, *, engine: str) -> "PluginConfig":
        """Validate ``opts`` for ``engine`` ("vllm" or "sglang").  Raises
        ValueError naming the bad or unknown key."""
        if engine not in _ENGINE_ONLY:
            raise ValueError(f"engine must be one of {list(_ENGINE_ONLY)}, got {engine!r}")
        opts = dict(opts or {})
        known = _COMMON + _ENGINE_ONLY[engine]
        ignored = SGLANG_KEYS if engine == "sglang" else ()
        unknown = sorted(k for k in opts if k not in known and k not in ignored)
        if unknown:
            raise ValueError(f"kvtier: unknown option(s) {unknown}; known: {list(known)}")
        data_dir = opts.get("data_dir")
        if not isinstance(data_dir, str) or not data_dir:
            raise ValueError("kvtier: the config needs \"data_dir\" (the store directory)")
        durable = opts.get("durable", True)
        if not isinstance(durable, bool):
            raise ValueError(f"kvtier: durable must be true or false, got {durable!r}")
        io_threads = opts.get("io_threads", 2)
        if not isinstance(io_threads, int) or isinstance(io_threads, bool) or not 1 <= io_threads <= 64:
            raise ValueError(f"kvtier: io_threads must be an int in 1..64, got {io_threads!r}")
        page_bytes = opts.get("page_bytes")
        if page_bytes is not None and (isinstance(page_bytes, bool) or not isinstance(page_bytes, int)
                                       or page_bytes <= 0):
            raise ValueError(f"kvtier: page_bytes must be a positive int, got {page_bytes!r}")
        service = _str(opts, "service_url")
        policy = _str(opts, "policy", None if service else "breakeven")
        if policy == "off":
            policy = None
        model, node = _str(opts, "model"), _str(opts, "node")
        from kvtier.tiering.presets import get_node, get_preset
        if model is not None:
            get_preset(model)            # ValueError naming the known presets
        if node is not None:
            get_node(node)
        if policy and service:
            raise ValueError("kvtier: give either policy or service_url, not both")
        default_tool = opts.get("default_tool", "unhinted")
        try:
            check_tool(default_tool)
        except ValueError as exc:
            raise ValueError(f"kvtier: default_tool: {exc}") from None
        remote_url = _str(opts, "remote_url")
        remote_write = opts.get("remote_write", "explicit")
        if remote_write not in ("explicit", "through"):
            raise ValueError(f"kvtier: remote_write must be 'explicit' or 'through', got {remote_write!r}")
        if remote_url is not None:
            from kvtier.store.remote.url import parse_remote_url
            try:
                parse_remote_url(remote_url)
            except ValueError as exc:
                raise ValueError(f"kvtier: remote_url: {exc}") from None
        remote_key_file = _str(opts, "remote_key_file")
        remote_encrypt = opts.get("remote_encrypt")
        if remote_encrypt is not None and not isinstance(remote_encrypt, bool):
            raise ValueError(f"kvtier: remote_encrypt must be true or false, got {remote_encrypt!r}")
        prefix_traj = opts.get("prefix_trajectories", True)
        if not isinstance(prefix_traj, bool):
            raise ValueError(f"kvtier: prefix_trajectories must be true or false, got {prefix_traj!r}")
        default_tier = opts.get("default_tier", "nvme")
        if default_tier not in TIERS:
            raise ValueError(f"kvtier: default_tier must be 'host' or 'nvme', got {default_tier!r}")
        max_traj = opts.get("max_trajectories", 20_000)
        if not isinstance(max_traj, int) or isinstance(max_traj, bool) or max_traj < 1:
            raise ValueError(f"kvtier: max_trajectories must be an int >= 1, got {max_traj!r}")
        lifecycle = opts.get("lifecycle", "forecast" if (policy or service) else "off")
        if lifecycle not in LIFECYCLES:
            raise ValueError(f"kvtier: lifecycle must be one of {list(LIFECYCLES)}, got {lifecycle!r}")
        if lifecycle == "forecast" and not (policy or service):
            raise ValueError("kvtier: lifecycle \"forecast\" needs a policy or a service_url")
        cfg = cls(data_dir=data_dir, nvme_bytes=_gb(opts, "nvme_gb", 64), host_bytes=_gb(opts, "host_gb", 0),
                  io_engine=str(opts.get("io_engine", "auto")), direct_io=str(opts.get("direct_io", "auto")),
                  durable=durable, policy=policy, model=model, node=node, service_url=service,
                  service_timeout_s=_pos(opts, "service_timeout_s", 1.0), service_ttl_s=_pos(opts, "service_ttl_s", 5.0),
                  default_tier=default_tier, lifecycle=lifecycle,
                  ttl_idle_s=_pos(opts, "ttl_idle_s", 300.0), ttl_demote_after_s=_pos(opts, "ttl_demote_after_s",
                                                                                       30.0, zero_ok=True),
                  time_scale=_pos(opts, "time_scale", 1.0), io_threads=io_threads, page_bytes=page_bytes,
                  forget_after_s=_pos(opts, "forget_after_s", 600.0, zero_ok=True), max_trajectories=max_traj,
                  default_tool=default_tool, prefix_trajectories=prefix_traj, remote_url=remote_url,
                  remote_write=remote_write, remote_key_file=remote_key_file, remote_encrypt=remote_encrypt)
        if cfg.nvme_bytes == 0 and cfg.host_bytes == 0:
            raise ValueError("kvtier: nvme_gb and host_gb are both 0: nowhere to store blocks")
        return cfg

    def store_options(self) -> dict:
        """The StoreConfig keyword arguments this config sets (the environment may override them)."""
        return dict(host_bytes=self.host_bytes, nvme_bytes=self.nvme_bytes, io_engine=self.io_engine,
                    direct_io=self.direct_io, durable=self.durable, remote_url=self.remote_url,
                    remote_write=self.remote_write,
                    **{k: v for k, v in (("remote_key_file", self.remote_key_file),
                                         ("remote_encrypt", self.remote_encrypt)) if v is not None})

    @property
    def host_available(self) -> bool:
        return self.host_bytes > 0

    @property
    def effective_default_tier(self) -> str:
        """``default_tier``, or NVMe where there is no host tier."""
        return self.default_tier if self.host_available else "nvme"

    def fallback_tier(self, tier: str | None, *, host_frames: int, nvme_slots: int) -> str | None:
        """``tier`` where the store has it, else the other one (None stays None)."""
        if tier == "host" and not host_frames:
            return "nvme"
        if tier == "nvme" and not nvme_slots:
            return "host"
        return tier
