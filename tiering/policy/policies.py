"""Pause policies: kvtier's expected-cost policy, the oracle, and the baselines.

Every policy implements :class:`kvtier.tiering.model.decision.Policy` and is built by name::

    policy = make_policy("breakeven", geometry=geom, hardware=hw)
    d = policy.decide(PauseContext(tool="pytest", kv_bytes=..., context_tokens=...))
    ... tool returns after w seconds ...
    policy.observe("pytest", w)

The expected-cost model (all costs in seconds-equivalent)
---------------------------------------------------------
For a pause holding G GB in HBM, of which Gm GB must move (prefix blocks
stored earlier don't move again), and a wait W with predicted distribution F:

* holding prices (seconds of cost per GB-second), rising with pressure::

      hbm(U)   = phi(U) / G_ref      phi = floor + (1-floor)(U/tau)^3 below the admission
                                     ceiling tau = 0.88; 1 + slope (U-tau)/(1-U+0.02) above
      dram(f)  = dram_ratio (1 + fill_slope f^power) / G_ref   f = host tier fill
                 (defaults 1e-5 (1 + 1e4 f^16): about free while the tier is mostly empty)
      nvme     = nvme_ratio / G_ref

  G_ref is the KV of ``ref_tokens`` (32,768) of the model: holding one
  typical agent context for one second at the admission ceiling costs one
  second (another trajectory's worth of service).
* retain:        hbm*G*E[W] (with a priced lease; on an evicting holder while nothing waits
                 for admission, or while a copy-out started now would queue on the host link
                 for revocable_busy_s (1 ms) or more: revocable_floor*G per second, 0 by
                 default, plus one possible eviction, see kvtier.tiering.policy.expected)
* offload_host:  hbm*G*t_out + dram*Gm*E[W] + prefetch(r = t_reload)
                 (on a write-through holder, ``PauseContext.write_through``, the host
                 copy is also on NVMe and droppable: dram is then only the fill term
                 of copies that cannot be dropped, see droppable_price); while the holder
                 measures new work's admission wait below early_host_wait_s (2 s), also
                 "host first, NVMe at a priced lease" (the early returns come back from DRAM)
* offload_nvme:  hbm*G*t_out + dram*Gm*t_write + io*(t_write + t_read)
                 + nvme*Gm*E[W] + prefetch(r = max(t_read, t_reload))  (chunked reload:
                 NVMe -> host and host -> GPU overlap; HBM is held until the write lands,
                 so a pause pays hbm*G*t_write instead of dram*Gm*t_write while dram < nvme)
* recompute:     (stall_weight + compute_weight * max(1, phi(U))) * t_recompute
                 (past the ceiling the saturated node's prefill is as scarce as its HBM)
* prefetch(r):   min over start times t of  stall_weight*E[stall(t)] + hbm*G*E[(W-t)+]
                 where stall(t) = r if W < t, t+r-W if t <= W < t+r, else 0
                 (a quantile trade-off; "never" = reload on resume is a candidate).

The shared link is a queue (``PauseContext.link_*_queue_s``, ``link_utilisation``): by default
(``queues="timing"``) a prefetch starts earlier by the expected reload queue wait;
``queues="price"`` puts every queue wait and a shadow price on link time into the costs
(:mod:`kvtier.tiering.policy.expected`).

With a point-mass forecast and the texts' assumptions this reduces exactly to
their break-even rule T* = 2M/B * mu_hbm/(mu_hbm - mu_dram) (tested).

Leases: retain and offload_host carry ``demote_at_s`` = the forecast's
``lease_quantile`` (p90).  When the tool outlives it, ``on_lease_expiry``
re-prices the options against the wait distribution *conditioned on having
already waited that long* (heavy tails make the remaining wait grow), from
the current placement (HBM -> host/NVMe, host -> NVMe), and returns the new
decision (or the same action with a renewed lease).

Conventions for holders (simulator, engine hooks, service):
``prefetch_at_s`` is None for an offload means "reload when the tool
returns".  ``demote_at_s`` is only set when it comes before the prefetch.
Times are seconds after the pause.

Rooms: :mod:`~kvtier.tiering.policy.pricing` (prices, the prefetch/lease optimisers),
:mod:`~kvtier.tiering.policy.breakeven` (BreakEvenPolicy, PointBreakEvenPolicy,
OraclePolicy), :mod:`~kvtier.tiering.policy.baselines` (the baselines), :mod:`~kvtier.tiering.policy.prefetch_baselines`
(``eager``, ``point``: prefetch rules without the distribution); this module is
the registry.
"""
from __future__ import annotations

from typing import Any, Callable

from kvtier.tiering.policy.baselines import (LRUPolicy, MinWastePolicy, OffloadHostPolicy, PerToolTTLPolicy,
                                      RecomputePolicy, ReloadTTLPolicy, RetainPolicy, TTLPolicy)
from kvtier.tiering.policy.breakeven import BreakEvenPolicy, OraclePolicy, PointBreakEvenPolicy
from kvtier.tiering.model.costmodel import HardwareProfile, ModelGeometry
from kvtier.tiering.model.decision import Policy
from kvtier.tiering.policy.prefetch_baselines import EagerPolicy, PointPrefetchPolicy
from kvtier.tiering.forecasting.forecast import Predictor, WaitDistribution
from kvtier.tiering.policy.pricing import (MAX_CONTEXT_TOKENS, MAX_KV_BYTES, CostPrices, best_lease, best_prefetch,
                                    check_context, expected_remaining)

__all__ = ["make_policy", "POLICY_NAMES", "BreakEvenPolicy", "PointBreakEvenPolicy", "OraclePolicy",
           "RetainPolicy", "RecomputePolicy", "OffloadHostPolicy", "LRUPolicy", "TTLPolicy", "PerToolTTLPolicy",
           "ReloadTTLPolicy",
           "MinWastePolicy", "EagerPolicy", "PointPrefetchPolicy", "CostPrices", "best_prefetch", "best_lease", "expected_remaining", "check_context",
           "MAX_KV_BYTES", "MAX_CONTEXT_TOKENS", "WaitDistribution"]


def _with_geometry(cls):
    def make(geometry, hardware, predictor, **o):
        return cls(geometry, hardware, predictor, **o)
    return make


def _simple(cls):
    def make(geometry, hardware, predictor, **o):
        return cls(**o)
    return make


_REGISTRY: dict[str, Callable[..., Policy]] = {
    "breakeven": _with_geometry(BreakEvenPolicy),
    "oracle": _with_geometry(OraclePolicy),
    "retain": _simple(RetainPolicy),
    "recompute": _simple(RecomputePolicy),
    "offload_host": _simple(OffloadHostPolicy),
    "lru": _simple(LRUPolicy),
    "ttl": _with_geometry(TTLPolicy),
    "ttl_cdf": _with_geometry(PerToolTTLPolicy),
    "ttl_reload": _with_geometry(ReloadTTLPolicy),
    "min_waste": _with_geometry(MinWastePolicy),
    "breakeven_point": _with_geometry(PointBreakEvenPolicy),
    "eager": _with_geometry(EagerPolicy),
    "point": _with_geometry(PointPrefetchPolicy),
}

POLICY_NAMES: tuple[str, ...] = tuple(_REGISTRY)
"""Every registered policy name."""


def make_policy(name: str, *, geometry: ModelGeometry, hardware: HardwareProfile,
                predictor: Predictor | None = None, **options: Any) -> Policy:
    """Build the policy registered as ``name``.

    ``predictor`` is used by the learning policies (breakeven, ttl_cdf,
    min_waste takes any object with observe/forecast); a fresh one is made
    when omitted.  Don't share one predictor between several policies that
    are all fed observe(): each would count every wait.
    Raises ValueError for an unknown name or option.
    """
    try:
        factory = _REGISTRY[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown policy {name!r}; known policies: {', '.join(POLICY_NAMES)}") from None
    if not isinstance(geometry, ModelGeometry) or not isinstance(hardware, HardwareProfile):
        raise ValueError("make_policy needs geometry=ModelGeometry and hardware=HardwareProfile")
    try:
        return factory(geometry, hardware, predictor, **options)
    except TypeError as exc:
        raise ValueError(f"bad option for policy {name!r}: {exc}") from None
