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
    io_engine, direct_io, durable, nvme_throttle_gbps   passed to kvtier.store.StoreConfig
                   (the last emulates a slower NVMe device, for benchmarks; the policy
                   prices NVMe at it)
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
                   mooncake://; see kvtier.store.remote)
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
    switch_interval_ms  lower the engine process's thread switch interval to this at the
                   plugin's start (default 0.5; 0 leaves it): kvtier's I/O threads get the
                   interpreter lock back from a spinning engine loop this fast, not in 5 ms
                   (see kvtier.engine_adapter.switch_interval)
    time_scale     run the lifecycle's timers on trace seconds = wall seconds / time_scale
                   (replays only; default 1)
    vLLM only:     io_threads (1..64, default 2); yield_to_prefill ("auto", "on", "off"):
                   the lifecycle's moves also wait out an engine step that prefills a new
                   request ("auto", the default: where the engine computes on the CPU, on
                   the cores kvtier's threads use; see kvtier.tiering.lifecycle.foreground);
                   hold_share (0..0.9, default 0.5): a pause the policy retains keeps its
                   blocks in the engine's own KV cache, holding at most this share of its
                   blocks (0: never hold; see kvtier.engine_adapter.vllm_holds);
                   link_gbps: the scale model (vLLM's CPU platform only): each copy between
                   the engine's cache and the CPU tier completes after the time a link of
                   this many GB/s would take (default: at once; see docs/live.md)
    SGLang only:   page_bytes (an expected page size, checked at registration)

With no host tier (``host_gb: 0``) a host placement falls back to NVMe, and
``default_tier: "host"`` means NVMe.

Every option is a key of the one settings layer (:mod:`kvtier.settings`, docs/config.md):
the same key in a config file (``KVTIER_CONFIG``) or as ``KVTIER_<KEY>`` (``KVTIER_NVME_GB``).
The JSON wins over the variable, the variable over the file, the file over the default.
"""
from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Any, Mapping

from kvtier.store.config import IoEngineKind, RemoteWrite, Switch
from kvtier.util.choices import member
from kvtier.util.tiers import Tier

GB = 10**9


class LifecycleKind(str, enum.Enum):
    """Which lifecycle carries out the pauses (option ``lifecycle``)."""
    FORECAST = "forecast"   # the policy's plan: lease, demote, stage
    TTL = "ttl"             # vLLM's fixed-timer session lifecycle
    OFF = "off"             # placement at store time only

    def __str__(self) -> str:
        return self.value


class YieldToPrefill(str, enum.Enum):
    """Whether the lifecycle's moves also wait out an engine step that prefills (vLLM only)."""
    AUTO = "auto"           # where the engine computes on the CPU
    ON = "on"
    OFF = "off"

    def __str__(self) -> str:
        return self.value

_COMMON = ("data_dir", "nvme_gb", "host_gb", "io_engine", "direct_io", "durable", "policy", "model", "node",
           "service_url", "service_timeout_s", "service_ttl_s", "default_tier", "lifecycle", "ttl_idle_s",
           "ttl_demote_after_s", "time_scale", "forget_after_s", "max_trajectories", "default_tool",
           "prefix_trajectories", "remote_url", "remote_write", "remote_key_file", "remote_encrypt",
           "switch_interval_ms", "nvme_throttle_gbps")
_ENGINE_ONLY = {"vllm": ("io_threads", "yield_to_prefill", "hold_share", "link_gbps"), "sglang": ("page_bytes",)}
# keys SGLang's own loader reads from the same extra config
SGLANG_KEYS = ("backend_name", "module_path", "class_name", "interface_v1", "prefetch_threshold",
               "enable_metadata_cache", "metadata_ttl")


def slug(s: str) -> str:
    """A file-name-safe form of a model name ("Qwen/Qwen3-8B" -> "Qwen-Qwen3-8B")."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", s).strip("-") or "model"


@dataclass(frozen=True)
class PluginConfig:
    """One engine plugin's kvtier settings (see the module doc)."""

    data_dir: str
    nvme_bytes: int = 64 * GB
    host_bytes: int = 0
    io_engine: IoEngineKind = IoEngineKind.AUTO
    direct_io: Switch = Switch.AUTO
    durable: bool = True
    policy: str | None = "breakeven"
    model: str | None = None
    node: str | None = None
    service_url: str | None = None
    service_timeout_s: float = 1.0
    service_ttl_s: float = 5.0
    default_tier: Tier = Tier.NVME
    lifecycle: LifecycleKind = LifecycleKind.OFF
    ttl_idle_s: float = 300.0
    ttl_demote_after_s: float = 30.0
    time_scale: float = 1.0
    forget_after_s: float = 600.0
    max_trajectories: int = 20_000
    io_threads: int = 2
    yield_to_prefill: YieldToPrefill = YieldToPrefill.AUTO
    page_bytes: int | None = None
    default_tool: str = "unhinted"
    prefix_trajectories: bool = True
    remote_url: str | None = None
    remote_write: RemoteWrite = RemoteWrite.EXPLICIT
    remote_key_file: str | None = None
    remote_encrypt: bool | None = None
    switch_interval_ms: float = 0.5
    nvme_throttle_gbps: float | None = None
    hold_share: float = 0.5
    link_gbps: float | None = None

    def __post_init__(self) -> None:
        """The modes as their enums (a name is taken as its member).

        Raises:
            ValueError: a name that is no member.
        """
        for name, kind in (("default_tier", Tier), ("lifecycle", LifecycleKind), ("yield_to_prefill", YieldToPrefill),
                           ("io_engine", IoEngineKind), ("direct_io", Switch), ("remote_write", RemoteWrite)):
            object.__setattr__(self, name, member(kind, getattr(self, name), field=f"kvtier: {name}"))
        if self.default_tier not in (Tier.HOST, Tier.NVME):
            raise ValueError(f"kvtier: default_tier must be 'host' or 'nvme', got {self.default_tier.value!r}")

    @classmethod
    def parse(cls, opts: Mapping[str, Any] | None, *, engine: str) -> "PluginConfig":
        """Validate ``opts`` for ``engine`` ("vllm" or "sglang") over the settings layer:
        ``opts`` > ``KVTIER_<KEY>`` variables > the config file (``KVTIER_CONFIG``) > the defaults
        (:mod:`kvtier.settings`).

        Raises:
            ValueError: a bad or unknown key (named, with where its value came from).
        """
        if engine not in _ENGINE_ONLY:
            raise ValueError(f"engine must be one of {list(_ENGINE_ONLY)}, got {engine!r}")
        opts = dict(opts or {})
        known = _COMMON + _ENGINE_ONLY[engine]
        ignored = SGLANG_KEYS if engine == "sglang" else ()
        unknown = sorted(k for k in opts if k not in known and k not in ignored)
        if unknown:
            raise ValueError(f"kvtier: unknown option(s) {unknown}; known: {list(known)}")
        from kvtier.settings import layered
        try:
            o = layered(known, {k: v for k, v in opts.items() if k in known},
                        source=f"the {engine} plugin config")
        except ValueError as exc:
            raise ValueError(f"kvtier: {exc}") from None
        if "data_dir" not in o:
            raise ValueError("kvtier: the config needs \"data_dir\" (the store directory)")
        service = o.get("service_url")
        policy = o.get("policy", None if service else "breakeven")
        if policy == "off":
            policy = None
        if policy and service:
            raise ValueError("kvtier: give either policy or service_url, not both")
        lifecycle = LifecycleKind(o.get("lifecycle", "forecast" if (policy or service) else "off"))
        if lifecycle is LifecycleKind.FORECAST and not (policy or service):
            raise ValueError("kvtier: lifecycle \"forecast\" needs a policy or a service_url")
        fields = {k: o[k] for k in ("io_engine", "direct_io", "durable", "model", "node", "service_timeout_s",
                                    "service_ttl_s", "default_tier", "ttl_idle_s", "ttl_demote_after_s",
                                    "time_scale", "forget_after_s", "max_trajectories", "io_threads",
                                    "yield_to_prefill", "page_bytes", "default_tool", "prefix_trajectories", "remote_url",
                                    "remote_write", "remote_key_file", "remote_encrypt", "switch_interval_ms",
                                    "nvme_throttle_gbps", "hold_share", "link_gbps") if k in o}
        for k in ("service_timeout_s", "service_ttl_s", "ttl_idle_s", "ttl_demote_after_s", "time_scale",
                  "forget_after_s", "switch_interval_ms", "nvme_throttle_gbps", "hold_share", "link_gbps"):
            if k in fields:
                fields[k] = float(fields[k])
        cfg = cls(data_dir=o["data_dir"], nvme_bytes=int(o.get("nvme_gb", 64) * GB),
                  host_bytes=int(o.get("host_gb", 0) * GB), policy=policy, service_url=service,
                  lifecycle=lifecycle, **fields)
        if cfg.nvme_bytes == 0 and cfg.host_bytes == 0:
            raise ValueError("kvtier: nvme_gb and host_gb are both 0: nowhere to store blocks")
        return cfg

    def store_options(self) -> dict:
        """The StoreConfig keyword arguments this config sets (the environment may override them)."""
        return dict(host_bytes=self.host_bytes, nvme_bytes=self.nvme_bytes, io_engine=self.io_engine,
                    direct_io=self.direct_io, durable=self.durable, remote_url=self.remote_url,
                    remote_write=self.remote_write,
                    **{k: v for k, v in (("remote_key_file", self.remote_key_file),
                                         ("remote_encrypt", self.remote_encrypt),
                                         ("nvme_throttle_gbps", self.nvme_throttle_gbps)) if v is not None})

    @property
    def host_available(self) -> bool:
        return self.host_bytes > 0

    @property
    def effective_default_tier(self) -> Tier:
        """``default_tier``, or NVMe where there is no host tier."""
        return self.default_tier if self.host_available else Tier.NVME

