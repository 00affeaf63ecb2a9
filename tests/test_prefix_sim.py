"""The prefix-load router on the cluster model, and the prefix hit rate metric."""
import pytest

from kvtier.bench.sim.cluster import ClusterConfig, run_cluster_policies
from kvtier.bench.sim.router import PrefixLoadRouter, make_router
from kvtier.bench.sim.runner import default_node
from kvtier.bench.sim.synth import SynthConfig, synthesize


def _run(router: str, **kw):
    sessions = synthesize(SynthConfig(sessions=40, rate_per_s=1.0, seed=4))
    cfg = ClusterConfig(nodes=4, router=router, **kw)
    return run_cluster_policies(sessions, default_node(), cfg, ["breakeven"])["breakeven"].metrics


def test_prefix_load_with_mu_1_keeps_resumes_where_the_state_is():
    m = _run("prefix-load", prefix_mu=1.0)
    aff = _run("affinity")
    # mu = 1: the match alone decides, and only home holds a resume's context
    assert m["cluster"]["resumes_moved"] == 0
    assert m["prefix_hit_rate"] == pytest.approx(aff["prefix_hit_rate"], abs=0.05)
    assert m["sessions_done"] == 160


def test_hit_rate_orders_the_routers_and_mu_0_spreads_the_work():
    rnd, ll0 = _run("random"), _run("prefix-load", prefix_mu=0.0)
    aff = _run("affinity")
    assert 0.0 <= rnd["prefix_hit_rate"] < aff["prefix_hit_rate"] <= 1.0
    # mu = 0: load only, so resumes move like least-loaded's
    assert ll0["cluster"]["resumes_moved"] > 0
    assert ll0["prefix_hit_rate"] < aff["prefix_hit_rate"]


def test_router_weights_are_validated():
    assert isinstance(make_router("prefix-load", mu=0.3, gamma=2.0), PrefixLoadRouter)
    with pytest.raises(ValueError):
        make_router("prefix-load", mu=1.5)
    with pytest.raises(ValueError):
        PrefixLoadRouter(gamma=0)
