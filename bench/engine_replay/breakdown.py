"""Where the slowest resumes' time went: the lifecycle's store moves that ran
while each resume was loading.

The replay records every resume's wall interval; the lifecycle controller (with
``move_log`` set) records every store move it makes -- ``(t0, t1, kind, tid,
blocks)`` for demotions, stagings and drops, in ``time.perf_counter``
seconds.  A move overlapping a resume competed with it for the disk, the cores
and the interpreter lock; one of the resuming trajectory itself means a
staging raced its own return.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence


@dataclass(frozen=True)
class ResumeRecord:
    """One resume as the replay saw it (``t0``/``t1``: perf_counter seconds)."""
    session: str
    round: int
    blocks: int
    served: str
    host_blocks: int        # blocks in DRAM when the resume began
    load_s: float
    t0: float
    t1: float


def _overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


def overlaps(r: ResumeRecord, moves: Iterable[tuple]) -> dict:
    """The moves overlapping resume ``r``: per kind, seconds overlapped, moves
    and blocks; ``own_s``: seconds a move of the resuming trajectory overlapped."""
    by_kind: dict[str, dict] = {}
    own = 0.0
    for t0, t1, kind, tid, blocks in moves:
        o = _overlap(r.t0, r.t1, t0, t1)
        if o <= 0:
            continue
        k = by_kind.setdefault(kind, {"s": 0.0, "moves": 0, "blocks": 0})
        k["s"] += o
        k["moves"] += 1
        k["blocks"] += int(blocks)
        if tid == r.session:
            own += o
    for k in by_kind.values():
        k["s"] = round(k["s"], 4)
    return {"moves": by_kind, "own_s": round(own, 4)}


def summarize(records: Sequence[ResumeRecord], moves: Sequence[tuple], slowest: int = 5) -> dict:
    """``{"slowest": [...], "resumes_overlapped", "overlap_s"}``: the ``slowest``
    resumes with the moves they overlapped, how many resumes overlapped any
    move, and the seconds of load time that overlapped moves in all."""
    moves = sorted(moves)
    n_over, total = 0, 0.0
    for r in records:
        o = sum(_overlap(r.t0, r.t1, m[0], m[1]) for m in moves if m[0] < r.t1 and m[1] > r.t0)
        if o > 0:
            n_over += 1
            total += o
    worst = sorted(records, key=lambda r: -r.load_s)[:slowest]
    return {"slowest": [{"session": r.session, "round": r.round, "blocks": r.blocks, "served": r.served,
                         "host_blocks": r.host_blocks, "load_s": round(r.load_s, 4), **overlaps(r, moves)} for r in worst],
            "resumes_overlapped": n_over, "overlap_s": round(total, 4)}
