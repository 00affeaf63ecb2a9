"""The checked workload: agent sessions whose contexts grow turn by turn, with tool waits, driven
over HTTP; every answer compared with a recompute of the same prompt.

The reference for a turn is the same engine's greedy output for the same prompt sent with a
``cache_salt`` never used before: vLLM folds the salt into every block hash, so no block of that
request can come from the engine's cache or from kvtier, and its output is a recompute from the
prompt alone.  A KV block that came back wrong from any tier changes the agent's output and
not the reference's.  (The same engine and config as the agent turn; no second engine to start.)

Sessions never run out: session ``i``'s shape is a pure function of (seed, i), and a finished
session is replaced by the next one.  One thread drives them (``run`` until ``stop`` is set).
"""
from __future__ import annotations

import heapq
import random
import threading
import time
from dataclasses import dataclass
from typing import Callable

from kvtier.bench.live.http_engine import HttpEngine, ServerError
from kvtier.bench.live.workload import LiveSession, LiveTurn, token_ids

TOOLS = ("pytest", "edit", "grep", "bash", "web")


def make_session(seed: int, i: int, *, max_context: int, turns: int = 5, output_tokens: int = 8,
                 shared_prefixes: int = 2) -> LiveSession:
    """Session ``i``: a shared prefix (one of ``shared_prefixes``), then ``turns`` turns of 32-160
    new tokens each, waits of 0.5-4 s; its final context fits ``max_context``."""
    r = random.Random(f"{seed}/session/{i}")
    prefix = 64 * r.randrange(1, 4)
    budget = max_context - prefix
    ts = []
    for k in range(turns):
        new = r.randrange(32, 161)
        if budget - new - output_tokens < 0:
            break
        budget -= new + output_tokens
        ts.append(LiveTurn(new, output_tokens, r.choice(TOOLS), round(r.uniform(0.5, 4.0), 2)))
    if len(ts) < 2:
        raise ValueError(f"max_context {max_context} is too small for a session of two turns")
    ts[-1] = LiveTurn(ts[-1].new_tokens, output_tokens, None, None)
    return LiveSession(f"s{i}", 0.0, f"p{r.randrange(shared_prefixes)}", prefix, tuple(ts))


@dataclass(frozen=True)
class Turn:
    t_s: float            # end of the turn, seconds after the soak's start
    session: str
    turn: int
    ttft_s: float
    prompt_tokens: int
    cached_tokens: int
    correct: bool


@dataclass(frozen=True)
class Failure:
    t_s: float
    session: str
    turn: int
    at_engine_stop: bool   # the engine was being stopped by a fault while the request ran
    message: str


class Agents:
    """``concurrent`` sessions at a time against ``url``.  ``engine_stopping``: set by the faults
    thread while a fault holds the engine down.  Results in ``turns`` and ``failures`` (appended
    by the agents thread; read them after :meth:`run` returns)."""

    def __init__(self, url: str, *, seed: int, vocab: int, max_context: int, concurrent: int,
                 engine_stopping: threading.Event, t0: float, timeout_s: float = 120.0) -> None:
        self.url, self.seed, self.vocab, self.max_context = url, seed, vocab, max_context
        self.concurrent, self.engine_stopping, self.t0, self.timeout_s = concurrent, engine_stopping, t0, timeout_s
        self.turns: list[Turn] = []
        self.failures: list[Failure] = []
        self._ref = 0

    def _now(self) -> float:
        return time.monotonic() - self.t0

    def _reference(self, prompt: list[int], n: int, stop: threading.Event) -> tuple[int, ...] | None:
        while not stop.is_set():
            self._ref += 1
            try:
                eng = HttpEngine(self.url, timeout_s=self.timeout_s, cache_salt=f"soak-ref-{self.seed}-{self._ref}")
                return tuple(eng.generate(prompt, max_tokens=n).tokens)
            except ServerError:
                time.sleep(1.0)
        return None

    def run(self, stop: threading.Event, on_turn: Callable[[Turn], None] = lambda t: None) -> None:
        eng = HttpEngine(self.url, timeout_s=self.timeout_s)
        heap = []
        ctx: dict[str, list[int]] = {}
        sessions: dict[str, LiveSession] = {}
        nxt = 0
        for _ in range(self.concurrent):
            s = make_session(self.seed, nxt, max_context=self.max_context)
            sessions[s.sid] = s
            heap.append((self._now(), nxt, s.sid, 0))
            nxt += 1
        heapq.heapify(heap)
        while heap and not stop.is_set():
            ready, order, sid, k = heapq.heappop(heap)
            if ready > self._now():
                if stop.wait(ready - self._now()):
                    break
            s, turn = sessions[sid], sessions[sid].turns[k]
            if k == 0 and sid not in ctx:
                ctx[sid] = (token_ids(self.seed, s.prefix_id, -1, s.prefix_tokens, self.vocab)
                            + token_ids(self.seed, sid, 0, turn.new_tokens, self.vocab))
            hint = {"kvtier": {"tool": turn.tool or "final", "trajectory_id": f"{self.seed}-{sid}"}}
            stopping = self.engine_stopping.is_set()
            try:
                r = eng.generate(ctx[sid], max_tokens=turn.output_tokens, kv_transfer_params=hint)
            except ServerError as exc:
                self.failures.append(Failure(self._now(), sid, k, stopping or self.engine_stopping.is_set(),
                                             str(exc)[:300]))
                heapq.heappush(heap, (self._now() + 1.0, order, sid, k))
                continue
            ref = self._reference(ctx[sid], turn.output_tokens, stop)
            if ref is None:
                break
            rec = Turn(self._now(), sid, k, r.ttft_s, r.prompt_tokens, r.cached_tokens, tuple(r.tokens) == ref)
            self.turns.append(rec)
            on_turn(rec)
            if k + 1 < len(s.turns):
                ctx[sid] = ctx[sid] + list(r.tokens) + token_ids(self.seed, sid, k + 1, s.turns[k + 1].new_tokens,
                                                                 self.vocab)
                heapq.heappush(heap, (self._now() + (turn.wait_s or 0.0), order, sid, k + 1))
            else:
                ctx.pop(sid, None)
                sessions.pop(sid, None)
                s2 = make_session(self.seed, nxt, max_context=self.max_context)
                sessions[s2.sid] = s2
                heapq.heappush(heap, (self._now(), nxt, s2.sid, 0))
                nxt += 1
