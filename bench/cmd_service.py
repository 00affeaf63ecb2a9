"""``kvtier bench service``: load-test the control-plane service on loopback.

Starts ``kvtier serve`` on a free loopback port (see :mod:`kvtier.bench.load_service`)
and measures requests/s and latency percentiles of the forecast and decision endpoints.
Needs the ``service`` extra; without it the command says so in one line (exit 2)
before starting anything.
"""
from __future__ import annotations

import argparse
import math

from kvtier.util.args import nonneg_int, pos_float, pos_int
from kvtier.util.cmd import CliError, CommandGroups, add_json_flag, emit_json


def register(groups: CommandGroups) -> None:
    b = groups.bench.add_parser("service", help="load-test the control-plane service on loopback",
                                description="Start `kvtier serve` on a loopback port and measure requests/s "
                                            "and latency percentiles of the forecast and decision endpoints.")
    b.add_argument("--clients", type=pos_int, default=64, help="concurrent clients (default 64)")
    b.add_argument("--requests", type=pos_int, default=4000, help="requests per endpoint (default 4000)")
    b.add_argument("--max-seconds", type=pos_float, default=60.0, help="time cap per endpoint (default 60)")
    b.add_argument("--paused", type=nonneg_int, default=10_000,
                   help="paused trajectories registered for the in-process decision timing (default 10000)")
    b.add_argument("--data-dir", default=None, help="state directory (default: a fresh temporary one)")
    add_json_flag(b)
    b.set_defaults(handler=_bench)


def _bench(args: argparse.Namespace) -> int:
    from kvtier.extras import require

    for module in ("httpx", "fastapi", "uvicorn"):   # the server runs in a child: check here, in one line
        require(module)
    from kvtier.bench.load_service import LoadConfig, print_table, run_load

    if not math.isfinite(args.max_seconds):
        raise CliError("--max-seconds must be a finite number > 0")
    if args.data_dir is not None:
        from kvtier.tiering.service.security import check_data_dir
        check_data_dir(args.data_dir, None)           # a file or an uncreatable path -> exit 2
    result = run_load(LoadConfig(clients=args.clients, requests=args.requests, max_seconds=args.max_seconds,
                                 paused=args.paused, data_dir=args.data_dir), progress=not args.json)
    if args.json:
        emit_json(result)
    else:
        print_table(result)
    return 0
