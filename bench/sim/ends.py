"""A round's end: the engine's events (:class:`~kvtier.bench.sim.engine.EngineClock`).

:class:`RoundEnds` handles them: a prefill done starts the decode, a decode
done ends the session (its JCT counted, its blocks freed) or pauses it
(:class:`~kvtier.bench.sim.pauses.Pauses`); then the admission queues are
pumped.  One owner, the node's event loop; not thread-safe.
"""
from __future__ import annotations

from typing import Callable

from kvtier.bench.sim.admission import Admission
from kvtier.bench.sim.events import EventQueue
from kvtier.bench.sim.ledger import Ledger
from kvtier.bench.sim.metrics import SimCounters
from kvtier.bench.sim.node import DONE, SessionState
from kvtier.bench.sim.pauses import Pauses
from kvtier.bench.sim.rounds import RoundStarts
from kvtier.bench.sim.strategies import RoundWatch


class RoundEnds:
    """The engine's events: prefills and decodes that finished (see the module docstring).
    ``progress(done, total)`` is called every 200 finished sessions; ``record_rounds`` keeps
    a per-round log in the counters."""

    def __init__(self, *, clock: EventQueue, ledger: Ledger, m: SimCounters, starts: RoundStarts,
                 pauses: Pauses, admission: Admission, watch: RoundWatch, sessions: list[SessionState],
                 progress: Callable[[int, int], None] | None, record_rounds: bool) -> None:
        self._clock = clock
        self._ledger = ledger
        self._m = m
        self._starts = starts
        self._engine = starts.engine
        self._pauses = pauses
        self._admission = admission
        self._watch = watch
        self._sessions = sessions
        self._progress = progress
        self._record = record_rounds
        self.done = 0                  # sessions finished
        self.last_done = 0.0           # when the latest one did

    def on_engine(self) -> None:
        """An ENGINE event of the current epoch fired."""
        now = self._clock.now
        pf_done, finished = self._engine.due(now)
        if pf_done is not None:
            self._prefill_done(pf_done)
        for x in finished:
            self._decode_done(x)
        self._starts.schedule_engine(self._engine.reschedule(now))
        self._admission.pump()

    def _prefill_done(self, x: SessionState) -> None:
        r = x.rounds[x.k]
        if x.k > 0:
            ideal = r.new_tokens * self._starts.comp_s_per_token
            self._m.delays.append(max(0.0, self._clock.now - x.return_t - ideal))
        if r.output_tokens <= 0:
            self._decode_done(x)
            return
        x.dec_kv = x.shared + x.ctx + r.new_tokens + r.output_tokens // 2
        self._engine.start_decode(x, r.output_tokens)

    def _decode_done(self, x: SessionState) -> None:
        r = x.rounds[x.k]
        now, m = self._clock.now, self._m
        if self._record:
            m.round_log.append((x.s.id, x.k, x.start_t, now))
        x.ctx += r.new_tokens + r.output_tokens
        m.out_tokens += r.output_tokens
        x.recompute = 0
        if x.k < len(x.rounds) - 1:
            self._pauses.pause(x)
            return
        x.phase = DONE
        m.close_record(x)
        self._ledger.hbm(x, 0)
        self._ledger.set_copy(x, None, 0)
        m.jcts.append(now - x.s.arrival_s)
        self.last_done = now
        self.done += 1
        if self._progress is not None and self.done % 200 == 0:
            self._progress(self.done, len(self._sessions))
        self._watch.finished(x)
