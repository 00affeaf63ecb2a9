"""Every ``KVTIER_*`` environment variable, generated from :mod:`kvtier.settings` (shown by ``kvtier --help``).

One variable per setting: the setting's key upper-cased behind ``KVTIER_``.  Precedence:
a flag (or the plugin's JSON) > the variable > the config file (``KVTIER_CONFIG``) > the
built-in default (:data:`kvtier.settings.PRECEDENCE`).  Modules read a variable through
:mod:`kvtier.settings` or :func:`get`, so the table cannot drift from what is read.
"""
from __future__ import annotations

import os
import warnings
from pathlib import Path

from kvtier.settings import CONFIG_VAR, PRECEDENCE, SETTINGS

# variables read that are not settings of their own (name -> what it does)
EXTRA_VARS: dict[str, str] = {
    CONFIG_VAR: "settings file: TOML, YAML or JSON (--config)",
}

# name -> what it sets
ENV_VARS: dict[str, str] = {**EXTRA_VARS, **{s.env: s.help for s in SETTINGS}}

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
    """The environment table as ``--help`` prints it, grouped by who reads each variable."""
    width = max(map(len, ENV_VARS))
    order = " > ".join(PRECEDENCE)
    lines = [f"configuration: {order}",
             "(docs/config.md); a key of the plugin JSON or config file is KVTIER_<KEY>:"]
    lines += [f"  {k:<{width}}  {v}" for k, v in EXTRA_VARS.items()]
    titles = {"store": "the store (both plugins, StoreConfig.from_env)", "remote": "the remote tier",
              "plugin": "the engine plugins (vLLM, SGLang)", "service": "the service", "bench": "the benchmarks"}
    for scope, title in titles.items():
        lines.append(f" {title}:")
        lines += [f"  {s.env:<{width}}  {s.help}" for s in SETTINGS if s.scope == scope]
    lines += [f"  {old:<{width}}  deprecated: use {new}" for old, new in DEPRECATED.items()]
    return "\n".join(lines)
