"""``kvtier bench engine`` end to end on a tiny trace: the JSON the issue asks
for, every resume bit-exact, and bad input as one line with exit 2."""
from __future__ import annotations

import gc
import json

import pytest

pytest.importorskip("torch")
from engines import need_engine  # noqa: E402

need_engine("sglang")
import kvtier.engine_adapter.sglang  # noqa: E402,F401

from kvtier.bench.sim.trace import make_session, write_trace  # noqa: E402
from kvtier.cli.main import main  # noqa: E402


def tiny_trace(path) -> str:
    sessions = [make_session(f"s{i}", 0.5 * i, [(600, 40, "bash", 0.5), (30, 20, "web_search", 4.0),
                                                (20, 10, None, None)])
                for i in range(4)]
    write_trace(path, sessions)
    return str(path)


def test_engine_replay_json_and_bit_exact_resumes(tmp_path, capsys):
    trace = tiny_trace(tmp_path / "t.jsonl")
    assert main(["bench", "engine", "--engine", "sglang", "--trace", trace, "--sessions", "3",
                 "--time-scale", "0.01", "--policies", "breakeven,lru", "--data-dir", str(tmp_path / "d"),
                 "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["engine"] == "sglang"
    assert gc.get_freeze_count() == 0        # the replay froze the start-up heap and let it go again
    c = doc["config"]
    assert c["bytes_per_token"] == 2048 and c["sessions"] == 3 and c["resumes"] == 6
    assert c["host_bytes"] > 0 and c["nvme_bytes"] >= c["peak_paused_bytes"] > 0
    for name in ("breakeven", "lru"):
        r = doc["policies"][name]
        assert set(r) >= {"resumes", "load_p50_s", "load_p99_s", "served", "bytes_written", "bytes_read",
                          "bit_exact"}
        assert r["resumes"] == 6 and sum(r["served"].values()) == 6 and set(r["served"]) == {
            "host", "nvme", "remote", "miss"}
        assert r["bit_exact"] is True and r["served"]["miss"] == 0
        assert r["bytes_written"] > 0 and r["bytes_read"] > 0
    lc = doc["policies"]["breakeven"]["engine"]["lifecycle"]
    assert lc["pauses"] == 6 and lc["foreground"]["loads"] == 12    # every resume's batch_exists and batch_get_v1 marked
    for name in ("breakeven", "lru"):   # the slowest resumes, slowest first, with what overlapped them
        r = doc["policies"][name]
        slow = r["breakdown"]["slowest"]
        assert 1 <= len(slow) <= 5 and [x["load_s"] for x in slow] == sorted((x["load_s"] for x in slow), reverse=True)
        assert slow[0]["load_s"] >= round(r["load_p99_s"], 4) - 1e-4
        assert all(set(x) >= {"session", "round", "blocks", "served", "host_blocks", "moves", "own_s"} for x in slow)
        assert all(0 <= x["host_blocks"] <= x["blocks"] for x in slow)
    assert doc["policies"]["lru"]["breakdown"]["resumes_overlapped"] == 0     # no lifecycle: nothing moves


@pytest.mark.parametrize("argv, flag", [
    (["--engine", "sglang", "--policies", "fs"], "--policies"),
    (["--engine", "vllm", "--policies", "nope"], "--policies"),
    (["--engine", "sglang", "--bytes-per-token", "100"], "--bytes-per-token"),
])
def test_bad_input_exits_2_with_one_line(tmp_path, capsys, argv, flag):
    trace = tiny_trace(tmp_path / "t.jsonl")
    assert main(["bench", "engine", "--trace", trace, *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("kvtier bench engine: error:") and flag in err[0]


def test_engine_replay_runs_the_prefetch_baselines_bit_exact(tmp_path, capsys):
    # eager (RFC #57103's prefetch at the pause) and point (Tokencake's mean minus reload) by name
    trace = tiny_trace(tmp_path / "t.jsonl")
    assert main(["bench", "engine", "--engine", "sglang", "--trace", trace, "--sessions", "3",
                 "--time-scale", "0.01", "--policies", "eager,point", "--data-dir", str(tmp_path / "d"),
                 "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    for name in ("eager", "point"):
        r = doc["policies"][name]
        assert r["resumes"] == 6 and r["bit_exact"] is True and sum(r["served"].values()) == 6
