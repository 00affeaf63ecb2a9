"""The ``--model`` and ``--node`` flags, defined once for every command that prices pauses.

Each takes a preset name (``kvtier plan presets`` lists them), checked when the
command line is parsed, so a typo is one line naming the known presets before any
work.  The value stored is the preset's normal name (a string); commands look the
preset up with :func:`kvtier.tiering.model.presets.get_preset` / ``get_node``.
"""
from __future__ import annotations

import argparse
from typing import Any


def model_name(text: str) -> str:
    """argparse type: a model preset name (normalised).  Raises ArgumentTypeError listing the known ones."""
    from kvtier.tiering.model.presets import get_preset
    try:
        return get_preset(text).name
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def node_name(text: str) -> str:
    """argparse type: a node preset name (normalised).  Raises ArgumentTypeError listing the known ones."""
    from kvtier.tiering.model.presets import get_node
    try:
        get_node(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text.strip().lower()


def add_model_flag(g: Any, *, default: str | None, purpose: str = "the model preset pauses are priced as") -> None:
    """``--model PRESET`` on ``g`` (a parser or an argument group)."""
    shown = f"default {default}" if default else "or give the geometry flags instead"
    g.add_argument("--model", type=model_name, default=default, metavar="PRESET",
                   help=f"{purpose}, e.g. llama-3.1-8b, qwen3-32b, gqa-70b, deepseek-v3 "
                        f"({shown}; kvtier plan presets lists them)")


def add_node_flag(g: Any, *, default: str | None = None, purpose: str = "the node's hardware preset") -> None:
    """``--node PRESET`` on ``g``; ``default`` None means the built-in default node."""
    from kvtier.tiering.model.presets import DEFAULT_NODE, NODES
    g.add_argument("--node", type=node_name, default=default, metavar="PRESET",
                   help=f"{purpose} (default {default or DEFAULT_NODE}; known: {', '.join(NODES)})")
