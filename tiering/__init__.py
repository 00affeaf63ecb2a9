"""Policy, no tensors: cost model, capacity planner, tool-wait predictor,
break-even decisions and prefetch timing, and the HTTP service.

This package must never import torch or ``store``; it reasons about bytes,
seconds and block keys only.
"""

# Lazy exports: `import kvtier.tiering` stays light (no numpy/lmdb until first use).
_LAZY = {
    "ToolWaitPredictor": "kvtier.tiering.predictor",
    "WaitForecast": "kvtier.tiering.predictor",
    "tool_features": "kvtier.tiering.predictor",
    "BreakEvenPolicy": "kvtier.tiering.policies",
    "CostPrices": "kvtier.tiering.policies",
    "make_policy": "kvtier.tiering.policies",
    "POLICY_NAMES": "kvtier.tiering.policies",
    "PointBreakEvenPolicy": "kvtier.tiering.policies",
    "Predictor": "kvtier.tiering.forecast",
}


def __getattr__(name: str):
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'kvtier.tiering' has no attribute {name!r}")
    import importlib
    return getattr(importlib.import_module(mod), name)


def __dir__():
    return sorted(list(globals()) + list(_LAZY))
