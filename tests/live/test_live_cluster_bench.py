"""``kvtier bench live --engines 2``: two ``vllm serve`` engines (the CPU build, tiny model) with
kvtier on one shared redis-server, behind kvtier's router, two routers compared on the same
sessions.  The cluster is started and stopped by the command itself (every process by its PID);
the test checks the JSON contract, that every request went through a router to one of the two
engines, that greedy outputs are the same under both routers, that sticky never moves a session
while both engines are up, and that nothing is left listening afterwards."""
from __future__ import annotations

import json
import math
import shutil
import socket
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from kvtier.bench.sim.trace import make_session, write_trace
from kvtier.cli.main import main


@pytest.mark.timeout(300)
def test_bench_live_engines_2_compares_routers_on_one_shared_tier(tiny_model, tmp_path, capsys):
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    trace = tmp_path / "t.jsonl"
    write_trace(trace, [make_session(f"a{i}", 0.1 * i, [(200, 8, "pytest", 0.3), (60, 8, "bash", 0.2),
                                                        (60, 8, None, None)]) for i in range(3)])
    assert main(["bench", "live", "--engines", "2", "--routers", "prefix-load,sticky", "--repeat", "1",
                 "--trace", str(trace), "--sessions", "3", "--turns", "3", "--max-context", "500",
                 "--model-dir", str(Path(tiny_model).parent), "--data-dir", str(tmp_path / "cluster"),
                 "--json"]) == 0
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert "engine 1/2 up" in err and "engine 2/2 up" in err          # progress on stderr while engines start
    assert doc["routers"] == ["prefix-load", "sticky"] and doc["reference"] == "prefix-load" and doc["repeat"] == 1
    c = doc["cluster"]
    assert c["engines"] == 2 and c["block_tokens"] == 32 and c["vllm"].startswith("0.32")
    engines = {urlsplit(u).netloc for u in c["engine_urls"]}
    assert len(engines) == 2
    turns = doc["workload"]["turns"]
    assert turns == 9 and doc["workload"]["resumes"] == 6
    for name, row in doc["configs"].items():
        # every request went through the router, to one of the two engines, and none failed
        assert row["failed_turns"] == [] and row["unrouted"] == 0 and row["turns"] == turns
        assert set(row["requests_by_engine"]) <= engines and sum(row["requests_by_engine"].values()) == turns
        for k in ("resume_ttft_p50_s", "resume_ttft_p99_s", "jct_mean_s"):
            assert row[k] > 0 and math.isfinite(row[k])
        for k in ("hit_rate", "resume_hit_rate", "engine_cache_hit_rate"):
            assert 0 <= row[k] <= 1
        assert row["resume_hit_rate"] > 0                     # a resume finds its earlier blocks somewhere
        assert sum(row["stored_chunks_by_tier"].values()) > 0  # kvtier's counters, from both engines' /metrics
    # greedy: the same tokens under either router (compared with the reference's, prefix-load)
    assert doc["configs"]["sticky"]["outputs_equal"] is True and doc["configs"]["prefix-load"]["outputs_equal"] is None
    assert doc["configs"]["sticky"]["moves"] == 0            # both engines up: no session leaves its engine
    pair = doc["paired"]["sticky"]
    assert set(pair) >= {"resume_ttft_p50_s", "resume_ttft_p99_s", "jct_mean_s", "hit_rate", "moves"}
    assert list(doc["paired"]) == ["sticky"]
    # the cluster is gone: nothing listens on the engines' ports
    for netloc in engines:
        host, port = netloc.rsplit(":", 1)
        with pytest.raises(OSError), socket.create_connection((host, int(port)), timeout=1):
            pass
