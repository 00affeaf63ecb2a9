"""The affinity-load objective of figure 7, stage 2.

``w* = argmax_j [ mu * (Match_j / S) - (1 - mu) * (L_j / L_max) ** gamma ]``

``Match_j``: prompt tokens worker j holds as a prefix; ``S``: prompt tokens;
``L_j``: worker j's load (queue depth, active requests: any one unit);
``L_max``: the largest load a worker may have (a cap), or, when not given,
the largest load among the candidates (then at least 1).  Ties go to the
lower load, then the earlier candidate.  Pure functions.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class Weights:
    """``mu`` in [0, 1] (1: prefix only, 0: load only), ``gamma`` > 0.  Raises ValueError."""

    mu: float = 0.5
    gamma: float = 1.0

    def __post_init__(self) -> None:
        if not (isinstance(self.mu, (int, float)) and 0.0 <= self.mu <= 1.0):
            raise ValueError(f"mu must be in [0, 1], got {self.mu!r}")
        if not (isinstance(self.gamma, (int, float)) and math.isfinite(self.gamma) and self.gamma > 0):
            raise ValueError(f"gamma must be a positive number, got {self.gamma!r}")


@dataclass(frozen=True)
class Choice:
    """The winner among the candidates, and every candidate's score (candidate order)."""

    index: int
    match_tokens: int
    prompt_tokens: int
    scores: tuple[float, ...]

    @property
    def hit(self) -> float:
        return self.match_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def prefill_tokens(self) -> int:
        return self.prompt_tokens - self.match_tokens


def score(match_tokens: int, prompt_tokens: int, load: float, load_max: float, w: Weights) -> float:
    """One worker's objective (larger is better)."""
    hit = min(1.0, match_tokens / prompt_tokens) if prompt_tokens > 0 else 0.0
    frac = min(1.0, max(0.0, load) / load_max) if load_max > 0 else 0.0
    return w.mu * hit - (1.0 - w.mu) * frac ** w.gamma


def choose(matches: Sequence[int], loads: Sequence[float], prompt_tokens: int, w: Weights,
           load_max: float | None = None) -> Choice:
    """Pick ``w*``.  Raises ValueError for no candidates or mismatched lengths."""
    if not matches or len(matches) != len(loads):
        raise ValueError(f"need one load per candidate and at least one ({len(matches)} matches, "
                         f"{len(loads)} loads)")
    lmax = float(load_max) if load_max is not None else max(1.0, max(float(x) for x in loads))
    sc = tuple(score(m, prompt_tokens, l, lmax, w) for m, l in zip(matches, loads))
    best = max(range(len(sc)), key=lambda j: (sc[j], -loads[j], -j))
    return Choice(best, min(int(matches[best]), prompt_tokens), prompt_tokens, sc)
