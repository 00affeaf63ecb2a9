"""Policy, no tensors: cost model, capacity planner, tool-wait predictor,
break-even decisions and prefetch timing, and the HTTP service.

This package must never import torch or ``store``; it reasons about bytes,
seconds and block keys only.
"""

# Lazy exports: `import kvtier.tiering` stays light (no numpy/lmdb until first use).
_LAZY = {
    "ToolWaitPredictor": "kvtier.tiering.forecasting.predictor",
    "WaitForecast": "kvtier.tiering.forecasting.predictor",
    "tool_features": "kvtier.tiering.forecasting.predictor",
    "BreakEvenPolicy": "kvtier.tiering.policy.policies",
    "CostPrices": "kvtier.tiering.policy.policies",
    "make_policy": "kvtier.tiering.policy.policies",
    "POLICY_NAMES": "kvtier.tiering.policy.policies",
    "PointBreakEvenPolicy": "kvtier.tiering.policy.policies",
    "Predictor": "kvtier.tiering.forecasting.forecast",
}


def __getattr__(name: str):
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'kvtier.tiering' has no attribute {name!r}")
    import importlib
    return getattr(importlib.import_module(mod), name)


def __dir__():
    return sorted(list(globals()) + list(_LAZY))
