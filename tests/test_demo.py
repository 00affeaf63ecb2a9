"""`kvtier demo`: the end-to-end agent loop reports every resumed turn equal to the uninterrupted run."""
from __future__ import annotations

import json
import subprocess
import sys

from bench.cmd_demo import run_demo


def test_demo_json_contract_and_all_turns_match(tmp_path):
    # the whole loop, tool waits scaled down 20x; the store lives in tmp_path
    doc = run_demo(time_scale=0.05, data_dir=str(tmp_path / "data"), tokens=4)
    assert doc["all_match"] is True
    assert len(doc["turns"]) == 5
    for t in doc["turns"]:
        assert {"tool", "wait_s", "action", "bytes_moved", "resume_stall_s", "matches_reference"} <= set(t)
        assert t["action"] in ("retain", "offload_host", "offload_nvme", "recompute")
        assert t["matches_reference"] is True
        # an offload moved bytes at its pause unless every block was already stored
        if t["action"].startswith("offload"):
            assert t["bytes_moved"] > 0 or t["blocks_reused"] > 0
        else:
            assert t["bytes_moved"] == 0
    assert doc["store"]["misses"] == 0


def test_demo_cli_prints_one_json_document_and_rejects_bad_input():
    r = subprocess.run([sys.executable, "-m", "bench.cli", "demo", "--json", "--time-scale", "0.02",
                        "--model", "qwen2", "--tokens", "3"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)                       # nothing but the document on stdout
    assert doc["all_match"] is True and doc["model"]["arch"] == "qwen2"
    bad = subprocess.run([sys.executable, "-m", "bench.cli", "demo", "--tokens", "0"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "--tokens" in bad.stderr
