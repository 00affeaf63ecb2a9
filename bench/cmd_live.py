"""``kvtier bench live``: agent sessions from a trace on a live vLLM engine,
every configuration x ``--repeat``, interleaved, on engines in this process
(with ``--scale-to NODE``, as a scale model of that GPU node); or, with
``--url``, ``--repeat`` runs on a running ``vllm serve`` (one configuration:
whatever the server runs).  See docs/live.md."""
from __future__ import annotations

import argparse
import math
from pathlib import Path

from kvtier.util.args import pos_float, pos_int
from kvtier.cli.main import CliError, CommandGroups, add_json_flag, emit_json

WAIT_SETS = ("trace", "swe_agent", "swe_smith", "tracelab_sample")


def register(groups: CommandGroups) -> None:
    from kvtier.bench.live.scale import TARGETS
    p = groups.bench.add_parser(
        "live", help="agent sessions on a live in-process vLLM engine: resume TTFT per configuration",
        description="Drive a live vLLM engine (in this process; vLLM's CPU build runs anywhere) with agent "
                    "sessions whose contexts grow turn by turn and whose tool waits are real sleeps; compare "
                    "resident, recompute, vLLM's CPU tier and kvtier's policies over --repeat interleaved runs. "
                    "With --scale-to, run it as a scale model of a GPU node (moves slowed and waits stretched so "
                    "that their ratios to a prefill are the node's). "
                    "With --url, drive a running `vllm serve` instead (one configuration).")
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
                   help="configurations (default resident,recompute,vllm-cpu-tier,lru,ttl,eager,point,breakeven; "
                        "also session-ttl, vLLM main's fixed-timer session lifecycle, or any policy name; "
                        "NAME#2: another copy of NAME, an A/A control)")
    p.add_argument("--repeat", type=pos_int, default=1, help="runs of every configuration, interleaved (default 1)")
    p.add_argument("--host-fraction", type=pos_float, default=None,
                   help="kvtier host frames as a share of the paused working set (default 0.25)")
    p.add_argument("--engine-fraction", type=pos_float, default=None,
                   help="the small engine cache as a share of the paused working set (default 0.25)")
    p.add_argument("--nvme-gbps", type=pos_float, default=None, metavar="GB/S",
                   help="emulate a slower NVMe tier for kvtier's configurations (the store's throttle; "
                        "default: the disk's own speed)")
    p.add_argument("--scale-to", default=None, choices=tuple(TARGETS), metavar="NODE",
                   help="run as a scale model of NODE (" + "; ".join(f"{k}: {t.about}" for k, t in TARGETS.items())
                        + "): calibrate this engine's prefill, then slow the CPU worker's link and kvtier's NVMe "
                          "and stretch the waits by the same factor, and price kvtier's pauses as NODE "
                          "(docs/live.md, 'The scale model')")
    p.add_argument("--sweep-host", default=None, metavar="F,F,...",
                   help="also sweep kvtier's host tier over these shares of the working set")
    p.add_argument("--sweep-configs", default=None, metavar="A,B",
                   help="configurations of the sweep (default eager,breakeven)")
    p.add_argument("--layers", type=pos_int, default=None, help="model layers (default 4)")
    p.add_argument("--hidden", type=pos_int, default=None, help="model hidden size, a multiple of 64 (default 512)")
    p.add_argument("--model-dir", default=None, metavar="DIR", help="where the random-weight model is built")
    p.add_argument("--data-dir", default=None, metavar="DIR", help="where the stores live (default: temporary)")
    p.add_argument("--seed", type=int, default=0, help="workload seed (default 0)")
    p.add_argument("--plots", default=None, metavar="DIR", help="write ttft_cdf.png (and host_sweep.png) here")
    url = p.add_argument_group("a running server", "--url drives a running `vllm serve` instead of an in-process "
                                                     "engine: one configuration, --repeat runs (docs/live.md)")
    url.add_argument("--url", default=None, metavar="URL", help="the server, e.g. http://127.0.0.1:8000")
    url.add_argument("--url-name", default=None, metavar="NAME", help="the configuration's name in the report "
                                                                      "(default url)")
    url.add_argument("--vocab", type=pos_int, default=None,
                     help="token ids are drawn below this (default 1024; the server does not tell its vocabulary)")
    url.add_argument("--block-tokens", type=pos_int, default=None,
                     help="the server's KV block size (default: read from its /metrics)")
    url.add_argument("--url-timeout", type=pos_float, default=None,
                     help="seconds to wait for the server's next bytes (default 300)")
    cl = p.add_argument_group("a cluster", "--engines N starts N `vllm serve` engines with kvtier on one shared "
                                           "redis-server behind kvtier's router, and compares routers "
                                           "(docs/routing.md, 'Two engines: the routers compared')")
    cl.add_argument("--engines", type=pos_int, default=None, metavar="N", help="engines in the cluster (>= 2)")
    cl.add_argument("--routers", default=None, metavar="A,B,...",
                    help="routing policies compared (default prefix-load,round-robin,least-loaded,sticky)")
    cl.add_argument("--engine-blocks", type=pos_int, default=None, metavar="N",
                    help="each engine's KV cache in blocks of 32 tokens (default: --engine-fraction of the "
                         "paused working set, at least the longest context)")
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


IN_PROCESS_ONLY = ("configs", "sweep_host", "sweep_configs", "host_fraction", "engine_fraction", "nvme_gbps",
                   "layers", "hidden", "model_dir", "data_dir", "scale_to")
URL_ONLY = ("url_name", "vocab", "block_tokens", "url_timeout")
CLUSTER_ONLY = ("routers", "engine_blocks")
NOT_IN_CLUSTER = ("configs", "sweep_host", "sweep_configs", "host_fraction", "nvme_gbps", "layers", "hidden",
                  "scale_to", "url", "url_name", "block_tokens")


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _live(a: argparse.Namespace) -> int:
    if a.engines is not None:
        given = [_flag(d) for d in NOT_IN_CLUSTER if getattr(a, d) is not None]
        if given:
            raise CliError(f"{', '.join(given)} {'does' if len(given) == 1 else 'do'} not apply with --engines")
        if a.engines < 2:
            raise CliError("--engines: a cluster has at least 2 engines")
        return _live_cluster(a)
    given = [_flag(d) for d in CLUSTER_ONLY if getattr(a, d) is not None]
    if given:
        raise CliError(f"{', '.join(given)} {'applies' if len(given) == 1 else 'apply'} only with --engines")
    if a.url is not None:
        given = [_flag(d) for d in IN_PROCESS_ONLY if getattr(a, d) is not None]
        if given:
            raise CliError(f"{', '.join(given)} {'does' if len(given) == 1 else 'do'} not apply with --url: the "
                           f"server is one configuration, its model and sizes its own")
        return _live_url(a)
    given = [_flag(d) for d in URL_ONLY if getattr(a, d) is not None]
    if given:
        also = all(d not in NOT_IN_CLUSTER for d in URL_ONLY if getattr(a, d) is not None)
        raise CliError(f"{', '.join(given)} {'applies' if len(given) == 1 else 'apply'} only with --url"
                       + (" or --engines" if also else ""))
    return _live_in_process(a)


def _live_url(a: argparse.Namespace) -> int:
    from kvtier.bench.live.http_engine import ServerError
    from kvtier.bench.live.url_bench import DEFAULT_VOCAB, UrlBenchOptions, run_url_benchmark
    name = (a.url_name if a.url_name is not None else "url").strip()
    if not name:
        raise CliError("--url-name must not be empty")
    opts = UrlBenchOptions(url=a.url, name=name, repeat=a.repeat, seed=a.seed, vocab=a.vocab or DEFAULT_VOCAB,
                           block_tokens=a.block_tokens, timeout_s=a.url_timeout or 300.0, time_scale=a.time_scale)
    sessions = _sessions(a)
    try:
        doc = run_url_benchmark(opts, sessions, progress=_progress(a))
    except ServerError as exc:
        raise CliError(f"--url: {exc}") from None
    return _report(a, doc)


def _live_cluster(a: argparse.Namespace) -> int:
    import shutil
    import tempfile
    from kvtier.bench.live.cluster import Cluster, ClusterError, ClusterSpec
    from kvtier.bench.live.cluster_bench import ClusterBenchOptions, print_cluster_tables, run_cluster_benchmark
    from kvtier.bench.live.http_engine import ServerError
    from kvtier.bench.live.url_bench import DEFAULT_VOCAB
    from kvtier.bench.live.workload import paused_working_set
    from kvtier.engine_adapter.tiny_model import TinyModel, build_tiny_model
    from kvtier.tiering.routing.policies import POLICIES
    routers = _names(a.routers, POLICIES)
    unknown = [r for r in routers if r not in POLICIES]
    if unknown:
        raise CliError(f"--routers: unknown routing policy {unknown[0]!r}; known: {', '.join(POLICIES)}")
    sessions = _sessions(a)
    bt = 32
    longest = max(s.final_context() for s in sessions)
    blocks = a.engine_blocks or max(-(-longest // bt) + 2,
                                    int((a.engine_fraction or 0.25) * paused_working_set(sessions) / bt))
    kv_block = TinyModel().kv_bytes_per_token() * bt
    kvtier = {"nvme_gb": max(0.0008, blocks * kv_block / 1e9), "host_gb": 0, "remote_write": "through"}
    work = Path(a.data_dir) if a.data_dir else Path(tempfile.mkdtemp(prefix="kvtier-cluster-"))
    from kvtier.util.console import make_console
    con = make_console(stderr=True)
    progress = lambda m: con.print(m, style="dim")    # on stderr with --json too: engines take a while
    try:
        model = str(build_tiny_model(Path(a.model_dir) if a.model_dir else work / "models"))
        spec = ClusterSpec(model=model, workdir=work, engines=a.engines, engine_blocks=blocks, block_tokens=bt,
                           max_model_len=longest + 64, kvtier=kvtier)
        opts = ClusterBenchOptions(routers=routers, repeat=a.repeat, seed=a.seed, vocab=a.vocab or DEFAULT_VOCAB,
                                   timeout_s=a.url_timeout or 300.0, time_scale=a.time_scale)
        with Cluster(spec, routers, progress=progress) as cluster:
            doc = run_cluster_benchmark(cluster, opts, sessions, progress=progress)
    except (ClusterError, ServerError, ValueError) as exc:
        raise CliError(str(exc)) from None
    finally:
        if not a.data_dir:
            shutil.rmtree(work, ignore_errors=True)
    runs = doc.pop("_runs")
    doc["plots"] = []
    if a.plots:
        from kvtier.bench.live.plots import plot_ttft_cdf
        out = Path(a.plots)
        out.mkdir(parents=True, exist_ok=True)
        doc["plots"].append(str(plot_ttft_cdf(runs, out / "ttft_cdf.png", title=(
            f"{a.engines} engines, {doc['workload']['sessions']} sessions, K={a.repeat}: resume TTFT by router"))))
    if a.json:
        emit_json(doc)
    else:
        print_cluster_tables(doc)
    return 0


def _progress(a: argparse.Namespace):
    if a.json:
        return lambda m: None
    from kvtier.util.console import make_console
    con = make_console(stderr=True)
    return lambda m: con.print(m, style="dim")


def _report(a: argparse.Namespace, doc: dict) -> int:
    """Plots, then the JSON document or the tables, of either benchmark."""
    runs = doc.pop("_runs")
    for cell in doc["sweep"]:
        cell.pop("_runs", None)
    doc["plots"] = []
    if a.plots:
        from kvtier.bench.live.plots import plot_host_sweep, plot_ttft_cdf
        out = Path(a.plots)
        out.mkdir(parents=True, exist_ok=True)
        doc["plots"].append(str(plot_ttft_cdf(runs, out / "ttft_cdf.png", title=_title(doc))))
        if doc["sweep"]:
            doc["plots"].append(str(plot_host_sweep(sweep_cells(doc), out / "host_sweep.png", title=_title(doc))))
    if a.json:
        emit_json(doc)
    else:
        print_tables(doc)
    return 0


def sweep_cells(doc: dict) -> list[dict]:
    """The host sweep's cells, with the main ensemble's host size as one more
    where it ran every configuration of the sweep, smallest host tier first."""
    cells = list(doc["sweep"])
    names = set(cells[0]["configs"]) if cells else set()
    if names and names <= set(doc["configs"]):
        cells.append({"host_bytes": doc["sizes"]["host_bytes"],
                      "configs": {n: doc["configs"][n] for n in names}})
    return sorted(cells, key=lambda c: c["host_bytes"])


def _live_in_process(a: argparse.Namespace) -> int:
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
    if a.scale_to and a.nvme_gbps is not None:
        raise CliError("--nvme-gbps does not apply with --scale-to: the scale model sets kvtier's NVMe speed")
    sweep = tuple(float(x) for x in a.sweep_host.split(",")) if a.sweep_host else ()
    if any(not (f > 0 and math.isfinite(f)) for f in sweep):
        raise CliError("--sweep-host: shares must be numbers > 0")
    opts = LiveBenchOptions(configs=_names(a.configs, CONFIGS), repeat=a.repeat, seed=a.seed, model=model,
                            model_dir=a.model_dir, engine_fraction=a.engine_fraction or 0.25,
                            host_fraction=a.host_fraction or 0.25,
                            time_scale=a.time_scale, nvme_gbps=a.nvme_gbps, data_dir=a.data_dir,
                            host_fractions=sweep,
                            sweep_configs=_names(a.sweep_configs, ("eager", "breakeven")), scale_to=a.scale_to)
    sessions = _sessions(a)
    header = (lambda sm: None) if a.json else (lambda sm: print_scale(sm.as_dict()))
    try:
        doc = run_benchmark(opts, sessions, progress=_progress(a), header=header)
    except VllmMissing as exc:
        raise CliError(str(exc)) from None
    except ValueError as exc:
        raise CliError(str(exc)) from None
    return _report(a, doc)


def _title(doc: dict) -> str:
    w, e = doc["workload"], doc["engine"]
    engine = (f"{e['model']} at {e['url']}" if e.get("url")
              else f"{e['model_params'] / 1e6:.1f}M-param model")
    return _label(doc) + f"{w['sessions']} sessions, {w['resumes']} resumes, K={doc['repeat']}, {engine}"


def _label(doc: dict) -> str:
    """``"scale model of NODE: "`` before every title of a scale-model run, else nothing."""
    sm = doc.get("scale_model")
    return f"{sm['label']}: " if sm else ""


def print_scale(sm: dict, *, achieved: bool = False) -> None:
    """The scale model's table (``scale_model`` of the JSON document): per
    quantity at the mean paused context, the target's time, ours, and each as
    a ratio to its own prefill; ``achieved``: our prefill as the runs measured it."""
    from kvtier.util.console import fit_table, make_console
    con = make_console()
    rows = sm["achieved"] if achieved and "achieved" in sm else sm["rows"]
    columns = [(c, "left" if c in ("quantity", "ours: how") else "right") for c in (
        "quantity", "target ms", "ours ms", "target / prefill", "ours / prefill", "ours: how")]
    body = [[r["quantity"], f"{r['target_s'] * 1000:.3g}", f"{r['ours_s'] * 1000:.3g}", f"{r['target_ratio']:.4g}",
             f"{r['ours_ratio']:.4g}", r["how"]] for r in rows]
    when = "our prefill as the runs measured it" if achieved and "achieved" in sm else "calibrated before the runs"
    t, _ = fit_table(con, columns, body, drop=(), title=(
        f"{sm['label']}: {sm['model']} on {sm['node']}, a context of {sm['context_tokens']} tokens; "
        f"f = {sm['time_scale']:.3g} wall s per target s; {when}"))
    con.print(t)
    o = sm["ours"]
    con.print(f"prefill per 1k tokens: target {sm['target_prefill_ms_per_1k_tokens']:.3g} ms, ours "
              f"{o['prefill_ms_per_1k_tokens']:.3g} ms (median of {len(o['samples'])} prefill-only requests); "
              f"KV per token: target {sm['target_kv_bytes_per_token']:.0f} B, ours {o['kv_bytes_per_token']:.0f} B",
              style="dim")


def _ms(m: float, se: float | None) -> str:
    if m is None or (isinstance(m, float) and math.isnan(m)):
        return "-"
    return f"{m * 1000:.0f} ± {se * 1000:.0f}" if se is not None and not math.isnan(se) else f"{m * 1000:.0f}"


def print_tables(doc: dict) -> None:
    from kvtier.util.console import fit_table, make_console
    con = make_console()
    mib = 2 ** 20
    if doc["engine"].get("url"):
        _print_server(con, doc)
    else:
        _print_in_process(con, doc)
    if doc.get("scale_model"):
        print_scale(doc["scale_model"], achieved=True)
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
                     f"{(m['engine_bytes'] + m['dram_bytes']) / mib:.1f}" if "engine_bytes" in m else "-",
                     f"{m['recomputed_tokens']:.0f}", f"{m['misses']:.1f}",
                     f"{served.get('host', 0):.0f}/{served.get('nvme', 0):.0f}" if served else "-",
                     {True: "yes", False: "NO", None: "-"}[m["outputs_equal"]]])
    title = f"{_label(doc)}mean ± SE over {doc['repeat']} interleaved repeats"
    if doc["engine"].get("url"):   # one configuration: nothing to compare with, sizes the server's own
        keep = [i for i, (c, _) in enumerate(columns) if c not in ("p99/resident", "engine+DRAM MiB")]
        columns, rows = [columns[i] for i in keep], [[r[i] for i in keep] for r in rows]
        title = f"mean ± SE over {doc['repeat']} repeats; outputs equal: every repeat's to the first's"
    t, _ = fit_table(con, columns, rows, drop=("served host/nvme", "misses", "recomputed tok"), title=title)
    con.print(t)
    _print_paired(con, doc["paired"], doc["reference"], label=_label(doc))
    for cell in doc["sweep"]:
        con.print(f"[bold]{_label(doc)}host tier {cell['host_bytes'] / mib:.2f} MiB[/bold] "
                  + "; ".join(f"{n}: p50 {_ms(m['resume_ttft_p50_s'], m['resume_ttft_p50_s_se'])} ms, p99 "
                              f"{_ms(m['resume_ttft_p99_s'], m['resume_ttft_p99_s_se'])} ms, JCT {m['jct_mean_s']:.2f} s"
                              for n, m in cell["configs"].items()))
        _print_paired(con, cell["paired"], doc["reference"], label=_label(doc))
    for p in doc["plots"]:
        con.print(f"plot: {p}")


def _print_server(con, doc: dict) -> None:
    e, w = doc["engine"], doc["workload"]
    pf = e["prefill_ms_per_1k_tokens"]
    con.print(f"[bold]engine[/bold] vLLM {e['vllm'] or '(version not told)'} at {e['url']}, model {e['model']}, "
              f"block {e['block_tokens']} tokens, prefill "
              f"{f'{pf:.0f}' if pf is not None else '-'} ms per 1k tokens (client-measured TTFT)")
    con.print(f"[bold]workload[/bold] {w['sessions']} sessions, {w['resumes']} resumes, paused working set "
              f"{w['paused_working_set_tokens']} tokens, token ids below {w['vocab']}")
    if not e["kvtier_metrics"]:
        con.print("the server's /metrics has no kvtier counters (no kvtier connector there)", style="dim")


def _print_in_process(con, doc: dict) -> None:
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


def _print_paired(con, pair: dict, ref: str, *, label: str = "") -> None:
    from kvtier.util.console import fit_table
    if not pair:
        return
    shown = [("Δ p50 ms", "resume_ttft_p50_s", 1000, "{:+.0f} ± {:.0f}"),
             ("Δ p99 ms", "resume_ttft_p99_s", 1000, "{:+.0f} ± {:.0f}"),
             ("Δ JCT s", "jct_mean_s", 1, "{:+.2f} ± {:.2f}"), ("Δ engine busy s", "engine_busy_s", 1, "{:+.2f} ± {:.2f}")]
    if all("resume_kvtier_cpu_s" in d for d in pair.values()):
        shown.append(("Δ kvtier CPU ms/resume", "resume_kvtier_cpu_s", 1000, "{:+.1f} ± {:.1f}"))
    columns = [(c, "left" if c == "config" else "right") for c in ("config", *(h for h, *_ in shown))]
    mark = {-1: " (resolved: lower)", 1: " (resolved: higher)", 0: ""}
    rows = []
    for n, d in pair.items():
        cells = []
        for _, k, scale, fmt in shown:
            x = d[k]
            cells.append(fmt.format(x["mean"] * scale, (x["se"] if not math.isnan(x["se"]) else 0) * scale)
                         + mark[x["resolved"]])
        rows.append([n, *cells])
    t, _ = fit_table(con, columns, rows, drop=(), title=f"{label}paired differences: config - {ref} (mean ± SE)")
    con.print(t)
