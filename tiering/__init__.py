"""Policy, no tensors: cost model, capacity planner, tool-wait predictor,
break-even decisions and prefetch timing, and the HTTP service.

This package must never import torch or ``store``; it reasons about bytes,
seconds and block keys only.
"""
