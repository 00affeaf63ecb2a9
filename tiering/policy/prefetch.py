"""The prefetch optimiser: when to start a reload so that stall and holding cost least over a forecast.

:func:`best_prefetch` (re-exported by :mod:`kvtier.tiering.policy.pricing`) prices the
candidates "just in time for point j", t_min and never over a
:class:`~kvtier.tiering.forecasting.forecast.WaitDistribution`; the two end candidates and
their bounds answer most calls, :func:`_exact_argmin` the rest (a proof that the
cost falls over a prefix of the candidates, then a walk).  Every path prices
with the vector formula's floats and keeps its first-index rule.  Pure
functions (thread-safe).
"""
from __future__ import annotations

import math
from bisect import bisect_left, bisect_right

from kvtier.tiering.forecasting.forecast import WaitDistribution


def best_prefetch(dist: WaitDistribution, reload_s: float, hold_rate: float, stall_weight: float,
                  t_min: float = 0.0, beat: float = math.inf) -> tuple[float | None, float]:
    """Start time of the reload minimising stall_weight*E[stall] + hold_rate*E[(W - t)+].

    ``dist`` is the discretised wait distribution (sorted points v_j with
    cumulative weights A and masses B).  Returns (t, expected cost), t None
    meaning "reload when the tool returns".  Waits shorter than ``t_min``
    (the state has not left HBM yet) never stall.

    The cost is piecewise linear in t; its candidates are "just in time for
    point j" (t_j = v_j - r), t_min, and never.  For t_j >= t_min, with
    p = A(t_j), m = B(t_j) (mass below t_j) and K_j = v_j A_j - B_j::

        cost_j = sw K_j + (sw - h)(m - t_j p) - h t_j + h M - sw r P(W < t_min)

    (stall sums t + r - W over t <= W < t + r and r below t; hold sums W - t
    above t).

    ``beat``: the caller only needs the answer if its cost is below ``beat``
    (an offload priced against the best action so far, with a margin).  When
    every option provably costs more, it returns (None, inf) without pricing
    the candidates one by one; otherwise, and with the default inf, the exact
    answer.  Pure.
    """
    r, h, sw = reload_s, hold_rate, stall_weight
    plist, cwl, cml = dist.lists
    total = cml[-1]
    t0 = t_min
    # i0, i1: the points below t_min and below t_min + r (p_min, j0's start, the clipped candidate)
    i0, i1 = bisect_left(plist, t0), bisect_left(plist, t0 + r)
    p_min = cwl[i0] if t_min > 0.0 else 0.0
    # candidates c_j = v_j - r before t_min cannot start; c is sorted, so they are a prefix
    j0 = 0
    if t_min > 0.0 or plist[0] < r:
        # the first j with v_j - r >= t_min, in the subtraction's own floats
        n, j0 = len(plist), i1
        while j0 > 0 and plist[j0 - 1] - r >= t_min:
            j0 -= 1
        while j0 < n and plist[j0] - r < t_min:
            j0 += 1
    # the clipped candidate t = t_min (general formula, scalars), and never
    p0, m0, p1, m1 = cwl[i0], cml[i0], cwl[i1], cml[i1]
    c0 = sw * (r * (p0 - p_min) + (t0 + r) * (p1 - p0) - (m1 - m0)) + h * ((total - m0) - t0 * (1.0 - p0))
    never = sw * r * (1.0 - p_min)
    best_t, best_c = plist[0] - r, math.inf
    if j0 < len(plist):
        adj = h * total - sw * r * p_min
        # candidates dearer than t_min or never cannot be the answer, nor, when both of those
        # cost more than ``beat``, candidates dearer than ``beat``: the argmin may stop there
        stop = c0 if c0 < never else never
        out = stop > beat
        j, cand = _prefetch_argmin(dist, r, h, sw, j0, (beat if out else stop) - adj)
        if j >= 0:
            best_t, best_c = plist[j] - r, cand + h * total - sw * r * p_min   # not cand + adj: same floats
        elif out:
            return None, math.inf
    if c0 <= best_c:
        best_t, best_c = t0, c0
    if never <= best_c + 1e-12 * abs(never) or best_t >= plist[-1]:
        return None, never
    return best_t, best_c


def _candidate(plist: list, cwl: list, cml: list, kl: list, r: float, h: float, sw: float, swh: float,
               j: int) -> tuple[float, int, float, float]:
    """Candidate ``j`` of best_prefetch (the reload just in time for point j): its start
    t = v_j - r, the index i of the first point at or past t, u = m - t p = -E[(t - W)+] at t,
    and its cost f = sw K_j + (sw - h) u - h t (``swh`` = sw - h; the vector formula's floats).
    Pure."""
    t = plist[j] - r
    i = bisect_left(plist, t)
    u = cml[i] - t * cwl[i]
    return t, i, u, sw * kl[j] + swh * u - h * t


def _prefetch_argmin(dist: WaitDistribution, r: float, h: float, sw: float, j0: int,
                     stop: float = math.inf) -> tuple[int, float]:
    """(j, cost_j): the first j >= j0 minimising cost_j (see best_prefetch), or (-1, inf) when
    the bounds show every candidate costs more than ``stop`` (then no candidate is the answer).

    Most forecasts make the cost monotone over the candidates (the reload is long against the
    points' spacing, or holding is dear): then one of the two end candidates is the answer,
    and two bisects and two bounds prove it, where the vector pass over all of them costs a dozen
    numpy calls (what the decision's time went to).  Otherwise :func:`_exact_argmin` answers.
    Every path prices with the vector formula's floats, and of equal costs the first index wins
    (numpy argmin's rule), so the answer is the vector code's."""
    plist, cwl, cml = dist.lists
    kl, swh = dist.k_list, sw - h
    last = len(plist) - 1
    ta, ia, ua, fa = _candidate(plist, cwl, cml, kl, r, h, sw, swh, j0)
    if last == j0:
        return j0, fa
    tb, ib, ub, fb = _candidate(plist, cwl, cml, kl, r, h, sw, swh, last)
    j, best = (last, fb) if fb < fa else (j0, fa)
    if last - j0 < 2:
        return j, best
    lb = _inner_bound(plist, cwl, kl, r, h, sw, j0, fa, ta, ia, ua, last, fb, tb, ib, ub)
    scale = (sw + abs(h)) * (abs(plist[-1]) + r)
    if lb > best + 1e-11 * (scale + abs(best)):
        return j, best
    if stop < best:
        cut = stop + 1e-11 * (scale + abs(stop))
        if best > cut and (lb > cut or _all_above(dist, r, h, sw, cut, (j0, fa, ta, ia, ua, last, fb, tb, ib, ub))):
            return -1, math.inf
    return _exact_argmin(dist, r, h, sw, (j0, fa, ta, ia, ua, last, fb, tb, ib, ub), scale)


# candidates _exact_argmin prices one by one in Python (every forecast's: 53 bins); more go to the
# vector pass.  In bench_decide's loop the walk over 53 costs about what the dozen numpy calls
# of the vector pass cost there, and the walk usually starts far past the first candidate.
PY_CANDIDATES = 64


def _exact_argmin(dist: WaitDistribution, r: float, h: float, sw: float, ends: tuple,
                  scale: float) -> tuple[int, float]:
    """(j, cost_j) of _prefetch_argmin where its two end candidates and their bounds prove
    nothing: the vector pass's answer (its floats; of equal costs the first index), found over
    fewer candidates.  Pure.

    While holding costs less than a stall (0 <= h < sw) the candidates before
    :func:`_falling_prefix`'s end cost strictly more than that end, by more than any rounding,
    so they are left out; the rest are bounded as the two ends are (:func:`_inner_bound`), then
    priced one by one when few (a merge walk), else by the vector pass over them."""
    j0, fa, ta, ia, ua, last, fb, tb, ib, ub = ends
    plist, cwl, cml = dist.lists
    kl, swh = dist.k_list, sw - h
    a = j0
    if 0.0 <= h < sw:
        a = _falling_prefix(plist, cwl, r, h, sw, j0, last, 2e-11 * scale, dist.sparse)
        if a == last:
            return last, fb
        if a > j0:
            ta, ia, ua, fa = _candidate(plist, cwl, cml, kl, r, h, sw, swh, a)
            j, best = (last, fb) if fb < fa else (a, fa)
            if last - a < 2:
                return j, best
            lb = _inner_bound(plist, cwl, kl, r, h, sw, a, fa, ta, ia, ua, last, fb, tb, ib, ub)
            if lb > best + 1e-11 * (scale + abs(best)):
                return j, best
    if last - a < PY_CANDIDATES:
        # the candidates' starts grow with j, so each one's bisect continues the last one's
        i, best, j = ia, math.inf, -1
        for k in range(a, last + 1):
            t = plist[k] - r
            while plist[i] < t:
                i += 1
            f = sw * kl[k] + swh * (cml[i] - t * cwl[i]) - h * t
            if f < best:
                best, j = f, k
        return j, best
    pts, cw, cm = dist.points, dist.cum_w, dist.cum_m
    c = pts - r
    i = pts.searchsorted(c)
    cost = dist.sw_k(sw) + swh * (cm[i] - c * cw[i]) - h * c
    j = a + int(cost[a:].argmin())
    return j, float(cost[j])


def _falling_prefix(plist: list, cwl: list, r: float, h: float, sw: float, j0: int, last: int,
                    tol: float, sparse: tuple | None = None) -> int:
    """The largest a >= j0 such that the cost falls over the candidates j0 .. a and each of
    j0 .. a - 1 costs more than candidate a by more than ``tol`` (0 <= h < sw).  Pure.

    The cost's right slope at t is sw F(t + r) - (sw - h) F(t) - h, F(x) = P(W <= x).  On
    [t_j, t_(j+1)) F(t + r) <= A_(j+1) (the weight below v_(j+1)), and from t_a on F(t) is at
    least F(t_a): so from t_a the cost falls up to the first t_b with
    sw A_(b+1) >= h + (sw - h) F(t_a) (a bisect), and the step repeats from t_b.  The last step
    before a must fall by more than ``tol`` (then every earlier candidate is dearer still),
    else a steps back.

    Where the points lie more than r apart (``sparse``, the distribution's
    :func:`~kvtier.tiering.forecasting.forecast.sparse_tail`, from its index js on) a window (t, t + r]
    holds at most one point, of weight at most w, so the slope is at most sw w - h (1 - F(t))
    with F(t) <= A_b before t_b: once a reaches js, one bisect takes it to the last b with
    A_b < 1 - sw w / h, where the steps above would creep there."""
    swh = sw - h
    a = j0
    js = last + 1
    if sparse is not None and h > 0.0:
        js = bisect_right(sparse[0], r * (1.0 + 1e-9))
    while a < last:
        if a >= js:
            js = last + 1        # one jump
            b = bisect_left(cwl, 1.0 - sw * sparse[1][a] / h) - 1
            if b > a:
                a = b if b < last else last
                continue
        b = bisect_left(cwl, (h + swh * cwl[bisect_right(plist, plist[a] - r)]) / sw) - 1
        if b <= a:
            break
        a = b if b < last else last
    while a > j0:
        tp = plist[a - 1] - r
        slope = sw * cwl[a] - swh * cwl[bisect_right(plist, tp)] - h
        if -slope * ((plist[a] - r) - tp) > tol:
            break
        a -= 1
    return a


def _inner_bound(plist: list, cwl: list, kl: list, r: float, h: float, sw: float,
                 a: int, fa: float, ta: float, ia: int, ua: float,
                 b: int, fb: float, tb: float, ib: int, ub: float) -> float:
    """A lower bound on cost_j over the candidates strictly between a and b (b - a >= 2), from
    what the two ends saw (their cost f, start t, point index i and m - t p = u).  Pure.

    * monotone: E[stall(t)] does not decrease with t and E[(W - t)+] does not grow, so the
      cost is at least sw Stall(t_a) + h Hold(t_b);
    * slope: d/dt = sw F(t + r) - (sw - h) F(t) - h with F(x) = P(W < x), and between t_a
      and t_b both F's lie between what the ends saw, so the cost stays above the line from
      the first end at the least slope and the line to the last end at the greatest."""
    swh = sw - h
    lb = sw * (kl[a] + ua) + h * (-ub - tb)
    f_lo, f_hi = (cwl[ib], cwl[ia]) if swh >= 0.0 else (cwl[ia], cwl[ib])
    dmin, dmax = sw * cwl[a + 1] - swh * f_lo - h, sw * cwl[b] - swh * f_hi - h
    tl, tr = plist[a + 1] - r, plist[b - 1] - r
    if dmin >= 0.0:
        t = tl
    elif dmax <= 0.0:
        t = tr
    else:
        t = (fb - dmax * tb - fa + dmin * ta) / (dmin - dmax)
        t = tl if tl > t else t          # min(max(t, tl), tr), as comparisons
        t = tr if tr < t else t
    x = fa + dmin * (t - ta)             # max(lb, x, y), as comparisons
    lb = x if x > lb else lb
    x = fb - dmax * (tb - t)
    return x if x > lb else lb


MAX_SPLITS = 4      # candidates _all_above prices before it leaves the question to the vector pass


def _all_above(dist: WaitDistribution, r: float, h: float, sw: float, cut: float, ends: tuple) -> bool:
    """True when every inner candidate provably costs more than ``cut`` (both ends do): the
    range is split at its midpoint, up to MAX_SPLITS times, until the bound of every part is
    above ``cut``.  False as soon as a priced candidate is at or below ``cut`` (the candidates
    matter: the exact answer is priced) or the splits run out.  ``ends`` is the whole range,
    of at least three candidates, whose bound the caller found at or below ``cut``: it is split
    at once, not bounded again.  Pure."""
    plist, cwl, cml = dist.lists
    kl, swh = dist.k_list, sw - h
    todo = [ends]
    splits = 0
    whole = True
    while todo:
        a, fa, ta, ia, ua, b, fb, tb, ib, ub = todo.pop()
        if whole:
            whole = False
        elif b - a < 2 or _inner_bound(plist, cwl, kl, r, h, sw, a, fa, ta, ia, ua, b, fb, tb, ib, ub) > cut:
            continue
        if splits == MAX_SPLITS:
            return False
        splits += 1
        m = (a + b) >> 1
        tm, im, um, fm = _candidate(plist, cwl, cml, kl, r, h, sw, swh, m)
        if fm <= cut:
            return False
        todo.append((m, fm, tm, im, um, b, fb, tb, ib, ub))
        todo.append((a, fa, ta, ia, ua, m, fm, tm, im, um))
    return True
