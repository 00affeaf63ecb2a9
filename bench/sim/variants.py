"""The simulator's policy variants: policies a benchmark compares that the product does not ship.

A variant is a class beside the product's policies (not an option of them), registered here by
name.  :func:`make_sim_policy` builds a variant or, for any other name, the product's policy
(:func:`kvtier.tiering.policy.policies.make_policy`), so ``--policies`` and ``--set VARIANT.OPTION=V``
take either.

* ``breakeven_recency``: breakeven's decisions with lru's victim order (the longest-paused
  first, :meth:`kvtier.tiering.model.decision.Policy.victim_priority`).  breakeven orders victims by
  expected remaining wait; docs/simulate.md has the comparison.
"""
from __future__ import annotations

from typing import Callable

from kvtier.tiering.policy.breakeven import BreakEvenPolicy
from kvtier.tiering.model.costmodel import HardwareProfile, ModelGeometry
from kvtier.tiering.model.decision import PauseContext, Policy
from kvtier.tiering.forecasting.forecast import Predictor
from kvtier.tiering.policy.policies import POLICY_NAMES, make_policy


class RecencyVictimsPolicy(BreakEvenPolicy):
    """BreakEvenPolicy whose HBM victims go longest-paused first (lru's order)."""

    name = "breakeven_recency"

    def victim_priority(self, ctx: PauseContext, elapsed_s: float) -> float:
        return Policy.victim_priority(self, ctx, elapsed_s)


VARIANTS: dict[str, Callable[..., Policy]] = {
    "breakeven_recency": RecencyVictimsPolicy,
}

SIM_POLICY_NAMES: tuple[str, ...] = POLICY_NAMES + tuple(VARIANTS)
"""Every name the simulator builds: the product's policies, then the variants."""


def make_sim_policy(name: str, *, geometry: ModelGeometry, hardware: HardwareProfile,
                    predictor: Predictor | None = None, **options: object) -> Policy:
    """Build the variant or product policy called ``name`` with ``options``.

    Raises:
        ValueError: an unknown name (listing :data:`SIM_POLICY_NAMES`), or an unknown or bad
            option (one line naming it).
    """
    cls = VARIANTS.get(name)
    if cls is None:
        if name not in POLICY_NAMES:
            raise ValueError(f"unknown policy {name!r}; known policies: {', '.join(SIM_POLICY_NAMES)}")
        return make_policy(name, geometry=geometry, hardware=hardware, predictor=predictor, **options)
    try:
        return cls(geometry, hardware, predictor, **options)
    except TypeError as exc:
        raise ValueError(f"bad option for policy {name!r}: {exc}") from None
