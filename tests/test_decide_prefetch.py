"""The prefetch optimiser's shortcuts against the formula: best_prefetch's early stop (t_min or never
cheaper than every candidate) and its ``beat`` cutoff, and the decisions that use them."""
from __future__ import annotations

import math
import random
from bisect import bisect_right
from dataclasses import replace

import numpy as np
import pytest

import kvtier.tiering.policy.expected as expected
import kvtier.tiering.policy.prefetch as prefetch_mod
from kvtier.tiering.model.costmodel import GB
from kvtier.tiering.model.decision import Action, Decision, PauseContext
from kvtier.tiering.forecasting.forecast import WaitDistribution, WaitForecast, build_forecast
from kvtier.tiering.policy.policies import best_prefetch, make_policy
from kvtier.tiering.model.presets import get_node, get_preset


def reference(dist: WaitDistribution, r: float, h: float, sw: float, t_min: float) -> tuple[float | None, float]:
    """best_prefetch's documented answer, every candidate priced by the vector formula (no bounds):
    cost_j = sw K_j + (sw - h)(m - t_j p) - h t_j + h M - sw r P(W < t_min) over t_j = v_j - r >= t_min,
    then the clipped candidate t_min, then never (reload on return)."""
    pts, cw, cm = dist.points, dist.cum_w, dist.cum_m
    plist, cwl, cml = dist.lists
    total = cml[-1]
    p_min = cwl[int(np.searchsorted(pts, t_min))] if t_min > 0.0 else 0.0
    c = pts - r
    i = pts.searchsorted(c)
    cost = sw * dist.k + (sw - h) * (cm[i] - c * cw[i]) - h * c
    ok = np.flatnonzero(c >= t_min)
    best_t, best_c = plist[0] - r, math.inf
    if len(ok):
        j = int(ok[0]) + int(cost[ok[0]:].argmin())
        best_t, best_c = plist[j] - r, float(cost[j]) + h * total - sw * r * p_min
    i0, i1 = int(np.searchsorted(pts, t_min)), int(np.searchsorted(pts, t_min + r))
    p0, m0, p1, m1 = cwl[i0], cml[i0], cwl[i1], cml[i1]
    c0 = sw * (r * (p0 - p_min) + (t_min + r) * (p1 - p0) - (m1 - m0)) + h * ((total - m0) - t_min * (1.0 - p0))
    if c0 <= best_c:
        best_t, best_c = t_min, c0
    never = sw * r * (1.0 - p_min)
    if never <= best_c + 1e-12 * abs(never) or best_t >= plist[-1]:
        return None, never
    return best_t, best_c


def distributions(rng: random.Random, n: int):
    for k in range(n):
        fc = build_forecast("x", "tool", 10, 10.0, rng.uniform(-5, 4), rng.uniform(0.05, 3.0), None, 10.0)
        kind = k % 4
        if kind == 0:
            yield fc.distribution
        elif kind == 1:      # conditioned on an elapsed wait (a lease expiry's view)
            yield WaitDistribution.remaining(fc, fc.quantile(rng.uniform(0.05, 0.95)))
        elif kind == 2:      # duplicated points (flat regions of a sketch blend)
            pts = np.maximum.accumulate(np.round(fc.points, 2) + 1e-3)
            yield WaitDistribution.of_bins(pts, fc.weights, float(np.sum(pts * fc.weights)))
        else:
            yield WaitForecast.point_mass("x", rng.uniform(0.0, 5.0)).distribution


def test_best_prefetch_is_the_formula_with_and_without_a_cutoff():
    rng = random.Random(16)
    stopped = cut = 0
    for dist in distributions(rng, 400):
        span = max(dist.lists[0][-1], 1e-3)
        for _ in range(6):
            r = span * 10 ** rng.uniform(-3, 0.5)
            h = 10 ** rng.uniform(-3, 0.7)
            sw = rng.choice([1.0, 1.0, 0.5, 3.0])
            t_min = rng.choice([0.0, r / 3, span * rng.random()])
            ref = reference(dist, r, h, sw, t_min)
            # no cutoff: the formula's answer, float for float
            assert best_prefetch(dist, r, h, sw, t_min) == ref
            # a cutoff: the same answer, or (None, inf) only when the answer costs at least the cutoff
            beat = ref[1] * rng.choice([0.5, 0.9, 0.999, 1.0, 1.001, 1.5])
            got = best_prefetch(dist, r, h, sw, t_min, beat)
            if got == (None, math.inf):
                cut += 1
                assert ref[1] >= beat
            else:
                assert got == ref
    assert cut > 100        # the cutoff was exercised, not just the exact path


def test_the_early_stop_leaves_the_answer_unchanged_where_t_min_or_never_wins():
    # wide reloads against the points' spacing make t_min or never the answer while the two end
    # candidates prove nothing: the optimiser stops before pricing every candidate
    rng = random.Random(7)
    seen = 0
    for dist in distributions(rng, 200):
        span = max(dist.lists[0][-1], 1e-3)
        for r in (span * 0.05, span * 0.3, span):
            for t_min in (0.0, span * 0.2):
                ref = reference(dist, r, 0.3, 1.0, t_min)
                assert best_prefetch(dist, r, 0.3, 1.0, t_min) == ref
                seen += ref[0] is None or ref[0] == t_min
    assert seen > 50


GEOM, NODE = get_preset("llama-3.1-70b"), get_node("h100x8")


def _random_pause(rng: random.Random, tool: str) -> PauseContext:
    tokens = rng.randint(500, 150_000)
    kv = GEOM.kv_bytes(tokens)
    return PauseContext(tool=tool, kv_bytes=kv, context_tokens=tokens,
                        new_bytes=None if rng.random() < 0.4 else rng.randint(0, kv),
                        hbm_pressure=rng.uniform(0.0, 1.0),
                        host_free_bytes=NODE.host_bytes * rng.uniform(0.0, 1.0) if rng.random() < 0.9 else kv * 0.5,
                        nvme_free_bytes=math.inf if rng.random() < 0.95 else kv * 0.5,
                        evictable=rng.random() < 0.5, write_through=rng.random() < 0.3,
                        admission_waiting_bytes=GB if rng.random() < 0.3 else 0.0,
                        link_out_queue_s=rng.choice([0.0, rng.uniform(0.0, 0.3)]),
                        link_in_queue_s=rng.choice([0.0, rng.uniform(0.0, 0.3)]),
                        link_utilisation=rng.choice([0.0, rng.uniform(0.0, 1.0)]))


@pytest.mark.parametrize("options", [{}, {"queues": "price"}, {"early_host_wait_s": 1e9}, {"early_stage_fill": 0.5},
                                     {"victim_plan": "full"}, {"nvme": False}])
def test_decisions_equal_those_of_the_exact_optimiser(monkeypatch, options):
    """Every decision (action, prefetch, lease, staging, cost) is the one the optimiser without the cutoff
    gives; an offload left out of ``extra`` costs, priced exactly, no less than the chosen action."""
    rng = random.Random(hash(tuple(sorted(options.items()))) & 0xFFFF)
    policy = make_policy("breakeven", geometry=GEOM, hardware=NODE, **options)
    tools = [(f"t{i}", rng.uniform(-4, 4), rng.uniform(0.3, 2.0)) for i in range(6)]
    for _ in range(300):
        name, mu, s = rng.choice(tools)
        policy.observe(name, rng.lognormvariate(mu, s))
    cases = []
    for _ in range(1200):
        ctx = _random_pause(rng, rng.choice(tools)[0])
        if "early_host_wait_s" in options:       # a holder that measures new work's admission wait
            ctx = replace(ctx, admission_wait_s=rng.uniform(0.0, 10.0))
        cases.append((ctx, rng.uniform(0.0, 5.0)))
    fast = [(policy.decide(c), policy.on_lease_expiry(c, e, Decision(Action.RETAIN)), policy.victim_decision(c, e))
            for c, e in cases]
    exact_prefetch = expected.best_prefetch
    monkeypatch.setattr(expected, "best_prefetch", lambda d, r, h, sw, t_min=0.0, beat=math.inf:
                        exact_prefetch(d, r, h, sw, t_min))
    exact = [(policy.decide(c), policy.on_lease_expiry(c, e, Decision(Action.RETAIN)), policy.victim_decision(c, e))
             for c, e in cases]
    left_out = 0
    for got, want in zip(fast, exact):
        for a, b in zip(got, want):
            assert (a.action, a.prefetch_at_s, a.demote_at_s, a.stage_at_s, a.expected_cost) == \
                (b.action, b.prefetch_at_s, b.demote_at_s, b.stage_at_s, b.expected_cost)
            for key, cost in b.extra.items():
                if key in a.extra:
                    assert a.extra[key] == cost
                else:
                    left_out += 1
                    assert key in ("offload_host", "offload_nvme") and cost >= b.expected_cost
    assert left_out > 0


def _vector_costs(dist: WaitDistribution, r: float, h: float, sw: float) -> np.ndarray:
    """Every candidate's cost_j by the vector formula (best_prefetch's docstring)."""
    pts, cw, cm = dist.points, dist.cum_w, dist.cum_m
    c = pts - r
    i = pts.searchsorted(c)
    return sw * dist.k + (sw - h) * (cm[i] - c * cw[i]) - h * c


def _vector_argmin(dist: WaitDistribution, r: float, h: float, sw: float, j0: int) -> tuple[int, float]:
    """The vector pass over every candidate j >= j0 (what _prefetch_argmin answered before the walk)."""
    cost = _vector_costs(dist, r, h, sw)
    j = j0 + int(cost[j0:].argmin())
    return j, float(cost[j])


@pytest.mark.parametrize("py_candidates", [prefetch_mod.PY_CANDIDATES, 4])
def test_the_exact_argmin_is_the_vector_pass_float_for_float(monkeypatch, py_candidates):
    """_prefetch_argmin without a cutoff, whatever path answers (the two ends, the falling prefix
    left out and the rest bounded, the walk, the vector pass over the rest), is the vector pass's
    first minimum with its floats; each path is taken."""
    monkeypatch.setattr(prefetch_mod, "PY_CANDIDATES", py_candidates)
    seen = {"cut": 0, "jump": 0, "walk": 0, "vector": 0}
    real_prefix = prefetch_mod._falling_prefix

    def prefix(plist, cwl, r, h, sw, j0, last, tol, sparse=None):
        a = real_prefix(plist, cwl, r, h, sw, j0, last, tol, sparse)
        # its promise: every candidate it leaves out costs more than candidate a
        cost = _vector_costs(dist, r, h, sw)
        assert all(cost[j] > cost[a] for j in range(j0, a))
        seen["cut"] += a > j0
        # the one-step proof over far-apart points took part
        seen["jump"] += sparse is not None and h > 0 and a > j0 and a >= bisect_right(sparse[0], r * (1 + 1e-9))
        seen["walk" if last - a < py_candidates else "vector"] += 1
        return a

    monkeypatch.setattr(prefetch_mod, "_falling_prefix", prefix)
    rng = random.Random(1616)
    for dist in distributions(rng, 400):
        plist = dist.lists[0]
        span = max(plist[-1], 1e-3)
        for _ in range(8):
            # reloads short and long against the points' spacing; holding cheaper than a stall
            # mostly (the falling prefix), sometimes dearer (no prefix: the walk from j0)
            r = span * 10 ** rng.uniform(-4, 0)
            sw = rng.choice([1.0, 1.0, 0.5, 3.0])
            h = sw * rng.choice([rng.uniform(0.0, 1.0), rng.uniform(0.9, 1.0), rng.uniform(1.0, 3.0), 0.0])
            j0 = rng.choice([0, 0, rng.randrange(len(plist))])
            assert prefetch_mod._prefetch_argmin(dist, r, h, sw, j0) == _vector_argmin(dist, r, h, sw, j0)
    assert seen["cut"] > 100 and seen["jump"] > 100 and seen["walk"] > 100
    assert seen["vector"] > 100 if py_candidates == 4 else seen["vector"] == 0


def test_far_apart_points_take_the_one_step_proof_and_keep_the_answer():
    """Points more than r apart (the distribution's sparse_tail): the one-step proof that the cost
    falls lands where the step-by-step proof would creep to, never past a cheaper candidate; the
    answers, inner ones among them, are the vector pass's."""
    rng = random.Random(99)
    inner = jumped = 0
    for _ in range(1500):
        n = rng.randint(5, 53)
        pts = np.cumsum([rng.uniform(0.95, 1.5) for _ in range(n)])
        w = np.array([rng.uniform(0.5, 1.5) for _ in range(n)])
        dist = WaitDistribution.of_bins(pts, w / w.sum(), float(np.dot(pts, w / w.sum())))
        r, h = rng.uniform(0.5, 0.94), rng.uniform(0.02, 0.9)
        want = _vector_argmin(dist, r, h, 1.0, 0)
        assert prefetch_mod._prefetch_argmin(dist, r, h, 1.0, 0) == want
        inner += want[0] < n - 1
        plist, cwl, _ = dist.lists
        with_proof = prefetch_mod._falling_prefix(plist, cwl, r, h, 1.0, 0, n - 1, 1e-12, dist.sparse)
        assert with_proof <= want[0]
        jumped += with_proof > 0 and dist.sparse[0][with_proof] > r
    assert inner > 300 and jumped > 300
