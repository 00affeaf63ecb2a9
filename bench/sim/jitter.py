"""A jitter ensemble: one draw of a workload, run again with its tool waits nudged.

The simulator is deterministic but not smooth.  Lengthening every tool wait of synthetic
0.6/s at 25 GB/s by a random amount under one microsecond moves lru's mean JCT by 0.07%
(standard deviation over the draw and five nudged copies), more than the gaps the one-draw tables rank
policies by: a nudge reorders two events somewhere, and every later batch, eviction and link
queue differs.  So one draw's difference between two policies smaller than that spread says
nothing about which is better on that workload.

``kvtier bench simulate --synth 2000 --rate 0.6 --jitter 15`` runs the draw itself (run 0) and
15 nudged copies of it (run k: each tool wait lengthened by a uniform draw in
[0, ``--jitter-ms``), the draws seeded by k), every policy on each.  A nudge under a
millisecond is far below anything a forecast resolves (tool waits run from tenths of a second
to hours), so it favours no policy; what it measures is the resolution of a one-draw
comparison.  :func:`summarize_ensemble` reports, per policy, the mean and spread of its mean
JCT and p99 resume stall over the runs, the three tests (jct, p99, bound) on the ensemble's means, and
the focus policy's paired difference to each baseline (run by run, the same nudge for both),
called a lead or a loss only when it is more than ``RESOLVED_SE`` standard errors from 0.

Pure functions; the runs are :mod:`kvtier.bench.sim.seeds_cli`'s.
"""
from __future__ import annotations

import math
import random
import statistics
from dataclasses import replace
from typing import Mapping, Sequence

from kvtier.bench.sim.seeds import BASELINES, FOCUS, MOVING, REL_TOL, seed_bounds, spread, verdict
from kvtier.bench.sim.trace import Session

DEFAULT_JITTER_MS = 1.0
MAX_RUNS = 1000
RESOLVED_SE = 2.0          # a paired difference is a lead or a loss past this many standard errors
_METRICS = ("jct_mean_s", "resume_stall_p99_s")


def jitter_waits(sessions: Sequence[Session], run: int, jitter_s: float) -> list[Session]:
    """Run ``run`` of the ensemble: ``sessions`` themselves for run 0, else a copy with every
    tool wait lengthened by a uniform draw in [0, ``jitter_s``) (``random.Random(run)``, in the
    sessions' order).  Arrivals, tokens and rounds are unchanged.  Pure.

    Raises ValueError for a negative run or a negative or non-finite ``jitter_s``."""
    if run < 0:
        raise ValueError(f"run must be >= 0, got {run}")
    if not (math.isfinite(jitter_s) and jitter_s >= 0.0):
        raise ValueError(f"the jitter must be a finite number of seconds >= 0, got {jitter_s!r}")
    if run == 0:
        return list(sessions)
    rng = random.Random(run)
    out = []
    for s in sessions:
        rounds = tuple(r if r.tool_wait_s is None else replace(r, tool_wait_s=r.tool_wait_s + rng.uniform(0.0, jitter_s))
                       for r in s.rounds)
        out.append(replace(s, rounds=rounds))
    return out


def _stats(xs: Sequence[float]) -> dict[str, float]:
    """:func:`~kvtier.bench.sim.seeds.spread` with the standard deviation and the mean's standard error."""
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return {**spread(xs), "sd": sd, "se": sd / math.sqrt(len(xs))}


def _paired(a: Sequence[float], b: Sequence[float]) -> dict:
    """``a`` minus ``b`` run by run: its mean, standard error, runs where ``a`` is lower, and
    whether that is a lead ("leads": lower by more than RESOLVED_SE standard errors, and more
    than float rounding), a loss ("trails") or neither ("tie")."""
    d = _stats([x - y for x, y in zip(a, b)])
    m, se = d["mean"], d["se"]
    tol = RESOLVED_SE * se + REL_TOL * statistics.fmean(abs(x) + abs(y) for x, y in zip(a, b))
    call = "tie" if abs(m) <= tol else ("leads" if m < 0 else "trails")
    return {"mean": m, "se": se, "lower_in": sum(1 for x, y in zip(a, b) if x < y), "call": call}


def summarize_ensemble(per_run: Mapping[int, Mapping[str, Mapping[str, float]]], focus: str = FOCUS) -> dict | None:
    """The JSON-ready summary of an ensemble (run -> policy -> metrics), or None when the runs
    lack ``focus`` or every baseline (see the module docstring).  ``tests`` are the three tests
    (:mod:`~kvtier.bench.sim.seeds`) on the means over the runs (the bound: the mean over runs of each run's best mean JCT);
    ``paired`` holds, per baseline, the focus policy's JCT difference (and, for a moving
    baseline, its p99 stall difference) with their calls.  Pure."""
    runs = list(per_run)
    if not runs:
        return None
    names = [n for n in per_run[runs[0]] if all(n in per_run[r] for r in runs)]
    series = {n: {k: [per_run[r][n][k] for r in runs] for k in _METRICS} for n in names}
    means = {n: {k: statistics.fmean(v) for k, v in series[n].items()} for n in names}
    bound = statistics.fmean(seed_bounds(per_run).values())
    tests = verdict(means, focus, bound=bound)
    if tests is None:
        return None
    paired = {}
    for b in (n for n in BASELINES if n in series):
        paired[b] = {"jct": _paired(series[focus]["jct_mean_s"], series[b]["jct_mean_s"])}
        if b in MOVING:
            paired[b]["p99"] = _paired(series[focus]["resume_stall_p99_s"], series[b]["resume_stall_p99_s"])
    resolved_loss = sorted({f"{b} {k}" for b, p in paired.items() for k, v in p.items() if v["call"] == "trails"})
    return {"runs": len(runs), "focus": focus,
            "policies": {n: {k: _stats(v) for k, v in series[n].items()} for n in names},
            "bound_jct_mean_s": bound, "tests": tests, "paired": paired, "resolved_losses": resolved_loss}

