"""Optional dependencies, grouped as the package's extras.

A module that needs an extra imports it through :func:`require`, which turns
a missing package into one line naming the ``pip install`` to run instead of
a traceback::

    httpx = require("httpx", extra="client")

The extras are declared in ``pyproject.toml``; this table only says which
extra brings which import, so the message is right.
"""
from __future__ import annotations

import importlib
from types import ModuleType

EXTRA_OF: dict[str, str] = {
    "httpx": "client",
    "fastapi": "service",
    "uvicorn": "service",
    "pydantic": "service",
    "prometheus_client": "service",
    "transformers": "hf",
    "rich": "bench",
    "matplotlib": "bench",
    "redis": "remote",
    "hiredis": "remote",
    "mooncake": "remote",
    "cupy": "cuda",
}


# engines kvtier plugs into: no extra brings them (each has its own install); the message names it
ENGINE_INSTALL: dict[str, str] = {
    "vllm": "pip install vllm  (tested with 0.33; docs/engines.md)",
    "sglang": "pip install sglang  (tested with 0.5.23; docs/engines.md)",
}


class MissingExtra(ImportError):
    """An optional dependency is not installed; the message says which extra (or, for an
    engine, which install) brings it."""

    def __init__(self, module: str, extra: str, feature: str | None = None) -> None:
        what = f"{feature} needs" if feature else "needs"
        install = ENGINE_INSTALL.get(module) or f"pip install 'kvtier[{extra}]'"
        super().__init__(f"{what} the '{module}' package: {install}")
        self.module = module
        self.extra = extra


def missing_line(exc: ModuleNotFoundError) -> str | None:
    """The one line naming the extra or engine install that brings the package ``exc`` misses,
    or None when the missing module is not an optional dependency of ours."""
    if isinstance(exc, MissingExtra):
        return str(exc)
    top = (exc.name or "").split(".")[0]
    if top in ENGINE_INSTALL:
        return str(MissingExtra(top, "engine"))
    if top in EXTRA_OF:
        return str(MissingExtra(top, EXTRA_OF[top]))
    return None


def require(module: str, extra: str | None = None, feature: str | None = None) -> ModuleType:
    """Import ``module`` or raise :class:`MissingExtra` naming the extra to install.

    Raises:
        MissingExtra: the module (or its top-level package) is not installed.
    """
    extra = extra or EXTRA_OF.get(module.split(".")[0], "all")
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        top = module.split(".")[0]
        if exc.name and exc.name.split(".")[0] != top:
            raise  # the package is there but one of *its* imports is missing: not ours to rename
        raise MissingExtra(top, extra, feature) from None
