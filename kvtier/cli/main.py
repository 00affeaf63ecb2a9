"""Entry point of the ``kvtier`` console script.

Subcommands live in their own modules and register themselves into one of
three argparse groups: the top level (``demo``, ``serve``), ``plan`` and
``bench``.  A module named in ``COMMAND_MODULES`` must export
``register(groups: CommandGroups) -> None`` and must be cheap to import
(no torch, no transformers at module top level: import inside the handler).

Every handler is called as ``handler(args) -> int`` and is expected to
honour ``args.json``: with it, print exactly one JSON document on stdout and
nothing else; without it, a readable table.

Errors: raise :class:`CliError` (or ``ValueError`` from the domain code) for
bad input; ``main`` prints ``kvtier: error: <message>`` on stderr and exits 2
without a traceback.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
from dataclasses import dataclass
from typing import Any, Sequence

# Each module registers its own subcommands; kept as strings so a broken or
# heavy optional module cannot take the whole CLI down at import time.
COMMAND_MODULES: tuple[str, ...] = (
    "kvtier.cli.plan",       # kvtier plan capacity|breakeven|paging|sharing
    "kvtier.bench.cmd_tiers",      # kvtier bench tiers
    "kvtier.bench.cmd_predictor",  # kvtier bench predictor
    "kvtier.bench.cmd_simulate",   # kvtier bench simulate / kvtier bench trace ...
    "kvtier.cli.demo",       # kvtier demo
    "kvtier.cli.serve",      # kvtier serve
)


class CliError(Exception):
    """Bad user input: reported as one line on stderr, exit status 2."""


@dataclass(frozen=True)
class CommandGroups:
    top: Any    # argparse._SubParsersAction for `kvtier <cmd>`
    plan: Any   # for `kvtier plan <cmd>`
    bench: Any  # for `kvtier bench <cmd>`


class _Parser(argparse.ArgumentParser):
    """argparse that reports errors as one line and exits 2 (its default code)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"kvtier: error: {self.prog}: {message}\n")


def add_json_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true",
                   help="machine-readable JSON on stdout (nothing else on stdout)")


def emit_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=2, sort_keys=False, default=_json_default)
    sys.stdout.write("\n")


def _json_default(o: Any) -> Any:
    if hasattr(o, "item"):  # numpy scalars
        return o.item()
    if hasattr(o, "tolist"):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def _missing_extra(exc: ModuleNotFoundError) -> str | None:
    """One line naming the extra that brings a missing optional package, or None."""
    from kvtier.extras import EXTRA_OF, MissingExtra

    if isinstance(exc, MissingExtra):
        return str(exc)
    top = (exc.name or "").split(".")[0]
    if top not in EXTRA_OF:
        return None
    return str(MissingExtra(top, EXTRA_OF[top]))


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="kvtier",
                     description="Tiered KV-cache offload for agent serving: plan, benchmark, demo, serve.")
    top = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    plan = top.add_parser("plan", help="capacity, break-even, paging and sharing arithmetic")
    plan_sub = plan.add_subparsers(dest="plan_command", metavar="WHAT", parser_class=_Parser)
    bench = top.add_parser("bench", help="tier bandwidths, trace simulation, predictor quality")
    bench_sub = bench.add_subparsers(dest="bench_command", metavar="WHAT", parser_class=_Parser)
    groups = CommandGroups(top=top, plan=plan_sub, bench=bench_sub)
    for name in COMMAND_MODULES:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # not written yet
                continue
            raise
        mod.register(groups)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        # `kvtier`, `kvtier plan`, `kvtier bench` without a subcommand
        parser.parse_args([*(argv if argv is not None else sys.argv[1:]), "--help"])
        return 2
    try:
        rc = handler(args)
    except (CliError, ValueError) as exc:
        print(f"kvtier: error: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        missing = _missing_extra(exc)
        if missing is None:
            raise
        print(f"kvtier: error: {missing}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("kvtier: interrupted", file=sys.stderr)
        return 130
    return int(rc or 0)


if __name__ == "__main__":  # pragma: no cover
    # `python -m kvtier` runs this file as __main__; dispatch through the
    # imported kvtier.cli.main so subcommand modules and main share one CliError.
    from kvtier.cli.main import main as _main
    sys.exit(_main())
