"""Ensembles of live runs: mean +- standard error per configuration, and each
configuration's paired difference with a reference (``breakeven``) over the
repeats (repeat r of every configuration ran in the same interleaved round,
so the machine's slow and fast moments fall on both sides of a pair).

A difference is *resolved* when its mean is more than two standard errors
from zero.  Pure functions of :class:`~kvtier.bench.live.runs.RunSummary` lists.
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

from kvtier.bench.live.runs import RunSummary

METRICS = {"resume_ttft_p50_s": lambda r: r.p50, "resume_ttft_p99_s": lambda r: r.p99,
           "jct_mean_s": lambda r: r.jct_mean}
LOWER_IS_BETTER = tuple(METRICS)
JCT_PARTS = {"engine_busy_s": lambda r: r.engine_busy_s, "queue_wait_s": lambda r: r.queue_wait_s}
"""What a run's JCT is made of besides the tool waits (:mod:`~kvtier.bench.live.runs`)."""
COMPARED = {**METRICS, **JCT_PARTS}
"""Every number a row gives with its standard error and a pair compares."""
TURN_COST = {"resume_kvtier_cpu_s": lambda r: r.resume_kvtier_cpu_s,
             "resume_engine_waits": lambda r: r.resume_engine_waits}
"""What kvtier's threads cost a resume (:mod:`~kvtier.bench.live.thread_cpu`): in a
row and a pair only where every run measured it (not a server's runs)."""


def mean_se(xs: Sequence[float]) -> tuple[float, float]:
    """Mean and its standard error (sample sd / sqrt(n)); SE is NaN below two values."""
    xs = [x for x in xs if not math.isnan(x)]
    if not xs:
        return math.nan, math.nan
    m = sum(xs) / len(xs)
    if len(xs) < 2:
        return m, math.nan
    var = sum((x - m) ** 2 for x in xs) / (len(xs) - 1)
    return m, math.sqrt(var / len(xs))


def config_row(runs: Sequence[RunSummary], reference_outputs: Mapping[int, Mapping] | None) -> dict:
    """One configuration's JSON row: every metric's mean and ``_se``, counts
    averaged over repeats, and ``outputs_equal`` against the reference outputs
    of the same repeat (None when there is no reference)."""
    row: dict = {"repeats": len(runs)}
    for k, f in (*COMPARED.items(), *_measured(runs)):
        row[k], row[k + "_se"] = mean_se([f(r) for r in runs])
    for k in ("resumes", "misses", "recomputed_tokens"):
        row[k], row[k + "_se"] = mean_se([float(getattr(r, k)) for r in runs])
    tiers = sorted({t for r in runs for t in r.served_chunks})
    row["served_chunks_by_tier"] = {t: mean_se([float(r.served_chunks.get(t, 0)) for r in runs])[0] for t in tiers}
    tiers = sorted({t for r in runs for t in r.stored_chunks})
    row["stored_chunks_by_tier"] = {t: mean_se([float(r.stored_chunks.get(t, 0)) for r in runs])[0] for t in tiers}
    row["errors"] = {k: sum(int(r.notes.get(k, 0)) for r in runs)
                     for k in ("load_failures", "contained_errors", "hint_rejections")}
    if any("decisions" in r.notes for r in runs):
        row["decisions"] = {a: sum(r.notes.get("decisions", {}).get(a, 0) for r in runs) / len(runs)
                            for a in sorted({a for r in runs for a in r.notes.get("decisions", {})})}
        for k in ("demoted_blocks", "dropped_blocks", "skipped_chunks", "staged_blocks", "hold_resumes",
                  "hold_pressure_releases", "read_skips"):
            row[k] = mean_se([float(r.notes.get(k, 0)) for r in runs])[0]
    swi = {r.notes["switch_interval_ms"] for r in runs if "switch_interval_ms" in r.notes}
    if swi:   # the interpreter's thread switch interval the runs had (kvtier's plugin lowers it)
        row["switch_interval_ms"] = max(swi)
    priced = next((r.notes["priced"] for r in runs if r.notes.get("priced")), None)
    if priced is not None:
        row["priced"] = priced
    if reference_outputs is None:
        row["outputs_equal"] = None
    else:
        row["outputs_equal"] = all(r.outputs == reference_outputs.get(r.repeat) for r in runs)
    return row


def paired(runs: Sequence[RunSummary], ref: Sequence[RunSummary]) -> dict:
    """Per metric (and JCT part): mean and SE of (this - reference) over repeats
    present in both, and ``resolved``: -1 (this is lower, i.e. better), +1 (higher), 0 (tie)."""
    by_rep = {r.repeat: r for r in ref}
    out = {}
    for k, f in (*COMPARED.items(), *_measured([*runs, *ref])):
        d = [f(r) - f(by_rep[r.repeat]) for r in runs if r.repeat in by_rep]
        m, se = mean_se(d)
        resolved = 0 if (math.isnan(se) or abs(m) <= 2 * se) else (1 if m > 0 else -1)
        out[k] = {"mean": m, "se": se, "resolved": resolved}
    return out


def _measured(runs: Sequence[RunSummary]) -> list:
    """The :data:`TURN_COST` measures every run in ``runs`` has."""
    return [(k, f) for k, f in TURN_COST.items() if runs and all(f(r) is not None for r in runs)]
