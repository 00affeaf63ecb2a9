"""``kvtier store check DIR`` and ``kvtier store rebuild DIR``: the index of a
closed store against its self-describing slots, by hand; ``kvtier store stats
DIR``: the counters an engine's kvtier tier last wrote there.

check    compares every index record with the slot headers and prints what
         agrees, what only the index names (damage) and what only the headers
         name (dropped or evicted blocks whose slots were not reused, or blocks
         the index lost), and how the last store closed (a leftover OPEN
         marker from another boot means the machine went down with the store
         open: its unflushed index commits may be lost, and the next open
         rebuilds); exit 0 if the index is sound, 1 if it is not.
rebuild  sets the index aside (index.corrupt-<time>) and rebuilds it from the
         slot headers, newest write sequence per key winning.

Both read the layout from DIR/FORMAT, hold the store's lock (so the store
must be closed), and show a progress bar over the slots on stderr.
"""
from __future__ import annotations

import argparse
import contextlib
import sys
from typing import Any

from kvtier.util.cmd import CliError, CommandGroups, add_json_flag, emit_json


def register(groups: CommandGroups) -> None:
    p = groups.top.add_parser("store", help="check or rebuild a store's index from its slot headers",
                              description="Check or rebuild the index of a closed store from its "
                                          "self-describing slot headers.")
    sub = p.add_subparsers(dest="store_command", metavar="WHAT", parser_class=type(p))
    c = sub.add_parser("check", help="compare the index with the slot headers (exit 1 if damaged)",
                       description="Compare the index of a closed store with its slot headers.")
    c.add_argument("dir", metavar="DIR", help="the store's data directory (StoreConfig.root)")
    _common(c)
    c.set_defaults(handler=_check)
    r = sub.add_parser("rebuild", help="set the index aside and rebuild it from the slot headers",
                       description="Set the index of a closed store aside and rebuild it from the slot headers.")
    r.add_argument("dir", metavar="DIR", help="the store's data directory (StoreConfig.root)")
    _common(r)
    r.set_defaults(handler=_rebuild)
    st = sub.add_parser("stats", help="what an engine's kvtier tier has done (its counters snapshot)",
                        description="Print the counters a running (or stopped) engine's kvtier tier last wrote "
                                    "to DIR (kvtier-stats.json, refreshed every few seconds): blocks stored and "
                                    "loaded by tier, decisions, hint rejections, contained errors, remote state.")
    st.add_argument("dir", metavar="DIR", help="the plugin's data_dir, or one store under it")
    add_json_flag(st)
    st.set_defaults(handler=_stats)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--io-engine", choices=("auto", "io_uring", "threads"), default="threads",
                   help="I/O engine for the scan (default threads)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    add_json_flag(p)


def _config(args):
    from kvtier.store import StoreError
    from kvtier.store.check import config_for_root

    try:
        return config_for_root(args.dir, io_engine=args.io_engine)
    except StoreError as exc:
        raise CliError(str(exc)) from None


@contextlib.contextmanager
def _progress(args, what: str):
    """A ``progress(done, total)`` callback drawing a rich bar on stderr (or None)."""
    if args.no_progress or not sys.stderr.isatty():     # a bar only where someone watches
        yield None
        return
    try:
        from kvtier.util.console import make_console as Console  # width rules: pipes not cut
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
    except ModuleNotFoundError:       # rich is the bench extra: no bar without it
        yield None
        return
    with Progress(TextColumn(what), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(what, total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)
        yield update


def _check(args) -> int:
    from kvtier.store import StoreError
    from kvtier.store.check import check_root

    cfg = _config(args)
    try:
        with _progress(args, "scanning slots") as prog:
            rep = check_root(cfg, prog)
    except StoreError as exc:
        raise CliError(str(exc)) from None
    if args.json:
        emit_json(rep)
    else:
        _print_check(rep)
    return 0 if rep["healthy"] else 1


def _print_check(rep: dict[str, Any]) -> None:
    from kvtier.util.console import make_console
    from rich.table import Table

    t = Table(title=f"kvtier store check {rep['root']}", show_header=False)
    idx, sl = rep["index"], rep["slots"]
    t.add_row("index", "sound" if idx["ok"] else f"DAMAGED: {idx['problem']}")
    t.add_row("index records", str(idx["records"]))
    t.add_row("slots scanned", f"{sl['scanned']} in {sl['seconds']} s")
    t.add_row("blocks in headers", str(sl["blocks"]))
    t.add_row("agree", str(rep["agree"]))
    t.add_row("index only (bad)", str(rep["index_only"]))
    t.add_row("headers only", str(rep["headers_only"]))
    t.add_row("bad headers / superseded / empty", f"{sl['bad_headers']} / {sl['superseded']} / {sl['empty']}")
    t.add_row("last close", {"clean": "clean",
                             "killed": "not clean: the process died (same boot, index complete)",
                             }.get(rep["last_close"], f"not clean: {rep['restart']}; the next open rebuilds the index"))
    t.add_row("verdict", "healthy" if rep["healthy"] else "run: kvtier store rebuild " + rep["root"])
    make_console().print(t)


STATS_FILE = "kvtier-stats.json"


def _stats(args) -> int:
    import json
    import os
    import time
    from pathlib import Path

    root = Path(args.dir)
    if not root.is_dir():
        raise CliError(f"{root}: no such directory")
    files = sorted(p for p in [root / STATS_FILE, *root.glob(f"*/{STATS_FILE}")] if p.is_file())
    if not files:
        raise CliError(f"{root}: no {STATS_FILE} (an engine with kvtier writes one under its data_dir "
                       f"every few seconds while it serves)")
    docs = []
    for p in files:
        try:
            doc = json.loads(p.read_text())
            if not isinstance(doc, dict) or not isinstance(doc.get("stats", {}), dict):
                raise ValueError("not a kvtier stats snapshot: a JSON object with a 'stats' object")
            age = round(time.time() - float(doc.get("time", 0)), 1)
        except (OSError, ValueError, TypeError) as exc:
            raise CliError(f"{p}: unreadable ({exc})") from None
        pid = doc.get("pid")
        doc["running"] = isinstance(pid, int) and pid > 0 and os.path.exists(f"/proc/{pid}")
        doc["age_s"] = age
        docs.append(doc)
    if args.json:
        emit_json({"stores": docs})
        return 0
    from kvtier.util.console import make_console
    from rich.table import Table
    for doc in docs:
        s = doc.get("stats", {})
        t = Table(title=f"{doc.get('root')} ({'engine running' if doc['running'] else 'engine stopped'}, "
                        f"written {doc['age_s']} s ago)", show_header=False)
        t.add_row("policy", f"{s.get('policy')} (priced by {s.get('priced_by')})")
        t.add_row("stored by tier", _tiers(s.get("stored_by_tier")))
        t.add_row("loaded by tier", _tiers(s.get("loaded_by_tier")))
        t.add_row("lookups / hits", f"{s.get('lookups', 0)} / {s.get('lookup_hits', 0)}")
        t.add_row("load failures", str(s.get("load_failures", 0)))
        t.add_row("decisions", _tiers(s.get("decisions")))
        lc = s.get("lifecycle") or {}
        t.add_row("pauses / resumes", f"{lc.get('pauses', 0)} / {lc.get('resumes', 0)}")
        t.add_row("staged / demoted blocks", f"{lc.get('staged_blocks', 0)} / {lc.get('demoted_blocks', 0)}")
        t.add_row("hint rejections", str(s.get("hint_rejections", 0)))
        t.add_row("contained errors", str(s.get("contained_errors", 0)))
        if s.get("remote"):
            t.add_row("remote", _tiers(s["remote"]))
        make_console().print(t)
    return 0


def _tiers(d) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted((d or {}).items())) or "-"


def _rebuild(args) -> int:
    import logging

    from kvtier.store import StoreError, TieredStore

    cfg = _config(args)
    logging.getLogger("kvtier.store").setLevel(logging.ERROR)   # the summary below says it all
    try:
        with _progress(args, "rebuilding from slot headers") as prog:
            scan = TieredStore.rebuild(cfg, prog)
    except StoreError as exc:
        raise CliError(str(exc)) from None
    doc = {"root": str(cfg.root_path), "moved_to": scan.moved_to, "blocks_recovered": len(scan.found),
           "slots_scanned": scan.slots_scanned, "bad_headers": scan.bad, "superseded": scan.superseded,
           "empty": scan.empty, "seconds": round(scan.seconds, 3)}
    if args.json:
        emit_json(doc)
    else:
        print(f"rebuilt {doc['root']}/index: {scan.summary()}"
              + (f"; the old index is at {scan.moved_to}" if scan.moved_to else ""), file=sys.stdout)
    return 0
