"""``kvtier bench predictor``: forecast quality on held-out real tool durations,
beside simple baselines, plus the decide + forecast micro-benchmark.

Quality: see :mod:`kvtier.bench.predictor_eval` (prequential scoring on the real
per-call durations under ``--traces DIR`` (default: the sample shipped in the package); TraceLab aggregates are only
the prior).  Models: ``kvtier`` (ToolWaitPredictor), ``running_mean``
(Continuum's predictor), ``global_median``, ``global_quantiles``.
Metrics: mean pinball loss over p10/p50/p90 in seconds (and on ln seconds),
coverage of the [p10, p90] interval (a calibrated forecast covers ~80%).

``--conversation``: instead, per-tool forecasts learned from replayed chat
traffic against the single unhinted class (:mod:`kvtier.bench.conversation_eval`,
docs/conversation-hints.md); no decide benchmark.

Speed: :mod:`kvtier.bench.bench_decide` (``--trajectories`` paused at once, p99 of
decide including the forecast; target < 100 us).  ``--skip-decide`` leaves
it out.
"""
from __future__ import annotations

import argparse

from kvtier.util.args import int_like, typed
from kvtier.util.cmd import CliError, CommandGroups, add_json_flag, emit_json


MAX_COUNT = 10_000_000  # more paused trajectories or timed pauses than this is a typo (memory, hours)


_pos_int = typed(int_like, lambda v: 1 <= v <= MAX_COUNT, f"an integer in 1..{MAX_COUNT:,}")


def _ratio(a: float, b: float) -> float | None:
    """a / b, or None when the baseline's loss is 0 (it predicted every call exactly)."""
    return a / b if b else None


def register(groups: CommandGroups) -> None:
    p = groups.bench.add_parser("predictor", help="tool-wait forecast quality on held-out real durations; "
                                                  "decide + forecast latency")
    p.add_argument("--traces", metavar="DIR", default=None,
                   help="directory of per-call tool durations laid out as the public traces "
                        "(continuum/, swe_agent/, tracelab/); default: $KVTIER_TRACES, else the "
                        "TraceLab example shipped with kvtier")
    p.add_argument("--trajectories", type=_pos_int, default=10_000,
                   help="paused trajectories in the decide benchmark (default 10000)")
    p.add_argument("--pauses", type=_pos_int, default=30_000, help="timed pauses (default 30000)")
    p.add_argument("--skip-decide", action="store_true", help="only score forecast quality")
    p.add_argument("--conversation", action="store_true",
                   help="score tool names learned from replayed chat traffic (the hint a router "
                        "forecasts) against the unhinted class and the true tool; no decide benchmark")
    p.add_argument("--seed", type=int, default=0, help="seed of the decide benchmark (default 0)")
    add_json_flag(p)
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from kvtier.bench import predictor_eval as pe

    from kvtier.samples import traces_input
    try:
        found = traces_input(args.traces)
    except FileNotFoundError as exc:
        raise CliError(f"{exc} (pass --traces DIR)") from None
    traces = found.path
    if found.is_sample:
        import sys
        print("note: read the TraceLab example shipped with kvtier (19 calls); for the full held-out sets "
              "pass --traces DIR (see kvtier/data/traces/NOTICE.md for the public sources)", file=sys.stderr)
    if args.conversation:
        return _run_conversation(traces, args.json)
    datasets = pe.load_datasets(traces)
    quality = pe.evaluate(datasets)
    out = {
        "traces": str(traces),
        "protocol": "prequential: per source, in file order, forecast then score then observe; "
                    "fresh predictors per source; TraceLab aggregates used only as the cold-start prior",
        "quantiles": list(pe.QUANTILES),
        **quality,
    }
    pooled = quality["pooled"]
    out["summary"] = {
        "kvtier_coverage_p10_p90": pooled["kvtier"]["coverage_p10_p90"],
        "kvtier_pinball_loss_s": pooled["kvtier"]["pinball_loss_s"],
        "running_mean_pinball_loss_s": pooled["running_mean"]["pinball_loss_s"],
        "pinball_vs_running_mean": _ratio(pooled["kvtier"]["pinball_loss_s"], pooled["running_mean"]["pinball_loss_s"]),
        "pinball_vs_global_median": _ratio(pooled["kvtier"]["pinball_loss_s"],
                                           pooled["global_median"]["pinball_loss_s"]),
    }
    if not args.skip_decide:
        from kvtier.bench import bench_decide
        with bench_decide.DecideProgress(args.pauses) as bar:
            out["decide"] = bench_decide.run(args.trajectories, args.pauses, args.seed, progress=bar)
    if args.json:
        emit_json(out)
    else:
        _print_tables(out)
    return 0


def _run_conversation(traces, as_json: bool) -> int:
    from kvtier.bench import conversation_eval as ce
    from kvtier.bench.predictor_eval import QUANTILES
    try:
        sources = ce.load_sources(traces)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    out = {"traces": str(traces),
           "protocol": "each source's trajectories replayed as OpenAI chat traffic through ConversationHints, "
                       "one after another in file order; each pause scored before its wait is learned; "
                       "fresh predictors per source",
           "quantiles": list(QUANTILES), **ce.evaluate(sources)}
    if as_json:
        emit_json(out)
    else:
        _print_conversation(out)
    return 0


def _print_conversation(out: dict) -> None:
    from kvtier.util.console import make_console as Console
    from rich.markup import escape
    from rich.table import Table

    con = Console()
    for name, d in [*out["sources"].items(), ("pooled", out["pooled"])]:
        acc = d["forecast_accuracy"]
        t = Table(title=f"{name}: {d['pauses']} pauses, hint forecast right "
                        f"{'-' if acc is None else f'{acc:.0%}'}")
        for col in ("model", "pinball (s)", "pinball (ln s)", escape("[p10,p90] coverage"),
                    "- unhinted (s)", "- unhinted (ln s)"):
            t.add_column(col, justify="right" if col != "model" else "left")
        for m, s in d["models"].items():
            pair = d["paired"].get(f"{m}-unhinted")
            diff = [("-" if pair is None or pair[k]["mean"] is None
                     else f"{pair[k]['mean']:+.4f} ± {pair[k]['se']:.4f}") for k in ("pinball_s", "pinball_log")]
            t.add_row(m, f"{s['pinball_loss_s']:.4f}", f"{s['pinball_loss_log']:.3f}",
                      f"{s['coverage_p10_p90']:.0%}", *diff)
        con.print(t)


def _print_tables(out: dict) -> None:
    from kvtier.util.console import make_console as Console  # width rules: pipes not cut
    from rich.markup import escape
    from rich.table import Table

    con = Console()
    for name, ds in [*out["datasets"].items(), ("pooled", {"models": out["pooled"], "calls": None, "path": ""})]:
        n = ds["calls"] if ds["calls"] is not None else next(iter(ds["models"].values()))["n"]
        t = Table(title=f"{name}: {n} held-out calls {ds['path']}")
        for col in ("model", "pinball (s)", "pinball (ln s)", escape("[p10,p90] coverage"), "|err| p50 (s)"):
            t.add_column(col, justify="right" if col != "model" else "left")
        for m, s in ds["models"].items():
            t.add_row(m, f"{s['pinball_loss_s']:.4f}", f"{s['pinball_loss_log']:.3f}",
                      f"{s['coverage_p10_p90']:.0%}", f"{s['mae_p50_s']:.3f}")
        con.print(t)
    s = out["summary"]
    def x(r: float | None) -> str:
        return "-" if r is None else f"{r:.2f}"
    con.print(f"kvtier pinball = {x(s['pinball_vs_running_mean'])} x running mean, "
              f"{x(s['pinball_vs_global_median'])} x global median; "
              + escape(f"[p10,p90] coverage {s['kvtier_coverage_p10_p90']:.0%} (calibrated: ~80%)"))
    d = out.get("decide")
    if d:
        t = Table(title=f"decide + forecast, {d['trajectories']:,} paused trajectories, {d['pauses']:,} pauses (us)")
        for col in ("what", "p50", "p90", "p99"):
            t.add_column(col, justify="right" if col != "what" else "left")
        t.add_row("decide (wall)", *(f"{d['decide_us'][k]:.1f}" for k in ("p50", "p90", "p99")))
        t.add_row("decide (thread CPU)", *(f"{d['decide_cpu_us'][k]:.1f}" for k in ("p50", "p90", "p99")))
        t.add_row("floor: retain decide", f"{d['floor_retain_decide_us']['p50']:.1f}", "",
                  f"{d['floor_retain_decide_us']['p99']:.1f}")
        t.add_row("observe", f"{d['observe_us']['p50']:.1f}", "", f"{d['observe_us']['p99']:.1f}")
        con.print(t)
        con.print(f"target p99 < {d['target_p99_us']:.0f} us: "
                  f"{'met' if d['meets_target'] else 'NOT met'} (wall), "
                  f"{'met' if d['meets_target_cpu_time'] else 'NOT met'} (CPU time)")
