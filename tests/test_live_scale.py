"""The live benchmark's scale model, pure parts (no vLLM): the settings that
make every move and wait keep the target node's ratio to a prefill, the
workload stretched by the factor, and the configurations' options."""
from __future__ import annotations

import pytest

from kvtier.bench.live.configs import Sizes, spec_for
from kvtier.bench.live.scale import Calibration, calibration_contexts, scale_model
from kvtier.bench.live.workload import LiveSession, LiveTurn, paused_contexts, scale_times
from kvtier.engine_adapter.config import PluginConfig
from kvtier.tiering.model.costmodel import breakeven_wait, t_nvme_read, t_recompute, t_reload
from kvtier.tiering.model.presets import get_node, get_preset

OURS = Calibration(prefill_s_per_1k=0.2, kv_bytes_per_token=4096.0, samples=((1000, 0.2),))


@pytest.mark.parametrize("node", ["h100x8", "pcie4"])
def test_every_ratio_to_a_prefill_is_the_targets(node):
    sm = scale_model(node, OURS, context_tokens=1200)
    geo, hw = get_preset("llama-3.1-70b"), get_node(node)
    # f: our wall seconds per target second, from the prefill
    assert sm.f == pytest.approx(0.2 / t_recompute(geo, 1000, hw))
    nbytes = geo.kv_bytes(1200)
    ours_prefill = 0.2 * 1.2                                         # s for 1200 tokens here
    # our link carries our 1200 tokens' bytes in f x the target's reload time ...
    ours_link = 4096 * 1200 / (sm.link_gbps * 1e9)
    assert ours_link == pytest.approx(sm.f * t_reload(nbytes, hw))
    # ... so reload/prefill (and NVMe read/prefill, break-even/prefill) are the target's
    target_prefill = t_recompute(geo, 1200, hw)
    assert ours_link / ours_prefill == pytest.approx(t_reload(nbytes, hw) / target_prefill)
    ours_nvme = 4096 * 1200 / (sm.nvme_gbps * 1e9)
    assert ours_nvme / ours_prefill == pytest.approx(t_nvme_read(nbytes, hw) / target_prefill)
    for r in sm.rows():
        assert r["ours_ratio"] == pytest.approx(r["target_ratio"]), r["quantity"]
    be = {r["quantity"]: r for r in sm.rows()}["break-even wait"]
    assert be["target_s"] == pytest.approx(breakeven_wait(nbytes, hw)) and be["ours_s"] == pytest.approx(sm.f * be["target_s"])
    # a prefill measured slower in the runs than in the calibration: the achieved ratios say so
    slower = {r["quantity"]: r for r in sm.rows(prefill_s_per_1k=0.4)}
    assert slower["link (one way)"]["ours_ratio"] == pytest.approx(slower["link (one way)"]["target_ratio"] / 2)
    doc = sm.as_dict(run_prefill_s_per_1k=0.4)
    assert doc["label"] == f"scale model of {node}" and doc["node"] == node and doc["model"] == "llama-3.1-70b"
    assert doc["achieved"][1]["ours_ratio"] == pytest.approx(slower["link (one way)"]["ours_ratio"])


def test_the_slower_link_node_makes_a_reload_dearer_against_a_prefill():
    fast, slow = scale_model("h100x8", OURS, context_tokens=1000), scale_model("pcie4", OURS, context_tokens=1000)
    ratio = {sm.target.name: {r["quantity"]: r["target_ratio"] for r in sm.rows()} for sm in (fast, slow)}
    assert ratio["pcie4"]["link (one way)"] > ratio["h100x8"]["link (one way)"]
    # (NVMe is the other way round: h100x8's one 7 GB/s NVMe serves eight GPUs' prefill)
    assert ratio["pcie4"]["NVMe read"] < ratio["h100x8"]["NVMe read"]


def test_unknown_targets_and_bad_calibrations_are_refused():
    with pytest.raises(ValueError, match="known: h100x8, pcie4"):
        scale_model("laptop", OURS, context_tokens=100)
    with pytest.raises(ValueError, match="prefill_s_per_1k"):
        Calibration(prefill_s_per_1k=0.0, kv_bytes_per_token=1.0)
    with pytest.raises(ValueError, match="context_tokens"):
        scale_model("h100x8", OURS, context_tokens=0)


def sessions():
    return [LiveSession("s0", 0.0, None, 0, (LiveTurn(300, 8, "pytest", 1.5), LiveTurn(60, 8, "bash", 0.5),
                                             LiveTurn(60, 8, None, None))),
            LiveSession("s1", 2.0, "sys", 64, (LiveTurn(500, 8, "grep", 3.0), LiveTurn(40, 8, None, None)))]


def test_the_workload_is_stretched_by_the_factor_and_calibrated_at_its_paused_contexts():
    ss = sessions()
    assert paused_contexts(ss) == [308, 376, 572]
    assert calibration_contexts(paused_contexts(ss)) == [308, 376, 572]
    assert calibration_contexts([100, 100, 100, 200]) == [100, 200]
    stretched = scale_times(ss, 5.0)
    assert [s.arrival_s for s in stretched] == [0.0, 10.0]
    assert [t.wait_s for t in stretched[0].turns] == [7.5, 2.5, None]
    assert [t.new_tokens for t in stretched[1].turns] == [500, 40] and stretched[1].prefix_id == "sys"
    with pytest.raises(ValueError):
        scale_times(ss, 0.0)


def test_a_scale_model_run_gives_kvtier_and_vllms_cpu_tier_its_settings(tmp_path):
    sm = scale_model("h100x8", OURS, context_tokens=1000)
    sz = Sizes(engine_blocks=40, resident_blocks=200, block_bytes=1 << 17, cpu_bytes=2 << 20, host_bytes=4 << 20,
               nvme_bytes=64 << 20)
    kw = dict(model="m", sizes=sz, data_dir=tmp_path, max_model_len=1000)
    for name in ("lru", "ttl", "eager", "point", "breakeven", "session-ttl"):
        spec, _ = spec_for(name, **kw, nvme_gbps=9.0, scale=sm)
        cfg = PluginConfig.parse(spec.kvtier, engine="vllm")         # the plugin takes every option
        assert (cfg.model, cfg.node, cfg.time_scale) == ("llama-3.1-70b", "h100x8", sm.f), name
        assert cfg.link_gbps == sm.link_gbps and cfg.nvme_throttle_gbps == sm.nvme_gbps   # the model's NVMe wins
    cpu, _ = spec_for("vllm-cpu-tier", **kw, scale=sm)
    assert cpu.kv_transfer_config()["kv_connector_extra_config"]["link_gbps"] == sm.link_gbps
    for name in ("resident", "recompute"):                             # they move nothing
        spec, _ = spec_for(name, **kw, scale=sm)
        assert spec.kv_transfer_config() is None and spec.link_gbps is None
    # without a scale model: no link anywhere, kvtier priced as the engine is
    plain, _ = spec_for("breakeven", **kw)
    assert not {"model", "node", "time_scale", "link_gbps"} & set(plain.kvtier)
    assert "link_gbps" not in spec_for("vllm-cpu-tier", **kw)[0].kv_transfer_config()["kv_connector_extra_config"]


def test_the_configurations_of_the_settling_benchmark(tmp_path):
    sz = Sizes(engine_blocks=40, resident_blocks=200, block_bytes=1 << 17, cpu_bytes=2 << 20, host_bytes=4 << 20,
               nvme_bytes=64 << 20)
    kw = dict(model="m", sizes=sz, data_dir=tmp_path, max_model_len=1000)
    lru, hints = spec_for("lru", **kw)
    assert PluginConfig.parse(lru.kvtier, engine="vllm").hold_share == 0 and not hints     # lru never holds
    ttl, hints = spec_for("ttl", **kw)
    assert ttl.kvtier["policy"] == "ttl_reload" and hints                                 # Continuum's hold
    assert spec_for("eager", **kw)[0].kvtier["policy"] == "eager"
    st, hints = spec_for("session-ttl", **kw, time_scale=0.5)
    assert st.kvtier["lifecycle"] == "ttl" and st.kvtier["ttl_idle_s"] == 150.0 and hints


@pytest.mark.parametrize("args, message", [
    (("--scale-to", "h100x8", "--nvme-gbps", "1"), "--nvme-gbps does not apply with --scale-to"),
    (("--url", "http://x", "--scale-to", "h100x8"), "--scale-to does not apply with --url"),
])
def test_scale_to_flags_that_cannot_go_together_are_refused(capsys, args, message):
    from kvtier.cli.main import main
    assert main(["bench", "live", *args]) == 2
    assert message in capsys.readouterr().err


def test_an_unknown_scale_to_node_is_refused_naming_the_known_ones(capsys):
    from kvtier.cli.main import main
    with pytest.raises(SystemExit) as exc:
        main(["bench", "live", "--scale-to", "laptop"])
    assert exc.value.code == 2 and "choose from 'h100x8', 'pcie4'" in capsys.readouterr().err
