"""The forecast-quality measurement of learned tool names (bench/conversation_eval.py,
``kvtier bench predictor --conversation``): synthetic replays where the answer is known, and the
real traces."""
from __future__ import annotations

import json
import random

import pytest

from kvtier.bench import conversation_eval as ce
from kvtier.bench.predictor_eval import default_traces_dir, evaluate, load_datasets
from kvtier.cli.main import main

TRACES = default_traces_dir()
needs_traces = pytest.mark.skipif(not (TRACES / "swe_agent").is_dir(), reason=f"real traces not found under {TRACES}")


def _source(waits: dict[str, float], order, sessions: int = 20, calls: int = 12, seed: int = 7) -> ce.Source:
    rng = random.Random(seed)
    out = []
    for s in range(sessions):
        tools = [order(rng, i) for i in range(calls)]
        out.append(ce.Session(f"s{s}", tuple((t, waits[t] * rng.lognormvariate(0.0, 0.3)) for t in tools)))
    return ce.Source("synthetic", "-", tuple(out))


CYCLE = ("ls", "edit", "pytest")


def test_learned_tool_names_beat_the_unhinted_class_when_tools_wait_very_differently():
    # an agent that runs ls -> edit -> pytest -> ls ...; ls takes 50 ms, edit 0.5 s, pytest 30 s
    src = _source({"ls": 0.05, "edit": 0.5, "pytest": 30.0}, lambda rng, i: CYCLE[i % 3])
    out = ce.evaluate([src])["pooled"]
    assert out["pauses"] == 20 * 12
    # the transitions are learned from the first run on: the hint names the true tool almost always
    assert out["forecast_accuracy"] > 0.95
    d = out["paired"]["learned-unhinted"]
    for k in ("pinball_s", "pinball_log"):
        assert d[k]["mean"] + 3 * d[k]["se"] < 0, (k, d[k])
    assert out["models"]["learned"]["pinball_loss_log"] < 0.5 * out["models"]["unhinted"]["pinball_loss_log"]


def test_learned_tool_names_tie_with_the_unhinted_class_when_every_tool_waits_alike():
    src = _source({"ls": 2.0, "edit": 2.0, "pytest": 2.0}, lambda rng, i: rng.choice(CYCLE))
    out = ce.evaluate([src])["pooled"]
    d = out["paired"]["learned-unhinted"]["pinball_log"]
    assert abs(d["mean"]) < max(3 * d["se"], 0.02), d
    # and even the true tool buys nothing
    t = out["paired"]["true_tool-unhinted"]["pinball_log"]
    assert abs(t["mean"]) < max(3 * t["se"], 0.02), t


def test_a_retag_that_lands_in_time_recovers_the_true_tool_and_one_that_lands_late_does_not():
    # a coin flip between a 0.3 s and a 30 s tool: forecasts are often wrong
    src = _source({"ls": 0.3, "pytest": 30.0}, lambda rng, i: rng.choice(("ls", "pytest")), sessions=30)
    quick = ce.evaluate([src], retag_latency_s=0.01)["pooled"]
    # every wrong forecast is corrected (the streamed half before the pause starts), none too late:
    # the engine plans and learns as an agent that sends the true tool would make it
    assert quick["retags"]["sent"] == quick["wrong_forecasts"]["n"] > 50
    assert quick["retags"]["too_late"] == 0 and 0 < quick["retags"]["before_pause"] < quick["retags"]["sent"]
    assert quick["models"]["replanned"] == quick["models"]["true_tool"]
    # a retag slower than every wait lands after the next request: the engine stays on the forecast
    late = ce.evaluate([src], retag_latency_s=100.0)["pooled"]
    assert late["retags"]["too_late"] == late["retags"]["sent"]
    assert late["models"]["replanned"] == late["models"]["learned"]

def test_a_wrong_forecast_is_scored_on_the_label_the_engine_got():
    # the next tool is a coin flip between a 50 ms and a 30 s tool: forecasts are often wrong, and
    # the true tool (known only once the response names it) is far better than any forecast
    src = _source({"ls": 0.05, "pytest": 30.0}, lambda rng, i: rng.choice(("ls", "pytest")), sessions=30)
    out = ce.evaluate([src])["pooled"]
    assert 0.3 < out["forecast_accuracy"] < 0.7
    assert out["wrong_forecasts"]["n"] > 50
    gap = out["paired"]["learned-true_tool"]["pinball_log"]
    assert gap["mean"] - 3 * gap["se"] > 0


def test_the_replay_goes_through_the_component_json_and_streamed():
    src = _source({"ls": 0.05, "edit": 0.5, "pytest": 30.0}, lambda rng, i: CYCLE[i % 3], sessions=2, calls=5)
    pauses, stats = ce.replay(src, piece_bytes=5)
    # every pause's wait and tool were learned by ConversationHints from the traffic itself
    assert [p.tool for p in pauses] == [t for s in src.sessions for t, _ in s.calls]
    assert [p.wait_s for p in pauses] == pytest.approx([w for s in src.sessions for _, w in s.calls])
    assert stats["observations"] == 10 and stats["responses"] == 12 and stats["trajectories"] == 2
    assert stats["named_early"] >= 4                     # streamed responses named their tool early


@needs_traces
def test_swe_agent_waits_the_true_tool_row_is_the_per_call_predictor_and_the_cli_prints_the_table(capsys):
    sources = {s.name: s for s in ce.load_sources(TRACES)}
    assert sum(len(s.calls) for s in sources["swe_agent"].sessions) == 40
    rc = main(["bench", "predictor", "--conversation", "--traces", str(TRACES), "--json"])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    swe = doc["sources"]["swe_agent"]
    assert swe["pauses"] == 40 and swe["trajectories"] == 4
    assert {m["n"] for m in swe["models"].values()} == {40}          # the same waits for every model
    # the true tool's row is `kvtier bench predictor`'s kvtier row on the same calls
    per_call = evaluate([d for d in load_datasets(TRACES) if d.name == "swe_agent"])
    want = per_call["datasets"]["swe_agent"]["models"]["kvtier"]
    assert swe["models"]["true_tool"]["pinball_loss_s"] == pytest.approx(want["pinball_loss_s"])
    assert swe["models"]["true_tool"]["coverage_p10_p90"] == pytest.approx(want["coverage_p10_p90"])
    # the table
    assert main(["bench", "predictor", "--conversation", "--traces", str(TRACES)]) == 0
    text = capsys.readouterr().out
    assert "swe_agent: 40 pauses" in text and "learned" in text and "unhinted" in text


def test_the_cli_refuses_traces_without_trajectories(tmp_path, capsys):
    (tmp_path / "swe_agent").mkdir()
    (tmp_path / "swe_agent" / "swe_agent_demo_step_exec_times.csv").write_text("action_head,execution_time_s\nls,1\n")
    rc = main(["bench", "predictor", "--conversation", "--traces", str(tmp_path)])
    assert rc != 0
    assert "traj_path" in capsys.readouterr().err
