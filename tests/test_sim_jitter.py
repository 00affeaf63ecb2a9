"""The jitter ensemble: `kvtier bench simulate ... --jitter K` (bench/sim/jitter.py)."""
from __future__ import annotations

import json

import pytest

from kvtier.bench.sim.jitter import RESOLVED_SE, jitter_waits, summarize_ensemble
from kvtier.bench.sim.synth import SynthConfig, synthesize
from kvtier.cli.main import main
from kvtier_testutil import run_cli

POLS = "breakeven,lru,offload_host,retain"


def test_a_nudged_copy_lengthens_only_tool_waits_each_by_less_than_the_jitter():
    sessions = synthesize(SynthConfig(sessions=40, rate_per_s=0.6, seed=2))
    assert jitter_waits(sessions, 0, 1e-3) == list(sessions)
    one = jitter_waits(sessions, 1, 1e-3)
    assert one == jitter_waits(sessions, 1, 1e-3)           # seeded by the run
    assert one != jitter_waits(sessions, 2, 1e-3)
    nudged = 0
    for s, t in zip(sessions, one):
        assert s.id == t.id and len(s.rounds) == len(t.rounds)
        for r, q in zip(s.rounds, t.rounds):
            assert (r.arrival_s, r.new_tokens, r.output_tokens, r.tool) == (q.arrival_s, q.new_tokens, q.output_tokens, q.tool)
            if r.tool_wait_s is None:
                assert q.tool_wait_s is None
            else:
                assert 0.0 <= q.tool_wait_s - r.tool_wait_s < 1e-3
                nudged += q.tool_wait_s != r.tool_wait_s
    assert nudged > 40
    for run, jit in ((-1, 1e-3), (1, -1e-3), (1, float("nan")), (1, float("inf"))):
        with pytest.raises(ValueError):
            jitter_waits(sessions, run, jit)


def _m(jct, p99):
    return {"jct_mean_s": jct, "resume_stall_p99_s": p99}


def test_the_summary_tests_the_means_and_calls_only_resolved_differences():
    # breakeven trails lru by 0.1 s in every run (a resolved loss), leads offload_host by
    # +-1 s alternately (a tie), and has the lower p99 than lru in every run (a lead)
    per_run = {r: {"breakeven": _m(100.0 + r, 0.4), "lru": _m(99.9 + r, 0.5),
                   "offload_host": _m(100.0 + r + (1.0 if r % 2 else -1.0), 0.3)} for r in range(6)}
    ens = summarize_ensemble(per_run)
    assert ens["runs"] == 6
    assert ens["paired"]["lru"]["jct"]["call"] == "trails"
    assert ens["paired"]["lru"]["jct"]["mean"] == pytest.approx(0.1)
    assert ens["paired"]["lru"]["p99"]["call"] == "leads" and ens["paired"]["lru"]["p99"]["lower_in"] == 6
    assert ens["paired"]["offload_host"]["jct"]["call"] == "tie"
    assert ens["paired"]["offload_host"]["p99"]["call"] == "trails"
    assert ens["resolved_losses"] == ["lru jct", "offload_host p99"]
    ts = ens["tests"]
    assert (ts["jct"], ts["p99"], ts["best_jct"], ts["best_p99"]) == (False, False, "lru", "offload_host")
    assert ens["policies"]["breakeven"]["jct_mean_s"]["mean"] == pytest.approx(102.5)
    # equal runs are a tie, not a float-rounding loss
    same = {r: {"breakeven": _m(297.7642470707455, 0.5), "lru": _m(297.764247070745, 0.5)} for r in range(3)}
    ens = summarize_ensemble(same)
    assert ens["paired"]["lru"]["jct"]["call"] == "tie" and ens["tests"]["jct"] and ens["resolved_losses"] == []
    assert summarize_ensemble({0: {"lru": _m(1.0, 1.0)}}) is None


def test_the_bound_is_the_mean_of_each_runs_best_not_the_best_mean():
    # the oracle is best in run 0, lru in run 1: the mean of the runs' bests (95) is lower than
    # either policy's mean (100), so a focus policy at 100 is 5.26% above it
    per_run = {0: {"breakeven": _m(100.0, 0.1), "lru": _m(110.0, 0.1), "oracle": _m(90.0, 0.0)},
               1: {"breakeven": _m(100.0, 0.1), "lru": _m(100.0, 0.1), "oracle": _m(110.0, 0.0)}}
    ens = summarize_ensemble(per_run)
    assert ens["bound_jct_mean_s"] == pytest.approx(95.0)
    assert ens["tests"]["vs_bound"] == pytest.approx(100.0 / 95.0) and not ens["tests"]["bound"]
    assert ens["tests"]["jct"]                              # lru's mean is 105


def test_run_0_is_the_plain_run_and_the_copies_differ(capsys):
    rc, out, _ = run_cli(capsys, "bench", "simulate", "--synth", "30", "--rate", "0.6", "--seed", "3",
                         "--jitter", "2", "--policies", POLS, "--jobs", "1", "--json")
    assert rc == 0
    doc = json.loads(out)
    assert list(doc["per_seed"]) == ["0", "1", "2"]
    assert doc["jitter"]["copies"] == 2 and doc["jitter"]["jitter_ms"] == 1.0 and doc["jitter"]["seed"] == 3
    ens = doc["jitter"]["ensemble"]
    assert ens["runs"] == 3 and set(ens["paired"]) == {"lru", "offload_host", "retain"}
    rc, out, _ = run_cli(capsys, "bench", "simulate", "--synth", "30", "--rate", "0.6", "--seed", "3",
                         "--policies", POLS, "--json")
    plain = json.loads(out)["policies"]
    for name, m in doc["per_seed"]["0"].items():
        assert (m["jct_mean_s"], m["resume_stall_p99_s"]) == (plain[name]["jct_mean_s"],
                                                               plain[name]["resume_stall_p99_s"])
    # every tool wait is longer in a copy, so every policy's mean JCT moves
    for name in plain:
        assert doc["per_seed"]["1"][name]["jct_mean_s"] != plain[name]["jct_mean_s"]
    # the ensemble's means are the runs' means
    for name, p in ens["policies"].items():
        runs = [doc["per_seed"][r][name]["jct_mean_s"] for r in ("0", "1", "2")]
        assert p["jct_mean_s"]["mean"] == pytest.approx(sum(runs) / 3)


def test_a_trace_file_jitters_and_the_report_names_the_calls(tmp_path, capsys):
    path = tmp_path / "t.jsonl"
    rc, _, _ = run_cli(capsys, "bench", "trace", "synth", "--out", str(path), "--sessions", "20", "--rate", "0.6",
                       "--json")
    assert rc == 0
    rc, out, _ = run_cli(capsys, "bench", "simulate", "--trace", str(path), "--jitter", "2", "--jitter-ms", "5",
                         "--policies", POLS, "--jobs", "2", "--plots", str(tmp_path / "p"))
    assert rc == 0
    assert (tmp_path / "p" / "sim-jitter.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "3 runs" in out and "under 5 ms" in out and "per run: 0 " in out
    assert f"resolved losses (paired mean past {RESOLVED_SE:g} standard errors):" in out
    assert "breakeven - lru: jct" in out


@pytest.mark.parametrize("argv, why", [
    (("--synth", "5", "--jitter", "2", "--seeds", "0-1"), "pick one"),
    (("--synth", "5", "--jitter-ms", "2"), "needs --jitter"),
    (("--trace", "t_{seed}.jsonl", "--jitter", "2"), "drop {seed}"),
    (("--synth", "5", "--jitter", "2", "--sweep-link", "25,50"), "drop --sweep-link"),
    (("--synth", "5", "--jitter", "1000"), "at most 999"),
    (("--synth", "5", "--jobs", "2"), "needs --seeds or --jitter"),
])
def test_bad_jitter_use_exits_2_with_one_line(capsys, argv, why):
    rc, out, err = run_cli(capsys, "bench", "simulate", *argv, "--policies", "lru")
    assert rc == 2 and out == ""
    assert why in err and "Traceback" not in err and err.strip().count("\n") == 0


def test_a_jitter_of_no_copies_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["bench", "simulate", "--synth", "5", "--jitter", "0", "--policies", "lru"])
    assert exc.value.code == 2
    assert "--jitter: expected a positive integer" in capsys.readouterr().err
