"""Converters from public traces to the agent trace (see :mod:`kvtier.bench.sim.trace`).

Mooncake FAST'25 (``../shared/traces/mooncake/*.jsonl``): one line per request,
``{"timestamp" ms, "input_length", "output_length", "hash_ids"}`` where
``hash_ids`` are *prefix* hashes of 512-token blocks (equal id at position i
means an equal prefix up to block i).  Sessions are rebuilt from them:

* a request continues the session of the latest request holding its longest
  matching block ``h[j]`` with ``j >= 1`` (the universal block 0 alone, a
  system prompt every request shares, links nothing), provided the match
  covers every full block of that session's previous request; a partial
  match is a fork, which starts a new session (the format has no branches);
* block 0 becomes the shared prefix (``shared_prefix_id = "mooncake-b0"``,
  512 tokens); round k's ``new_tokens`` is its input minus the context the
  format implies (shared prefix + all earlier new and output tokens), at
  least 1 (``stats["context_overstated"]`` counts rounds whose real input
  was shorter than that context);
* round 0 arrives at its timestamp (times ``time_scale``); the waits between
  rounds are drawn from the real tool-latency aggregates
  (:class:`kvtier.bench.sim.synth.ToolWaitSampler`, seeded), or with
  ``waits="gaps"`` are the trace's own inter-request gaps (think time plus
  the previous response: an upper bound on a tool wait), named ``user``.

TraceLab round rows (``../shared/traces/tracelab/*round_trace.jsonl``): one
line per LLM round with token accounting, tool calls (``emitted_at``,
``result_at``) and timing events.  A round's tool is its longest-running
call and the wait spans first emission to last result (calls may run in
parallel); a round without tools followed by a user message is a ``human``
wait (last event of the round to the user message).  Round 0's cached
prefix becomes the shared prefix.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from kvtier.bench.sim.synth import ToolWaitSampler
from kvtier.bench.sim.trace import (ON_ERROR_CHOICES, Session, TraceError, TraceProblem, iter_json_lines,
                             make_session)

MOONCAKE_BLOCK_TOKENS = 512
WAIT_SOURCES = ("aggregate", "gaps")


@dataclass(frozen=True)
class Conversion:
    """Sessions built by a converter, what it noticed, and the lines it skipped."""

    sessions: tuple[Session, ...]
    stats: dict = field(default_factory=dict)
    problems: tuple[TraceProblem, ...] = ()


def default_traces_dir() -> Path:
    """The trace directory: ``$KVTIER_TRACES`` or ``../shared/traces`` (see :func:`kvtier.env.traces_dir`)."""
    from kvtier.env import traces_dir
    return traces_dir()


def _check_on_error(on_error: str) -> None:
    if on_error not in ON_ERROR_CHOICES:
        raise ValueError(f"on_error must be one of {', '.join(ON_ERROR_CHOICES)}, got {on_error!r}")


def _read_jsonl(path: str | Path, on_error: str, validate) -> tuple[list[tuple[int, dict]], list[TraceProblem]]:
    problems: list[TraceProblem] = []

    def checked(obj: dict, no: int) -> dict:
        validate(obj, no)
        return obj

    with open(path, "r", encoding="utf-8") as fh:
        rows = list(iter_json_lines(fh, None if on_error == "stop" else problems, checked))
    return rows, problems


def _mooncake_validate(obj: dict, no: int) -> None:
    for k in ("timestamp", "input_length", "output_length"):
        v = obj.get(k)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or v != v:
            raise TraceError(f"{k} must be a number >= 0, got {v!r}", no)
    h = obj.get("hash_ids")
    if not isinstance(h, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in h):
        raise TraceError("hash_ids must be a list of integers", no)
    if obj["input_length"] < 1:
        raise TraceError("input_length must be >= 1", no)


def convert_mooncake(path: str | Path, *, seed: int = 0, time_scale: float = 1.0,
                     max_sessions: int | None = None, waits: str = "aggregate",
                     on_error: str = "stop") -> Conversion:
    """Rebuild multi-turn sessions from a Mooncake FAST'25 trace.  Deterministic for a seed.

    Raises TraceError (``on_error="stop"``) on a malformed line, ValueError
    on bad arguments, OSError if the file cannot be read.
    """
    _check_on_error(on_error)
    if waits not in WAIT_SOURCES:
        raise ValueError(f"waits must be one of {', '.join(WAIT_SOURCES)}, got {waits!r}")
    if not (time_scale > 0 and time_scale < float("inf")):
        raise ValueError(f"time_scale must be a positive number, got {time_scale}")
    if max_sessions is not None and max_sessions < 1:
        raise ValueError(f"max_sessions must be >= 1, got {max_sessions}")
    rows, problems = _read_jsonl(path, on_error, _mooncake_validate)
    rows.sort(key=lambda r: (r[1]["timestamp"], r[0]))   # stable: file order breaks ties

    owner: dict[int, int] = {}           # block id -> session index holding it most recently
    groups: list[list[dict]] = []        # per session, its requests in order
    forks = 0
    for _, req in rows:
        h = req["hash_ids"]
        s = None
        for j in range(len(h) - 1, 0, -1):
            o = owner.get(h[j])
            if o is not None:
                prev = groups[o][-1]["hash_ids"]
                if j + 1 >= len(prev) - 1:       # covers the previous request's full blocks
                    s = o
                else:
                    forks += 1
                break
        if s is None:
            groups.append([req])
            s = len(groups) - 1
        else:
            groups[s].append(req)
        for b in h:
            owner[b] = s

    rng = random.Random(seed)
    sampler = ToolWaitSampler(rng)
    sessions: list[Session] = []
    overstated = 0
    t0 = rows[0][1]["timestamp"] if rows else 0
    width = len(str(max(1, len(groups) - 1)))
    for i, reqs in enumerate(groups):
        if max_sessions is not None and len(sessions) >= max_sessions:
            break
        first = reqs[0]
        shared = min(MOONCAKE_BLOCK_TOKENS, int(first["input_length"]) - 1) \
            if first["hash_ids"] and first["hash_ids"][0] == 0 else 0
        steps = []
        ctx = shared
        for k, req in enumerate(reqs):
            inp, out = int(req["input_length"]), int(req["output_length"])
            new = inp - ctx
            if new < 1:
                overstated += 1
                new = 1
            ctx += new + out
            if k + 1 < len(reqs):
                if waits == "aggregate":
                    tool, wait = sampler.draw()
                else:
                    tool, wait = "user", (reqs[k + 1]["timestamp"] - req["timestamp"]) / 1000.0 * time_scale
            else:
                tool, wait = None, None
            steps.append((new, max(0, out), tool, wait))
        arrival = (first["timestamp"] - t0) / 1000.0 * time_scale
        sessions.append(make_session(f"mc{i:0{width}d}", arrival, steps,
                                     shared_prefix_id="mooncake-b0" if shared else None,
                                     shared_prefix_tokens=shared))
    stats = {"requests": len(rows), "sessions": len(sessions),
             "multi_round_sessions": sum(1 for s in sessions if len(s.rounds) > 1),
             "forks_started_new_session": forks, "context_overstated": overstated,
             "skipped_lines": len(problems), "waits": waits, "seed": seed, "time_scale": time_scale}
    return Conversion(tuple(sessions), stats, tuple(problems))


def _ts(s: str) -> float:
    return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


def _tracelab_validate(obj: dict, no: int) -> None:
    sid = obj.get("session_id")
    if not isinstance(sid, str) or not sid:
        raise TraceError("session_id must be a non-empty string", no)
    for k in ("round_index", "input_tokens_total", "output_tokens"):
        v = obj.get(k)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise TraceError(f"{k} must be an integer >= 0, got {v!r}", no)
    ev = obj.get("timing_events")
    if not isinstance(ev, list) or not ev:
        raise TraceError("timing_events must be a non-empty list", no)
    try:
        for e in ev:
            _ts(e["timestamp"])
        for t in obj.get("tools") or []:
            _ts(t["emitted_at"])
            if t.get("result_at") is not None:
                _ts(t["result_at"])
            if not isinstance(t.get("tool_name"), str):
                raise TypeError("tool_name")
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise TraceError(f"bad timing data ({type(exc).__name__}: {exc})", no) from None


def convert_tracelab(path: str | Path, *, on_error: str = "stop") -> Conversion:
    """Convert TraceLab round rows.  Duplicate (session, round) rows: the first wins.

    Raises TraceError (``on_error="stop"``) on a malformed line, OSError if unreadable.
    """
    _check_on_error(on_error)
    rows, problems = _read_jsonl(path, on_error, _tracelab_validate)
    by: dict[str, dict[int, dict]] = {}
    dups = 0
    for no, r in rows:
        d = by.setdefault(r["session_id"], {})
        if r["round_index"] in d:
            dups += 1
            continue
        d[r["round_index"]] = r
    t0 = min((_ts(r["timing_events"][0]["timestamp"]) for _, r in rows), default=0.0)
    sessions: list[Session] = []
    gaps = 0
    overstated = 0
    for n, (sid, d) in enumerate(sorted(by.items())):
        ks = sorted(d)
        if ks != list(range(len(ks))):
            gaps += 1
            ks = ks[:next((i for i, k in enumerate(ks) if k != i), len(ks))]
        rs = [d[k] for k in ks]
        shared = int(rs[0].get("prefix_tokens") or 0)
        shared = min(shared, int(rs[0]["input_tokens_total"]) - 1) if shared > 0 else 0
        steps = []
        ctx = shared
        for k, r in enumerate(rs):
            new = int(r["input_tokens_total"]) - ctx
            if new < 1:
                overstated += 1
                new = 1
            out = int(r["output_tokens"])
            ctx += new + out
            tool = wait = None
            if k + 1 < len(rs):
                calls = [t for t in (r.get("tools") or []) if t.get("result_at")]
                if calls:
                    start = min(_ts(t["emitted_at"]) for t in calls)
                    end = max(_ts(t["result_at"]) for t in calls)
                    longest = max(calls, key=lambda t: _ts(t["result_at"]) - _ts(t["emitted_at"]))
                    tool, wait = longest["tool_name"], max(0.0, end - start)
                else:
                    last = max(_ts(e["timestamp"]) for e in r["timing_events"])
                    nxt = _ts(rs[k + 1]["timing_events"][0]["timestamp"])
                    tool, wait = "human", max(0.0, nxt - last)
            steps.append((new, out, tool, wait))
        provider = str(rs[0].get("provider") or "tracelab")
        arrival = _ts(rs[0]["timing_events"][0]["timestamp"]) - t0
        sessions.append(make_session(f"tl{n}-{provider}", arrival, steps,
                                     shared_prefix_id=f"tracelab-{provider}-{shared}" if shared else None,
                                     shared_prefix_tokens=shared))
    stats = {"rows": len(rows), "sessions": len(sessions), "duplicate_rows": dups,
             "sessions_truncated_at_missing_round": gaps, "context_overstated": overstated,
             "skipped_lines": len(problems)}
    return Conversion(tuple(sessions), stats, tuple(problems))

