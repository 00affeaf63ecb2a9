"""A mergeable, decaying log-bucket quantile sketch for wait times (seconds).

Layout (DDSketch-style, fixed range so two sketches always line up)::

    value v (seconds), clamped to [MIN_S, MAX_S]
    bucket i = floor(log(v / MIN_S) / log(GAMMA))        0 <= i < N_BUCKETS
    representative value of bucket i = MIN_S * GAMMA**(i + 0.5)

    |b0|b1|b2| ... |b575|     counts: float64, one array per sketch
     100us ...   ... 1e6 s    each bucket spans a factor GAMMA (~4.1%)

Every reported quantile is within about +-2% (relative) of a value that was
really observed at that rank.  Two sketches merge by adding their arrays.

Decay: each ``add`` first multiplies every previous count by ``decay`` (so the
sketch's memory is about ``1 / (1 - decay)`` observations).  That is done
lazily: new observations enter with weight ``self._scale`` which grows by
``1 / decay`` per call; counts are renormalised when the scale gets large.
``add`` is O(1) amortised.

Thread safety: none; the owner (the predictor) serialises access.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

import numpy as np

MIN_S = 1e-4           # 100 microseconds: anything faster is "instant"
MAX_S = 1e6            # ~11.6 days
REL_ACCURACY = 0.02
GAMMA = (1 + REL_ACCURACY) / (1 - REL_ACCURACY)
_LOG_GAMMA = math.log(GAMMA)
N_BUCKETS = int(math.ceil(math.log(MAX_S / MIN_S) / _LOG_GAMMA)) + 1
BUCKET_VALUES = MIN_S * GAMMA ** (np.arange(N_BUCKETS) + 0.5)
_RENORM_AT = 1e100


def bucket_of(seconds: float) -> int:
    """Bucket index of a wait (clamped into the sketch's range)."""
    v = min(max(seconds, MIN_S), MAX_S)
    return min(int(math.log(v / MIN_S) / _LOG_GAMMA), N_BUCKETS - 1)


@dataclass(frozen=True)
class SketchSnapshot:
    """Immutable normalised view used to answer quantile queries fast.

    ``cum_p``: cumulative probability at the upper edge of each non-empty
    bucket; ``values``: that bucket's representative value; ``cum_mass``:
    cumulative E[W; W <= bucket] (for conditional means).
    """

    cum_p: np.ndarray
    values: np.ndarray
    cum_mass: np.ndarray
    mean: float
    weight: float

    def quantile(self, q: float) -> float:
        i = int(np.searchsorted(self.cum_p, q, side="left"))
        return float(self.values[min(i, len(self.values) - 1)])

    def quantiles(self, qs: np.ndarray) -> np.ndarray:
        idx = np.searchsorted(self.cum_p, qs, side="left")
        return self.values[np.minimum(idx, len(self.values) - 1)]

    def partial_mass(self, qs: np.ndarray) -> np.ndarray:
        """E[W * 1{F(W) <= q}] for each q (piecewise-linear in q)."""
        return np.interp(qs, np.concatenate(([0.0], self.cum_p)), np.concatenate(([0.0], self.cum_mass)))


class WaitSketch:
    """Decaying log-bucket histogram of waits.  ``add`` mutates; queries don't."""

    __slots__ = ("decay", "_counts", "_scale", "_total", "n")

    def __init__(self, decay: float = 1.0) -> None:
        if not (0.0 < decay <= 1.0):
            raise ValueError(f"decay must be in (0, 1], got {decay!r}")
        self.decay = float(decay)
        self._counts = np.zeros(N_BUCKETS, dtype=np.float64)
        self._scale = 1.0
        self._total = 0.0
        self.n = 0  # raw number of observations ever added

    # -- mutation ---------------------------------------------------------
    def add(self, seconds: float) -> None:
        """Record one wait.  Raises ValueError for negative / non-finite input."""
        if not (isinstance(seconds, (int, float)) and math.isfinite(seconds) and seconds >= 0):
            raise ValueError(f"wait must be a finite number >= 0, got {seconds!r}")
        if self.decay < 1.0 and self.n > 0:
            self._scale /= self.decay
            if self._scale > _RENORM_AT:
                self._renormalise()
        self._counts[bucket_of(seconds)] += self._scale
        self._total += self._scale
        self.n += 1

    def merge(self, other: "WaitSketch") -> None:
        """Add ``other``'s (effective) counts into this sketch.  Mutates self only."""
        self._counts += other._counts * (self._scale / other._scale)
        self._total += other._total * (self._scale / other._scale)
        self.n += other.n

    def _renormalise(self) -> None:
        self._counts /= self._scale
        self._total /= self._scale
        self._scale = 1.0

    # -- queries ----------------------------------------------------------
    @property
    def weight(self) -> float:
        """Effective (decayed) number of observations."""
        return self._total / self._scale

    def snapshot(self) -> SketchSnapshot | None:
        """Normalised immutable view; None when empty."""
        if self._total <= 0:
            return None
        nz = np.flatnonzero(self._counts)
        c = self._counts[nz] / self._total
        v = BUCKET_VALUES[nz]
        cum_p = np.cumsum(c)
        cum_p[-1] = 1.0
        cum_mass = np.cumsum(c * v)
        return SketchSnapshot(cum_p=cum_p, values=v, cum_mass=cum_mass,
                              mean=float(cum_mass[-1]), weight=self.weight)

    # -- persistence ------------------------------------------------------
    def to_state(self) -> dict:
        """Plain-data form (effective counts of non-empty buckets)."""
        nz = np.flatnonzero(self._counts)
        return {"decay": self.decay, "n": self.n,
                "buckets": {str(int(i)): float(self._counts[i] / self._scale) for i in nz}}

    @classmethod
    def from_state(cls, state: Mapping) -> "WaitSketch":
        """Inverse of :meth:`to_state`.  Raises ValueError on malformed input."""
        try:
            sk = cls(decay=float(state["decay"]))
            n = int(state["n"])
            buckets = state["buckets"]
            if n < 0:
                raise ValueError("negative n")
            for k, c in buckets.items():
                i, c = int(k), float(c)
                if not (0 <= i < N_BUCKETS) or not (math.isfinite(c) and c >= 0):
                    raise ValueError(f"bad bucket {k!r}: {c!r}")
                sk._counts[i] = c
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"malformed sketch state: {exc}") from exc
        sk._total = float(sk._counts.sum())
        sk.n = n
        return sk
