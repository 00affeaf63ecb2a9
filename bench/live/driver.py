"""Sessions driven concurrently through one live engine, tool waits as real sleeps.

An event loop over sessions ordered by the wall-clock time their next turn is
ready: a session arrives at its ``arrival_s``, and after each turn it is
ready again when its tool wait (a real, already time-scaled wait) has passed.
The engine answers one request at a time, so a turn that is ready while
another runs queues behind it (that queueing is in the job completion time,
not in the turn's TTFT, which is the engine's own first-token latency).

Every turn's prompt is the session's whole context so far: its shared prefix,
each turn's new tokens and every earlier output (greedy, so the same on every
configuration unless a KV block came back wrong).
"""
from __future__ import annotations

import heapq
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from kvtier.bench.live.thread_cpu import TurnMeter
from kvtier.bench.live.workload import LiveSession, token_ids


@dataclass(frozen=True)
class TurnRecord:
    session: str
    turn: int
    ready_s: float            # when the turn was ready (seconds after the run's start)
    start_s: float            # when the engine took it
    end_s: float
    ttft_s: float             # the engine's first-token latency
    prompt_tokens: int
    cached_tokens: int
    tokens: tuple[int, ...]
    tool: str | None          # the tool the session then waits on
    kvtier_cpu_s: float | None = None   # CPU kvtier's threads ran during the turn (a TurnMeter's; None: not measured)
    engine_waits: int | None = None     # the engine-calling thread's voluntary context switches during it


@dataclass(frozen=True)
class RunRecord:
    turns: tuple[TurnRecord, ...]
    jct_s: dict[str, float]   # per session: last turn's end - arrival
    wall_s: float


def drive(engine: Any, sessions: Sequence[LiveSession], *, seed: int, vocab: int,
          params: Callable[[LiveSession, int], Mapping[str, Any] | None] = lambda s, k: None,
          clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
          meter: TurnMeter | None = None) -> RunRecord:
    """Run every session's turns on ``engine`` (``generate(prompt, max_tokens=,
    kv_transfer_params=)``); ``params(session, turn)`` is a turn's
    kv_transfer_params; ``meter``: what kvtier's threads cost each turn (an
    in-process engine's).  Returns every turn in the order it ran."""
    t0 = clock()
    ctx: dict[str, list[int]] = {}
    heap = [(s.arrival_s, i, 0) for i, s in enumerate(sessions)]
    heapq.heapify(heap)
    out: list[TurnRecord] = []
    done: dict[str, float] = {}
    while heap:
        ready, i, k = heapq.heappop(heap)
        s = sessions[i]
        now = clock() - t0
        if ready > now:
            sleep(ready - now)
        turn = s.turns[k]
        if k == 0:
            pre = token_ids(seed, s.prefix_id, -1, s.prefix_tokens, vocab) if s.prefix_id else []
            ctx[s.sid] = pre + token_ids(seed, s.sid, 0, turn.new_tokens, vocab)
        mark = meter.start() if meter is not None else None
        start = clock() - t0
        r = engine.generate(ctx[s.sid], max_tokens=turn.output_tokens, kv_transfer_params=params(s, k))
        end = clock() - t0
        cost = meter.stop(mark) if meter is not None else None
        out.append(TurnRecord(s.sid, k, ready, start, end, r.ttft_s, r.prompt_tokens, r.cached_tokens,
                              tuple(r.tokens), turn.tool, kvtier_cpu_s=cost.kvtier_cpu_s if cost else None,
                              engine_waits=cost.engine_waits if cost else None))
        if k + 1 < len(s.turns):
            ctx[s.sid] = ctx[s.sid] + list(r.tokens) + token_ids(seed, s.sid, k + 1, s.turns[k + 1].new_tokens, vocab)
            heapq.heappush(heap, (end + (turn.wait_s or 0.0), i, k + 1))
        else:
            done[s.sid] = end - s.arrival_s
            ctx.pop(s.sid, None)
    return RunRecord(tuple(out), done, clock() - t0)
