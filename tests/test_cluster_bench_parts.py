"""The cluster benchmark's parts that need no engine: the specs and options, the hit rates and
moved resumes of a run, the tables, redis-server missing, and the flags of ``--engines``
(the live run: tests/live/test_live_cluster_bench.py)."""
from __future__ import annotations

import pytest

from kvtier.bench.live.cluster import Cluster, ClusterError, ClusterSpec, redis_binary
from kvtier.bench.live.cluster_bench import (ClusterBenchOptions, ClusterRun, _hit_rates, _moves,
                                             print_cluster_tables)
from kvtier.bench.live.driver import RunRecord, TurnRecord
from kvtier.cli.main import main


def test_the_spec_caps_the_context_at_what_the_engine_cache_holds_and_refuses_bad_sizes(tmp_path):
    assert ClusterSpec("m", tmp_path, engine_blocks=24, max_model_len=2048).context_tokens == 23 * 32
    assert ClusterSpec("m", tmp_path, engine_blocks=100, max_model_len=600).context_tokens == 600
    with pytest.raises(ValueError, match="engines must be >= 1"):
        ClusterSpec("m", tmp_path, engines=0)
    with pytest.raises(ValueError, match="engine_blocks"):
        ClusterSpec("m", tmp_path, engine_blocks=1)
    with pytest.raises(ValueError, match="data_dir and remote_url itself"):
        ClusterSpec("m", tmp_path, kvtier={"nvme_gb": 1, "remote_url": "redis://x"})
    with pytest.raises(ValueError, match="unknown routing policy 'random'; known: prefix-load"):
        Cluster(ClusterSpec("m", tmp_path), ("prefix-load", "random"))


def test_no_redis_server_is_one_clear_error_and_starts_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(ClusterError, match="redis-server is not installed"):
        redis_binary()
    c = Cluster(ClusterSpec("m", tmp_path / "w"), ("sticky",))
    with pytest.raises(ClusterError, match="redis-server is not installed"):
        with c:
            pass
    assert c.engines == [] and c.redis is None


def test_options_pair_with_prefix_load_unless_told():
    assert ClusterBenchOptions(("round-robin", "prefix-load")).ref == "prefix-load"
    assert ClusterBenchOptions(("round-robin", "sticky")).ref == "round-robin"
    assert ClusterBenchOptions(("round-robin", "sticky"), reference="sticky").ref == "sticky"
    for bad in ((), ("sticky", "sticky")):
        with pytest.raises(ValueError, match="empty or names one twice"):
            ClusterBenchOptions(bad)
    with pytest.raises(ValueError, match="not among the routers"):
        ClusterBenchOptions(("sticky",), reference="prefix-load")


def _turn(sid: str, k: int, prompt: int, cached: int) -> TurnRecord:
    return TurnRecord(sid, k, 0.0, 0.0, 1.0, 0.1, prompt, cached, (1, 2), None)


def test_hit_rates_and_moved_resumes_of_a_run():
    turns = (_turn("s0", 0, 100, 0), _turn("s0", 1, 200, 96), _turn("s1", 0, 100, 0), _turn("s1", 1, 200, 192))
    run = ClusterRun(RunRecord(turns, {"s0": 2.0, "s1": 2.0}, 3.0),
                     {("s0", 0): "e1", ("s0", 1): "e1", ("s1", 0): "e1", ("s1", 1): "e2"}, ())
    h = _hit_rates(run, loaded_tokens=64)
    assert h["hit_rate"] == pytest.approx(288 / 600) and h["resume_hit_rate"] == pytest.approx(288 / 400)
    assert h["engine_cache_hit_rate"] == pytest.approx(224 / 600)       # 64 of the cached tokens kvtier loaded
    assert _moves(run) == 1                                             # s1's resume went to e2


def _row(ttft: float) -> dict:
    row = {k: v for k in ("hit_rate", "resume_hit_rate", "engine_cache_hit_rate", "moves")
           for k, v in ((k, 0.5), (k + "_se", 0.01))}
    row.update(resume_ttft_p50_s=ttft, resume_ttft_p50_s_se=0.001, resume_ttft_p99_s=ttft * 2,
               resume_ttft_p99_s_se=0.002, jct_mean_s=3.0, jct_mean_s_se=0.1, served_chunks_by_tier={"remote": 4.0},
               outputs_equal=True)
    return row


def test_the_tables_name_every_router_and_the_pair(capsys):
    d = {"mean": 0.02, "se": 0.005, "resolved": 1}
    doc = {"machine": {"label": "vLLM's CPU build", "cpus": 2},
           "cluster": {"engines": 2, "engine_blocks": 20, "block_tokens": 32, "kvtier": {"nvme_gb": 0.001},
                       "shared_tier": "redis-server", "omp_threads_per_engine": 1},
           "workload": {"sessions": 4, "resumes": 8, "paused_working_set_tokens": 1600}, "wall_s": 60.0,
           "repeat": 5, "reference": "prefix-load",
           "configs": {"prefix-load": _row(0.05), "round-robin": _row(0.07)},
           "paired": {"round-robin": {k: d for k in ("hit_rate", "engine_cache_hit_rate", "resume_ttft_p50_s",
                                                     "resume_ttft_p99_s", "jct_mean_s")}}}
    print_cluster_tables(doc)
    out = capsys.readouterr().out
    assert "prefix-load" in out and "round-robin" in out and "paired differences: router - prefix-load" in out
    assert "+20 ± 5 (higher)" in out                                    # the p50 difference, in ms


@pytest.mark.parametrize("args, message", [
    (("--engines", "2", "--url", "http://x"), "--url does not apply with --engines"),
    (("--engines", "2", "--configs", "lru", "--layers", "2"), "--configs, --layers do not apply with --engines"),
    (("--engines", "1",), "a cluster has at least 2 engines"),
    (("--routers", "sticky",), "--routers applies only with --engines"),
    (("--engines", "2", "--routers", "prefix-load,random"), "unknown routing policy 'random'"),
])
def test_cluster_flags_are_checked_before_anything_starts(capsys, args, message):
    assert main(["bench", "live", *args]) == 2
    assert message in capsys.readouterr().err
