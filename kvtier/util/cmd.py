"""What every ``kvtier`` command handler uses, in the product (``kvtier.cli``) and the
benchmarks (``kvtier.bench``) alike: the bad-input error, the command groups a module
registers into, the ``--json`` flag and its one-document output, and the one way a
command ends when its reader has gone (``kvtier ... --json | head``).

Cheap to import: the standard library only.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from typing import Any


class CliError(Exception):
    """Bad user input: reported as one line on stderr, exit status 2."""


@dataclass(frozen=True)
class CommandGroups:
    top: Any    # argparse._SubParsersAction for `kvtier <cmd>`
    plan: Any   # for `kvtier plan <cmd>`
    bench: Any  # for `kvtier bench <cmd>`


def error_line(prog: str, message: object) -> str:
    """``<prog>: error: <message>`` on one line (newlines folded, no doubled ``kvtier: error:``)."""
    text = " ".join(str(message).split())
    for prefix in ("kvtier: error:", "kvtier:", "error:"):   # domain messages that carry their own
        if text.startswith(prefix):
            text = text[len(prefix):].lstrip()
    return f"{prog}: error: {text or 'failed'}\n"


def add_json_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true",
                   help="machine-readable JSON on stdout (nothing else on stdout)")


def emit_json(obj: Any) -> None:
    """Print ``obj`` as the command's one JSON document on stdout."""
    json.dump(obj, sys.stdout, indent=2, sort_keys=False, default=_json_default)
    sys.stdout.write("\n")


def _json_default(o: Any) -> Any:
    if hasattr(o, "item"):  # numpy scalars
        return o.item()
    if hasattr(o, "tolist"):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def reader_gone() -> int:
    """End a command whose stdout reader has left (a closed pipe): point stdout at /dev/null so the
    interpreter's last flush cannot fail, print nothing, and return the exit status (0).

    The one place a closed pipe is handled: ``kvtier.cli.main.main`` calls it on
    ``BrokenPipeError``, and the rich console (:mod:`kvtier.util.console`) raises
    ``BrokenPipeError`` instead of exiting on its own."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):   # stdout already closed or replaced (tests)
        pass
    return 0
