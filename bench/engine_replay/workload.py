"""An agent trace as an engine replay's work: block keys, bytes and a timeline.

Each session's context is cut into chunks of ``chunk_tokens`` tokens (only
full chunks are offloaded, as the engines do).  A chunk's key is derived from
who owns its tokens (the shared prefix id for prefix chunks, else the
session) and its position, so sessions sharing a prompt share its chunks.  A
chunk's bytes are a pure function of its key (:func:`payload`), so every
resume's bytes can be regenerated and compared with what was stored.

Timeline (trace seconds; no compute time is modelled): round ``k`` of a session
starts at its arrival (k = 0) or when round k-1's tool returns; it first
resumes (loads the chunks of the context so far), then stores the chunks of
its context at the end of the round, then pauses for ``tool_wait_s``.  The
last round resumes only.
"""
from __future__ import annotations

import hashlib
import heapq
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from . import BYTES_PER_TOKEN


@dataclass(frozen=True)
class Geometry:
    """The replay's small KV geometry (a real 8B model has 128 KiB per token).
    2,048 bytes per token: at 256 a vLLM resume's time was
    its per-chunk bookkeeping (a 1,900-chunk resume: 176 ms from DRAM, 185 from
    NVMe), at 2,048 its bytes show (180 against 279 ms for 1,500 chunks)."""
    bytes_per_token: int = BYTES_PER_TOKEN
    chunk_tokens: int = 64

    @property
    def chunk_bytes(self) -> int:
        return self.bytes_per_token * self.chunk_tokens


@dataclass(frozen=True)
class Step:
    """One round of one session, as the replay runs it."""
    session: str
    round: int
    start_s: float                   # trace seconds
    resume_chunks: tuple[bytes, ...]  # chunk ids to load first (empty for round 0)
    store_chunks: tuple[bytes, ...]   # chunk ids of the context at the round's end (empty: last round)
    context_tokens: int               # tokens at the round's end
    tool: str | None                  # the tool the round then waits on (None: last round)
    prev_tool: str | None             # the tool the round resumes from
    wait_s: float | None


def chunk_id(owner: str, i: int) -> bytes:
    return hashlib.blake2b(f"{owner}\x00{i}".encode(), digest_size=16).digest()


def payload(cid: bytes, nbytes: int) -> np.ndarray:
    """The bytes of chunk ``cid`` (deterministic)."""
    return np.frombuffer(np.random.default_rng(int.from_bytes(cid[:8], "little")).bytes(nbytes), dtype=np.uint8)


def _chunks(session, tokens: int, geo: Geometry) -> tuple[bytes, ...]:
    n = tokens // geo.chunk_tokens
    pre = session.shared_prefix_tokens // geo.chunk_tokens
    owner_pre = session.shared_prefix_id or session.id
    return tuple(chunk_id(owner_pre if i < pre else session.id, i) for i in range(n))


def steps_of(session, geo: Geometry) -> list[Step]:
    out, t, prev = [], session.arrival_s, ()
    prev_tool = None
    n = len(session.rounds)
    for k, r in enumerate(session.rounds):
        last = k == n - 1 or r.tool is None or r.tool_wait_s is None
        tokens = session.shared_prefix_tokens + session.context_tokens(k + 1)
        store = () if last else _chunks(session, tokens, geo)
        out.append(Step(session.id, k, t, prev, store, tokens, None if last else r.tool, prev_tool,
                        None if last else r.tool_wait_s))
        if last:
            break
        t += r.tool_wait_s
        prev, prev_tool = store, r.tool
    return out


@dataclass(frozen=True)
class Workload:
    steps: tuple[Step, ...]        # in start order
    sessions: int
    peak_paused_bytes: int         # max over time of the bytes of paused sessions (counted per session)
    distinct_bytes: int            # bytes of every distinct chunk stored
    max_context_chunks: int

    @classmethod
    def build(cls, sessions: Sequence, geo: Geometry) -> "Workload":
        steps = sorted((s for ses in sessions for s in steps_of(ses, geo)), key=lambda s: (s.start_s, s.session))
        events = []
        distinct: set[bytes] = set()
        for s in steps:
            distinct.update(s.store_chunks)
            if s.store_chunks:
                b = len(s.store_chunks) * geo.chunk_bytes
                events.append((s.start_s, 1, b))
                events.append((s.start_s + s.wait_s, 0, -b))
        heapq.heapify(events)
        cur = peak = 0
        while events:
            _, _, b = heapq.heappop(events)
            cur += b
            peak = max(peak, cur)
        max_chunks = max((max(len(s.store_chunks), len(s.resume_chunks)) for s in steps), default=0)
        return cls(tuple(steps), len(sessions), peak, len(distinct) * geo.chunk_bytes, max_chunks)

    @property
    def resumes(self) -> int:
        return sum(1 for s in self.steps if s.resume_chunks)
