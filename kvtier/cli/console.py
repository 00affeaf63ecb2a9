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
    console = require("rich.console", extra="bench", feature="tables and progress bars")
    stream = sys.stderr if stderr else sys.stdout
    return console.Console(stderr=stderr, width=width or console_width(stream), **kw)
