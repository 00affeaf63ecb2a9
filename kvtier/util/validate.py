"""Checks of configuration values: one small kind per shape of value.

A kind checks a typed value (plugin JSON, a TOML/YAML config file, a keyword
argument) with :meth:`Kind.check`, and a value written as text (an environment
variable) with :meth:`Kind.from_text`, which parses first.  Both raise
``ValueError("must be <what>, got <value>")``; the caller puts the key and the
source in front (see :mod:`kvtier.settings`).  Standard library only.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

_TRUE = ("1", "true")
_FALSE = ("0", "false")


class Kind:
    """A shape of value.  Subclasses set :attr:`what` and implement :meth:`check`."""

    what = "a value"

    def check(self, v: Any) -> Any:
        """``v`` itself (or its normal form).  Raises ValueError naming what was expected."""
        raise NotImplementedError

    def from_text(self, text: str) -> Any:
        """``text`` parsed and checked (the form an environment variable holds)."""
        return self.check(text)

    def bad(self, v: Any) -> ValueError:
        return ValueError(f"must be {self.what}, got {v!r}")


@dataclass(frozen=True)
class Number(Kind):
    """A finite int or float with bounds; ``integer``: an int only (``1.5`` is refused, ``2.0`` too)."""

    low: float | None = None
    low_open: bool = False       # True: low itself is refused (> low)
    high: float | None = None
    integer: bool = False
    unit: str = ""

    @property
    def what(self) -> str:  # type: ignore[override]
        noun = "an integer" if self.integer else "a number"
        if self.unit:
            noun += f" of {self.unit}"
        bounds = []
        if self.low is not None:
            bounds.append(f"{'>' if self.low_open else '>='} {self.low:g}")
        if self.high is not None:
            bounds.append(f"<= {self.high:g}")
        return f"{noun} {' and '.join(bounds)}".strip()

    def check(self, v: Any) -> Any:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise self.bad(v)
        if self.integer and not isinstance(v, int):
            raise self.bad(v)
        if not math.isfinite(v):
            raise self.bad(v)
        if self.low is not None and (v < self.low or (self.low_open and v == self.low)):
            raise self.bad(v)
        if self.high is not None and v > self.high:
            raise self.bad(v)
        return v

    def from_text(self, text: str) -> Any:
        try:
            v = int(text) if self.integer else float(text)
        except ValueError:
            raise self.bad(text) from None
        return self.check(v)


@dataclass(frozen=True)
class Flag(Kind):
    """true or false (as text: 1 or 0, true or false)."""

    what = "true or false"

    def check(self, v: Any) -> bool:
        if not isinstance(v, bool):
            raise self.bad(v)
        return v

    def from_text(self, text: str) -> bool:
        t = text.strip().lower()
        if t in _TRUE:
            return True
        if t in _FALSE:
            return False
        raise ValueError(f"must be one of {'/'.join(_TRUE)} or {'/'.join(_FALSE)}, got {text!r}")


@dataclass(frozen=True)
class Choice(Kind):
    """One of a few names."""

    options: tuple[str, ...] = ()

    @property
    def what(self) -> str:  # type: ignore[override]
        return "one of " + ", ".join(repr(o) for o in self.options)

    def check(self, v: Any) -> str:
        if v not in self.options:
            raise self.bad(v)
        return v


@dataclass(frozen=True)
class Text(Kind):
    """A non-empty string, optionally checked further by ``test`` (which raises ValueError)."""

    test: Callable[[str], Any] | None = None
    what = "a non-empty string"

    def check(self, v: Any) -> str:
        if not isinstance(v, str) or not v:
            raise self.bad(v)
        if self.test is not None:
            self.test(v)
        return v
