"""Every kvtier setting in one registry, and the one rule that layers where a value comes from.

A setting has one key, used unchanged in the engine plugins' JSON
(``engine_adapter/config.py``), in a config file (``--config FILE`` or
``KVTIER_CONFIG``: TOML, YAML or JSON; top-level keys or a ``[kvtier]`` table) and,
upper-cased behind ``KVTIER_``, as an environment variable (``io_engine`` is
``KVTIER_IO_ENGINE``).  ``kvtier --help`` lists the variables from this registry.

Precedence, highest first (:data:`PRECEDENCE`)::

    explicit (a command-line flag, the plugin's JSON, a keyword argument)
      > environment (KVTIER_*)
        > config file (KVTIER_CONFIG / --config)
          > the built-in default

A bad value from any layer raises ``ValueError`` naming the key and where the
value came from (``io_engine from KVTIER_IO_ENGINE must be one of 'auto',
'io_uring', 'threads', got 'bogus'``); an unknown key in a config file is refused
with its name.  An empty environment variable counts as unset.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from kvtier.util.tiers import Tier
from kvtier.util.validate import Choice, Flag, Kind, Number, Text

PRECEDENCE = ("explicit", "environment", "config file", "default")
CONFIG_VAR = "KVTIER_CONFIG"


def _remote_url(text: str) -> None:
    from kvtier.store.remote.url import parse_remote_url   # imported on use: this module stays light
    parse_remote_url(text)


def _model(text: str) -> None:
    from kvtier.tiering.model.presets import get_preset
    get_preset(text)


def _node(text: str) -> None:
    from kvtier.tiering.model.presets import get_node
    get_node(text)


def _tool(text: str) -> None:
    from kvtier.tiering.forecasting.features import check_tool
    check_tool(text)


@dataclass(frozen=True)
class Setting:
    """One key.  ``scope``: who reads it ("store", "plugin", "service", "remote", "bench")."""

    key: str
    kind: Kind
    help: str
    scope: str
    secret: bool = False     # never echoed in an error

    @property
    def env(self) -> str:
        return "KVTIER_" + self.key.upper()


_S = Setting
GB = Number(low=0, unit="GB")
SECONDS = Number(low=0, low_open=True, unit="seconds")
SETTINGS: tuple[Setting, ...] = (
    # the store (StoreConfig.from_env and both plugins)
    _S("io_engine", Choice(options=("auto", "io_uring", "threads")), "NVMe I/O engine: auto, io_uring or threads", "store"),
    _S("direct_io", Choice(options=("auto", "on", "off")), "O_DIRECT for NVMe slabs: auto, on or off", "store"),
    _S("queue_depth", Number(low=1, high=4096, integer=True), "NVMe I/Os in flight per batch (1..4096)", "store"),
    _S("prepare_slots", Flag(), "pre-write new slab slots when idle (0 or 1)", "store"),
    _S("nvme_throttle_gbps", Number(low=0, low_open=True, unit="GB/s"),
       "emulate a slower NVMe, GB/s (benchmarks)", "store"),
    _S("durable", Flag(), "fdatasync data before the index commits (1)", "store"),
    _S("remote_url", Text(test=_remote_url), "shared remote tier: redis://..., mooncake://...",
       "store", secret=True),
    _S("remote_domain", Text(), "remote tier isolation domain (tenant salt)", "store", secret=True),
    _S("remote_write", Choice(options=("explicit", "through")), "remote writes: explicit or through", "store"),
    _S("remote_key", Text(), "remote tier secret, >= 16 bytes (MACs values)", "store", secret=True),
    _S("remote_key_file", Text(), "file holding the remote tier secret", "store"),
    _S("remote_encrypt", Flag(), "encrypt remote values (AES-GCM; needs a key)", "store"),
    _S("remote_username", Text(), "remote tier user when the URL names none", "remote"),
    _S("remote_password", Text(), "remote tier password when the URL names none", "remote", secret=True),
    _S("remote_tls_ca", Text(), "CA bundle for rediss:// when the URL names none", "remote"),
    # the engine plugins (vLLM, SGLang); see engine_adapter/config.py
    _S("data_dir", Text(), "plugin store directory", "plugin"),
    _S("nvme_gb", GB, "plugin NVMe tier capacity, GB (default 64)", "plugin"),
    _S("host_gb", GB, "plugin host frames before NVMe, GB (default 0)", "plugin"),
    _S("policy", Text(), "plugin pause policy (breakeven), a name, or off", "plugin"),
    _S("model", Text(test=_model), "plugin: price pauses as this model preset", "plugin"),
    _S("node", Text(test=_node), "plugin: price pauses on this node preset", "plugin"),
    _S("service_url", Text(), "plugin: ask a running kvtier serve for decisions", "plugin"),
    _S("service_timeout_s", SECONDS, "plugin: one service fetch's time limit, s (1.0)", "plugin"),
    _S("service_ttl_s", SECONDS, "plugin: reuse a service answer for, s (5.0)", "plugin"),
    _S("default_tier", Choice(options=(Tier.HOST.value, Tier.NVME.value)), "plugin: where unhinted blocks go (nvme)",
       "plugin"),
    _S("lifecycle", Choice(options=("forecast", "ttl", "off")), "plugin lifecycle: forecast, ttl or off", "plugin"),
    _S("ttl_idle_s", SECONDS, "plugin ttl lifecycle: forget after, s (300)", "plugin"),
    _S("ttl_demote_after_s", Number(low=0, unit="seconds"), "plugin ttl lifecycle: demote after, s (30)", "plugin"),
    _S("time_scale", SECONDS, "plugin: trace seconds per wall second (replays; 1)", "plugin"),
    _S("forget_after_s", Number(low=0, unit="seconds"), "plugin: forget idle trajectories after, s (600)", "plugin"),
    _S("max_trajectories", Number(low=1, integer=True), "plugin: trajectories kept at most (20000)", "plugin"),
    _S("default_tool", Text(test=_tool), "plugin: tool class of an unhinted pause (unhinted)", "plugin"),
    _S("prefix_trajectories", Flag(), "plugin: join the trajectory a prompt extends", "plugin"),
    _S("switch_interval_ms", Number(low=0, unit="ms"),
       "plugin: GIL switch interval, ms (0.5; 0: keep)", "plugin"),
    _S("io_threads", Number(low=1, high=64, integer=True), "vLLM plugin I/O threads (1..64, default 2)", "plugin"),
    _S("yield_to_prefill", Choice(options=("auto", "on", "off")),
       "vLLM plugin: moves wait out prefills (auto: CPU)", "plugin"),
    _S("hold_share", Number(low=0, high=0.9), "vLLM plugin: KV share held for paused agents (0.5)",
       "plugin"),
    _S("link_gbps", Number(low=0, low_open=True, unit="GB/s"),
       "vLLM CPU scale model: engine-CPU tier link, GB/s", "plugin"),
    _S("page_bytes", Number(low=1, integer=True), "SGLang plugin: expected page size, bytes", "plugin"),
    # the service and the command line
    _S("token", Text(), "bearer token: serve --token, clients, plugins", "service", secret=True),
    _S("data_root", Text(), "serve --data-dir must lie inside it (--data-root)", "service"),
    _S("traces", Text(), "folder of the full public traces (--traces)", "bench"),
    _S("peer_env_dir", Text(), "bench tiers --peer lmcache venv (--peer-env-dir)", "bench"),
    _S("peer_timeout_s", SECONDS, "bench tiers --peer: a peer call's limit, s (120)", "bench"),
)
BY_KEY: dict[str, Setting] = {s.key: s for s in SETTINGS}
BY_ENV: dict[str, Setting] = {s.env: s for s in SETTINGS}


def _check(s: Setting, value: Any, where: str, *, text: bool) -> Any:
    try:
        return s.kind.from_text(value) if text else s.kind.check(value)
    except ValueError as exc:
        msg = str(exc)
        if s.secret:
            msg = msg.split(", got ")[0]
        raise ValueError(f"{s.key} from {where} {msg}") from None


# ----------------------------------------------------------------------------- the config file
_FILE_CACHE: dict[tuple[str, float], dict[str, Any]] = {}


def config_file(env: Mapping[str, str] | None = None) -> str | None:
    """The config file's path (``$KVTIER_CONFIG``), or None."""
    return (os.environ if env is None else env).get(CONFIG_VAR) or None


def load_config_file(path: str | os.PathLike) -> dict[str, Any]:
    """The settings a config file holds (validated).  TOML (``.toml``), YAML (``.yaml``/``.yml``,
    needs PyYAML) or JSON; its keys at the top level or in a ``kvtier`` table.

    Raises:
        ValueError: the file cannot be read or parsed, holds an unknown key (named), or a bad value.
    """
    p = Path(path)
    try:
        stamp = p.stat().st_mtime
        cached = _FILE_CACHE.get((str(p), stamp))
        if cached is not None:
            return dict(cached)
        raw = p.read_bytes()
    except OSError as exc:
        raise ValueError(f"config file {str(p)!r}: {exc.strerror or exc}") from None
    doc = _parse_file(p, raw)
    if isinstance(doc, dict) and isinstance(doc.get("kvtier"), dict) and len(doc) == 1:
        doc = doc["kvtier"]
    if not isinstance(doc, dict):
        raise ValueError(f"config file {str(p)!r}: expected a table of settings at the top level")
    unknown = sorted(str(k) for k in doc if k not in BY_KEY)
    if unknown:
        raise ValueError(f"config file {str(p)!r}: unknown key(s) {unknown}; known: {sorted(BY_KEY)}")
    out = {k: _check(BY_KEY[k], v, f"config file {p.name}", text=False) for k, v in doc.items()}
    _FILE_CACHE[(str(p), stamp)] = dict(out)
    return out


def _parse_file(p: Path, raw: bytes) -> Any:
    suffix = p.suffix.lower()
    try:
        if suffix == ".toml":
            try:
                import tomllib
            except ModuleNotFoundError:     # Python 3.10
                from kvtier.extras import require
                tomllib = require("tomli", extra="all", feature="a TOML config file on Python 3.10")
            return tomllib.loads(raw.decode())
        if suffix in (".yaml", ".yml"):
            from kvtier.extras import require
            yaml = require("yaml", extra="all", feature="a YAML config file")
            return yaml.safe_load(raw.decode())
        if suffix == ".json":
            return json.loads(raw.decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"config file {str(p)!r}: {exc}") from None
    except Exception as exc:           # tomllib.TOMLDecodeError, yaml.YAMLError: a parse error
        if isinstance(exc, ImportError):
            raise
        raise ValueError(f"config file {str(p)!r}: {' '.join(str(exc).split())}") from None
    raise ValueError(f"config file {str(p)!r}: name it .toml, .yaml, .yml or .json")


# ----------------------------------------------------------------------------- the layers
def env_value(key: str, env: Mapping[str, str] | None = None) -> Any:
    """The checked value of ``key`` from its environment variable, or None when unset or empty.

    Raises:
        ValueError: the variable holds a bad value (the message names it).
    """
    s = BY_KEY[key]
    text = (os.environ if env is None else env).get(s.env)
    if not text:
        return None
    return _check(s, text, s.env, text=True)


def layered(keys: Iterable[str], explicit: Mapping[str, Any] | None = None, *, source: str = "explicit",
            env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The value of each of ``keys`` set in some layer, by :data:`PRECEDENCE` (a key set nowhere is
    left out, so the caller's default applies).  ``explicit`` values are checked too, named by
    ``source`` ("the vLLM plugin config", "--io-engine", ...); a value of None there counts as unset.

    Raises:
        ValueError: a bad value in any layer, or a bad config file (the key and the source named).
    """
    env = os.environ if env is None else env
    explicit = explicit or {}
    path = config_file(env)
    from_file = load_config_file(path) if path else {}
    out: dict[str, Any] = {}
    for key in keys:
        s = BY_KEY[key]
        if explicit.get(key) is not None:
            out[key] = _check(s, explicit[key], source, text=False)
            continue
        v = env_value(key, env)
        if v is not None:
            out[key] = v
        elif key in from_file:
            out[key] = from_file[key]
    return out


def check_environment(env: Mapping[str, str] | None = None) -> list[str]:
    """Check every ``KVTIER_*`` variable that is set and the config file it names; return the
    names of ``KVTIER_*`` variables that no setting reads (probably typos).

    Raises:
        ValueError: a bad value (one line naming the variable) or a bad config file.
    """
    from kvtier.env import DEPRECATED, EXTRA_VARS
    env = os.environ if env is None else env
    for s in SETTINGS:
        env_value(s.key, env)
    path = config_file(env)
    if path:
        load_config_file(path)
    return sorted(k for k in env if k.startswith("KVTIER_") and k not in BY_ENV and k != CONFIG_VAR
                  and k not in DEPRECATED and k not in EXTRA_VARS)
