"""The plugins lower the engine process's thread switch interval, never raise it
(engine_adapter/switch_interval.py), and the setting is one key of the config."""
from __future__ import annotations

import math
import sys

import pytest

from kvtier.engine_adapter.config import PluginConfig
from kvtier.engine_adapter.switch_interval import lower_switch_interval


@pytest.fixture
def interval():
    was = sys.getswitchinterval()
    yield
    sys.setswitchinterval(was)


def test_lowers_a_higher_interval_and_returns_the_old_one(interval):
    sys.setswitchinterval(0.005)
    assert lower_switch_interval(0.5) == pytest.approx(0.005)
    assert sys.getswitchinterval() == pytest.approx(0.0005)


def test_never_raises_a_lower_interval_and_zero_leaves_it(interval):
    sys.setswitchinterval(0.0001)
    assert lower_switch_interval(0.5) is None
    assert sys.getswitchinterval() == pytest.approx(0.0001)
    sys.setswitchinterval(0.005)
    assert lower_switch_interval(0) is None
    assert sys.getswitchinterval() == pytest.approx(0.005)


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf, "0.5", True])
def test_bad_values_are_refused(interval, bad):
    sys.setswitchinterval(0.005)
    with pytest.raises(ValueError, match="switch_interval_ms"):
        lower_switch_interval(bad)
    assert sys.getswitchinterval() == pytest.approx(0.005)


def test_plugin_config_default_env_and_explicit(monkeypatch):
    assert PluginConfig.parse({"data_dir": "/d"}, engine="vllm").switch_interval_ms == 0.5
    monkeypatch.setenv("KVTIER_SWITCH_INTERVAL_MS", "0")
    assert PluginConfig.parse({"data_dir": "/d"}, engine="sglang").switch_interval_ms == 0.0
    assert PluginConfig.parse({"data_dir": "/d", "switch_interval_ms": 2}, engine="vllm").switch_interval_ms == 2.0
