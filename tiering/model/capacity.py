"""Capacity planning: how many trajectories a node's KV pool holds.

The reference text's equations (000, "Capacity for Agent Workloads"):

    (3)  C_HBM = M_weights + M_activations + M_runtime + M_KV
    (4)  M_weights = N_params * b_weight / (TP * PP)            (per device)
    (5)  M_KV = C_HBM - (M_weights + M_activations + M_runtime)
    (6)  M_demand = B * (M_avg + K_avg) * m_token                (nothing shared)
    (7)  M_demand = (S_shared + B * ((1 - sigma) * M_avg + K_avg)) * m_token + Pool_headroom

Here a trajectory's context ``M_avg`` *includes* the shared prefix, so
``sigma = S_shared / M_avg`` and its private state is ``M_avg - S_shared``
context tokens plus ``K_avg`` output tokens (Napkin Math 0.7, step 5).
``headroom`` is a fraction of the KV pool kept free; the shared prefix is
stored once, out of the remainder.  All byte figures are node-wide unless a
name says ``device``.  Pure functions on frozen values; bad input raises
ValueError with a one-line message.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from kvtier.tiering.model.costmodel import GB, ModelGeometry


def _check_nonneg(name: str, v: float) -> None:
    if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
        raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")


def weights_bytes(params: float, bytes_per_param: float = 2.0, *, tp: int = 1, pp: int = 1) -> float:
    """Equation 4: weight bytes per device, N_params * b_weight / (TP * PP).

    With tp = pp = 1 this is the node-wide total.  Raises ValueError on
    non-positive inputs.
    """
    if not (params > 0 and bytes_per_param > 0):
        raise ValueError(f"params and bytes per parameter must be positive, got {params!r}, {bytes_per_param!r}")
    if not (isinstance(tp, int) and isinstance(pp, int) and tp >= 1 and pp >= 1):
        raise ValueError(f"tp and pp must be integers >= 1, got {tp!r}, {pp!r}")
    return params * bytes_per_param / (tp * pp)


@dataclass(frozen=True)
class NodeBudget:
    """Equation 3 for one node: HBM split into weights, activations, runtime and KV.

    Raises ValueError (at construction) if any figure is negative or the
    static reservations leave no KV pool ("weights larger than memory").
    """

    hbm_bytes: float
    weights_bytes: float
    runtime_bytes: float = 0.0
    activations_bytes: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.hbm_bytes) and self.hbm_bytes > 0):
            raise ValueError(f"HBM must be a positive number of bytes, got {self.hbm_bytes!r}")
        for name in ("weights_bytes", "runtime_bytes", "activations_bytes"):
            _check_nonneg(name.replace("_bytes", ""), getattr(self, name))
        static = self.weights_bytes + self.runtime_bytes + self.activations_bytes
        if static >= self.hbm_bytes:
            raise ValueError(
                f"weights ({self.weights_bytes / GB:.1f} GB) + runtime and activations "
                f"({(self.runtime_bytes + self.activations_bytes) / GB:.1f} GB) do not fit in "
                f"{self.hbm_bytes / GB:.1f} GB of HBM: no room left for a KV pool")

    @property
    def kv_pool_bytes(self) -> float:
        """Equation 5: HBM left for the paged KV pool (always > 0)."""
        return self.hbm_bytes - self.weights_bytes - self.runtime_bytes - self.activations_bytes


@dataclass(frozen=True)
class CapacityRow:
    """One context length's concurrency ceiling.

    bytes_per_trajectory: private KV bytes per trajectory (context not shared + output).
    shared_bytes:         the shared prefix, stored once.
    usable_bytes:         KV pool after headroom (the prefix comes out of this).
    concurrency:          floor((usable - shared) / bytes_per_trajectory), >= 0.
    """

    context_tokens: int
    output_tokens: int
    shared_tokens: int
    bytes_per_trajectory: int
    shared_bytes: int
    usable_bytes: float
    concurrency: int


def _check_workload(context_tokens: int, output_tokens: int, shared_tokens: int) -> None:
    if not (isinstance(context_tokens, int) and context_tokens > 0):
        raise ValueError(f"context must be a positive number of tokens, got {context_tokens!r}")
    for name, v in (("output tokens", output_tokens), ("shared tokens", shared_tokens)):
        if not (isinstance(v, int) and v >= 0):
            raise ValueError(f"{name} must be an integer >= 0, got {v!r}")
    if shared_tokens > context_tokens:
        raise ValueError(f"shared prefix ({shared_tokens} tokens) is longer than the context ({context_tokens} tokens)")
    if context_tokens - shared_tokens + output_tokens <= 0:
        raise ValueError("each trajectory needs at least one private token (context fully shared and no output)")


def kv_demand_bytes(geom: ModelGeometry, concurrency: int, context_tokens: int, *, output_tokens: int = 0,
                    shared_tokens: int = 0, headroom_bytes: float = 0.0) -> float:
    """Equations 6/7: KV bytes ``concurrency`` trajectories demand, headroom included.

    ``(S_shared + B * (context - S_shared + output)) * m_token + headroom``;
    with ``shared_tokens = 0`` and no headroom this is equation 6.  Pure;
    raises ValueError on negative counts or a prefix longer than the context.
    """
    if not (isinstance(concurrency, int) and concurrency >= 0):
        raise ValueError(f"concurrency must be an integer >= 0, got {concurrency!r}")
    _check_workload(context_tokens, output_tokens, shared_tokens)
    _check_nonneg("headroom", headroom_bytes)
    private = context_tokens - shared_tokens + output_tokens
    return float(geom.kv_bytes(shared_tokens) + concurrency * geom.kv_bytes(private)) + headroom_bytes


def max_concurrency(geom: ModelGeometry, kv_pool_bytes: float, context_tokens: int, *, output_tokens: int = 0,
                    shared_tokens: int = 0, headroom: float = 0.0) -> CapacityRow:
    """The largest B with ``kv_demand_bytes(B, ..., headroom_bytes=headroom*pool) <= pool``.

    ``headroom`` is the fraction of the pool kept free, in [0, 1).  A shared
    prefix bigger than the usable pool gives concurrency 0 (not an error).
    Pure; raises ValueError on bad input.
    """
    if not (math.isfinite(kv_pool_bytes) and kv_pool_bytes > 0):
        raise ValueError(f"KV pool must be a positive number of bytes, got {kv_pool_bytes!r}")
    if not (0.0 <= headroom < 1.0):
        raise ValueError(f"headroom must be a fraction in [0, 1), got {headroom!r}")
    _check_workload(context_tokens, output_tokens, shared_tokens)
    usable = kv_pool_bytes * (1.0 - headroom)
    shared = geom.kv_bytes(shared_tokens)
    per = geom.kv_bytes(context_tokens - shared_tokens + output_tokens)
    room = usable - shared
    b = int(room // per) if room > 0 else 0
    return CapacityRow(context_tokens=context_tokens, output_tokens=output_tokens, shared_tokens=shared_tokens,
                       bytes_per_trajectory=per, shared_bytes=shared, usable_bytes=usable, concurrency=b)


def capacity_table(geom: ModelGeometry, node: NodeBudget, contexts: list[int] | tuple[int, ...], *,
                   output_tokens: int = 0, shared_tokens: int = 0, headroom: float = 0.0) -> list[CapacityRow]:
    """:func:`max_concurrency` for each context length on ``node``'s pool (pure)."""
    if not contexts:
        raise ValueError("give at least one context length")
    return [max_concurrency(geom, node.kv_pool_bytes, c, output_tokens=output_tokens,
                            shared_tokens=shared_tokens, headroom=headroom) for c in contexts]
