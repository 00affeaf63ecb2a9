"""``kvtier bench soak --live``: a live engine with kvtier under a seeded fault schedule.

(The in-process soak of invented names, :mod:`kvtier.bench.soak`, stays
``python -m kvtier.bench.soak``.)  Run it in an environment with vLLM's CPU build: the engine is
this Python's ``vllm.entrypoints.openai.api_server``, redis-server must be on PATH.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from kvtier.util.args import nonneg_int, pos_float, pos_int
from kvtier.util.cmd import CliError, CommandGroups, add_json_flag, emit_json

KINDS = ("redis-kill", "redis-stop", "redis-evict", "remote-trickle", "slab-flip", "index-flip", "files-damage",
         "fs-full", "engine-kill", "index-truncate", "hostile-clients")


def register(groups: CommandGroups) -> None:
    p = groups.bench.add_parser("soak", help="a live engine with kvtier under a seeded fault schedule (--live)",
                                description="Start redis-server and `vllm serve` with kvtier (host frames, NVMe, "
                                            "a Redis tier written through), drive agent sessions with tool waits "
                                            "over HTTP, run a seeded fault schedule, check every output against "
                                            "a recompute, and report per fault kind.")
    p.add_argument("--live", action="store_true", required=True,
                   help="the live soak (required; the in-process soak is `python -m kvtier.bench.soak`)")
    p.add_argument("--minutes", type=pos_float, default=8.0, help="how long the agents run (default 8)")
    p.add_argument("--seed", type=nonneg_int, default=0, help="the fault schedule's and workload's seed (default 0)")
    p.add_argument("--faults", default=None,
                   help=f"comma-separated fault kinds (default: every kind this host can run of "
                        f"{','.join(KINDS)}; fs-full needs root)")
    p.add_argument("--spacing", type=pos_float, default=40.0, help="seconds between two faults at most (default 40)")
    p.add_argument("--hold", type=pos_float, default=5.0, help="seconds a fault holds before recover (default 5)")
    p.add_argument("--warmup", type=pos_float, default=30.0, help="seconds before the first fault (default 30)")
    p.add_argument("--sessions", type=pos_int, default=6, help="agent sessions at a time (default 6)")
    p.add_argument("--engine-blocks", type=pos_int, default=24,
                   help="the engine's KV cache in 32-token blocks, well below the working set (default 24)")
    p.add_argument("--data-mib", type=nonneg_int, default=256,
                   help="kvtier's data dir is its own ext4 of this many MiB, loop-mounted (needs root; "
                        "the fs-full fault fills it; 0: no mount and no fs-full; default 256)")
    p.add_argument("--workdir", default=None, help="where logs and kvtier's data dir go (default: a temporary dir)")
    p.add_argument("--plot", default=None, metavar="PATH", help="a PNG of resume TTFT over time, faults marked")
    add_json_flag(p)
    p.set_defaults(handler=_soak)


def _soak(a: argparse.Namespace) -> int:
    from kvtier.bench.live.cluster import ClusterError
    from kvtier.bench.soak_live.report import plot_resume_ttft, table
    from kvtier.bench.soak_live.run import SoakOptions, plannable, run_soak
    from kvtier.engine_adapter.tiny_model import build_tiny_model

    kinds = None if a.faults is None else [k.strip() for k in a.faults.split(",") if k.strip()]
    say = (lambda m: print(m, file=sys.stderr, flush=True)) if a.json else (lambda m: print(m, flush=True))
    data_mib = a.data_mib or None
    try:
        plannable(kinds, KINDS, data_mib)     # the soak plans the same: refuse here, before a model is built
    except ValueError as exc:
        raise CliError(f"argument --faults: {exc}") from None
    with tempfile.TemporaryDirectory(prefix="kvtier-soak-live-") as tmp:
        work = Path(a.workdir) if a.workdir else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        model = str(build_tiny_model(work / "models"))
        opts = SoakOptions(model=model, workdir=work, minutes=a.minutes, seed=a.seed, kinds=kinds,
                           engine_blocks=a.engine_blocks, concurrent=a.sessions, warmup_s=a.warmup, hold_s=a.hold,
                           spacing_s=a.spacing, data_mib=data_mib)
        try:
            doc = run_soak(opts, progress=say)
        except ClusterError as exc:
            raise CliError(str(exc)) from None
    if a.plot:
        plot_resume_ttft(doc, Path(a.plot))
        say(f"plot: {a.plot}")
    if a.json:
        emit_json(doc)
    else:
        print(table(doc))
    bad_run = doc["wrong_outputs"] or doc["crashes"] or doc["never_recovered"] or doc["growth"]["unbounded"]
    return 1 if bad_run else 0
