"""The shared tail of the ``python -m bench.<name>`` benchmark scripts."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Callable


def run_script(name: str, parser: argparse.ArgumentParser, run: Callable[[argparse.Namespace], dict],
               show: Callable[[dict], None], argv=None) -> int:
    """Parse ``argv``, call ``run(args)`` and print its document: JSON with ``--json``, else ``show(doc)``.

    ValueError and ImportError (bad input, an engine package missing) are one line on
    stderr and exit status 2.  The parser must define ``--json``."""
    args = parser.parse_args(argv)
    try:
        doc = run(args)
    except (ValueError, ImportError) as exc:
        print(f"{name}: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        show(doc)
    return 0
