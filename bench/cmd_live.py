"""``kvtier bench live``: agent sessions from a trace on a running vLLM engine,
every configuration x ``--repeat``, interleaved.  See docs/live.md."""
from __future__ import annotations

import argparse
import math
from pathlib import Path

from kvtier.util.args import pos_float, pos_int
from kvtier.cli.main import CliError, CommandGroups, add_json_flag, emit_json

WAIT_SETS = ("trace", "swe_agent", "swe_smith", "tracelab_sample")


def register(groups: CommandGroups) -> None:
    p = groups.bench.add_parser(
        "live", help="agent sessions on a live in-process vLLM engine: resume TTFT per configuration",
        description="Drive a live vLLM engine (in this process; vLLM's CPU build runs anywhere) with agent "
                    "sessions whose contexts grow turn by turn and whose tool waits are real sleeps; compare "
                    "resident, recompute, vLLM's CPU tier and kvtier's policies over --repeat interleaved runs.")
    p.add_argument("--trace", default=None, metavar="FILE",
                   help="agent trace (kvtier bench trace mooncake|synth|tracelab writes one); default: synthetic")
    p.add_argument("--waits", choices=WAIT_SETS, default="trace",
                   help="tool waits from the trace (default) or drawn, tool names and all, from a real per-call "
                        "set under --traces")
    p.add_argument("--traces", default=None, metavar="DIR", help="where the per-call sets are ($KVTIER_TRACES)")
    p.add_argument("--sessions", type=pos_int, default=6, help="sessions (default 6)")
    p.add_argument("--turns", type=pos_int, default=4, help="turns per session at most (default 4)")
    p.add_argument("--max-context", type=pos_int, default=1600, help="tokens of the longest context (default 1600)")
    p.add_argument("--time-scale", type=pos_float, default=1.0,
                   help="multiply the trace's arrivals and waits by this (default 1)")
    p.add_argument("--max-wait", type=pos_float, default=6.0, help="cap any wait at this many seconds (default 6)")
    p.add_argument("--arrival-spread", type=float, default=2.0,
                   help="spread the sessions' arrivals evenly over this many seconds (default 2; -1: the trace's)")
    p.add_argument("--configs", default=None, metavar="A,B,...",
                   help="configurations (default resident,recompute,vllm-cpu-tier,lru,ttl,eager,point,breakeven)")
    p.add_argument("--repeat", type=pos_int, default=1, help="runs of every configuration, interleaved (default 1)")
    p.add_argument("--host-fraction", type=pos_float, default=0.25,
                   help="kvtier host frames as a share of the paused working set (default 0.25)")
    p.add_argument("--engine-fraction", type=pos_float, default=0.25,
                   help="the small engine cache as a share of the paused working set (default 0.25)")
    p.add_argument("--nvme-gbps", type=pos_float, default=None, metavar="GB/S",
                   help="emulate a slower NVMe tier for kvtier's configurations (the store's throttle; "
                        "default: the disk's own speed)")
    p.add_argument("--sweep-host", default=None, metavar="F,F,...",
                   help="also sweep kvtier's host tier over these shares of the working set")
    p.add_argument("--sweep-configs", default="eager,breakeven", metavar="A,B",
                   help="configurations of the sweep (default eager,breakeven)")
    p.add_argument("--layers", type=pos_int, default=None, help="model layers (default 4)")
    p.add_argument("--hidden", type=pos_int, default=None, help="model hidden size, a multiple of 64 (default 512)")
    p.add_argument("--model-dir", default=None, metavar="DIR", help="where the random-weight model is built")
    p.add_argument("--data-dir", default=None, metavar="DIR", help="where the stores live (default: temporary)")
    p.add_argument("--seed", type=int, default=0, help="workload seed (default 0)")
    p.add_argument("--plots", default=None, metavar="DIR", help="write ttft_cdf.png (and host_sweep.png) here")
    p.add_argument("--url", default=None, help="a running `vllm serve` (not supported yet: refused with a message)")
    add_json_flag(p)
    p.set_defaults(handler=_live)


def _names(s: str | None, default) -> tuple[str, ...]:
    names = tuple(x.strip() for x in s.split(",") if x.strip()) if s else tuple(default)
    if not names or len(set(names)) != len(names):
        raise CliError("a configuration list is empty or repeats a name")
    return names


def _sessions(a: argparse.Namespace):
    from kvtier.bench.live.workload import Fit, fit_trace
    from kvtier.bench.sim.trace import TraceError, read_trace
    if a.trace:
        try:
            sessions = read_trace(a.trace).sessions
        except TraceError as exc:
            raise CliError(f"--trace {a.trace}: {exc}") from None
        except OSError as exc:
            raise CliError(f"--trace: cannot read {a.trace!r}: {exc.strerror or exc}") from None
    else:
        from kvtier.bench.sim.synth import SynthConfig, synthesize
        sessions = synthesize(SynthConfig(sessions=max(4 * a.sessions, 20), rate_per_s=1.0, seed=a.seed))
    calls = None
    if a.waits != "trace":
        from kvtier.bench.predictor_eval import load_datasets
        from kvtier.bench.sim.convert import default_traces_dir
        try:
            sets = {d.name: d for d in load_datasets(Path(a.traces) if a.traces else default_traces_dir())}
        except ValueError as exc:
            raise CliError(str(exc)) from None
        if a.waits not in sets:
            raise CliError(f"--waits {a.waits}: not found under the traces directory (found: {', '.join(sets)})")
        calls = sets[a.waits].calls
    fit = Fit(sessions=a.sessions, turns=max(2, a.turns), max_context=a.max_context, time_scale=a.time_scale,
              max_wait_s=a.max_wait, arrival_spread_s=None if a.arrival_spread < 0 else a.arrival_spread)
    try:
        return fit_trace(sessions, fit, calls=calls, seed=a.seed)
    except ValueError as exc:
        raise CliError(str(exc)) from None


def _live(a: argparse.Namespace) -> int:
    if a.url:
        raise CliError("--url (a running `vllm serve`) is not supported yet: the benchmark runs the engine in-process")
    from dataclasses import replace
    from kvtier.bench.live.benchmark import BENCH_MODEL, LiveBenchOptions, run_benchmark
    from kvtier.bench.live.configs import CONFIGS
    from kvtier.engine_adapter.vllm_inprocess import VllmMissing
    model = BENCH_MODEL
    if a.layers:
        model = replace(model, layers=a.layers)
    if a.hidden:
        heads = max(2, a.hidden // 64)       # head size 64: vLLM's CPU attention takes 32, 64, 128, ...
        model = replace(model, hidden=a.hidden, heads=heads, kv_heads=max(1, heads // 4),
                        intermediate=a.hidden * 11 // 4)
    if a.hidden and a.hidden % 64:
        raise CliError("--hidden must be a multiple of 64 (heads of 64)")
    sweep = tuple(float(x) for x in a.sweep_host.split(",")) if a.sweep_host else ()
    if any(not (f > 0 and math.isfinite(f)) for f in sweep):
        raise CliError("--sweep-host: shares must be numbers > 0")
    opts = LiveBenchOptions(configs=_names(a.configs, CONFIGS), repeat=a.repeat, seed=a.seed, model=model,
                            model_dir=a.model_dir, engine_fraction=a.engine_fraction, host_fraction=a.host_fraction,
                            time_scale=a.time_scale, nvme_gbps=a.nvme_gbps, data_dir=a.data_dir,
                            host_fractions=sweep,
                            sweep_configs=_names(a.sweep_configs, ("eager", "breakeven")))
    sessions = _sessions(a)
    con = None
    if not a.json:
        from kvtier.util.console import make_console
        con = make_console(stderr=True)
    try:
        doc = run_benchmark(opts, sessions, progress=(lambda m: con.print(m, style="dim")) if con else (lambda m: None))
    except VllmMissing as exc:
        raise CliError(str(exc)) from None
    except ValueError as exc:
        raise CliError(str(exc)) from None
    runs = doc.pop("_runs")
    sweep_runs = [cell.pop("_runs") for cell in doc["sweep"]]
    doc["plots"] = []
    if a.plots:
        from kvtier.bench.live.plots import plot_host_sweep, plot_ttft_cdf
        out = Path(a.plots)
        out.mkdir(parents=True, exist_ok=True)
        doc["plots"].append(str(plot_ttft_cdf(runs, out / "ttft_cdf.png", title=_title(doc))))
        if doc["sweep"]:
            doc["plots"].append(str(plot_host_sweep(doc["sweep"], out / "host_sweep.png", title=_title(doc))))
    del sweep_runs
    if a.json:
        emit_json(doc)
    else:
        print_tables(doc)
    return 0


def _title(doc: dict) -> str:
    w = doc["workload"]
    return (f"{w['sessions']} sessions, {w['resumes']} resumes, K={doc['repeat']}, "
            f"{doc['engine']['model_params'] / 1e6:.1f}M-param model")


def _ms(m: float, se: float | None) -> str:
    if m is None or (isinstance(m, float) and math.isnan(m)):
        return "-"
    return f"{m * 1000:.0f} ± {se * 1000:.0f}" if se is not None and not math.isnan(se) else f"{m * 1000:.0f}"


def print_tables(doc: dict) -> None:
    from kvtier.util.console import fit_table, make_console
    con = make_console()
    e, w, sz = doc["engine"], doc["workload"], doc["sizes"]
    mib = 2 ** 20
    con.print(f"[bold]engine[/bold] vLLM {e['vllm']} in-process, random-weight Llama {e['model_params'] / 1e6:.1f}M "
              f"params ({e['model']['layers']} layers, hidden {e['model']['hidden']}), "
              f"{e['kv_bytes_per_token']} B KV/token, prefill "
              f"{(e['prefill_ms_per_1k_tokens'] or float('nan')):.0f} ms per 1k tokens")
    con.print(f"[bold]workload[/bold] {w['sessions']} sessions, {w['resumes']} resumes, paused working set "
              f"{w['paused_working_set_bytes'] / mib:.1f} MiB ({w['paused_working_set_tokens']} tokens); "
              f"engine cache {sz['engine_blocks'] * sz['block_bytes'] / mib:.1f} MiB (resident "
              f"{sz['resident_blocks'] * sz['block_bytes'] / mib:.1f} MiB), kvtier host "
              f"{sz['host_bytes'] / mib:.1f} MiB + vLLM CPU tier {sz['cpu_bytes'] / mib:.1f} MiB"
              + (f"; NVMe throttled to {sz['nvme_throttle_gbps']:g} GB/s" if sz.get("nvme_throttle_gbps") else ""))
    con.print("vllm-cpu-tier runs on kvtier's CPU copy worker (vLLM's own refuses the CPU platform)", style="dim")
    res = doc["configs"].get("resident")
    columns = [(c, "left" if c == "config" else "right") for c in (
        "config", "TTFT p50 ms", "TTFT p99 ms", "JCT s", "p99/resident", "engine+DRAM MiB", "recomputed tok",
        "misses", "served host/nvme", "outputs equal")]
    rows = []
    for n, m in doc["configs"].items():
        rel = f"{m['resume_ttft_p99_s'] / res['resume_ttft_p99_s']:.2f}x" if res else "-"
        served = m["served_chunks_by_tier"]
        rows.append([n, _ms(m["resume_ttft_p50_s"], m["resume_ttft_p50_s_se"]),
                     _ms(m["resume_ttft_p99_s"], m["resume_ttft_p99_s_se"]),
                     f"{m['jct_mean_s']:.2f} ± {m['jct_mean_s_se']:.2f}" if not math.isnan(m["jct_mean_s_se"])
                     else f"{m['jct_mean_s']:.2f}", rel,
                     f"{(m['engine_bytes'] + m['dram_bytes']) / mib:.1f}", f"{m['recomputed_tokens']:.0f}",
                     f"{m['misses']:.1f}",
                     f"{served.get('host', 0):.0f}/{served.get('nvme', 0):.0f}" if served else "-",
                     {True: "yes", False: "NO", None: "-"}[m["outputs_equal"]]])
    t, _ = fit_table(con, columns, rows, drop=("served host/nvme", "misses", "recomputed tok"),
                     title=f"mean ± SE over {doc['repeat']} interleaved repeats")
    con.print(t)
    _print_paired(con, doc["paired"], doc["reference"])
    for cell in doc["sweep"]:
        con.print(f"[bold]host tier {cell['host_bytes'] / mib:.2f} MiB[/bold] "
                  + "; ".join(f"{n}: p50 {_ms(m['resume_ttft_p50_s'], m['resume_ttft_p50_s_se'])} ms, p99 "
                              f"{_ms(m['resume_ttft_p99_s'], m['resume_ttft_p99_s_se'])} ms, JCT {m['jct_mean_s']:.2f} s"
                              for n, m in cell["configs"].items()))
        _print_paired(con, cell["paired"], doc["reference"])
    for p in doc["plots"]:
        con.print(f"plot: {p}")


def _print_paired(con, pair: dict, ref: str) -> None:
    from kvtier.util.console import fit_table
    if not pair:
        return
    columns = [(c, "left" if c == "config" else "right") for c in ("config", "Δ p50 ms", "Δ p99 ms", "Δ JCT s")]
    mark = {-1: " (resolved: lower)", 1: " (resolved: higher)", 0: ""}
    rows = []
    for n, d in pair.items():
        cells = []
        for k, scale, fmt in (("resume_ttft_p50_s", 1000, "{:+.0f} ± {:.0f}"), ("resume_ttft_p99_s", 1000, "{:+.0f} ± {:.0f}"),
                              ("jct_mean_s", 1, "{:+.2f} ± {:.2f}")):
            x = d[k]
            cells.append(fmt.format(x["mean"] * scale, (x["se"] if not math.isnan(x["se"]) else 0) * scale)
                         + mark[x["resolved"]])
        rows.append([n, *cells])
    t, _ = fit_table(con, columns, rows, drop=(), title=f"paired differences: config - {ref} (mean ± SE)")
    con.print(t)
