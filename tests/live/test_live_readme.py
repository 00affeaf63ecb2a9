"""The README's CPU vLLM commands, run as written: the server block, then the request block.

The blocks marked ``<!-- readme-test: live -->`` run in order as one script in the repository
root (the server block calls ``ci/live-env.sh``, which finds this environment already built),
with this environment's ``bin`` first on PATH so ``kvtier`` is the one installed beside vLLM.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from readme_blocks import README, bash_script, blocks


def test_the_readme_cpu_engine_commands_serve_a_hinted_request_and_count_it(tiny_model):
    # tiny_model: skips (or fails, under KVTIER_LIVE_REQUIRED=1) without a runnable vLLM
    live = [b for b in blocks() if b.mark == "live"]
    assert len(live) >= 2, "the README's CPU engine blocks are marked live"
    script = "".join(bash_script(b) for b in live)
    here = Path(sys.executable).parent
    env = dict(os.environ, PYTHONSAFEPATH="1", KVTIER_LIVE_VENV=str(here.parent),   # refresh this env
               PATH=f"{here}{os.pathsep}{os.environ.get('PATH', '')}")
    r = subprocess.run(["bash", "-c", script], cwd=README.parent, env=env, capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-4000:]}"
    assert '"choices"' in r.stdout                     # the completion came back
    assert "vllm:kvtier_" in r.stdout                  # the connector's counters are in /metrics
    assert "Traceback" not in r.stdout
