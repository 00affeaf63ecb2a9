"""bench_decide's document: the decisions' percentiles and, beside them, the machine-noise
reference (fixed work timed between the pauses)."""
from __future__ import annotations

import json

import pytest

from kvtier.bench import bench_decide


def test_the_document_carries_the_noise_reference_beside_the_decisions(capsys):
    assert bench_decide.main(["--trajectories", "50", "--pauses", "300", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    d, ref = doc["decide_us"], doc["noise_reference_us"]
    assert 0 < d["p50"] <= d["p90"] <= d["p99"]
    assert 0 < ref["p50"] <= ref["p90"] <= ref["p99"]
    assert ref["p99_over_p50"] == ref["p99"] / ref["p50"]
    # the reference is one piece of work that never changes (no kvtier code in it)
    assert "reference_work" in ref["work"]
    import numpy as np
    args = (np.array(bench_decide._REF_POINTS), np.array(bench_decide._REF_WEIGHTS))
    assert bench_decide.reference_work(*args) == bench_decide.reference_work(*args)
    assert sum(doc["actions"].values()) == 300


def test_the_reference_can_be_left_out_and_bad_input_is_one_line(capsys):
    assert bench_decide.main(["--trajectories", "20", "--pauses", "100", "--no-reference", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    # without --admission-wait-s no admission wait is passed, as the engines pass none (null)
    assert doc["noise_reference_us"] is None and doc["admission_wait_s"] is None
    with pytest.raises(SystemExit) as bad:
        bench_decide.main(["--pauses", "0", "--json"])
    out, err = capsys.readouterr()
    assert bad.value.code == 2 and out == "" and "1..10,000,000" in err


def test_the_admission_wait_given_is_in_the_document_and_a_bad_one_is_one_line(capsys):
    # the simulator's holder passes new work's admission wait (the run without it: above)
    assert bench_decide.main(["--trajectories", "20", "--pauses", "100", "--no-reference",
                              "--admission-wait-s", "0.1", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["admission_wait_s"] == 0.1 and sum(doc["actions"].values()) == 100
    for bad in ("-1", "inf", "soon"):
        with pytest.raises(SystemExit) as exc:
            bench_decide.main(["--admission-wait-s", bad, "--json"])
        out, err = capsys.readouterr()
        assert exc.value.code == 2 and out == "" and "a number >= 0" in err
