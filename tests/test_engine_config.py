"""One plugin config for both engines (engine_adapter/config.py): validated once,
the bad key named, the same settings mean the same thing in vLLM and SGLang."""
from __future__ import annotations

import dataclasses

import pytest

from kvtier.engine_adapter.config import GB, LifecycleKind, PluginConfig, YieldToPrefill, slug
from kvtier.store.config import IoEngineKind, RemoteWrite, Switch
from kvtier.util.tiers import Tier


def test_same_settings_same_config_in_both_engines():
    opts = {"data_dir": "/d", "nvme_gb": 2.5, "host_gb": 0.5, "policy": "breakeven", "model": "qwen3-8b"}
    v, s = PluginConfig.parse(opts, engine="vllm"), PluginConfig.parse(opts, engine="sglang")
    assert v == s and v.nvme_bytes == int(2.5 * GB) and v.host_bytes == GB // 2
    assert v.lifecycle == "forecast"                       # a policy implies the forecast lifecycle
    # the forecast is on by default, priced with the engine's geometry (no preset needed); "off" turns it off
    d = PluginConfig.parse({"data_dir": "/d"}, engine="vllm")
    assert (d.policy, d.model, d.lifecycle, d.default_tool, d.prefix_trajectories) == \
        ("breakeven", None, "forecast", "unhinted", True)
    off = PluginConfig.parse({"data_dir": "/d", "policy": "off"}, engine="vllm")
    assert (off.policy, off.lifecycle) == (None, "off")
    assert PluginConfig.parse({"data_dir": "/d", "service_url": "http://x"}, engine="vllm").policy is None
    p = PluginConfig.parse({"data_dir": "/d", "forget_after_s": 60, "max_trajectories": 500}, engine="sglang")
    assert (p.forget_after_s, p.max_trajectories) == (60.0, 500)
    with pytest.raises(dataclasses.FrozenInstanceError):
        v.nvme_bytes = 1                                   # frozen
    # SGLang's own loader keys pass through its parse only
    PluginConfig.parse({"data_dir": "/d", "backend_name": "kvtier", "interface_v1": 1}, engine="sglang")
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['backend_name'\]"):
        PluginConfig.parse({"data_dir": "/d", "backend_name": "kvtier"}, engine="vllm")


@pytest.mark.parametrize("opts, engine, needle", [
    ({}, "vllm", "data_dir"),
    ({"data_dir": "/d", "nvme_gbs": 1}, "sglang", "nvme_gbs"),
    ({"data_dir": "/d", "nvme_gb": -1}, "vllm", "nvme_gb"),
    ({"data_dir": "/d", "nvme_gb": 0, "host_gb": 0}, "vllm", "nowhere"),
    ({"data_dir": "/d", "model": "qwen3-9000b"}, "vllm", "unknown model preset"),
    ({"data_dir": "/d", "node": "my-laptop"}, "vllm", "unknown node preset"),
    ({"data_dir": "/d", "default_tool": "a\x00b"}, "vllm", "default_tool"),
    ({"data_dir": "/d", "default_tool": "x" * 200}, "sglang", "default_tool"),
    ({"data_dir": "/d", "prefix_trajectories": "yes"}, "vllm", "prefix_trajectories"),
    ({"data_dir": "/d", "policy": "breakeven", "service_url": "http://x"}, "vllm", "either"),
    ({"data_dir": "/d", "default_tier": "disk"}, "sglang", "default_tier"),
    ({"data_dir": "/d", "policy": "off", "lifecycle": "forecast"}, "vllm", "lifecycle"),
    ({"data_dir": "/d", "lifecycle": "weekly"}, "vllm", "lifecycle"),
    ({"data_dir": "/d", "io_threads": 0}, "vllm", "io_threads"),
    ({"data_dir": "/d", "page_bytes": 0}, "sglang", "page_bytes"),
    ({"data_dir": "/d", "page_bytes": 4096}, "vllm", "page_bytes"),
    ({"data_dir": "/d", "time_scale": 0}, "vllm", "time_scale"),
    ({"data_dir": "/d", "forget_after_s": -1}, "sglang", "forget_after_s"),
    ({"data_dir": "/d", "max_trajectories": 0}, "vllm", "max_trajectories"),
    ({"data_dir": "/d", "max_trajectories": 1.5}, "vllm", "max_trajectories"),
    ({"data_dir": "/d", "durable": "yes"}, "sglang", "durable"),
    ({"data_dir": "/d", "switch_interval_ms": -0.5}, "vllm", "switch_interval_ms"),
    ({"data_dir": "/d", "switch_interval_ms": "fast"}, "sglang", "switch_interval_ms"),
])
def test_bad_options_name_the_key(opts, engine, needle):
    with pytest.raises(ValueError, match=needle):
        PluginConfig.parse(opts, engine=engine)


def test_host_to_nvme_fallback_and_slug():
    cfg = PluginConfig.parse({"data_dir": "/d", "default_tier": "host"}, engine="vllm")
    assert cfg.effective_default_tier is Tier.NVME         # no host tier configured
    assert slug("Qwen/Qwen3-8B") == "Qwen-Qwen3-8B" and slug("///") == "model"


def test_the_modes_are_enums_whose_values_are_the_option_strings():
    cfg = PluginConfig.parse({"data_dir": "/d", "lifecycle": "ttl", "default_tier": "host", "host_gb": 1,
                              "yield_to_prefill": "on"}, engine="vllm")
    assert cfg.lifecycle is LifecycleKind.TTL and cfg.default_tier is Tier.HOST
    assert cfg.yield_to_prefill is YieldToPrefill.ON and cfg.effective_default_tier is Tier.HOST
    assert f"{cfg.lifecycle}" == "ttl" and cfg.lifecycle == "ttl"          # the option string, printed and compared
    # made directly, a name is taken as its member; a tier the plugin cannot store to is refused
    assert PluginConfig(data_dir="/d", lifecycle="forecast").lifecycle is LifecycleKind.FORECAST
    with pytest.raises(ValueError, match="default_tier"):
        PluginConfig(data_dir="/d", default_tier="remote")
    with pytest.raises(ValueError, match="lifecycle"):
        PluginConfig(data_dir="/d", lifecycle="sometimes")
    # the store's modes it passes on are the store's enums
    s = PluginConfig(data_dir="/d", io_engine="threads", direct_io="off", remote_write="through")
    assert (s.io_engine, s.direct_io, s.remote_write) == (IoEngineKind.THREADS, Switch.OFF, RemoteWrite.THROUGH)
    assert s.store_options()["remote_write"] is RemoteWrite.THROUGH
    with pytest.raises(ValueError, match="direct_io"):
        PluginConfig(data_dir="/d", direct_io="sometimes")
