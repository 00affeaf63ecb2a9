"""The cluster's offered load: a trace replayed several times with distinct ids.

An N-node cluster of one-node hardware receives, by default, N times the
trace's load, so each node sees about what the one-node simulation sees.
``copies`` (N x ``--load-scale``) need not be whole: the fractional part is a
seeded sample of the sessions.  Copy 0 is the trace itself (same ids, same
times: one copy is exactly the one-node input); copy c >= 1 renames every
session ``<id>~c`` and shifts all its rounds by one uniform draw in
``[0, jitter_s)``, so the copies interleave instead of arriving in lockstep.
Tool waits and token counts are the original's (a copy is the same work).
"""
from __future__ import annotations

import math
import random
from dataclasses import replace
from typing import Sequence

from kvtier.bench.sim.trace import Session


def default_jitter_s(sessions: Sequence[Session]) -> float:
    """One mean gap between session arrivals (1 s for a single session or none)."""
    if len(sessions) < 2:
        return 1.0
    arr = [s.arrival_s for s in sessions]
    span = max(arr) - min(arr)
    return span / (len(arr) - 1) if span > 0 else 1.0


def replicate(sessions: Sequence[Session], copies: float, *, jitter_s: float | None = None,
              seed: int = 0) -> list[Session]:
    """``copies`` x the sessions (see the module doc), sorted by arrival then id.

    Raises ValueError for ``copies`` < 1 / N (no session at all would be left), a
    non-finite value, or a negative jitter.
    """
    if not (math.isfinite(copies) and copies > 0):
        raise ValueError(f"copies must be a positive number, got {copies!r}")
    if jitter_s is not None and not (math.isfinite(jitter_s) and jitter_s >= 0):
        raise ValueError(f"jitter_s must be a finite number >= 0, got {jitter_s!r}")
    base = list(sessions)
    if not base or copies == 1:
        return base                                    # exactly the one-node input, in its order
    jit = default_jitter_s(base) if jitter_s is None else float(jitter_s)
    rng = random.Random(seed)
    whole = int(math.floor(copies + 1e-9))
    frac = copies - whole
    out: list[Session] = list(base) if whole >= 1 else []
    for c in range(1, whole):
        out.extend(_copy(s, c, rng.random() * jit) for s in base)
    if frac > 1e-9:
        c = max(1, whole)
        k = int(round(frac * len(base)))
        if whole == 0:
            picked = sorted(rng.sample(range(len(base)), max(1, k)))
            out.extend(base[i] for i in picked)        # a sample of the trace itself, unshifted
        elif k:
            for i in sorted(rng.sample(range(len(base)), k)):
                out.append(_copy(base[i], c, rng.random() * jit))
    out.sort(key=lambda s: (s.arrival_s, s.id))
    return out


def _copy(s: Session, c: int, shift: float) -> Session:
    sid = f"{s.id}~{c}"
    return Session(sid, tuple(replace(r, session=sid, arrival_s=r.arrival_s + shift) for r in s.rounds))
