"""``kvtier prefix LOG``: the prefix doctor on a harness request log (docs/prefix.md).

JSON (``--json``): ``{"hit_rate", "trajectories": {ID: {"hit_rate", "turns": [{"turn",
"prompt_tokens", "matched_tokens", "cause", ...}]}}}`` plus a ``summary`` block.
Without it: a table of the turns that broke their prefix (``--all`` for every turn) and
the per-trajectory hit rates.  ``--plot PNG``: hit rate per turn (matplotlib).
"""
from __future__ import annotations

import argparse
from collections import Counter
from typing import Any

from kvtier.util.args import nonneg_float, pos_int
from kvtier.util.cmd import CliError, add_json_flag, emit_json
from kvtier.util.preset_args import add_model_flag, add_node_flag


def register(groups: Any) -> None:
    p = groups.top.add_parser("prefix",
                              help="prefix-cache hit rate of an agent harness's request log, and what broke it",
                              description="Read a request log (JSON Lines: trajectory id + chat-completions "
                                          "body or token ids) and report the prefix hit rate per trajectory "
                                          "and turn, and which change broke each prefix.")
    p.add_argument("log", help="request log, JSON Lines")
    p.add_argument("--id-field", default="trajectory_id", help="the trajectory id's field (default trajectory_id)")
    p.add_argument("--tokenizer", default=None, metavar="PATH",
                   help="a local tokenizer.json (or its folder); default: one token per UTF-8 byte")
    p.add_argument("--block-tokens", type=pos_int, default=16,
                   help="prefix-cache block size in tokens: matches count whole blocks (default 16)")
    p.add_argument("--ttl", type=nonneg_float, default=300.0, metavar="S",
                   help="provider cache time-to-live: flag turns after a longer tool wait (default 300; 0: off)")
    add_model_flag(p, default="llama-3.1-70b", purpose="the model preset whose re-prefill seconds are reported")
    add_node_flag(p, purpose="the hardware preset the re-prefill runs on")
    p.add_argument("--all", action="store_true", help="list every turn, not only the broken ones")
    p.add_argument("--plot", default=None, metavar="PNG", help="write a plot of hit rate per turn")
    add_json_flag(p)
    p.set_defaults(handler=_run)


def _doctor(a: argparse.Namespace):
    from kvtier.tiering.model.costmodel import t_recompute
    from kvtier.tiering.prefix.doctor import PrefixDoctor
    from kvtier.tiering.prefix.render import load_tokenizer
    from kvtier.tiering.model.presets import DEFAULT_NODE, get_node, get_preset
    spt = t_recompute(get_preset(a.model), 1, get_node(a.node or DEFAULT_NODE))
    return PrefixDoctor(load_tokenizer(a.tokenizer), block_tokens=a.block_tokens, seconds_per_token=spt,
                        ttl_s=a.ttl if a.ttl > 0 else None)


def summary(d) -> dict:
    turns = [t for r in d.trajectories.values() for t in r.turns]
    causes = Counter(t.cause for t in turns)
    return {"calls": len(turns), "trajectories": len(d.trajectories),
            "prompt_tokens": sum(t.prompt_tokens for t in turns),
            "matched_tokens": sum(t.matched_tokens for t in turns),
            "causes": {c: causes.get(c, 0) for c in ("none", "head_volatile", "tools_changed", "reordered",
                                                      "compaction", "edit")},
            "reprefill_tokens": sum(t.reprefill_tokens for t in turns),
            "reprefill_s": sum(t.reprefill_s for t in turns),
            "ttl_expired_turns": sum(t.ttl_expired for t in turns),
            "ttl_lost_tokens": sum(t.ttl_lost_tokens for t in turns)}


def _run(a: argparse.Namespace) -> int:
    import os

    from kvtier.tiering.prefix.log import replay
    if not os.path.isfile(a.log):            # before any work (and before a progress line on stderr)
        raise CliError(f"request log {a.log!r}: " + ("is a directory" if os.path.isdir(a.log) else "no such file"))
    d = _doctor(a)
    if a.json:
        replay(a.log, d, id_field=a.id_field)
    else:
        from rich.progress import Progress
        from kvtier.util.console import make_console
        with Progress(console=make_console(stderr=True), transient=True) as prog:
            task = prog.add_task("reading the log", total=None)
            replay(a.log, d, id_field=a.id_field, progress=lambda n: prog.update(task, completed=n))
    doc = d.to_json()
    doc["summary"] = summary(d)
    if a.plot:
        doc["plot"] = str(plot_turns(d, a.plot))
    if a.json:
        emit_json(doc)
    else:
        _show(d, doc, a.all)
    return 0


def _show(d, doc: dict, every: bool) -> None:
    from kvtier.util.console import fit_table, make_console
    con = make_console()
    rows = []
    for tid, r in d.trajectories.items():
        for t in r.turns:
            if not every and t.cause == "none" and not t.ttl_expired:
                continue
            rows.append([tid, str(t.turn), f"{t.prompt_tokens:,}", f"{t.matched_tokens:,}", f"{t.hit_rate:.0%}",
                         t.cause, "" if t.first_diff_token is None else f"{t.first_diff_token:,}",
                         t.first_diff_field or "", f"{t.reprefill_tokens:,}", f"{t.reprefill_s * 1e3:.1f}",
                         "yes" if t.ttl_expired else ""])
    cols = [("trajectory", "left"), ("turn", "right"), ("prompt", "right"), ("matched", "right"),
            ("hit", "right"), ("cause", "left"), ("first diff", "right"), ("field", "left"),
            ("re-prefilled", "right"), ("ms", "right"), ("ttl", "left")]
    if rows:
        table, dropped = fit_table(con, cols, rows, drop=("ms", "first diff", "ttl"),
                                   title="turns that broke their prefix" if not every else "turns")
        con.print(table)
        if dropped:
            con.print(f"(columns left out to fit: {', '.join(dropped)})")
    else:
        con.print("no turn broke its prefix")
    notes = [f"  {tid} turn {t.turn}: {t.note}" for tid, r in d.trajectories.items() for t in r.turns if t.note]
    if notes:
        con.print("volatile content in the head (fix the template to keep it out of the prefix):")
        for line in notes[:20]:
            con.print(line, markup=False, highlight=False)
        if len(notes) > 20:
            con.print(f"  ... {len(notes) - 20} more (--json lists every one)")
    s = doc["summary"]
    trs = [[tid, str(len(r.turns)), f"{r.prompt_tokens:,}", f"{r.matched_tokens:,}", f"{r.hit_rate:.1%}"]
           for tid, r in d.trajectories.items()]
    table, _ = fit_table(con, [("trajectory", "left"), ("turns", "right"), ("prompt", "right"),
                               ("matched", "right"), ("H", "right")], trs, title="hit rate per trajectory")
    con.print(table)
    causes = ", ".join(f"{k} {v}" for k, v in s["causes"].items() if v)
    con.print(f"H = {doc['hit_rate']:.1%} over {s['calls']} calls ({s['trajectories']} trajectories); "
              f"turns by cause: {causes}; re-prefilled {s['reprefill_tokens']:,} tokens "
              f"({s['reprefill_s']:.2f} s); {s['ttl_expired_turns']} turns after a wait past the TTL")
    if "plot" in doc:
        con.print(f"plot: {doc['plot']}")


def plot_turns(d, path: str):
    """Hit rate per turn, one line per trajectory; broken turns marked by cause."""
    from pathlib import Path
    from kvtier.extras import require
    mpl = require("matplotlib", extra="bench")
    mpl.use("Agg")
    import matplotlib.pyplot as plt
    marks = {"head_volatile": "v", "tools_changed": "s", "reordered": "D", "compaction": "X", "edit": "o"}
    fig, ax = plt.subplots(figsize=(9, 4.5))
    seen: set[str] = set()
    for r in d.trajectories.values():
        xs = [t.turn for t in r.turns]
        ax.plot(xs, [t.hit_rate for t in r.turns], color="0.6", lw=0.8, alpha=0.6)
        for t in r.turns:
            if t.cause in marks:
                ax.scatter([t.turn], [t.hit_rate], marker=marks[t.cause], s=40, zorder=3,
                           label=None if t.cause in seen else t.cause)
                seen.add(t.cause)
    ax.set_xlabel("turn")
    ax.set_ylabel("prefix hit rate (matched / prompt)")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(f"prefix hit rate per turn (H = {d.hit_rate:.1%})")
    if seen:
        ax.legend(loc="lower right")
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p
