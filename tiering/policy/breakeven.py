"""kvtier's expected-cost policy (break-even over the forecast), its point-estimate form, the oracle.

See :mod:`kvtier.tiering.policy.policies` for the cost model.  decide() and
on_lease_expiry() read the predictor and never mutate it; observe() feeds it.
"""
from __future__ import annotations

import enum
import math
from dataclasses import replace
from typing import Any, Mapping

from kvtier.tiering.model.costmodel import (GB, HardwareProfile, ModelGeometry, PausePrice, breakeven_wait,
                                      t_nvme_read, t_nvme_roundtrip, t_nvme_write, t_offload, t_recompute,
                                      t_reload, t_roundtrip)
from kvtier.tiering.model.decision import Action, Decision, PauseContext, Policy
from kvtier.tiering.model.tiers import Tier
from kvtier.tiering.forecasting.forecast import Predictor, WaitDistribution, WaitForecast
from kvtier.tiering.forecasting.predictor import ToolWaitPredictor
from kvtier.tiering.policy.breakeven_options import BreakEvenOptions, VictimPlan, split_options
from kvtier.tiering.policy.expected import decide_expected, restage_time
from kvtier.tiering.policy.pricing import CostPrices, check_context, check_elapsed, expected_remaining


class BreakEvenPolicy(Policy):
    """Minimise expected cost over the predicted wait distribution (module doc).

    Prices every action over the forecast; :class:`PointBreakEvenPolicy`
    applies the texts' break-even rule to a point estimate instead.

    decide() and on_lease_expiry() read the predictor and never mutate it;
    observe() feeds it.  Raises ValueError on an absurd PauseContext.
    """

    name = "breakeven"

    def __init__(self, geometry: ModelGeometry, hardware: HardwareProfile,
                 predictor: Predictor | None = None, *, options: BreakEvenOptions | None = None,
                 prices: CostPrices | None = None, **overrides: Any) -> None:
        """``options`` and ``prices``, or their fields one by one in ``overrides`` (what
        ``make_policy`` and the simulator's ``--set`` pass), not both for either.

        Raises:
            ValueError: an unknown option, a bad value, or both forms of one object.
        """
        opt_kw, price_kw = split_options(self.name, overrides)
        if options is None:
            options = BreakEvenOptions(**opt_kw)
        elif opt_kw:
            raise ValueError("pass either options=BreakEvenOptions(...) or individual options, not both")
        if prices is None:
            prices = CostPrices(**price_kw)
        elif price_kw:
            raise ValueError("pass either prices=CostPrices(...) or individual price options, not both")
        self.geometry, self.hardware = geometry, hardware
        self.predictor = predictor if predictor is not None else ToolWaitPredictor()
        self.prices = prices
        self.options = options
        self._ref_gb = geometry.kv_bytes(prices.ref_tokens) / GB
        self._two_params = 2.0 * geometry.compute_params     # costmodel.t_recompute's first product

    @property
    def ref_gb(self) -> float:
        """GB of KV of ``prices.ref_tokens`` tokens of this model: the unit the holding prices divide by."""
        return self._ref_gb

    @property
    def flops_per_token(self) -> float:
        """Prefill FLOPs per context token (2 x the model's parameters, as costmodel.t_recompute)."""
        return self._two_params

    @property
    def plan_victims(self) -> bool:
        """Whether :meth:`victim_decision` plans a victim's way back (option ``victim_plan``)."""
        return self.options.plan_victims

    # -- Policy API ---------------------------------------------------------
    def observe(self, tool: str, wait_s: float, features: Mapping[str, str] | None = None) -> None:
        self.predictor.observe(tool, wait_s, features)

    def forecast(self, ctx: PauseContext) -> WaitForecast:
        return self.predictor.forecast(ctx.tool, ctx.features)

    def decide(self, ctx: PauseContext) -> Decision:
        check_context(ctx)
        fc = self.forecast(ctx)
        return decide_expected(self, ctx, fc.distribution, fc, Action.RETAIN, 0.0)

    def decide_for_wait(self, ctx: PauseContext, wait_s: float) -> Decision:
        """Decide as if the wait were known to be ``wait_s`` (no predictor involved).

        The expected-cost minimum over a point mass at ``wait_s`` (what the
        oracle does; :class:`PointBreakEvenPolicy`: the texts' rule on
        ``wait_s``).  Pure; raises ValueError on bad input.
        """
        check_context(ctx)
        if not (isinstance(wait_s, (int, float)) and math.isfinite(wait_s) and wait_s >= 0):
            raise ValueError(f"wait_s must be a finite number >= 0, got {wait_s!r}")
        return self._decide_known(ctx, float(wait_s))

    def _decide_known(self, ctx: PauseContext, wait_s: float) -> Decision:
        fc = WaitForecast.point_mass(ctx.tool, wait_s)
        return self._decide_expected(ctx, fc.distribution, fc, from_tier=Action.RETAIN, elapsed=0.0)

    def on_lease_expiry(self, ctx: PauseContext, elapsed_s: float, current: Decision) -> Decision | None:
        """Re-decide with the wait conditioned on W > elapsed_s, from ``current``'s tier.

        Returns a Decision whose times are seconds after the *pause* (same
        action = stay, with a renewed lease), or None when nothing can be
        demoted further (offload_nvme, recompute).
        """
        check_context(ctx)
        check_elapsed(elapsed_s)
        if current.action in (Action.OFFLOAD_NVME, Action.RECOMPUTE):
            return None
        fc = self.forecast(ctx)
        dist = WaitDistribution.remaining(fc, elapsed_s)
        return self._decide_expected(ctx, dist, None, from_tier=current.action, elapsed=elapsed_s)

    def restage_at(self, ctx: PauseContext, elapsed_s: float) -> float | None:
        """A host copy the store pushed down to NVMe comes back when the staging
        pays over the wait remaining after ``elapsed_s``: the saved NVMe read
        (stall-weighted) against DRAM held from the staging to the return
        (:func:`~kvtier.tiering.policy.expected.restage_time`).  Seconds after the
        pause; None: the resume reads it from NVMe.  Pure; raises ValueError on bad input."""
        check_context(ctx)
        check_elapsed(elapsed_s)
        s = restage_time(self, ctx, WaitDistribution.remaining(self.forecast(ctx), float(elapsed_s)))
        return None if s is None else float(elapsed_s) + s

    def reads(self, tier: Tier, tokens: int) -> bool:
        """A resume reads a chunk kept only on NVMe when the read (NVMe -> host,
        overlapping host -> device: ``max(t_nvme_read, t_reload)``) takes no longer
        than prefilling its ``tokens`` again (``t_recompute``), as the pause was
        priced; other tiers are read.  Pure; raises ValueError for a negative count."""
        if tokens < 0:
            raise ValueError(f"token count must be >= 0, got {tokens}")
        if tier is not Tier.NVME or tokens == 0:
            return True
        nbytes, hw = self.geometry.kv_bytes(tokens), self.hardware
        return max(t_nvme_read(nbytes, hw), t_reload(nbytes, hw)) <= t_recompute(self.geometry, tokens, hw)

    # -- pricing ------------------------------------------------------------
    def hbm_price(self, u: float) -> float:
        """Seconds of cost per GB-second held in HBM at pool utilisation u."""
        return self.prices.hbm_pressure_factor(u) / self._ref_gb

    def host_fill(self, ctx: PauseContext) -> float:
        """The host tier's fill in [0, 1] that the DRAM prices see (0 when unknown).  Pure."""
        hf, hb = ctx.host_free_bytes, self.hardware.host_bytes
        if -math.inf < hf < math.inf and hb > 0:
            return min(max(1.0 - hf / hb, 0.0), 1.0)
        return 0.0

    def dram_price(self, ctx: PauseContext) -> float:
        return self.prices.dram_factor(self.host_fill(ctx)) / self._ref_gb

    def droppable_price(self, fill: float) -> float:
        """Seconds of cost per GB-second for holding a droppable host copy through a wait,
        at host fill ``fill`` (:meth:`host_fill`); a copy that is not droppable pays
        :meth:`dram_price`.

        On a write-through holder (``ctx.write_through``, option ``cache_pricing``) a host
        copy is also on NVMe and is dropped for free when the room is wanted (longest
        expected remaining wait first, :meth:`victim_priority`), so it only pays the fill
        term dram_ratio * fill_slope * f^power, f = the fill of the tier by copies that
        cannot be dropped (droppable ones are room, ``host_free_bytes`` counts them): near
        zero while the tier holds mostly droppable copies.  What this leaves out: a copy
        dropped before its return reloads from NVMe (the victim order makes that the
        copies expected back last).  Pure."""
        pr = self.prices
        return pr.dram_ratio * pr.dram_fill_slope * fill ** pr.dram_fill_power / self._ref_gb

    def victim_priority(self, ctx: PauseContext, elapsed_s: float) -> float:
        """Evict first the paused trajectory expected to stay away longest: its
        expected remaining wait E[W - e | W > e] after ``elapsed_s`` = e (the
        oracle: the true remaining wait).  Past the forecast's tail the remaining
        wait is taken as e (Lindy).

        While the holder measures new work's admission wait below
        ``victim_floor_wait_s`` (``ctx.admission_wait_s``; a node that is not
        overloaded) the remaining wait is at least e everywhere (Lindy floor):
        there evictions are rare, so how long a pause has lasted is evidence of
        its tool's tail that the per-tool forecast does not see.  Under overload
        the survivors of the eviction order are the pauses it ranked low, their
        time paused says little, and the forecast's own remaining wait ranks
        better (docs/policy.md, "Why it is this way").  Pure."""
        e = float(elapsed_s)
        r = expected_remaining(self.forecast(ctx).distribution, e)
        aw = ctx.admission_wait_s
        if aw is not None and aw < self.options.victim_floor_wait_s and r < e:
            return e
        return r

    def victim_action(self, ctx: PauseContext) -> Action:
        """The engine must evict this paused, HBM-resident trajectory: the cheapest way out
        (host, NVMe or recompute) over the forecast.  Pure; raises ValueError on bad input."""
        check_context(ctx)
        return self._victim_action_for(ctx, self.forecast(ctx))

    def victim_decision(self, ctx: PauseContext, elapsed_s: float) -> Decision:
        """The engine must evict this paused, HBM-resident trajectory ``elapsed_s`` into its
        pause: the cheapest way out (host, NVMe or recompute) over the wait conditioned on
        W > elapsed_s, with its way back (staging, lease, and with ``victim_plan="full"`` a
        prefetch) as a pause's decision has it, times in seconds after the pause.  A holder that carries out only the action may
        call :meth:`victim_action`.  Pure; raises ValueError on bad input."""
        check_context(ctx)
        check_elapsed(elapsed_s)
        dist, fc = self._victim_view(ctx, float(elapsed_s))
        d = self._decide_expected(ctx, dist, fc, from_tier=Action.RETAIN, elapsed=float(elapsed_s),
                                  allow_retain=False)
        if self.options.victim_plan is VictimPlan.STAGE and d.prefetch_at_s is not None:
            d = replace(d, prefetch_at_s=None)
        return d

    def _victim_view(self, ctx: PauseContext, elapsed_s: float) -> tuple[WaitDistribution, WaitForecast | None]:
        """The remaining wait a victim is priced over (and the forecast, when it is known)."""
        return WaitDistribution.remaining(self.forecast(ctx), elapsed_s), None

    def _victim_action_for(self, ctx: PauseContext, fc: WaitForecast) -> Action:
        d = self._decide_expected(ctx, fc.distribution, fc, from_tier=Action.RETAIN, elapsed=0.0,
                                  allow_retain=False)
        return d.action

    def _decide_expected(self, ctx: PauseContext, dist: WaitDistribution, fc: WaitForecast | None,
                         from_tier: Action, elapsed: float, allow_retain: bool = True) -> Decision:
        return decide_expected(self, ctx, dist, fc, from_tier, elapsed, allow_retain)


class PointStat(str, enum.Enum):
    """The point estimate :class:`PointBreakEvenPolicy` prices (option ``point_stat``)."""
    MEAN = "mean"   # the forecast's mean
    P50 = "p50"     # the forecast's median

    def __str__(self) -> str:
        return self.value


class PointBreakEvenPolicy(BreakEvenPolicy):
    """The texts' break-even rule on a point estimate of the wait (registry ``breakeven_point``).

    The estimate is the forecast's mean (``point_stat="mean"``) or median
    (``"p50"``); the rule is :class:`kvtier.tiering.model.costmodel.PausePrice`'s.
    Leases, victims and observe() are :class:`BreakEvenPolicy`'s.
    """

    name = "breakeven_point"

    def __init__(self, geometry: ModelGeometry, hardware: HardwareProfile,
                 predictor: Predictor | None = None, *, point_stat: PointStat = PointStat.MEAN,
                 **options: Any) -> None:
        if point_stat not in tuple(PointStat):
            raise ValueError(f"point_stat must be 'mean' or 'p50', got {point_stat!r}")
        super().__init__(geometry, hardware, predictor, **options)
        self.point_stat = PointStat(point_stat)

    def decide(self, ctx: PauseContext) -> Decision:
        check_context(ctx)
        fc = self.forecast(ctx)
        return self._decide_point(ctx, fc.mean_s if self.point_stat is PointStat.MEAN else fc.quantiles["p50"])

    def _decide_known(self, ctx: PauseContext, wait_s: float) -> Decision:
        return self._decide_point(ctx, wait_s)

    def _decide_point(self, ctx: PauseContext, wait_s: float) -> Decision:
        """The texts' rule (via costmodel.PausePrice) on a point estimate of the wait."""
        pr, hw = self.prices, self.hardware
        kv, move = ctx.kv_bytes, ctx.bytes_to_move
        mu_h = self.hbm_price(ctx.hbm_pressure)
        mu_d = self.dram_price(ctx)
        if mu_h > mu_d:
            if move == kv:
                t_star = breakeven_wait(kv, hw, mu_hbm=mu_h, mu_dram=mu_d, stall_s=pr.stall_tolerance_s)
            else:
                t_star = (t_offload(move, hw) + t_reload(kv, hw)) * mu_h / (mu_h - mu_d) + pr.stall_tolerance_s
        else:
            t_star = math.inf
        price = PausePrice(context_tokens=ctx.context_tokens, kv_bytes=kv, t_reload_s=t_reload(kv, hw),
                           t_roundtrip_s=t_roundtrip(kv, hw),
                           t_recompute_s=t_recompute(self.geometry, ctx.context_tokens, hw),
                           breakeven_wait_s=t_star,
                           t_nvme_roundtrip_s=t_nvme_roundtrip(kv, hw) if self.options.nvme else None,
                           stall_s=pr.stall_tolerance_s)
        action = Action(price.action(wait_s))
        if action == Action.OFFLOAD_HOST and move > ctx.host_free_bytes:
            action = Action.OFFLOAD_NVME if self.options.nvme and move <= ctx.nvme_free_bytes else Action.RECOMPUTE
        elif action == Action.OFFLOAD_NVME and move > ctx.nvme_free_bytes:
            action = Action.OFFLOAD_HOST if move <= ctx.host_free_bytes else Action.RECOMPUTE
        prefetch = None
        if action == Action.OFFLOAD_HOST:
            prefetch = max(t_offload(move, hw), wait_s - price.t_reload_s)
        elif action == Action.OFFLOAD_NVME:
            prefetch = max(t_offload(move, hw) + t_nvme_write(move, hw),
                           wait_s - price.t_reload_s - t_nvme_read(kv, hw))
        return Decision(action=action, prefetch_at_s=prefetch, expected_cost=0.0,
                        reason=f"point estimate {wait_s:.3g}s vs break-even {t_star:.3g}s",
                        extra={"wait_s": wait_s, "breakeven_wait_s": t_star})


class OraclePolicy(BreakEvenPolicy):
    """Per-pause clairvoyant: knows the true wait (``ctx.true_wait_s``).

    For each pause it prices every action on the *known* wait W with the same
    prices as :class:`BreakEvenPolicy` (retain holds HBM for W; an offload
    pays its copy-out and lower-tier holding and starts the reload at
    max(copy-out done, W - t_reload) so it finishes exactly when the tool
    returns; recompute pays the rebuild), picks the cheapest, never needs a
    lease, and evicts victims knowing their remaining wait.  So it bounds what
    any per-pause decision rule can do *under this cost model* (breakeven
    differs from it only by not knowing W).  It is not a global optimum of a
    queueing node: it does not plan jointly across pauses, so when the prices
    misjudge the node's bottleneck a fixed rule can come out a hair ahead.

    Raises ValueError when ``true_wait_s`` is missing.
    """

    name = "oracle"

    def decide(self, ctx: PauseContext) -> Decision:
        check_context(ctx)
        if ctx.true_wait_s is None:
            raise ValueError("the oracle policy needs PauseContext.true_wait_s")
        return self.decide_for_wait(ctx, ctx.true_wait_s)

    def on_lease_expiry(self, ctx: PauseContext, elapsed_s: float, current: Decision) -> Decision | None:
        return None  # it knew the wait; its plan stands

    def observe(self, tool: str, wait_s: float, features: Mapping[str, str] | None = None) -> None:
        pass

    def victim_priority(self, ctx: PauseContext, elapsed_s: float) -> float:
        """The true remaining wait (the forecast's expectation when the holder gives no truth)."""
        if ctx.true_wait_s is None:
            return super().victim_priority(ctx, elapsed_s)
        return max(ctx.true_wait_s - float(elapsed_s), 0.0)

    def victim_action(self, ctx: PauseContext) -> Action:
        """The cheapest way out knowing the wait (the forecast's when the holder gives no truth)."""
        check_context(ctx)
        if ctx.true_wait_s is None:
            return super().victim_action(ctx)
        return self._victim_action_for(ctx, WaitForecast.point_mass(ctx.tool, ctx.true_wait_s))

    def _victim_view(self, ctx: PauseContext, elapsed_s: float) -> tuple[WaitDistribution, WaitForecast | None]:
        """The true remaining wait (the forecast's when the holder gives no truth)."""
        if ctx.true_wait_s is None:
            return super()._victim_view(ctx, elapsed_s)
        fc = WaitForecast.point_mass(ctx.tool, max(ctx.true_wait_s - elapsed_s, 0.0))
        return fc.distribution, fc
