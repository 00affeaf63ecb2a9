"""An agent trace cut to fit a small live engine: sessions, turns, token ids, tool waits.

A trace session (``kvtier bench trace`` writes them; :mod:`kvtier.bench.sim.trace`)
keeps its arrival, its shared prefix and its turns' token counts and tools,
with its counts multiplied by its own factor so that its final context fits
``max_context`` tokens (at least ``min_turn_tokens`` per turn).
Times are multiplied by ``time_scale`` and each wait capped at ``max_wait_s``
(wall seconds).  Waits can instead be drawn, tool and all, from a real
per-call set (``calls``: SWE-agent, SWE-smith or TraceLab durations,
:func:`kvtier.bench.predictor_eval.load_datasets`).

Token ids are a pure function of (seed, owner, turn): sessions that share a
prefix id send the same prefix ids, and two runs send the same prompts.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class LiveTurn:
    """One turn: ``new_tokens`` appended to the context (the tool's result, or
    the first prompt), ``output_tokens`` generated, then ``wait_s`` wall seconds
    on ``tool`` (None: the session's last turn)."""
    new_tokens: int
    output_tokens: int
    tool: str | None
    wait_s: float | None


@dataclass(frozen=True)
class LiveSession:
    sid: str
    arrival_s: float
    prefix_id: str | None
    prefix_tokens: int
    turns: tuple[LiveTurn, ...]

    def final_context(self) -> int:
        return self.prefix_tokens + sum(t.new_tokens + t.output_tokens for t in self.turns)


@dataclass(frozen=True)
class Fit:
    """How a trace is cut: sessions kept, turns per session at most, context cap,
    the factors applied, a cap on any wait, output tokens per turn."""
    sessions: int = 6
    turns: int = 4
    max_context: int = 1600
    time_scale: float = 1.0
    max_wait_s: float = 6.0
    min_turn_tokens: int = 32
    output_tokens: int = 8
    arrival_spread_s: float | None = None   # None: the trace's arrivals x time_scale

    def __post_init__(self) -> None:
        if self.sessions < 1 or self.turns < 2 or self.max_context < 64 or self.output_tokens < 1:
            raise ValueError("need sessions >= 1, turns >= 2, max_context >= 64, output_tokens >= 1")
        if not (self.time_scale > 0 and self.max_wait_s > 0):
            raise ValueError("time_scale and max_wait_s must be > 0")


def fit_trace(sessions: Sequence, fit: Fit, *, calls: Sequence | None = None, seed: int = 0) -> list[LiveSession]:
    """``sessions`` (trace :class:`~kvtier.bench.sim.trace.Session` objects, by
    arrival) cut to ``fit`` (module doc).  ``calls``: objects with ``tool`` and
    ``seconds`` to draw waits from instead of the trace's.  Raises ValueError
    when no session has two turns with a tool wait between them."""
    rng = random.Random(seed)
    picked = [s for s in sorted(sessions, key=lambda s: s.arrival_s)
              if len(s.rounds) >= 2 and s.rounds[0].tool is not None][:fit.sessions]
    if not picked:
        raise ValueError("the trace has no session with a tool wait between two turns")
    t0 = picked[0].arrival_s
    raw = []
    for s in picked:
        rounds = s.rounds[:fit.turns]
        raw.append((s, rounds, s.shared_prefix_tokens + sum(r.new_tokens for r in rounds)))
    budget = fit.max_context - fit.turns * (fit.output_tokens + fit.min_turn_tokens)
    out = []
    for i, (s, rounds, n) in enumerate(raw):
        scale = min(1.0, budget / n)
        prefix = int(s.shared_prefix_tokens * scale) // 32 * 32
        turns = []
        for k, r in enumerate(rounds):
            last = k == len(rounds) - 1 or r.tool is None or r.tool_wait_s is None
            tool, wait = (None, None) if last else _wait(r, calls, rng, fit)
            turns.append(LiveTurn(max(fit.min_turn_tokens, int(r.new_tokens * scale)), fit.output_tokens, tool, wait))
            if last:
                break
        arrival = ((s.arrival_s - t0) * fit.time_scale if fit.arrival_spread_s is None
                   else fit.arrival_spread_s * i / max(1, len(raw) - 1))
        out.append(LiveSession(f"s{i}", arrival, s.shared_prefix_id if prefix else None, prefix, tuple(turns)))
    return _trim(out, fit.max_context)


def _wait(r, calls, rng: random.Random, fit: Fit) -> tuple[str, float]:
    if calls:
        c = calls[rng.randrange(len(calls))]
        tool, w = str(c.tool), float(c.seconds)
    else:
        tool, w = str(r.tool), float(r.tool_wait_s) * fit.time_scale
    return tool, min(fit.max_wait_s, max(0.0, w))


def _trim(sessions: list[LiveSession], cap: int) -> list[LiveSession]:
    """Drop trailing turns of a session whose minimum-size turns still pass ``cap``."""
    out = []
    for s in sessions:
        turns = list(s.turns)
        while len(turns) > 2 and s.prefix_tokens + sum(t.new_tokens + t.output_tokens for t in turns) > cap:
            turns.pop()
        if turns and turns[-1].tool is not None:
            turns[-1] = LiveTurn(turns[-1].new_tokens, turns[-1].output_tokens, None, None)
        out.append(LiveSession(s.sid, s.arrival_s, s.prefix_id, s.prefix_tokens, tuple(turns)))
    return out


def token_ids(seed: int, owner: str, turn: int, n: int, vocab: int) -> list[int]:
    """``n`` token ids in [3, vocab), a pure function of the arguments."""
    r = random.Random(f"{seed}\x00{owner}\x00{turn}")
    return [r.randrange(3, vocab) for _ in range(n)]


def paused_working_set(sessions: Sequence[LiveSession]) -> int:
    """Tokens of every session's context at its longest pause, summed (each
    session's last pause: what a cache must hold to keep every trajectory)."""
    total = 0
    for s in sessions:
        ctx = s.prefix_tokens + sum(t.new_tokens + t.output_tokens for t in s.turns[:-1])
        total += ctx
    return total


def describe(sessions: Sequence[LiveSession], *, time_scale: float) -> dict:
    """The workload part of a live benchmark's JSON: counts, the paused working set
    in tokens, the longest context, every wait (sorted) and the time scale."""
    return {"sessions": len(sessions), "turns": sum(len(s.turns) for s in sessions),
            "resumes": sum(len(s.turns) - 1 for s in sessions),
            "paused_working_set_tokens": paused_working_set(sessions),
            "max_context_tokens": max(s.final_context() for s in sessions),
            "wait_s": sorted(t.wait_s for s in sessions for t in s.turns if t.wait_s is not None),
            "time_scale": time_scale}


def scale_times(sessions: Sequence[LiveSession], factor: float) -> list[LiveSession]:
    """``sessions`` with every arrival and tool wait multiplied by ``factor``
    (a scale model's wall seconds per target second).  Pure.  Raises
    ValueError for a factor that is not a positive number."""
    if not (factor > 0 and factor != float("inf")):
        raise ValueError(f"a time factor must be a positive number, got {factor!r}")
    return [LiveSession(s.sid, s.arrival_s * factor, s.prefix_id, s.prefix_tokens,
                        tuple(LiveTurn(t.new_tokens, t.output_tokens, t.tool,
                                       None if t.wait_s is None else t.wait_s * factor) for t in s.turns))
            for s in sessions]


def paused_contexts(sessions: Sequence[LiveSession]) -> list[int]:
    """Tokens of every session's context at each of its pauses (what a resume
    finds paused), in session and turn order."""
    out = []
    for s in sessions:
        ctx = s.prefix_tokens
        for t in s.turns[:-1]:
            ctx += t.new_tokens + t.output_tokens
            out.append(ctx)
    return out
