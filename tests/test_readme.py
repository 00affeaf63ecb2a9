"""Every command of the README runs as written (see ``readme_blocks`` for the marks)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from engines import need_engine
from readme_blocks import README, Block, bash_script, blocks, console_command

pytestmark = pytest.mark.slow
MAX_LINES = 250
_BLOCKS = blocks()


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONSAFEPATH="1", COLUMNS="200")
    env.setdefault("KVTIER_LOG_LEVEL", "WARNING")
    return env


def _cwd(block: Block, tmp_path) -> str:
    return str(README.parent) if block.mark == "repo" else str(tmp_path)


def test_the_readme_is_short_and_marks_every_block_it_leaves_out():
    assert len(README.read_text().splitlines()) <= MAX_LINES
    for b in _BLOCKS:
        if b.mark == "skip":
            assert b.reason, f"{b.name}: a skipped block says why"
    assert sum(b.mark is None or b.mark == "repo" for b in _BLOCKS) >= 5


@pytest.mark.parametrize("block", [b for b in _BLOCKS if b.mark in (None, "repo")],
                         ids=lambda b: b.name)
def test_readme_block_runs_as_written(block: Block, tmp_path):
    for engine in ("vllm", "sglang"):
        if f"--engine {engine}" in block.text:      # a replay through the engine's own classes
            need_engine(engine)
    if block.lang == "python":
        r = subprocess.run([sys.executable, "-c", block.text], cwd=_cwd(block, tmp_path),
                           env=_env(), capture_output=True, text=True, timeout=600)
    elif block.lang == "bash":
        r = subprocess.run(["bash", "-c", bash_script(block)], cwd=_cwd(block, tmp_path),
                           env=_env(), capture_output=True, text=True, timeout=900)
    else:
        cmd, first = console_command(block)
        r = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], cwd=_cwd(block, tmp_path),
                           env=_env(), capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-2000:]
        assert r.stdout.splitlines()[0].rstrip() == first.rstrip()
        return
    assert r.returncode == 0, f"{block.name} exit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    assert "Traceback" not in r.stderr
