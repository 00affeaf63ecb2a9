"""ToolWaitPredictor: cold start, learning, back-off, drift, persistence, bad input."""
from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.tiering.model.decision import Forecast
from kvtier.tiering.forecasting.predictor import (GlobalMedianPredictor, PredictorConfig, RunningMeanPredictor,
                               ToolWaitPredictor, WaitForecast, tool_features)
from kvtier.tiering.forecasting.sketch import REL_ACCURACY, WaitSketch


def _coverage(fc: WaitForecast, samples) -> float:
    lo, hi = fc.quantiles["p10"], fc.quantiles["p90"]
    return sum(lo <= x <= hi for x in samples) / len(samples)


# --------------------------------------------------------------------------- cold start
def test_cold_start_uses_the_tracelab_priors():
    p = ToolWaitPredictor()
    # An unknown tool gets the prior fitted to 432,510 real tool calls: p50 0.3 s, p90 13.6 s.
    fc = p.forecast("Bash")
    assert isinstance(fc, Forecast) and isinstance(fc, WaitForecast)
    assert fc.source == "prior" and fc.n == 0
    assert fc.quantiles["p50"] == pytest.approx(0.3, rel=1e-6)
    assert fc.quantiles["p90"] == pytest.approx(13.6, rel=0.15)
    assert fc.mean_s == pytest.approx(18.4, rel=0.1)       # TraceLab's reported mean
    # Approval-like tools start from the human-input prior (p50 1.4 min).
    h = p.forecast("request_human_approval")
    assert h.quantiles["p50"] == pytest.approx(84.0, rel=1e-6)
    assert h.quantiles["p90"] > 10 * fc.quantiles["p90"]


def test_unknown_tool_after_learning_gets_the_global_forecast_not_an_error():
    p = ToolWaitPredictor()
    for _ in range(20):
        p.observe("grep", 0.2)
    fc = p.forecast("never_seen_tool")
    assert fc.source == "global" and fc.tool == "never_seen_tool" and fc.n == 20
    assert fc.quantiles["p50"] < 0.3     # pulled towards what the fleet actually does


# --------------------------------------------------------------------------- learning
def test_learns_a_tools_distribution_and_is_calibrated_on_fresh_samples():
    rng = random.Random(7)
    p = ToolWaitPredictor()
    # pytest runs take ~45 s with modest spread
    for _ in range(300):
        p.observe("pytest", rng.lognormvariate(math.log(45.0), 0.2))
    fc = p.forecast("pytest")
    # (forecasts are rebuilt after 2% new observations: n says what this one was built from)
    assert fc.source == "tool" and 300 * 0.98 <= fc.n <= 300
    assert fc.quantiles["p50"] == pytest.approx(45.0, rel=0.08)
    fresh = [rng.lognormvariate(math.log(45.0), 0.2) for _ in range(2000)]
    assert 0.7 <= _coverage(fc, fresh) <= 0.9
    # The distribution's pieces agree with each other.
    for q in (0.1, 0.5, 0.9, 0.99):
        assert fc.cdf(fc.quantile(q)) == pytest.approx(q, abs=0.01)
    assert fc.survival(60.0) == pytest.approx(1.0 - fc.cdf(60.0))
    assert float(np.sum(fc.points * fc.weights)) == pytest.approx(fc.mean_s, rel=1e-9)


def test_backs_off_from_features_to_tool():
    rng = random.Random(3)
    p = ToolWaitPredictor()
    # The same tool, two very different commands.
    for _ in range(60):
        p.observe("bash", rng.lognormvariate(math.log(60.0), 0.3), {"cmd": "pytest"})
        p.observe("bash", rng.lognormvariate(math.log(0.5), 0.3), {"cmd": "cd"})
    slow = p.forecast("bash", {"cmd": "pytest"})
    fast = p.forecast("bash", {"cmd": "cd"})
    whole = p.forecast("bash")
    assert slow.source == fast.source == "tool+features"
    assert slow.quantiles["p50"] > 50 * fast.quantiles["p50"]
    assert whole.source == "tool"
    # The tool level blends both commands: its median lies between theirs and its p10..p90
    # interval covers both medians.
    assert fast.quantiles["p50"] < whole.quantiles["p50"] < slow.quantiles["p50"]
    assert whole.quantiles["p10"] < fast.quantiles["p50"] and whole.quantiles["p90"] > slow.quantiles["p50"]
    # An unseen command falls back to the tool level.
    assert p.forecast("bash", {"cmd": "make"}).source == "tool"


def test_new_tool_with_one_observation_is_pulled_to_it_but_stays_uncertain():
    p = ToolWaitPredictor()
    p.observe("deploy", 120.0)
    fc = p.forecast("deploy")
    assert fc.source == "tool" and fc.n == 1
    assert 10.0 < fc.quantiles["p50"] < 120.0 * 1.01
    assert fc.quantiles["p90"] / fc.quantiles["p10"] > 5      # one sample: wide interval


def test_decay_follows_drift():
    p = ToolWaitPredictor(config=PredictorConfig(half_life_obs=20))
    for _ in range(200):
        p.observe("build", 1.0)
    assert p.forecast("build").quantiles["p50"] == pytest.approx(1.0, rel=0.1)
    # The build got slow (a dependency changed): 100 s from now on.
    for _ in range(100):
        p.observe("build", 100.0)
    assert p.forecast("build").quantiles["p50"] == pytest.approx(100.0, rel=0.2)


def test_forecast_does_not_change_learned_state():
    p = ToolWaitPredictor()
    for w in (0.5, 1.0, 2.0):
        p.observe("grep", w, {"cmd": "rg"})
    before = json.dumps(p.state_dict(), sort_keys=True)
    for _ in range(5):
        p.forecast("grep", {"cmd": "rg"})
        p.forecast("other")
    p.refresh()
    assert json.dumps(p.state_dict(), sort_keys=True) == before



def test_a_forecast_with_no_cached_answer_is_built_from_the_walked_chain():
    """forecast() serves a node's cached forecast without walking its chain; a node without one
    (just loaded) is built under the prior its ancestors hand down, as learning would build it."""
    p = ToolWaitPredictor()
    for w in (0.5, 1.0, 2.0, 4.0):
        p.observe("grep", w, {"cmd": "rg"})
    q = ToolWaitPredictor()
    q.load_state_dict(p.state_dict())
    for feats in ({"cmd": "rg"}, None):
        a, b = p.forecast("grep", feats), q.forecast("grep", feats)
        assert (a.source, a.n, a.mean_s, a.quantiles) == (b.source, b.n, b.mean_s, b.quantiles)
        assert np.allclose(a.points, b.points, rtol=1e-12, atol=0.0)   # the state round trip: ulps
    assert q.forecast("grep", {"cmd": "rg"}).source == "tool+features"

# --------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf"), -float("inf"), 1e9, True, "3", None])
def test_bad_waits_are_rejected_and_leave_state_untouched(bad):
    p = ToolWaitPredictor()
    p.observe("grep", 0.3)
    before = json.dumps(p.state_dict(), sort_keys=True)
    with pytest.raises(ValueError):
        p.observe("grep", bad)
    assert json.dumps(p.state_dict(), sort_keys=True) == before


@pytest.mark.parametrize("bad", ["", "   ", "x" * 500, "a\nb", "tab\there", None, 42, ["grep"]])
def test_invalid_tool_names_are_errors(bad):
    p = ToolWaitPredictor()
    with pytest.raises(ValueError):
        p.observe(bad, 1.0)
    with pytest.raises(ValueError):
        p.forecast(bad)
    assert p.state_dict()["nodes"] == {}


@pytest.mark.parametrize("bad", [["cmd"], {"cmd": 3}, {"": "x"}, {"cmd": "a=b"}, {"cmd": "x" * 100},
                                 {f"k{i}": "v" for i in range(20)}])
def test_malformed_features_are_errors(bad):
    p = ToolWaitPredictor()
    with pytest.raises(ValueError):
        p.observe("bash", 1.0, bad)
    assert p.state_dict()["nodes"] == {}


def test_zero_wait_is_valid():
    p = ToolWaitPredictor()
    for _ in range(30):
        p.observe("noop", 0.0)
    fc = p.forecast("noop")
    assert fc.quantiles["p50"] < 1e-3 and math.isfinite(fc.mean_s)


# --------------------------------------------------------------------------- persistence
def test_lmdb_persistence_survives_restart(tmp_path):
    # Learn, close (as on shutdown), reopen: the same forecasts come back.
    with ToolWaitPredictor(tmp_path / "pred") as p:
        for i in range(50):
            p.observe("pytest", 40.0 + i % 7, {"cmd": "pytest"})
            p.observe("grep", 0.1 + 0.01 * (i % 5))
        want = {t: p.forecast(t, f).quantiles for t, f in (("pytest", {"cmd": "pytest"}), ("grep", None))}
    with ToolWaitPredictor(tmp_path / "pred") as q:
        assert q.tools() == {"pytest": 50, "grep": 50}
        for (t, f) in (("pytest", {"cmd": "pytest"}), ("grep", None)):
            assert q.forecast(t, f).quantiles == pytest.approx(want[t])
        # and it keeps learning from there
        q.observe("grep", 0.12)
        assert q.tools()["grep"] == 51


def test_corrupt_lmdb_record_is_ignored_not_served(tmp_path):
    import lmdb
    with ToolWaitPredictor(tmp_path / "pred") as p:
        for _ in range(10):
            p.observe("grep", 0.2)
            p.observe("make", 3.0)
    env = lmdb.open(str(tmp_path / "pred"), subdir=True)
    with env.begin(write=True) as txn:
        txn.put(b"pred/t:make", b"{not json")
    env.close()
    with ToolWaitPredictor(tmp_path / "pred") as q:
        assert q.load_errors == 1
        assert "make" not in q.tools() and q.tools()["grep"] == 10
        assert q.forecast("make").source in ("global", "prior")     # back to the prior, not garbage


def test_shared_lmdb_environment(tmp_path):
    import lmdb
    env = lmdb.open(str(tmp_path / "svc"), subdir=True, map_size=16 << 20)
    with env.begin(write=True) as txn:
        txn.put(b"other/key", b"service data")     # someone else's records live beside ours
    p = ToolWaitPredictor.open(env)
    p.observe("grep", 0.5)
    q = ToolWaitPredictor.open(env)
    assert q.tools() == {"grep": 1}
    with env.begin() as txn:
        assert txn.get(b"other/key") == b"service data"
    env.close()


def test_state_dict_round_trip_and_all_or_nothing_load():
    p = ToolWaitPredictor()
    rng = random.Random(1)
    for _ in range(40):
        p.observe("grep", rng.lognormvariate(-1, 0.5))
    state = json.loads(json.dumps(p.state_dict()))     # plain JSON on the way
    q = ToolWaitPredictor()
    q.load_state_dict(state)
    assert q.forecast("grep").quantiles == pytest.approx(p.forecast("grep").quantiles)
    # A malformed state is refused and q keeps what it had.
    bad = json.loads(json.dumps(state))
    bad["nodes"]["t:grep"]["w"] = "NaN"
    with pytest.raises(ValueError):
        q.load_state_dict(bad)
    with pytest.raises(ValueError):
        q.load_state_dict({"version": 999})
    assert q.tools() == {"grep": 40}


def test_load_state_dict_replaced_memory_before_the_disk_transactions_succeeded(tmp_path):
    # Regression (issue 12 item 5): load_state_dict set the in-memory nodes first, then deleted
    # the records on disk and wrote the new ones in a second transaction; a failed write left
    # memory with the new state and the disk with the old one (or none).
    import lmdb
    d = tmp_path / "pred"
    with ToolWaitPredictor(d) as p:
        for _ in range(5):
            p.observe("grep", 0.5)
    other = ToolWaitPredictor()
    other.observe("pytest", 30.0)
    # 1. a read-only environment: every write transaction fails
    env = lmdb.open(str(d), subdir=True, readonly=True, lock=False)
    q = ToolWaitPredictor.open(env)
    before = json.dumps(q.state_dict(), sort_keys=True)
    with pytest.raises(lmdb.Error):
        q.load_state_dict(other.state_dict())
    # 2. memory kept the old state, and so did the disk
    assert json.dumps(q.state_dict(), sort_keys=True) == before
    assert q.tools() == {"grep": 5}
    env.close()
    with ToolWaitPredictor(d) as r:
        assert r.tools() == {"grep": 5}
        # 3. a writable environment: the replacement lands on both, in one transaction
        r.load_state_dict(other.state_dict())
        assert r.tools() == {"pytest": 1}
    with ToolWaitPredictor(d) as s:
        assert s.tools() == {"pytest": 1}


# --------------------------------------------------------------------------- sketch
def test_sketch_quantiles_are_within_relative_accuracy_and_merge():
    rng = np.random.default_rng(0)
    data = rng.lognormal(0.0, 2.0, size=5000)
    a, b = WaitSketch(), WaitSketch()
    for x in data[:2500]:
        a.add(float(x))
    for x in data[2500:]:
        b.add(float(x))
    a.merge(b)
    snap = a.snapshot()
    for q in (0.1, 0.5, 0.9, 0.99):
        exact = float(np.quantile(data, q, method="inverted_cdf"))
        assert abs(snap.quantile(q) / exact - 1) <= 2.5 * REL_ACCURACY
    assert a.n == 5000 and a.weight == pytest.approx(5000)
    with pytest.raises(ValueError):
        a.add(float("nan"))


def test_sketch_decay_forgets_old_observations():
    s = WaitSketch(decay=0.9)
    for _ in range(100):
        s.add(1.0)
    for _ in range(100):
        s.add(50.0)
    assert s.snapshot().quantile(0.5) == pytest.approx(50.0, rel=0.05)
    assert s.weight == pytest.approx(1 / (1 - 0.9), rel=0.01)


# --------------------------------------------------------------------------- features and baselines
def test_tool_features_extracts_the_command_head():
    assert tool_features("cd /repo && python -m pytest -x tests", 120) == {"cmd": "pytest", "arg": "<256"}
    assert tool_features("timeout 60 make -j8") == {"cmd": "make"}
    assert tool_features("FOO=1 sudo /usr/bin/apt-get install x") == {"cmd": "apt-get"}
    assert tool_features("") == {}
    assert tool_features("echo 'unterminated", 10**9) == {"cmd": "echo", "arg": ">=65536"}


def test_baseline_predictors_give_point_forecasts():
    rm, gm = RunningMeanPredictor(), GlobalMedianPredictor()
    for w in (1.0, 2.0, 9.0):
        rm.observe("t", w)
        gm.observe("t", w)
    assert rm.forecast("t").mean_s == pytest.approx(4.0)
    assert gm.forecast("other").quantiles["p90"] == pytest.approx(2.0)
    with pytest.raises(ValueError):
        rm.observe("t", -1)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(min_value=0.0, max_value=1e6, allow_nan=False), min_size=1, max_size=40))
def test_any_valid_history_gives_a_sane_forecast(waits):
    p = ToolWaitPredictor()
    for w in waits:
        p.observe("t", w)
    fc = p.forecast("t")
    qs = [fc.quantiles[k] for k in ("p10", "p25", "p50", "p75", "p90", "p95", "p99")]
    assert all(math.isfinite(v) and v >= 0 for v in qs)
    assert qs == sorted(qs)
    assert math.isfinite(fc.mean_s) and fc.mean_s >= 0
    assert np.all(np.diff(fc.points) >= 0)
