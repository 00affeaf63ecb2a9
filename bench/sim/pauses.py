"""Pauses: the policy's decision at a tool call, and the tool's return.

When a round other than the last finishes decoding, :meth:`Pauses.pause` has
the node's lifecycle controller (:class:`~kvtier.bench.sim.lifecycle.SimController`)
ask the policy once (its PauseContext from :class:`~kvtier.bench.sim.contexts.PauseContexts`);
:class:`~kvtier.bench.sim.placement.Placement` makes the pause's own move and
the controller arms the plan's timers (``stage_at_s``, ``prefetch_at_s``,
``demote_at_s``, seconds after the pause).  Lease ends, stagings and prefetches
are the controller's timers.  When the tool returns the controller resumes the
pause (the policy ``observe``s the real wait) and the next round is queued
here (:meth:`Pauses.resume_here`), or, in a cluster, the pause ends here and the
round runs on another node (:meth:`Pauses.leave`).  One owner, the node's event
loop; not thread-safe.
"""
from __future__ import annotations

from kvtier.tiering.model.decision import Action

from kvtier.bench.sim.admission import Admission
from kvtier.bench.sim.attribution import PauseRecord
from kvtier.bench.sim.events import EventKind, EventQueue
from kvtier.bench.sim.ledger import Ledger
from kvtier.bench.sim.lifecycle import SimController
from kvtier.bench.sim.metrics import SimCounters
from kvtier.bench.sim.node import DONE, PAUSED, RESUME_Q, SessionState, WaitQueues
from kvtier.bench.sim.placement import Placement
from kvtier.bench.sim.strategies import RoundWatch
from kvtier.util.tiers import Tier


class Pauses:
    """Pauses and tool returns of the node's sessions (see the module docstring)."""

    def __init__(self, *, clock: EventQueue, ledger: Ledger, m: SimCounters, controller: SimController,
                 placement: Placement, admission: Admission, queues: WaitQueues, watch: RoundWatch) -> None:
        self._clock = clock
        self._ledger = ledger
        self._m = m
        self._ctl = controller
        self._placement = placement
        self._admission = admission
        self._queues = queues
        self._watch = watch

    def pause(self, x: SessionState) -> None:
        """x's round ended at a tool call: decide, make the pause's move, arm the plan."""
        r = x.rounds[x.k]
        now, m = self._clock.now, self._m
        x.epoch += 1
        self._ledger.idle_flush(x)
        x.phase = PAUSED
        x.place = Tier.DEVICE
        x.pause_t = now
        x.return_t = now + (r.tool_wait_s or 0.0)
        x.prefetch_pending = False
        x.stage_pending = False
        x.waiting_reload = False
        self._clock.push(x.return_t, EventKind.RETURN, x, x.epoch)
        ctl = self._ctl
        d = ctl.pause_session(x)                 # the controller asks the policy (DeviceSchedule)
        x.decision = d
        a = d.action.value if isinstance(d.action, Action) else str(d.action)
        m.actions[a] = m.actions.get(a, 0) + 1
        m.close_record(x)
        x.rec = PauseRecord(a, d.extra)
        self._placement.place(x, Action(d.action))   # the pause's own move
        ctl.armed(x)                             # then the plan's timers (staging, reload, lease)
        self._admission.pump()
        self._watch.paused(x)

    def _end(self, x: SessionState) -> None:
        """x's tool returned: the controller resumes the pause (the policy observes the wait)."""
        r = x.rounds[x.k]
        self._ctl.resume(x.s.id, wait_s=float(r.tool_wait_s or 0.0))
        self._ctl.learn()           # the policy observes the wait at the return (a simulation has no timer thread)
        self._ledger.idle_flush(x)
        self._placement.unlist(x)

    def resume_here(self, x: SessionState) -> None:
        """x's tool returned and its next round runs on this node: queue it for admission."""
        self._end(x)
        mv = x.moving
        if mv is not None and mv.victim_blocks:
            # a victim resumed during its copy-out keeps its blocks: they are no longer on their way
            self._ledger.pending(-mv.victim_blocks)
            mv.victim_blocks = 0
        x.epoch += 1
        x.prefetch_pending = False
        x.stage_pending = False
        x.k += 1
        x.phase = RESUME_Q
        self._queues.resume.append(x)
        self._admission.pump()

    def leave(self, x: SessionState) -> None:
        """x's tool returned and its next round runs on another node: release every copy of its
        state here (transfers in flight land into nothing); x becomes a ghost (phase DONE, no
        JCT here).  The caller pumps the admission queues."""
        self._end(x)
        x.epoch += 1                       # stale: its prefetch, lease and staging events
        x.prefetch_pending = x.stage_pending = False
        self._ledger.hbm(x, 0)
        self._ledger.set_copy(x, None, 0)
        x.place = None
        x.phase = DONE
