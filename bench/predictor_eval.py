"""Forecast quality of tool-wait predictors on held-out real tool durations.

Held-out data (per-call wall-clock durations, read from ``../shared/traces``):

* ``continuum/swe_smith_5traj_tool_durations.csv`` -- 125 calls of 5 SWE-smith
  trajectories (claude-3-7-sonnet); tool = ``tool``, feature cmd = ``cmd_head``.
  (Derived from ``continuum/swe_smith_5traj_with_timings.json``; the JSON holds
  the same 125 timings, so it is not counted twice.  The other two Continuum
  JSONs hold job completion times, not tool durations.)
* ``swe_agent/swe_agent_demo_step_exec_times.csv`` -- 40 steps of 4 SWE-agent
  demo trajectories; tool = the ACI command (``action_head``).
* ``tracelab/example_sanitized_round_trace.jsonl`` -- 19 tool calls of one
  sanitized Claude/Codex session; tool = ``tool_name``, duration =
  ``tool_wall_latency_ms``, feature arg = bucket of ``input_chars``.

TraceLab's aggregate statistics (432,510 calls) are the predictor's cold-start
prior only; they are never scored.

Protocol (prequential, online): each source is replayed in file order through
a fresh predictor; for every call the predictor first forecasts, is scored
against the real duration, then observes it.  So every score is on a
duration the predictor had not seen.
"""
from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

QUANTILES = (0.1, 0.5, 0.9)


@dataclass(frozen=True)
class Call:
    """One real tool call: the tool, coarse features, and its duration (s)."""

    tool: str
    seconds: float
    features: Mapping[str, str] | None = None


@dataclass(frozen=True)
class Dataset:
    name: str
    path: str
    calls: tuple[Call, ...]
    note: str = ""


def default_traces_dir() -> Path:
    """The trace directory: ``$KVTIER_TRACES`` or ``../shared/traces`` (see :func:`kvtier.env.traces_dir`)."""
    from kvtier.env import traces_dir
    return traces_dir()


def _arg_bucket(chars: int | None) -> Mapping[str, str] | None:
    from kvtier.tiering.forecasting.predictor import tool_features
    if chars is None:
        return None
    return tool_features(None, int(chars)) or None


def _duration(value: object, where: str, scale: float = 1.0) -> float:
    """``value`` as seconds (times ``scale``); ValueError naming ``where`` unless finite and >= 0."""
    try:
        v = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"{where}: duration {value!r} is not a number") from None
    if not (math.isfinite(v) and v >= 0):
        raise ValueError(f"{where}: duration {value!r} must be a finite number >= 0")
    return v * scale


def _csv_rows(path: Path, need: tuple[str, ...]) -> Iterable[tuple[str, dict]]:
    """Rows of a CSV file with ``need`` columns, each with ``"path: line N"``; ValueError if a column is missing."""
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in need if c not in (reader.fieldnames or ())]
        if missing:
            raise ValueError(f"{path}: missing column(s) {', '.join(missing)}")
        for row in reader:
            yield f"{path}: line {reader.line_num}", row


def _jsonl_objects(path: Path) -> list[dict]:
    """JSON objects of a JSON Lines file; ValueError naming the line of anything else."""
    rows = []
    with open(path) as f:
        for i, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}: line {i}: not JSON ({exc.msg})") from None
            if not isinstance(r, dict) or not isinstance(r.get("tools") or [], list):
                raise ValueError(f"{path}: line {i}: expected an object with a 'tools' list")
            if not all(isinstance(t, dict) and isinstance(t.get("tool_index", 0), int)
                       and isinstance(t.get("input_chars"), (int, type(None))) for t in r.get("tools") or []):
                raise ValueError(f"{path}: line {i}: every entry of 'tools' must be an object "
                                 "with integer tool_index and input_chars")
            if not isinstance(r.get("round_index", 0), int):
                raise ValueError(f"{path}: line {i}: round_index must be an integer")
            rows.append(r)
    return rows


def load_datasets(traces: Path) -> list[Dataset]:
    """Load every held-out source present under ``traces`` (missing files are skipped).

    Raises ValueError when none holds a tool duration, or naming the file and
    line of a malformed row (missing column, a duration that is not a finite
    number >= 0, a line that is not a JSON object).
    """
    out: list[Dataset] = []
    p = traces / "continuum" / "swe_smith_5traj_tool_durations.csv"
    if p.is_file():
        calls = tuple(Call(r["tool"] or "unknown", _duration(r["execution_time_seconds"], where),
                           {"cmd": r["cmd_head"]} if r.get("cmd_head") else None)
                      for where, r in _csv_rows(p, ("tool", "execution_time_seconds", "cmd_head")))
        out.append(Dataset("swe_smith", "continuum/swe_smith_5traj_tool_durations.csv", calls,
                           "5 SWE-smith trajectories, per-call execution_time_seconds"))
    p = traces / "swe_agent" / "swe_agent_demo_step_exec_times.csv"
    if p.is_file():
        calls = tuple(Call(r["action_head"] or "unknown", _duration(r["execution_time_s"], where))
                      for where, r in _csv_rows(p, ("action_head", "execution_time_s")))
        out.append(Dataset("swe_agent", "swe_agent/swe_agent_demo_step_exec_times.csv", calls,
                           "4 SWE-agent demo trajectories, per-step execution_time"))
    p = traces / "tracelab" / "example_sanitized_round_trace.jsonl"
    if p.is_file():
        calls_l: list[Call] = []
        rows = _jsonl_objects(p)
        rows.sort(key=lambda r: (str(r.get("session_id")), r.get("round_index", 0)))
        for r in rows:
            for t in sorted(r.get("tools") or [], key=lambda t: t.get("tool_index", 0)):
                ms = t.get("tool_wall_latency_ms")
                if ms is None or not t.get("tool_name"):
                    continue
                calls_l.append(Call(str(t["tool_name"]), _duration(ms, f"{p}: session {r.get('session_id')}", 1e-3),
                                    _arg_bucket(t.get("input_chars"))))
        out.append(Dataset("tracelab_sample", "tracelab/example_sanitized_round_trace.jsonl", tuple(calls_l),
                           "one sanitized TraceLab session, tool_wall_latency_ms"))
    out = [d for d in out if d.calls]
    if not out:
        raise ValueError(f"no held-out tool durations found under {traces} "
                         "(expected continuum/, swe_agent/ or tracelab/ files; set --traces)")
    return out


# --------------------------------------------------------------------------- scoring
def pinball(y: float, q_pred: float, q: float) -> float:
    """Quantile (pinball) loss of predicting ``q_pred`` for level q when ``y`` happened."""
    d = y - q_pred
    return q * d if d >= 0 else (q - 1.0) * d


@dataclass
class Score:
    n: int = 0
    pinball_s: float = 0.0       # sum over calls of mean-over-QUANTILES pinball (seconds)
    pinball_log: float = 0.0     # same on ln(max(x, 1 ms))
    covered: int = 0             # y within [p10, p90]
    abs_err_p50: float = 0.0

    def add(self, y: float, qs: Sequence[float]) -> None:
        self.n += 1
        self.pinball_s += sum(pinball(y, v, q) for q, v in zip(QUANTILES, qs)) / len(QUANTILES)
        ly = math.log(max(y, 1e-3))
        self.pinball_log += sum(pinball(ly, math.log(max(v, 1e-3)), q) for q, v in zip(QUANTILES, qs)) / len(QUANTILES)
        self.covered += int(qs[0] <= y <= qs[-1])
        self.abs_err_p50 += abs(y - qs[1])

    def merge(self, o: "Score") -> None:
        self.n += o.n
        self.pinball_s += o.pinball_s
        self.pinball_log += o.pinball_log
        self.covered += o.covered
        self.abs_err_p50 += o.abs_err_p50

    def to_dict(self) -> dict:
        n = max(self.n, 1)
        return {"n": self.n, "pinball_loss_s": self.pinball_s / n, "pinball_loss_log": self.pinball_log / n,
                "coverage_p10_p90": self.covered / n, "mae_p50_s": self.abs_err_p50 / n}


class GlobalQuantilesPredictor:
    """Empirical p10/p50/p90 of every wait seen so far, whatever the tool."""

    def __init__(self) -> None:
        self._v: list[float] = []

    def observe(self, tool: str, seconds: float, features=None) -> None:
        import bisect
        bisect.insort(self._v, seconds)

    def qs(self, tool: str, features=None) -> tuple[float, float, float]:
        v = self._v
        if not v:
            return (0.3, 0.3, 0.3)
        return tuple(v[min(int(q * len(v)), len(v) - 1)] for q in QUANTILES)  # type: ignore[return-value]


def _quantiles_of(pred, tool: str, features) -> tuple[float, float, float]:
    if hasattr(pred, "qs"):
        return pred.qs(tool, features)
    fc = pred.forecast(tool, features)
    return tuple(fc.quantiles[f"p{int(q * 100)}"] for q in QUANTILES)  # type: ignore[return-value]


def model_factories() -> dict[str, Callable[[], object]]:
    from kvtier.tiering.forecasting.predictor import GlobalMedianPredictor, RunningMeanPredictor, ToolWaitPredictor
    return {
        "kvtier": ToolWaitPredictor,
        "running_mean": RunningMeanPredictor,
        "global_median": GlobalMedianPredictor,
        "global_quantiles": GlobalQuantilesPredictor,
    }


def evaluate(datasets: Iterable[Dataset], factories: Mapping[str, Callable[[], object]] | None = None) -> dict:
    """Prequential scores per dataset and pooled, for every model.  Pure (fresh models per dataset)."""
    factories = factories or model_factories()
    per: dict[str, dict] = {}
    pooled = {m: Score() for m in factories}
    for ds in datasets:
        scores = {m: Score() for m in factories}
        for m, make in factories.items():
            pred = make()
            for c in ds.calls:
                scores[m].add(c.seconds, _quantiles_of(pred, c.tool, c.features))
                pred.observe(c.tool, c.seconds, c.features)
            pooled[m].merge(scores[m])
        per[ds.name] = {"path": ds.path, "calls": len(ds.calls), "note": ds.note,
                        "models": {m: s.to_dict() for m, s in scores.items()}}
    return {"datasets": per, "pooled": {m: s.to_dict() for m, s in pooled.items()}}
