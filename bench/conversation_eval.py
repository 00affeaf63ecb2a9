"""Forecast quality of tool names learned from chat traffic, against the unhinted class.

Each held-out source of :mod:`kvtier.bench.predictor_eval` (the same per-call
waits, grouped into their trajectories) is replayed as OpenAI chat traffic on
a trace clock, one trajectory after another in file order::

    request  [system, user, (assistant tool_calls, tool result)*]   (tools: the source's tool names)
    response assistant tool_calls [{name: the call's tool}]   (JSON, or SSE in small pieces: every
             other response is streamed)
    wait     the call's measured duration, then the next request carries its result
    last     a response that calls no tool (the trajectory's end)

through :class:`~kvtier.tiering.conversation.ConversationHints`, which names
the trajectory, forecasts the hint's tool, parses the responses and learns
each true tool's waits from the traffic (its predictor).  Every pause is
scored prequentially (quantiles taken when its response ends, before its wait
is learned; fresh predictors per source) five ways:

    unhinted      one class for every pause (the engine's ``default_tool``)
    learned       the hint's tool as forecast at request time, learned under that label
                  (an engine told only the hint: it learns the wait under the tool it was told)
    learned_true  the same forecast label, asked of the router's predictor, which
                  learns under the true tool (a lifecycle that relabels its waits with
                  the parsed tool without re-planning)
    replanned     the forecast, corrected by the router's retag once it lands: the
                  pause is planned, and its wait learned, on the true tool, unless the
                  retag lands after the next request (then on the forecast, as ``learned``)
    true_tool     the tool the response names (what a hint-sending agent gives)

The retag's timing: the router asks :meth:`ConversationHints.retag` as the name is
parsed (a streamed response's bytes pass evenly over its ``GENERATION_S``, so the
name is known when the piece completing it passes; a JSON response's at its end)
and the retag lands ``retag_latency_s`` later (an HTTP request and an engine step).

Metrics: :class:`~kvtier.bench.predictor_eval.Score` (pinball over p10/p50/p90
in seconds and on ln seconds, [p10, p90] coverage), and paired per-pause
differences of pinball loss with their standard errors.  Pure: no I/O but
reading the traces.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

from kvtier.bench.predictor_eval import (QUANTILES, Score, _csv_rows, _duration, _jsonl_objects, _quantiles_of,
                                         pinball)

MODELS = ("unhinted", "learned", "learned_true", "replanned", "true_tool")
UNHINTED = "unhinted"          # the engine's default_tool
GENERATION_S = 0.5             # trace seconds from a request to its response's end (no effect on waits)
RETAG_LATENCY_S = 0.05         # from the parsed name to the retag applied in the engine's lifecycle
PAIRS = (("learned", "unhinted"), ("learned_true", "unhinted"), ("replanned", "unhinted"),
         ("true_tool", "unhinted"), ("learned", "true_tool"), ("replanned", "true_tool"))


@dataclass(frozen=True)
class Session:
    """One trajectory: its calls in order, (tool, seconds)."""

    name: str
    calls: tuple[tuple[str, float], ...]


@dataclass(frozen=True)
class Source:
    name: str
    path: str
    sessions: tuple[Session, ...]


def _grouped(rows: Iterable[tuple[str, str, float]]) -> tuple[Session, ...]:
    """(session, tool, seconds) rows in file order -> sessions in order of first appearance."""
    out: dict[str, list[tuple[str, float]]] = {}
    for sid, tool, s in rows:
        out.setdefault(sid, []).append((tool or "unknown", s))
    return tuple(Session(k, tuple(v)) for k, v in out.items())


def load_sources(traces: Path) -> list[Source]:
    """The sources of :func:`~kvtier.bench.predictor_eval.load_datasets` present under
    ``traces``, by trajectory (the same calls, the same order).  Raises ValueError
    when none is there, or naming the file and line of a malformed row."""
    out = []
    p = traces / "swe_agent" / "swe_agent_demo_step_exec_times.csv"
    if p.is_file():
        out.append(Source("swe_agent", "swe_agent/swe_agent_demo_step_exec_times.csv", _grouped(
            (r["traj_path"], r["action_head"], _duration(r["execution_time_s"], w))
            for w, r in _csv_rows(p, ("traj_path", "action_head", "execution_time_s")))))
    p = traces / "continuum" / "swe_smith_5traj_tool_durations.csv"
    if p.is_file():
        out.append(Source("swe_smith", "continuum/swe_smith_5traj_tool_durations.csv", _grouped(
            (r["traj_id"], r["tool"], _duration(r["execution_time_seconds"], w))
            for w, r in _csv_rows(p, ("traj_id", "tool", "execution_time_seconds")))))
    p = traces / "tracelab" / "example_sanitized_round_trace.jsonl"
    if p.is_file():
        rows = sorted(_jsonl_objects(p), key=lambda r: (str(r.get("session_id")), r.get("round_index", 0)))
        out.append(Source("tracelab_sample", "tracelab/example_sanitized_round_trace.jsonl", _grouped(
            (str(r.get("session_id")), str(t["tool_name"]),
             _duration(t["tool_wall_latency_ms"], f"{p}: session {r.get('session_id')}", 1e-3))
            for r in rows for t in sorted(r.get("tools") or [], key=lambda t: t.get("tool_index", 0))
            if t.get("tool_wall_latency_ms") is not None and t.get("tool_name"))))
    out = [s for s in out if any(x.calls for x in s.sessions)]
    if not out:
        raise ValueError(f"no tool durations by trajectory found under {traces} "
                         "(expected swe_agent/, continuum/ or tracelab/ files; set --traces)")
    return out


# --------------------------------------------------------------------------- the traffic
def _tool_call(call_id: str, tool: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": tool, "arguments": "{}"}}


def _json_response(call_id: str, tool: str | None, tokens: int) -> dict:
    msg = {"role": "assistant", "content": None if tool else "done",
           **({"tool_calls": [_tool_call(call_id, tool)]} if tool else {})}
    return {"id": "r", "object": "chat.completion",
            "choices": [{"index": 0, "message": msg, "finish_reason": "tool_calls" if tool else "stop"}],
            "usage": {"total_tokens": tokens}}


def _sse_response(call_id: str, tool: str | None, tokens: int) -> bytes:
    """The response as server-sent events; a tool's name arrives in two fragments."""
    def chunk(delta: dict, finish: str | None = None) -> dict:
        return {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    events = [chunk({"role": "assistant"})]
    if tool:
        half = max(1, len(tool) // 2)
        events += [chunk({"tool_calls": [{"index": 0, "id": call_id, "type": "function",
                                          "function": {"name": tool[:half], "arguments": ""}}]}),
                   chunk({"tool_calls": [{"index": 0, "function": {"name": tool[half:]}}]}),
                   chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}),
                   chunk({}, "tool_calls")]
    else:
        events += [chunk({"content": "done"}), chunk({}, "stop")]
    events.append({"object": "chat.completion.chunk", "choices": [], "usage": {"total_tokens": tokens}})
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"


@dataclass(frozen=True)
class Pause:
    """One scored pause: its true tool, the hint's forecast, the wait, and each model's p10/p50/p90;
    ``retag``: the retag's landing in seconds after the pause started (negative: before it; None:
    none was needed)."""

    tool: str
    forecast: str | None
    wait_s: float
    qs: dict[str, tuple[float, float, float]]
    retag: float | None = None


def replay(source: Source, make_predictor: Callable[[], object] | None = None, *,
           piece_bytes: int = 37, retag_latency_s: float = RETAG_LATENCY_S) -> tuple[list[Pause], dict]:
    """Replay ``source`` through a fresh ConversationHints; its scored pauses and
    the component's stats.  ``make_predictor``: the wait predictor of every model
    (default ToolWaitPredictor).  Raises AssertionError if the component reads the
    traffic wrong (a pause's parsed tool or learned wait differs from the trace, or
    it asks for a retag other than the one the pause needs)."""
    from kvtier.tiering.conversation import ConversationHints
    from kvtier.tiering.forecasting.predictor import ToolWaitPredictor
    make = make_predictor or ToolWaitPredictor
    unhinted, told, router, engine = make(), make(), make(), make()
    hints = ConversationHints(router, clock=lambda: 0.0)
    names = sorted({tool for s in source.sessions for tool, _ in s.calls})
    tools = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}} for n in names]
    now = 0.0
    pauses: list[Pause] = []
    for k, session in enumerate(source.sessions):
        msgs: list[dict] = [{"role": "system", "content": f"You are a coding agent ({source.name})."},
                            {"role": "user", "content": f"Solve {session.name}."}]
        open_: tuple[str, str, tuple[str, float], dict, float | None] | None = None
        for i, step in enumerate([*session.calls, None]):
            body = {"model": "replay", "messages": list(msgs), "tools": tools, "stream": i % 2 == 1}
            fwd = hints.on_request(body, now)
            if open_ is not None:
                label, _, (tool, secs), qs, landed = open_
                obs = fwd.observed
                assert obs is not None and obs.tool == tool and math.isclose(obs.wait_s, secs, abs_tol=1e-6), \
                    f"{source.name}/{session.name} step {i}: learned {obs} for {tool} {secs}"
                pauses.append(Pause(tool, obs.forecast, obs.wait_s, qs, landed))
                unhinted.observe(UNHINTED, obs.wait_s)
                told.observe(label, obs.wait_s)
                # the engine learns under the tool the pause has at its resume
                engine.observe(tool if landed is None or landed < obs.wait_s else label, obs.wait_s)
            tool = step[0] if step is not None else None
            call_id = f"call_{k}_{i}"
            tokens = 200 * (i + 1)
            retag, named_at = None, GENERATION_S          # seconds after the request
            if body["stream"]:
                watch = hints.stream(fwd.trajectory_id)
                data = _sse_response(call_id, tool, tokens)
                for j in range(0, len(data), piece_bytes):
                    if watch.feed(data[j:j + piece_bytes]) and retag is None:
                        named_at = GENERATION_S * min(len(data), j + piece_bytes) / len(data)
                        retag = hints.retag(fwd.trajectory_id)
                started = watch.end(now + GENERATION_S)
            else:
                started = hints.on_response(fwd.trajectory_id, _json_response(call_id, tool, tokens),
                                            now + GENERATION_S)
            now += GENERATION_S
            assert started is not None and started.tool == tool, f"{source.name}: parsed {started} for {tool}"
            retag = retag or hints.retag(fwd.trajectory_id)
            if step is None:
                break
            label = (fwd.hint or {}).get("kvtier", {}).get("tool") or UNHINTED
            told_tool = (fwd.hint or {}).get("kvtier", {}).get("tool")
            assert (retag is None) == (told_tool == tool) and (retag is None or retag.tool == tool), \
                f"{source.name}: retag {retag} for {tool} forecast {told_tool}"
            landed = None if retag is None else named_at - GENERATION_S + retag_latency_s
            planned_on = tool if landed is not None and landed < step[1] else label   # the engine's plan's label
            qs = {"unhinted": _quantiles_of(unhinted, UNHINTED, None), "learned": _quantiles_of(told, label, None),
                  "learned_true": _quantiles_of(router, label, None),
                  "replanned": _quantiles_of(engine, planned_on, None),
                  "true_tool": _quantiles_of(router, tool, None)}
            open_ = (label, call_id, step, qs, landed)
            now += step[1]
            msgs += [{"role": "assistant", "content": None, "tool_calls": [_tool_call(call_id, tool)]},
                     {"role": "tool", "tool_call_id": call_id, "content": f"output of {tool}"}]
    return pauses, hints.stats()


# --------------------------------------------------------------------------- scoring
def _losses(y: float, qs: Sequence[float]) -> tuple[float, float]:
    """This pause's pinball loss, mean over QUANTILES, in seconds and on ln seconds (as Score)."""
    s = sum(pinball(y, v, q) for q, v in zip(QUANTILES, qs)) / len(QUANTILES)
    ly = math.log(max(y, 1e-3))
    lg = sum(pinball(ly, math.log(max(v, 1e-3)), q) for q, v in zip(QUANTILES, qs)) / len(QUANTILES)
    return s, lg


def _mean_se(xs: Sequence[float]) -> dict:
    n = len(xs)
    if n == 0:
        return {"n": 0, "mean": None, "se": None}
    m = sum(xs) / n
    var = sum((x - m) ** 2 for x in xs) / (n - 1) if n > 1 else 0.0
    return {"n": n, "mean": m, "se": math.sqrt(var / n)}


def score(pauses: Sequence[Pause]) -> dict:
    """Scores of ``pauses``: per model, paired differences (a - b: negative, a is better),
    how often the forecast named the true tool, and the models on the pauses it missed."""
    models = {m: Score() for m in MODELS}
    loss = {m: [_losses(p.wait_s, p.qs[m]) for p in pauses] for m in MODELS}
    for p in pauses:
        for m in MODELS:
            models[m].add(p.wait_s, p.qs[m])
    paired = {f"{a}-{b}": {"pinball_s": _mean_se([x[0] - y[0] for x, y in zip(loss[a], loss[b])]),
                           "pinball_log": _mean_se([x[1] - y[1] for x, y in zip(loss[a], loss[b])])}
              for a, b in PAIRS}
    wrong = [i for i, p in enumerate(pauses) if p.forecast != p.tool]
    return {"pauses": len(pauses), "models": {m: s.to_dict() for m, s in models.items()}, "paired": paired,
            "forecast_accuracy": (len(pauses) - len(wrong)) / len(pauses) if pauses else None,
            "unforecast": sum(p.forecast is None for p in pauses),
            "retags": {"sent": sum(p.retag is not None for p in pauses),
                       "before_pause": sum(p.retag is not None and p.retag <= 0 for p in pauses),
                       "too_late": sum(p.retag is not None and p.retag >= p.wait_s for p in pauses)},
            "wrong_forecasts": {"n": len(wrong), **{m: {"pinball_s": _mean_se([loss[m][i][0] for i in wrong])["mean"],
                                                         "pinball_log": _mean_se([loss[m][i][1] for i in wrong])["mean"]}
                                                     for m in MODELS}}}


def evaluate(sources: Iterable[Source], make_predictor: Callable[[], object] | None = None, *,
             retag_latency_s: float = RETAG_LATENCY_S) -> dict:
    """Every source replayed and scored, and all pauses pooled."""
    per, everything = {}, []
    for src in sources:
        pauses, stats = replay(src, make_predictor, retag_latency_s=retag_latency_s)
        everything += pauses
        per[src.name] = {"path": src.path, "trajectories": len(src.sessions),
                         "tools": len({t for s in src.sessions for t, _ in s.calls}), **score(pauses),
                         "forecast_sources": {k.split(":", 1)[1]: v for k, v in stats.items()
                                              if k.startswith("forecast:")}}
    return {"sources": per, "pooled": score(everything)}
