"""One configuration's run on a live engine, reduced to the numbers a report compares.

Resume TTFT is the engine's first-token latency of every turn after a
session's first.  A session's job completion time is its turns' engine time,
their wait for the engine behind other sessions' turns and its tool waits:
``engine_busy_s`` and ``queue_wait_s`` are the run's first two, summed over
its turns, so a difference in JCT can be told apart (the engine slower, or
the same work in another order).  A resume's *reusable* tokens are the full blocks of the
context the session paused with (its previous prompt, its output and the
tool's tokens are new); the tokens of those blocks the engine did not find
cached were recomputed, and a resume that recomputed any is a miss.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from kvtier.bench.live.driver import RunRecord
from kvtier.util.stats import interpolated_percentile


@dataclass(frozen=True)
class RunSummary:
    config: str
    repeat: int
    resume_ttft_s: tuple[float, ...]
    jct_s: tuple[float, ...]
    resumes: int
    misses: int
    recomputed_tokens: int
    outputs: Mapping[tuple[str, int], tuple[int, ...]]
    served_chunks: Mapping[str, int] = field(default_factory=dict)   # kvtier: chunks loaded, by tier
    stored_chunks: Mapping[str, int] = field(default_factory=dict)
    wall_s: float = 0.0
    prefill_ms_per_1k: float | None = None     # first turns of >= 64 computed tokens: TTFT per 1k computed
    notes: Mapping[str, Any] = field(default_factory=dict)
    engine_busy_s: float = 0.0     # the engine's time on the run's turns (each turn's end - start)
    queue_wait_s: float = 0.0      # the turns' waits for the engine behind other turns (start - ready)
    resume_kvtier_cpu_s: float | None = None   # per resume: CPU kvtier's threads ran during it (None: not measured)
    resume_engine_waits: float | None = None   # per resume: the engine thread's voluntary context switches

    @property
    def p50(self) -> float:
        return interpolated_percentile(self.resume_ttft_s, 0.5)

    @property
    def p99(self) -> float:
        return interpolated_percentile(self.resume_ttft_s, 0.99)

    @property
    def jct_mean(self) -> float:
        return sum(self.jct_s) / len(self.jct_s) if self.jct_s else math.nan


def summarize(config: str, repeat: int, run: RunRecord, *, block_tokens: int,
              kvtier_stats: Mapping[str, Any] | None) -> RunSummary:
    prev: dict[str, int] = {}
    ttft, misses, recomputed, prefill = [], 0, 0, []
    for t in run.turns:
        if t.turn == 0 and t.prompt_tokens - t.cached_tokens >= 64:
            prefill.append(t.ttft_s / (t.prompt_tokens - t.cached_tokens) * 1e6)
        if t.turn > 0:
            ttft.append(t.ttft_s)
            reusable = prev[t.session] // block_tokens * block_tokens
            lost = max(0, reusable - t.cached_tokens)
            recomputed += lost
            misses += lost > 0
        prev[t.session] = t.prompt_tokens
    s = kvtier_stats or {}
    return RunSummary(config, repeat, tuple(ttft), tuple(run.jct_s.values()), len(ttft), misses, recomputed,
                      {(t.session, t.turn): t.tokens for t in run.turns},
                      dict(s.get("loaded_by_tier", {})), dict(s.get("stored_by_tier", {})), run.wall_s,
                      sum(prefill) / len(prefill) if prefill else None,
                      {**{k: s[k] for k in ("load_failures", "contained_errors", "hint_rejections") if k in s},
                       **_lifecycle_notes(s)},
                      engine_busy_s=sum(t.end_s - t.start_s for t in run.turns),
                      queue_wait_s=sum(max(0.0, t.start_s - t.ready_s) for t in run.turns),
                      resume_kvtier_cpu_s=_resume_mean(run, "kvtier_cpu_s"),
                      resume_engine_waits=_resume_mean(run, "engine_waits"))


def _resume_mean(run: RunRecord, field: str) -> float | None:
    """A turn measure's mean over the run's resumes (None where none measured it)."""
    xs = [getattr(t, field) for t in run.turns if t.turn > 0 and getattr(t, field) is not None]
    return sum(xs) / len(xs) if xs else None


def _lifecycle_notes(s: Mapping[str, Any]) -> dict:
    """kvtier's decisions by action and the blocks its lifecycle moved (empty without kvtier)."""
    if not s:
        return {}
    lc = s.get("lifecycle") or {}
    holds = s.get("holds") or {}
    return {"decisions": dict(s.get("decisions") or {}), "demoted_blocks": int(lc.get("demoted_blocks", 0)),
            "dropped_blocks": int(lc.get("dropped_blocks", 0)), "skipped_chunks": int(s.get("chunks_skipped", 0)),
            "staged_blocks": int(lc.get("staged_blocks", 0)), "hold_resumes": int(holds.get("served_resumes", 0)),
            "hold_pressure_releases": int((holds.get("released") or {}).get("pressure", 0)),
            "read_skips": int(s.get("read_skips", 0))}
