"""From a :class:`PluginConfig` to the objects a plugin runs (:func:`build_parts`):
the pricing, the policy, the placement advisor (one-shot placement of hinted
blocks without a trajectory), the store, and the lifecycle -- the controller
with its timer thread (hinted trajectories), or :class:`NoLifecycle` when the
configuration has none.  Built in that order, closed in reverse
(:meth:`PluginParts.close`); SGLang, whose store opens only when the engine
registers its host pool, builds the first three early and calls
:func:`open_store` then.

A plugin talks to either through the same calls, one per engine event
(``hint``, ``place`` per store job, ``pause``, ``resume``, ``touch`` and
``loading`` around a load, ``retag`` for a router's late tool), so it never
asks whether there is a lifecycle.
``place`` is the one placement route: a tracked trajectory's plan from the
controller (``plan_blocks``, one locked call), else the advisor's one-shot
decision, else the default tier -- resolved there, once, against the tiers the
store has (:class:`~kvtier.engine_adapter.plugin_common.StoreTiers`), so the
:class:`~kvtier.engine_adapter.plugin_common.Placement` a plugin gets is final
and carries its own overflow (host frames full: NVMe)."""
from __future__ import annotations

import contextlib
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Mapping, Sequence

from kvtier.engine_adapter.config import LifecycleKind, PluginConfig
from kvtier.engine_adapter.geometry import EngineFacts, Pricing, resolve
from kvtier.engine_adapter.hints import Retag, ToolHint
from kvtier.engine_adapter.plugin_common import Placement, PlacementAdvisor, StoreTiers
from kvtier.tiering.model.decision import Policy
from kvtier.tiering.lifecycle import (Clock, ForecastSchedule, LifecycleController, LifecycleTimer, MonotonicClock,
                                      ScaledClock, TTLSchedule)
from kvtier.tiering.lifecycle.foreground import Foreground
from kvtier.tiering.lifecycle.pruning import Pruner
from kvtier.tiering.lifecycle.registry import Event, Plan
from kvtier.tiering.lifecycle.retag import Retagged
from kvtier.tiering.model.decision import Action, Decision
from kvtier.tiering.model.tiers import Tier

if TYPE_CHECKING:
    from kvtier.store import StoreConfig
    from kvtier.store.protocol import BlockStore

log = logging.getLogger("kvtier.engine")
_BOTH = StoreTiers(host=True, nvme=True)      # a lifecycle told nothing of its store: placements as decided


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


@dataclass(frozen=True)
class Held:
    """Where a device holder's pause left its KV (what :meth:`Lifecycle.hold`'s
    ``place`` returns): ``tier`` (``Tier.DEVICE``: still in its device memory;
    None: nowhere, recompute) and its own timers, (seconds after the pause, event)."""

    tier: Tier | None
    timers: tuple[tuple[float, Event], ...] = ()


@dataclass(frozen=True)
class Retained:
    """A pause the policy keeps in device memory: ``lease_s``, seconds on the
    lifecycle clock until its lease ends (None: no lease end)."""

    lease_s: float | None


@dataclass
class Lifecycle:
    """A running controller and its timer thread (``close`` stops the thread),
    with the advisor that places what the controller does not track.
    Wrap an engine load in ``with lifecycle.loading():`` so the controller's
    demotions and stagings step aside meanwhile (:mod:`kvtier.tiering.lifecycle.foreground`).
    Thread-safe (the controller's calls are)."""

    controller: LifecycleController
    timer: LifecycleTimer
    foreground: Foreground
    advisor: PlacementAdvisor
    mode: LifecycleKind = LifecycleKind.FORECAST      # the configured lifecycle (FORECAST, TTL)
    tiers: StoreTiers = field(default=_BOTH)   # the store's tiers: what a placement may name
    default_tool: str = "unhinted"             # the tool of a request without one (the plugin's config)
    replanned: deque = field(default_factory=lambda: deque(maxlen=1024))   # retagged pauses, for take_replanned

    # -- the engine's events
    def hint(self, tid: str, tool: str | None, *, context_tokens: int | None = None, resume: bool = True) -> None:
        self.controller.hint(tid, tool, context_tokens=context_tokens, resume=resume)

    def retag(self, r: Retag) -> None:
        """A router's late tool for ``r.trajectory_id``'s pause (its forecast None: it was
        told :attr:`default_tool`): planned again (:mod:`kvtier.tiering.lifecycle.retag`)."""
        out = self.controller.retag(r.trajectory_id, r.tool,
                                    forecast=self.default_tool if r.forecast is None else r.forecast)
        if out is Retagged.REPLANNED:
            self.replanned.append(r.trajectory_id)

    def take_replanned(self) -> list[str]:
        """The trajectories whose current pause a retag planned again since the last call
        (the engine's held blocks follow the new plan); at most the last 1,024."""
        out = []
        while self.replanned:
            out.append(self.replanned.popleft())
        return out

    def place(self, tid: str | None, hint: ToolHint | None, keys: list[bytes], *, tokens_per_block: int,
              block_bytes: int, context_tokens: int | None = None,
              on_error: Callable[[Exception], None] | None = None) -> Placement:
        """Where one store job's blocks ``keys`` go: ``tid``'s plan (the controller
        remembers the blocks and decides once per pause; ``context_tokens``: the
        request's context when the plugin knows it, else its blocks times
        ``tokens_per_block``), else (untracked, or no tool hint) the advisor's;
        either on the store's tiers, with its overflow.
        ``on_error``: takes a controller failure, which then falls back to the
        advisor (None: it raises)."""
        if tid is not None:
            try:
                plan = self.controller.plan_blocks(tid, keys, tokens_per_block=tokens_per_block,
                                                   context_tokens=context_tokens)
            except Exception as exc:
                if on_error is None:
                    raise
                on_error(exc)
                plan = None
            if plan is not None:
                return self.tiers.resolve(Placement(plan.tier, None, "lifecycle"))
        return self.tiers.resolve(_one_shot(self.advisor, hint, keys, tokens_per_block, block_bytes, context_tokens))

    def pause(self, tid: str) -> None:
        self.controller.pause(tid)

    def decision(self, tid: str) -> Any:
        """The policy's decision for ``tid``'s current pause (None: none)."""
        return self.controller.decision(tid)

    def retained(self, tid: str) -> Retained | None:
        """Whether the policy keeps ``tid``'s coming pause in the engine's device
        memory (its plan's action is ``retain``) and for how long; None: it does
        not (or ``tid`` has no tool, so no plan).  Decides the pause's plan if
        nothing has yet (one locked call)."""
        plan = self.controller.plan_for(tid)
        if plan is None or plan.action != Action.RETAIN.value:
            return None
        d = self.controller.decision(tid)
        return Retained(None if d is None else d.demote_at_s)

    def now(self) -> float:
        """The lifecycle clock's time (a lease is on it)."""
        return self.controller.clock.now()

    def resume(self, tid: str) -> None:
        self.controller.resume(tid)

    def touch(self) -> None:
        """An engine call of a resume that is no load (a lookup): moves wait a little after it."""
        self.foreground.touch()

    def loading(self) -> ContextManager[None]:
        return self.foreground.loading()

    def step(self, prefill: bool) -> None:
        """An engine step was scheduled; ``prefill``: it prefills a new request
        (a plugin whose engine computes on kvtier's cores): moves wait it out."""
        self.foreground.step(prefill)

    def stats(self) -> dict:
        """The controller's counters, plus ``foreground``: engine loads and prefill
        steps marked, background slices that waited for one, and the seconds they waited."""
        return {**self.controller.stats(), "foreground": self.foreground.stats()}

    def counters(self) -> dict[str, int]:
        """The controller's counters alone (an engine's per-step metrics)."""
        return self.controller.counter_values()

    # -- a holder that keeps paused KV in its own device memory (the HF hook, with DeviceHooks)
    def hold(self, tid: str, tool: str, keys: Sequence[bytes], *, context_tokens: int,
             features: Mapping[str, str] | None, place: Callable[[Plan, Decision | None], Held],
             until_s: float | None = None) -> None:
        """One pause of a device holder: the controller plans it (``keys``: the
        context's blocks, exactly), ``place(plan, decision)`` carries the plan out
        on the device, outside the controller's lock, and the pause starts where
        ``place`` says (no timer armed at or after ``until_s``: a scripted tool's
        known wait).  Raises what ``place`` raises (no pause started then)."""
        c = self.controller
        c.hint(tid, tool, features=features, context_tokens=context_tokens)
        c.set_blocks(tid, keys)
        held = place(c.plan_for(tid), c.decision(tid))
        c.pause(tid, tier=held.tier, timers=held.timers, until_s=until_s)

    def release(self, tid: str, *, wait_s: float | None = None) -> float | None:
        """The end of a :meth:`hold` pause: the lease ends due before ``wait_s`` (a
        scripted tool's known wait, time fast-forwarded) are carried out first, then
        the resume, and the policy learns the wait now.  Returns the observed wait
        (None: not paused).  Call holding none of the locks the device hooks take."""
        c = self.controller
        if wait_s is not None:
            c.settle(tid, wait_s)
        wait = c.resume(tid, wait_s=wait_s)
        c.learn()
        return wait

    def close(self) -> None:
        self.timer.close()

    # -- a replay's (bench/engine_replay)
    def replay_on(self, clock: Clock) -> None:
        """Run on ``clock`` (a replay's trace clock; before any traffic) and record
        the store moves from now on (:meth:`moves`)."""
        self.controller.set_clock(clock)
        self.controller.move_log = deque()

    def moves(self) -> list:
        """The store moves recorded since :meth:`replay_on`, ``(t0, t1, kind, tid, blocks)``."""
        return list(self.controller.move_log or ())


@dataclass
class NoLifecycle:
    """The null lifecycle (``lifecycle: "off"``, or a forecast without a policy):
    every event is a no-op, ``place`` is the advisor's (on the store's tiers),
    ``stats`` is empty."""

    advisor: PlacementAdvisor
    mode: LifecycleKind = LifecycleKind.OFF
    tiers: StoreTiers = field(default=_BOTH)

    def hint(self, tid: str, tool: str | None, *, context_tokens: int | None = None, resume: bool = True) -> None:
        pass

    def retag(self, r: Retag) -> None:
        pass

    def take_replanned(self) -> list[str]:
        return []

    def place(self, tid: str | None, hint: ToolHint | None, keys: list[bytes], *, tokens_per_block: int,
              block_bytes: int, context_tokens: int | None = None,
              on_error: Callable[[Exception], None] | None = None) -> Placement:
        return self.tiers.resolve(_one_shot(self.advisor, hint, keys, tokens_per_block, block_bytes, context_tokens))

    def pause(self, tid: str) -> None:
        pass

    def decision(self, tid: str) -> Any:
        return None

    def retained(self, tid: str) -> "Retained | None":
        return None

    def now(self) -> float:
        return time.monotonic()

    def resume(self, tid: str) -> None:
        pass

    def touch(self) -> None:
        pass

    def loading(self) -> ContextManager[None]:
        return contextlib.nullcontext()

    def step(self, prefill: bool) -> None:
        pass

    def stats(self) -> dict:
        return {}

    def counters(self) -> dict[str, int]:
        return {}

    def close(self) -> None:
        pass

    def replay_on(self, clock: Clock) -> None:
        pass

    def moves(self) -> list:
        return []


def _one_shot(advisor: PlacementAdvisor, hint: ToolHint | None, keys: list[bytes], tokens_per_block: int,
              block_bytes: int, context_tokens: int | None) -> Placement:
    """The advisor's placement of one store job no trajectory plans (its context:
    ``context_tokens``, else the job's blocks times ``tokens_per_block``)."""
    tokens = len(keys) * tokens_per_block if context_tokens is None else context_tokens
    return advisor.place(hint, kv_bytes=len(keys) * block_bytes, context_tokens=tokens)


def make_lifecycle(cfg: PluginConfig, policy: Policy | None, store: "BlockStore", block_bytes: int,
                   pricing: Pricing | None, advisor: PlacementAdvisor, *,
                   tiers: StoreTiers = _BOTH) -> Lifecycle | NoLifecycle:
    """The lifecycle ``cfg.lifecycle`` asks for over ``store``, its timer thread
    started (:class:`NoLifecycle` for "off", or "forecast" without a policy);
    ``advisor`` places what it does not track; ``tiers``: the store's tiers
    (its placements name only those)."""
    if cfg.lifecycle is LifecycleKind.OFF or cfg.lifecycle is LifecycleKind.FORECAST and (policy is None or pricing is None):
        return NoLifecycle(advisor, tiers=tiers)
    if cfg.lifecycle is LifecycleKind.TTL:
        schedule = TTLSchedule(idle_ttl_s=cfg.ttl_idle_s, demote_after_s=cfg.ttl_demote_after_s)
        price, host_price, pool_price = None, None, None
    else:
        schedule = ForecastSchedule(policy)
        price = pricing.geometry.kv_bytes   # the policy prices a pause as the served model's KV
        host_price = pricing.node.host_bytes   # ... and kvtier's host fill as its DRAM's
        pool = pricing.node.kv_pool_bytes      # ... and the paused KV against the engine's cache
        pool_price = pool if pool > 0 else None
    clock = MonotonicClock() if cfg.time_scale == 1.0 else ScaledClock(cfg.time_scale)
    ctl = LifecycleController(store, schedule, clock=clock, block_bytes=block_bytes, price_bytes=price,
                              host_price_bytes=host_price, pool_price_bytes=pool_price,
                              pruner=Pruner(forget_after_s=cfg.forget_after_s, max_trajectories=cfg.max_trajectories))
    ctl.foreground = fg = Foreground()      # engine loads first: the moves yield to them
    return Lifecycle(ctl, LifecycleTimer(ctl).start(), fg, advisor, cfg.lifecycle, tiers, cfg.default_tool)


def priced(cfg: PluginConfig, facts: EngineFacts | None, *, model_name: str) -> Pricing | None:
    """:func:`pricing_for`, as a plugin starts: a preset the user named that is
    wrong raises ValueError (said at start); an engine that cannot describe its
    model turns the forecast off (None) with one WARNING."""
    try:
        return pricing_for(cfg, facts)
    except ValueError as exc:
        if cfg.model is not None or cfg.node is not None:
            raise
        log.warning("kvtier: %s; the forecast is off for %s (plain tiering). Name a \"model\" "
                    "preset to price pauses.", str(exc), model_name)   # the text: a record keeps no traceback
        return None


def open_store(cfg: PluginConfig, store_cfg: "StoreConfig", policy: Policy | None, pricing: Pricing | None,
               advisor: PlacementAdvisor) -> tuple["BlockStore", Lifecycle | NoLifecycle]:
    """The store at ``store_cfg`` (a root it cannot read discarded: :mod:`.store_open`) and its
    lifecycle (placing on the tiers that store has).  Raises what
    :func:`~kvtier.engine_adapter.store_open.open_engine_store` raises; on a raise nothing stays open."""
    from kvtier.engine_adapter.store_open import open_engine_store
    store = open_engine_store(store_cfg)
    try:
        tiers = StoreTiers.of(store_cfg.host_frames, store_cfg.nvme_slots)
        return store, make_lifecycle(cfg, policy, store, store_cfg.block_bytes, pricing, advisor, tiers=tiers)
    except BaseException:
        store.close()
        raise


@dataclass
class PluginParts:
    """What a plugin runs, built by :func:`build_parts` in this order and
    closed in reverse (:meth:`close`).  Thread-safe as each part is."""

    pricing: Pricing | None
    policy: Policy | None
    advisor: PlacementAdvisor
    store: "BlockStore"
    lifecycle: Lifecycle | NoLifecycle

    def close(self) -> None:
        """Stop the lifecycle's thread, close the policy, close the store.  Idempotent."""
        self.lifecycle.close()
        if self.policy is not None:
            self.policy.close()
        self.store.close()


def build_parts(cfg: PluginConfig, store_cfg: "StoreConfig", facts: EngineFacts | None, *,
                model_name: str) -> PluginParts:
    """Pricing (:func:`priced`), policy, advisor, store and lifecycle for ``cfg``.
    Raises ValueError for a bad preset or policy, and what ``TieredStore.open`` raises."""
    pricing = priced(cfg, facts, model_name=model_name)
    policy = make_policy(cfg, pricing)
    advisor = make_advisor(cfg, policy)
    store, lifecycle = open_store(cfg, store_cfg, policy, pricing, advisor)
    return PluginParts(pricing, policy, advisor, store, lifecycle)
