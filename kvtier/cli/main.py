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
bad input; ``main`` prints one line ``<command>: error: <message>`` on stderr
(``kvtier plan capacity: error: argument --context: ...``, the command that
failed, then the flag at fault) and exits 2 without a traceback.  A missing
optional package is reported the same way, naming the extra to install.
"""
from __future__ import annotations

import argparse
import importlib
import re
import sys
from typing import Sequence

from kvtier.util.cmd import (CliError, CommandGroups, add_json_flag, emit_json, error_line,  # noqa: F401
                             reader_gone)

# Each module registers its own subcommands; kept as strings so a broken or
# heavy optional module cannot take the whole CLI down at import time.
COMMAND_MODULES: tuple[str, ...] = (
    "kvtier.cli.plan",       # kvtier plan capacity|breakeven|paging|sharing
    "kvtier.bench.cmd_tiers",      # kvtier bench tiers
    "kvtier.bench.cmd_predictor",  # kvtier bench predictor
    "kvtier.bench.cmd_simulate",   # kvtier bench simulate / kvtier bench trace ...
    "kvtier.bench.cmd_engine",     # kvtier bench engine
    "kvtier.bench.cmd_live",       # kvtier bench live
    "kvtier.bench.cmd_service",    # kvtier bench service
    "kvtier.bench.soak_live.cmd",  # kvtier bench soak --live
    "kvtier.cli.demo",       # kvtier demo
    "kvtier.cli.serve",      # kvtier serve
    "kvtier.cli.route",      # kvtier route
    "kvtier.cli.store",      # kvtier store check|rebuild
    "kvtier.cli.prefix",     # kvtier prefix LOG
)


class _Parser(argparse.ArgumentParser):
    """argparse that reports errors as one line and exits 2 (its default code).

    ``self.prog`` is the command path (``kvtier plan capacity``), so the line
    names the subcommand; argparse's message names the flag
    (``argument --context: expected a positive integer, got 'x'``)."""

    # a value such as "-64K", "-1e3" or "-.5" is a (bad) value, never a flag: the flag's type then says
    # what is wrong with it instead of argparse reporting a missing argument
    _VALUE_LIKE = re.compile(r"^-\.?\d\S*$")

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self._negative_number_matcher = self._VALUE_LIKE

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, error_line(self.prog, message))


def build_parser() -> argparse.ArgumentParser:
    from kvtier.env import help_epilog

    parser = _Parser(prog="kvtier",
                     description="Tiered KV-cache offload for agent serving: plan, benchmark, demo, serve.",
                     epilog=help_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"kvtier {_version()}",
                        help="print the version and exit")
    parser.add_argument("--config", metavar="FILE", default=None,
                        help="settings file (TOML, YAML or JSON; default $KVTIER_CONFIG): the keys of "
                             "docs/config.md, below flags and KVTIER_* variables")
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
    _record_progs(parser)
    return parser


def _version() -> str:
    from kvtier import __version__
    return __version__


def _record_progs(parser: argparse.ArgumentParser) -> None:
    """Give every subcommand the default ``_prog`` (its command path), so an error raised by
    its handler names it.  The deepest subparser's default wins, as argparse applies them."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                sub.set_defaults(_prog=sub.prog)
                _record_progs(sub)


def iter_parsers(parser: argparse.ArgumentParser):
    """The parser and every subparser below it (each once), depth first."""
    yield parser
    seen: set[int] = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                if id(sub) not in seen:   # aliases map several names to one parser
                    seen.add(id(sub))
                    yield from iter_parsers(sub)


class _OneLineWarnings:
    """A ``warnings.formatwarning`` that prints kvtier's own deprecation warnings as
    ``kvtier: warning: <message>`` (one line) and the rest as ``plain`` does."""

    def __init__(self, plain) -> None:    # noqa: ANN001 - warnings' formatter
        self.plain = plain

    def __call__(self, message, category, *args, **kw):   # noqa: ANN001 - warnings' signature
        from kvtier.env import DeprecatedVariable
        if issubclass(category, DeprecatedVariable):
            return f"kvtier: warning: {message}\n"
        return self.plain(message, category, *args, **kw)


def _one_line_warnings() -> None:
    """Install :class:`_OneLineWarnings` (once: main may be called again in-process)."""
    import warnings
    if not isinstance(warnings.formatwarning, _OneLineWarnings):
        warnings.formatwarning = _OneLineWarnings(warnings.formatwarning)


def _check_settings(args: argparse.Namespace) -> None:
    """Make ``--config`` the config file of this process (``KVTIER_CONFIG``, so the store and the
    plugins read it too), then check every ``KVTIER_*`` variable and the config file before any
    work: a bad value stops the command with one line naming it.  A ``KVTIER_*`` variable that no
    setting reads gets a one-line warning (a typo would otherwise change nothing, silently).

    Raises:
        ValueError: a bad value or config file (the message names the key and where it came from).
    """
    import os

    from kvtier.settings import CONFIG_VAR, check_environment
    if getattr(args, "config", None):
        os.environ[CONFIG_VAR] = args.config
    for name in check_environment():
        print(f"kvtier: warning: {name} is not a kvtier variable (see kvtier --help); ignored",
              file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    _one_line_warnings()

    argv = list(argv if argv is not None else sys.argv[1:])
    try:
        return _run(argv)
    except BrokenPipeError:      # `kvtier ... --json | head`, `kvtier --help | head`: end quietly
        return reader_gone()


def _run(argv: list[str]) -> int:
    from kvtier.extras import MissingExtra

    try:
        parser = build_parser()
    except MissingExtra as exc:   # a command module that imports an extra at its top
        sys.stderr.write(error_line("kvtier", exc))
        return 2
    try:
        args, unknown = parser.parse_known_args(argv)
    except SystemExit:           # --help, --version (0) or a usage error (2, already one line)
        sys.stdout.flush()       # help into a closed pipe fails here, inside main's BrokenPipeError
        raise
    prog = getattr(args, "_prog", "kvtier")
    if unknown:
        # argparse would blame the top-level parser; name the subcommand that got them
        sys.stderr.write(error_line(prog, f"unrecognized arguments: {' '.join(unknown)}"))
        return 2
    try:
        _check_settings(args)
    except (ValueError, MissingExtra) as exc:
        sys.stderr.write(error_line(prog, exc))
        return 2
    handler = getattr(args, "handler", None)
    if handler is None:
        # `kvtier`, `kvtier plan`, `kvtier bench` without a subcommand: that group's help, exit 2
        group = next(p for p in iter_parsers(parser) if p.prog == prog)
        group.print_help()
        return 2
    try:
        rc = handler(args)
        sys.stdout.flush()       # inside the try: a closed pipe found by the last flush ends quietly too
    except (CliError, ValueError, MissingExtra) as exc:
        sys.stderr.write(error_line(prog, exc))
        return 2
    except ModuleNotFoundError as exc:
        from kvtier.extras import missing_line
        missing = missing_line(exc)
        if missing is None:
            raise
        sys.stderr.write(error_line(prog, missing))
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        raise                    # main ends quietly
    except OSError as exc:       # a path the user named that cannot be read or written
        if exc.filename is None:
            raise
        sys.stderr.write(error_line(prog, f"{exc.filename}: {exc.strerror or exc}"))
        return 2
    return int(rc or 0)


if __name__ == "__main__":  # pragma: no cover
    # `python -m kvtier` runs this file as __main__; dispatch through the
    # imported kvtier.cli.main so subcommand modules and main share one CliError.
    from kvtier.cli.main import main as _main
    sys.exit(_main())
