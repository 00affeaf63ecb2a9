"""The simulator's measured admission wait (``PauseContext.admission_wait_s``)."""
from __future__ import annotations

import math

import pytest

from kvtier.bench.sim.metrics import ADMISSION_TAU_S, RecentMean
from kvtier.bench.sim.runner import default_node
from kvtier.bench.sim.simulator import Simulator
from kvtier.bench.sim.synth import SynthConfig, synthesize
from kvtier.tiering.policy.baselines import LRUPolicy


def test_the_recent_mean_weights_old_waits_less_and_holds_still_between_samples():
    m = RecentMean()
    assert m.mean() is None                         # nothing admitted yet: unknown
    m.add(0.0, 10.0)
    assert m.mean() == pytest.approx(10.0)
    m.add(ADMISSION_TAU_S, 0.0)                     # one time constant later
    d = math.exp(-1.0)
    assert m.mean() == pytest.approx(10.0 * d / (d + 1.0))
    before = m.mean()
    m.add(30 * ADMISSION_TAU_S, 2.0)                # long after: the old waits have faded
    assert before > 2.0 and m.mean() == pytest.approx(2.0, rel=1e-9)


class Recording(LRUPolicy):
    """lru, recording the admission wait each pause sees and the queue behind it."""

    def __init__(self):
        self.seen = []

    def decide(self, ctx):
        self.seen.append((ctx.admission_wait_s, ctx.admission_waiting_bytes))
        return super().decide(ctx)


@pytest.mark.parametrize("hbm_gb", [687.2, 250.0])
def test_pauses_see_how_long_new_work_has_waited_for_admission(hbm_gb):
    # the default node never queues these 150 sessions; with 250 GB of HBM they wait ~1 s
    node = default_node(hbm_bytes=hbm_gb * 1e9)
    ss = synthesize(SynthConfig(sessions=150, rate_per_s=0.6, seed=0))
    pol = Recording()
    r = Simulator(ss, node, pol, check_every=199).run()
    seen = [w for w, _ in pol.seen]
    # every pause comes after the first admission (its own session's), so the wait is known
    assert seen and all(w is not None and w >= 0.0 and math.isfinite(w) for w in seen)
    waits = r.metrics["admission_wait_mean_s"]
    # a node whose sessions waited shows a positive wait to some pause; one where none waited, 0
    assert (max(seen) > 0.0) == (waits > 0.0)
    if hbm_gb < 300:
        assert waits > 0.1 and max(seen) > waits
        # while sessions queue, the head's wait so far counts even before the mean catches up
        assert any(b > 0.0 and w > 0.0 for w, b in pol.seen)
