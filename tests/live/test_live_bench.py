"""``kvtier bench live`` end to end on a tiny engine: the JSON contract, every
configuration's greedy outputs equal to ``recompute``'s, paired differences."""
from __future__ import annotations

import json
import math

import pytest

from kvtier.cli.main import main
from kvtier.bench.sim.trace import make_session, write_trace


def test_bench_live_json_contract_and_outputs_equal(tiny_model, tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    write_trace(trace, [make_session(f"a{i}", 0.2 * i, [(300, 8, "pytest", 0.3), (60, 8, "bash", 0.1),
                                                        (60, 8, None, None)]) for i in range(3)])
    configs = ("resident", "recompute", "vllm-cpu-tier", "eager", "breakeven")
    assert main(["bench", "live", "--trace", str(trace), "--sessions", "3", "--turns", "3", "--max-context", "600",
                 "--layers", "2", "--hidden", "128", "--repeat", "2", "--configs", ",".join(configs),
                 "--model-dir", str(tmp_path / "models"), "--plots", str(tmp_path / "plots"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc["configs"]) == set(configs) and doc["repeat"] == 2 and doc["reference"] == "breakeven"
    assert doc["workload"]["resumes"] == 6
    sz = doc["sizes"]
    # the engine's cache and kvtier's host tier each hold less than the paused working set
    ws = doc["workload"]["paused_working_set_bytes"]
    assert sz["engine_blocks"] * sz["block_bytes"] < ws and sz["host_bytes"] < ws
    assert sz["resident_blocks"] * sz["block_bytes"] >= ws
    for name, row in doc["configs"].items():
        for k in ("resume_ttft_p50_s", "resume_ttft_p99_s", "jct_mean_s"):
            assert row[k] > 0 and math.isfinite(row[k]) and row[k + "_se"] >= 0
        assert row["outputs_equal"] is True, name                    # no wrong KV block anywhere
        assert row["resumes"] == 6
        # what the JCT is made of: every turn's engine time lies inside its session's JCT
        n = doc["workload"]["sessions"]
        assert 0 < row["engine_busy_s"] <= row["jct_mean_s"] * n + 1e-6 and row["queue_wait_s"] >= 0
        assert row["errors"]["load_failures"] == 0 and row["errors"]["contained_errors"] == 0
    assert doc["configs"]["resident"]["misses"] == 0                  # the limit never loses its state
    assert doc["configs"]["breakeven"]["stored_chunks_by_tier"]       # kvtier stored blocks
    be = doc["configs"]["breakeven"]
    assert sum(be["decisions"].values()) > 0 and be["priced"]["source"] == "engine"
    assert be["priced"]["nvme_read_gbps"] > 0 and 0 < be["priced"]["host_bytes"] <= sz["host_bytes"]   # the real tier
    assert "priced" not in doc["configs"]["recompute"] and "decisions" not in doc["configs"]["resident"]
    # what kvtier's threads cost a resume: none without kvtier, some under its lifecycle
    assert 0 <= doc["configs"]["resident"]["resume_kvtier_cpu_s"] < be["resume_kvtier_cpu_s"]
    assert be["resume_engine_waits"] >= 0
    # kvtier's plugin lowers the engine process's switch interval; the benchmark restores it between runs
    assert be["switch_interval_ms"] == 0.5 and doc["configs"]["recompute"]["switch_interval_ms"] > 0.5
    assert set(doc["paired"]) == set(configs) - {"breakeven"}
    for d in doc["paired"].values():
        assert set(d) == {"resume_ttft_p50_s", "resume_ttft_p99_s", "jct_mean_s", "engine_busy_s", "queue_wait_s",
                          "resume_kvtier_cpu_s", "resume_engine_waits"}
        assert all(x["resolved"] in (-1, 0, 1) for x in d.values())
    assert [p.endswith("ttft_cdf.png") for p in doc["plots"]] == [True]


def test_bench_live_scale_model_labels_its_tables_and_matches_the_targets_ratios(tiny_model, tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    write_trace(trace, [make_session(f"a{i}", 0.2 * i, [(300, 8, "pytest", 0.3), (60, 8, None, None)])
                        for i in range(2)])
    configs = ("recompute", "vllm-cpu-tier", "breakeven")
    assert main(["bench", "live", "--trace", str(trace), "--sessions", "2", "--turns", "2", "--max-context", "400",
                 "--layers", "2", "--hidden", "128", "--repeat", "1", "--configs", ",".join(configs),
                 "--scale-to", "pcie4", "--model-dir", str(tmp_path / "models"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    sm = doc["scale_model"]
    assert sm["label"] == "scale model of pcie4" and sm["time_scale"] > 0
    for row in sm["rows"]:                      # every set quantity has the target's ratio to a prefill
        if row["quantity"] != "prefill":
            assert row["ours_ratio"] == pytest.approx(row["target_ratio"], rel=1e-6), row["quantity"]
    be = doc["configs"]["breakeven"]
    assert be["priced"]["source"] == "preset"                    # priced as the target node
    for name in configs:
        assert doc["configs"][name]["outputs_equal"] is True, name
