"""The engine boundary: nothing kvtier does on an engine thread raises into the engine.

A plugin method an engine calls is wrapped with :func:`guarded`: an exception
from kvtier's lifecycle, policy or store inside it is *contained*: counted,
logged at most once a minute per kind (:class:`RateLimitedLog`), and the
method returns its fallback (plain tiering's answer, or a miss)::

    class KvtierTier(...):
        @guarded(LookupResult.MISS)
        def lookup(self, key, req_context): ...

The host object holds a :class:`Firewall` as ``self.firewall``.  Thread-safe.
"""
from __future__ import annotations

import functools
import logging
import threading
import time
from collections import Counter
from typing import Any, Callable, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


class RateLimitedLog:
    """A WARNING per kind at most once every ``every_s`` seconds; the repeats in
    between are counted and reported with the next line.  Thread-safe."""

    def __init__(self, log: logging.Logger, every_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._log, self._every, self._clock = log, float(every_s), clock
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}
        self._held: Counter[str] = Counter()
        self.lines = 0                      # lines actually written

    def warn(self, kind: str, msg: str, *args: Any) -> bool:
        """Log ``msg % args`` under ``kind`` unless one was logged less than
        ``every_s`` ago.  Returns whether it was logged."""
        now = self._clock()
        with self._lock:
            last = self._last.get(kind)
            if last is not None and now - last < self._every:
                self._held[kind] += 1
                return False
            if len(self._last) >= 1024:     # kinds are a handful; never grows with what clients send
                self._last.clear()
            self._last[kind] = now
            held = self._held.pop(kind, 0)
            self.lines += 1
        self._log.warning("kvtier: " + msg + (f" ({held} more since the last such line)" if held else ""), *args)
        return True


class Firewall:
    """Counts what the boundary contained, by entry point, and the errors a
    plugin answered as a miss itself; logs both through a :class:`RateLimitedLog`
    (bounded, whatever messages bad input makes).  ``counts()`` ->
    {"errors": n, "contained_errors": n, "contained:<entry>": n}."""

    def __init__(self, log: logging.Logger, every_s: float = 60.0) -> None:
        self.log = RateLimitedLog(log, every_s)
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self._errors = 0

    def error(self, what: str, exc: BaseException | str) -> None:
        """A failure the plugin answered itself (a miss, a failed job): counted, logged rate-limited."""
        with self._lock:
            self._errors += 1
        kind = type(exc).__name__ if isinstance(exc, BaseException) else shorten(exc, 60)
        self.log.warn(f"error:{what}:{kind}", "%s: %s", what, shorten(exc))

    def contain(self, entry: str, exc: BaseException) -> None:
        """Record that ``entry`` raised ``exc`` and was answered with its fallback."""
        with self._lock:
            self._counts[entry] += 1
        self.log.warn(f"contained:{entry}:{type(exc).__name__}",
                      "%s raised %s: %s; answered with plain tiering (the engine is unaffected)",
                      entry, type(exc).__name__, shorten(exc))

    def counts(self) -> dict[str, int]:
        with self._lock:
            out = {f"contained:{k}": v for k, v in self._counts.items()}
            out["contained_errors"] = sum(self._counts.values())
            out["errors"] = self._errors
        return out


def shorten(obj: object, limit: int = 200) -> str:
    """``str(obj)`` cut to ``limit`` characters (a client's input can make a message of any size)."""
    s = str(obj)
    return s if len(s) <= limit else s[:limit] + "..."


def guarded(fallback: Any = None, *, factory: Callable[..., Any] | None = None) -> Callable[[F], F]:
    """Wrap an engine-facing method: an exception becomes ``fallback`` (or
    ``factory(*args)`` for a per-call answer, e.g. a list of misses of the
    right length), counted on ``self.firewall``.  BaseExceptions that are not
    Exceptions (KeyboardInterrupt, SystemExit) pass through."""
    def wrap(fn: F) -> F:
        entry = fn.__name__

        @functools.wraps(fn)
        def inner(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return fn(self, *args, **kwargs)
            except Exception as exc:
                self.firewall.contain(entry, exc)
                if factory is not None:
                    try:
                        return factory(*args, **kwargs)
                    except Exception:
                        return fallback
                return fallback
        return inner  # type: ignore[return-value]
    return wrap
