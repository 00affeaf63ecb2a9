"""``kvtier plan capacity | breakeven | paging | sharing``: the cost model on the command line.

Thin layer over ``kvtier.tiering.model.costmodel``, ``kvtier.tiering.model.capacity``, ``kvtier.tiering.model.paging``
and ``kvtier.tiering.model.presets``: parse flags, call the pure functions, print one JSON
document (``--json``) or rich tables.  GB means 10**9 bytes; GB/s 10**9 B/s;
TFLOP/s 10**12 FLOP/s.  Bad input exits 2 with one line (argparse type errors,
or ValueError from the domain code via ``kvtier.cli.main.main``).
"""
from __future__ import annotations

import argparse
import math
import sys
from dataclasses import replace
from typing import Any

from kvtier.util.args import add_rate_flag, fraction, nonneg_float, nonneg_int, png_path, pos_float, pos_int, share
from kvtier.util.cmd import CliError, CommandGroups, add_json_flag, emit_json
from kvtier.util.preset_args import add_model_flag, add_node_flag

# ---------------------------------------------------------------------------
# result checks


def _check_finite(doc: Any, where: str = "") -> None:
    """Raise CliError naming the first result that overflowed (inf/nan), e.g. from --wait 1e308.

    JSON has no infinity, so such a document could not be emitted; a table would show nonsense."""
    if isinstance(doc, float) and not math.isfinite(doc):
        raise CliError(f"result {where or 'value'} is {doc}: an input is out of range (too large or too small)")
    if isinstance(doc, dict):
        for k, v in doc.items():
            _check_finite(v, f"{where}.{k}" if where else str(k))
    elif isinstance(doc, (list, tuple)):
        for i, v in enumerate(doc):
            _check_finite(v, f"{where}[{i}]")


# ---------------------------------------------------------------------------
# shared flag groups


def _add_geometry(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model geometry (a preset, or every field; explicit flags override the preset)")
    add_model_flag(g, default=None, purpose="the model preset")
    g.add_argument("--layers", type=pos_int, help="transformer layers L")
    g.add_argument("--kv-heads", type=pos_int, help="key-value heads H_kv")
    g.add_argument("--head-dim", type=pos_int, help="head dimension d_head")
    g.add_argument("--dtype-bytes", type=pos_float, help="bytes per stored KV element (2 = bf16, 1 = FP8); default 2")
    g.add_argument("--params", type=pos_float, help="parameter count, e.g. 70e9 (recompute is 2*P FLOPs per token)")
    g.add_argument("--active-params", type=pos_float, help="MoE: parameters active per token (recompute uses them)")
    g.add_argument("--mla-latent-dim", type=pos_int, help="MLA: cached latent width per layer (e.g. 576)")
    g.add_argument("--d-model", type=pos_int, help="hidden size (only for the quadratic attention term)")


def _geometry(args: argparse.Namespace, params_unused: bool = False, params_or: str = ""):
    """The model geometry from ``--model`` and the explicit fields.

    ``params_unused``: the command does not use the parameter count (``plan capacity`` given
    ``--weights-gb``), so a full geometry without ``--params`` is enough; ``params_or`` names the
    flag that would stand in for ``--params`` in the error."""
    from kvtier.tiering.model.costmodel import ModelGeometry
    from kvtier.tiering.model.presets import PRESETS

    fields = {"layers": args.layers, "kv_heads": args.kv_heads, "head_dim": args.head_dim,
              "dtype_bytes": args.dtype_bytes, "params": args.params, "active_params": args.active_params,
              "mla_latent_dim": args.mla_latent_dim, "d_model": args.d_model}
    given = {k: v for k, v in fields.items() if v is not None}
    if args.model is not None:
        from kvtier.tiering.model.presets import get_preset
        geom = replace(get_preset(args.model), **given)
        if "params" in given and "active_params" not in given and geom.active_params is not None \
                and geom.active_params > geom.params:
            geom = replace(geom, active_params=None)
        return geom
    if args.mla_latent_dim is not None:
        given.setdefault("kv_heads", 1)
        given.setdefault("head_dim", args.mla_latent_dim)
    needed = ("layers", "kv_heads", "head_dim") + (() if params_unused else ("params",))
    missing = [f"--{k.replace('_', '-')}" + (f" (or {params_or})" if k == "params" and params_or else "")
               for k in needed if k not in given]
    if missing:
        raise CliError(f"give --model PRESET or {' '.join(missing)} (known presets: {', '.join(PRESETS)})")
    given.setdefault("dtype_bytes", 2)
    given.setdefault("params", 1.0)   # only when params_unused: no figure reads it
    return ModelGeometry(name="custom", **given)


def _add_node(p: argparse.ArgumentParser) -> None:
    add_node_flag(p, purpose="the hardware preset that gives the node flags below their defaults")


def _node(args: argparse.Namespace):
    from kvtier.tiering.model.presets import DEFAULT_NODE, get_node
    name = args.node or DEFAULT_NODE
    return name, get_node(name)


# ---------------------------------------------------------------------------
# formatting for the tables


def _gb(n: float) -> str:
    return f"{n / 1e9:,.2f} GB"


def _secs(s: float | None) -> str:
    if s is None:
        return "-"
    if s < 1.0:
        return f"{s * 1e3:,.1f} ms"
    return f"{s:,.3f} s"


def _console():
    from kvtier.util.console import make_console
    return make_console()


def _kv_table(title: str, rows: list[tuple[str, str]]):
    from rich.table import Table
    t = Table(title=title, show_header=False, title_justify="left")
    t.add_column(style="bold")
    t.add_column(justify="right")
    for k, v in rows:
        t.add_row(k, v)
    return t


# ---------------------------------------------------------------------------
# kvtier plan capacity


def _capacity(args: argparse.Namespace) -> int:
    from kvtier.tiering.model.capacity import NodeBudget, capacity_table
    from kvtier.tiering.model.costmodel import GB

    geom = _geometry(args, params_unused=args.weights_gb is not None, params_or="--weights-gb")
    node_name, hw = _node(args)
    hbm = args.hbm_gb * GB if args.hbm_gb is not None else hw.hbm_bytes
    runtime = args.runtime_gb * GB if args.runtime_gb is not None else hw.runtime_bytes
    if args.weights_gb is not None:
        weights, weights_src = args.weights_gb * GB, "--weights-gb"
    else:
        weights, weights_src = geom.weights_bytes(args.weight_bytes), f"params x {args.weight_bytes:g} B"
    budget = NodeBudget(hbm_bytes=hbm, weights_bytes=weights, runtime_bytes=runtime,
                        activations_bytes=(args.activations_gb or 0.0) * GB)
    rows = capacity_table(geom, budget, args.context, output_tokens=args.output_tokens,
                          shared_tokens=args.shared_tokens, headroom=args.headroom)
    usable = budget.kv_pool_bytes * (1.0 - args.headroom)
    shared_bytes = geom.kv_bytes(args.shared_tokens)
    doc = {
        "model": geom.name,
        "node": node_name if args.hbm_gb is None and args.runtime_gb is None
        else f"custom (other figures from {node_name})",
        "m_token_bytes": geom.token_bytes,
        "hbm_bytes": hbm,
        "weights_bytes": weights,
        "runtime_bytes": runtime + budget.activations_bytes,
        "kv_pool_bytes": budget.kv_pool_bytes,
        "headroom": args.headroom,
        "usable_pool_bytes": usable,
        "output_tokens": args.output_tokens,
        "shared_tokens": args.shared_tokens,
        "shared_bytes": shared_bytes,
        "tp": args.tp,
        "per_device": {
            "m_token_bytes": geom.token_bytes / args.tp,
            "weights_bytes": weights / (args.tp * args.pp),
            "kv_pool_bytes": budget.kv_pool_bytes / (args.tp * args.pp),
        },
        "rows": [{"context_tokens": r.context_tokens, "bytes_per_trajectory": r.bytes_per_trajectory,
                  "concurrency": r.concurrency} for r in rows],
    }
    _check_finite(doc)
    if args.json:
        emit_json(doc)
        return 0
    from rich.table import Table
    con = _console()
    con.print(_kv_table(f"KV pool: {geom.name} on {doc['node']}", [
        ("KV bytes per token (m_token)", f"{geom.token_bytes:,} B"),
        ("HBM", _gb(hbm)),
        ("weights", f"{_gb(weights)}  ({weights_src})"),
        ("runtime + activations", _gb(doc["runtime_bytes"])),
        ("KV pool (HBM - weights - runtime)", _gb(budget.kv_pool_bytes)),
        (f"usable after {args.headroom:.0%} headroom", _gb(usable)),
        (f"shared prefix ({args.shared_tokens:,} tokens, stored once)", _gb(shared_bytes)),
    ]))
    t = Table(title=f"Concurrency ceiling (output {args.output_tokens:,} tokens per trajectory)",
              title_justify="left")
    for col in ("context tokens", "private KV per trajectory", "concurrent trajectories"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(f"{r.context_tokens:,}", _gb(r.bytes_per_trajectory), f"{r.concurrency:,}")
    con.print(t)
    return 0


# ---------------------------------------------------------------------------
# kvtier plan breakeven


def _breakeven(args: argparse.Namespace) -> int:
    from kvtier.tiering.model.costmodel import GB, TFLOP, hold_gb_s, price_pause, t_offload

    geom = _geometry(args)
    node_name, hw = _node(args)
    over: dict[str, float] = {}
    if args.link_gbps is not None:
        over["link_h2d_bps"] = over["link_d2h_bps"] = args.link_gbps * GB
    if args.link_d2h_gbps is not None:
        over["link_d2h_bps"] = args.link_d2h_gbps * GB
    if args.prefill_tflops is not None:
        over["prefill_flops"] = args.prefill_tflops * TFLOP
    if args.nvme_gbps is not None:
        over["nvme_read_bps"] = over["nvme_write_bps"] = args.nvme_gbps * GB
    if args.nvme_write_gbps is not None:
        if args.nvme_gbps is None:
            raise CliError("--nvme-write-gb-per-s needs --nvme-gb-per-s (the read bandwidth)")
        over["nvme_write_bps"] = args.nvme_write_gbps * GB
    hw = replace(hw, **over)
    price = price_pause(geom, args.context, hw, mu_hbm=args.mu_hbm, mu_dram=args.mu_dram, stall_s=args.stall_s,
                        quadratic=args.quadratic, nvme=args.nvme_gbps is not None,
                        nvme_max_share=args.nvme_max_share)
    waits = args.wait or []
    holds = [hold_gb_s(price.kv_bytes, w) for w in waits]
    decisions = [{"wait_s": w, "action": price.action(w)} for w in waits]
    doc = {
        "model": geom.name,
        "context_tokens": price.context_tokens,
        "kv_bytes": price.kv_bytes,
        "t_reload_s": price.t_reload_s,
        "t_offload_s": t_offload(price.kv_bytes, hw),
        "t_roundtrip_s": price.t_roundtrip_s,
        "t_recompute_s": price.t_recompute_s,
        "reload_speedup": price.reload_speedup,
        "breakeven_wait_s": price.breakeven_wait_s,
        "retain_until_s": price.retain_until_s,
        "t_nvme_roundtrip_s": price.t_nvme_roundtrip_s,
        "link_h2d_bps": hw.link_h2d_bps,
        "link_d2h_bps": hw.link_d2h_bps,
        "prefill_flops": hw.prefill_flops,
        "hold_gb_s": holds,
        "decisions": decisions,
    }
    _check_finite(doc)
    if args.json:
        emit_json(doc)
        return 0
    from rich.table import Table
    con = _console()
    con.print(_kv_table(f"One pause: {geom.name}, {price.context_tokens:,} tokens, node {node_name}", [
        ("KV state", _gb(price.kv_bytes)),
        (f"reload (host -> HBM at {hw.link_h2d_bps / GB:g} GB/s)", _secs(price.t_reload_s)),
        ("round trip (out and back)", _secs(price.t_roundtrip_s)),
        (f"recompute (prefill at {hw.prefill_flops / TFLOP:g} TFLOP/s"
         f"{', + attention term' if args.quadratic else ''})", _secs(price.t_recompute_s)),
        ("reload speedup vs recompute", f"{price.reload_speedup:,.1f}x"),
        (f"break-even wait (mu_hbm={args.mu_hbm:g}, mu_dram={args.mu_dram:g}, stall={args.stall_s:g} s)",
         _secs(price.breakeven_wait_s)),
        ("retain up to" + (" (recompute is cheaper than the round trip)"
                           if price.recompute_beats_roundtrip else ""), _secs(price.retain_until_s)),
        ("NVMe round trip (serial)", _secs(price.t_nvme_roundtrip_s)),
        ("offload_nvme from", _secs(price.offload_nvme_from_s())),
    ]))
    if waits:
        t = Table(title="Decisions (point estimate of the wait)", title_justify="left")
        for col in ("wait", "HBM held if retained", "action"):
            t.add_column(col, justify="right")
        for d, h in zip(decisions, holds):
            t.add_row(_secs(d["wait_s"]), f"{h:,.1f} GB*s", d["action"])
        con.print(t)
    return 0


# ---------------------------------------------------------------------------
# kvtier plan paging / sharing


def _paging(args: argparse.Namespace) -> int:
    from kvtier.tiering.model.paging import paged_vs_naive

    r = paged_vs_naive(args.lengths, args.block_size, args.max_seq_len)
    doc = {
        "block_size": r.block_size,
        "max_seq_len": r.max_seq_len,
        "total_actual_tokens": r.total_actual_tokens,
        "blocks": r.block_table_entries,
        "block_table_entries": r.block_table_entries,
        "paged_slots": r.paged_slots,
        "naive_slots": r.naive_slots,
        "paged_fragmentation_pct": r.paged_fragmentation_pct,
        "naive_fragmentation_pct": r.naive_fragmentation_pct,
        "memory_reduction_factor": r.memory_reduction_factor,
        "requests": [{"length": q.length, "blocks": q.blocks, "slots": q.slots, "waste": q.waste}
                     for q in r.requests],
    }
    _check_finite(doc)
    if args.json:
        emit_json(doc)
        return 0
    from rich.table import Table
    con = _console()
    t = Table(title=f"Paged blocks of {r.block_size} tokens vs {r.max_seq_len}-token contiguous reservations",
              title_justify="left")
    for col in ("request tokens", "blocks", "slots", "wasted slots"):
        t.add_column(col, justify="right")
    for q in r.requests:
        t.add_row(f"{q.length:,}", f"{q.blocks:,}", f"{q.slots:,}", f"{q.waste:,}")
    t.add_row("total " + f"{r.total_actual_tokens:,}", f"{r.block_table_entries:,}", f"{r.paged_slots:,}",
              f"{r.paged_slots - r.total_actual_tokens:,}", style="bold")
    con.print(t)
    con.print(_kv_table("Fragmentation", [
        ("paged fragmentation", f"{r.paged_fragmentation_pct:.2f}%"),
        (f"naive slots ({len(r.requests)} x {r.max_seq_len:,})", f"{r.naive_slots:,}"),
        ("naive fragmentation", f"{r.naive_fragmentation_pct:.2f}%"),
        ("memory reduction factor", f"{r.memory_reduction_factor:.2f}x"),
    ]))
    return 0


def _sharing(args: argparse.Namespace) -> int:
    from kvtier.tiering.model.paging import prefix_sharing

    r = prefix_sharing(args.prefix_tokens, args.suffix_tokens, args.requests, args.block_size)
    doc = {
        "prefix_tokens": r.prefix_tokens,
        "suffix_tokens": r.suffix_tokens,
        "requests": r.requests,
        "block_size": r.block_size,
        "prefix_blocks": r.prefix_blocks,
        "suffix_blocks": r.suffix_blocks,
        "blocks_per_request_unshared": r.prefix_blocks + r.suffix_blocks,
        "without_sharing_blocks": r.without_sharing_blocks,
        "with_sharing_blocks": r.with_sharing_blocks,
        "reduction_factor": r.reduction_factor,
        "shareable_prefix_blocks": r.shareable_prefix_blocks,
        "shareable_prefix_tokens": r.shareable_prefix_tokens,
        "shareable_prefix_pct": r.shareable_prefix_pct,
        "strict_with_sharing_blocks": r.strict_with_sharing_blocks,
        "prefill_tokens_saved": r.prefill_tokens_saved,
    }
    _check_finite(doc)
    if args.json:
        emit_json(doc)
        return 0
    con = _console()
    con.print(_kv_table(
        f"{r.requests:,} requests: {r.prefix_tokens:,}-token shared prefix + {r.suffix_tokens:,}-token suffix, "
        f"blocks of {r.block_size}", [
            ("prefix blocks ceil(P/B)", f"{r.prefix_blocks:,}"),
            ("suffix blocks per request ceil(U/B)", f"{r.suffix_blocks:,}"),
            ("without sharing", f"{r.without_sharing_blocks:,} blocks"),
            ("with sharing (prefix stored once)", f"{r.with_sharing_blocks:,} blocks"),
            ("reduction factor", f"{r.reduction_factor:.2f}x"),
            ("full prefix blocks floor(P/B)",
             f"{r.shareable_prefix_blocks:,} ({r.shareable_prefix_tokens:,} tokens, {r.shareable_prefix_pct:.1f}%)"),
            ("with sharing of full blocks only (unpadded prefix)", f"{r.strict_with_sharing_blocks:,} blocks"),
            ("prefill tokens skipped after the first request", f"{r.prefill_tokens_saved:,}"),
        ]))
    return 0


# ---------------------------------------------------------------------------
# kvtier plan presets / regimes


def _presets(args: argparse.Namespace) -> int:
    from kvtier.tiering.model.costmodel import GB, TFLOP
    from kvtier.tiering.model.presets import NODES, PRESETS

    models = [{"name": g.name, "layers": g.layers, "kv_heads": g.kv_heads, "head_dim": g.head_dim,
               "dtype_bytes": g.dtype_bytes, "params": g.params, "active_params": g.active_params,
               "mla_latent_dim": g.mla_latent_dim, "d_model": g.d_model, "m_token_bytes": g.token_bytes}
              for g in PRESETS.values()]
    nodes = [{"name": k, "hbm_bytes": h.hbm_bytes, "link_h2d_bps": h.link_h2d_bps, "link_d2h_bps": h.link_d2h_bps,
              "prefill_flops": h.prefill_flops, "nvme_read_bps": h.nvme_read_bps,
              "nvme_write_bps": h.nvme_write_bps, "runtime_bytes": h.runtime_bytes} for k, h in NODES.items()]
    if args.json:
        emit_json({"models": models, "nodes": nodes})
        return 0
    from rich.table import Table
    con = _console()
    t = Table(title="Model presets (KV in 16-bit unless --dtype-bytes)", title_justify="left")
    for col in ("name", "layers", "KV heads x dim", "params", "KV per token"):
        t.add_column(col, justify="right" if col != "name" else "left")
    for m in models:
        heads = f"MLA {m['mla_latent_dim']}" if m["mla_latent_dim"] else f"{m['kv_heads']} x {m['head_dim']}"
        params = f"{m['params'] / 1e9:g}B" + (f" ({m['active_params'] / 1e9:g}B active)" if m["active_params"] else "")
        t.add_row(m["name"], str(m["layers"]), heads, params, f"{m['m_token_bytes'] / 1024:g} KiB")
    con.print(t)
    t = Table(title="Node presets (node-wide figures)", title_justify="left")
    for col in ("name", "HBM", "host link each way", "prefill", "NVMe read / write", "runtime reserve"):
        t.add_column(col, justify="right" if col != "name" else "left")
    for n in nodes:
        t.add_row(n["name"], _gb(n["hbm_bytes"]), f"{n['link_h2d_bps'] / GB:g} GB/s",
                  f"{n['prefill_flops'] / TFLOP:g} TFLOP/s",
                  f"{n['nvme_read_bps'] / GB:g} / {n['nvme_write_bps'] / GB:g} GB/s", _gb(n["runtime_bytes"]))
    con.print(t)
    return 0


def _log_grid(lo: float, hi: float, n: int) -> list[float]:
    if n == 1:
        return [lo]
    return [lo * (hi / lo) ** (i / (n - 1)) for i in range(n)]


def _regimes(args: argparse.Namespace) -> int:
    from kvtier.tiering.model.costmodel import GB, OFFLOAD_NVME, RECOMPUTE, RETAIN, price_pause

    if args.plot:
        png_path(args.plot)
    geom = _geometry(args)
    node_name, hw = _node(args)
    over: dict[str, float] = {}
    if args.link_gbps is not None:
        over["link_h2d_bps"] = over["link_d2h_bps"] = args.link_gbps * GB
    if args.prefill_tflops is not None:
        over["prefill_flops"] = args.prefill_tflops * 1e12
    if args.nvme_gbps is not None:
        over["nvme_read_bps"] = over["nvme_write_bps"] = args.nvme_gbps * GB
    hw = replace(hw, **over)
    contexts = args.context or [int(round(c)) for c in _log_grid(1024, 1_048_576, 11)]
    waits = args.wait or _log_grid(1e-3, 86_400.0, 40)
    rows = []
    for c in contexts:
        price = price_pause(geom, c, hw, mu_hbm=args.mu_hbm, mu_dram=args.mu_dram, stall_s=args.stall_s,
                            quadratic=args.quadratic, nvme=args.nvme_gbps is not None,
                            nvme_max_share=args.nvme_max_share)
        rows.append({"context_tokens": c, "kv_bytes": price.kv_bytes, "breakeven_wait_s": price.breakeven_wait_s,
                     "retain_until_s": price.retain_until_s,
                     "t_recompute_s": price.t_recompute_s, "t_roundtrip_s": price.t_roundtrip_s,
                     "recompute_beats_roundtrip": price.recompute_beats_roundtrip,
                     "offload_nvme_from_s": price.offload_nvme_from_s(),
                     "actions": [price.action(w) for w in waits]})
    doc = {"model": geom.name, "node": node_name, "waits_s": waits, "rows": rows}
    _check_finite(doc)
    if args.plot:
        _plot_regimes(args.plot, geom.name, node_name, contexts, waits, rows,
                      (RETAIN, "offload_host", OFFLOAD_NVME, RECOMPUTE))
        doc["plot"] = args.plot
    if args.json:
        emit_json(doc)
        return 0
    from rich.table import Table
    con = _console()
    t = Table(title=f"Decision regimes: {geom.name} on {node_name} (point estimate of the wait)",
              title_justify="left")
    for col in ("context tokens", "KV state", "retain up to", "recompute", "offload_nvme from"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(f"{r['context_tokens']:,}", _gb(r["kv_bytes"]), _secs(r["retain_until_s"]),
                  _secs(r["t_recompute_s"]) + (" (wins)" if r["recompute_beats_roundtrip"] else ""),
                  _secs(r["offload_nvme_from_s"]) if r["offload_nvme_from_s"] is not None else "-")
    con.print(t)
    if args.plot:
        print(f"plot written to {args.plot}", file=sys.stderr)
    return 0


def _plot_regimes(path: str, model: str, node: str, contexts: list[int], waits: list[float],
                  rows: list[dict], order: tuple[str, ...]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap

    code = {a: i for i, a in enumerate(order)}
    grid = [[code[a] for a in r["actions"]] for r in rows]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    cmap = ListedColormap(["#d62728", "#2ca02c", "#1f77b4", "#ff7f0e"])
    ax.pcolormesh(waits, contexts, grid, cmap=cmap, vmin=-0.5, vmax=len(order) - 0.5, shading="nearest")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("tool wait (s)")
    ax.set_ylabel("context tokens at the pause")
    ax.set_title(f"kvtier plan regimes: {model} on {node}")
    from matplotlib.patches import Patch
    ax.legend(handles=[Patch(color=cmap(i), label=a) for i, a in enumerate(order)], loc="lower right", fontsize=8)
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=120)
    except OSError as exc:
        raise CliError(f"cannot write --plot {path!r}: {exc.strerror or exc}") from None
    finally:
        plt.close(fig)


# ---------------------------------------------------------------------------


def register(groups: CommandGroups) -> None:
    p = groups.plan.add_parser(
        "capacity", help="how many agent trajectories fit in a node's KV cache",
        description="How many trajectories fit in the KV pool: pool = HBM - weights - runtime, "
                    "headroom kept free, a shared prefix stored once. GB = 1e9 bytes. "
                    "Without --weights-gb the weights are params x --weight-bytes (node-wide). "
                    "The formulas: docs/plan.md.")
    _add_geometry(p)
    n = p.add_argument_group("node (defaults from --node)")
    _add_node(n)
    n.add_argument("--hbm-gb", type=pos_float, help="HBM of the whole node, GB")
    n.add_argument("--weights-gb", type=nonneg_float,
                   help="weights, GB (default: params x --weight-bytes, e.g. 70.6e9 x 2 = 141.2 GB)")
    n.add_argument("--weight-bytes", type=pos_float, default=2.0,
                   help="bytes per weight when --weights-gb is omitted (default 2)")
    n.add_argument("--runtime-gb", type=nonneg_float, help="runtime reserve (CUDA context, buffers), GB")
    n.add_argument("--activations-gb", type=nonneg_float, help="activation workspace, GB (default 0)")
    n.add_argument("--tp", type=pos_int, default=1, help="tensor-parallel degree, for the per-device figures")
    n.add_argument("--pp", type=pos_int, default=1, help="pipeline-parallel degree, for the per-device figures")
    w = p.add_argument_group("workload")
    w.add_argument("--context", type=pos_int, nargs="+", required=True, metavar="N",
                   help="context tokens per trajectory (one row each); includes the shared prefix")
    w.add_argument("--output-tokens", type=nonneg_int, default=0, help="output tokens per trajectory (K_avg)")
    w.add_argument("--shared-tokens", type=nonneg_int, default=0,
                   help="tokens of the context common to all trajectories, stored once (S_shared)")
    w.add_argument("--headroom", type=fraction, default=0.0, help="fraction of the KV pool kept free (e.g. 0.10)")
    add_json_flag(p)
    p.set_defaults(handler=_capacity)

    p = groups.plan.add_parser(
        "breakeven", help="price one pause: reload, round trip, recompute, break-even wait, decisions",
        description="Price one pause of an agent trajectory: keep its KV cache in HBM, copy it to host DRAM "
                    "or NVMe and back, or recompute it, and say which wins for each --wait. "
                    "The break-even wait T* = 2 M/B * mu_hbm/(mu_hbm - mu_dram) + stall. Rule per wait: retain if "
                    "wait <= T* (or, when recompute <= round trip, wait <= recompute + stall); else recompute if "
                    "recompute <= round trip; else offload_nvme if --nvme-gb-per-s is "
                    "given and the serial NVMe round trip is <= --nvme-max-share of the wait and < recompute; "
                    "else offload_host.")
    _add_geometry(p)
    n = p.add_argument_group("node (defaults from --node)")
    _add_node(n)
    add_rate_flag(n, "--link-gbps", type=pos_float, metavar="GB/S",
                  help="host link, gigabytes per second each way (node-wide)")
    add_rate_flag(n, "--link-d2h-gbps", type=pos_float, metavar="GB/S",
                  help="device->host gigabytes per second, if it differs from --link-gb-per-s")
    n.add_argument("--prefill-tflops", type=pos_float, help="sustained prefill TFLOP/s (node-wide)")
    add_rate_flag(n, "--nvme-gbps", type=pos_float, metavar="GB/S",
                  help="NVMe read gigabytes per second (and write, unless --nvme-write-gb-per-s); "
                                                       "enables the offload_nvme action")
    add_rate_flag(n, "--nvme-write-gbps", type=pos_float, metavar="GB/S", help="NVMe write gigabytes per second")
    w = p.add_argument_group("pause")
    w.add_argument("--context", type=pos_int, required=True, metavar="N", help="context tokens at the pause")
    w.add_argument("--wait", type=nonneg_float, nargs="+", metavar="S", help="tool waits to decide, seconds")
    w.add_argument("--mu-hbm", type=pos_float, default=1.0, help="HBM shadow price per byte-second (default 1)")
    w.add_argument("--mu-dram", type=nonneg_float, default=0.0, help="DRAM shadow price (default 0; < --mu-hbm)")
    w.add_argument("--stall-s", type=nonneg_float, default=0.0, help="tolerated resume stall, seconds")
    w.add_argument("--quadratic", action="store_true", help="add the 4 L S^2 d_model attention FLOPs to recompute")
    w.add_argument("--nvme-max-share", type=share, default=0.01,
                   help="offload_nvme needs its round trip <= this share of the wait (default 0.01)")
    add_json_flag(p)
    p.set_defaults(handler=_breakeven)

    p = groups.plan.add_parser(
        "paging", help="memory wasted by contiguous max-length reservations vs paged blocks",
        description="Fragmentation of paged allocation (ceil(len/B) blocks) vs one max-seq-len buffer per request.")
    p.add_argument("--lengths", type=pos_int, nargs="+", required=True, metavar="N", help="tokens per request")
    p.add_argument("--block-size", type=pos_int, required=True, metavar="B", help="tokens per block")
    p.add_argument("--max-seq-len", type=pos_int, required=True, metavar="N", help="contiguous reservation per request")
    add_json_flag(p)
    p.set_defaults(handler=_paging)

    p = groups.plan.add_parser(
        "sharing", help="KV blocks saved when requests share a prompt prefix",
        description="R requests with a P-token shared prefix and a U-token suffix: R*(ceil(P/B)+ceil(U/B)) blocks "
                    "unshared vs ceil(P/B) + R*ceil(U/B) shared; also the full-block-only count floor(P/B).")
    p.add_argument("--prefix-tokens", type=pos_int, required=True, metavar="P", help="shared prefix tokens")
    p.add_argument("--suffix-tokens", type=pos_int, required=True, metavar="U", help="private suffix tokens per request")
    p.add_argument("--requests", type=pos_int, required=True, metavar="R", help="number of requests")
    p.add_argument("--block-size", type=pos_int, required=True, metavar="B", help="tokens per block")
    add_json_flag(p)
    p.set_defaults(handler=_sharing)

    p = groups.plan.add_parser("presets", help="list the model and node presets",
                               description="Model geometries (published configs) and node profiles by name.")
    add_json_flag(p)
    p.set_defaults(handler=_presets)

    p = groups.plan.add_parser(
        "regimes", help="which action wins for each context length and tool wait (a map)",
        description="The point-estimate action of `plan breakeven` on a grid of contexts and waits; "
                    "optionally drawn to a PNG with --plot.")
    _add_geometry(p)
    n = p.add_argument_group("node (defaults from --node)")
    _add_node(n)
    add_rate_flag(n, "--link-gbps", type=pos_float, metavar="GB/S",
                  help="host link, gigabytes per second each way (node-wide)")
    n.add_argument("--prefill-tflops", type=pos_float, help="sustained prefill TFLOP/s (node-wide)")
    add_rate_flag(n, "--nvme-gbps", type=pos_float, metavar="GB/S",
                  help="NVMe gigabytes per second each way; enables offload_nvme")
    w = p.add_argument_group("grid and prices")
    w.add_argument("--context", type=pos_int, nargs="+", metavar="N",
                   help="context lengths (default: 1,024 .. 1,048,576, 11 log steps)")
    w.add_argument("--wait", type=nonneg_float, nargs="+", metavar="S",
                   help="waits, seconds (default: 1 ms .. 1 day, 40 log steps)")
    w.add_argument("--mu-hbm", type=pos_float, default=1.0, help="HBM shadow price (default 1)")
    w.add_argument("--mu-dram", type=nonneg_float, default=0.0, help="DRAM shadow price (default 0)")
    w.add_argument("--stall-s", type=nonneg_float, default=0.0, help="tolerated resume stall, seconds")
    w.add_argument("--quadratic", action="store_true", help="add the attention term to recompute")
    w.add_argument("--nvme-max-share", type=share, default=0.01, help="see `plan breakeven` (default 0.01)")
    w.add_argument("--plot", metavar="FILE.png", help="draw the regime map (matplotlib, Agg) to FILE.png")
    add_json_flag(p)
    p.set_defaults(handler=_regimes)
