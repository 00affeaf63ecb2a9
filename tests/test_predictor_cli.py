"""`kvtier bench predictor` on the real held-out tool durations in ../shared/traces."""
from __future__ import annotations

import json

import pytest

from kvtier.cli.main import main
from kvtier.bench.predictor_eval import default_traces_dir, evaluate, load_datasets

TRACES = default_traces_dir()
needs_traces = pytest.mark.skipif(not (TRACES / "continuum").is_dir(),
                                  reason=f"real traces not found under {TRACES}")


@needs_traces
def test_real_held_out_durations_calibrated_and_better_than_running_mean():
    # Every held-out call is scored before the predictor sees it (prequential).
    datasets = load_datasets(TRACES)
    names = {d.name for d in datasets}
    assert {"swe_smith", "swe_agent", "tracelab_sample"} <= names
    result = evaluate(datasets)
    pooled = result["pooled"]
    assert pooled["kvtier"]["n"] == sum(len(d.calls) for d in datasets) >= 150
    # The [p10, p90] interval covers 70-90% of real durations it had not seen...
    assert 0.70 <= pooled["kvtier"]["coverage_p10_p90"] <= 0.90
    # ...and its quantiles beat Continuum's running mean and the global median.
    assert pooled["kvtier"]["pinball_loss_s"] < pooled["running_mean"]["pinball_loss_s"]
    assert pooled["kvtier"]["pinball_loss_s"] < pooled["global_median"]["pinball_loss_s"]


@needs_traces
def test_cli_json(capsys):
    rc = main(["bench", "predictor", "--traces", str(TRACES), "--json", "--trajectories", "300", "--pauses", "300"])
    out = capsys.readouterr().out
    assert rc == 0
    doc = json.loads(out)          # exactly one JSON document on stdout
    assert set(doc["pooled"]) >= {"kvtier", "running_mean", "global_median"}
    assert doc["summary"]["pinball_vs_running_mean"] < 1.0
    d = doc["decide"]
    assert d["trajectories"] == 300 and d["pauses"] == 300
    assert 0 < d["decide_us"]["p50"] <= d["decide_us"]["p99"]
    assert sum(d["actions"].values()) == 300


@needs_traces
def test_cli_table(capsys):
    assert main(["bench", "predictor", "--traces", str(TRACES), "--skip-decide"]) == 0
    out = capsys.readouterr().out
    assert "running_mean" in out and "pooled" in out


def test_cli_bad_input(tmp_path, capsys):
    assert main(["bench", "predictor", "--traces", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["bench", "predictor", "--traces", str(tmp_path)]) == 2     # exists, but no traces
    assert "no held-out tool durations" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["bench", "predictor", "--pauses", "0"])
    assert exc.value.code == 2


@pytest.mark.parametrize("flag_value", ["1e30", "inf", "2.5"])
def test_counts_out_of_range_are_refused(capsys, flag_value):
    # "1e30" used to be accepted and hang building 1e30 paused trajectories; "inf" was an OverflowError
    with pytest.raises(SystemExit) as exc:
        main(["bench", "predictor", "--trajectories", flag_value])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--trajectories" in err and err.count("\n") == 1


@pytest.mark.parametrize("rel, text, needle", [
    # a CSV without the expected header used to be a KeyError traceback
    ("continuum/swe_smith_5traj_tool_durations.csv", "garbage\n", "missing column"),
    # a NaN or negative duration used to be scored (or fail deep in the predictor)
    ("continuum/swe_smith_5traj_tool_durations.csv", "tool,execution_time_seconds,cmd_head\nbash,-5,ls\n",
     "line 2: duration '-5'"),
    # a JSON line that is not an object used to be an AttributeError traceback
    ("tracelab/example_sanitized_round_trace.jsonl", "[1]\n", "line 1: expected an object"),
    # an empty file used to end in a ZeroDivisionError traceback
    ("tracelab/example_sanitized_round_trace.jsonl", "", "no held-out tool durations"),
])
def test_malformed_trace_files_exit_2_naming_the_file(tmp_path, capsys, rel, text, needle):
    f = tmp_path / rel
    f.parent.mkdir(parents=True)
    f.write_text(text)
    assert main(["bench", "predictor", "--traces", str(tmp_path), "--skip-decide", "--json"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and needle in err and err.count("\n") == 1 and "Traceback" not in err
