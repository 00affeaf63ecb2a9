"""`kvtier bench simulate` and `kvtier bench trace ...` end to end (in-process CLI)."""
from __future__ import annotations

import json

import pytest

from kvtier.cli.main import main
from kvtier.bench.sim.runner import DEFAULT_POLICIES, REQUIRED_METRICS
from kvtier_testutil import run_cli


def test_synth_then_simulate_json_has_every_policy_and_metric(tmp_path, capsys):
    trace = tmp_path / "agents.jsonl"
    # write a small synthetic workload
    rc, out, _ = run_cli(capsys, "bench", "trace", "synth", "--out", str(trace), "--sessions", "12",
                         "--rate", "2", "--seed", "3", "--json")
    assert rc == 0
    doc = json.loads(out)
    assert doc["lines"] == sum(1 for _ in trace.open()) and doc["summary"]["sessions"] == 12
    # replay it through the default policy set: one JSON document, nothing else on stdout
    rc, out, _ = run_cli(capsys, "bench", "simulate", "--trace", str(trace), "--json")
    assert rc == 0
    doc = json.loads(out)
    assert set(DEFAULT_POLICIES) <= set(doc["policies"])
    for name, m in doc["policies"].items():
        for key in REQUIRED_METRICS:
            assert isinstance(m[key], (int, float)), (name, key)
        assert m["sessions_done"] == 12
    assert doc["node"]["model"] == "gqa-70b"


def test_table_output_and_plots(tmp_path, capsys):
    rc, out, _ = run_cli(capsys, "bench", "simulate", "--synth", "8", "--policies", "retain,oracle,breakeven",
                         "--plots", str(tmp_path / "p"))
    assert rc == 0
    assert "retain" in out and "JCT" in out
    for name in ("occupancy.png", "stall_cdf.png", "vs_oracle.png"):
        png = tmp_path / "p" / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_malformed_line_stops_or_is_skipped_as_asked(tmp_path, capsys):
    trace = tmp_path / "bad.jsonl"
    good = {"session": "s", "round": 0, "arrival_s": 0, "new_tokens": 100, "output_tokens": 10,
            "tool": None, "tool_wait_s": None}
    trace.write_text(json.dumps(good) + "\n" + '{"session": "t", "round": 0}\n')
    # stop (default): exit 2, one line naming line 2, no traceback
    rc, out, err = run_cli(capsys, "bench", "simulate", "--trace", str(trace), "--json", "--policies", "retain")
    assert rc == 2 and out == ""
    assert "line 2" in err and "Traceback" not in err and err.strip().count("\n") == 0
    # skip: the run continues and reports the skipped line
    rc, out, err = run_cli(capsys, "bench", "simulate", "--trace", str(trace), "--json", "--policies", "retain",
                           "--on-error", "skip")
    assert rc == 0
    doc = json.loads(out)
    assert doc["problems"] and doc["problems"][0].startswith("line 2:")
    assert doc["policies"]["retain"]["sessions_done"] == 1
    assert "line 2" in err


def test_bad_input_exits_2_with_one_line(tmp_path, capsys):
    rc, _, err = run_cli(capsys, "bench", "simulate", "--synth", "3", "--policies", "retain,nosuch")
    assert rc == 2 and "nosuch" in err and "known" in err
    rc, _, err = run_cli(capsys, "bench", "simulate", "--trace", str(tmp_path / "missing.jsonl"))
    assert rc == 2 and "cannot read" in err
    with pytest.raises(SystemExit) as ei:
        main(["bench", "simulate", "--synth", "3", "--ceiling", "1.5"])
    assert ei.value.code == 2


def test_trace_stats_reads_back_a_written_trace(tmp_path, capsys):
    trace = tmp_path / "a.jsonl"
    run_cli(capsys, "bench", "trace", "synth", "--out", str(trace), "--sessions", "5", "--json")
    rc, out, _ = run_cli(capsys, "bench", "trace", "stats", str(trace), "--json")
    assert rc == 0 and json.loads(out)["sessions"] == 5


def test_write_through_flag_reaches_the_node_and_every_policy(capsys):
    # Default: host copies are the only copies; nothing is written through.
    rc, out, _ = run_cli(capsys, "bench", "simulate", "--synth", "20", "--rate", "2",
                         "--policies", "offload_host,breakeven", "--json")
    doc = json.loads(out)
    assert rc == 0 and doc["node"]["write_through"] is False
    assert all(m["write_through"]["written_gb"] == 0 for m in doc["policies"].values())
    # --write-through: every policy's host copies are written to NVMe in the background.
    rc, out, _ = run_cli(capsys, "bench", "simulate", "--synth", "20", "--rate", "2",
                         "--policies", "offload_host,breakeven", "--write-through", "--json")
    doc = json.loads(out)
    assert rc == 0 and doc["node"]["write_through"] is True
    for name, m in doc["policies"].items():
        assert m["write_through"]["on"] and m["sessions_done"] == 20, name
    assert doc["policies"]["offload_host"]["write_through"]["written_gb"] > 0
    # the prefetch rule: by default a prefetch yields to waiting admissions; the flag restores
    # the old rule, and it reaches the node
    assert doc["node"]["prefetch_past_ceiling"] is False
    rc, out, _ = run_cli(capsys, "bench", "simulate", "--synth", "20", "--rate", "2",
                         "--policies", "breakeven", "--prefetch-past-ceiling", "--json")
    doc = json.loads(out)
    assert rc == 0 and doc["node"]["prefetch_past_ceiling"] is True
    assert doc["policies"]["breakeven"]["sessions_done"] == 20


def test_hostile_inputs_exit_2_before_any_work(tmp_path, capsys):
    trace = tmp_path / "a.jsonl"
    run_cli(capsys, "bench", "trace", "synth", "--out", str(trace), "--sessions", "3", "--json")
    # a time scale that pushes arrivals to infinity used to hang the simulator
    rc, out, err = run_cli(capsys, "bench", "simulate", "--trace", str(trace), "--time-scale", "1e308", "--json")
    assert rc == 2 and out == "" and "--time-scale" in err and err.count("\n") == 1
    # --plots naming an existing file used to end in a FileExistsError traceback
    rc, out, err = run_cli(capsys, "bench", "simulate", "--trace", str(trace), "--plots", str(trace), "--json")
    assert rc == 2 and out == "" and "--plots" in err and "is a file" in err
    # an empty trace: stats and the converters refuse it instead of writing an empty trace
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    rc, out, err = run_cli(capsys, "bench", "trace", "stats", str(empty), "--json")
    assert rc == 2 and out == "" and "no complete session" in err
    rc, out, err = run_cli(capsys, "bench", "simulate", "--trace", str(empty), "--json")
    assert rc == 2 and out == "" and "no complete session" in err
    dest = tmp_path / "out.jsonl"
    rc, out, err = run_cli(capsys, "bench", "trace", "tracelab", "--input", str(empty), "--out", str(dest), "--json")
    assert rc == 2 and out == "" and "nothing written" in err and not dest.exists()


def test_sweep_link_reports_each_speed_against_the_bound_and_plots(tmp_path, capsys):
    rc, out, _ = run_cli(capsys, "bench", "simulate", "--synth", "10", "--rate", "2", "--policies",
                         "breakeven,lru,offload_host", "--sweep-link", "25,512", "--plots", str(tmp_path),
                         "--json")
    assert rc == 0
    sw = json.loads(out)["sweep"]
    assert sw["link_gbps"] == [25.0, 512.0]
    for i in range(2):
        # the bound is the best any policy reached, so no policy is below it and one is on it
        jcts = [sw["policies"][n]["jct_mean_s"][i] for n in sw["policies"]]
        assert sw["bound"]["jct_mean_s"][i] == min(jcts)
        assert all(r["jct_mean"][i] >= 1.0 for r in sw["vs_bound"].values())
    assert (tmp_path / "sim-sweep-link.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("argv, word", [(("--sweep-link", "25,0"), "positive"),
                                         (("--sweep-link", "25,25"), "repeats"),
                                         (("--sweep-link", "25", "--link-gbps", "50"), "--link-gb-per-s")])
def test_sweep_link_refuses_bad_speeds(capsys, argv, word):
    rc, out, err = run_cli(capsys, "bench", "simulate", "--synth", "4", "--policies", "lru", *argv, "--json")
    assert rc == 2 and out == "" and word in err


def test_simulate_table_fits_an_80_column_terminal_and_pipes_keep_every_column(capsys, monkeypatch):
    argv = ("bench", "simulate", "--synth", "12", "--rate", "1", "--policies", "breakeven,oracle,lru")
    monkeypatch.setenv("COLUMNS", "80")          # what an 80-column terminal reports
    rc, narrow, _ = run_cli(capsys, *argv)
    assert rc == 0 and "…" not in narrow
    assert max(len(line) for line in narrow.splitlines()) <= 80
    assert "narrow terminal: columns" in narrow  # it says which columns it left out
    monkeypatch.delenv("COLUMNS")                 # a pipe: every column, nothing cut
    rc, piped, _ = run_cli(capsys, *argv)
    assert rc == 0 and "…" not in piped and "narrow terminal" not in piped
    for col in ("idle HBM GB*s", "peak HBM", "recomputed tok", "vs oracle"):
        assert col in piped
