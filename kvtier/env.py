"""Every ``KVTIER_*`` environment variable, in one table (shown by ``kvtier --help``).

One variable per setting.  A command-line flag always wins over its variable;
the variable wins over the built-in default.  Modules read a variable through
the helpers here (or name it in :data:`ENV_VARS` when they read it themselves,
as ``StoreConfig.from_env`` does), so the table stays complete.
"""
from __future__ import annotations

import os
import warnings
from pathlib import Path

# name -> what it sets (the flag it backs, where there is one)
ENV_VARS: dict[str, str] = {   # (each line of `kvtier --help` fits 80 columns)
    "KVTIER_TOKEN": "bearer token: serve --token, the clients and plugins",
    "KVTIER_DATA_ROOT": "serve --data-dir must resolve inside it (--data-root)",
    "KVTIER_TRACES": "trace dir: bench predictor --traces, trace --input",
    "KVTIER_IO_ENGINE": "store NVMe I/O engine: auto, io_uring or threads",
    "KVTIER_DIRECT_IO": "store O_DIRECT: auto, on or off",
    "KVTIER_QUEUE_DEPTH": "store NVMe queue depth (an integer)",
    "KVTIER_REMOTE_URL": "store remote tier URL (StoreConfig.remote_url)",
    "KVTIER_REMOTE_DOMAIN": "remote tier isolation domain (tenant salt)",
    "KVTIER_REMOTE_USERNAME": "remote tier user when the URL names none",
    "KVTIER_REMOTE_PASSWORD": "remote tier password when the URL names none",
    "KVTIER_PEER_ENV_DIR": "bench tiers --peer lmcache venv dir (--peer-env-dir)",
}

class DeprecatedVariable(FutureWarning):
    """A deprecated ``KVTIER_*`` name was read (the CLI prints it as one line)."""


# old name -> the name that replaced it (still read, with a warning)
DEPRECATED: dict[str, str] = {
    "KVTIER_TRACES_DIR": "KVTIER_TRACES",
}


def get(name: str) -> str | None:
    """The value of ``name`` (a key of :data:`ENV_VARS`), or of the deprecated name it
    replaced (with a :class:`DeprecatedVariable` warning), or None when neither is set or both are empty.

    Raises:
        KeyError: ``name`` is not in :data:`ENV_VARS` (a typo would read nothing forever).
    """
    if name not in ENV_VARS:
        raise KeyError(f"{name} is not a kvtier environment variable; known: {', '.join(ENV_VARS)}")
    value = os.environ.get(name)
    if value:
        return value
    for old, new in DEPRECATED.items():
        if new == name and os.environ.get(old):
            warnings.warn(f"{old} is deprecated: set {name} instead", DeprecatedVariable, stacklevel=2)
            return os.environ[old]
    return None


def traces_dir() -> Path:
    """``$KVTIER_TRACES``, else ``../shared/traces`` beside the working directory, else beside
    the source tree (an editable checkout), else the relative ``../shared/traces``."""
    value = get("KVTIER_TRACES")
    if value:
        return Path(value)
    here = Path(__file__).resolve().parent.parent   # the repository root in a checkout
    for base in (Path.cwd(), here):
        cand = base.parent / "shared" / "traces"
        if cand.is_dir():
            return cand
    return Path("../shared/traces")


def help_epilog() -> str:
    """The environment table as ``--help`` prints it."""
    width = max(map(len, ENV_VARS))
    lines = ["environment (a flag wins over its variable):"]
    lines += [f"  {k:<{width}}  {v}" for k, v in ENV_VARS.items()]
    lines += [f"  {old:<{width}}  deprecated: use {new}" for old, new in DEPRECATED.items()]
    return "\n".join(lines)
