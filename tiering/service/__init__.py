"""kvtier's HTTP control plane (``kvtier serve``): tool-wait forecasts, pause
decisions and the paused-trajectory registry, persisted in LMDB.

Heavy pieces import lazily: ``from kvtier.tiering.service import create_app``.
"""
from __future__ import annotations

from typing import Any

__all__ = ["create_app", "ServiceConfig", "ServiceServer", "ServiceState", "StateConfig"]


def __getattr__(name: str) -> Any:
    if name in ("create_app", "ServiceConfig"):
        from . import app
        return getattr(app, name)
    if name in ("ServiceState", "StateConfig"):
        from . import state
        return getattr(state, name)
    if name == "ServiceServer":
        from .server import ServiceServer
        return ServiceServer
    raise AttributeError(name)
