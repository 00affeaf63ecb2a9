"""The seed set: `kvtier bench simulate --synth N --seeds ...` and its three tests (bench/sim/seeds.py)."""
from __future__ import annotations

import json

import pytest

from kvtier.bench.sim.seeds import BOUND_SLACK, parse_seeds, summarize_seeds, verdict
from kvtier_testutil import run_cli

POLS = "breakeven,lru,offload_host,retain"


def test_seed_lists_and_ranges_parse_in_order_and_bad_ones_say_why():
    assert parse_seeds("0-3") == (0, 1, 2, 3)
    assert parse_seeds("7, 2,4-5") == (7, 2, 4, 5)
    for text, why in (("", "no seed"), ("3-1", "backwards"), ("1,1", "repeats"), ("-2", "not a seed"),
                      ("a", "not a seed"), ("0-5000", "more than")):
        with pytest.raises(ValueError, match=why):
            parse_seeds(text)


def _m(jct, p99):
    return {"jct_mean_s": jct, "resume_stall_p99_s": p99}


def test_verdict_holds_each_test_to_its_own_set_of_policies():
    # retain leads the JCT (a baseline, so the JCT test fails) but is not a moving baseline,
    # so its lower p99 does not count against the focus policy
    run = {"breakeven": _m(100.0, 0.5), "lru": _m(100.0, 0.6), "retain": _m(99.0, 0.1), "ttl": _m(300.0, 0.5)}
    v = verdict(run)
    assert (v["jct"], v["p99"], v["bound"], v["all"]) == (False, True, True, False)
    assert v["best_jct"] == "retain" and v["best_p99"] == "ttl"
    assert v["jct_gap"] == pytest.approx(100.0 / 99.0 - 1.0)
    # ties count as met; the oracle is no baseline but sets the bound
    tie = {"breakeven": _m(100.0, 0.5), "lru": _m(100.0, 0.5), "oracle": _m(100.0 / BOUND_SLACK - 1.0, 0.0)}
    v = verdict(tie)
    assert (v["jct"], v["p99"], v["bound"]) == (True, True, False)
    # equal decisions summed in another order: the last bits of a mean differ, still a tie;
    # a real lead, however small, is not
    v = verdict({"breakeven": _m(297.7642470707455, 0.5), "lru": _m(297.764247070745, 0.5)})
    assert v["jct"] and v["jct_gap"] > 0
    assert not verdict({"breakeven": _m(100.0 * (1 + 1e-9), 0.5), "lru": _m(100.0, 0.5)})["jct"]
    assert verdict({"lru": _m(1.0, 1.0)}) is None and verdict({"breakeven": _m(1.0, 1.0)}) is None


def test_summary_counts_the_seeds_that_meet_each_test():
    per_seed = {0: {"breakeven": _m(10.0, 0.1), "lru": _m(11.0, 0.2)},
                1: {"breakeven": _m(12.0, 0.3), "lru": _m(11.0, 0.2)},
                2: {"breakeven": _m(10.0, 0.3), "lru": _m(10.5, 0.2)}}
    doc = summarize_seeds(per_seed)
    t = doc["tests"]
    assert t["n"] == 3 and t["met"] == {"jct": 2, "p99": 1, "bound": 2, "all": 1}   # seed 1 is 9% off
    assert doc["policies"]["lru"]["jct_mean_s"]["max"] == 11.0
    assert doc["policies"]["breakeven"]["jct_vs_bound"]["max"] == pytest.approx(12.0 / 11.0)
    assert t["p99_ratio"]["median"] == pytest.approx(1.5)


def test_a_seed_set_reproduces_each_seeds_own_run_whatever_the_number_of_jobs(capsys):
    rc, out, _ = run_cli(capsys, "bench", "simulate", "--synth", "30", "--rate", "0.6", "--seeds", "0,3",
                         "--policies", POLS, "--jobs", "1", "--json")
    assert rc == 0
    one = json.loads(out)
    assert one["seeds"]["seeds"] == [0, 3] and list(one["per_seed"]) == ["0", "3"]
    # the same seeds in two worker processes: the same numbers, float for float (but the wall time)
    rc, out, _ = run_cli(capsys, "bench", "simulate", "--synth", "30", "--rate", "0.6", "--seeds", "0,3",
                         "--policies", POLS, "--jobs", "2", "--json")
    assert rc == 0
    two = json.loads(out)["per_seed"]
    for seed, pols in one["per_seed"].items():
        for name, m in pols.items():
            m2 = two[seed][name]
            assert {k: v for k, v in m.items() if k != "sim_wall_s"} == {k: v for k, v in m2.items() if k != "sim_wall_s"}
    # and each seed's numbers are that seed's plain run
    for seed in ("0", "3"):
        rc, out, _ = run_cli(capsys, "bench", "simulate", "--synth", "30", "--rate", "0.6", "--seed", seed,
                             "--policies", POLS, "--json")
        assert rc == 0
        plain = json.loads(out)["policies"]
        for name, m in one["per_seed"][seed].items():
            assert m["jct_mean_s"] == plain[name]["jct_mean_s"]
            assert m["resume_stall_p99_s"] == plain[name]["resume_stall_p99_s"]
            assert m["sessions_done"] == 30
    # the counts are the per-seed verdicts'
    t = one["seeds"]["tests"]
    assert t["met"]["all"] == sum(1 for v in t["per_seed"].values() if v["all"])


def test_table_and_plot(tmp_path, capsys):
    rc, out, _ = run_cli(capsys, "bench", "simulate", "--synth", "20", "--rate", "0.6", "--seeds", "1-2",
                         "--policies", POLS, "--jobs", "1", "--plots", str(tmp_path / "p"))
    assert rc == 0
    assert "2 seeds" in out and "breakeven: mean JCT no worse than every baseline in" in out
    assert "per seed: 1 " in out and ("all three met" in out or "missed" in out)
    png = tmp_path / "p" / "sim-seeds.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_trace_path_with_seed_in_it_is_one_draw_per_seed(tmp_path, capsys):
    for seed in (4, 5):
        rc, _, _ = run_cli(capsys, "bench", "trace", "synth", "--out", str(tmp_path / f"t_{seed}.jsonl"),
                           "--sessions", "25", "--rate", "0.6", "--seed", str(seed), "--json")
        assert rc == 0
    pattern = str(tmp_path / "t_{seed}.jsonl")
    rc, out, _ = run_cli(capsys, "bench", "simulate", "--trace", pattern, "--seeds", "4-5", "--policies", POLS,
                         "--jobs", "1", "--json")
    assert rc == 0
    doc = json.loads(out)
    assert list(doc["per_seed"]) == ["4", "5"] and doc["seeds"]["tests"]["n"] == 2
    for seed in ("4", "5"):
        rc, out, _ = run_cli(capsys, "bench", "simulate", "--trace", str(tmp_path / f"t_{seed}.jsonl"),
                             "--policies", POLS, "--json")
        plain = json.loads(out)["policies"]
        for name, m in doc["per_seed"][seed].items():
            assert (m["jct_mean_s"], m["resume_stall_p99_s"]) == (plain[name]["jct_mean_s"],
                                                                   plain[name]["resume_stall_p99_s"])
    # a seed without its file: exit 2, one line naming the file
    rc, out, err = run_cli(capsys, "bench", "simulate", "--trace", pattern, "--seeds", "4-6", "--policies", "lru",
                           "--jobs", "1")
    assert rc == 2 and out == "" and "t_6.jsonl" in err and "Traceback" not in err
    # a malformed one: exit 2, one line naming that seed's file and its line
    (tmp_path / "t_6.jsonl").write_text('{"session": "t", "round": 0}\n')
    rc, out, err = run_cli(capsys, "bench", "simulate", "--trace", pattern, "--seeds", "4-6", "--policies", "lru",
                           "--jobs", "2")
    assert rc == 2 and out == "" and "Traceback" not in err
    assert "t_6.jsonl: line 1:" in err and err.strip().count("\n") == 0


@pytest.mark.parametrize("argv, why", [
    (("--trace", "x.jsonl", "--seeds", "0-1"), "{seed}"),
    (("--synth", "5", "--jobs", "2"), "needs --seeds"),
    (("--synth", "5", "--seeds", "0-1", "--sweep-link", "25,50"), "drop --sweep-link"),
    (("--synth", "5", "--seeds", "0-1", "--seed", "4"), "drop --seed"),
    (("--synth", "5", "--seeds", "2-1"), "backwards"),
])
def test_bad_seed_set_use_exits_2_with_one_line(capsys, argv, why):
    rc, out, err = run_cli(capsys, "bench", "simulate", *argv, "--policies", "lru")
    assert rc == 2 and out == ""
    assert why in err and "Traceback" not in err and err.strip().count("\n") == 0
