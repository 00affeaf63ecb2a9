"""The member of a mode enum that a setting names: one rule for every option whose
values are an enum's (the store's I/O modes, the break-even policy's options).

A mode enum's values are the option strings (``IoEngineKind.AUTO.value == "auto"``), so a
setting may hold the member or its value; :func:`member` turns either into the member and
refuses anything else with one line naming the setting and the values it takes.
Standard library only.
"""
from __future__ import annotations

import enum
from typing import TypeVar

__all__ = ["member"]

E = TypeVar("E", bound=enum.Enum)


def member(kind: type[E], v: object, *, field: str) -> E:
    """``v`` (a member of ``kind`` or a member's value) as that member.

    ``field`` is the setting's name as the error shows it, with any prefix the caller's
    errors carry (``"StoreConfig.io_engine"``).  Pure: any thread.

    Raises:
        ValueError: ``v`` is neither: ``"<field> must be one of 'a', 'b', got <v!r>"``.
    """
    try:
        return kind(v)
    except ValueError:
        values = ", ".join(repr(m.value) for m in kind)
        raise ValueError(f"{field} must be one of {values}, got {v!r}") from None
