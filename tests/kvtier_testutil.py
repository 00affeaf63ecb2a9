"""Helpers shared by several test modules (pytest puts tests/ on sys.path)."""
from __future__ import annotations

import contextlib
import hashlib
import signal
import subprocess
import sys

import numpy as np


def tiny(arch: str):
    """A 2-layer, hidden-64 fp32 causal LM ("llama" or "qwen2") from a config with seeded weights."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
    kw = dict(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    torch.manual_seed(1234)
    m = LlamaForCausalLM(LlamaConfig(**kw)) if arch == "llama" else Qwen2ForCausalLM(Qwen2Config(**kw))
    return m.eval()


def key(i: int) -> bytes:
    """A 16-byte block key for test block number ``i``."""
    return hashlib.blake2b(i.to_bytes(8, "little"), digest_size=16).digest()


def random_block(i: int, nbytes: int) -> np.ndarray:
    """Deterministic random bytes for test block number ``i``."""
    return np.random.default_rng(i).integers(0, 256, nbytes, dtype=np.uint8)


@contextlib.contextmanager
def session_store(root, model, block_tokens: int, host_frames: int = 32, nvme_frames: int = 64):
    """A TieredStore sized in frames of ``model``'s AgentSession format; integrity checked on exit."""
    from kvtier.engine_adapter.hf import AgentSession
    from kvtier.store.config import StoreConfig
    from kvtier.store.tiered import TieredStore
    fmt = AgentSession.frame_format(model, block_tokens)
    with TieredStore.open(StoreConfig(root=root, host_bytes=host_frames * fmt.frame_bytes,
                                      nvme_bytes=nvme_frames * fmt.frame_bytes,
                                      block_bytes=fmt.frame_bytes)) as s:
        yield s
        s.check_integrity()


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample in Prometheus text (parsed, not string-matched)."""
    from prometheus_client.parser import text_string_to_metric_families
    for fam in text_string_to_metric_families(text):
        for smp in fam.samples:
            if smp.name == name and all(smp.labels.get(k) == v for k, v in labels.items()):
                return smp.value
    raise KeyError(f"{name}{labels} not in metrics")


def kill_when_idle(script: str, *args: str) -> set[int]:
    """Run ``script`` (python -c) with ``args``; it prints ``done ID...`` after each
    acknowledged put and ``idle ...`` when it has put everything.  SIGKILL it at
    ``idle`` and return the acknowledged ids."""
    p = subprocess.Popen([sys.executable, "-c", script, *args], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    done: set[int] = set()
    for line in p.stdout:
        parts = line.split()
        if parts[0] == "idle":
            break
        done |= {int(x) for x in parts[1:]}
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=30)
    assert p.returncode == -signal.SIGKILL, p.stderr.read()[-2000:]
    return done


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    """Run `kvtier <argv>` in-process; returns (exit status, stdout, stderr).  An argparse
    error's SystemExit propagates (tests that expect one use pytest.raises)."""
    from kvtier.cli.main import main
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err
