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


class MissingExtra(ImportError):
    """An optional dependency is not installed; the message says which extra brings it."""

    def __init__(self, module: str, extra: str, feature: str | None = None) -> None:
        what = f"{feature} needs" if feature else "needs"
        super().__init__(f"{what} the '{module}' package: pip install 'kvtier[{extra}]'")
        self.module = module
        self.extra = extra


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
