"""argparse value types shared by the ``kvtier`` subcommands.

Each type rejects non-numbers, NaN and infinities and out-of-range values
with ``argparse.ArgumentTypeError("expected <what>, got '<text>'")``, which
the CLI reports as one line with exit status 2.
"""
from __future__ import annotations

import argparse
import math
from typing import Any, Callable


def typed(kind: Callable[[str], Any], ok: Callable[[Any], bool], what: str) -> Callable[[str], Any]:
    """An argparse ``type=`` that parses with ``kind`` and accepts values where ``ok(v)``."""
    def parse(text: str) -> Any:
        try:
            v = kind(text)
        except (TypeError, ValueError, OverflowError):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if (isinstance(v, float) and not math.isfinite(v)) or not ok(v):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return v
    parse.__name__ = what
    return parse


def int_like(text: str) -> int:
    """An integer, also written as "2e3"; "2.5", "inf" and "nan" raise ValueError."""
    try:
        return int(text)
    except ValueError:
        f = float(text)
        if f.is_integer():  # False for inf and nan
            return int(f)
        raise


pos_int = typed(int_like, lambda v: v > 0, "a positive integer")
nonneg_int = typed(int_like, lambda v: v >= 0, "an integer >= 0")
pos_float = typed(float, lambda v: v > 0, "a positive number")
nonneg_float = typed(float, lambda v: v >= 0, "a number >= 0")
fraction = typed(float, lambda v: 0 <= v < 1, "a fraction in [0, 1)")
share = typed(float, lambda v: 0 < v <= 1, "a fraction in (0, 1]")
prob = typed(float, lambda v: 0 <= v <= 1, "a probability in [0, 1]")


def png_path(path: str, flag: str = "--plot") -> str:
    """Check a plot destination before any work: a ``.png`` file in an existing directory.

    Raises kvtier.util.cmd.CliError (exit 2, one line) otherwise."""
    import os

    from kvtier.util.cmd import CliError
    if not path.lower().endswith(".png"):
        raise CliError(f"{flag} {path!r}: give a file name ending in .png")
    if os.path.isdir(path):
        raise CliError(f"{flag} {path!r} is a directory")
    parent = os.path.dirname(path) or "."
    if not os.path.isdir(parent):
        raise CliError(f"{flag} {path!r}: directory {parent!r} does not exist")
    return path


def ensure_dir(path: str, flag: str, *, writable: bool = True) -> str:
    """Create the directory a flag names (``--data-dir``, ``--plots``) before any work.

    Raises kvtier.util.cmd.CliError (exit 2, one line) when the path is an existing
    file, cannot be created, or (with ``writable``) cannot be written."""
    import os

    from kvtier.util.cmd import CliError
    if os.path.exists(path) and not os.path.isdir(path):
        raise CliError(f"{flag} {path!r} is a file, not a directory")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise CliError(f"cannot create {flag} {path!r}: {exc.strerror or exc}") from None
    if writable and not os.access(path, os.W_OK | os.X_OK):
        raise CliError(f"{flag} {path!r} is not writable")
    return path


# Bandwidth flags spell their unit: --link-gb-per-s 64 is 64 gigabytes (1e9 bytes) per second.
# The earlier spellings (--link-gbps, read by some as gigabits) are still accepted, unlisted.
RENAMED: dict[str, str] = {
    "--link-gbps": "--link-gb-per-s",
    "--link-d2h-gbps": "--link-d2h-gb-per-s",
    "--nvme-gbps": "--nvme-gb-per-s",
    "--nvme-read-gbps": "--nvme-read-gb-per-s",
    "--nvme-write-gbps": "--nvme-write-gb-per-s",
    "--remote-gbps": "--remote-gb-per-s",
    "--hbm-bw-tbps": "--hbm-tb-per-s",
}


def add_rate_flag(g: Any, old: str, **kw: Any) -> None:
    """Add the bandwidth flag that replaced ``old`` (see :data:`RENAMED`) to ``g``, keeping
    ``old``'s destination (``args.link_gbps``), and ``old`` itself as an unlisted alias."""
    dest = old.lstrip("-").replace("-", "_")
    g.add_argument(RENAMED[old], dest=dest, **kw)
    g.add_argument(old, dest=dest, type=kw.get("type"), metavar=kw.get("metavar"),
                   default=argparse.SUPPRESS, help=argparse.SUPPRESS)
