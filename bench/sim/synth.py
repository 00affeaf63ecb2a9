"""Synthetic agent workloads, seeded and deterministic.

Tool waits come from :data:`TOOL_MIX`, a mixture of per-tool log-normals
fitted (by a small search, offline) so the mixture reproduces the real
aggregates of 432,510 coding-agent tool calls in ``../shared/traces/STATS.md``
(TraceLab): p50 0.3 s, p90 13.6 s, p99 3.6 min, mean 18.4 s, 3.97% of calls
over one minute holding 84.7% of tool time.  The per-tool components follow
the reference texts' workloads: file reads and edits (tens of ms), shell
commands (sub-second), compiles (seconds), web searches (seconds), test
suites (tens of seconds) and long jobs (minutes).  Human approvals are a
separate log-normal at the real human-input aggregates (p50 1.4 min,
p90 20.6 min), drawn with probability ``human_prob`` per pause.

Token shapes: a shared system prompt + tool set held once
(``shared_prefix_tokens``), a first round carrying the task and a repository
map, then per round a tool observation (median 875 tokens, the TraceLab
median append; heavy tail up to ``max_observation_tokens``, "a single
test-suite run can inject twenty thousand tokens") and a short output.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass

from kvtier.bench.sim.trace import Session, make_session

# (tool, weight, median seconds, log-sigma); weights sum to 1.
TOOL_MIX: tuple[tuple[str, float, float, float], ...] = (
    ("read_file", 0.402, 0.061, 0.87),
    ("bash", 0.324, 0.47, 1.07),
    ("compile", 0.055, 3.95, 1.56),
    ("web_search", 0.112, 4.93, 0.15),
    ("test", 0.083, 31.4, 0.96),
    ("long_job", 0.024, 107.0, 1.81),
)
HUMAN = ("human", 84.0, 2.10)       # p50 1.4 min; p90 = 84 * exp(1.2816 * 2.1) = 20.6 min
MAX_TOOL_WAIT_S = 4 * 3600.0
MAX_HUMAN_WAIT_S = 24 * 3600.0


class ToolWaitSampler:
    """Draws (tool, wait_s) pairs from :data:`TOOL_MIX` (and :data:`HUMAN`)."""

    def __init__(self, rng: random.Random, human_prob: float = 0.0) -> None:
        if not 0.0 <= human_prob <= 1.0:
            raise ValueError(f"human_prob must be in [0, 1], got {human_prob}")
        self._rng = rng
        self._human = human_prob
        acc = 0.0
        self._cum = []
        for name, w, med, sig in TOOL_MIX:
            acc += w
            self._cum.append((acc, name, med, sig))

    def draw(self) -> tuple[str, float]:
        rng = self._rng
        if self._human and rng.random() < self._human:
            name, med, sig = HUMAN
            return name, min(MAX_HUMAN_WAIT_S, med * math.exp(sig * rng.gauss(0.0, 1.0)))
        u = rng.random() * self._cum[-1][0]
        for acc, name, med, sig in self._cum:
            if u <= acc:
                break
        return name, min(MAX_TOOL_WAIT_S, med * math.exp(sig * rng.gauss(0.0, 1.0)))


@dataclass(frozen=True)
class SynthConfig:
    """Parameters of the synthetic agent workload (every field is a CLI flag)."""

    sessions: int = 1000
    rate_per_s: float = 0.4             # Poisson session arrivals
    rounds_mean: float = 10.0           # rounds per session: 1 + geometric
    max_rounds: int = 60
    shared_prompts: int = 2             # distinct system prompts
    shared_prefix_tokens: int = 8192    # system prompt + tool schemas
    first_tokens_median: int = 4000     # task + repository map
    observation_tokens_median: int = 875
    observation_sigma: float = 1.2
    max_observation_tokens: int = 20_000
    output_tokens_median: int = 150
    output_sigma: float = 0.8
    max_output_tokens: int = 2000
    max_context_tokens: int = 131_072
    human_prob: float = 0.03
    seed: int = 0

    def __post_init__(self) -> None:
        if self.sessions < 1:
            raise ValueError(f"sessions must be >= 1, got {self.sessions}")
        for f in ("rate_per_s", "rounds_mean"):
            v = getattr(self, f)
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"{f} must be a positive number, got {v}")
        if self.rounds_mean < 1:
            raise ValueError(f"rounds_mean must be >= 1, got {self.rounds_mean}")
        for f in ("max_rounds", "first_tokens_median", "observation_tokens_median",
                  "output_tokens_median", "max_output_tokens", "max_observation_tokens",
                  "max_context_tokens", "shared_prompts"):
            if getattr(self, f) < 1:
                raise ValueError(f"{f} must be >= 1, got {getattr(self, f)}")
        if self.shared_prefix_tokens < 0:
            raise ValueError("shared_prefix_tokens must be >= 0")
        if not 0.0 <= self.human_prob <= 1.0:
            raise ValueError(f"human_prob must be in [0, 1], got {self.human_prob}")


def _lognormal_int(rng: random.Random, median: float, sigma: float, cap: int) -> int:
    return max(1, min(cap, int(round(median * math.exp(sigma * rng.gauss(0.0, 1.0))))))


def synthesize(cfg: SynthConfig) -> list[Session]:
    """Generate ``cfg.sessions`` sessions; the same config gives the same sessions."""
    rng = random.Random(cfg.seed)
    tools = ToolWaitSampler(rng, cfg.human_prob)
    p_more = 1.0 - 1.0 / cfg.rounds_mean       # P(another round)
    out: list[Session] = []
    t = 0.0
    width = len(str(cfg.sessions - 1))
    for i in range(cfg.sessions):
        t += rng.expovariate(cfg.rate_per_s)
        prompt = rng.randrange(cfg.shared_prompts)
        spid = f"sys-{prompt}" if cfg.shared_prefix_tokens else None
        ctx = cfg.shared_prefix_tokens
        steps = []
        new = _lognormal_int(rng, cfg.first_tokens_median, 0.5, cfg.max_context_tokens // 4)
        while True:
            outp = _lognormal_int(rng, cfg.output_tokens_median, cfg.output_sigma, cfg.max_output_tokens)
            ctx += new + outp
            tool, wait = tools.draw()
            steps.append((new, outp, tool, wait))
            if len(steps) >= cfg.max_rounds or rng.random() > p_more:
                break
            new = _lognormal_int(rng, cfg.observation_tokens_median, cfg.observation_sigma,
                                 cfg.max_observation_tokens)
            if ctx + new + cfg.max_output_tokens > cfg.max_context_tokens:
                break
        out.append(make_session(f"s{i:0{width}d}", round(t, 3), steps, shared_prefix_id=spid,
                                shared_prefix_tokens=cfg.shared_prefix_tokens))
    return out
