"""Harness request logs with known prefix breakers, for checking ``kvtier prefix``.

A log is built from agent sessions (per round: new and output tokens, the tool
and its wait; e.g. rebuilt from the Mooncake trace's prefix hash ids by
``bench.sim.convert``) as chat-completions requests::

    messages[0]  system: a fixed instruction ("Session started <ISO time>": the head's
                 volatile field, fixed for the session unless a breaker changes it)
    tools        three tool definitions
    then per round k: the tool result of round k-1 (k >= 1), the assistant's call of round k

Content is deterministic filler text (letters only, one character ~ one byte
token), ``new_tokens / scale`` characters per tool result.  A breaker injected
at turn k changes the session from k on (so only turn k breaks the prefix):

``head_volatile``  the system message's time changes;
``tools_changed``  a fourth tool is added;
``reordered``      every tool definition's keys are serialized in reverse order;
``compaction``     every message between the task and the last one is replaced by one
                   summary message.

``python -m kvtier.bench.prefix_logs --out DIR [--trace F] [--json]`` writes
``clean.jsonl``, ``broken.jsonl`` and ``truth.json`` ({trajectory: {turn: cause}}).
"""
from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Mapping, Sequence

BREAKERS = ("head_volatile", "tools_changed", "reordered", "compaction")

_WORDS = ("alpha", "bravo", "delta", "gamma", "kilo", "lima", "oscar", "papa", "sierra", "tango",
          "uniform", "victor", "whisky", "yankee", "zulu", "build", "patch", "test", "file", "line",
          "error", "trace", "module", "import", "return", "value", "result", "check", "diff", "commit")

_TOOLS = [
    {"type": "function", "function": {"name": "bash", "description": "Run a shell command",
                                      "parameters": {"type": "object", "properties": {
                                          "command": {"type": "string"}}, "required": ["command"]}}},
    {"type": "function", "function": {"name": "read_file", "description": "Read a file",
                                      "parameters": {"type": "object", "properties": {
                                          "path": {"type": "string"}}, "required": ["path"]}}},
    {"type": "function", "function": {"name": "edit_file", "description": "Replace text in a file",
                                      "parameters": {"type": "object", "properties": {
                                          "path": {"type": "string"}, "old": {"type": "string"},
                                          "new": {"type": "string"}}, "required": ["path", "old", "new"]}}},
]
_EXTRA_TOOL = {"type": "function", "function": {"name": "web_search", "description": "Search the web",
                                                "parameters": {"type": "object", "properties": {
                                                    "query": {"type": "string"}}, "required": ["query"]}}}


def filler(n: int, seed: str) -> str:
    """``n`` characters of deterministic words (no digits: nothing looks volatile)."""
    rng = random.Random(seed)
    out, size = [], 0
    while size < n:
        w = rng.choice(_WORDS)
        out.append(w)
        size += len(w) + 1
    return " ".join(out)[:max(1, n)]


def _reverse_keys(o):
    if isinstance(o, dict):
        return {k: _reverse_keys(o[k]) for k in reversed(list(o))}
    if isinstance(o, list):
        return [_reverse_keys(x) for x in o]
    return o


def _time(i: int) -> str:
    return f"2025-03-{1 + i % 28:02d}T{(i // 28) % 24:02d}:{i % 60:02d}:00Z"


def session_log(sid: str, rounds: Sequence[tuple[int, str | None, float | None]], *,
                inject: Mapping[int, str] | None = None, scale: float = 8.0, sys_seed: int = 0) -> list[dict]:
    """The log lines of one session.  ``rounds``: (new_tokens, tool, tool_wait_s) per round;
    ``inject``: turn -> breaker.  Raises ValueError for an unknown breaker or turn 0."""
    inject = dict(inject or {})
    for k, b in inject.items():
        if b not in BREAKERS:
            raise ValueError(f"unknown breaker {b!r}; known: {', '.join(BREAKERS)}")
        if not 1 <= k < len(rounds):
            raise ValueError(f"a breaker goes on a turn in 1..{len(rounds) - 1}, got {k}")
    t0 = sys_seed
    system = "You are a careful coding agent. Follow the repository's rules. " + filler(400, "sys")
    tools = [dict(t) for t in _TOOLS]
    history: list[dict] = [{"role": "user", "content": "Task: " + filler(200, f"{sid}/task")}]
    out = []
    prev_wait = None
    for k, (new, tool, wait) in enumerate(rounds):
        b = inject.get(k)
        if b == "head_volatile":
            t0 += 1000
        elif b == "tools_changed":
            tools = tools + [_EXTRA_TOOL]
        elif b == "reordered":
            tools = _reverse_keys(tools)
        elif b == "compaction":
            summary = {"role": "user", "content": "Summary of earlier work: " + filler(120, f"{sid}/sum{k}")}
            history = [history[0], summary] + history[-1:]
        if k > 0:
            history.append({"role": "tool", "tool_call_id": f"c{k - 1}",
                            "content": filler(max(1, int(new / scale)), f"{sid}/{k}")})
        msgs = [{"role": "system", "content": f"Session started {_time(t0)}. " + system}] + history
        out.append({"trajectory_id": sid, "request": {"model": "agent", "messages": msgs, "tools": tools},
                    **({"tool_wait_s": prev_wait} if prev_wait is not None else {})})
        name = tool or "bash"
        history = history + [{"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{k}", "type": "function",
             "function": {"name": name, "arguments": json.dumps({"command": filler(40, f"{sid}/cmd{k}")})}}]}]
        prev_wait = wait
    return out


def plan_breakers(ids: Sequence[str], turns: Mapping[str, int], seed: int = 0,
                  every: int = 2) -> dict[str, dict[int, str]]:
    """One breaker in every ``every``-th session with at least 3 turns, cycling through
    :data:`BREAKERS`, at a turn drawn in 2..n-1 (seeded)."""
    rng = random.Random(seed)
    plan: dict[str, dict[int, str]] = {}
    j = 0
    for i, sid in enumerate(ids):
        n = turns[sid]
        if n < 3 or i % every:
            continue
        plan[sid] = {rng.randrange(2, n): BREAKERS[j % len(BREAKERS)]}
        j += 1
    return plan


def build_logs(sessions, *, seed: int = 0, scale: float = 8.0, every: int = 2,
               min_rounds: int = 3) -> tuple[list[dict], list[dict], dict]:
    """(clean lines, broken lines, truth) from agent-trace sessions (``bench.sim.trace.Session``)."""
    chosen = [s for s in sessions if len(s.rounds) >= min_rounds]
    turns = {s.id: len(s.rounds) for s in chosen}
    plan = plan_breakers([s.id for s in chosen], turns, seed, every)
    clean, broken = [], []
    for s in chosen:
        rounds = [(r.new_tokens, r.tool, r.tool_wait_s) for r in s.rounds]
        clean += session_log(s.id, rounds, scale=scale)
        broken += session_log(s.id, rounds, inject=plan.get(s.id), scale=scale)
    return clean, broken, {sid: {str(k): b for k, b in p.items()} for sid, p in plan.items()}


def _interleave(lines: list[dict]) -> list[dict]:
    """Round-robin over trajectories (a log of concurrent sessions), each in its own order."""
    by: dict[str, list[dict]] = {}
    for ln in lines:
        by.setdefault(ln["trajectory_id"], []).append(ln)
    out, k = [], 0
    while any(k < len(v) for v in by.values()):
        out += [v[k] for v in by.values() if k < len(v)]
        k += 1
    return out


def main(argv=None) -> int:
    from kvtier.bench.script import run_script
    p = argparse.ArgumentParser(prog="python -m kvtier.bench.prefix_logs", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="folder for clean.jsonl, broken.jsonl, truth.json")
    p.add_argument("--trace", default=None, help="Mooncake trace (default: ../shared/traces/mooncake/"
                                                  "conversation_trace.jsonl)")
    p.add_argument("--sessions", type=int, default=40, help="sessions with >= 3 rounds to use")
    p.add_argument("--scale", type=float, default=8.0, help="trace tokens per generated character")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")

    def run(a) -> dict:
        from kvtier.bench.sim.convert import convert_mooncake, default_traces_dir
        path = a.trace or default_traces_dir() / "mooncake" / "conversation_trace.jsonl"
        conv = convert_mooncake(path, seed=a.seed)
        multi = [s for s in conv.sessions if len(s.rounds) >= 3][:a.sessions]
        clean, broken, truth = build_logs(multi, seed=a.seed, scale=a.scale)
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        for name, lines in (("clean.jsonl", clean), ("broken.jsonl", broken)):
            with open(out / name, "w", encoding="utf-8") as fh:
                for ln in _interleave(lines):
                    fh.write(json.dumps(ln) + "\n")
        (out / "truth.json").write_text(json.dumps(truth, indent=1))
        return {"trace": str(path), "sessions": len(multi), "calls": len(clean),
                "injected": sum(len(v) for v in truth.values()), "out": str(out)}

    return run_script("prefix_logs", p, run, lambda d: print(json.dumps(d, indent=2)), argv)


if __name__ == "__main__":
    raise SystemExit(main())
