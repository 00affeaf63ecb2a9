"""Agent trace format, converters and the synthetic workload."""
from __future__ import annotations

import json
import math
import random

import pytest

from kvtier.bench.sim.convert import convert_mooncake, convert_tracelab, default_traces_dir
from kvtier.bench.sim.synth import SynthConfig, ToolWaitSampler, synthesize
from kvtier.bench.sim.trace import (Trace, TraceError, make_session, read_trace, summarize, write_trace)

TRACES = default_traces_dir()


def _line(**kw):
    base = {"session": "a", "round": 0, "arrival_s": 0.0, "new_tokens": 10, "output_tokens": 5,
            "tool": None, "tool_wait_s": None}
    base.update(kw)
    return json.dumps(base)


def test_write_then_read_round_trips(tmp_path):
    s1 = make_session("x", 1.5, [(100, 10, "bash", 2.0), (50, 5, None, None)],
                      shared_prefix_id="sys", shared_prefix_tokens=64)
    s2 = make_session("y", 0.5, [(7, 3, None, None)])
    path = tmp_path / "t.jsonl"
    assert write_trace(path, [s1, s2]) == 3
    tr = read_trace(path)
    # sessions come back sorted by arrival, rounds intact, later arrival = arrival + waits
    assert [s.id for s in tr.sessions] == ["y", "x"]
    x = tr.sessions[1]
    assert x.rounds == s1.rounds
    assert x.rounds[1].arrival_s == pytest.approx(3.5)
    assert x.shared_prefix_tokens == 64 and x.context_tokens(1) == 110


def test_malformed_lines_are_reported_with_their_line_number(tmp_path):
    lines = [
        _line(session="good", round=0, tool="bash", tool_wait_s=1.0),
        _line(session="good", round=1),
        "{not json",                                                   # line 3
        _line(session="neg", new_tokens=-4),                           # line 4
        _line(session="half", round=0, tool="bash", tool_wait_s=None),  # line 5: tool without wait
        _line(session="gap", round=0, tool="t", tool_wait_s=1.0),
        _line(session="gap", round=2),                                 # line 7: round 1 missing
    ]
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    # stop: the first bad line aborts, naming line 3
    with pytest.raises(TraceError) as ei:
        read_trace(path, on_error="stop")
    assert ei.value.line == 3 and str(ei.value).startswith("line 3:")
    # skip: every problem is recorded with its line; the good session survives
    tr = read_trace(path, on_error="skip")
    assert [s.id for s in tr.sessions] == ["good"]
    lines_reported = [p.line for p in tr.problems if p.line is not None]
    assert lines_reported == [3, 4, 5, 7]
    assert "lacks round 1" in str(tr.problems[3])


def test_a_round_other_than_the_last_needs_a_tool(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(_line(round=0) + "\n" + _line(round=1) + "\n")
    with pytest.raises(TraceError, match="line 1: .*no tool"):
        read_trace(path)


def test_read_rejects_an_unknown_on_error_choice(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(_line() + "\n")
    with pytest.raises(ValueError, match="on_error"):
        read_trace(path, on_error="ignore")


def test_synthetic_workload_is_seeded_and_deterministic():
    a = synthesize(SynthConfig(sessions=40, seed=7))
    b = synthesize(SynthConfig(sessions=40, seed=7))
    c = synthesize(SynthConfig(sessions=40, seed=8))
    assert a == b
    assert a != c


def test_synthetic_contexts_respect_the_cap():
    cfg = SynthConfig(sessions=200, max_context_tokens=20_000, seed=3)
    for s in synthesize(cfg):
        assert s.shared_prefix_tokens + s.context_tokens(len(s.rounds)) <= cfg.max_context_tokens
        assert s.rounds[-1].tool is None and all(r.tool for r in s.rounds[:-1])


def test_tool_wait_mixture_matches_the_real_aggregates():
    # STATS.md (TraceLab, 432,510 calls): p50 0.3 s, p90 13.6 s, p99 3.6 min, 3.97% over 1 min
    # holding 84.7% of tool time.  The fitted mixture must land close to each.
    rng = random.Random(11)
    sampler = ToolWaitSampler(rng)
    w = sorted(sampler.draw()[1] for _ in range(60_000))
    n = len(w)
    p50, p90, p99 = w[n // 2], w[int(0.9 * n)], w[int(0.99 * n)]
    assert 0.25 <= p50 <= 0.36
    assert 11.0 <= p90 <= 16.5
    assert 170 <= p99 <= 280
    over = [x for x in w if x > 60]
    assert 0.032 <= len(over) / n <= 0.048
    assert 0.75 <= sum(over) / sum(w) <= 0.92


def _mooncake_file(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_mooncake_sessions_are_rebuilt_from_prefix_hashes(tmp_path):
    rows = [
        {"timestamp": 0, "input_length": 1500, "output_length": 100, "hash_ids": [0, 1, 2]},
        {"timestamp": 1000, "input_length": 900, "output_length": 50, "hash_ids": [0, 7]},
        # continues the first request: its prefix covers blocks 0,1,2
        {"timestamp": 30000, "input_length": 2700, "output_length": 80, "hash_ids": [0, 1, 2, 3, 4, 5]},
        # shares only blocks 0,1 of the first session's latest request: a fork -> new session
        {"timestamp": 40000, "input_length": 1100, "output_length": 10, "hash_ids": [0, 1, 9]},
    ]
    conv = convert_mooncake(_mooncake_file(tmp_path / "m.jsonl", rows), seed=1)
    by_arrival = sorted(conv.sessions, key=lambda s: s.arrival_s)
    assert [len(s.rounds) for s in by_arrival] == [2, 1, 1]
    first = by_arrival[0]
    # block 0 is the shared prefix; round 1's new tokens = input - (prefix + round 0 in + out)
    assert first.shared_prefix_tokens == 512
    assert first.rounds[0].new_tokens == 1500 - 512
    assert first.rounds[1].new_tokens == 2700 - 1500 - 100
    assert first.rounds[0].tool is not None and first.rounds[0].tool_wait_s >= 0
    assert conv.stats["forks_started_new_session"] == 1
    assert by_arrival[2].arrival_s == pytest.approx(40.0)
    # same seed, same waits; another seed, other waits
    again = convert_mooncake(tmp_path / "m.jsonl", seed=1)
    other = convert_mooncake(tmp_path / "m.jsonl", seed=2)
    assert again.sessions == conv.sessions
    assert other.sessions != conv.sessions


def test_mooncake_bad_line_stops_or_is_skipped(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps({"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [0, 1]})
                    + "\n" + json.dumps({"timestamp": 5, "input_length": "many", "hash_ids": []}) + "\n")
    with pytest.raises(TraceError, match="line 2"):
        convert_mooncake(path)
    conv = convert_mooncake(path, on_error="skip")
    assert len(conv.sessions) == 1 and conv.problems[0].line == 2


@pytest.mark.skipif(not (TRACES / "mooncake" / "conversation_trace.jsonl").is_file(),
                    reason="../shared/traces/mooncake not present")
def test_real_mooncake_conversation_trace_converts(tmp_path):
    conv = convert_mooncake(TRACES / "mooncake" / "conversation_trace.jsonl", seed=0)
    rounds = sum(len(s.rounds) for s in conv.sessions)
    assert rounds == conv.stats["requests"] == 12031          # every request becomes one round
    assert conv.stats["multi_round_sessions"] > 1000
    st = summarize(Trace(conv.sessions))
    assert 0.2 < st["tool_wait_p50_s"] < 0.45
    # writing and reading back gives the same sessions
    write_trace(tmp_path / "mc.jsonl", conv.sessions)
    assert read_trace(tmp_path / "mc.jsonl").sessions == tuple(sorted(conv.sessions, key=lambda s: (s.arrival_s, s.id)))


@pytest.mark.skipif(not (TRACES / "tracelab" / "example_sanitized_round_trace.jsonl").is_file(),
                    reason="../shared/traces/tracelab not present")
def test_tracelab_rows_become_sessions_with_tool_and_human_waits():
    conv = convert_tracelab(TRACES / "tracelab" / "example_sanitized_round_trace.jsonl")
    assert len(conv.sessions) == 2
    tools = {r.tool for s in conv.sessions for r in s.rounds[:-1]}
    assert "human" in tools and len(tools) > 3
    for s in conv.sessions:
        for r in s.rounds[:-1]:
            assert r.tool_wait_s is not None and 0 <= r.tool_wait_s < 3600
        assert all(r.new_tokens >= 1 for r in s.rounds)


def test_summary_counts_long_waits():
    s = make_session("a", 0.0, [(1, 1, "t", 100.0), (1, 1, "t", 1.0), (1, 1, None, None)])
    st = summarize(Trace((s,)))
    assert st["pauses"] == 2
    assert st["frac_waits_over_60s"] == 0.5
    assert math.isclose(st["frac_wait_time_over_60s"], 100 / 101)
