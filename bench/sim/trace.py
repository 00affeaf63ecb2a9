"""The agent trace: JSON Lines, one object per round of a session.

Shape (DESIGN.md, keep the names)::

    {"session": str, "round": int, "arrival_s": float, "new_tokens": int,
     "output_tokens": int, "tool": str|null, "tool_wait_s": float|null,
     "shared_prefix_id": str (optional), "shared_prefix_tokens": int (optional)}

Semantics:

* ``arrival_s`` of round 0 is when the session arrives.  Later rounds start
  when the previous round's tool returns; their ``arrival_s`` is informative
  only (converters write the time the round would start with no queueing).
* The context of round k is the shared prefix plus everything (new and
  output tokens) of rounds < k.
* Every round but the last ends with a tool call (``tool`` and
  ``tool_wait_s`` set); the last round has ``tool: null`` (a tool on the last
  round is accepted and ignored: nothing resumes after it).

Reading reports malformed lines with their 1-based line number.  With
``on_error="stop"`` the first problem raises :class:`TraceError`; with
``"skip"`` the bad line is dropped, the error recorded, and a session whose
rounds no longer form 0..n-1 is dropped whole (also recorded).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Callable, Iterable, Iterator, Sequence, TypeVar

T = TypeVar("T")

ON_ERROR_CHOICES = ("skip", "stop")
MAX_TOKENS = 10_000_000          # a round bigger than this is a typo, not a workload
MAX_WAIT_S = 30 * 24 * 3600.0    # a month
MAX_ARRIVAL_S = 1e12             # about 30,000 years: later is a unit mistake


class TraceError(ValueError):
    """A malformed trace; the message starts with ``line N:`` when one line is at fault."""

    def __init__(self, message: str, line: int | None = None) -> None:
        self.line = line
        self.message = message
        super().__init__(f"line {line}: {message}" if line is not None else message)


@dataclass(frozen=True)
class Round:
    """One round of a session: prefill ``new_tokens``, decode ``output_tokens``, then wait on ``tool``."""

    session: str
    round: int
    arrival_s: float
    new_tokens: int
    output_tokens: int
    tool: str | None = None
    tool_wait_s: float | None = None
    shared_prefix_id: str | None = None
    shared_prefix_tokens: int = 0

    def to_json(self) -> dict:
        d = {"session": self.session, "round": self.round, "arrival_s": round(self.arrival_s, 6),
             "new_tokens": self.new_tokens, "output_tokens": self.output_tokens,
             "tool": self.tool,
             "tool_wait_s": None if self.tool_wait_s is None else round(self.tool_wait_s, 6)}
        if self.shared_prefix_id is not None:
            d["shared_prefix_id"] = self.shared_prefix_id
            d["shared_prefix_tokens"] = self.shared_prefix_tokens
        return d


@dataclass(frozen=True)
class Session:
    """A session's rounds in order (``rounds[k].round == k``)."""

    id: str
    rounds: tuple[Round, ...]

    @property
    def arrival_s(self) -> float:
        return self.rounds[0].arrival_s

    @property
    def shared_prefix_id(self) -> str | None:
        return self.rounds[0].shared_prefix_id

    @property
    def shared_prefix_tokens(self) -> int:
        return self.rounds[0].shared_prefix_tokens if self.rounds[0].shared_prefix_id is not None else 0

    def context_tokens(self, k: int) -> int:
        """Private context at the start of round k (shared prefix excluded)."""
        return sum(r.new_tokens + r.output_tokens for r in self.rounds[:k])


@dataclass(frozen=True)
class TraceProblem:
    line: int | None
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}" if self.line is not None else self.message


@dataclass(frozen=True)
class Trace:
    """A parsed trace: sessions sorted by arrival, plus the problems skipped while reading."""

    sessions: tuple[Session, ...]
    problems: tuple[TraceProblem, ...] = field(default_factory=tuple)
    lines_read: int = 0

    @property
    def rounds(self) -> int:
        return sum(len(s.rounds) for s in self.sessions)


def _num(obj: dict, key: str, line: int, *, integer: bool, optional: bool = False,
         lo: float = 0.0, hi: float = math.inf) -> float | int | None:
    if key not in obj:
        if optional:
            return None
        raise TraceError(f"missing field {key!r}", line)
    v = obj[key]
    if v is None and optional:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TraceError(f"{key} must be a number, got {v!r}", line)
    if integer:
        if isinstance(v, float):
            if not v.is_integer():
                raise TraceError(f"{key} must be an integer, got {v!r}", line)
            v = int(v)
    elif not math.isfinite(v):
        raise TraceError(f"{key} must be finite, got {v!r}", line)
    if not (lo <= v <= hi):
        raise TraceError(f"{key} must be in [{lo:g}, {hi:g}], got {v!r}", line)
    return v


def parse_round(obj: object, line: int) -> Round:
    """Validate one decoded JSON object.  Raises TraceError naming the line."""
    if not isinstance(obj, dict):
        raise TraceError(f"expected a JSON object, got {type(obj).__name__}", line)
    sid = obj.get("session")
    if not isinstance(sid, str) or not sid:
        raise TraceError(f"session must be a non-empty string, got {sid!r}", line)
    rnd = _num(obj, "round", line, integer=True, hi=1_000_000)
    arrival = _num(obj, "arrival_s", line, integer=False, hi=MAX_ARRIVAL_S)
    new = _num(obj, "new_tokens", line, integer=True, hi=MAX_TOKENS)
    out = _num(obj, "output_tokens", line, integer=True, hi=MAX_TOKENS)
    tool = obj.get("tool")
    if tool is not None and (not isinstance(tool, str) or not tool or len(tool) > 200):
        raise TraceError(f"tool must be null or a non-empty string of at most 200 characters, got {tool!r}", line)
    wait = _num(obj, "tool_wait_s", line, integer=False, optional=True, hi=MAX_WAIT_S)
    if (tool is None) != (wait is None):
        raise TraceError("tool and tool_wait_s must both be set or both be null", line)
    spid = obj.get("shared_prefix_id")
    sptok = 0
    if spid is not None:
        if not isinstance(spid, str) or not spid:
            raise TraceError(f"shared_prefix_id must be a non-empty string, got {spid!r}", line)
        sptok = _num(obj, "shared_prefix_tokens", line, integer=True, hi=MAX_TOKENS)
    elif obj.get("shared_prefix_tokens") not in (None, 0):
        raise TraceError("shared_prefix_tokens given without shared_prefix_id", line)
    return Round(sid, int(rnd), float(arrival), int(new), int(out), tool,
                 None if wait is None else float(wait), spid, int(sptok))


def iter_json_lines(lines: Iterable[str], problems: list[TraceProblem] | None,
                    parse: Callable[[dict, int], T]) -> Iterator[tuple[int, T]]:
    """Yield (line number, parse(obj, line number)) for every well-formed JSON-object line.

    Blank lines and lines starting with ``#`` are ignored.  A line that is not
    JSON, not an object, or that ``parse`` rejects with TraceError raises when
    ``problems`` is None; otherwise it is appended there and skipped.
    """
    for no, text in enumerate(lines, start=1):
        s = text.strip()
        if not s or s.startswith("#"):
            continue
        try:
            try:
                obj = json.loads(s)
            except json.JSONDecodeError as exc:
                raise TraceError(f"not valid JSON ({exc.msg} at column {exc.colno})", no) from None
            if not isinstance(obj, dict):
                raise TraceError(f"expected a JSON object, got {type(obj).__name__}", no)
            yield no, parse(obj, no)
        except TraceError as exc:
            if problems is None:
                raise
            problems.append(TraceProblem(exc.line, exc.message))


def iter_rounds(lines: Iterable[str], problems: list[TraceProblem] | None,
                ) -> Iterator[tuple[int, Round]]:
    """Yield (line number, Round) for every well-formed line (see iter_json_lines)."""
    return iter_json_lines(lines, problems, parse_round)


def read_trace(source: str | Path | IO[str], *, on_error: str = "stop") -> Trace:
    """Parse a trace file (or open text stream).

    Raises TraceError (``on_error="stop"``) on the first malformed line or
    session, ValueError for an unknown ``on_error``, OSError if the file
    cannot be read.  Never mutates the file.
    """
    if on_error not in ON_ERROR_CHOICES:
        raise ValueError(f"on_error must be one of {', '.join(ON_ERROR_CHOICES)}, got {on_error!r}")
    problems: list[TraceProblem] | None = [] if on_error == "skip" else None
    if isinstance(source, (str, Path)):
        with open(source, "r", encoding="utf-8") as fh:
            return _assemble(fh, problems)
    return _assemble(source, problems)


def _assemble(fh: Iterable[str], problems: list[TraceProblem] | None) -> Trace:
    by_session: dict[str, dict[int, tuple[int, Round]]] = {}
    bad_sessions: dict[str, int] = {}
    n_lines = 0

    def fail(sid: str, msg: str, line: int) -> None:
        if problems is None:
            raise TraceError(msg, line)
        problems.append(TraceProblem(line, msg))
        bad_sessions.setdefault(sid, line)

    counted = _Counting(fh)
    for no, r in iter_rounds(counted, problems):
        rounds = by_session.setdefault(r.session, {})
        if r.round in rounds:
            fail(r.session, f"session {r.session!r} round {r.round} repeats line {rounds[r.round][0]}", no)
            continue
        if rounds:
            first = next(iter(rounds.values()))[1]
            if (r.shared_prefix_id, r.shared_prefix_tokens) != (first.shared_prefix_id, first.shared_prefix_tokens):
                fail(r.session, f"session {r.session!r}: shared prefix differs from its earlier rounds", no)
                continue
        rounds[r.round] = (no, r)
    n_lines = counted.n

    sessions: list[Session] = []
    for sid, rounds in by_session.items():
        if sid in bad_sessions:
            continue
        ks = sorted(rounds)
        if ks != list(range(len(ks))):
            missing = next(i for i in range(len(ks) + 1) if i not in rounds)
            line = max(no for no, _ in rounds.values())
            fail(sid, f"session {sid!r} lacks round {missing} (rounds must be 0..n-1)", line)
            continue
        ordered = tuple(rounds[k][1] for k in ks)
        bad = next((rounds[k][0] for k in ks[:-1] if rounds[k][1].tool is None), None)
        if bad is not None:
            fail(sid, f"session {sid!r}: a round other than the last has no tool", bad)
            continue
        sessions.append(Session(sid, ordered))
    if problems:
        dropped = [s for s in bad_sessions if s in by_session]
        if dropped:
            problems.append(TraceProblem(None, f"dropped {len(dropped)} session(s) with bad rounds"))
    sessions.sort(key=lambda s: (s.arrival_s, s.id))
    return Trace(tuple(sessions), tuple(problems or ()), n_lines)


class _Counting:
    def __init__(self, it: Iterable[str]) -> None:
        self._it = it
        self.n = 0

    def __iter__(self) -> Iterator[str]:
        for x in self._it:
            self.n += 1
            yield x


def write_trace(path: str | Path, sessions: Sequence[Session]) -> int:
    """Write sessions as JSON Lines (rounds in session-arrival order).  Returns lines written."""
    n = 0
    with open(path, "w", encoding="utf-8") as fh:
        for s in sorted(sessions, key=lambda s: (s.arrival_s, s.id)):
            for r in s.rounds:
                fh.write(json.dumps(r.to_json(), separators=(",", ":")))
                fh.write("\n")
                n += 1
    return n


def make_session(sid: str, arrival_s: float, steps: Sequence[tuple[int, int, str | None, float | None]],
                 *, shared_prefix_id: str | None = None, shared_prefix_tokens: int = 0) -> Session:
    """Build a Session from (new_tokens, output_tokens, tool, wait) steps.

    Later rounds' ``arrival_s`` is the no-queueing start (arrival + previous
    waits); the last step's tool is forced to null.
    """
    rounds = []
    t = round(float(arrival_s), 6)
    for k, (new, out, tool, wait) in enumerate(steps):
        last = k == len(steps) - 1
        w = None if last else round(float(wait), 6)        # what write_trace keeps: exact round trips
        rounds.append(Round(sid, k, t, int(new), int(out), None if last else tool, w, shared_prefix_id,
                            shared_prefix_tokens if shared_prefix_id else 0))
        if w is not None:
            t = round(t + w, 6)
    return Session(sid, tuple(rounds))


def summarize(trace: Trace) -> dict:
    """Plain statistics of a trace (sessions, rounds, tokens, tool waits)."""
    waits = sorted(r.tool_wait_s for s in trace.sessions for r in s.rounds[:-1] if r.tool_wait_s is not None)
    new = [r.new_tokens for s in trace.sessions for r in s.rounds]
    out = [r.output_tokens for s in trace.sessions for r in s.rounds]
    final_ctx = sorted(s.shared_prefix_tokens + s.context_tokens(len(s.rounds)) for s in trace.sessions)
    arr = [s.arrival_s for s in trace.sessions]
    tools: dict[str, int] = {}
    for s in trace.sessions:
        for r in s.rounds[:-1]:
            tools[r.tool or "?"] = tools.get(r.tool or "?", 0) + 1

    def q(xs: list, p: float) -> float:
        return float(xs[min(len(xs) - 1, int(p * len(xs)))]) if xs else 0.0

    total_wait = sum(waits)
    return {
        "sessions": len(trace.sessions),
        "rounds": trace.rounds,
        "pauses": len(waits),
        "span_s": (max(arr) - min(arr)) if arr else 0.0,
        "new_tokens_mean": sum(new) / len(new) if new else 0.0,
        "output_tokens_mean": sum(out) / len(out) if out else 0.0,
        "final_context_p50": q(final_ctx, 0.5),
        "final_context_p99": q(final_ctx, 0.99),
        "tool_wait_p50_s": q(waits, 0.5),
        "tool_wait_p90_s": q(waits, 0.9),
        "tool_wait_p99_s": q(waits, 0.99),
        "tool_wait_mean_s": total_wait / len(waits) if waits else 0.0,
        "frac_waits_over_60s": sum(1 for w in waits if w > 60) / len(waits) if waits else 0.0,
        "frac_wait_time_over_60s": sum(w for w in waits if w > 60) / total_wait if total_wait else 0.0,
        "tools": dict(sorted(tools.items(), key=lambda kv: -kv[1])),
        "problems": len(trace.problems),
    }
