"""What the vLLM replay tells the policy about the engine it replays (issue 49's
regression: breakeven's resumes from DRAM fell once the forecast was on by default).

* A session's last round, which no tool follows, prices no pause: as an unhinted
  request it was priced as a pause of the default tool that never resumes, and
  its context was staged into host frames ahead of the sessions that come back.
* The replayed vLLM's pool holds no paused KV, so the pauses are priced at its
  pool use by pauses, none, not at the paused KV over a preset node's pool.
"""
from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
from engines import need_engine  # noqa: E402

need_engine("vllm")

from kvtier.bench.engine_replay.clock import ReplayClock  # noqa: E402
from kvtier.bench.engine_replay.setups import setup_of  # noqa: E402
from kvtier.bench.engine_replay.vllm_side import VllmReplay  # noqa: E402
from kvtier.bench.engine_replay.workload import Geometry, Workload  # noqa: E402
from kvtier.bench.sim.trace import make_session, write_trace  # noqa: E402
from kvtier.cli.main import main  # noqa: E402

SESSIONS, TOOL_ROUNDS = 3, 2     # each session: bash, web_search, then a last round with no tool


def _sessions():
    return [make_session(f"s{i}", 0.5 * i, [(600, 40, "bash", 0.5), (30, 20, "web_search", 4.0),
                                            (20, 10, None, None)])
            for i in range(SESSIONS)]


@pytest.mark.parametrize("policy", ["breakeven", "ttl"])
def test_a_sessions_last_round_starts_no_pause(tmp_path, capsys, policy):
    trace = tmp_path / "t.jsonl"
    write_trace(trace, _sessions())
    assert main(["bench", "engine", "--engine", "vllm", "--trace", str(trace), "--sessions", str(SESSIONS),
                 "--time-scale", "0.01", "--policies", policy, "--data-dir", str(tmp_path / "d"), "--json"]) == 0
    r = json.loads(capsys.readouterr().out)["policies"][policy]
    assert r["resumes"] == SESSIONS * TOOL_ROUNDS and r["bit_exact"] is True
    lc = r["engine"]["lifecycle"]
    # one pause per tool wait, each resumed; the last rounds (no tool) paused nothing
    assert lc["pauses"] == SESSIONS * TOOL_ROUNDS and lc["resumes"] == SESSIONS * TOOL_ROUNDS
    if policy == "breakeven":      # the policy priced exactly those pauses (no recompute of an ended session)
        assert sum(r["engine"]["decisions"].values()) == SESSIONS * TOOL_ROUNDS


def test_the_replayed_vllm_reports_no_paused_kv_in_its_pool(tmp_path):
    geo = Geometry()
    work = Workload.build(_sessions(), geo)
    setup = setup_of("breakeven", "vllm", host_gb=0.01, nvme_gb=0.05, time_scale=0.01,
                     model="gqa-70b", node="pcie5-x16")
    rep = VllmReplay(geo, tmp_path / "d", kvtier_opts=setup.kvtier_opts, primary_chunks=64, hints=True)
    try:
        rep.set_clock(ReplayClock(0.01, work.steps[0].start_s))
        ctl = rep.tier.lifecycle.controller
        for step in work.steps:       # every session paused on its first tool, none resumed
            if step.round == 0:
                rep.begin(step)
                rep.store(step)
                rep.finish(step)
        assert ctl.counter_values()["pauses"] == SESSIONS
        assert ctl.pool_usage is not None and ctl.pool_usage() == 0.0
    finally:
        rep.close()
