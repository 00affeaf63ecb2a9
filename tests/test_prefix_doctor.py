"""The prefix doctor: equation (2) on a hand-made log, and every injected breaker found."""
import json
import random

import pytest

from kvtier.bench.prefix_logs import BREAKERS, build_logs, session_log
from kvtier.bench.sim.trace import make_session
from kvtier.tiering.prefix.doctor import PrefixDoctor
from kvtier.tiering.prefix.log import LogError, replay


def test_equation_2_on_a_hand_made_token_log(tmp_path):
    # block_tokens=4.  Trajectory a: 8 tokens, then the same 8 + 4 new (8 matched), then a
    # real edit at token 2 (0 matched: the first chunk differs).  Trajectory b shares a's
    # first chunk (4 matched against everything earlier in the log).
    lines = [
        {"trajectory_id": "a", "tokens": [1, 2, 3, 4, 5, 6, 7, 8]},
        {"trajectory_id": "b", "tokens": [1, 2, 3, 4, 9, 9, 9, 9, 9, 9]},
        {"trajectory_id": "a", "tokens": [1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 12, 13]},
        {"trajectory_id": "a", "tokens": [1, 2, 99, 4, 5, 6, 7, 8, 10, 11, 12, 13, 14, 15, 16, 17]},
    ]
    log = tmp_path / "log.jsonl"
    log.write_text("".join(json.dumps(x) + "\n" for x in lines))
    d = PrefixDoctor(block_tokens=4, seconds_per_token=0.001)
    assert replay(log, d) == 4
    a, b = d.trajectories["a"], d.trajectories["b"]
    assert [t.matched_tokens for t in a.turns] == [0, 8, 0]
    assert [t.prompt_tokens for t in a.turns] == [8, 12, 16]
    assert [t.cause for t in a.turns] == ["none", "none", "edit"]
    assert a.turns[2].first_diff_token == 2 and a.turns[2].prev_matched_tokens == 2
    assert a.turns[2].reprefill_tokens == 12 and a.turns[2].reprefill_s == pytest.approx(0.012)
    assert b.turns[0].matched_tokens == 4
    # H = sum matched / sum prompt
    assert a.hit_rate == pytest.approx(8 / 36)
    assert d.hit_rate == pytest.approx((8 + 4) / (36 + 10))
    doc = d.to_json()
    assert doc["hit_rate"] == pytest.approx(12 / 46)
    assert doc["trajectories"]["a"]["turns"][1] == {**doc["trajectories"]["a"]["turns"][1],
                                                    "turn": 1, "prompt_tokens": 12, "matched_tokens": 8,
                                                    "cause": "none"}


def _sessions(n: int, seed: int = 3):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        rounds = rng.randrange(4, 9)
        steps = [(rng.randrange(200, 3000), 50, rng.choice(["bash", "read_file"]), rng.uniform(1, 600))
                 for _ in range(rounds)]
        out.append(make_session(f"s{i}", 0.0, steps))
    return out


def _doctor(lines, **kw) -> PrefixDoctor:
    d = PrefixDoctor(block_tokens=16, **kw)
    for ln in lines:
        d.observe(ln["trajectory_id"], ln["request"], tool_wait_s=ln.get("tool_wait_s"))
    return d


def test_every_injected_breaker_is_found_and_the_clean_log_has_no_alarm():
    clean, broken, truth = build_logs(_sessions(16), seed=1, every=1)
    assert sorted({b for p in truth.values() for b in p.values()}) == sorted(BREAKERS)
    dc = _doctor(clean)
    assert all(t.cause == "none" for r in dc.trajectories.values() for t in r.turns)
    db = _doctor(broken)
    found = {tid: {str(t.turn): t.cause for t in r.turns if t.cause != "none"}
             for tid, r in db.trajectories.items()}
    assert {k: v for k, v in found.items() if v} == truth
    # a break costs hit rate; the clean log's hit rate is the higher
    assert db.hit_rate < dc.hit_rate
    for tid, p in truth.items():
        for k, cause in p.items():
            t = db.trajectories[tid].turns[int(k)]
            assert t.reprefill_tokens > 0 and t.first_diff_field is not None
            if cause == "head_volatile":
                assert t.first_diff_field == "messages[0].content"
                # named on first sight, with what changed: the session's start time
                assert [(v.kind, v.field) for v in t.volatile] == [("date and time", "messages[0].content")]
            else:
                assert t.volatile == ()
            if cause in ("tools_changed", "reordered"):
                assert t.first_diff_field.startswith("tools")


def test_ttl_flags_turns_after_a_long_tool_wait():
    steps = [(500, 10, "bash", 30.0), (500, 10, "bash", 900.0), (500, 10, None, None)]
    lines = session_log("t", [(n, tool, w) for n, _, tool, w in steps])
    d = _doctor(lines, ttl_s=300.0)
    turns = d.trajectories["t"].turns
    assert [t.ttl_expired for t in turns] == [False, False, True]
    assert turns[2].ttl_lost_tokens == turns[2].matched_tokens > 0


def test_bad_log_lines_name_their_line(tmp_path):
    log = tmp_path / "bad.jsonl"
    log.write_text(json.dumps({"trajectory_id": "a", "tokens": [1, 2]}) + "\n"
                   + json.dumps({"trajectory_id": "a", "request": {"messages": "hi"}}) + "\n")
    with pytest.raises(LogError, match="line 2"):
        replay(log, PrefixDoctor())
    with pytest.raises(ValueError):
        PrefixDoctor().observe("x")


def test_cli_json_contract_table_and_plot(tmp_path, capsys):
    from kvtier.cli.main import main
    _, broken, truth = build_logs(_sessions(6), seed=2, every=1)
    log = tmp_path / "log.jsonl"
    log.write_text("".join(json.dumps(x) + "\n" for x in broken))
    assert main(["prefix", str(log), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert 0 < doc["hit_rate"] < 1
    for tid, r in doc["trajectories"].items():
        assert set(r) >= {"hit_rate", "turns"}
        for t in r["turns"]:
            assert set(t) >= {"turn", "prompt_tokens", "matched_tokens", "cause"}
            assert t["cause"] == truth.get(tid, {}).get(str(t["turn"]), "none")
    png = tmp_path / "hit.png"
    assert main(["prefix", str(log), "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "hit rate per trajectory" in out and png.stat().st_size > 0
    assert any(c in out for c in truth[next(iter(truth))].values())
    volatile = [(tid, t) for tid, r in doc["trajectories"].items() for t in r["turns"] if t["cause"] == "head_volatile"]
    assert volatile and "volatile content in the head" in out   # the table names what it saw, where
    tid, t = volatile[0]
    assert f"{tid} turn {t['turn']}: " in out and t["volatile"][0]["field"] in out
