"""kvtier: tiered KV-cache offload for LLM engines that serve agents.

The names a program needs, importable from here (each is imported on first use, so
``import kvtier`` stays cheap and imports neither torch nor the store)::

    from kvtier import TieredStore, StoreConfig, chain_keys, Namespace
    from kvtier import ToolWaitPredictor, make_policy, PauseContext, get_preset, get_node

=====================  =======================================================
``TieredStore``        the block store: host frames, NVMe slabs, an optional remote tier
``StoreConfig``        its configuration (``StoreConfig.from_env`` applies ``KVTIER_*``)
``StoreError``         what the store raises on a damaged or unusable store
``chain_keys``         content-addressed keys of a token sequence's blocks
``Namespace``          the model and KV dtype keys are scoped to
``ToolWaitPredictor``  learns how long each tool keeps a trajectory paused
``make_policy``        a pause policy by name ("breakeven", "lru", "ttl", ...)
``PauseContext``       what a policy decides about: tool, KV bytes, context
``get_preset``         a model's geometry by preset name ("llama-3.1-8b", ...)
``get_node``           a node's hardware by preset name ("h100x8", ...)
``MissingExtra``       an optional package is missing (the message names the extra)
=====================  =======================================================

The rooms (source folders at the repository's top level, mapped under this
package by ``pyproject.toml``): ``kvtier.tiering`` (policy, no tensors),
``kvtier.store`` (bytes on host, disk and a remote tier), ``kvtier.dma`` (device <->
host movement), ``kvtier.engine_adapter`` (transformers, SGLang, vLLM),
``kvtier.bench`` (benchmarks, the trace simulator), ``kvtier.cli`` (the ``kvtier``
command), ``kvtier.util`` (small helpers both share).
"""
from __future__ import annotations

import importlib
from typing import Any

from kvtier.extras import MissingExtra, require

__version__ = "0.2.0"   # the one place: pyproject.toml reads it (dynamic version)

# name -> the module that defines it
_LAZY: dict[str, str] = {
    "TieredStore": "kvtier.store",
    "StoreConfig": "kvtier.store.config",
    "StoreError": "kvtier.store.errors",
    "chain_keys": "kvtier.store.keys",
    "Namespace": "kvtier.store.keys",
    "ToolWaitPredictor": "kvtier.tiering",
    "make_policy": "kvtier.tiering",
    "PauseContext": "kvtier.tiering.model.decision",
    "get_preset": "kvtier.tiering.model.presets",
    "get_node": "kvtier.tiering.model.presets",
}

__all__ = ["TieredStore", "StoreConfig", "StoreError", "chain_keys", "Namespace", "ToolWaitPredictor",
           "make_policy", "PauseContext", "get_preset", "get_node", "MissingExtra", "require", "__version__"]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'kvtier' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value          # the next access skips this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
