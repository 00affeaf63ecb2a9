"""The soak's fault plan: a pure function of (seed, minutes, kinds), printed at the start so that
a run can be replayed with ``--seed``.

    plan(seed=7, minutes=8, kinds=["redis-kill", "slab-flip"], warmup_s=30, hold_s=5)
    # -> (Planned(at_s=30.0, kind='slab-flip', hold_s=5.0), Planned(at_s=..., kind='redis-kill', ...), ...)

Faults are evenly spaced after ``warmup_s``, one at a time; each kind runs at least once (in
rounds: every kind once per round, each round shuffled by the seed).
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class Planned:
    at_s: float        # seconds after the agents start
    kind: str
    hold_s: float      # seconds between inject and recover


def plan(*, seed: int, minutes: float, kinds: Sequence[str], warmup_s: float = 30.0,
         hold_s: float = 5.0, spacing_s: float = 40.0) -> tuple[Planned, ...]:
    """See the module doc.  ``spacing_s``: the gap between two faults' starts at most (the plan
    packs tighter when every kind would not otherwise fit).  Raises ValueError for no kinds, a
    duplicate kind, or a non-positive duration."""
    if not kinds or len(set(kinds)) != len(kinds):
        raise ValueError("give each fault kind once, at least one")
    if not (minutes > 0 and spacing_s > 0 and hold_s >= 0 and warmup_s >= 0):
        raise ValueError("minutes and spacing_s must be > 0, hold_s and warmup_s >= 0")
    span = minutes * 60.0 - warmup_s
    count = max(len(kinds), int(span // spacing_s))
    gap = max(span, 0.0) / count
    rng = random.Random(seed)
    order: list[str] = []
    while len(order) < count:
        rnd = list(kinds)
        rng.shuffle(rnd)
        order.extend(rnd)
    return tuple(Planned(round(warmup_s + i * gap, 1), k, hold_s) for i, k in enumerate(order[:count]))


def describe(p: Sequence[Planned], seed: int) -> str:
    lines = [f"fault schedule (seed {seed}, replay with --seed {seed}):"]
    lines += [f"  t+{x.at_s:7.1f} s  {x.kind:<16} hold {x.hold_s:g} s" for x in p]
    return "\n".join(lines)
