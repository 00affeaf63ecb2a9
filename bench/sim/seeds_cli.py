"""The seed-set flags of ``kvtier bench simulate`` (``--seeds``, ``--jitter``, ``--jobs``) and their run.

``bench/cmd_simulate.py`` calls :func:`add_seed_flags` on its parser, :func:`seeds_from_args`
before any work (bad use fails fast) and :func:`run` instead of the one-node runner when
seeds were given.  Each seed is one draw of the workload: the ``--synth`` workload drawn with
that seed, or the trace file named by ``--trace`` with ``{seed}`` replaced by it (e.g. Mooncake
converted once per seed of its drawn waits).  Every policy runs on each draw on the same node;
the seeds run in worker processes (``--jobs``), each with fresh policies, so the result does
not depend on the number of jobs.  What is reported is
:func:`kvtier.bench.sim.seeds.summarize_seeds`.  With ``--jitter K`` the "seeds" are the runs
0..K of one draw (:mod:`kvtier.bench.sim.jitter`), and its ensemble summary is reported too.
Module top level stays cheap.
"""
from __future__ import annotations

import argparse
import os
from typing import Callable, Mapping, Sequence

from kvtier.util.args import pos_float, pos_int
from kvtier.util.cmd import CliError


def add_seed_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("seed set (one workload drawn with several seeds; docs/simulate.md)")
    g.add_argument("--seeds", metavar="SEEDS", default=None,
                   help="run every policy on the --synth workload drawn with each of these seeds (e.g. "
                        "0-19 or 0,3,7), or on each trace file --trace names with {seed} in its path "
                        "(e.g. mc_{seed}.jsonl), and report how each policy's metrics spread over them, "
                        "and in how many seeds breakeven's mean JCT is no worse than every baseline's, its "
                        "p99 stall no worse than every moving baseline's, and its JCT within 5%% of the "
                        "bound; instead of --seed")
    g.add_argument("--jitter", type=pos_int, default=None, metavar="K",
                   help="run every policy on the one draw (--synth with --seed, or a --trace file) and on K "
                        "copies of it with each tool wait lengthened by under --jitter-ms, and report the "
                        "spread of each policy's metrics (what one draw can resolve), the three tests on "
                        "the means, and breakeven's paired differences; instead of --seeds")
    g.add_argument("--jitter-ms", type=pos_float, default=None, metavar="MS",
                   help="with --jitter: the most a tool wait is lengthened, ms (default 1)")
    g.add_argument("--jobs", type=pos_int, default=None, metavar="N",
                   help="with --seeds or --jitter: runs at once, one process each (default: the CPUs, at "
                        "most one per run)")


def seeds_from_args(a: argparse.Namespace) -> tuple[int, ...]:
    """The --seeds list, or with --jitter K the runs 0..K (empty without either flag).  Raises
    CliError on bad use."""
    if a.jitter_ms is not None and a.jitter is None:
        raise CliError("--jitter-ms sets how far --jitter nudges the tool waits; it needs --jitter")
    if a.jitter is not None:
        return _jitter_runs(a)
    if a.seeds is None:
        if a.jobs is not None:
            raise CliError("--jobs runs seeds in parallel; it needs --seeds or --jitter")
        return ()
    from kvtier.bench.sim.seeds import parse_seeds
    if not a.synth and "{seed}" not in a.trace:
        raise CliError("--seeds needs one draw per seed: --synth N, or a --trace path with {seed} in it "
                       "(e.g. mc_{seed}.jsonl, written by kvtier bench trace mooncake --seed S)")
    _refuse_partial_runs(a, "--seeds runs one node at one link speed on whole draws of the workload",
                         ("--seed", a.seed != 0))
    try:
        return parse_seeds(a.seeds)
    except ValueError as exc:
        raise CliError(f"--seeds: {exc}") from None


def _refuse_partial_runs(a: argparse.Namespace, why: str, *more: tuple[str, bool]) -> None:
    """Raises CliError naming the first flag set that a seed set or an ensemble cannot honour
    (another link sweep, a cluster, part of the sessions, rescaled arrivals, or ``more``)."""
    for flag, bad in (("--sweep-link", a.sweep_link is not None), ("--nodes", a.nodes is not None),
                      ("--max-sessions", a.max_sessions is not None), ("--time-scale", a.time_scale != 1.0),
                      *more):
        if bad:
            raise CliError(f"{why}; drop {flag}")


def _jitter_runs(a: argparse.Namespace) -> tuple[int, ...]:
    from kvtier.bench.sim.jitter import MAX_RUNS
    if a.seeds is not None:
        raise CliError("--jitter nudges one draw, --seeds runs several draws: pick one")
    if a.trace is not None and "{seed}" in a.trace:
        raise CliError("--jitter runs one trace file; drop {seed} from --trace (or use --seeds)")
    _refuse_partial_runs(a, "--jitter runs one node at one link speed on the whole draw")
    if a.jitter >= MAX_RUNS:
        raise CliError(f"--jitter: at most {MAX_RUNS - 1} nudged copies")
    return tuple(range(a.jitter + 1))


def _scalars(metrics: Mapping) -> dict:
    return {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def draw(source: tuple, seed: int) -> list:
    """The sessions of one draw: ``source`` is ("synth", sessions, rate), ("trace", path
    pattern with ``{seed}``), or ("jitter", inner source, its seed, jitter s), where ``seed`` is
    the ensemble's run (:func:`kvtier.bench.sim.jitter.jitter_waits`).  Raises TraceError or
    OSError for a bad or missing trace file."""
    if source[0] == "jitter":
        from kvtier.bench.sim.jitter import jitter_waits
        return jitter_waits(draw(source[1], source[2]), seed, source[3])
    if source[0] == "synth":
        from kvtier.bench.sim.synth import SynthConfig, synthesize
        return synthesize(SynthConfig(sessions=source[1], rate_per_s=source[2], seed=seed))
    from kvtier.bench.sim.trace import TraceError, read_trace
    path = source[1].replace("{seed}", str(seed))
    try:
        return list(read_trace(path).sessions)
    except TraceError as exc:
        raise TraceError(f"{path}: {exc}") from None        # which seed's file, not the pattern


def one_seed(job: tuple) -> tuple[int, dict]:
    """Worker: (seed, source, node, names, options) -> (seed, policy -> scalar metrics).
    Raises what :func:`draw` and the simulator raise (TraceError, OSError, SimulationStalled,
    ValueError)."""
    seed, source, node, names, options = job
    from kvtier.bench.sim.runner import run_policies
    sessions = draw(source, seed)
    if not sessions:
        raise ValueError(f"seed {seed}: the draw holds no complete session")
    res = run_policies(sessions, node, names, options=options)
    return seed, {name: _scalars(r.metrics) for name, r in res.items()}


def run_seed_set(jobs: Sequence[tuple], workers: int,
                 on_done: Callable[[int], None] | None = None) -> dict[int, dict]:
    """Run :func:`one_seed` over ``jobs``, ``workers`` at a time (1: in this process).
    Returns seed -> policy -> metrics in the jobs' order.  Raises what a job raises."""
    out: dict[int, dict] = {}

    def collect(results) -> None:
        for seed, m in results:
            out[seed] = m
            if on_done is not None:
                on_done(seed)

    if workers <= 1 or len(jobs) <= 1:
        collect(map(one_seed, jobs))
    else:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor, as_completed
        with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn")) as ex:
            collect(f.result() for f in as_completed([ex.submit(one_seed, job) for job in jobs]))
    return {job[0]: out[job[0]] for job in jobs}


def run(a: argparse.Namespace, node, names: Sequence[str], seeds: Sequence[int], options: Mapping,
        node_json: dict) -> dict:
    """Run the seed set (or, with --jitter, the ensemble) the flags ask for and return the
    JSON-ready document (``"seeds"``: the summary, ``"per_seed"``: every policy's scalar metrics
    per seed; for an ensemble both keyed by run, 0 the draw itself, and ``"jitter"``: its
    :func:`~kvtier.bench.sim.jitter.summarize_ensemble`).  Raises CliError when a run stalls or
    a trace file is missing or malformed."""
    from kvtier.bench.sim.seeds import summarize_seeds
    from kvtier.bench.sim.simulator import SimulationStalled
    from kvtier.bench.sim.trace import TraceError
    workers = a.jobs if a.jobs is not None else max(1, min(os.cpu_count() or 1, len(seeds)))
    source = ("synth", a.synth, a.rate) if a.synth else ("trace", a.trace)
    jitter_ms = None
    if a.jitter is not None:
        from kvtier.bench.sim.jitter import DEFAULT_JITTER_MS
        jitter_ms = DEFAULT_JITTER_MS if a.jitter_ms is None else a.jitter_ms
        source = ("jitter", source, a.seed, jitter_ms / 1000.0)
    jobs = [(s, source, node, tuple(names), dict(options)) for s in seeds]
    from kvtier.util.console import make_console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    con = make_console(stderr=True)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=con, transient=True, disable=not con.is_terminal) as prog:
        what = "runs" if jitter_ms is not None else "seeds"
        task = prog.add_task(f"{what} ({workers} at a time)", total=len(seeds))
        try:
            per_seed = run_seed_set(jobs, workers, on_done=lambda s: prog.advance(task))
        except SimulationStalled as exc:
            raise CliError(f"simulation stalled: {exc}") from None
        except TraceError as exc:
            raise CliError(str(exc)) from None
        except OSError as exc:
            raise CliError(f"cannot read a trace of {a.trace!r}: {exc.strerror or exc} ({exc.filename})") from None
        except ValueError as exc:
            raise CliError(str(exc)) from None
    which = f"seeds {a.seeds}"
    if jitter_ms is not None:
        which = (f"{'seed ' + str(a.seed) + ', ' if a.synth else ''}the draw and {a.jitter} copies with tool "
                 f"waits lengthened by under {jitter_ms:g} ms")
    if a.synth:
        label = f"synthetic {a.synth} sessions @ {a.rate:g}/s, {which}"
        trace = {"source": label, "sessions": a.synth, "rate_per_s": a.rate}
    else:
        trace = {"source": f"{a.trace}, {which}"}
    doc = {"trace": trace,
           "node": node_json, "seeds": summarize_seeds(per_seed),
           "per_seed": {str(s): m for s, m in per_seed.items()}, "plots": []}
    if jitter_ms is not None:
        from kvtier.bench.sim.jitter import summarize_ensemble
        doc["jitter"] = {"copies": a.jitter, "jitter_ms": jitter_ms, "seed": a.seed if a.synth else None,
                         "ensemble": summarize_ensemble(per_seed)}
    return doc


def print_report(doc: dict) -> None:
    """The seed set as a table per policy and the focus policy's tests, on stdout."""
    from kvtier.util.console import make_console
    from rich.table import Table
    con = make_console()
    sd = doc["seeds"]
    n = len(sd["seeds"])
    unit = "run" if "jitter" in doc else "seed"
    con.print(f"[bold]{doc['trace']['source']}[/bold] ({n} {unit}s), link {doc['node']['link_gbps']:g} GB/s")
    t = Table(title=f"over the {unit}s: mean JCT s (mean, min-max), p99 resume stall s (median, min-max), "
                    f"mean JCT / that {unit}'s bound (median, max)")
    for c in ("policy", "mean JCT s", "p99 stall s", "JCT / bound"):
        t.add_column(c, justify="left" if c == "policy" else "right")
    for name, p in sd["policies"].items():
        j, s, r = p["jct_mean_s"], p["resume_stall_p99_s"], p["jct_vs_bound"]
        t.add_row(name, f"{j['mean']:.3f} ({j['min']:.3f}-{j['max']:.3f})",
                  f"{s['median']:.4f} ({s['min']:.4f}-{s['max']:.4f})", f"{r['median']:.5f}x ({r['max']:.5f}x)")
    con.print(t)
    tests = sd.get("tests")
    if tests is None:
        con.print(f"({sd['focus']} or every baseline is missing from --policies: no tests)", style="dim")
    else:
        met, k = tests["met"], tests["n"]
        g = tests["jct_gap"]
        con.print(f"{sd['focus']}: mean JCT no worse than every baseline in {met['jct']}/{k} {unit}s, p99 stall no "
                  f"worse than every moving baseline in {met['p99']}/{k}, within 5% of the bound in "
                  f"{met['bound']}/{k}; all three in {met['all']}/{k}", highlight=False)
        line = (f"its mean JCT against the best baseline's: median {g['median']:+.4%}, "
                f"range {g['min']:+.4%} to {g['max']:+.4%}")
        pr = tests["p99_ratio"]
        if pr is not None:
            line += f"; p99 stall over the best moving baseline's: median {pr['median']:.3f}x"
        con.print(line, highlight=False)
        names = {"jct": "mean JCT", "p99": "p99 stall", "bound": "bound"}
        con.print(f"per {unit}: " + "; ".join(
            f"{s} " + ("all three met" if v["all"] else
                       "missed " + ", ".join(n for x, n in names.items() if not v[x]))
            for s, v in tests["per_seed"].items()), highlight=False)
    if "jitter" in doc:
        _print_ensemble(con, doc["jitter"]["ensemble"])
    for p in doc["plots"]:
        con.print(f"plot: {p}")


def _print_ensemble(con, ens: dict | None) -> None:
    """The ensemble's means, the three tests on them and the paired calls
    (:func:`kvtier.bench.sim.jitter.summarize_ensemble`)."""
    from rich.table import Table
    if ens is None:
        return
    from kvtier.bench.sim.jitter import RESOLVED_SE
    t = Table(title=f"over the {ens['runs']} runs: mean and standard deviation (what one draw resolves)")
    for c in ("policy", "mean JCT s", "sd", "p99 stall s", "sd"):
        t.add_column(c, justify="left" if c == "policy" else "right")
    for name, p in ens["policies"].items():
        j, s = p["jct_mean_s"], p["resume_stall_p99_s"]
        t.add_row(name, f"{j['mean']:.4f}", f"{j['sd']:.4f} ({j['sd'] / j['mean']:.4%})" if j["mean"] else "0",
                  f"{s['mean']:.4f}", f"{s['sd']:.4f}")
    con.print(t)
    ts, f = ens["tests"], ens["focus"]
    yn = {True: "yes", False: "NO"}
    con.print(f"{f} on the means: JCT no worse than every baseline: {yn[ts['jct']]} (best {ts['best_jct']}, "
              f"{ts['jct_gap']:+.4%}); p99 no worse than every moving baseline: {yn[ts['p99']]}"
              f"{'' if ts['best_p99'] is None else ' (best ' + ts['best_p99'] + ')'}; within 5% of the bound: "
              f"{yn[ts['bound']]} ({ts['vs_bound']:.5f}x)", highlight=False)
    for b, p in ens["paired"].items():
        parts = [f"{k} {v['mean']:+.4f} ± {v['se']:.4f} s ({v['call']}, lower in {v['lower_in']}/{ens['runs']})"
                 for k, v in p.items()]
        con.print(f"  {f} - {b}: " + "; ".join(parts), highlight=False)
    losses = ens["resolved_losses"]
    con.print(f"resolved losses (paired mean past {RESOLVED_SE:g} standard errors): "
              + (", ".join(losses) if losses else "none"), highlight=False)
