"""The live agent benchmark: configurations x repeats on an in-process vLLM engine.

    opts = LiveBenchOptions(repeat=5)
    doc = run_benchmark(opts, sessions)       # sessions: workload.fit_trace(...)

Every repeat runs every configuration once, in an order rotated per repeat
(interleaved: a slow moment of the shared machine falls on different
configurations), each on a fresh engine and a fresh store, with the same
workload and the repeat's own token ids.  ``recompute`` runs first in each
repeat's order when present, and its greedy outputs are the reference every
other configuration's are compared with.

Sizes follow the workload unless given: the small engine cache holds
``engine_fraction`` of the paused working set (at least one whole context),
``resident`` holds all of it, kvtier's host frames ``host_fraction`` of it,
vLLM's CPU tier in front of kvtier ``cpu_blocks`` blocks or one whole context
if that is more (a smaller one cannot take a request's store), and
``vllm-cpu-tier`` gets the same DRAM as kvtier's configurations.

With ``scale_to`` the run is a scale model of that node (:mod:`.scale`): a
throwaway engine is calibrated first, the workload's arrivals and waits are
stretched by the factor f, and every connector configuration gets the
scale model's settings; the document's ``scale_model`` says so.
"""
from __future__ import annotations

import math
import shutil
import sys
import tempfile
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable, Sequence

from kvtier.bench.live.configs import CONFIGS, Sizes, checked_name, spec_for
from kvtier.bench.live.driver import drive
from kvtier.bench.live.ensemble import config_row, paired
from kvtier.bench.live.runs import RunSummary, summarize
from kvtier.bench.live.scale import ScaleModel, calibrate, calibration_contexts, scale_model, target
from kvtier.bench.live.thread_cpu import TurnMeter
from kvtier.bench.live.workload import (LiveSession, describe, paused_contexts, paused_working_set,
                                        scale_times)
from kvtier.engine_adapter.tiny_model import TinyModel

BENCH_MODEL = TinyModel(layers=4, hidden=512, heads=8, kv_heads=2, intermediate=1408, vocab=1024)
"""12.3 M parameters, 4 KiB of fp32 KV per token: a 1k-token prefill costs ~0.2 s on one shared core."""
BLOCK_TOKENS = 32
FRESH_SWITCH_INTERVAL = 0.005   # CPython's default: every run starts as a fresh engine process (kvtier's plugin lowers it)


@dataclass(frozen=True)
class LiveBenchOptions:
    configs: Sequence[str] = CONFIGS
    repeat: int = 1
    seed: int = 0
    model: TinyModel = BENCH_MODEL
    model_dir: str | None = None
    engine_fraction: float = 0.25
    host_fraction: float = 0.25
    cpu_blocks: int = 16
    time_scale: float = 1.0
    nvme_gbps: float | None = None      # kvtier's NVMe tier throttled to this (None: the disk's speed)
    reference: str = "breakeven"
    data_dir: str | None = None
    keep_runs: bool = False
    host_fractions: Sequence[float] = field(default_factory=tuple)   # the host-tier sweep
    sweep_configs: Sequence[str] = ("eager", "breakeven")
    scale_to: str | None = None         # a scale model of this node (bench/live/scale.py TARGETS)


def sizes_for(sessions: Sequence[LiveSession], opts: LiveBenchOptions, *, host_fraction: float | None = None) -> Sizes:
    """The memory of every configuration for ``sessions`` (module doc)."""
    block_bytes = opts.model.kv_bytes_per_token() * BLOCK_TOKENS
    ws_blocks = math.ceil(paused_working_set(sessions) / BLOCK_TOKENS)
    ctx_blocks = math.ceil(max(s.final_context() for s in sessions) / BLOCK_TOKENS) + 2
    hf = opts.host_fraction if host_fraction is None else host_fraction
    engine = max(ctx_blocks + 2, math.ceil(opts.engine_fraction * ws_blocks))
    resident = ws_blocks + ctx_blocks + 8
    total = sum(math.ceil(s.final_context() / BLOCK_TOKENS) for s in sessions)
    return Sizes(engine_blocks=engine, resident_blocks=resident, block_bytes=block_bytes,
                 cpu_bytes=max(opts.cpu_blocks, ctx_blocks) * block_bytes, host_bytes=max(block_bytes, int(hf * ws_blocks * block_bytes)),
                 nvme_bytes=max(64 << 20, 4 * total * block_bytes))


def _params(hints: bool):
    if not hints:
        return lambda s, k: None
    return lambda s, k: {"kvtier": {"tool": s.turns[k].tool or "final", "trajectory_id": s.sid}}


def run_one(name: str, sessions: Sequence[LiveSession], *, model: str, sizes: Sizes, repeat: int,
            opts: LiveBenchOptions, root: Path, scale: ScaleModel | None = None) -> RunSummary:
    """One configuration, one repeat, on a fresh engine and store under ``root``
    (``scale``: the scale model's settings, None: the engine as it is)."""
    from kvtier.engine_adapter.vllm_inprocess import LiveEngine
    data = root / f"{name}-r{repeat}"
    max_len = min((sizes.engine_blocks - 1) * BLOCK_TOKENS, opts.model.max_positions)
    spec, hints = spec_for(name, model=model, sizes=sizes, data_dir=data, max_model_len=max_len,
                           time_scale=opts.time_scale, nvme_gbps=opts.nvme_gbps, scale=scale)
    was = sys.getswitchinterval()
    sys.setswitchinterval(FRESH_SWITCH_INTERVAL)
    try:
        with LiveEngine(spec) as eng:
            run = drive(eng, sessions, seed=opts.seed * 1000 + repeat, vocab=opts.model.vocab, params=_params(hints),
                        meter=TurnMeter())
            swi = sys.getswitchinterval()
            eng.settle()
            stats = eng.kvtier_stats()
            priced = priced_node(eng.kvtier())
    finally:
        sys.setswitchinterval(was)
        if not opts.keep_runs:
            shutil.rmtree(data, ignore_errors=True)
    s = summarize(name, repeat, run, block_tokens=BLOCK_TOKENS, kvtier_stats=stats)
    return replace(s, notes={**s.notes, "switch_interval_ms": swi * 1e3, **({"priced": priced} if priced else {})})


def priced_node(tier) -> dict | None:
    """The speeds kvtier's policy priced this run's pauses with (measured at the
    tier's start, :func:`kvtier.engine_adapter.geometry.measure_node`), or None."""
    node = getattr(getattr(tier, "pricing", None), "node", None)
    if node is None:
        return None
    return {"nvme_read_gbps": node.nvme_read_bps / 1e9, "nvme_write_gbps": node.nvme_write_bps / 1e9,
            "link_gbps": node.link_h2d_bps / 1e9, "prefill_tflops": node.prefill_flops / 1e12,
            "host_bytes": node.host_bytes, "source": tier.pricing.source}


def ensemble(names: Sequence[str], sessions: Sequence[LiveSession], *, model: str, sizes: Sizes,
             opts: LiveBenchOptions, root: Path, progress: Callable[[str], None] = lambda m: None,
             scale: ScaleModel | None = None) -> dict:
    """Every configuration in ``names`` x ``opts.repeat``, interleaved; the JSON
    document's ``configs`` and ``paired`` parts and the raw runs."""
    names = list(names)
    order0 = (["recompute"] if "recompute" in names else []) + [n for n in names if n != "recompute"]
    runs: dict[str, list[RunSummary]] = {n: [] for n in names}
    for rep in range(opts.repeat):
        rest = order0[1:] if order0[:1] == ["recompute"] else order0
        k = rep % max(1, len(rest))
        order = order0[:len(order0) - len(rest)] + rest[k:] + rest[:k]
        for n in order:
            progress(f"repeat {rep + 1}/{opts.repeat}: {n}")
            runs[n].append(run_one(n, sessions, model=model, sizes=sizes, repeat=rep, opts=opts, root=root,
                                   scale=scale))
    ref_out = {r.repeat: r.outputs for r in runs["recompute"]} if "recompute" in runs else None
    configs = {n: {**config_row(rs, ref_out), "engine_bytes": sizes.engine_bytes(n), "dram_bytes": sizes.dram_bytes(n)}
               for n, rs in runs.items()}
    pair = {n: paired(rs, runs[opts.reference]) for n, rs in runs.items()
            if opts.reference in runs and n != opts.reference}
    return {"configs": configs, "paired": pair, "runs": runs}


def run_benchmark(opts: LiveBenchOptions, sessions: Sequence[LiveSession], *,
                  progress: Callable[[str], None] = lambda m: None,
                  header: Callable[[ScaleModel], None] = lambda sm: None) -> dict:
    """The whole benchmark (module doc): the main ensemble and, with
    ``opts.host_fractions``, the host-tier sweep; with ``opts.scale_to``, the
    calibration first (``header`` is shown the scale model before the runs).
    Returns the JSON document plus ``"_runs"`` (raw runs, for the plots;
    dropped before printing JSON).  Raises VllmMissing when no vLLM can run
    here, ValueError for an unknown configuration or scale-model target."""
    for n in list(opts.configs) + list(opts.sweep_configs if opts.host_fractions else ()):
        checked_name(n)         # before vLLM starts
    if opts.scale_to is not None:
        target(opts.scale_to)
    from kvtier.engine_adapter.vllm_inprocess import require_live_vllm
    version = require_live_vllm()
    from kvtier.engine_adapter.tiny_model import build_tiny_model
    mdir = Path(opts.model_dir) if opts.model_dir else Path(tempfile.gettempdir()) / "kvtier-live-models"
    model = str(build_tiny_model(mdir, opts.model))
    root = Path(opts.data_dir) if opts.data_dir else Path(tempfile.mkdtemp(prefix="kvtier-live-"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        sizes = sizes_for(sessions, opts)
        scale = None
        if opts.scale_to is not None:
            progress(f"calibrating this engine for the scale model of {opts.scale_to}")
            scale = calibrated(opts, sessions, model=model, sizes=sizes)
            header(scale)
            sessions = scale_times(sessions, scale.f)
        main = ensemble(opts.configs, sessions, model=model, sizes=sizes, opts=opts, root=root, progress=progress,
                        scale=scale)
        sweep = []
        for hf in opts.host_fractions:
            sz = sizes_for(sessions, opts, host_fraction=hf)
            o = replace(opts, configs=tuple(opts.sweep_configs))
            e = ensemble(o.configs, sessions, model=model, sizes=sz, opts=o, root=root,
                         progress=lambda m, hf=hf: progress(f"host {hf:g}: {m}"), scale=scale)
            sweep.append({"host_fraction": hf, "host_bytes": sz.host_bytes, "configs": e["configs"],
                          "paired": e["paired"], "_runs": e["runs"]})
    finally:
        if opts.data_dir is None:
            shutil.rmtree(root, ignore_errors=True)
    pf = [r.prefill_ms_per_1k for rs in main["runs"].values() for r in rs if r.prefill_ms_per_1k is not None]
    ws = paused_working_set(sessions)
    doc = {
        "engine": {"vllm": version, "in_process": True, "model_params": opts.model.params(),
                   "model": {k: v for k, v in asdict(opts.model).items() if k != "seed"},
                   "kv_bytes_per_token": opts.model.kv_bytes_per_token(), "block_tokens": BLOCK_TOKENS,
                   "prefill_ms_per_1k_tokens": sum(pf) / len(pf) if pf else None,
                   "vllm_cpu_tier_worker": "kvtier's CPU copy worker (vLLM's own refuses the CPU platform)"},
        "workload": {**describe(sessions, time_scale=opts.time_scale * (scale.f if scale else 1.0)),
                     "paused_working_set_bytes": ws * opts.model.kv_bytes_per_token()},
        "sizes": {**asdict(sizes), "nvme_throttle_gbps": scale.nvme_gbps if scale else opts.nvme_gbps},
        "repeat": opts.repeat, "reference": opts.reference,
        "configs": main["configs"], "paired": main["paired"],
        "sweep": sweep, "_runs": main["runs"],
    }
    if scale is not None:
        pf_mean = doc["engine"]["prefill_ms_per_1k_tokens"]
        doc["scale_model"] = scale.as_dict(run_prefill_s_per_1k=pf_mean / 1000 if pf_mean else None)
    return doc


def calibrated(opts: LiveBenchOptions, sessions: Sequence[LiveSession], *, model: str, sizes: Sizes) -> ScaleModel:
    """The scale model of ``opts.scale_to`` for this engine: calibrated on a
    throwaway ``recompute`` engine at the workload's paused contexts, its
    per-context rows at their mean."""
    paused = paused_contexts(sessions)
    max_len = min((sizes.engine_blocks - 1) * BLOCK_TOKENS, opts.model.max_positions)
    spec, _ = spec_for("recompute", model=model, sizes=sizes, data_dir=Path(tempfile.gettempdir()),
                       max_model_len=max_len)
    was = sys.getswitchinterval()
    sys.setswitchinterval(FRESH_SWITCH_INTERVAL)
    try:
        cal = calibrate(spec, [min(n, max_len - 1) for n in calibration_contexts(paused)],
                        vocab=opts.model.vocab, seed=opts.seed)
    finally:
        sys.setswitchinterval(was)
    return scale_model(opts.scale_to, cal, context_tokens=round(sum(paused) / len(paused)))
