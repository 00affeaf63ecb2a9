"""Pause policies: scenario stories, the texts' break-even rule, leases, baselines, registry."""
from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest

from kvtier.tiering.model.costmodel import GB, HardwareProfile, breakeven_wait, t_reload, t_roundtrip
from kvtier.tiering.model.decision import Action, Decision, PauseContext, Policy
from kvtier.tiering.forecasting.forecast import build_forecast
from kvtier.tiering.policy.policies import (POLICY_NAMES, BreakEvenPolicy, CostPrices, WaitDistribution, best_lease,
                                    best_prefetch, make_policy)
from kvtier.tiering.forecasting.predictor import ToolWaitPredictor, WaitForecast
from kvtier.tiering.model.presets import get_node, get_preset
from kvtier.bench.sim.variants import make_sim_policy

GEOM = get_preset("gqa-70b")
# An eight-accelerator node whose host links sustain 25 GB/s node-wide (shared
# PCIe), so moving 10.7 GB takes 0.43 s: long enough for prefetch timing to matter.
NODE = HardwareProfile(hbm_bytes=640 * GB, link_h2d_bps=25 * GB, link_d2h_bps=25 * GB,
                       prefill_flops=3560e12, weights_bytes=141 * GB, runtime_bytes=20 * GB,
                       host_bytes=1000 * GB)
TOKENS = 32768
KV = GEOM.kv_bytes(TOKENS)          # 10.7 GB, the texts' 45-second-wait example


def pause(tool: str, pressure: float = 0.5, **kw) -> PauseContext:
    # a holder that keeps what it retains (the engine hooks, the service); stories about an evicting
    # holder (the simulator) pass evictable=True
    kw.setdefault("evictable", False)
    return PauseContext(tool=tool, kv_bytes=KV, context_tokens=TOKENS, hbm_pressure=pressure, **kw)


@pytest.fixture()
def trained():
    """A breakeven policy that has watched an agent fleet for a while."""
    rng = random.Random(0)
    policy = make_policy("breakeven", geometry=GEOM, hardware=NODE)
    for _ in range(40):
        policy.observe("make", rng.uniform(0.05, 0.10))              # incremental builds
        policy.observe("pytest", rng.uniform(44.0, 46.0))            # the 45 s test suite
        policy.observe("grep", rng.lognormvariate(math.log(2.0), 0.3))
    return policy


# --------------------------------------------------------------------------- stories
def test_short_build_wait_retains(trained):
    # make returns in ~75 ms, far less than the 0.86 s round trip: keep the KV where it is.
    d = trained.decide(pause("make"))
    assert d.action == Action.RETAIN
    assert d.prefetch_at_s is None
    # The lease is priced: every build the predictor has seen is back long before holding
    # 10.7 GB could cost a round trip, so no lease beats any lease...
    assert d.demote_at_s is None
    # ...while the quantile-lease mode keeps one at the build's p90, in case of the odd slow build.
    q = BreakEvenPolicy(GEOM, NODE, trained.predictor, lease="quantile").decide(pause("make"))
    assert q.action == Action.RETAIN
    assert q.demote_at_s == pytest.approx(trained.predictor.forecast("make").quantiles["p90"])


def test_45s_test_run_offloads_to_host_and_prefetches_in_time(trained):
    # The texts' Napkin Math 0.6: holding 10.7 GB for 45 s is a misallocation.
    d = trained.decide(pause("pytest", pressure=0.3))
    assert d.action == Action.OFFLOAD_HOST
    assert d.expected_cost < d.extra["retain"] / 3
    # The reload starts before the suite is due back and finishes before most runs end.
    reload = t_reload(KV, NODE)
    assert 30.0 < d.prefetch_at_s < 44.0
    waits = np.random.default_rng(1).uniform(44.0, 46.0, 1000)
    in_time = np.mean(d.prefetch_at_s + reload <= waits)
    assert in_time >= 0.75


FILLING = 0.15 * NODE.host_bytes     # host tier 85% full: DRAM room is wanted, it has its price


def test_human_approval_goes_to_nvme(trained):
    # Nobody has approved anything yet: the human-input prior (p50 1.4 min, p90 20 min).  With the
    # host tier filling up, DRAM for many minutes is dearer than the NVMe round trip.
    d = trained.decide(pause("human_approval", host_free_bytes=FILLING))
    assert d.action == Action.OFFLOAD_NVME
    # After watching approvals take ~10 minutes, still NVMe, with a prefetch near the end.
    rng = random.Random(5)
    for _ in range(30):
        trained.observe("human_approval", rng.lognormvariate(math.log(600), 0.5))
    d = trained.decide(pause("human_approval", host_free_bytes=FILLING))
    assert d.action == Action.OFFLOAD_NVME
    assert d.prefetch_at_s is None or d.prefetch_at_s > 60
    # While the host tier is nearly empty its room is wanted by nobody: DRAM is (almost) free,
    # so the approval waits there and an early return comes back over the host link, not NVMe.
    empty = trained.decide(pause("human_approval"))
    assert empty.action == Action.OFFLOAD_HOST
    assert empty.extra["offload_host"] < empty.extra.get("offload_nvme", math.inf)    # or not priced: its bound lost


def test_full_host_tier_pushes_to_nvme_or_recompute(trained):
    d = trained.decide(pause("pytest", host_free_bytes=0.0))
    assert d.action in (Action.OFFLOAD_NVME, Action.RECOMPUTE)
    assert "offload_host" not in d.extra
    # With NVMe full too, only recompute is left (retaining 45 s is still dearer).
    d = trained.decide(pause("pytest", host_free_bytes=0.0, nvme_free_bytes=0.0))
    assert d.action == Action.RECOMPUTE


def test_pressure_changes_the_answer(trained):
    # A 2 s grep: idle HBM is nearly free, so keep it (below the ceiling a retained pause is an
    # eviction victim, so pressure buys one possible eviction); at the admission ceiling, where
    # every held second keeps a session out, move it out.
    relaxed = trained.decide(pause("grep", pressure=0.1, evictable=True))
    tight = trained.decide(pause("grep", pressure=0.88))
    assert relaxed.action == Action.RETAIN
    assert tight.action == Action.OFFLOAD_HOST
    # On an evicting holder at the ceiling, with new work waiting, the room is taken at once:
    # moved out too.
    queued = trained.decide(pause("grep", pressure=0.88, evictable=True, admission_waiting_bytes=GB))
    assert queued.action == Action.OFFLOAD_HOST
    # Past the ceiling HBM is dear, but so is the saturated node's prefill: a quick copy-out
    # still beats a rebuild that would take the engine from everybody queued behind it.
    overloaded = trained.decide(pause("grep", pressure=0.97))
    assert overloaded.action == Action.OFFLOAD_HOST
    assert overloaded.extra["recompute"] > overloaded.extra["offload_host"]
    # With nowhere to put it, dropping it is the way out.
    stuck = trained.decide(pause("grep", pressure=0.97, host_free_bytes=0.0, nvme_free_bytes=0.0))
    assert stuck.action == Action.RECOMPUTE


def test_only_new_blocks_move():
    # The second pause of a trajectory re-offloads only the blocks added since the first.
    policy = make_policy("breakeven", geometry=GEOM, hardware=NODE)
    for _ in range(30):
        policy.observe("grep", 1.5)
    full = policy.decide(pause("grep", pressure=0.5))
    incremental = policy.decide(pause("grep", pressure=0.5, new_bytes=KV // 20))
    assert incremental.extra["offload_host"] < full.extra.get("offload_host", math.inf)


# --------------------------------------------------------------------------- the texts' rule
@pytest.mark.parametrize("pressure", [0.3, 0.7, 0.88, 0.95])
def test_point_mode_reproduces_the_texts_breakeven(pressure):
    policy = make_policy("breakeven_point", geometry=GEOM, hardware=NODE)
    ctx = pause("x", pressure)
    mu_h = policy.hbm_price(pressure)
    mu_d = policy.dram_price(ctx)
    t_star = breakeven_wait(KV, NODE, mu_hbm=mu_h, mu_dram=mu_d)
    assert policy.decide_for_wait(ctx, t_star * (1 - 1e-9)).action == Action.RETAIN
    assert policy.decide_for_wait(ctx, t_star * (1 + 1e-9)).action == Action.OFFLOAD_HOST


def test_texts_figure_10_threshold_with_free_dram():
    # Figure 10: 70B at 16,384 tokens over PCIe Gen5 (~50 GB/s each way): T* = round trip = 215 ms.
    hw = HardwareProfile(hbm_bytes=640 * GB, link_h2d_bps=50 * GB, link_d2h_bps=50 * GB, prefill_flops=3560e12)
    geom = get_preset("gqa-70b")
    kv = geom.kv_bytes(16384)
    policy = make_policy("breakeven_point", geometry=geom, hardware=hw, dram_ratio=0.0)
    ctx = PauseContext(tool="x", kv_bytes=kv, context_tokens=16384, hbm_pressure=0.5)
    t_star = t_roundtrip(kv, hw)
    assert t_star == pytest.approx(0.215, abs=0.001)
    assert policy.decide_for_wait(ctx, 0.2).action == Action.RETAIN
    assert policy.decide_for_wait(ctx, 0.23).action == Action.OFFLOAD_HOST


@pytest.mark.parametrize("pressure", [0.3, 0.7, 0.95])
def test_expected_cost_on_a_known_wait_has_the_same_threshold(pressure):
    # The expected-cost model, given a point mass and the texts' premise that the
    # resumed step must not stall (a huge stall weight), draws the line where they do.
    # (With stalls priced at 1 s/s it may offload a little earlier under pressure.)
    oracle = make_policy("oracle", geometry=GEOM, hardware=NODE, nvme=False, compute_weight=100.0,
                         stall_weight=1e6)
    ctx = pause("x", pressure)
    t_star = breakeven_wait(KV, NODE, mu_hbm=oracle.hbm_price(pressure), mu_dram=oracle.dram_price(ctx))
    below = oracle.decide(pause("x", pressure, true_wait_s=t_star * 0.999))
    above = oracle.decide(pause("x", pressure, true_wait_s=t_star * 1.001))
    assert below.action == Action.RETAIN and above.action == Action.OFFLOAD_HOST
    # and it prefetches exactly in time: reload done when the tool returns
    assert above.prefetch_at_s + t_reload(KV, NODE) == pytest.approx(t_star * 1.001)


def test_victim_under_pressure_is_swapped_not_dropped(trained):
    # The engine needs room and picks a retained make: swapping beats a 1.3 s rebuild...
    assert trained.decide(pause("make")).action == Action.RETAIN
    assert trained.victim_action(pause("make")) == Action.OFFLOAD_HOST
    # ...unless neither lower tier has room.
    assert trained.victim_action(pause("make", host_free_bytes=0, nvme_free_bytes=0)) == Action.RECOMPUTE


def test_a_victims_decision_plans_its_way_back_after_the_pause(trained):
    # 30 s into a pytest pause (45 s suite) the room is wanted: the victim leaves HBM now, and
    # its plan is in seconds after the pause, never before now
    # (victim_free_weight=0: the NVMe write's time is not charged as the waiting work's stall,
    # so the way out follows the DRAM price alone, as this story assumes)
    stage = make_policy("breakeven", geometry=GEOM, hardware=NODE, predictor=trained.predictor, victim_plan="stage",
                        victim_free_weight=0.0)
    assert stage.plan_victims and not trained.plan_victims          # "none" by default: victim_action only
    d = stage.victim_decision(pause("pytest", host_free_bytes=NODE.host_bytes * 0.02), 30.0)
    assert d.action == Action.OFFLOAD_NVME               # host DRAM 98% full: dear until the return
    assert d.stage_at_s is not None and 30.0 <= d.stage_at_s < 45.0
    assert d.prefetch_at_s is None                        # "stage": the reload waits for the resume
    full = make_policy("breakeven", geometry=GEOM, hardware=NODE, predictor=trained.predictor, victim_plan="full")
    assert full.plan_victims and full.victim_decision(pause("pytest"), 30.0).prefetch_at_s >= 30.0
    assert not make_policy("breakeven", geometry=GEOM, hardware=NODE, victim_plan="none").plan_victims
    with pytest.raises(ValueError):
        trained.victim_decision(pause("pytest"), -1.0)
    with pytest.raises(ValueError):
        make_policy("breakeven", geometry=GEOM, hardware=NODE, victim_plan="sometimes")
    # the oracle plans over the true remaining wait: the reload lands as the tool returns
    oracle = make_policy("oracle", geometry=GEOM, hardware=NODE, victim_plan="full")
    od = oracle.victim_decision(pause("pytest", true_wait_s=45.0), 30.0)
    assert od.action == Action.OFFLOAD_HOST
    assert od.prefetch_at_s + t_reload(KV, NODE) == pytest.approx(45.0)


# --------------------------------------------------------------------------- leases
def test_lease_expiry_demotes_as_the_wait_outgrows_the_forecast():
    rng = random.Random(2)
    policy = make_policy("breakeven", geometry=GEOM, hardware=NODE)
    # bash: usually a second, occasionally a very long job (heavy tail).
    for _ in range(200):
        policy.observe("bash", rng.lognormvariate(0.0, 1.5))
    ctx = pause("bash", pressure=0.3)
    d = policy.decide(ctx)
    assert d.action in (Action.RETAIN, Action.OFFLOAD_HOST) and d.demote_at_s is not None
    # The tool is still running at the lease: what remains is long, so step down.
    later = policy.on_lease_expiry(ctx, d.demote_at_s, d)
    assert later is not None and later.action != Action.RETAIN
    # Far past anything seen before, host DRAM is no place to wait either.
    host = Decision(Action.OFFLOAD_HOST, demote_at_s=60.0)
    deep = policy.on_lease_expiry(pause("bash", pressure=0.3, host_free_bytes=FILLING), 3600.0, host)
    assert deep.action in (Action.OFFLOAD_NVME, Action.RECOMPUTE)
    # Nothing below NVMe.
    assert policy.on_lease_expiry(ctx, 7200.0, Decision(Action.OFFLOAD_NVME)) is None


def test_lease_renewal_keeps_times_relative_to_the_pause(trained):
    ctx = pause("grep", pressure=0.1, evictable=True)
    d = trained.decide(ctx)
    assert d.action == Action.RETAIN
    e = d.demote_at_s if d.demote_at_s is not None else 5.0   # 5 s: past every grep seen
    again = trained.on_lease_expiry(ctx, e, d)
    assert again is not None
    for t in (again.prefetch_at_s, again.demote_at_s, again.stage_at_s):
        assert t is None or t >= e


def test_decide_never_mutates_learned_state(trained):
    before = json.dumps(trained.predictor.state_dict(), sort_keys=True)
    ctx = pause("pytest")
    d = trained.decide(ctx)
    trained.on_lease_expiry(ctx, 50.0, Decision(Action.RETAIN, demote_at_s=50.0))
    trained.decide_for_wait(ctx, 3.0)
    assert json.dumps(trained.predictor.state_dict(), sort_keys=True) == before
    assert d == trained.decide(ctx)


# --------------------------------------------------------------------------- prefetch optimiser
def test_best_prefetch_matches_brute_force():
    rng = random.Random(11)
    for _ in range(60):
        fc = build_forecast("x", "tool", 10, 10.0, rng.uniform(-3, 4), rng.uniform(0.05, 3.0), None, 10.0)
        dist = fc.distribution
        r, h = 10 ** rng.uniform(-3, 1), 10 ** rng.uniform(-3, 1)
        t_min = rng.choice([0.0, r / 2, 10 ** rng.uniform(-3, 1)])
        t, cost = best_prefetch(dist, r, h, 1.0, t_min)
        pts, w = fc.points, fc.weights

        def expected(t):
            stall = np.where(pts < t_min, 0.0, np.where(pts < t, r, np.clip(t + r - pts, 0.0, None)))
            return float(np.sum(w * (stall + h * np.clip(pts - t, 0.0, None))))
        grid = np.concatenate(([t_min], np.linspace(t_min, pts[-1], 2000), pts - r, pts))
        brute = min([expected(x) for x in grid if x >= t_min] + [float(np.sum(w[pts >= t_min])) * r])
        assert cost <= brute * (1 + 1e-6) + 1e-12
        if t is not None:
            assert t >= t_min and expected(t) == pytest.approx(cost, rel=1e-6, abs=1e-12)


def test_best_lease_on_the_envelope_matches_the_table():
    # a forecast's distribution answers best_lease from its lease table's lower envelope; a
    # conditioned one (no envelope) from the table itself: both give the same lease and cost
    rng = random.Random(12)
    for _ in range(60):
        fc = build_forecast("x", "tool", 10, 10.0, rng.uniform(-3, 4), rng.uniform(0.05, 3.0), None, 10.0)
        dist = fc.distribution
        table_only = WaitDistribution(dist.points, dist.cum_w, dist.cum_m, dist.k, dist.mean)
        assert dist.lease_hull is not None and table_only.lease_hull is None
        for _ in range(20):
            hold = 10 ** rng.uniform(-6, 1)
            after = rng.choice([0.0, 10 ** rng.uniform(-4, 2)])
            tail = rng.choice([0.0, hold * rng.random(), 10 ** rng.uniform(-8, -2)])
            lease, cost = best_lease(dist, hold, after, tail)
            assert (lease, cost) == best_lease(table_only, hold, after, tail)
            # and it is the best point: E[hold min(W, L) + after 1(W > L) + tail (W - L)+]
            pts, w = fc.points, fc.weights

            def expected(x):
                return float(np.sum(w * (hold * np.minimum(pts, x) + after * (pts > x) + tail * np.clip(pts - x, 0, None))))
            assert cost <= min(expected(x) for x in pts) * (1 + 1e-9) + 1e-12


# --------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("kw", [dict(kv_bytes=int(1e18)), dict(context_tokens=10 ** 10),
                                dict(host_free_bytes=float("nan")), dict(nvme_free_bytes=-1.0)])
def test_absurd_pauses_are_rejected(kw):
    policy = make_policy("breakeven", geometry=GEOM, hardware=NODE)
    base = dict(tool="grep", kv_bytes=KV, context_tokens=TOKENS, hbm_pressure=0.5)
    with pytest.raises(ValueError):
        policy.decide(PauseContext(**{**base, **kw}))


def test_bad_contexts_and_tools():
    policy = make_policy("breakeven", geometry=GEOM, hardware=NODE)
    with pytest.raises(ValueError):
        PauseContext(tool="grep", kv_bytes=KV, context_tokens=TOKENS, hbm_pressure=float("nan"))
    with pytest.raises(ValueError):
        policy.decide(pause(""))
    with pytest.raises(ValueError):
        policy.observe("grep", -3.0)
    with pytest.raises(ValueError):
        make_policy("oracle", geometry=GEOM, hardware=NODE).decide(pause("grep"))  # no true wait
    with pytest.raises(ValueError):
        policy.decide_for_wait(pause("grep"), float("nan"))
    # Unknown tools are not errors: they get the prior.
    assert policy.decide(pause("brand_new_tool")).action in set(Action)


# --------------------------------------------------------------------------- registry and baselines
def test_registry_names_and_errors():
    for name in ("breakeven", "oracle", "retain", "recompute", "offload_host", "lru", "ttl", "min_waste"):
        assert name in POLICY_NAMES
    with pytest.raises(ValueError, match="known policies: .*breakeven"):
        make_policy("nope", geometry=GEOM, hardware=NODE)
    with pytest.raises(ValueError, match="unknown option"):
        make_policy("breakeven", geometry=GEOM, hardware=NODE, shadow_price=3)
    with pytest.raises(ValueError):
        make_policy("ttl", geometry=GEOM, hardware=NODE, ttl_s=-1)
    with pytest.raises(ValueError):
        CostPrices(admission_ceiling=1.5)


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_every_policy_decides_and_learns(name):
    policy = make_policy(name, geometry=GEOM, hardware=get_node("h100x8"))
    assert isinstance(policy, Policy)
    for w in (0.5, 1.0, 2.0):
        policy.observe("grep", w)
    d = policy.decide(pause("grep", true_wait_s=1.0))
    assert isinstance(d, Decision) and d.action in set(Action)
    for t in (d.prefetch_at_s, d.demote_at_s):
        assert t is None or (math.isfinite(t) and t >= 0)


def test_baselines_behave_as_their_papers_say():
    mk = lambda n, **o: make_policy(n, geometry=GEOM, hardware=NODE, **o)  # noqa: E731
    ctx = pause("pytest")
    assert mk("retain").decide(ctx).action == Action.RETAIN
    assert mk("retain").victim_action(ctx) == Action.RECOMPUTE          # vLLM preemption
    assert mk("recompute").decide(ctx).action == Action.RECOMPUTE
    assert mk("offload_host").decide(ctx).action == Action.OFFLOAD_HOST
    assert mk("offload_host").decide(pause("pytest", host_free_bytes=0)).action == Action.OFFLOAD_NVME
    assert mk("lru").decide(ctx).action == Action.RETAIN
    assert mk("lru").victim_action(ctx) == Action.OFFLOAD_HOST         # HiCache-like swap
    # Continuum: pin for the TTL, evict when it expires.
    ttl = mk("ttl", ttl_s=3.0)
    d = ttl.decide(ctx)
    assert d.action == Action.RETAIN and d.demote_at_s == 3.0
    assert ttl.on_lease_expiry(ctx, 3.0, d).action == Action.RECOMPUTE
    # Its per-tool CDF variant pins quick tools and not 45-second ones.
    cdf = mk("ttl_cdf")
    for _ in range(30):
        cdf.observe("make", 0.08)
        cdf.observe("pytest", 45.0)
    assert cdf.decide(pause("make")).demote_at_s > 0.08
    assert cdf.decide(pause("pytest", pressure=0.8)).action == Action.RECOMPUTE
    # InferCept: preserve short interceptions, swap long ones.
    mw = mk("min_waste")
    for _ in range(10):
        mw.observe("make", 0.08)
        mw.observe("pytest", 45.0)
    assert mw.decide(pause("make")).action == Action.RETAIN
    assert mw.decide(pause("pytest")).action == Action.OFFLOAD_HOST


# --------------------------------------------------------------------------- revocable retention, eviction order, staging
def test_an_evicting_holder_retains_a_short_wait_that_a_pinning_holder_moves_out(trained):
    # A 2 s grep at half pressure.  On a holder that can evict paused state when it needs the
    # room (the simulator, an engine with swap-on-pressure), retaining is an option: the pressure
    # part of the HBM price buys one possible eviction, not every second of the wait...
    evicting = trained.decide(pause("grep", pressure=0.5, evictable=True))
    assert evicting.action == Action.RETAIN
    # ...while a holder that keeps whatever it retains (evictable=False) pays HBM for the
    # whole wait, and a copy to host is cheaper.
    pinning = trained.decide(pause("grep", pressure=0.5, evictable=False))
    assert pinning.action == Action.OFFLOAD_HOST
    assert pinning.extra["retain"] > evicting.extra["retain"]
    # Switching the option off restores the non-revocable price.
    plain = BreakEvenPolicy(GEOM, NODE, trained.predictor, revocable=False)
    assert plain.decide(pause("grep", pressure=0.5, evictable=True)).action == Action.OFFLOAD_HOST


def test_with_new_work_waiting_for_admission_a_retained_pause_pays_its_whole_hold(trained):
    # The same 2 s grep on the same evicting holder, but new sessions are queued for admission:
    # whatever room the pause holds would be taken at once, so evicting it later sits on the
    # waiting work's critical path.  Retention is priced as on a pinning holder: host wins.
    queued = trained.decide(pause("grep", pressure=0.5, evictable=True, admission_waiting_bytes=2 * GB))
    assert queued.action == Action.OFFLOAD_HOST
    pinning = trained.decide(pause("grep", pressure=0.5, evictable=False))
    assert queued.extra["retain"] == pytest.approx(pinning.extra["retain"])


def test_priced_lease_demotes_a_heavy_tailed_retention_early(trained):
    # bash-like waits: mostly sub-second, a long tail.  Retained on a quiet node, the lease comes
    # well before the tail: holding through the tail would cost more than one copy-out and reload.
    rng = random.Random(5)
    for _ in range(200):
        trained.observe("bash", rng.lognormvariate(math.log(0.3), 2.0))
    d = trained.decide(pause("bash", pressure=0.3))
    assert d.action == Action.RETAIN
    fc = trained.predictor.forecast("bash")
    assert d.demote_at_s is not None and d.demote_at_s < fc.quantiles["p99"]
    # and at expiry the tail is re-priced from HBM: it leaves (or renews with a later lease)
    again = trained.on_lease_expiry(pause("bash", pressure=0.3), d.demote_at_s, d)
    assert again is not None
    assert again.action != Action.RETAIN or (again.demote_at_s or math.inf) > d.demote_at_s


def test_victims_in_order_of_expected_remaining_wait(trained):
    rng = random.Random(6)
    for _ in range(60):
        trained.observe("human", rng.lognormvariate(math.log(84.0), 2.0))
    # breakeven's order is the expected remaining wait, not the time paused (recency, the
    # longest-paused first, is the simulator's variant breakeven_recency: docs/policy.md)
    assert trained.victim_priority(pause("human"), 7.0) != 7.0
    # A human approval just started is expected back far later than a grep or a test run...
    assert trained.victim_priority(pause("human"), 0.0) > trained.victim_priority(pause("pytest"), 0.0) \
        > trained.victim_priority(pause("grep"), 0.0)
    # ...a test run 40 s in is nearly back, so it goes after a fresh grep...
    assert trained.victim_priority(pause("pytest"), 40.0) < trained.victim_priority(pause("grep"), 0.0) + 5.0
    # ...past everything the predictor has seen, the remaining wait grows with the wait (Lindy).
    assert trained.victim_priority(pause("grep"), 100.0) == pytest.approx(100.0)
    # The oracle ranks by the true remaining wait; recency order is the elapsed time.
    oracle = make_policy("oracle", geometry=GEOM, hardware=NODE)
    assert oracle.victim_priority(pause("grep", true_wait_s=30.0), 10.0) == pytest.approx(20.0)
    recency = make_sim_policy("breakeven_recency", geometry=GEOM, hardware=NODE, predictor=trained.predictor)
    assert recency.victim_priority(pause("human"), 7.0) == 7.0
    # The base Policy contract: the longest-paused first.
    assert Policy.victim_priority(recency, pause("grep"), 3.0) == 3.0
    with pytest.raises(ValueError, match="victim_order"):
        BreakEvenPolicy(GEOM, NODE, trained.predictor, victim_order="recency")


def test_a_victims_remaining_wait_is_floored_at_its_time_paused_only_on_a_node_that_is_not_overloaded(trained):
    # The 45 s test run, 40 s in: the forecast expects it back in a few seconds.  A holder whose new
    # work waits under victim_floor_wait_s for admission (admission_wait_s) evicts rarely, so 40 s
    # paused is evidence of a tail the forecast does not see: the remaining wait is at least 40 s.
    # Under overload (or a holder that does not measure it: the engines) the forecast's stands.
    p = trained
    assert p.options.victim_floor_wait_s == 0.5
    plain = p.victim_priority(pause("pytest"), 40.0)
    assert plain < 10.0
    assert p.victim_priority(pause("pytest", admission_wait_s=0.1), 40.0) == pytest.approx(40.0)
    assert p.victim_priority(pause("pytest", admission_wait_s=0.5), 40.0) == plain     # at the gate: off
    assert p.victim_priority(pause("pytest", admission_wait_s=30.0), 40.0) == plain
    # the floor never lowers a longer forecast: a fresh pytest is still expected back in ~45 s
    fresh = p.victim_priority(pause("pytest"), 0.0)
    assert fresh > 40.0 and p.victim_priority(pause("pytest", admission_wait_s=0.0), 0.0) == fresh
    # 0 turns it off; recency order is unchanged; the field is validated
    off = BreakEvenPolicy(GEOM, NODE, p.predictor, victim_floor_wait_s=0.0)
    assert off.victim_priority(pause("pytest", admission_wait_s=0.0), 40.0) == plain
    recency = make_sim_policy("breakeven_recency", geometry=GEOM, hardware=NODE, predictor=p.predictor)
    assert recency.victim_priority(pause("pytest", admission_wait_s=0.0), 40.0) == 40.0
    for bad in (-1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="admission_wait_s"):
            pause("pytest", admission_wait_s=bad)
    with pytest.raises(ValueError, match="victim_floor_wait_s"):
        BreakEvenPolicy(GEOM, NODE, p.predictor, victim_floor_wait_s=-1.0)


def test_host_first_then_nvme_is_priced_only_while_new_work_is_admitted_quickly():
    # A bimodal tool: 3 in 10 calls return within 1.5 s, the rest after minutes.  On a host tier
    # 90% full (DRAM dear) the long body alone sends the state to NVMe, and the early returns
    # pay the NVMe read.  While the holder measures new work's admission wait below
    # early_host_wait_s (2 s), breakeven also prices "host first, NVMe at a lease": the early
    # mode comes back from DRAM and the copy moves on to NVMe after it.  Under overload (DRAM is
    # wanted) and in a holder that measures no admission wait (the engines) it stays off.
    rng = random.Random(0)
    p = make_policy("breakeven", geometry=GEOM, hardware=NODE)
    for _ in range(60):
        p.observe("mix", rng.uniform(0.5, 1.5) if rng.random() < 0.3 else rng.uniform(200.0, 400.0))
    assert p.options.early_host_wait_s == 2.0
    full = dict(host_free_bytes=0.1 * NODE.host_bytes, nvme_free_bytes=10_000 * GB)
    plain = p.decide(pause("mix", **full))
    assert plain.action == Action.OFFLOAD_NVME
    early = p.decide(pause("mix", admission_wait_s=0.1, **full))
    assert early.action == Action.OFFLOAD_HOST
    assert 1.5 < early.demote_at_s < 200.0          # after the early mode, before the body
    assert early.expected_cost < plain.extra["offload_nvme"]
    for aw in (2.0, 30.0):                           # at the gate and past it: as without a measure
        d = p.decide(pause("mix", admission_wait_s=aw, **full))
        assert (d.action, d.demote_at_s) == (plain.action, plain.demote_at_s)
    # while DRAM is cheaper to hold in than NVMe no lease to NVMe pays: the same decision
    roomy = dict(host_free_bytes=0.7 * NODE.host_bytes, nvme_free_bytes=10_000 * GB)
    a, b = p.decide(pause("mix", **roomy)), p.decide(pause("mix", admission_wait_s=0.1, **roomy))
    assert (a.action, a.demote_at_s, a.expected_cost) == (b.action, b.demote_at_s, b.expected_cost)
    # a victim gets the same way out
    assert p.victim_action(pause("mix", **full)) != Action.OFFLOAD_HOST
    assert p.victim_action(pause("mix", admission_wait_s=0.1, **full)) == Action.OFFLOAD_HOST
    # a gate past the measured wait prices it there too; 0 turns the gate off; the oracle knows
    # the wait; the ungated option is refused
    wide = BreakEvenPolicy(GEOM, NODE, p.predictor, early_host_wait_s=60.0)
    assert wide.decide(pause("mix", admission_wait_s=30.0, **full)).action == Action.OFFLOAD_HOST
    with pytest.raises(ValueError, match="early_host"):
        BreakEvenPolicy(GEOM, NODE, p.predictor, early_host=True)
    off = BreakEvenPolicy(GEOM, NODE, p.predictor, early_host_wait_s=0.0)
    assert off.decide(pause("mix", admission_wait_s=0.0, **full)).action == Action.OFFLOAD_NVME
    oracle = make_policy("oracle", geometry=GEOM, hardware=NODE)
    assert oracle.decide(pause("mix", admission_wait_s=0.1, true_wait_s=300.0, **full)).demote_at_s is None
    for bad in (-1.0, math.inf, "2"):
        with pytest.raises(ValueError, match="early_host_wait_s"):
            BreakEvenPolicy(GEOM, NODE, p.predictor, early_host_wait_s=bad)


def test_nvme_state_is_staged_to_host_ahead_of_a_predictable_return():
    # A long, tight job (~10 min) while host DRAM is 95% full (dear): the state goes to NVMe,
    # and its way back is planned in two steps: NVMe -> host DRAM near the job's return (held
    # at the DRAM price, so not for the whole wait), then host -> HBM, so a return after the
    # staging costs a host reload, not an NVMe read.
    hw = HardwareProfile(hbm_bytes=640 * GB, link_h2d_bps=25 * GB, link_d2h_bps=25 * GB,
                         prefill_flops=3560e12, weights_bytes=141 * GB, runtime_bytes=20 * GB,
                         host_bytes=1000 * GB, nvme_read_bps=5 * GB, nvme_write_bps=5 * GB)
    policy = make_policy("breakeven", geometry=GEOM, hardware=hw)
    rng = random.Random(7)
    for _ in range(60):
        policy.observe("train", rng.uniform(590.0, 610.0))
    d = policy.decide(pause("train", pressure=0.5, host_free_bytes=50 * GB))
    assert d.action == Action.OFFLOAD_NVME
    assert d.stage_at_s is not None and d.prefetch_at_s is not None
    t_read = KV / hw.nvme_read_bps
    assert 500.0 < d.stage_at_s and d.stage_at_s + t_read <= d.prefetch_at_s
    # Without room in host DRAM for the staged copy there is no staging step.
    no_room = policy.decide(pause("train", pressure=0.5, host_free_bytes=1 * GB))
    assert no_room.stage_at_s is None
    # Staging off: the reload plan goes straight from NVMe.
    off = BreakEvenPolicy(GEOM, hw, policy.predictor, staging=False).decide(
        pause("train", pressure=0.5, host_free_bytes=50 * GB))
    assert off.stage_at_s is None


def test_a_write_through_host_keeps_a_human_approval_in_dram(trained):
    # Without write-through a host copy is the only copy: holding 10.7 GB of DRAM for an
    # approval expected to take many minutes is dearer than the NVMe round trip.
    rng = random.Random(5)
    for _ in range(30):
        trained.observe("human_approval", rng.lognormvariate(math.log(600), 0.5))
    assert trained.decide(pause("human_approval", host_free_bytes=FILLING)).action == Action.OFFLOAD_NVME
    # On a write-through holder the host copy is also on NVMe and is dropped for free when the
    # room is wanted: it pays only the fill term of the DRAM price, never more than a plain copy
    # (with the default prices the plain copy's floor is already near zero, so the two nearly
    # agree), and while the tier has room the approval stays in DRAM.
    for free in (1.0, 0.5, 0.3, 0.15, 0.0):
        c = pause("human_approval", write_through=True, host_free_bytes=free * NODE.host_bytes)
        assert trained.droppable_price(trained.host_fill(c)) <= trained.dram_price(c)
    wt = trained.decide(pause("human_approval", write_through=True))
    assert wt.action == Action.OFFLOAD_HOST
    assert wt.extra["offload_host"] < wt.extra.get("offload_nvme", math.inf)     # or not priced: its bound lost
    # A host tier full of copies that cannot be dropped prices DRAM as before: NVMe again.
    full = trained.decide(pause("human_approval", write_through=True, host_free_bytes=20 * GB))
    assert full.action == Action.OFFLOAD_NVME
    # Droppable copies are room, not fill: the same free bytes held by droppable copies
    # leave the fill the prices see as low as an empty tier's.
    assert trained.host_fill(pause("x", write_through=True, host_free_bytes=900 * GB,
                                   host_droppable_bytes=800 * GB)) == \
        trained.host_fill(pause("x", write_through=True, host_free_bytes=900 * GB))
    # The option turns it off (A/B): priced as a plain DRAM copy.
    off = BreakEvenPolicy(GEOM, NODE, trained.predictor, cache_pricing=False)
    c = pause("human_approval", write_through=True, host_free_bytes=FILLING)
    assert off.decide(c).action == Action.OFFLOAD_NVME


# --------------------------------------------------------------------------- the shared link
def test_a_queued_reload_link_starts_the_prefetch_earlier_by_the_expected_wait(trained):
    # the 45 s test run offloads to host and prefetches ahead of its return
    calm = trained.decide(pause("pytest", pressure=0.3))
    assert calm.action == Action.OFFLOAD_HOST and calm.prefetch_at_s is not None
    # 2 s of reloads queued ahead on the host -> device link: same plan, started 2 s earlier
    busy = trained.decide(pause("pytest", pressure=0.3, link_in_queue_s=2.0))
    assert busy.action == calm.action
    assert busy.prefetch_at_s == pytest.approx(calm.prefetch_at_s - 2.0)
    assert busy.extra["exp_link_queue_s"] == pytest.approx(2.0)
    # queues="off": the old model, blind to the queue
    off = BreakEvenPolicy(GEOM, NODE, trained.predictor, queues="off").decide(
        pause("pytest", pressure=0.3, link_in_queue_s=2.0))
    assert off.prefetch_at_s == pytest.approx(calm.prefetch_at_s)


def test_priced_queues_make_an_offload_dearer_on_a_busy_link(trained):
    priced = BreakEvenPolicy(GEOM, NODE, trained.predictor, queues="price")
    calm = priced.decide(pause("pytest", pressure=0.3))
    busy = priced.decide(pause("pytest", pressure=0.3, link_out_queue_s=1.0, link_in_queue_s=1.0,
                               link_utilisation=0.8))
    # calm link: offload to host; at 80% utilisation with a second queued each way, the copy-out
    # holds HBM through its queue, the reload waits too, and each link-second delays others
    # (rho/(1 - rho) = 4 per second): keeping 10.7 GB through the 45 s wait (or rebuilding it)
    # at 30% pressure wins
    assert calm.action == Action.OFFLOAD_HOST
    assert busy.action in (Action.RETAIN, Action.RECOMPUTE)
    assert busy.extra.get("offload_host", math.inf) > calm.extra["offload_host"]


@pytest.mark.parametrize("field, value", [("link_in_queue_s", -1.0), ("link_out_queue_s", math.inf),
                                          ("nvme_read_queue_s", math.nan), ("link_utilisation", 1.5)])
def test_pause_context_refuses_impossible_queue_views(field, value):
    with pytest.raises(ValueError, match=field):
        pause("pytest", **{field: value})


def test_an_evicting_holder_keeps_idle_state_until_the_room_is_wanted(trained):
    # The 45 s test run on a holder that evicts paused state when it needs the room, nothing
    # waiting for admission: HBM nobody wants costs nothing per second (revocable_floor 0), so the
    # state stays until it is taken, even above the admission ceiling (one certain eviction is
    # what pressure buys there), like lru; with work queued it is moved out at once.
    for u in (0.3, 0.88, 0.95):
        assert trained.decide(pause("pytest", pressure=u, evictable=True)).action == Action.RETAIN
    queued = trained.decide(pause("pytest", pressure=0.95, evictable=True, admission_waiting_bytes=GB))
    assert queued.action == Action.OFFLOAD_HOST
    # the HBM floor paid per second (price option revocable_floor) moves it out below the ceiling
    floor = BreakEvenPolicy(GEOM, NODE, trained.predictor, revocable_floor=0.05)
    assert floor.decide(pause("pytest", pressure=0.3, evictable=True)).action == Action.OFFLOAD_HOST
    # an occupancy cap on revocable retention is refused, as is revocable retention with work queued
    for removed in ("revocable_max_u", "revocable_queued"):
        with pytest.raises(ValueError, match=removed):
            BreakEvenPolicy(GEOM, NODE, trained.predictor, **{removed: 0.88})


def test_with_work_waiting_and_copy_outs_queued_on_the_link_retention_stays_revocable(trained):
    # The 45 s test run at 95% with new work queued moves out at once on an idle link.  With
    # copy-outs already queued on the host link (link_out_queue_s at or past revocable_busy_s),
    # moving it out now frees its room no sooner than evicting it when the room is wanted (one
    # FIFO link), and the pause may return first: it stays until it is taken, as with nothing
    # waiting.
    p = trained
    busy = p.options.revocable_busy_s
    assert 0.0 < busy < math.inf
    base = dict(pressure=0.95, evictable=True, admission_waiting_bytes=GB)
    assert p.decide(pause("pytest", **base, link_out_queue_s=0.0)).action == Action.OFFLOAD_HOST
    assert p.decide(pause("pytest", **base, link_out_queue_s=busy)).action == Action.RETAIN
    assert p.decide(pause("pytest", **base, link_out_queue_s=0.5 * busy)).action == Action.OFFLOAD_HOST
    # a pinning holder cannot take it back later: the queue does not make retention revocable
    pinned = dict(base, evictable=False)
    assert p.decide(pause("pytest", **pinned, link_out_queue_s=10.0)).action != Action.RETAIN
    # off: the previous rule (moved out whenever work waits)
    off = BreakEvenPolicy(GEOM, NODE, p.predictor, revocable_busy_s=math.inf)
    assert off.decide(pause("pytest", **base, link_out_queue_s=10.0)).action == Action.OFFLOAD_HOST
    for bad in (-1.0, math.nan, "1"):
        with pytest.raises(ValueError, match="revocable_busy_s"):
            BreakEvenPolicy(GEOM, NODE, p.predictor, revocable_busy_s=bad)


def test_a_rebuild_is_dearer_while_new_work_waits_for_admission(trained):
    # The prefill engine is the critical path of queued work: while something waits for admission
    # each second of rebuild is charged queued_compute_weight (3) instead of compute_weight (1).
    calm = trained.decide(pause("pytest", pressure=0.5))
    queued = trained.decide(pause("pytest", pressure=0.5, admission_waiting_bytes=GB))
    assert queued.extra["recompute"] == pytest.approx(calm.extra["recompute"] * (1 + 3) / (1 + 1))
    same = BreakEvenPolicy(GEOM, NODE, trained.predictor, queued_compute_weight=1.0)
    assert same.decide(pause("pytest", pressure=0.5, admission_waiting_bytes=GB)).extra["recompute"] == \
        pytest.approx(calm.extra["recompute"])


def test_the_hot_path_decision_is_the_constructors_decision(trained):
    """make_decision (decide's cheap Decision) builds the same frozen object as Decision(...)."""
    import pickle
    from dataclasses import FrozenInstanceError, replace

    from kvtier.tiering.model.decision import make_decision
    d = trained.decide(pause("pytest", 0.7))
    same = Decision(action=d.action, prefetch_at_s=d.prefetch_at_s, demote_at_s=d.demote_at_s,
                    expected_cost=d.expected_cost, reason=d.reason, extra=d.extra, stage_at_s=d.stage_at_s)
    assert d == same and repr(d) == repr(same)
    assert pickle.loads(pickle.dumps(d)) == d
    assert replace(d, prefetch_at_s=None).prefetch_at_s is None
    with pytest.raises(FrozenInstanceError):
        d.action = Action.RETAIN  # type: ignore[misc]
    built = make_decision(Action.OFFLOAD_HOST, 1.0, None, 2.0, "r", {"x": 1.0}, None)
    assert built == Decision(Action.OFFLOAD_HOST, 1.0, None, 2.0, "r", {"x": 1.0}, None)


def test_check_context_fast_path_still_rejects_nan_and_absurd_values():
    from kvtier.tiering.policy.pricing import check_context
    base = dict(tool="grep", kv_bytes=KV, context_tokens=TOKENS)
    check_context(PauseContext(**base, true_wait_s=3.0))
    for kw in (dict(true_wait_s=float("nan")), dict(true_wait_s=float("inf")), dict(kv_bytes=int(2e15)),
               dict(host_free_bytes=float("nan")), dict(nvme_free_bytes=float("nan"))):
        with pytest.raises(ValueError):
            check_context(PauseContext(**{**base, **kw}))


def test_a_measured_eviction_rate_prices_a_revocable_retention_by_its_chance_of_eviction(trained):
    # The 45 s test run on an evicting holder, nothing waiting.  The pressure rule prices one
    # likely eviction (certain at the ceiling).  A holder that measures how often it has made a
    # retained pause leave (eviction_rate_per_s = h) says the eviction comes before the return
    # with probability 1 - E[exp(-h W)]: rarely for a short wait on a node that seldom evicts.
    p = trained
    base = dict(pressure=0.88, evictable=True)
    rule = p.decide(pause("pytest", **base)).extra["retain"]
    never = p.decide(pause("pytest", **base, eviction_rate_per_s=0.0))
    assert never.action == Action.RETAIN and never.extra["retain"] == pytest.approx(0.0, abs=1e-12)
    some = p.decide(pause("pytest", **base, eviction_rate_per_s=0.01)).extra["retain"]
    press = (1.0 - p.prices.hbm_floor)              # the pressure rule's chance at the ceiling
    fc = p.predictor.forecast("pytest")
    chance = 1.0 - float(np.dot(fc.weights, np.exp(-0.01 * fc.points)))
    assert 0.3 < chance < 0.4 and some == pytest.approx(rule * chance / press, rel=1e-9)
    # the pressure bounds the measured chance: a node that evicts all the time changes nothing
    assert p.decide(pause("pytest", **base, eviction_rate_per_s=1e3)).extra["retain"] == pytest.approx(rule)
    # a holder that measures no rate keeps the pressure rule (above); a pinning holder's retention
    # is not revocable at all
    pinned = p.decide(pause("pytest", pressure=0.88, evictable=False, eviction_rate_per_s=0.0))
    assert pinned.extra["retain"] > rule
    for bad in (-1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="eviction_rate_per_s"):
            pause("pytest", eviction_rate_per_s=bad)
    with pytest.raises(ValueError, match="eviction_hazard"):
        BreakEvenPolicy(GEOM, NODE, p.predictor, eviction_hazard=False)


def test_a_revocable_retention_expects_the_eviction_it_priced(trained):
    # The attribution sets each pause's outcome against Decision.extra's exp_* terms.  A
    # retention priced as revocable expects what it priced: with chance 1 - E[exp(-h W)] it is
    # evicted before the return (a copy-out, and a reload stall on the return), and it holds HBM
    # until min(W, eviction), E[(1 - exp(-h W)) / h].  A pinned one (the short build) expects
    # the whole wait in HBM and no stall.
    p, h = trained, 0.01
    d = p.decide(pause("pytest", pressure=0.88, evictable=True, eviction_rate_per_s=h))
    assert d.action == Action.RETAIN and d.demote_at_s is None
    fc = p.predictor.forecast("pytest")
    chance = 1.0 - float(np.dot(fc.weights, np.exp(-h * fc.points)))
    held = float(np.dot(fc.weights, (1.0 - np.exp(-h * fc.points)) / h))
    reload_s, copy_s = KV / NODE.link_h2d_bps, KV / NODE.link_d2h_bps
    assert d.extra["exp_stall_s"] == pytest.approx(chance * reload_s, rel=1e-9)
    assert d.extra["exp_transfer_s"] == pytest.approx(chance * (copy_s + reload_s), rel=1e-9)
    assert d.extra["exp_hold_gbs"] == pytest.approx(KV / GB * (held + chance * copy_s), rel=1e-9)
    pinned = p.decide(pause("make", pressure=0.88, evictable=False))
    assert pinned.action == Action.RETAIN and pinned.demote_at_s is None
    assert pinned.extra["exp_stall_s"] == 0.0
    assert pinned.extra["exp_hold_gbs"] == pytest.approx(KV / GB * p.predictor.forecast("make").mean_s, rel=1e-9)


def test_a_pause_pays_the_hbm_its_nvme_write_holds_while_the_host_tier_is_cheaper():
    # A 43 GB context waiting about 5 s: its copy-out takes 1.7 s at 25 GB/s, and an NVMe offload
    # holds the HBM through the write too (the copy streams through bounce buffers).  With the
    # host tier empty, DRAM holds the copy more cheaply than NVMe, so NVMe has nothing to win:
    # its write seconds are paid at the HBM price, and host is the way out.
    rng = random.Random(0)
    p = make_policy("breakeven", geometry=GEOM, hardware=NODE)
    for _ in range(40):
        p.observe("deploy", rng.lognormvariate(math.log(5.0), 0.3))
    tok = 131072
    kv = GEOM.kv_bytes(tok)
    ctx = PauseContext(tool="deploy", kv_bytes=kv, context_tokens=tok, hbm_pressure=0.5)
    d = p.decide(ctx)
    assert d.action == Action.OFFLOAD_HOST
    # the NVMe way out pays at least the HBM held through copy-out and write (so much that its
    # lower bound lost and it was not priced exactly)
    held = p.hbm_price(0.5) * kv / GB * (kv / NODE.link_d2h_bps + kv / NODE.nvme_write_bps)
    assert d.extra.get("offload_nvme", math.inf) > held > d.expected_cost
    # past the fill where DRAM is dearer than NVMe the host tier is the scarce one: the write is
    # paid at the DRAM price, so the NVMe way out costs less than the HBM those seconds hold
    filling = p.decide(PauseContext(tool="deploy", kv_bytes=kv, context_tokens=tok, hbm_pressure=0.5,
                                    host_free_bytes=FILLING))
    assert filling.action == Action.OFFLOAD_NVME and filling.extra["offload_nvme"] < held
    with pytest.raises(ValueError, match="nvme_write_hbm"):
        BreakEvenPolicy(GEOM, NODE, nvme_write_hbm=False)


def test_a_victims_way_out_pays_the_waiting_work_for_the_time_its_room_stays_taken():
    # A victim is evicted because work wants its room now, and its room is free only when its
    # copy lands: after the copy-out to host, after the NVMe write as well for NVMe (5x slower
    # here).  Those seconds are the waiting work's stall.  With the host tier 86% full and a
    # long approval forecast, DRAM through the wait is about as dear as the NVMe round trip:
    # priced on the DRAM alone the victim goes to NVMe, priced with its room's delay to host.
    rng = random.Random(0)
    waits = [rng.lognormvariate(math.log(120.0), 1.0) for _ in range(40)]
    pols = {}
    for w in (1.0, 0.0):
        pols[w] = make_policy("breakeven", geometry=GEOM, hardware=NODE, victim_free_weight=w)
        for s in waits:
            pols[w].observe("approve", s)
    ctx = pause("approve", pressure=0.9, evictable=True, host_free_bytes=NODE.host_bytes * 0.14)
    assert pols[0.0].victim_action(ctx) == Action.OFFLOAD_NVME
    assert pols[1.0].victim_action(ctx) == Action.OFFLOAD_HOST
    # exactly the copy-out's seconds (one stall weight each) on the host way out
    d1, d0 = (pols[w].victim_decision(ctx, 0.0) for w in (1.0, 0.0))
    assert d1.extra["offload_host"] - d0.extra["offload_host"] == pytest.approx(KV / NODE.link_d2h_bps)
    # a pause's own decision (the room is not wanted yet) is priced as before
    assert pols[1.0].decide(ctx).extra == pols[0.0].decide(ctx).extra
    with pytest.raises(ValueError, match="victim_free_weight"):
        BreakEvenPolicy(GEOM, NODE, victim_free_weight=-1.0)


def test_every_policy_answers_the_interface_the_holders_call():
    # what the lifecycle and the simulator call on any policy is declared on Policy, with defaults
    for name in POLICY_NAMES:
        p = make_policy(name, geometry=GEOM, hardware=NODE)
        ctx = pause("x")
        assert isinstance(p.plan_victims, bool) and p.name == name
        d = p.victim_decision(ctx, 1.0)
        assert isinstance(d, Decision) and d.action in tuple(Action)
        fc = p.forecast(ctx)
        assert fc is None or fc.n == 0                 # nothing observed yet
        p.close()
    base = make_policy("lru", geometry=GEOM, hardware=NODE)
    assert not base.plan_victims and base.forecast(pause("x")) is None
    assert base.victim_decision(pause("x"), 1.0) == Decision(base.victim_action(pause("x")))
