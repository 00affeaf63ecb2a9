"""Trajectories of requests that name none, found by their prompt's prefix.

An agent's next request repeats its whole context so far and appends the
tool's result, so its prompt's block hashes (vLLM's ``request.block_hashes``,
chained: equal prefixes give equal hashes) begin with the hashes of the
previous request's prompt and output.  When a request finishes, the last few
of its block hashes are remembered as its trajectory's *tail*; a new request
whose hashes contain a remembered tail continues that trajectory (the latest
such tail wins, so a shared system prompt, which is at the head, never joins
two sessions).  A request that extends no tail starts a new trajectory.  The
gap between a request finishing and the next one on its trajectory is then an
observed wait, learned like a hinted tool's.

Bounded: at most ``cap`` tails and ``cap`` open requests are kept (least
recently used dropped first).  Thread-safe; vLLM calls it from its scheduler
thread.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Hashable, Sequence

TAIL_BLOCKS = 4


class PrefixTrajectories:
    """Maps requests to trajectories by the tails of earlier requests (see the module doc)."""

    def __init__(self, cap: int = 20_000, tail_blocks: int = TAIL_BLOCKS) -> None:
        if cap < 1 or tail_blocks < 1:
            raise ValueError("cap and tail_blocks must be >= 1")
        self._cap, self._tail = int(cap), int(tail_blocks)
        self._lock = threading.Lock()
        self._tails: OrderedDict[Hashable, str] = OrderedDict()      # block hash -> trajectory
        self._open: OrderedDict[str, str | None] = OrderedDict()      # request id -> trajectory
        self._found: dict[str, bool] = {}                              # request id -> extends a tail
        self.joined = 0        # requests adopted into a trajectory they extend
        self.started = 0       # requests adopted as a new trajectory

    def propose(self, req_id: str, block_hashes: Sequence[Hashable]) -> str | None:
        """The trajectory a new request with these prompt block hashes would
        belong to (None: a prompt shorter than one block), kept for :meth:`adopt`."""
        traj, found = None, False
        with self._lock:
            for h in reversed(block_hashes):
                traj = self._tails.get(h)
                if traj is not None:
                    self._tails.move_to_end(h)
                    found = True
                    break
            else:
                if block_hashes:
                    traj = f"prefix:{req_id}"
            self._remember(req_id, traj)
            self._found[req_id] = found
        return traj

    def adopt(self, req_id: str) -> str | None:
        """The proposed trajectory of ``req_id``, taken as its own (a request that
        names none); counted as joined or started.  None if none was proposed."""
        with self._lock:
            traj = self._open.get(req_id)
            found = self._found.pop(req_id, None)
            if traj is not None and found is not None:
                if found:
                    self.joined += 1
                else:
                    self.started += 1
        return traj

    def bind(self, req_id: str, traj: str | None) -> None:
        """``req_id`` belongs to ``traj`` (a named trajectory, or the adopted one)."""
        with self._lock:
            self._found.pop(req_id, None)
            self._remember(req_id, traj)

    def finished(self, req_id: str, block_hashes: Sequence[Hashable]) -> str | None:
        """``req_id`` is done: its last block hashes become its trajectory's tail.
        Returns the trajectory (None if the request was not bound)."""
        with self._lock:
            traj = self._open.pop(req_id, None)
            self._found.pop(req_id, None)
            if traj is None:
                return None
            for h in list(block_hashes)[-self._tail:]:
                self._tails[h] = traj
                self._tails.move_to_end(h)
            while len(self._tails) > self._cap * self._tail:
                self._tails.popitem(last=False)
        return traj

    def _remember(self, req_id: str, traj: str | None) -> None:
        self._open[req_id] = traj
        self._open.move_to_end(req_id)
        while len(self._open) > self._cap:
            old, _ = self._open.popitem(last=False)
            self._found.pop(old, None)

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"prefix_joined": self.joined, "prefix_started": self.started, "prefix_tails": len(self._tails)}
