"""Gets of small values straight into lent, contiguous host frames: each header lands in the frame before.

A remote value is ``header (112 B) + payload``; the caller's destination is
``bodies[i]``, payload-sized.  Below ``SMALL_VALUE`` the Mooncake backend
moves a value as one request (a second request per value costs more on TCP
than copying the payload, docs/remote.md), so without this the value lands
in a staging arena and the payload is copied out (12-15 ms per 64 MiB here).

When ``bodies[j]`` ends exactly where ``bodies[i]`` starts (host frames of
one run), value i can be read straight to ``bodies[i].address - 112``: its
header then overwrites the last 112 bytes of frame j.  Frame j's own payload
must not be written at the same time, so a run is read in two rounds:

* round A -- the run's odd positions (1, 3, ...) in place, and its first
  frame (no frame before it) through the arena, as before;
* round B -- the even positions from 2 in place; before it, the last 112
  bytes of each frame that a round-B header will overwrite (all round A
  frames) are saved, and restored after it.

Headers are copied out of the frames right after their round, before
anything else writes there.  A round the backend abandons at its deadline
may still write later: the caller's ``Loan`` keeps the frames reserved until
that call ends, and the whole batch is reported lost (the backend raises).

Threading: a plan is built and used by one call on one thread.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class InPlacePlan:
    """Which values of a batch go where (indexes into the batch).

    ``staged``: read through the arena (no frame right before them in the
    batch), in round A.  ``round_a`` / ``round_b``: read in place.
    ``saved``: the frames whose last ``head`` bytes round B overwrites."""

    staged: tuple[int, ...]
    round_a: tuple[int, ...]
    round_b: tuple[int, ...]
    saved: tuple[int, ...]

    @property
    def in_place(self) -> int:
        return len(self.round_a) + len(self.round_b)


def plan(addresses: list[int], body: int) -> InPlacePlan:
    """The plan for payload buffers at ``addresses`` (each ``body`` bytes).

    A value goes in place when another buffer of the batch ends exactly
    where it starts; positions along each such chain alternate between the
    rounds.  Buffers that overlap otherwise (never the case for host frames)
    are all staged."""
    at = {a: i for i, a in enumerate(addresses)}
    if len(at) != len(addresses):                 # the same buffer twice: keep it simple
        return InPlacePlan(tuple(range(len(addresses))), (), (), ())
    prev = [at.get(a - body) for a in addresses]
    depth = [0] * len(addresses)
    staged, a_side, b_side, saved = [], [], [], []
    for i in sorted(range(len(addresses)), key=addresses.__getitem__):   # chain order
        j = prev[i]
        if j is None:
            staged.append(i)
            continue
        depth[i] = depth[j] + 1
        if depth[i] % 2:
            a_side.append(i)
        else:
            b_side.append(i)
            saved.append(j)
    return InPlacePlan(tuple(staged), tuple(a_side), tuple(b_side), tuple(saved))
