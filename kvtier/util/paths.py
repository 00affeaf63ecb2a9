"""Where kvtier keeps files of its own outside a store: the user cache folder."""
from __future__ import annotations

import os
from pathlib import Path


def cache_dir(*parts: str) -> Path:
    """``$XDG_CACHE_HOME/kvtier/...``, else ``~/.cache/kvtier/...`` (the XDG base-directory rule:
    an unset, empty or relative ``XDG_CACHE_HOME`` is ignored)."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    root = Path(base) if base and os.path.isabs(base) else Path.home() / ".cache"
    return root.joinpath("kvtier", *parts)
