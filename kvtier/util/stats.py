"""kvtier's percentiles, in one place: nearest rank (every report's rule) and, for samples too small
for a rank to mean much (the live benchmark's 17 resumes a run), linear interpolation."""
from __future__ import annotations

import math
from typing import Sequence


def _check_q(q: float) -> None:
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be in [0, 1], got {q!r}")


def percentile(xs: Sequence[float], q: float, *, presorted: bool = False, empty: float = math.nan) -> float:
    """The nearest-rank ``q``-quantile: the ceil(q n)-th smallest of ``xs`` (``q`` in [0, 1]; q = 0
    gives the smallest).  ``presorted``: ``xs`` is sorted already (no copy).  ``empty`` is returned
    for no data (NaN by default: a table shows it as missing, not as zero).

    Raises:
        ValueError: ``q`` outside [0, 1].
    """
    _check_q(q)
    if not xs:
        return empty
    s = xs if presorted else sorted(xs)
    return float(s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))])


def interpolated_percentile(xs: Sequence[float], q: float, *, empty: float = math.nan) -> float:
    """The linearly interpolated ``q``-quantile (numpy's default rule) of ``xs``; ``empty`` for no
    data.

    Raises:
        ValueError: ``q`` outside [0, 1].
    """
    _check_q(q)
    if not xs:
        return empty
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(s) - 1)
    return float(s[lo] + (s[hi] - s[lo]) * (pos - lo))
