"""The options of :class:`~kvtier.tiering.policy.breakeven.BreakEvenPolicy`: one frozen, validated object.

``BreakEvenOptions`` holds what a policy can be told besides its prices
(:class:`~kvtier.tiering.policy.pricing.CostPrices`); it is checked once, when made, and
never changes.  :func:`split_options` sorts a flat mapping of options (what
``make_policy("breakeven", ..., **options)`` and the simulator's
``--set breakeven.OPTION=VALUE`` pass) into options and price fields, and refuses
an unknown name with one line naming it.

:class:`PricedPolicy` is the rest of what :mod:`kvtier.tiering.policy.expected` reads of its
policy besides these options (its prices and the prices it derives), so the decision depends
on this contract, not on :class:`~kvtier.tiering.policy.breakeven.BreakEvenPolicy`.

Imports :mod:`kvtier.tiering.policy.pricing`, :mod:`~kvtier.tiering.model.costmodel`,
:mod:`~kvtier.tiering.model.decision` and :mod:`kvtier.util.choices` only.
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass, fields
from typing import Mapping, Protocol

from kvtier.tiering.model.costmodel import HardwareProfile
from kvtier.tiering.model.decision import PauseContext
from kvtier.tiering.policy.pricing import CostPrices
from kvtier.util.choices import member


class Lease(str, enum.Enum):
    """How retention's lease is set (option ``lease``)."""
    PRICED = "priced"       # the cheapest lease over the forecast
    QUANTILE = "quantile"   # the forecast's ``lease_quantile``

    def __str__(self) -> str:
        return self.value


class Queues(str, enum.Enum):
    """What the holder's queue fields do (option ``queues``)."""
    TIMING = "timing"       # start prefetches that much earlier
    PRICE = "price"         # also price every queue wait and the link's shadow price
    OFF = "off"             # ignore them

    def __str__(self) -> str:
        return self.value


class VictimPlan(str, enum.Enum):
    """What :meth:`~kvtier.tiering.policy.breakeven.BreakEvenPolicy.victim_decision` plans of
    an evicted victim's way back (option ``victim_plan``)."""
    NONE = "none"           # nothing: the action only
    STAGE = "stage"         # the staging NVMe -> host, no prefetch
    FULL = "full"           # the staging and a prefetch

    def __str__(self) -> str:
        return self.value


def _number(name: str, v: object, lo: float, hi: float = math.inf, *, hi_open: bool = True) -> float:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and lo <= v and (v < hi if hi_open else v <= hi)
    if not ok:
        bound = "a finite number >= 0" if hi == math.inf else f"in [{lo:g}, {hi:g}{')' if hi_open else ']'}"
        raise ValueError(f"{name} must be {bound}, got {v!r}")
    return float(v)


@dataclass(frozen=True)
class BreakEvenOptions:
    """What a :class:`~kvtier.tiering.policy.breakeven.BreakEvenPolicy` is told besides its prices.

    lease_quantile       the quantile lease of offload_host (and of retain with ``lease="quantile"``)
    nvme                 price an NVMe tier (false: a node without one)
    lease                ``"priced"``: retention's lease is the cheapest over the forecast;
                         ``"quantile"``: the forecast's ``lease_quantile``
    staging              plan an NVMe copy's staging NVMe -> host ahead of the return
    revocable            on an evicting holder, retention pays one possible eviction instead of
                         the pressure price per second
    cache_pricing        on a write-through holder, a host copy is droppable and pays the fill term only
    queues               what the holder's queue fields do: ``"timing"`` start prefetches that much
                         earlier, ``"price"`` also price every queue wait and the link's shadow
                         price, ``"off"`` ignore them
    early_stage_fill     below this host fill after staging, a staged copy pays the fill term only (0: never)
    victim_plan          what :meth:`victim_decision` plans of an evicted victim's way back:
                         ``"none"``, ``"stage"``, ``"full"`` (and a prefetch)
    revocable_busy_s     retention stays revocable while work waits once a copy-out started now would
                         wait this long on the host link
    victim_free_weight   stall weights a victim's way out pays per second until its HBM is free
    victim_floor_wait_s  while new work's admission wait is below this, a victim's expected remaining
                         wait is at least its time paused
    early_host_wait_s    while new work's admission wait is below this, an offload also prices
                         "host first, NVMe at a lease"

    Raises:
        ValueError: on a value of the wrong type or out of range (the message names the option).
    """

    lease_quantile: float = 0.9
    nvme: bool = True
    lease: Lease = Lease.PRICED
    staging: bool = True
    revocable: bool = True
    cache_pricing: bool = True
    queues: Queues = Queues.TIMING
    early_stage_fill: float = 0.0
    victim_plan: VictimPlan = VictimPlan.NONE
    revocable_busy_s: float = 0.001
    victim_free_weight: float = 1.0
    victim_floor_wait_s: float = 0.5
    early_host_wait_s: float = 2.0

    def __post_init__(self) -> None:
        for name in ("nvme", "staging", "revocable", "cache_pricing"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        set_ = object.__setattr__
        for name, kind in (("lease", Lease), ("queues", Queues), ("victim_plan", VictimPlan)):
            set_(self, name, member(kind, getattr(self, name), field=name))
        q = self.lease_quantile
        if not (isinstance(q, (int, float)) and not isinstance(q, bool) and 0.0 < q < 1.0):
            raise ValueError(f"lease_quantile must be in (0, 1), got {q!r}")
        set_(self, "lease_quantile", float(q))
        set_(self, "early_stage_fill", _number("early_stage_fill", self.early_stage_fill, 0.0, 1.0, hi_open=False))
        busy = self.revocable_busy_s
        if not (isinstance(busy, (int, float)) and not isinstance(busy, bool) and busy >= 0.0):
            raise ValueError(f"revocable_busy_s must be a number >= 0, got {busy!r}")
        set_(self, "revocable_busy_s", float(busy))
        for name in ("victim_free_weight", "victim_floor_wait_s", "early_host_wait_s"):
            set_(self, name, _number(name, getattr(self, name), 0.0))

    @property
    def lease_key(self) -> str:
        """The forecast quantile key of ``lease_quantile`` (``"p90"``), or "" when it has none."""
        pct = self.lease_quantile * 100
        return f"p{round(pct)}" if abs(pct - round(pct)) < 1e-9 else ""

    @property
    def plan_victims(self) -> bool:
        """Whether :meth:`victim_decision` plans a victim's way back (``victim_plan`` is not "none")."""
        return self.victim_plan is not VictimPlan.NONE


OPTION_NAMES: tuple[str, ...] = tuple(f.name for f in fields(BreakEvenOptions))
PRICE_NAMES: tuple[str, ...] = tuple(f.name for f in fields(CostPrices))


def split_options(policy: str, options: Mapping[str, object]) -> tuple[dict, dict]:
    """Sort ``options`` into (BreakEvenOptions fields, CostPrices fields).  Pure.

    Raises:
        ValueError: one line listing the unknown options with the known names.
    """
    unknown = sorted(k for k in options if k not in OPTION_NAMES and k not in PRICE_NAMES)
    if unknown:
        raise ValueError(f"unknown option(s) {unknown} for policy {policy!r}; options: {list(OPTION_NAMES)}; "
                         f"price options: {sorted(PRICE_NAMES)}")
    opts = {k: v for k, v in options.items() if k in OPTION_NAMES}
    prices = {k: v for k, v in options.items() if k in PRICE_NAMES}
    return opts, prices


class PricedPolicy(Protocol):
    """What the expected-cost decision reads of its policy (a
    :class:`~kvtier.tiering.policy.breakeven.BreakEvenPolicy`): its options, prices, hardware, and
    the prices it derives from them.  Every member is read only."""

    @property
    def options(self) -> BreakEvenOptions: ...
    @property
    def prices(self) -> CostPrices: ...
    @property
    def hardware(self) -> HardwareProfile: ...
    @property
    def ref_gb(self) -> float: ...
    @property
    def flops_per_token(self) -> float: ...
    def hbm_price(self, u: float) -> float: ...
    def host_fill(self, ctx: PauseContext) -> float: ...
    def droppable_price(self, fill: float) -> float: ...
