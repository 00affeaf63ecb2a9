"""``kvtier bench live --url`` against a real ``vllm serve`` with kvtier's connector.

The server is vLLM's OpenAI server (``python -m vllm.entrypoints.openai.api_server``,
what ``vllm serve`` runs; see test_live_serve.py) on the tiny random-weight
model, on 127.0.0.1 at an explicit port, started with
``--enable-prompt-tokens-details`` (the cached-token count the benchmark needs)
and stopped by its PID.  Its engine cache (24 blocks) is smaller than the
sessions' paused working set, so resumes go through kvtier's connector."""
from __future__ import annotations

import json
import math
import signal
import subprocess

import pytest

from kvtier.bench.sim.trace import make_session, write_trace
from kvtier.cli.main import main
from remote_servers import free_port
from vllm_server import start_api_server, wait_healthy

CONFIG = {"kv_connector": "KvtierConnector", "kv_role": "kv_both",
          "kv_connector_extra_config": {"cpu_bytes_to_use": 1 << 20,
                                        "kvtier": {"nvme_gb": 0.05, "host_gb": 0.002}}}


@pytest.mark.timeout(900)
def test_bench_live_url_on_vllm_serve_with_kvtier(tiny_model, tmp_path, capsys):
    port = free_port()
    cfg = json.loads(json.dumps(CONFIG))
    cfg["kv_connector_extra_config"]["kvtier"]["data_dir"] = str(tmp_path / "kvtier")
    log = open(tmp_path / "server.log", "w")
    proc = start_api_server(tiny_model, port, cfg, log, blocks=24, max_model_len=736,
                            extra=("--enable-prompt-tokens-details",))
    url = f"http://127.0.0.1:{port}"
    trace = tmp_path / "t.jsonl"
    write_trace(trace, [make_session(f"a{i}", 0.2 * i, [(300, 8, "pytest", 0.3), (60, 8, "bash", 0.1),
                                                        (60, 8, None, None)]) for i in range(3)])
    try:
        wait_healthy(proc, url, tmp_path / "server.log", 300)
        assert main(["bench", "live", "--url", url, "--url-name", "kvtier-serve", "--trace", str(trace),
                     "--sessions", "3", "--turns", "3", "--max-context", "600", "--repeat", "2",
                     "--plots", str(tmp_path / "plots"), "--json"]) == 0
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
        log.close()
    doc = json.loads(capsys.readouterr().out)
    e = doc["engine"]
    assert e["in_process"] is False and e["model"] == tiny_model and e["vllm"].startswith("0.32")
    assert e["block_tokens"] == 32 and e["block_tokens_from"] == "server" and e["kvtier_metrics"] is True
    assert list(doc["configs"]) == ["kvtier-serve"] and doc["repeat"] == 2 and doc["workload"]["resumes"] == 6
    row = doc["configs"]["kvtier-serve"]
    for k in ("resume_ttft_p50_s", "resume_ttft_p99_s", "jct_mean_s"):
        assert row[k] > 0 and math.isfinite(row[k]) and row[k + "_se"] >= 0
    assert row["resumes"] == 6 and row["repeats"] == 2
    assert row["outputs_equal"] is True                   # greedy: repeat 2 answered as repeat 1 did
    # kvtier's counters, read from the server's /metrics, per repeat
    assert sum(row["stored_chunks_by_tier"].values()) > 0 and sum(row["decisions"].values()) > 0
    assert row["errors"]["contained_errors"] == 0 and row["errors"]["hint_rejections"] == 0
    assert [p.endswith("ttft_cdf.png") for p in doc["plots"]] == [True]
