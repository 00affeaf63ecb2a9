"""The engine clock: chunked-prefill iterations on a virtual iteration counter.

One engine runs iterations; each decodes one token for every running sequence
and prefills up to ``chunk`` tokens of the head prefill job (resumed rounds
before new sessions).  An iteration takes ``max(memory time, compute time)``:
memory = (weights + KV of the decode batch) / HBM bandwidth, compute = (chunk +
batch) tokens x 2P FLOPs / prefill FLOP/s.  Progress is the iteration count
``I``, advanced lazily, so an event is due only when a job finishes or the
batch changes: :meth:`reschedule` returns its time, :meth:`due` says what
finished.

Owned by one simulator (not thread-safe).  Jobs are opaque objects with
``need_prefill`` (tokens) and ``dec_kv`` (KV tokens while decoding).
"""
from __future__ import annotations

import heapq
import math
from collections import deque


class EngineClock:
    """Iteration clock of one engine (see the module docstring)."""

    def __init__(self, *, t_weights: float, kv_s_per_token: float, comp_s_per_token: float,
                 chunk: int) -> None:
        self.t_weights = t_weights
        self.kv_s_per_token = kv_s_per_token
        self.comp_s_per_token = comp_s_per_token
        self.chunk = chunk
        self.I = 0.0                 # iterations done (virtual clock)
        self.t_I = 0.0               # wall time I was last advanced to
        self.T_it = 0.0              # seconds per iteration of the current batch (0: idle)
        self.epoch = 0               # bumped at each reschedule: older events are stale
        self.target = 0.0            # iteration count the pending event was scheduled for
        self.pf_resume: deque = deque()
        self.pf_new: deque = deque()
        self.pf_cur = None
        self.pf_target = 0.0
        self.dec_heap: list = []
        self.n_dec = 0
        self.kv_dec = 0
        self._seq = 0

    @property
    def busy(self) -> bool:
        """Something is prefilling or decoding."""
        return bool(self.n_dec) or self.pf_cur is not None

    def advance(self, now: float) -> None:
        """Bring the iteration count up to ``now``."""
        if self.T_it > 0:
            self.I += (now - self.t_I) / self.T_it
        self.t_I = now

    def reschedule(self, now: float) -> float | None:
        """Start the next prefill if none runs, re-time the batch; returns when the next job
        finishes (the caller queues an engine event tagged with :attr:`epoch`), None if idle."""
        if self.pf_cur is None:
            nxt = self.pf_resume.popleft() if self.pf_resume else (self.pf_new.popleft() if self.pf_new else None)
            if nxt is not None:
                self.pf_cur = nxt
                self.pf_target = self.I + nxt.need_prefill / self.chunk
        pf = self.pf_cur is not None
        if not pf and not self.n_dec:
            self.T_it = 0.0
            self.epoch += 1
            return None
        t_mem = self.t_weights + self.kv_dec * self.kv_s_per_token
        t_comp = ((self.chunk if pf else 0) + self.n_dec) * self.comp_s_per_token
        self.T_it = max(t_mem, t_comp)
        target = self.pf_target if pf else math.inf
        if self.dec_heap and self.dec_heap[0][0] < target:
            target = self.dec_heap[0][0]
        self.epoch += 1
        self.target = target
        return now + max(0.0, target - self.I) * self.T_it

    def due(self, now: float) -> tuple[object | None, list]:
        """The engine event fired: (the prefill job that finished or None, decode jobs that finished)."""
        self.advance(now)
        # the job this event was scheduled for is due, whatever float rounding of time says
        if self.I < self.target:
            self.I = self.target
        eps = 1e-9 * max(1.0, abs(self.I))
        finished = []
        while self.dec_heap and self.dec_heap[0][0] <= self.I + eps:
            _, _, x = heapq.heappop(self.dec_heap)
            self.n_dec -= 1
            self.kv_dec -= x.dec_kv
            finished.append(x)
        pf_done = None
        if self.pf_cur is not None and self.pf_target <= self.I + eps:
            pf_done, self.pf_cur = self.pf_cur, None
        return pf_done, finished

    def enqueue_prefill(self, x, resumed: bool, now: float) -> float | None:
        """Queue x's prefill (resumed rounds first); returns a new event time if it started now."""
        self.advance(now)
        (self.pf_resume if resumed else self.pf_new).append(x)
        if self.pf_cur is None:
            return self.reschedule(now)
        return None

    def start_decode(self, x, output_tokens: int) -> None:
        """x decodes ``output_tokens`` from the next iteration on (x.dec_kv already set)."""
        self.kv_dec += x.dec_kv
        self.n_dec += 1
        self._seq += 1
        heapq.heappush(self.dec_heap, (self.I + output_tokens, self._seq, x))
