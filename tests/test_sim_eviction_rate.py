"""The simulator's measured eviction rate (``PauseContext.eviction_rate_per_s``)."""
from __future__ import annotations

import math

import pytest

from kvtier.bench.sim.residents import EVICTION_TAU_S, EvictionRate
from kvtier.bench.sim.runner import default_node
from kvtier.bench.sim.simulator import Simulator
from kvtier.bench.sim.synth import SynthConfig, synthesize
from kvtier.tiering.policy.baselines import LRUPolicy


def test_the_rate_is_victims_over_trajectory_seconds_of_residence():
    r = EvictionRate()
    assert r.rate(0.0) is None                       # nothing resident yet: unknown
    r.resident(0.0, 4)
    assert r.rate(5.0) == 0.0                        # resident, never evicted
    r.evicted(10.0)
    r.resident(10.0, 3)
    exposure = 4 * EVICTION_TAU_S * (1.0 - math.exp(-10.0 / EVICTION_TAU_S))
    early = r.rate(10.0)
    assert early == pytest.approx(1.0 / exposure)      # ~1 / 40 trajectory-seconds
    # old evictions fade: an hour later, with 3 resident and none taken since, the rate has fallen
    assert r.rate(3610.0) < 1e-3 * early


class Recording(LRUPolicy):
    """lru, recording the eviction rate each pause sees."""

    def __init__(self):
        self.seen = []

    def decide(self, ctx):
        self.seen.append(ctx.eviction_rate_per_s)
        return super().decide(ctx)


def test_pauses_see_the_rate_of_the_victims_the_node_takes():
    node = default_node()
    ss = synthesize(SynthConfig(sessions=150, rate_per_s=0.6, seed=0))
    pol = Recording()
    r = Simulator(ss, node, pol, check_every=199).run()
    victims = sum(r.metrics["victims"].values())
    known = [h for h in pol.seen if h is not None]
    assert known and all(h >= 0.0 and math.isfinite(h) for h in known)
    # a node that took victims shows a positive rate to the pauses after them; one that took
    # none shows 0 throughout
    assert (max(known) > 0.0) == (victims > 0)
