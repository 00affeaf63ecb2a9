"""One configuration layer (kvtier.settings): the same key in the plugin JSON, a config file and a
KVTIER_* variable; one precedence rule; a bad value names the key and its source; every variable
the code reads is listed in `kvtier --help`."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from kvtier import env as kenv
from kvtier.engine_adapter.config import PluginConfig
from kvtier.settings import BY_ENV, PRECEDENCE, SETTINGS, layered, load_config_file
from kvtier.store.config import IoEngineKind, StoreConfig, Switch

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def clean_env(monkeypatch):
    import os
    for k in list(os.environ):
        if k.startswith("KVTIER_"):
            monkeypatch.delenv(k)
    return monkeypatch


def test_precedence_explicit_over_environment_over_file_over_default(clean_env, tmp_path):
    assert PRECEDENCE == ("explicit", "environment", "config file", "default")
    f = tmp_path / "kvtier.toml"
    f.write_text('io_engine = "threads"\nqueue_depth = 8\ndirect_io = "off"\n')
    clean_env.setenv("KVTIER_CONFIG", str(f))
    clean_env.setenv("KVTIER_QUEUE_DEPTH", "4")
    cfg = StoreConfig.from_env(tmp_path / "s", direct_io="on")
    assert (cfg.io_engine, cfg.queue_depth, cfg.direct_io) == ("threads", 4, "on")   # file, env, explicit
    assert cfg.io_engine is IoEngineKind.THREADS and cfg.direct_io is Switch.ON      # the strings are enum values
    assert cfg.durable is True                                                       # default
    # the plugins: the same keys, the same rule
    p = PluginConfig.parse({"data_dir": str(tmp_path), "io_engine": "auto"}, engine="vllm")
    assert p.io_engine is IoEngineKind.AUTO and p.direct_io is Switch.OFF
    clean_env.setenv("KVTIER_NVME_GB", "2")
    assert PluginConfig.parse({"data_dir": "/d"}, engine="sglang").nvme_bytes == 2 * 10**9
    assert PluginConfig.parse({"data_dir": "/d", "nvme_gb": 3}, engine="sglang").nvme_bytes == 3 * 10**9


@pytest.mark.parametrize("var, value, needle", [
    ("KVTIER_IO_ENGINE", "bogus", "io_engine from KVTIER_IO_ENGINE must be one of"),
    ("KVTIER_QUEUE_DEPTH", "x", "queue_depth from KVTIER_QUEUE_DEPTH must be an integer"),
    ("KVTIER_PREPARE_SLOTS", "maybe", "prepare_slots from KVTIER_PREPARE_SLOTS"),
    ("KVTIER_NVME_GB", "-1", "nvme_gb from KVTIER_NVME_GB must be a number of GB >= 0"),
])
def test_a_bad_variable_names_the_key_and_the_variable(clean_env, tmp_path, var, value, needle):
    clean_env.setenv(var, value)
    with pytest.raises(ValueError, match=re.escape(needle)):
        StoreConfig.from_env(tmp_path)
        PluginConfig.parse({"data_dir": "/d"}, engine="vllm")


def test_config_file_refuses_unknown_keys_and_bad_values(clean_env, tmp_path):
    f = tmp_path / "c.toml"
    f.write_text("[kvtier]\nlocality = 1\n")
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['locality'\]"):
        load_config_file(f)
    f.write_text("[kvtier]\nqueue_depth = 0\n")
    with pytest.raises(ValueError, match="queue_depth from config file c.toml"):
        load_config_file(f)
    j = tmp_path / "c.json"
    j.write_text('{"io_engine": "threads"}')
    assert load_config_file(j) == {"io_engine": "threads"}
    with pytest.raises(ValueError, match="secret|remote_url from the vllm plugin config"):
        PluginConfig.parse({"data_dir": "/d", "remote_url": "http://user:pw@h"}, engine="vllm")


def test_locality_is_refused_by_name(clean_env):
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['locality'\]"):
        PluginConfig.parse({"data_dir": "/d", "locality": "rack"}, engine="vllm")


def test_explicit_values_are_checked_and_named(clean_env):
    with pytest.raises(ValueError, match="io_engine from --io-engine"):
        layered(["io_engine"], {"io_engine": "fast"}, source="--io-engine")


def test_every_variable_read_in_the_code_is_listed_in_help():
    read = set()
    for folder in ("kvtier", "store", "tiering", "engine_adapter", "dma", "bench"):
        for f in (REPO / folder).rglob("*.py"):
            read |= set(re.findall(r"[\"'`](KVTIER_[A-Z][A-Z0-9_]*)", f.read_text()))
    read -= {"KVTIER_STAGES"}     # bench/timing.py's table of profiled stages, not a variable
    missing = sorted(v for v in read if v not in kenv.ENV_VARS and v not in kenv.DEPRECATED)
    assert not missing, missing
    out = subprocess.run([sys.executable, "-m", "kvtier", "--help"], capture_output=True, text=True).stdout
    for name in [*kenv.ENV_VARS, *kenv.DEPRECATED]:
        assert name in out, name
    assert all(len(line) <= 100 for line in out.splitlines())
    assert {s.env for s in SETTINGS} == set(BY_ENV)
