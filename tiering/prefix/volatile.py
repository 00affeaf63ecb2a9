"""Volatile content: values a harness writes fresh on every call, and what changed between two texts.

Kinds found by :func:`spans` (first the fixed shapes; a nonce only where none of them is)::

    date and time   2026-12-07T13:13:01Z, 2026-12-07 13:13
    date            2026-12-07, 12/07/2026, 07.12.2026, December 7, 2026, Dec  7, 7th Dec 2026
    clock time      13:13, 13:13:01.5, 1:13 PM   (not after ':' or '.': ``parser.py:12:34`` is no time)
    weekday         Monday .. Sunday, Mon .. Sun (capitalised, whole words)
    UUID            8-4-4-4-12 hex
    request id      req_/call_/chatcmpl-/msg_/run_/trace_/toolu_... + 6 or more letters and digits,
                    or the value after a key such as ``request id:``, ``"trace_id": "``, ``Call-ID=``
    epoch number    9 or more digits
    hex id          12 or more hex digits, with a digit and a letter
    nonce           a run of 8 or more base64 characters (letters, digits, ``+/_-``) with digits or
                    mixed case, at least 3 class changes (lower/upper/digit) and less than half of
                    it word-like (a 3+ letter run with a vowel): ``Xk3j9QpL2m``; named ``hex id``
                    when all hex (``3f9a2b1c``).  These are guessed from their shape alone

:func:`changes` explains the difference of two texts by these values alone, or says it cannot:
the texts with every span masked must be equal (or, with ``prefix``, the first a prefix of the
second), and each pair of masked values that differ must be volatile.  A fixed shape on either
side is; two guessed ones are only when they look regenerated (lengths within a quarter, at least half
the positions different): ``getUserName2`` -> ``getUserName3`` or ``iPhone15Pro`` ->
``iPhone16Pro`` is an edit.  Pure functions.
"""
from __future__ import annotations

import bisect
import re
from dataclasses import dataclass
from typing import NamedTuple

MAX_VALUE_CHARS = 80
PREFIX_SLACK_CHARS = 4096

_MONTH = (r"(?:January|February|March|April|May|June|July|August|September|October|November|December"
          r"|Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sept|Sep|Oct|Nov|Dec)\.?")
_ID_KEY = (r"(?i:\b(?:request|req|call|trace|span|session|correlation|conversation|message|msg|run|invocation)"
           r"[ _-]?id\b)")
_ID_VALUE = r"[A-Za-z0-9](?:[A-Za-z0-9._:-]*[A-Za-z0-9])?"

# (kind, pattern): a pattern with a group ``v`` names only that group's text as the value
_FIXED: tuple[tuple[str, re.Pattern], ...] = tuple((k, re.compile(p)) for k, p in (
    ("date and time", r"\b\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?"),
    ("date", r"\b\d{4}-\d{2}-\d{2}\b"),
    ("date", r"\b\d{4}/\d{1,2}/\d{1,2}\b"),
    ("date", r"\b\d{1,2}/\d{1,2}/(?:\d{4}|\d{2})\b"),
    ("date", r"\b\d{1,2}\.\d{1,2}\.\d{4}\b"),
    ("date", rf"\b{_MONTH}\s{{1,2}}\d{{1,2}}(?:st|nd|rd|th)?\b(?:,?\s\d{{4}}\b)?"),
    ("date", rf"\b\d{{1,2}}(?:st|nd|rd|th)?\s{_MONTH}(?:,?\s\d{{4}}\b)?"),
    ("clock time", r"(?<![:.\w])\d{1,2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:\s?(?:[AaPp]\.[Mm]\.|[AaPp][Mm]\b))?(?![\w:])"),
    ("weekday", r"\b(?:Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday"
                r"|Mon|Tues|Tue|Wed|Thurs|Thur|Thu|Fri|Sat|Sun)\b"),
    ("UUID", r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"),
    ("request id", r"\b(?:req|request|call|chatcmpl|msg|run|trace|span|sess|session|toolu|resp)[-_][A-Za-z0-9]{6,}\b"),
    ("request id", rf"{_ID_KEY}[\"']?\s*[:=#]\s*[\"']?(?P<v>{_ID_VALUE})"),
    ("request id", rf"{_ID_KEY}\s+(?P<v>(?=[A-Za-z0-9._:-]*\d){_ID_VALUE})"),
    ("epoch number", r"\b\d{9,}(?:\.\d+)?\b"),
    ("hex id", r"\b(?=[0-9a-fA-F]*\d)(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{12,}\b"),
))
_NONCE_RUN = re.compile(r"(?<![A-Za-z0-9+/_-])[A-Za-z0-9+/_-]{8,}={0,2}(?![A-Za-z0-9+/_=-])")
_WORDLIKE = re.compile(r"[A-Z]?[a-z]{3,}")
_VOWEL = re.compile(r"[aeiou]")
_HEX = re.compile(r"[0-9a-fA-F]+")


class Span(NamedTuple):
    """A volatile value at ``text[start:end]``; ``guessed``: found by the nonce shape alone."""

    kind: str
    start: int
    end: int
    guessed: bool = False


@dataclass(frozen=True)
class VolatileChange:
    """One volatile value that changed: its kind, the field it sits in (``messages[0].content``,
    ``tools[1].function.description``, ``tokens`` for a decoded token line), where it is in the
    current turn's text of that field (``start``/``end``, characters), and both values (cut to
    :data:`MAX_VALUE_CHARS`)."""

    kind: str
    field: str
    start: int
    end: int
    before: str
    after: str

    def describe(self) -> str:
        """``clock time '10:00' -> '10:05' at messages[0].content chars 5-10``."""
        return f"{self.kind} {self.before!r} -> {self.after!r} at {self.field} chars {self.start}-{self.end}"


def _cut(s: str) -> str:
    return s if len(s) <= MAX_VALUE_CHARS else s[:MAX_VALUE_CHARS - 1] + "\u2026"


def looks_random(s: str) -> bool:
    """The nonce shape of the module docstring (``s`` one run of base64 characters)."""
    core = s.rstrip("=")
    alnum = "".join(c for c in core if c.isalnum())
    if len(alnum) < 8 or alnum.isdigit():
        return False
    digit = any(c.isdigit() for c in alnum)
    if not digit and (alnum.islower() or alnum.isupper()):
        return False
    wordlike = sum(len(m.group()) for m in _WORDLIKE.finditer(core) if _VOWEL.search(m.group()))
    if 2 * wordlike >= len(alnum):
        return False
    cls = ["d" if c.isdigit() else "u" if c.isupper() else "l" for c in alnum]
    return sum(a != b for a, b in zip(cls, cls[1:])) >= 3


def _regenerated(a: str, b: str) -> bool:
    """Two nonces that look drawn afresh rather than edited."""
    n = max(len(a), len(b))
    if abs(len(a) - len(b)) * 4 > n:
        return False
    differ = sum(x != y for x, y in zip(a, b)) + abs(len(a) - len(b))
    return 2 * differ >= n


def spans(text: str) -> list[Span]:
    """The volatile values of ``text``, left to right, not overlapping (the fixed shapes first:
    leftmost, then longest, then the order of the module docstring; then nonces in the gaps)."""
    found = []
    for order, (kind, rx) in enumerate(_FIXED):
        for m in rx.finditer(text):
            s, e = m.span("v") if "v" in rx.groupindex else m.span()
            found.append((s, -e, order, kind))
    found.sort()
    out: list[Span] = []
    end = 0
    for s, neg_e, _, kind in found:
        if s >= end:
            out.append(Span(kind, s, -neg_e))
            end = -neg_e
    starts = [sp.start for sp in out]
    guessed = []
    for m in _NONCE_RUN.finditer(text):
        s, e = m.span()
        i = bisect.bisect_left(starts, e)        # fixed spans starting before the run ends
        if (i == 0 or out[i - 1].end <= s) and looks_random(m.group()):
            guessed.append(Span("hex id" if _HEX.fullmatch(m.group()) else "nonce", s, e, guessed=True))
    return sorted(out + guessed, key=lambda sp: sp.start) if guessed else out


def mask(text: str) -> str:
    """``text`` with every fixed-shape value replaced by NUL (nonces kept: they may be identifiers)."""
    parts, at = [], 0
    for sp in spans(text):
        if not sp.guessed:
            parts.append(text[at:sp.start])
            parts.append("\x00")
            at = sp.end
    parts.append(text[at:])
    return "".join(parts)


def _gaps(text: str, sps: list[Span]) -> list[str]:
    out, at = [], 0
    for sp in sps:
        out.append(text[at:sp.start])
        at = sp.end
    out.append(text[at:])
    return out


def changes(before: str, after: str, field: str, *, prefix: bool = False) -> list[VolatileChange] | None:
    """The volatile values that changed from ``before`` to ``after`` if they explain the whole
    difference (``prefix``: ``after`` may go on past ``before``'s end; the values may grow it
    by up to :data:`PREFIX_SLACK_CHARS` in all), else None.  Equal texts give ``[]``."""
    if before == after or (prefix and after.startswith(before)):
        return []
    if prefix:          # what lies past ``before``'s end (and the values' growth) is not compared
        after = after[:len(before) + PREFIX_SLACK_CHARS]
    sa, sb = spans(before), spans(after)
    ga, gb = _gaps(before, sa), _gaps(after, sb)
    n = len(sa)
    if prefix:
        if len(sb) < n or ga[:n] != gb[:n] or not gb[n].startswith(ga[n]):
            return None
    elif len(sb) != n or ga != gb:
        return None
    out = []
    for a, b in zip(sa, sb[:n]):
        va, vb = before[a.start:a.end], after[b.start:b.end]
        if va == vb:
            continue
        if a.guessed and b.guessed and not _regenerated(va, vb):
            return None
        kind = a.kind if b.guessed and not a.guessed else b.kind
        out.append(VolatileChange(kind, field, b.start, b.end, _cut(va), _cut(vb)))
    return out
