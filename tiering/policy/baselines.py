"""Baseline pause policies: fixed rules, HiCache-like LRU, Continuum's TTL, InferCept's min-waste.

Each implements :class:`kvtier.tiering.model.decision.Policy`; decide() is pure.
The learning ones (per-tool TTL, min-waste) own their predictor: one caller,
not thread-safe.
"""
from __future__ import annotations

import math
from typing import Mapping

import numpy as np

from kvtier.tiering.model.costmodel import GB, HardwareProfile, ModelGeometry, t_recompute, t_reload
from kvtier.tiering.model.decision import Action, Decision, PauseContext, Policy
from kvtier.tiering.forecasting.forecast import Predictor
from kvtier.tiering.forecasting.predictor import ToolWaitPredictor
from kvtier.tiering.forecasting.predictor_baselines import RunningMeanPredictor
from kvtier.tiering.policy.pricing import CostPrices, check_context


class RetainPolicy(Policy):
    """Keep KV in HBM through every pause; under pressure the engine drops victims (vLLM)."""

    name = "retain"

    def decide(self, ctx: PauseContext) -> Decision:
        check_context(ctx)
        return Decision(Action.RETAIN, reason="always retain")


class RecomputePolicy(Policy):
    """vLLM's behaviour for a finished request: free the blocks, prefill again on resume."""

    name = "recompute"

    def decide(self, ctx: PauseContext) -> Decision:
        check_context(ctx)
        return Decision(Action.RECOMPUTE, reason="always recompute")


class OffloadHostPolicy(Policy):
    """Always swap to host DRAM, reload when the tool returns (no prediction).

    Falls back to NVMe, then recompute, when the host tier has no room.
    """

    name = "offload_host"

    def decide(self, ctx: PauseContext) -> Decision:
        check_context(ctx)
        move = ctx.bytes_to_move
        if move <= ctx.host_free_bytes:
            return Decision(Action.OFFLOAD_HOST, reason="always offload to host")
        if move <= ctx.nvme_free_bytes:
            return Decision(Action.OFFLOAD_NVME, reason="host tier full")
        return Decision(Action.RECOMPUTE, reason="host and NVMe tiers full")


class LRUPolicy(RetainPolicy):
    """HiCache-like: keep everything, and when the engine needs room, swap the
    least recently used paused trajectory to host instead of dropping it."""

    name = "lru"

    def decide(self, ctx: PauseContext) -> Decision:
        check_context(ctx)
        return Decision(Action.RETAIN, reason="retain; swap to host on pressure")

    def victim_action(self, ctx: PauseContext) -> Action:
        return Action.OFFLOAD_HOST if ctx.bytes_to_move <= ctx.host_free_bytes else Action.RECOMPUTE


class TTLPolicy(Policy):
    """Continuum: pin the KV in HBM for a fixed time-to-live ``ttl_s``, then evict.

    On expiry the state is evicted to ``evict_to`` (recompute, or offload_host
    when the host tier has room).  :class:`PerToolTTLPolicy` picks the TTL per tool.
    """

    name = "ttl"

    def __init__(self, geometry: ModelGeometry, hardware: HardwareProfile,
                 predictor: Predictor | None = None, *, ttl_s: float = 5.0,
                 evict_to: Action = Action.RECOMPUTE, prices: CostPrices | None = None) -> None:
        if not (math.isfinite(ttl_s) and ttl_s >= 0):
            raise ValueError(f"ttl_s must be a finite number >= 0, got {ttl_s!r}")
        if evict_to not in (Action.RECOMPUTE, Action.OFFLOAD_HOST):
            raise ValueError(f"evict_to must be 'recompute' or 'offload_host', got {evict_to!r}")
        self.geometry, self.hardware = geometry, hardware
        self.ttl_s = float(ttl_s)
        self.evict_to = Action(evict_to)
        self.predictor = predictor
        self.prices = prices or CostPrices()
        self._ref_gb = geometry.kv_bytes(self.prices.ref_tokens) / GB

    def observe(self, tool: str, wait_s: float, features: Mapping[str, str] | None = None) -> None:
        if self.predictor is not None:
            self.predictor.observe(tool, wait_s, features)

    def _evict(self, ctx: PauseContext) -> Action:
        if self.evict_to is Action.OFFLOAD_HOST and ctx.bytes_to_move <= ctx.host_free_bytes:
            return Action.OFFLOAD_HOST
        return Action.RECOMPUTE

    def ttl_for(self, ctx: PauseContext) -> float:
        """The time-to-live of this pause (seconds)."""
        return self.ttl_s

    def decide(self, ctx: PauseContext) -> Decision:
        check_context(ctx)
        ttl = self.ttl_for(ctx)
        if ttl <= 0:
            return Decision(self._evict(ctx), reason="ttl 0: evict now")
        return Decision(Action.RETAIN, demote_at_s=ttl, reason=f"pin for ttl {ttl:.3g}s")

    def on_lease_expiry(self, ctx: PauseContext, elapsed_s: float, current: Decision) -> Decision | None:
        if current.action != Action.RETAIN:
            return None
        return Decision(self._evict(ctx), reason="ttl expired")


class PerToolTTLPolicy(TTLPolicy):
    """Continuum's per-tool TTL (registry ``ttl_cdf``): per tool, the TTL maximising
    P(W <= tau) * benefit - hold_price * E[min(W, tau)] over the tool's empirical wait
    CDF (from the predictor), where benefit is the resume cost avoided (recompute,
    or reload when ``evict_to="offload_host"``)."""

    name = "ttl_cdf"

    def __init__(self, geometry: ModelGeometry, hardware: HardwareProfile,
                 predictor: Predictor | None = None, **options) -> None:
        super().__init__(geometry, hardware, predictor if predictor is not None else ToolWaitPredictor(),
                         **options)

    def ttl_for(self, ctx: PauseContext) -> float:
        dist = self.predictor.forecast(ctx.tool, ctx.features).distribution
        pts, cw, cm = dist.points, dist.cum_w, dist.cum_m
        hw, pr = self.hardware, self.prices
        if self._evict(ctx) == Action.OFFLOAD_HOST:
            benefit = pr.stall_weight * t_reload(ctx.kv_bytes, hw)
        else:
            benefit = (pr.stall_weight + pr.compute_weight) * t_recompute(self.geometry, ctx.context_tokens, hw)
        c_h = pr.hbm_pressure_factor(ctx.hbm_pressure) / self._ref_gb * ctx.kv_bytes / GB
        # tau at each point: P(W <= tau) = cw[i+1]; E[min(W, tau)] = cm[i+1] + tau * (1 - cw[i+1])
        taus = pts
        p_le = cw[1:]
        e_min = cm[1:] + taus * (1.0 - p_le)
        util = p_le * benefit - c_h * e_min
        j = int(np.argmax(util))
        return float(taus[j]) if util[j] > 0 else 0.0



class ReloadTTLPolicy(TTLPolicy):
    """Continuum's hold without a forecast (registry ``ttl_reload``): each pause is
    pinned in HBM for the TTL at which holding it has cost one reload round trip
    (the ski-rental rule: hold price x TTL = the stall of a reload from host), then
    offloaded to host.  Priced like every policy here (``CostPrices``), so the TTL
    shrinks as the engine's pool fills; it never learns a wait."""

    name = "ttl_reload"

    def __init__(self, geometry: ModelGeometry, hardware: HardwareProfile,
                 predictor: Predictor | None = None, **options) -> None:
        options.setdefault("evict_to", Action.OFFLOAD_HOST)
        super().__init__(geometry, hardware, None, **options)

    def ttl_for(self, ctx: PauseContext) -> float:
        pr = self.prices
        reload_cost = 2.0 * pr.stall_weight * t_reload(ctx.kv_bytes, self.hardware)
        hold_rate = pr.hbm_pressure_factor(ctx.hbm_pressure) / self._ref_gb * ctx.kv_bytes / GB
        return reload_cost / hold_rate if hold_rate > 0 else self.ttl_s

class MinWastePolicy(Policy):
    """InferCept's min-waste rule on a point prediction (running mean per tool).

    Memory waste in GB-seconds of each choice for a paused request of G GB
    while the rest of the batch holds G_other = U * kv_pool:
    preserve = T_pred * G; discard = t_recompute * (G + G_other) (the
    recompute stalls the batch); swap = 2 * t_reload * (G + G_other)
    (swap out and in, not overlapped).  The smallest waste wins.
    """

    name = "min_waste"

    def __init__(self, geometry: ModelGeometry, hardware: HardwareProfile,
                 predictor: Predictor | None = None) -> None:
        self.geometry, self.hardware = geometry, hardware
        self.predictor = predictor if predictor is not None else RunningMeanPredictor()

    def observe(self, tool: str, wait_s: float, features: Mapping[str, str] | None = None) -> None:
        self.predictor.observe(tool, wait_s, features)

    def decide(self, ctx: PauseContext) -> Decision:
        check_context(ctx)
        hw = self.hardware
        t_pred = self.predictor.forecast(ctx.tool, ctx.features).mean_s
        g = ctx.kv_bytes / GB
        g_other = ctx.hbm_pressure * max(hw.kv_pool_bytes, 0.0) / GB
        waste = {
            Action.RETAIN: t_pred * g,
            Action.RECOMPUTE: t_recompute(self.geometry, ctx.context_tokens, hw) * (g + g_other),
        }
        if ctx.bytes_to_move <= ctx.host_free_bytes:
            waste[Action.OFFLOAD_HOST] = 2.0 * t_reload(ctx.kv_bytes, hw) * (g + g_other)
        action = min(waste, key=waste.__getitem__)
        return Decision(action, expected_cost=waste[action], reason=f"min waste (T_pred {t_pred:.3g}s)",
                        extra={a.value: w for a, w in waste.items()})
