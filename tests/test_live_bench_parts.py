"""The live benchmark's pure parts (no vLLM): a trace cut to fit a small engine,
the event loop over sessions, a run's summary, ensembles and paired differences,
the configurations' specs."""
from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, replace

import pytest

from kvtier.bench.live.configs import CONFIGS, Sizes, spec_for
from kvtier.bench.live.driver import drive
from kvtier.bench.live.ensemble import config_row, mean_se, paired
from kvtier.bench.live.runs import RunSummary, summarize
from kvtier.bench.live.thread_cpu import TurnMeter
from kvtier.util.stats import interpolated_percentile
from kvtier.bench.live.workload import Fit, fit_trace, paused_working_set
from kvtier.bench.sim.trace import make_session


def trace():
    return [make_session(f"t{i}", 10.0 * i, [(4000, 100, "pytest", 20.0), (800, 100, "bash", 0.5),
                                             (800, 100, "grep", 600.0), (100, 10, None, None)],
                         shared_prefix_id="sys", shared_prefix_tokens=2048) for i in range(5)]


def test_a_trace_is_cut_to_fit_the_engine():
    fit = Fit(sessions=3, turns=3, max_context=1000, time_scale=0.1, max_wait_s=5.0, output_tokens=4)
    ss = fit_trace(trace(), fit)
    assert len(ss) == 3 and all(len(s.turns) == 3 for s in ss)
    assert all(s.final_context() <= 1000 for s in ss)              # the longest context fits
    assert [s.arrival_s for s in ss] == pytest.approx([0.0, 1.0, 2.0])   # arrivals x time scale
    s = ss[0]
    assert s.prefix_id == "sys" and s.prefix_tokens % 32 == 0 and s.prefix_tokens > 0
    assert [t.wait_s for t in s.turns] == [pytest.approx(2.0), pytest.approx(0.05), None]   # scaled; last: none
    assert [t.tool for t in s.turns] == ["pytest", "bash", None]
    assert paused_working_set(ss) == sum(s.final_context() - s.turns[-1].new_tokens - 4 for s in ss)
    # waits capped, and drawn from a real per-call set when given one
    capped = fit_trace(trace(), Fit(sessions=1, turns=4, max_context=2000, time_scale=1.0, max_wait_s=3.0))
    assert max(t.wait_s for t in capped[0].turns if t.wait_s is not None) == 3.0

    @dataclass
    class Call:
        tool: str
        seconds: float
    drawn = fit_trace(trace(), fit, calls=[Call("edit", 0.25)])
    assert {t.tool for t in drawn[0].turns[:-1]} == {"edit"} and drawn[0].turns[0].wait_s == 0.25
    with pytest.raises(ValueError):
        fit_trace([make_session("x", 0, [(10, 1, None, None)])], fit)


class FakeEngine:
    """Answers with the prompt's length; TTFT 1 ms; every full block of a context seen before is cached."""
    def __init__(self):
        self.seen: list[list[int]] = []

    def generate(self, prompt, *, max_tokens, kv_transfer_params=None):
        cached = max((len(p) for p in self.seen if prompt[:len(p)] == p), default=0) // 32 * 32
        self.seen.append(list(prompt))

        class R:
            tokens = tuple([len(prompt) % 97] * max_tokens)
            prompt_tokens, cached_tokens, ttft_s = len(prompt), cached, 0.001
        R.cached_tokens = cached
        return R


def test_the_event_loop_runs_turns_when_their_tools_return():
    ss = fit_trace(trace(), Fit(sessions=2, turns=3, max_context=1000, time_scale=0.01, max_wait_s=1.0,
                                arrival_spread_s=0.0))
    slept, now = [], [0.0]
    run = drive(FakeEngine(), ss, seed=1, vocab=100, clock=lambda: now[0],
                sleep=lambda s: (slept.append(s), now.__setitem__(0, now[0] + s)))
    assert len(run.turns) == 6 and set(run.jct_s) == {"s0", "s1"}
    order = [(t.session, t.turn) for t in run.turns]
    assert order[:2] == [("s0", 0), ("s1", 0)]                     # both arrive at 0
    assert all(b.prompt_tokens > a.prompt_tokens for a, b in zip(run.turns, run.turns[2:])
               if a.session == b.session)                          # contexts grow
    s = summarize("x", 0, run, block_tokens=32, kvtier_stats=None)
    assert s.resumes == 4 and s.misses == 0 and s.recomputed_tokens == 0   # the fake keeps everything
    assert s.p50 == pytest.approx(0.001) and len(s.outputs) == 6


def test_a_runs_engine_time_and_queue_wait_add_up_its_turns():
    from kvtier.bench.live.driver import RunRecord, TurnRecord
    turns = (TurnRecord("s0", 0, 0.0, 0.0, 0.5, 0.4, 100, 0, (1,), "bash"),
             TurnRecord("s1", 0, 0.1, 0.5, 0.8, 0.2, 100, 0, (1,), "bash"),     # queued 0.4 s behind s0
             TurnRecord("s0", 1, 1.0, 1.0, 1.25, 0.2, 200, 96, (2,), None))
    s = summarize("x", 0, RunRecord(turns, {"s0": 1.25, "s1": 0.8}, 1.3), block_tokens=32, kvtier_stats=None)
    assert s.engine_busy_s == pytest.approx(0.5 + 0.3 + 0.25) and s.queue_wait_s == pytest.approx(0.4)
    slower = [replace(s, repeat=r, engine_busy_s=s.engine_busy_s + 0.1 + 0.01 * (r % 2)) for r in range(4)]
    same = [replace(s, repeat=r) for r in range(4)]
    d = paired(slower, same)
    assert d["engine_busy_s"]["resolved"] == 1 and d["engine_busy_s"]["mean"] == pytest.approx(0.105)
    assert d["queue_wait_s"]["resolved"] == 0 and d["queue_wait_s"]["mean"] == 0
    assert config_row(slower, None)["engine_busy_s"] == pytest.approx(1.155)


def _rs(name, rep, ttft, jct, outputs=None):
    return RunSummary(name, rep, tuple(ttft), (jct,), len(ttft), 0, 0, outputs or {("s0", 1): (1,)})


def test_ensembles_and_paired_differences():
    assert mean_se([1.0, 2.0, 3.0]) == pytest.approx((2.0, 1 / math.sqrt(3)))
    assert math.isnan(mean_se([1.0])[1])
    assert interpolated_percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    ref = [_rs("breakeven", r, [0.1, 0.1 + 0.01 * r], 1.0 + 0.1 * r) for r in range(5)]
    slow = [_rs("eager", r, [0.3, 0.3 + 0.01 * r], 1.0 + 0.1 * r + 0.001 * (r % 2)) for r in range(5)]
    d = paired(slow, ref)
    assert d["resume_ttft_p50_s"]["resolved"] == 1 and d["resume_ttft_p50_s"]["mean"] == pytest.approx(0.2)
    assert d["jct_mean_s"]["resolved"] == 0                          # within noise: a tie
    row = config_row(slow, {r: {("s0", 1): (1,)} for r in range(5)})
    assert row["outputs_equal"] is True and row["repeats"] == 5
    assert config_row(slow, {r: {("s0", 1): (2,)} for r in range(5)})["outputs_equal"] is False


def test_a_copy_of_a_configuration_runs_the_same_spec(tmp_path):
    from kvtier.bench.live.configs import base_name
    sz = Sizes(engine_blocks=10, resident_blocks=40, block_bytes=1024, cpu_bytes=4096, host_bytes=8192,
               nvme_bytes=1 << 20)
    kw = dict(model="m", sizes=sz, data_dir=tmp_path, max_model_len=256)
    assert base_name("lru#2") == "lru" and base_name("breakeven") == "breakeven"
    assert spec_for("lru#2", **kw) == spec_for("lru", **kw) and spec_for("resident#3", **kw) == spec_for("resident", **kw)
    assert sz.engine_bytes("resident#2") == sz.engine_bytes("resident") and sz.dram_bytes("recompute#2") == 0
    with pytest.raises(ValueError, match="NAME#N"):
        base_name("lru#x")
    with pytest.raises(ValueError, match="unknown configuration"):
        spec_for("nope#2", **kw)


def test_every_configuration_has_a_spec(tmp_path):
    sz = Sizes(engine_blocks=40, resident_blocks=200, block_bytes=1 << 17, cpu_bytes=2 << 20, host_bytes=4 << 20,
               nvme_bytes=64 << 20)
    for name in CONFIGS:
        spec, hints = spec_for(name, model="m", sizes=sz, data_dir=tmp_path, max_model_len=1000, time_scale=0.5)
        assert (spec.engine_blocks == 200) == (name == "resident")
        assert hints == (name in ("ttl", "eager", "point", "breakeven"))
    spec, _ = spec_for("vllm-cpu-tier", model="m", sizes=sz, data_dir=tmp_path, max_model_len=1000)
    assert spec.cpu_bytes == sz.dram_bytes("breakeven")              # the same DRAM as kvtier's
    spec, _ = spec_for("session-ttl", model="m", sizes=sz, data_dir=tmp_path, max_model_len=1000, time_scale=0.5)
    assert spec.kvtier["lifecycle"] == "ttl" and spec.kvtier["ttl_demote_after_s"] == 15.0
    assert spec_for("point", model="m", sizes=sz, data_dir=tmp_path, max_model_len=1000)[0].kvtier["policy"] == "point"
    # a throttled NVMe tier is kvtier's only, and parses as the plugin's option
    from kvtier.engine_adapter.config import PluginConfig
    lru, _ = spec_for("lru", model="m", sizes=sz, data_dir=tmp_path, max_model_len=1000, nvme_gbps=0.2)
    assert PluginConfig.parse(lru.kvtier, engine="vllm").store_options()["nvme_throttle_gbps"] == 0.2
    assert "nvme_throttle_gbps" not in spec_for("lru", model="m", sizes=sz, data_dir=tmp_path, max_model_len=1000)[0].kvtier
    assert spec_for("vllm-cpu-tier", model="m", sizes=sz, data_dir=tmp_path, max_model_len=1000,
                    nvme_gbps=0.2)[0].kvtier == {}
    with pytest.raises(ValueError, match="unknown configuration"):
        spec_for("oracle", model="m", sizes=sz, data_dir=tmp_path, max_model_len=1000)


def test_the_host_sweep_plot_takes_the_main_ensembles_host_size_where_it_ran_the_sweeps_configs():
    from kvtier.bench.cmd_live import sweep_cells
    row = {"resume_ttft_p50_s": 0.1}
    doc = {"sizes": {"host_bytes": 20}, "configs": {"eager": row, "breakeven": row, "recompute": row},
           "sweep": [{"host_bytes": 40, "configs": {"eager": row, "breakeven": row}},
                     {"host_bytes": 5, "configs": {"eager": row, "breakeven": row}}]}
    cells = sweep_cells(doc)
    assert [c["host_bytes"] for c in cells] == [5, 20, 40] and set(cells[1]["configs"]) == {"eager", "breakeven"}
    doc["configs"].pop("eager")                       # the main ensemble did not run the sweep's configurations
    assert [c["host_bytes"] for c in sweep_cells(doc)] == [5, 40]


def _burn(seconds: float) -> float:
    t0 = time.thread_time()
    while time.thread_time() - t0 < seconds:
        sum(range(1000))
    return time.thread_time() - t0


@pytest.mark.skipif(not TurnMeter.available, reason="the turn meter reads Linux's /proc and RUSAGE_THREAD")
def test_a_turn_meter_counts_kvtier_threads_cpu_and_the_callers_waits():
    used: dict[str, float] = {}
    done = threading.Event()

    def work(name: str) -> None:
        used[name] = _burn(0.05)
        done.wait()             # alive at the meter's stop: a thread's CPU is read while it lives

    threads = [threading.Thread(target=work, args=(n,), name=n) for n in ("kvtier-test", "other-test")]
    meter = TurnMeter()
    mark = meter.start()
    for t in threads:
        t.start()
    while len(used) < 2:
        time.sleep(0.005)       # each sleep: a voluntary switch of this thread
    cost = meter.stop(mark)
    done.set()
    for t in threads:
        t.join()
    assert cost is not None and cost.engine_waits >= 1
    assert cost.kvtier_cpu_s == pytest.approx(used["kvtier-test"], rel=0.3)
    assert cost.kvtier_cpu_s < used["kvtier-test"] + used["other-test"] / 2     # not kvtier's: not counted


def test_a_runs_kvtier_cpu_per_resume_reaches_its_row_and_pairs():
    from kvtier.bench.live.driver import RunRecord, TurnRecord
    def run(cpu: float):
        turns = (TurnRecord("s0", 0, 0.0, 0.0, 0.5, 0.4, 100, 0, (1,), "bash", 0.5, 9),   # a first turn: not a resume
                 TurnRecord("s0", 1, 1.0, 1.0, 1.2, 0.2, 200, 96, (2,), "bash", cpu, 4),
                 TurnRecord("s0", 2, 2.0, 2.0, 2.2, 0.2, 300, 192, (3,), None, cpu + 0.002, 6))
        return RunRecord(turns, {"s0": 2.2}, 2.3)
    s = summarize("x", 0, run(0.001), block_tokens=32, kvtier_stats=None)
    assert s.resume_kvtier_cpu_s == pytest.approx(0.002) and s.resume_engine_waits == 5
    more = [summarize("y", r, run(0.003 + 0.0001 * (r % 2)), block_tokens=32, kvtier_stats=None) for r in range(4)]
    base = [replace(s, repeat=r) for r in range(4)]
    d = paired(more, base)
    assert d["resume_kvtier_cpu_s"]["resolved"] == 1 and d["resume_kvtier_cpu_s"]["mean"] == pytest.approx(0.00205)
    assert config_row(more, None)["resume_kvtier_cpu_s"] == pytest.approx(0.00405)
    unmeasured = [replace(r, resume_kvtier_cpu_s=None, resume_engine_waits=None) for r in base]   # a server's runs
    assert "resume_kvtier_cpu_s" not in config_row(unmeasured, None)
    assert "resume_kvtier_cpu_s" not in paired(more, unmeasured)
