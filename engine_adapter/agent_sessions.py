"""Agent sessions for a live engine: contexts that grow turn by turn, tool waits
between turns, and the hints a harness would send.

A session's turn k sends its whole context so far (the first prompt, then
every turn's output and the tool's result appended), so its prompt extends
the previous one, as an agent's does.  Turns of different sessions
interleave (round-robin), so with an engine cache smaller than the sessions'
contexts a session's blocks are evicted while it waits on its tool.

``hints`` says what the requests carry: ``"tool"`` (kvtier's hint: the tool
the session will wait on and its trajectory), ``"session"`` (vLLM's
``session_id`` only) or ``"none"`` (nothing: kvtier finds the trajectory by
its prefix).  Token ids are drawn from a seeded generator, so two runs of one
script send identical prompts.
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

HINT_MODES = ("tool", "session", "none")
DEFAULT_TOOLS = (("pytest", 0.4), ("build", 1.2), ("web_search", 0.1))


@dataclass(frozen=True)
class Script:
    """The workload: ``sessions`` sessions of ``turns`` turns."""
    sessions: int = 4
    turns: int = 3
    first_tokens: int = 300
    tool_tokens: int = 60
    output_tokens: int = 8
    vocab: int = 1024
    seed: int = 0
    tools: Sequence[tuple[str, float]] = DEFAULT_TOOLS     # (name, wait in seconds) cycled per session

    def tool_of(self, session: int, turn: int) -> tuple[str, float]:
        return self.tools[(session + turn) % len(self.tools)]


@dataclass(frozen=True)
class TurnResult:
    session: str
    turn: int
    tool: str                   # the tool this turn waits on afterwards
    wait_s: float
    prompt_tokens: int
    cached_tokens: int
    tokens: tuple[int, ...]
    ttft_s: float


@dataclass
class _Session:
    sid: str
    context: list[int] = field(default_factory=list)


def params_for(mode: str, sid: str, tool: str, extra: Mapping[str, Any] | None = None) -> dict | None:
    """The ``kv_transfer_params`` of one request in hint mode ``mode``."""
    if mode == "tool":
        return {"kvtier": {"tool": tool, "trajectory_id": sid, **(extra or {})}}
    if mode == "session":
        return {"session_id": sid}
    if mode == "none":
        return None
    raise ValueError(f"hint mode must be one of {HINT_MODES}, got {mode!r}")


def run_script(engine: Any, script: Script, *, hints: str = "tool", time_scale: float = 0.0,
               on_turn: Callable[[TurnResult], None] | None = None,
               params: Callable[[str, int, str], Mapping[str, Any] | None] | None = None) -> list[TurnResult]:
    """Drive ``engine`` (a :class:`~kvtier.engine_adapter.vllm_inprocess.LiveEngine`) through
    ``script``; returns every turn's result in the order they ran.  With
    ``time_scale`` > 0 each round is followed by a sleep of the round's longest
    tool wait times ``time_scale`` (the pauses' wall-clock length).  ``params``
    (session, turn, tool) -> kv_transfer_params overrides the hint mode."""
    rng = random.Random(script.seed)
    sessions = [_Session(f"s{i}", [rng.randrange(3, script.vocab) for _ in range(script.first_tokens)])
                for i in range(script.sessions)]
    out: list[TurnResult] = []
    for turn in range(script.turns):
        longest = 0.0
        for i, s in enumerate(sessions):
            tool, wait = script.tool_of(i, turn)
            p = params(s.sid, turn, tool) if params is not None else params_for(hints, s.sid, tool)
            r = engine.generate(s.context, max_tokens=script.output_tokens, kv_transfer_params=p)
            tr = TurnResult(s.sid, turn, tool, wait, r.prompt_tokens, r.cached_tokens, r.tokens, r.ttft_s)
            out.append(tr)
            if on_turn is not None:
                on_turn(tr)
            s.context = s.context + list(r.tokens) + [rng.randrange(3, script.vocab)
                                                      for _ in range(script.tool_tokens)]
            longest = max(longest, wait)
        if time_scale > 0:
            time.sleep(longest * time_scale)
    return out
