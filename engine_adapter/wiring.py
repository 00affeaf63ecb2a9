"""From a :class:`PluginConfig` to the objects a plugin runs: the placement
advisor (one-shot placement of hinted blocks without a trajectory), and the
lifecycle controller with its timer thread (hinted trajectories)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvtier.engine_adapter.config import PluginConfig
from kvtier.engine_adapter.geometry import EngineFacts, Pricing, resolve
from kvtier.engine_adapter.plugin_common import PlacementAdvisor
from kvtier.tiering.decision import Policy
from kvtier.tiering.lifecycle import (ForecastSchedule, LifecycleController, LifecycleTimer, MonotonicClock,
                                      ScaledClock, TTLSchedule)
from kvtier.tiering.lifecycle.foreground import Foreground
from kvtier.tiering.lifecycle.pruning import Pruner

if TYPE_CHECKING:
    from kvtier.store.protocol import BlockStore


def pricing_for(cfg: PluginConfig, facts: EngineFacts | None) -> Pricing | None:
    """What the policy prices pauses with: the engine's geometry and device, or
    the ``model``/``node`` presets (what-ifs).  None without a policy.  Raises
    ValueError for an unknown preset, or when neither the engine nor a preset
    names the model."""
    if not (cfg.policy or cfg.service_url):
        return None
    return resolve(model=cfg.model, node=cfg.node, facts=facts)


def make_policy(cfg: PluginConfig, pricing: Pricing | None) -> Policy | None:
    """The local policy (service mode: the service-backed one, falling back to
    a local breakeven policy), pricing pauses with ``pricing``.  Raises
    ValueError for an unknown policy."""
    if pricing is None:
        return None
    from kvtier.tiering import make_policy as _make
    geo, hw = pricing.geometry, pricing.node
    if cfg.policy:
        return _make(cfg.policy, geometry=geo, hardware=hw)
    from kvtier.tiering.lifecycle.service_policy import ServicePolicy
    return ServicePolicy(cfg.service_url, cfg.model or geo, local=_make("breakeven", geometry=geo, hardware=hw),
                         ttl_s=cfg.service_ttl_s, timeout_s=cfg.service_timeout_s)


def make_advisor(cfg: PluginConfig, policy: Policy | None) -> PlacementAdvisor:
    return PlacementAdvisor(cfg.effective_default_tier, policy=policy, host_available=cfg.host_available)


@dataclass
class Lifecycle:
    """A running controller and its timer thread (``close`` stops the thread).
    Wrap an engine load in ``with lifecycle.loading():`` so the controller's
    demotions and stagings step aside meanwhile (:mod:`kvtier.tiering.lifecycle.foreground`)."""

    controller: LifecycleController
    timer: LifecycleTimer
    foreground: Foreground

    def loading(self):
        return self.foreground.loading()

    def stats(self) -> dict:
        """The controller's counters, plus ``foreground``: engine loads marked,
        background slices that waited for one, and the seconds they waited."""
        return {**self.controller.stats(), "foreground": self.foreground.stats()}

    def poke(self) -> None:
        self.timer.poke()

    def close(self) -> None:
        self.timer.close()


def make_lifecycle(cfg: PluginConfig, policy: Policy | None, store: "BlockStore",
                   block_bytes: int, pricing: Pricing | None) -> Lifecycle | None:
    """The controller ``cfg.lifecycle`` asks for over ``store`` (None for "off",
    or "forecast" without a policy), its timer thread started."""
    if cfg.lifecycle == "off" or cfg.lifecycle == "forecast" and (policy is None or pricing is None):
        return None
    if cfg.lifecycle == "ttl":
        schedule = TTLSchedule(idle_ttl_s=cfg.ttl_idle_s, demote_after_s=cfg.ttl_demote_after_s)
        price, host_price = None, None
    else:
        schedule = ForecastSchedule(policy)
        price = pricing.geometry.kv_bytes   # the policy prices a pause as the served model's KV
        host_price = pricing.node.host_bytes   # ... and kvtier's host fill as its DRAM's
    clock = MonotonicClock() if cfg.time_scale == 1.0 else ScaledClock(cfg.time_scale)
    ctl = LifecycleController(store, schedule, clock=clock, block_bytes=block_bytes, price_bytes=price,
                              host_price_bytes=host_price,
                              pruner=Pruner(forget_after_s=cfg.forget_after_s, max_trajectories=cfg.max_trajectories))
    ctl.foreground = fg = Foreground()      # engine loads first: the moves yield to them
    return Lifecycle(ctl, LifecycleTimer(ctl).start(), fg)
