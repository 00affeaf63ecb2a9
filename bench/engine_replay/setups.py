"""The compared set-ups, by name: what each policy name means in an engine replay.

* ``breakeven`` (or another tiering policy name): kvtier with hints carrying
  the tool and trajectory, its lifecycle controller driven by the policy.
* ``lru``: kvtier without hints: every block to kvtier host frames, evicted to
  NVMe by recency (the store's own LRU).
* ``ttl``: kvtier with vLLM's fixed-timer session lifecycle (idle TTL, demotion
  age, watermarks 0.9/0.7) and the same hints (whose tool it ignores).
* ``fs`` (vLLM only): vLLM's own file-system tier in kvtier's place.
"""
from __future__ import annotations

from dataclasses import dataclass

SPECIAL = ("lru", "ttl", "fs")


@dataclass(frozen=True)
class Setup:
    name: str
    kvtier_opts: dict | None     # None: vLLM's fs tier
    hints: bool


def setup_of(name: str, engine: str, *, host_gb: float, nvme_gb: float, time_scale: float,
             model: str, node: str) -> Setup:
    """Raises ValueError for a name that is not a policy or a baseline of ``engine``."""
    base = {"host_gb": host_gb, "nvme_gb": nvme_gb, "durable": False}
    if name == "fs":
        if engine != "vllm":
            raise ValueError("the fs baseline is vLLM's own file-system tier: --engine vllm only")
        return Setup(name, None, False)
    if name == "lru":
        return Setup(name, {**base, "default_tier": "host"}, False)
    if name == "ttl":
        return Setup(name, {**base, "default_tier": "host", "lifecycle": "ttl", "time_scale": time_scale}, True)
    from kvtier.tiering.policy.policies import POLICY_NAMES
    if name not in POLICY_NAMES or name == "oracle":
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(SPECIAL + tuple(p for p in POLICY_NAMES if p != 'oracle'))}")
    return Setup(name, {**base, "policy": name, "model": model, "node": node, "time_scale": time_scale}, True)
