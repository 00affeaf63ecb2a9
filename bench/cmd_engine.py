"""``kvtier bench engine``: an agent trace replayed through the real engine classes.

vLLM: its ``TieringOffloadingManager`` with kvtier as the secondary tier (or
vLLM's own fs tier); SGLang: its storage interface over a ``page_first`` host
pool.  Real store I/O on real bytes, tool returns in scaled real time, hints
carrying tool names so the predictor learns online.  See docs/engines.md.
"""
from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

from kvtier.bench.engine_replay import BYTES_PER_TOKEN
from kvtier.util.args import ensure_dir, pos_float, pos_int
from kvtier.util.cmd import CliError, CommandGroups, add_json_flag, emit_json
from kvtier.util.preset_args import add_model_flag, add_node_flag

DEFAULT_POLICIES = {"vllm": "breakeven,lru,ttl,fs", "sglang": "breakeven,lru,ttl"}
PRIMARY_CHUNKS = 256      # vLLM's CPU primary tier, kept small so resumes come through the secondary tier
GB = 1e9


def register(groups: CommandGroups) -> None:
    p = groups.bench.add_parser(
        "engine", help="replay an agent trace through the real vLLM / SGLang classes with kvtier's lifecycle",
        description="Replay an agent trace through vLLM's offloading manager or SGLang's storage backend on "
                    "CPU, with real store I/O and bytes, per policy; report where resumes were served from, "
                    "their load times and whether every byte came back.")
    p.add_argument("--engine", choices=("vllm", "sglang"), required=True, help="the engine whose classes run")
    p.add_argument("--trace", required=True, metavar="FILE",
                   help="agent trace, JSON Lines (kvtier bench trace mooncake|tracelab|synth writes one)")
    p.add_argument("--sessions", type=pos_int, default=150, help="replay the first N sessions by arrival (default 150)")
    p.add_argument("--time-scale", type=pos_float, default=0.02,
                   help="multiply every trace time, arrivals and waits, by this (default 0.02)")
    p.add_argument("--policies", default=None, metavar="A,B,...",
                   help="comma-separated: tiering policies (breakeven, ...) and baselines lru, ttl, fs (vLLM's own "
                        "tier; --engine vllm); default breakeven,lru,ttl (+fs for vllm)")
    p.add_argument("--host-gb", type=pos_float, default=None,
                   help="kvtier host frames, GB (default: a quarter of the peak bytes of paused sessions)")
    p.add_argument("--nvme-gb", type=pos_float, default=None,
                   help="kvtier NVMe tier, GB (default: room for every distinct block twice over)")
    p.add_argument("--bytes-per-token", type=pos_int, default=BYTES_PER_TOKEN,
                   help=f"replay KV bytes per token (default {BYTES_PER_TOKEN}: a chunk of 64 tokens is "
                        f"128 KiB, enough that where a resume is served from shows in its load time)")
    p.add_argument("--chunk-tokens", type=pos_int, default=64,
                   help="tokens per stored block: vLLM chunk / SGLang page (default 64)")
    add_model_flag(p, default="llama-3.1-8b", purpose="the model preset the policy prices pauses as")
    add_node_flag(p, default="pcie5-x16", purpose="the hardware preset the policy prices on")
    p.add_argument("--data-dir", default=None, metavar="DIR",
                   help="where the stores live (default: a temporary directory, removed afterwards)")
    add_json_flag(p)
    p.set_defaults(handler=_engine)


def _names(a: argparse.Namespace) -> list[str]:
    names = [x.strip() for x in (a.policies or DEFAULT_POLICIES[a.engine]).split(",") if x.strip()]
    if not names:
        raise CliError("--policies names no policy")
    if len(set(names)) != len(names):
        raise CliError("--policies repeats a name")
    return names


def _workload(a: argparse.Namespace):
    from kvtier.bench.engine_replay.workload import Geometry, Workload
    from kvtier.bench.sim.trace import TraceError, read_trace
    try:
        trace = read_trace(a.trace)
    except TraceError as exc:
        raise CliError(f"--trace {a.trace}: {exc}") from None
    except OSError as exc:
        raise CliError(f"--trace: cannot read {a.trace!r}: {exc.strerror or exc}") from None
    if a.bytes_per_token % 8:
        raise CliError(f"--bytes-per-token must be a multiple of 8, got {a.bytes_per_token}")
    if a.chunk_tokens % 16:
        raise CliError(f"--chunk-tokens must be a multiple of 16 (vLLM's block), got {a.chunk_tokens}")
    sessions = sorted(trace.sessions, key=lambda s: (s.arrival_s, s.id))[:a.sessions]
    work = Workload.build(sessions, Geometry(a.bytes_per_token, a.chunk_tokens))
    if not work.resumes:
        raise CliError(f"--trace {a.trace}: the first {a.sessions} sessions never resume (no tool pauses)")
    return work


def _engine(a: argparse.Namespace) -> int:
    from kvtier.bench.engine_replay.setups import setup_of
    names = _names(a)
    work = _workload(a)
    from kvtier.bench.engine_replay.workload import Geometry
    geo = Geometry(a.bytes_per_token, a.chunk_tokens)
    host_gb = a.host_gb if a.host_gb is not None else max(work.peak_paused_bytes / 4, geo.chunk_bytes * 64) / GB
    nvme_gb = a.nvme_gb if a.nvme_gb is not None else 2 * work.distinct_bytes / GB + 0.01
    try:
        setups = [setup_of(n, a.engine, host_gb=host_gb, nvme_gb=nvme_gb, time_scale=a.time_scale,
                           model=a.model, node=a.node) for n in names]
        from kvtier.tiering.model.presets import get_node, get_preset
        get_preset(a.model), get_node(a.node)
    except ValueError as exc:
        raise CliError(f"--policies/--model/--node: {exc}") from None
    root = Path(ensure_dir(a.data_dir, "--data-dir")) if a.data_dir else Path(tempfile.mkdtemp(prefix="kvtier-engine-"))
    try:
        results = _run_all(a, setups, work, geo, root)
    finally:
        if not a.data_dir:
            shutil.rmtree(root, ignore_errors=True)
    doc = {"engine": a.engine,
           "config": {"bytes_per_token": geo.bytes_per_token, "chunk_tokens": geo.chunk_tokens,
                      "chunk_bytes": geo.chunk_bytes, "host_bytes": int(host_gb * GB), "nvme_bytes": int(nvme_gb * GB),
                      "peak_paused_bytes": work.peak_paused_bytes, "distinct_bytes": work.distinct_bytes,
                      "sessions": work.sessions, "resumes": work.resumes, "time_scale": a.time_scale,
                      "policy_model": a.model, "policy_node": a.node, "trace": Path(a.trace).name,
                      **({"vllm_primary_bytes": PRIMARY_CHUNKS * geo.chunk_bytes} if a.engine == "vllm" else {})},
           "policies": {n: r.as_dict() for n, r in results.items()}}
    if a.json:
        emit_json(doc)
    else:
        _table(doc)
    return 0


def _make(a, setup, work, geo, root: Path):
    d = root / setup.name
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    if a.engine == "vllm":
        from kvtier.bench.engine_replay.vllm_side import VllmReplay
        return VllmReplay(geo, d, kvtier_opts=setup.kvtier_opts, primary_chunks=PRIMARY_CHUNKS, hints=setup.hints)
    from kvtier.bench.engine_replay.sglang_side import SglangReplay
    return SglangReplay(geo, d, kvtier_opts=setup.kvtier_opts, max_pages=work.max_context_chunks, hints=setup.hints)


def _run_all(a, setups, work, geo, root: Path) -> dict:
    from kvtier.util.console import make_console as Console  # width rules: pipes not cut
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from kvtier.bench.engine_replay.runner import replay
    con = Console(stderr=True)
    out = {}
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=con, transient=True, disable=a.json or not con.is_terminal) as prog:
        task = prog.add_task("engine", total=len(work.steps) * len(setups))
        for s in setups:
            prog.update(task, description=f"{a.engine} {s.name}")
            eng = _make(a, s, work, geo, root)
            try:
                out[s.name] = replay(eng, work, a.time_scale, on_step=lambda: prog.advance(task))
            finally:
                eng.close()
    return out


def _table(doc: dict) -> None:
    from kvtier.util.console import make_console as Console  # width rules: pipes not cut
    from rich.table import Table
    c = doc["config"]
    t = Table(title=f"kvtier bench engine --engine {doc['engine']}: {c['sessions']} sessions, "
                    f"{c['resumes']} resumes, time scale {c['time_scale']:g}")
    for col in ("policy", "host", "nvme", "miss", "p50 load", "p99 load", "wrote", "read", "exact"):
        t.add_column(col, justify="left" if col == "policy" else "right", no_wrap=col == "policy")
    for n, r in doc["policies"].items():
        sv = r["served"]
        t.add_row(n, str(sv["host"]), str(sv["nvme"]), str(sv["miss"]), _ms(r["load_p50_s"]), _ms(r["load_p99_s"]),
                  _mb(r["bytes_written"]), _mb(r["bytes_read"]), "yes" if r["bit_exact"] else "NO")
    con = Console()
    con.print(t)
    con.print("host / nvme / miss: resumes served from DRAM (vLLM's CPU tier or kvtier's host frames), "
              "from NVMe (or vLLM's fs tier), or not found; load: the wall time of the resume's engine calls "
              "(vLLM: not the worker's copy to the GPU, an asynchronous DMA there).", highlight=False)
    con.print(f"{c['bytes_per_token']} B/token, {c['chunk_bytes'] // 1024} KiB blocks; kvtier host "
              f"{_mb(c['host_bytes'])} (peak paused {_mb(c['peak_paused_bytes'])}), NVMe {_mb(c['nvme_bytes'])}; "
              f"policy prices pauses as {c['policy_model']} on {c['policy_node']}.", highlight=False)


def _ms(s) -> str:
    return "-" if s is None else f"{s * 1e3:.1f} ms"


def _mb(b) -> str:
    return f"{b / 1e6:.1f} MB"
