"""The node's clock and its heap of timed events.

Every part of a simulated node reads the time from one :class:`EventQueue`
(``now``) and queues what happens later on it.  The heap orders events by
(time, push order); an event's :class:`EventKind` only says which part handles
it (the node's event loop, :mod:`.simulator`, dispatches).  One owner, not
thread-safe.
"""
from __future__ import annotations

import enum
import heapq
from typing import Iterator


class EventKind(enum.IntEnum):
    """Which part of the node handles an event."""

    ARRIVE = 0       # a session arrives (the admission queue)
    RETURN = 1       # a paused session's tool returns
    XFER = 4         # a transfer on the node's servers landed (:mod:`.landings`)
    ENGINE = 5       # the engine's next job finished (:mod:`.rounds`)
    FILL = 6         # a fill over the NIC from the cluster's remote tier landed
    TIMER = 7        # a lifecycle controller timer (:mod:`.lifecycle`)


class EventQueue:
    """The clock (``now``, seconds) and the timed events still to come.

    ``handled`` counts events handled (the summary's ``events``), including
    those an outer loop hands the node directly (:meth:`jump`).
    """

    __slots__ = ("now", "heap", "seq", "handled")

    def __init__(self) -> None:
        self.now = 0.0
        self.heap: list[tuple[float, int, EventKind, object, int]] = []
        self.seq = 0
        self.handled = 0

    def push(self, t: float, kind: EventKind, obj: object, tok: int) -> None:
        """Queue ``obj`` at time ``t``; ``tok`` lets its handler tell a stale event (an epoch)."""
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, obj, tok))

    def pop(self) -> tuple[EventKind, object, int]:
        """Take the earliest event, move the clock to it; returns (kind, obj, tok).
        Raises IndexError when none is queued."""
        t, _, kind, obj, tok = heapq.heappop(self.heap)
        self.now = t
        self.handled += 1
        return kind, obj, tok

    def jump(self, now: float, *, counted: bool) -> None:
        """Move the clock to ``now`` for an event an outer loop handles here itself (a
        cluster's arrival: ``counted``; a session moved in from another node: not)."""
        self.now = now
        if counted:
            self.handled += 1

    def next_time(self) -> float | None:
        """Time of the earliest queued event (None when none is)."""
        return self.heap[0][0] if self.heap else None

    def pending(self) -> Iterator[tuple[EventKind, object, int]]:
        """Every queued event as (kind, obj, tok), in no particular order (integrity checks)."""
        for _, _, kind, obj, tok in self.heap:
            yield kind, obj, tok
