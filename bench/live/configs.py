"""The configurations a live benchmark compares, by name, as engine specs.

* ``resident``: the engine's own cache big enough to keep every paused
  trajectory (vLLM's prefix cache, no connector): the limit, the state never leaves.
* ``recompute``: vLLM's prefix cache alone in the small cache.
* ``vllm-cpu-tier``: vLLM's own CPU tier (its LRU, nothing below) with the same
  DRAM as kvtier's configurations hold (its CPU tier + kvtier's host frames),
  on kvtier's CPU copy worker (vLLM's refuses the CPU platform).
* ``lru``: kvtier, no policy and no holds: every block to its host frames,
  pushed to NVMe by the store's recency order.
* ``ttl``: Continuum's rule, no forecast: hold a paused trajectory for a TTL
  set from its reload cost, then to host (policy ``ttl_reload``), tool hints sent.
* ``eager``: offload at the pause and stage back at once; never holds (the
  policy never answers ``retain``), tool hints sent.
* ``point``, ``breakeven`` (or any other registered policy name): kvtier's
  forecast lifecycle driven by that policy (hold and stage by the predicted
  mean; by the distribution), tool hints sent.
* ``session-ttl``: kvtier with vLLM main's fixed-timer session lifecycle (every
  pause to host, demoted after ``ttl_demote_after_s``, forgotten after
  ``ttl_idle_s``; both x the workload's time scale), tool hints sent (it ignores the tool).

A scale model (:mod:`.scale`) gives kvtier's configurations its options
(target ``model``/``node`` pricing, ``time_scale``, ``link_gbps``,
``nvme_throttle_gbps``) and ``vllm-cpu-tier`` the same link; ``resident`` and
``recompute`` move nothing and run as they are.

``NAME#2`` (``#`` and a number) is another copy of configuration ``NAME``: an
A/A control, whose paired differences with ``NAME`` show what an ensemble on
this machine calls a difference between two identical configurations.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kvtier.engine_adapter.vllm_inprocess import EngineSpec

if TYPE_CHECKING:
    from kvtier.bench.live.scale import ScaleModel

CONFIGS = ("resident", "recompute", "vllm-cpu-tier", "lru", "ttl", "eager", "point", "breakeven")
FIXED = ("resident", "recompute", "vllm-cpu-tier", "lru", "ttl", "session-ttl")
TTL_POLICY = "ttl_reload"      # the ``ttl`` configuration's policy (Continuum's hold, no forecast)
GB = 1e9


def base_name(name: str) -> str:
    """The configuration ``name`` runs (``lru#2``: ``lru``, see the module doc).
    Raises ValueError for a copy suffix that is not a number."""
    base, sep, copy = name.partition("#")
    if sep and not copy.isdigit():
        raise ValueError(f"configuration {name!r}: a copy is NAME#N, N a number")
    return base


def checked_name(name: str) -> str:
    """``name``'s configuration (:func:`base_name`), known to run.  Raises
    ValueError for an unknown one (or a bad copy suffix)."""
    base = base_name(name)
    if base not in FIXED:
        from kvtier.tiering.policy.policies import POLICY_NAMES
        if base not in POLICY_NAMES or base == "oracle":
            raise ValueError(f"unknown configuration {name!r}; known: {', '.join(CONFIGS)} "
                             f"(or any policy: {', '.join(p for p in POLICY_NAMES if p != 'oracle')})")
    return base


@dataclass(frozen=True)
class Sizes:
    """Memory of every configuration.  ``engine_blocks``: the small engine cache;
    ``resident_blocks``: the limit's; ``cpu_bytes``: vLLM's CPU tier in front of
    kvtier (its staging area); ``host_bytes``/``nvme_bytes``: kvtier's tiers."""
    engine_blocks: int
    resident_blocks: int
    block_bytes: int
    cpu_bytes: int
    host_bytes: int
    nvme_bytes: int

    def dram_bytes(self, name: str) -> int:
        """Host DRAM a configuration holds for KV (outside the engine's cache)."""
        if base_name(name) in ("resident", "recompute"):
            return 0
        return self.cpu_bytes + self.host_bytes

    def engine_bytes(self, name: str) -> int:
        return (self.resident_blocks if base_name(name) == "resident" else self.engine_blocks) * self.block_bytes


def spec_for(name: str, *, model: str, sizes: Sizes, data_dir: Path, max_model_len: int,
             time_scale: float = 1.0, nvme_gbps: float | None = None,
             scale: "ScaleModel | None" = None) -> tuple[EngineSpec, bool]:
    """The engine spec of configuration ``name`` and whether its requests carry
    kvtier's tool hints; ``nvme_gbps``: kvtier's NVMe tier throttled to this
    (``nvme_throttle_gbps``; None: the disk's own speed); ``scale``: a scale
    model's settings (module doc; its NVMe speed wins over ``nvme_gbps``).
    Raises ValueError for an unknown name."""
    name = checked_name(name)
    small = dict(model=model, engine_blocks=sizes.engine_blocks, max_model_len=max_model_len)
    if name == "resident":
        return EngineSpec(model=model, engine_blocks=sizes.resident_blocks, max_model_len=max_model_len), False
    if name == "recompute":
        return EngineSpec(**small), False
    link = {"link_gbps": scale.link_gbps} if scale is not None else {}
    if name == "vllm-cpu-tier":
        return EngineSpec(**small, offload="vllm-cpu-tier", cpu_bytes=sizes.dram_bytes(name), **link), False
    base = {"data_dir": str(data_dir), "host_gb": sizes.host_bytes / GB, "nvme_gb": sizes.nvme_bytes / GB,
            "durable": False, **({"nvme_throttle_gbps": nvme_gbps} if nvme_gbps else {}),
            **(scale.kvtier_options() if scale is not None else {})}
    if name == "lru":
        opts, hints = {**base, "policy": "off", "default_tier": "host", "hold_share": 0}, False
    elif name == "session-ttl":
        opts, hints = {**base, "policy": "off", "default_tier": "host", "lifecycle": "ttl",
                       "ttl_idle_s": 300.0 * time_scale, "ttl_demote_after_s": 30.0 * time_scale}, True
    elif name == "ttl":
        opts, hints = {**base, "policy": TTL_POLICY}, True
    else:
        opts, hints = {**base, "policy": name}, True
    return EngineSpec(**small, offload="kvtier", cpu_bytes=sizes.cpu_bytes, kvtier=opts), hints
