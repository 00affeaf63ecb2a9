"""The one rich console every ``kvtier`` command prints its tables through.

Width rules (rich's own default is 80 columns whenever the output is not a
terminal, which cuts wide tables in pipes and CI logs):

=====================================  ===========================================
output                                 width
=====================================  ===========================================
``$COLUMNS`` set                       that (what a terminal or the user says)
a terminal                             the terminal's width (tables wrap to fit)
not a terminal (piped, redirected)     wide enough that no table is cut
                                       (:data:`PIPE_WIDTH`); lines are not padded
=====================================  ===========================================

Colour follows rich's rules (``NO_COLOR``, ``FORCE_COLOR``, terminal or not).
Import this module only inside a handler: it imports rich (the ``bench`` extra).
"""
from __future__ import annotations

import os
import sys
from typing import Any

from kvtier.extras import require

PIPE_WIDTH = 240          # piped output: wider than any table of ours, so nothing is cut
MIN_WIDTH = 40            # a $COLUMNS below this is taken as this


def console_width(stream: Any) -> int | None:
    """The width to render at for ``stream``, or None to let rich ask the terminal."""
    columns = os.environ.get("COLUMNS", "").strip()
    if columns.isdigit() and int(columns) > 0:
        return max(MIN_WIDTH, int(columns))
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):   # closed or replaced streams
        tty = False
    return None if tty else PIPE_WIDTH


def make_console(*, stderr: bool = False, width: int | None = None, **kw: Any):
    """A ``rich.console.Console`` on stdout (or stderr) with the width rules above.

    ``width`` overrides them (tests render at 80 columns this way).

    Raises:
        kvtier.extras.MissingExtra: rich is not installed (one line naming ``kvtier[bench]``).
    """
    console = require("rich.console", extra="bench")
    stream = sys.stderr if stderr else sys.stdout
    con = console.Console(stderr=stderr, width=width or console_width(stream), **kw)
    con.on_broken_pipe = _broken_pipe   # rich would exit 1 itself; the CLI ends quietly in one place
    return con


def _broken_pipe() -> None:
    """rich's hook when a write finds the reader gone: hand it to ``kvtier.cli.main`` (see
    :func:`kvtier.util.cmd.reader_gone`)."""
    raise BrokenPipeError("the reader of the output has gone")


def fit_table(console: Any, columns: list[tuple[str, str]], rows: list[list[str]], *,
              drop: tuple[str, ...] = (), **table_kw: Any):
    """A ``rich.table.Table`` of ``columns`` (name, justify) and ``rows`` that fits ``console``.

    Cells never wrap or get cut; while the table is wider than the console, the columns named in
    ``drop`` are left out, in that order (least useful first), for a narrower layout, and as a last
    resort the vertical rules go.  Returns the table and the names of the columns dropped (say so
    under the table).
    """
    from rich import box
    from rich.measure import Measurement
    from rich.table import Table

    def build(keep: list[int], **extra: Any):
        t = Table(**{**table_kw, **extra})
        for i in keep:
            name, justify = columns[i]
            t.add_column(name, justify=justify, no_wrap=True, min_width=len(name))
        for row in rows:
            t.add_row(*(row[i] for i in keep))
        return t

    def fits(t) -> bool:   # console.measure() caps at the console width; this does not
        return Measurement.get(console, console.options.update_width(10_000), t).maximum <= console.width

    keep = list(range(len(columns)))
    names = [c[0] for c in columns]
    dropped: list[str] = []
    table = build(keep)
    for name in drop:
        if fits(table):
            return table, dropped
        keep.remove(names.index(name))
        dropped.append(name)
        table = build(keep)
    if not fits(table):   # last resort: no vertical rules
        table = build(keep, box=box.SIMPLE_HEAD)
    return table, dropped
