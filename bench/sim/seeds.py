"""A seed set: one workload drawn with several seeds, every policy on each draw.

One draw of a workload is one sample.  Two policies a hundredth of a percent apart in mean
JCT on one seed can swap places on the next: a small change anywhere (a lease a few
milliseconds longer, one victim chosen differently) reorders every later event of the run.
``kvtier bench simulate --synth N --rate R --seeds 0-19`` (or ``--trace 'mc_{seed}.jsonl'
--seeds 0-9``, one trace file per seed) runs the policies on each draw and reports, per policy, how its metrics spread over the seeds, and for the focus policy
(``breakeven``) how many seeds meet each of the three tests (jct, p99, bound):

* **jct**: its mean JCT is no worse than every baseline's (``BASELINES`` present in the run);
* **p99**: its p99 resume stall is no worse than every moving baseline's (``MOVING``);
* **bound**: its mean JCT is within ``BOUND_SLACK`` of the bound, the best mean JCT any
  simulated policy reached on that seed (:func:`kvtier.bench.sim.bound.envelope`).

Pure functions over plain metric mappings; the runs themselves are the caller's
(:mod:`kvtier.bench.sim.seeds_cli`).
"""
from __future__ import annotations

import statistics
from typing import Mapping, Sequence

from kvtier.bench.sim.bound import envelope

MOVING: tuple[str, ...] = ("offload_host", "lru", "ttl", "min_waste", "eager", "point")
BASELINES: tuple[str, ...] = MOVING + ("retain", "recompute")
BOUND_SLACK = 1.05
REL_TOL = 1e-12     # float rounding: two runs of equal decisions can differ in the last digits of a mean
FOCUS = "breakeven"
MAX_SEEDS = 1000
KEPT_METRICS = ("jct_mean_s", "jct_p99_s", "resume_stall_mean_s", "resume_stall_p99_s",
                "throughput_tokens_per_s", "admission_wait_mean_s")


def parse_seeds(text: str) -> tuple[int, ...]:
    """``"0-19"``, ``"0,3,7"`` or ``"0-4,9"`` -> the seeds in the order given.

    Raises ValueError for an empty list, a malformed part, a negative seed, a range that
    runs backwards, a repeated seed, or more than ``MAX_SEEDS`` seeds."""
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        lo, dash, hi = part.partition("-")
        try:
            a = int(lo)
            b = int(hi) if dash else a
        except ValueError:
            raise ValueError(f"{part!r} is not a seed or a range of seeds (e.g. 0-19)") from None
        if a < 0:
            raise ValueError(f"seed {a} is negative")
        if b < a:
            raise ValueError(f"range {part!r} runs backwards")
        if len(out) + (b - a + 1) > MAX_SEEDS:
            raise ValueError(f"more than {MAX_SEEDS} seeds")
        out.extend(range(a, b + 1))
    if not out:
        raise ValueError("no seed given")
    if len(set(out)) != len(out):
        raise ValueError("a seed repeats")
    return tuple(out)


def verdict(metrics: Mapping[str, Mapping[str, float]], focus: str = FOCUS,
            bound: float | None = None) -> dict | None:
    """The three tests for ``focus`` on one run (policy name -> its metrics), or None when the
    run lacks ``focus`` or every baseline.  Ties count as met, within ``REL_TOL`` (a mean summed
    in another order differs in its last bits).  ``jct_gap`` is the focus
    policy's mean JCT over the best baseline's, minus 1 (negative: it leads); ``p99_ratio``
    its p99 resume stall over the best moving baseline's (None without a moving baseline, or
    when that stall is 0).  ``bound`` is the mean JCT the bound test measures against (default:
    the run's envelope, the best any policy in ``metrics`` reached).  Pure."""
    own = metrics.get(focus)
    base = [n for n in BASELINES if n in metrics]
    if own is None or not base:
        return None
    best_jct = min(base, key=lambda n: metrics[n]["jct_mean_s"])
    moving = [n for n in MOVING if n in metrics]
    best_p99 = min(moving, key=lambda n: metrics[n]["resume_stall_p99_s"]) if moving else None
    if bound is None:
        bound = envelope(metrics)["jct_mean_s"]
    j, b = own["jct_mean_s"], metrics[best_jct]["jct_mean_s"]
    s = own["resume_stall_p99_s"]
    sb = metrics[best_p99]["resume_stall_p99_s"] if best_p99 else None
    out = {"jct": j <= b * (1.0 + REL_TOL), "p99": True if sb is None else s <= sb * (1.0 + REL_TOL),
           "bound": j <= BOUND_SLACK * bound,
           "best_jct": best_jct, "best_p99": best_p99,
           "jct_gap": j / b - 1.0 if b > 0 else 0.0,
           "p99_ratio": s / sb if sb else None,
           "vs_bound": j / bound if bound > 0 else 1.0}
    out["all"] = out["jct"] and out["p99"] and out["bound"]
    return out


def spread(xs: Sequence[float]) -> dict[str, float]:
    """mean, median, min and max of a non-empty sequence.  Pure."""
    return {"mean": statistics.fmean(xs), "median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def seed_bounds(per_seed: Mapping) -> dict:
    """Each seed's bound: the best mean JCT any policy reached on it (seed -> seconds).  Pure."""
    return {s: envelope(m)["jct_mean_s"] for s, m in per_seed.items()}


def summarize_seeds(per_seed: Mapping[int, Mapping[str, Mapping[str, float]]], focus: str = FOCUS) -> dict:
    """The JSON-ready summary of a seed set (seed -> policy -> metrics): every policy's
    spread of ``KEPT_METRICS`` and of its mean JCT over each seed's bound, and the focus
    policy's verdict per seed with how many seeds meet each test.  Pure."""
    seeds = list(per_seed)
    names = list(per_seed[seeds[0]]) if seeds else []
    bounds = seed_bounds(per_seed)
    pols: dict[str, dict] = {}
    for n in names:
        pols[n] = {k: spread([per_seed[s][n][k] for s in seeds]) for k in KEPT_METRICS
                   if all(k in per_seed[s][n] for s in seeds)}
        pols[n]["jct_vs_bound"] = spread([per_seed[s][n]["jct_mean_s"] / bounds[s] for s in seeds])
    verdicts = {s: verdict(per_seed[s], focus) for s in seeds}
    doc: dict = {"seeds": seeds, "policies": pols, "focus": focus}
    if seeds and all(v is not None for v in verdicts.values()):
        vs = [verdicts[s] for s in seeds]
        doc["tests"] = {
            "per_seed": {str(s): verdicts[s] for s in seeds},
            "met": {k: sum(1 for v in vs if v[k]) for k in ("jct", "p99", "bound", "all")},
            "n": len(vs),
            "jct_gap": spread([v["jct_gap"] for v in vs]),
            "p99_ratio": spread([v["p99_ratio"] for v in vs if v["p99_ratio"] is not None])
            if any(v["p99_ratio"] is not None for v in vs) else None,
        }
    return doc
