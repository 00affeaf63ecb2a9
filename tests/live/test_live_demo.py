"""``kvtier demo --engine vllm`` end to end, as a user runs it (a subprocess)."""
from __future__ import annotations

import json
import subprocess
import sys


def test_demo_engine_vllm(tiny_model, tmp_path):
    out = subprocess.run([sys.executable, "-m", "kvtier", "demo", "--engine", "vllm", "--json", "--time-scale", "0.5",
                          "--data-dir", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    doc = json.loads(out.stdout)
    assert doc["all_match"] is True and all(t["matches_reference"] for t in doc["turns"])
    assert doc["policy"] == "breakeven" and doc["priced_by"] == "engine"
    assert doc["resumes"] >= doc["sessions"] * 2
    assert sum(doc["served_tokens_by_tier"].values()) > 0                 # kvtier served resumed prefixes
    assert sum(doc["decisions"].values()) >= len(doc["turns"])
    assert all(t["action"] for t in doc["turns"])                        # every pause was priced
