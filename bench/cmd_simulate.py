"""``kvtier bench simulate`` and ``kvtier bench trace synth|mooncake|tracelab|stats``.

simulate replays an agent trace (JSON Lines, see bench/sim/trace.py) through
every pause policy on a model of one serving node and prints, per policy,
the DESIGN.md metrics.  Defaults model the reference texts' 70B GQA model on
their eight-accelerator node; every node parameter has a flag.  The trace
tools write traces: a synthetic agent workload, or conversions of the
public Mooncake and TraceLab traces (``--input FILE``; by default the small samples
shipped in the package, see :mod:`kvtier.samples`).

Module top level stays cheap; the simulator, policies and matplotlib are
imported inside the handlers.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from kvtier.util.args import add_rate_flag, ensure_dir, nonneg_float, nonneg_int, pos_float, pos_int, prob, share, typed
from kvtier.util.cmd import CliError, CommandGroups, add_json_flag, emit_json
from kvtier.util.preset_args import add_model_flag, add_node_flag




def register(groups: CommandGroups) -> None:
    p = groups.bench.add_parser(
        "simulate", help="replay an agent trace through every pause policy on a model of one node",
        description="Replay an agent trace (JSON Lines) through every pause policy on a simulated "
                    "serving node; report JCT, resume stalls, throughput, recomputed tokens and "
                    "idle HBM per policy.")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--trace", metavar="FILE", help="agent trace, JSON Lines (kvtier bench trace ... writes one)")
    src.add_argument("--synth", type=pos_int, metavar="N",
                     help="simulate N synthetic agent sessions instead of a trace file (seeded by --seed)")
    p.add_argument("--rate", type=pos_float, default=1.0,
                   help="with --synth: session arrivals per second (default 1.0)")
    p.add_argument("--seed", type=int, default=0, help="with --synth: random seed (default 0)")
    p.add_argument("--policies", default=None, metavar="A,B,...",
                   help="comma-separated policy names (default: breakeven,oracle,retain,recompute,"
                        "offload_host,lru,ttl,min_waste,eager,point)")
    p.add_argument("--set", action="append", default=[], metavar="POLICY.OPTION=VALUE",
                   help="pass an option to one policy, e.g. breakeven.stall_weight=2 or ttl.ttl_s=30 (repeatable)")
    p.add_argument("--on-error", choices=("skip", "stop"), default="stop",
                   help="malformed trace lines: stop at the first (default) or skip and report each")
    p.add_argument("--max-sessions", type=pos_int, default=None, help="replay only the first N sessions")
    p.add_argument("--time-scale", type=pos_float, default=1.0,
                   help="multiply session arrival times (>1 spreads load out; default 1)")
    _add_node_flags(p)
    from kvtier.bench.sim import cluster_cli      # the cluster model: --nodes, --router, --remote-gb-per-s, ...
    cluster_cli.add_cluster_flags(p)
    from kvtier.bench.sim import seeds_cli        # the seed set: --seeds, --jobs
    seeds_cli.add_seed_flags(p)
    p.add_argument("--plots", metavar="DIR", default=None,
                   help="write occupancy.png, stall_cdf.png and vs_oracle.png into DIR "
                        "(with --sweep-link: sim-sweep-link.png; with --seeds: sim-seeds.png; with --jitter: "
                        "sim-jitter.png)")
    p.add_argument("--sweep-link", metavar="GB/S,...", default=None,
                   help="run once per host-link speed (gigabytes per second each way, e.g. 12.5,25,50,100,512) and report "
                        "mean JCT and p99 stall per policy relative to the bound (the best any policy "
                        "reached); one node only, instead of --link-gb-per-s")
    add_json_flag(p)
    p.set_defaults(handler=_simulate)

    t = groups.bench.add_parser("trace", help="write agent traces: synthetic, or converted from public traces")
    ts = t.add_subparsers(dest="trace_command", metavar="SOURCE", parser_class=type(t))
    s = ts.add_parser("synth", help="synthetic agent workload (tool waits fitted to real aggregates)")
    s.add_argument("--out", required=True, metavar="FILE", help="trace to write (JSON Lines)")
    s.add_argument("--sessions", type=pos_int, default=1000, help="agent sessions (default 1000)")
    s.add_argument("--rate", type=pos_float, default=1.0, help="session arrivals per second (default 1.0)")
    s.add_argument("--rounds-mean", type=typed(float, lambda v: v >= 1, "a number >= 1"), default=10.0,
                   help="mean rounds per session (default 10)")
    s.add_argument("--max-rounds", type=pos_int, default=60, help="rounds per session at most (default 60)")
    s.add_argument("--shared-prefix-tokens", type=nonneg_int, default=8192,
                   help="system prompt + tool schemas shared by sessions (default 8192)")
    s.add_argument("--shared-prompts", type=pos_int, default=2, help="distinct shared prefixes (default 2)")
    s.add_argument("--first-tokens", type=pos_int, default=4000, help="median tokens of round 0")
    s.add_argument("--observation-tokens", type=pos_int, default=875, help="median tokens of a tool observation")
    s.add_argument("--output-tokens", type=pos_int, default=150, help="median output tokens per round")
    s.add_argument("--max-context", type=pos_int, default=131072,
                   help="a session ends when its context would pass this (default 131072)")
    s.add_argument("--human-prob", type=prob, default=0.03, help="share of pauses that wait on a human")
    s.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    add_json_flag(s)
    s.set_defaults(handler=_trace_synth)

    m = ts.add_parser("mooncake", help="rebuild sessions from a Mooncake FAST'25 trace")
    m.add_argument("--out", required=True, metavar="FILE", help="agent trace to write (JSON Lines)")
    m.add_argument("--input", default=None, metavar="FILE",
                   help="a Mooncake FAST'25 trace, e.g. conversation_trace.jsonl (default: $KVTIER_TRACES/"
                        "mooncake/conversation_trace.jsonl, else a 480-request sample shipped with kvtier)")
    m.add_argument("--waits", choices=("aggregate", "gaps"), default="aggregate",
                   help="tool waits drawn from the real aggregates (default) or the trace's own gaps")
    m.add_argument("--time-scale", type=pos_float, default=1.0,
                   help="multiply the trace's timestamps (default 1)")
    m.add_argument("--max-sessions", type=pos_int, default=None, help="convert only the first N sessions")
    m.add_argument("--seed", type=int, default=0, help="seed of the drawn tool waits (default 0)")
    m.add_argument("--on-error", choices=("skip", "stop"), default="stop",
                   help="malformed input lines: stop at the first (default) or skip and report each")
    add_json_flag(m)
    m.set_defaults(handler=_trace_mooncake)

    tl = ts.add_parser("tracelab", help="convert TraceLab round rows")
    tl.add_argument("--out", required=True, metavar="FILE", help="agent trace to write (JSON Lines)")
    tl.add_argument("--input", default=None, metavar="FILE",
                    help="TraceLab round rows (default: $KVTIER_TRACES/tracelab/"
                         "example_sanitized_round_trace.jsonl, else the example shipped with kvtier)")
    tl.add_argument("--on-error", choices=("skip", "stop"), default="stop",
                    help="malformed input lines: stop at the first (default) or skip and report each")
    add_json_flag(tl)
    tl.set_defaults(handler=_trace_tracelab)

    st = ts.add_parser("stats", help="summarise an agent trace")
    st.add_argument("file", metavar="FILE", help="agent trace (JSON Lines)")
    st.add_argument("--on-error", choices=("skip", "stop"), default="stop",
                    help="malformed lines: stop at the first (default) or skip and report each")
    add_json_flag(st)
    st.set_defaults(handler=_trace_stats)


def _add_node_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("node (defaults: the texts' 70B GQA model on 8 x H100, preset h100x8)")
    add_model_flag(g, default="gqa-70b", purpose="the served model's preset")
    add_node_flag(g, purpose="the node's hardware preset")
    g.add_argument("--hbm-gb", type=pos_float, help="node HBM, GB")
    g.add_argument("--weights-gb", type=nonneg_float, help="weights, GB (default: 2 bytes x params)")
    g.add_argument("--runtime-gb", type=nonneg_float, help="runtime + activation reserve, GB")
    g.add_argument("--host-gb", type=nonneg_float, help="pinned host DRAM for KV, GB (default 1024)")
    g.add_argument("--nvme-gb", type=nonneg_float, help="NVMe tier capacity, GB (default 8000)")
    add_rate_flag(g, "--link-gbps", type=pos_float, metavar="GB/S",
                  help="host link, gigabytes per second each way, node-wide")
    add_rate_flag(g, "--nvme-read-gbps", type=pos_float, metavar="GB/S",
                  help="NVMe read gigabytes per second, node-wide (default from --node)")
    add_rate_flag(g, "--nvme-write-gbps", type=pos_float, metavar="GB/S",
                  help="NVMe write gigabytes per second, node-wide (default from --node)")
    g.add_argument("--prefill-tflops", type=pos_float, help="sustained prefill TFLOP/s, node-wide")
    add_rate_flag(g, "--hbm-bw-tbps", type=pos_float, default=26.8, metavar="TB/S",
                  help="HBM bandwidth for decode, terabytes per second (default 26.8)")
    g.add_argument("--block-tokens", type=pos_int, default=16, help="tokens per KV block (default 16)")
    g.add_argument("--chunk-tokens", type=pos_int, default=2048, help="chunked-prefill tokens per iteration")
    g.add_argument("--ceiling", type=share, default=0.88, help="admission ceiling (default 0.88)")
    g.add_argument("--write-through", action="store_true",
                   help="write host DRAM copies through to NVMe in the background, so host DRAM is a "
                        "cache whose copies drop for free in the policy's victim order (every policy)")
    g.add_argument("--prefetch-past-ceiling", action="store_true",
                   help="let a prefetch fill the pool past the admission ceiling while new sessions "
                        "wait (the old rule; default: such a prefetch is deferred to the resume)")
    g.add_argument("--holders-first", action="store_true",
                   help="admit resumed rounds whose context is still in HBM (retained, prefetched, or "
                        "copy-out in flight) before queued resumes that need room, as vLLM drains "
                        "requests holding KV blocks first (default: one FIFO resume queue)")


def node_from_args(a: argparse.Namespace):
    from kvtier.bench.sim.runner import default_node
    GB = 1e9
    ov: dict[str, Any] = {"hbm_bw_bps": a.hbm_bw_tbps * 1e12, "block_tokens": a.block_tokens,
                          "chunk_tokens": a.chunk_tokens, "admission_ceiling": a.ceiling,
                          "write_through": bool(getattr(a, "write_through", False)),
                          "prefetch_past_ceiling": bool(getattr(a, "prefetch_past_ceiling", False)),
                          "holders_first": bool(getattr(a, "holders_first", False))}
    for flag, field, unit in (("hbm_gb", "hbm_bytes", GB), ("weights_gb", "weights_bytes", GB),
                              ("runtime_gb", "runtime_bytes", GB), ("host_gb", "host_bytes", GB),
                              ("nvme_gb", "nvme_bytes", GB), ("nvme_read_gbps", "nvme_read_bps", GB),
                              ("nvme_write_gbps", "nvme_write_bps", GB), ("prefill_tflops", "prefill_flops", 1e12)):
        v = getattr(a, flag)
        if v is not None:
            ov[field] = v * unit
    if a.link_gbps is not None:
        ov["link_h2d_bps"] = ov["link_d2h_bps"] = a.link_gbps * GB
    return default_node(a.model, a.node, **ov)


def _node_json(node) -> dict:
    hw, g = node.hardware, node.geometry
    return {"model": g.name, "token_bytes": g.token_bytes, "hbm_gb": hw.hbm_bytes / 1e9,
            "weights_gb": hw.weights_bytes / 1e9, "kv_pool_gb": hw.kv_pool_bytes / 1e9,
            "host_gb": hw.host_bytes / 1e9, "nvme_gb": hw.nvme_bytes / 1e9,
            "link_gbps": hw.link_h2d_bps / 1e9, "nvme_read_gbps": hw.nvme_read_bps / 1e9,
            "nvme_write_gbps": hw.nvme_write_bps / 1e9, "prefill_tflops": hw.prefill_flops / 1e12,
            "hbm_bw_tbps": node.hbm_bw_bps / 1e12, "block_tokens": node.block_tokens,
            "chunk_tokens": node.chunk_tokens, "admission_ceiling": node.admission_ceiling,
            "write_through": node.write_through, "prefetch_past_ceiling": node.prefetch_past_ceiling,
            "holders_first": node.holders_first}


def _stderr_console():
    from kvtier.util.console import make_console as Console  # width rules: pipes not cut
    return Console(stderr=True)


def _load_sessions(a: argparse.Namespace):
    from kvtier.bench.sim.trace import Trace, TraceError, read_trace
    if a.synth:
        from kvtier.bench.sim.synth import SynthConfig, synthesize
        sessions = synthesize(SynthConfig(sessions=a.synth, rate_per_s=a.rate, seed=a.seed))
        trace = Trace(tuple(sessions))
        label = f"synthetic {a.synth} sessions @ {a.rate:g}/s seed {a.seed}"
    else:
        try:
            trace = read_trace(a.trace, on_error=a.on_error)
        except TraceError as exc:
            raise CliError(f"{a.trace}: {exc} (use --on-error skip to skip bad lines)") from None
        except OSError as exc:
            raise CliError(f"cannot read trace {a.trace!r}: {exc.strerror or exc}") from None
        label = Path(a.trace).name
    sessions = list(trace.sessions)
    if a.max_sessions:
        sessions = sessions[:a.max_sessions]
    if a.time_scale != 1.0:
        from dataclasses import replace
        from kvtier.bench.sim.trace import MAX_ARRIVAL_S, Session
        last = max((s.arrival_s for s in sessions), default=0.0)
        if last * a.time_scale > MAX_ARRIVAL_S:
            raise CliError(f"--time-scale {a.time_scale:g} puts the last arrival at {last * a.time_scale:.3g} s, "
                           f"past the {MAX_ARRIVAL_S:g} s a trace may span")
        sessions = [Session(s.id, tuple(replace(r, arrival_s=r.arrival_s * a.time_scale) for r in s.rounds))
                    for s in sessions]
    if not sessions:
        raise CliError("the trace holds no complete session")
    return Trace(tuple(sessions), trace.problems, trace.lines_read), label


def _simulate(a: argparse.Namespace) -> int:
    from kvtier.bench.sim.runner import DEFAULT_POLICIES, REQUIRED_METRICS
    from kvtier.bench.sim.trace import summarize
    names = DEFAULT_POLICIES if a.policies is None else tuple(x.strip() for x in a.policies.split(",") if x.strip())
    if not names:
        raise CliError("--policies names no policy")
    if len(set(names)) != len(names):
        raise CliError("--policies repeats a name")
    node = node_from_args(a)
    from kvtier.bench.sim import cluster_cli
    cluster_cli.cluster_config(a)                 # bad cluster flags fail before any work
    from kvtier.bench.sim import seeds_cli
    seeds = seeds_cli.seeds_from_args(a)
    options = _policy_options(a.set, names)
    if a.plots:
        ensure_dir(a.plots, "--plots")
    if seeds:
        return _seed_set(a, node, names, seeds, options)
    speeds = _sweep_speeds(a)
    trace, label = _load_sessions(a)
    con = _stderr_console()
    for pr in trace.problems:
        con.print(f"[yellow]skipped[/yellow] {a.trace}: {pr}", markup=True, highlight=False, soft_wrap=True)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    total = len(trace.sessions)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=con, transient=True, disable=not con.is_terminal) as prog:
        task = prog.add_task("simulate", total=total * len(names))
        state = {"base": 0}

        def on_policy(n: str, i: int, k: int) -> None:
            state["base"] = i * total
            prog.update(task, description=f"{n} ({i + 1}/{k})", completed=state["base"])

        def progress(n: str, done: int, tot: int) -> None:
            prog.update(task, completed=state["base"] + done)

        from kvtier.bench.sim.simulator import SimulationStalled
        if speeds:
            return _sweep(a, trace, label, node, names, speeds, prog, task, on_policy, progress)
        try:
            results, cluster = cluster_cli.run(a, trace.sessions, node, names,
                                               options=options,
                                               on_policy=on_policy, progress=progress)
        except SimulationStalled as exc:       # never report metrics over part of the sessions
            raise CliError(f"simulation stalled: {exc}") from None
    plots = []
    if a.plots:
        from kvtier.bench.sim.plots import plot_all
        plots = plot_all(results, a.plots, ceiling=node.admission_ceiling, title=label)
    doc = {"trace": {"source": label, **{k: v for k, v in summarize(trace).items() if k != "tools"}},
           "node": _node_json(node),
           **({"cluster": cluster} if cluster is not None else {}),
           "policies": {n: r.metrics for n, r in results.items()},
           "problems": [str(p) for p in trace.problems],
           "plots": plots}
    if a.json:
        emit_json(doc)
        return 0
    _print_table(doc, results, REQUIRED_METRICS)
    if cluster is not None:
        from kvtier.util.console import make_console as Console  # width rules: pipes not cut
        Console().print(cluster_cli.describe(cluster), highlight=False, soft_wrap=True)
    return 0


def _seed_set(a: argparse.Namespace, node, names, seeds, options) -> int:
    from kvtier.bench.sim import seeds_cli
    doc = seeds_cli.run(a, node, names, seeds, options, _node_json(node))
    if a.plots:
        from kvtier.bench.sim.plots import plot_seeds
        png = "sim-jitter.png" if "jitter" in doc else "sim-seeds.png"
        doc["plots"] = [str(plot_seeds(doc, Path(a.plots) / png, title=doc["trace"]["source"]))]
    if a.json:
        emit_json(doc)
        return 0
    seeds_cli.print_report(doc)
    return 0


def _sweep_speeds(a: argparse.Namespace) -> tuple[float, ...]:
    """The --sweep-link speeds (empty without the flag).  Raises CliError on bad use."""
    if a.sweep_link is None:
        return ()
    from kvtier.bench.sim.sweep import parse_speeds
    if a.link_gbps is not None:
        raise CliError("--sweep-link sets the link speed itself; drop --link-gb-per-s")
    if getattr(a, "nodes", None) is not None:
        raise CliError("--sweep-link runs the one-node simulator; drop --nodes")
    try:
        return parse_speeds(a.sweep_link)
    except ValueError as exc:
        raise CliError(f"--sweep-link: {exc}") from None


def _sweep(a: argparse.Namespace, trace, label: str, node, names, speeds, prog, task, on_policy, progress) -> int:
    from kvtier.bench.sim.runner import run_policies
    from kvtier.bench.sim.simulator import SimulationStalled
    from kvtier.bench.sim.sweep import run_sweep
    from kvtier.bench.sim.trace import summarize
    k = len(names)
    prog.update(task, total=len(trace.sessions) * k * len(speeds))

    def run(sessions, nd, ns, options):
        return run_policies(sessions, nd, ns, options=options, on_policy=on_policy, progress=progress)

    def on_speed(s: float, i: int, n: int) -> None:
        prog.update(task, description=f"{s:g} GB/s ({i + 1}/{n})")

    try:
        sweep = run_sweep(trace.sessions, node, names, speeds, run=run,
                          options=_policy_options(a.set, names), on_speed=on_speed)
    except SimulationStalled as exc:
        raise CliError(f"simulation stalled: {exc}") from None
    plots = []
    if a.plots:
        from kvtier.bench.sim.plots import plot_sweep
        plots = [str(plot_sweep(sweep, Path(a.plots) / "sim-sweep-link.png", title=label))]
    doc = {"trace": {"source": label, **{k: v for k, v in summarize(trace).items() if k != "tools"}},
           "node": _node_json(node), "sweep": sweep, "problems": [str(p) for p in trace.problems],
           "plots": plots}
    if a.json:
        emit_json(doc)
        return 0
    from kvtier.util.console import make_console as Console  # width rules: pipes not cut
    from rich.table import Table
    con = Console()
    t = Table(title="mean JCT / bound, p99 stall s (bound = the best any policy reached at that speed)")
    t.add_column("policy")
    for s in speeds:
        t.add_column(f"{s:g} GB/s", justify="right")
    for n in names:
        r, m = sweep["vs_bound"][n], sweep["policies"][n]
        t.add_row(n, *(f"{r['jct_mean'][i]:.3f}x {m['resume_stall_p99_s'][i]:.3f}" for i in range(len(speeds))))
    b = sweep["bound"]
    t.add_row("bound", *(f"{b['jct_mean_s'][i]:.1f} s {b['resume_stall_p99_s'][i]:.3f}" for i in range(len(speeds))))
    con.print(t)
    for p in plots:
        con.print(f"plot: {p}")
    return 0


def _policy_options(items: list[str], names) -> dict:
    out: dict[str, dict] = {}
    for it in items:
        key, sep, raw = it.partition("=")
        pol, dot, opt = key.partition(".")
        if not sep or not dot or not pol or not opt:
            raise CliError(f"--set wants POLICY.OPTION=VALUE, got {it!r}")
        if pol not in names:
            raise CliError(f"--set {it!r}: policy {pol!r} is not being simulated")
        val: Any = raw
        for conv in (int, float):
            try:
                val = conv(raw)
                break
            except ValueError:
                pass
        if raw.lower() in ("true", "false"):
            val = raw.lower() == "true"
        out.setdefault(pol, {})[opt] = val
    return out


def _print_table(doc: dict, results, required) -> None:
    from kvtier.util.console import fit_table, make_console  # width rules: pipes not cut
    con = make_console()
    tr, nd = doc["trace"], doc["node"]
    con.print(f"[bold]trace[/bold] {tr['source']}: {tr['sessions']} sessions, {tr['rounds']} rounds, "
              f"{tr['pauses']} pauses (tool wait p50 {tr['tool_wait_p50_s']:.2f} s, p99 {tr['tool_wait_p99_s']:.0f} s)")
    con.print(f"[bold]node[/bold] {nd['model']} on {nd['hbm_gb']:.0f} GB HBM (KV pool {nd['kv_pool_gb']:.0f} GB), "
              f"host {nd['host_gb']:.0f} GB, link {nd['link_gbps']:.0f} GB/s, NVMe {nd['nvme_read_gbps']:.0f}/"
              f"{nd['nvme_write_gbps']:.0f} GB/s, prefill {nd['prefill_tflops']:.0f} TFLOP/s, "
              f"ceiling {nd['admission_ceiling']:.0%}")
    pol = doc["policies"]
    ref = pol.get("oracle")
    columns = [(c, "left" if c == "policy" else "right") for c in (
        "policy", "JCT mean s", "JCT p99 s", "stall p50 s", "stall p99 s", "tok/s",
        "recomputed tok", "idle HBM GB*s", "peak HBM", "vs oracle")]
    best = min(pol, key=lambda n: pol[n]["jct_mean_s"])
    rows = []
    for n, m in pol.items():
        rel = f"{m['jct_mean_s'] / ref['jct_mean_s']:.3f}x" if ref and ref["jct_mean_s"] > 0 else "-"
        rows.append([f"[bold]{n}[/bold]" if n == best else n, f"{m['jct_mean_s']:.1f}", f"{m['jct_p99_s']:.1f}",
                     f"{m['resume_stall_p50_s']:.3f}", f"{m['resume_stall_p99_s']:.3f}",
                     f"{m['throughput_tokens_per_s']:.1f}", f"{m['recomputed_tokens']:,}",
                     f"{m['hbm_idle_gb_s']:,.0f}", f"{m['hbm_peak_util']:.0%}", rel])
    # a narrow terminal: leave out the least telling columns rather than cut cells
    t, dropped = fit_table(con, columns, rows,
                           drop=("idle HBM GB*s", "peak HBM", "tok/s", "recomputed tok", "stall p50 s", "JCT p99 s"),
                           title="policies (JCT = completion - arrival; stall = tool return until the state is "
                                 "back in HBM, or its recompute)")
    con.print(t)
    if dropped:
        con.print(f"(narrow terminal: columns {', '.join(dropped)} left out; --json has every field)",
                  style="dim", highlight=False)
    for p in doc["plots"]:
        con.print(f"plot: {p}")


def _write_conversion(a: argparse.Namespace, sessions, stats: dict, problems) -> int:
    from kvtier.bench.sim.trace import Trace, summarize, write_trace
    if not sessions:
        raise CliError("the input holds no complete session; nothing written")
    try:
        n = write_trace(a.out, sessions)
    except OSError as exc:
        raise CliError(f"cannot write {a.out!r}: {exc.strerror or exc}") from None
    summary = summarize(Trace(tuple(sessions)))
    doc = {"out": str(a.out), "lines": n, "stats": stats, "summary": summary,
           "problems": [str(p) for p in problems]}
    if a.json:
        emit_json(doc)
        return 0
    from kvtier.util.console import make_console as Console  # width rules: pipes not cut
    from rich.table import Table
    con = Console()
    for p in problems:
        _stderr_console().print(f"skipped: {p}", markup=False, highlight=False, soft_wrap=True)
    t = Table(title=f"wrote {n} rounds to {a.out}")
    t.add_column("field")
    t.add_column("value", justify="right")
    for k, v in {**stats, **summary}.items():
        if isinstance(v, float):
            v = f"{v:.4g}"
        elif isinstance(v, dict):
            v = ", ".join(f"{kk} {vv}" for kk, vv in list(v.items())[:8])
        t.add_row(k, str(v))
    con.print(t)
    return 0


def _trace_synth(a: argparse.Namespace) -> int:
    from kvtier.bench.sim.synth import SynthConfig, synthesize
    cfg = SynthConfig(sessions=a.sessions, rate_per_s=a.rate, rounds_mean=a.rounds_mean, max_rounds=a.max_rounds,
                      shared_prompts=a.shared_prompts, shared_prefix_tokens=a.shared_prefix_tokens,
                      first_tokens_median=a.first_tokens, observation_tokens_median=a.observation_tokens,
                      output_tokens_median=a.output_tokens, max_context_tokens=a.max_context,
                      human_prob=a.human_prob, seed=a.seed)
    return _write_conversion(a, synthesize(cfg), {"generator": "synth", "seed": a.seed}, ())


def _input(a: argparse.Namespace, source: str) -> Path:
    """``--input``, else the full trace under ``$KVTIER_TRACES``, else the packaged sample (one line
    on stderr says so and where the full trace is)."""
    from kvtier.samples import sample_note, trace_input
    try:
        found = trace_input(source, a.input)
    except FileNotFoundError as exc:
        raise CliError(str(exc)) from None
    if found.is_sample:
        import sys
        print(f"note: {sample_note(source)}", file=sys.stderr)
    return found.path


def _conv_errors(fn, *args, **kw):
    from kvtier.bench.sim.trace import TraceError
    try:
        return fn(*args, **kw)
    except TraceError as exc:
        raise CliError(f"{args[0]}: {exc} (use --on-error skip to skip bad lines)") from None


def _trace_mooncake(a: argparse.Namespace) -> int:
    from kvtier.bench.sim.convert import convert_mooncake
    path = _input(a, "mooncake")
    c = _conv_errors(convert_mooncake, path, seed=a.seed, time_scale=a.time_scale, max_sessions=a.max_sessions,
                     waits=a.waits, on_error=a.on_error)
    return _write_conversion(a, c.sessions, {"source": path.name, **c.stats}, c.problems)


def _trace_tracelab(a: argparse.Namespace) -> int:
    from kvtier.bench.sim.convert import convert_tracelab
    path = _input(a, "tracelab")
    c = _conv_errors(convert_tracelab, path, on_error=a.on_error)
    return _write_conversion(a, c.sessions, {"source": path.name, **c.stats}, c.problems)


def _trace_stats(a: argparse.Namespace) -> int:
    from kvtier.bench.sim.trace import TraceError, read_trace, summarize
    try:
        tr = read_trace(a.file, on_error=a.on_error)
    except TraceError as exc:
        raise CliError(f"{a.file}: {exc} (use --on-error skip to skip bad lines)") from None
    except OSError as exc:
        raise CliError(f"cannot read trace {a.file!r}: {exc.strerror or exc}") from None
    if not tr.sessions:
        raise CliError(f"{a.file}: the trace holds no complete session")
    doc = {"file": a.file, **summarize(tr), "problems": [str(p) for p in tr.problems]}
    if a.json:
        emit_json(doc)
        return 0
    from kvtier.util.console import make_console as Console  # width rules: pipes not cut
    from rich.table import Table
    t = Table(title=a.file)
    t.add_column("field")
    t.add_column("value", justify="right")
    for k, v in doc.items():
        if k in ("file",):
            continue
        if isinstance(v, float):
            v = f"{v:.4g}"
        elif isinstance(v, (dict, list)):
            v = ", ".join(f"{kk} {vv}" for kk, vv in list(v.items())[:8]) if isinstance(v, dict) else "; ".join(v[:5])
        t.add_row(k, str(v))
    Console().print(t)
    return 0
