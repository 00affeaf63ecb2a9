"""Discrete-event simulator of one serving node replaying an agent trace.

Pure Python (no torch, no store): a heap of timed events, whole-round jobs
(never per-token events), and the pause policies plugged in unchanged through
:class:`kvtier.tiering.model.decision.Policy`.

The node
--------
::

    HBM pool (blocks of ``block_tokens``)     pinned host DRAM          NVMe
    +---------------------------------+  d2h   +-------------+  write  +------+
    | shared prefixes | running | idle | -----> | host copies | ------> | NVMe |
    +---------------------------------+ <----- +-------------+ <------ +------+
          ^ admission ceiling  ^ 100%     h2d                   read

* **Memory.** The KV pool is ``hardware.kv_pool_bytes`` (equation 5) cut
  into blocks.  A round reserves its whole footprint (context + new +
  output tokens) when it starts, so a running round never runs out
  mid-decode.  Shared prefixes are loaded once and stay resident.
* **Admission.** New sessions are admitted FIFO only while occupancy after
  admission stays at or under ``admission_ceiling`` (the texts' tau_high);
  resumed rounds come first and may use the pool up to 100%.
* **Pressure.** When the head of a queue does not fit, paused trajectories
  still resident in HBM are victims, oldest pause first: the policy's
  ``victim_action`` says drop (recompute later), swap out (freed when the
  transfer completes) or ``retain`` (pinned: skipped).  If a resumed round
  still cannot start, nothing is running and nothing is being freed, the
  oldest pinned trajectory is dropped anyway (an emergency preemption,
  counted).  Resumed rounds queued behind the head may hold HBM too (state
  not yet gone, or already back, when the tool returned); when nothing runs
  and no foreground transfer is in flight, their blocks are freed, latest
  return first (a complete lower-tier copy is kept, else the state is
  dropped), so the node cannot deadlock.  A run whose event queue empties
  with sessions unfinished raises :class:`SimulationStalled`.
* **Compute.** One engine runs chunked-prefill iterations: each iteration
  decodes one token for every running sequence and prefills up to
  ``chunk_tokens`` of the head prefill job (resumed rounds before new
  sessions).  An iteration takes ``max(memory time, compute time)``:
  memory = (weights + KV of the decode batch) / HBM bandwidth, compute =
  (chunk + batch) tokens x 2P FLOPs / prefill FLOP/s.  Progress is tracked
  on a virtual iteration clock, so events happen only when a job finishes
  or the batch changes.
* **Transfers.** Host link each way and NVMe read/write are FIFO servers
  with the profile's bandwidths; a transfer occupies its server for
  bytes / bandwidth.  Offload to NVMe streams HBM -> NVMe through bounce
  buffers (HBM blocks are freed when the NVMe write completes).
* **Write-through** (``NodeConfig.write_through``, off by default; every
  policy on equal terms).  Each host copy is also written to NVMe in the
  background (the write server's spare time: offload writes preempt it).
  A host copy fully written is droppable: when host room is needed, clean
  copies go first, then durable copies of paused trajectories in the
  policy's ``victim_priority`` order (default: the longest-paused first),
  whose state then reloads from NVMe.  A staging NVMe -> host keeps the NVMe
  copy (so the staged copy is droppable) and pushes out only copies the
  policy ranks above the staged trajectory.  Policies see it as
  ``PauseContext.write_through``; droppable copies count as free host room
  (``host_free_bytes``, with ``host_droppable_bytes`` saying how much).
* **Pauses.** When a round other than the last finishes decoding, the
  policy decides (``PauseContext``: whole KV bytes, bytes not already in a
  lower tier, occupancy, free host/NVMe bytes; ``true_wait_s`` for the
  oracle only).  ``prefetch_at_s`` and ``demote_at_s`` are seconds after
  the pause; at a lease expiry ``on_lease_expiry`` may re-decide.  When the
  tool returns the policy ``observe``s the real wait and the next round is
  queued; it can start only once its state is back in HBM (retained,
  prefetched, reloaded on demand, or recomputed as part of its prefill).

Parts
-----
The node is composed, as the store is (``store/parts.py``): one part per
concern, each owning its fields and handed the parts it uses when built, in
order (``parts.py`` lists them: the clock, counters, paused residents, ledger,
transfer engine, wait queues, contexts, host room, round starts, placement,
lifecycle controller, admission, pauses, round ends, transfer landings).  This class
builds them, runs the event loop and dispatches each event to its part.

What differs in a cluster's node (a remote fill, a prefetch gate, counting
rounds and publishing, routing a return) is the node's
:class:`~kvtier.bench.sim.role.Role`: :class:`~kvtier.bench.sim.role.Alone`
here, :class:`~kvtier.bench.sim.cluster_node.Seat` in a cluster (their
strategies' interfaces: ``strategies.py``).  Other rooms:
``node.py`` (config, session state, results), ``transfers.py`` (FIFO servers,
transfer data), ``engine.py`` (the iteration clock), ``attribution.py``
(per-pause cost against the policy's expectation), ``bound.py`` (the exact
offline optimum on small traces, the envelope), ``sweep.py`` (``--sweep-link``).

Driving a node from outside
---------------------------
:meth:`Simulator.run` is ``start()``, then ``step()`` until
``next_event_time()`` is None, then ``finish()``.  An outer loop (a cluster of
nodes) may interleave several simulators by always stepping the one with the
earliest ``next_event_time()``, hand them arrivals (:meth:`Simulator.arrive`)
and sessions resumed from elsewhere (:meth:`Simulator.adopt`), and inject
sessions with :meth:`Simulator.add_session`.

"""
from __future__ import annotations

import time as _time
from typing import Callable, Sequence

from kvtier.tiering.model.decision import Policy

from kvtier.bench.sim.events import EventKind
from kvtier.bench.sim.metrics import summary
from kvtier.bench.sim.node import (DONE, NEW_Q, PAUSED, REJECTED, RESUME_Q, RUNNING, NodeConfig, SessionState,
                                   SimResult, SimulationStalled)
from kvtier.bench.sim.parts import build_parts
from kvtier.bench.sim.role import Alone, Role
from kvtier.bench.sim.trace import Session

__all__ = ["NodeConfig", "SimResult", "SimulationStalled", "Simulator", "simulate"]


class Simulator:
    """Replays ``sessions`` through ``policy`` on ``node``.  Use :meth:`run` once.

    ``reveal_true_wait`` puts the real wait into every PauseContext (the
    oracle).  ``progress(done, total)`` is called now and then.  ``record_rounds``
    keeps a per-round log (tests).  ``check_every``: :meth:`Ledger.check_integrity`
    after every that many events.  ``span_s``: the arrival span the occupancy
    samples cover (default: the sessions').  ``role``: the node's strategies
    (default: a node on its own).  ``parts``: the node's parts (:class:`NodeParts`);
    ``clock``, ``m``, ``ledger`` and ``lifecycle`` name four of them.  Not thread-safe; one
    run per instance.
    """

    def __init__(self, sessions: Sequence[Session], node: NodeConfig, policy: Policy, *,
                 name: str | None = None, reveal_true_wait: bool = False,
                 progress: Callable[[int, int], None] | None = None,
                 record_rounds: bool = False, check_every: int = 0,
                 occupancy_points: int = 4000, span_s: float | None = None,
                 role: Role | None = None) -> None:
        self.node = node
        self.policy = policy
        self.name = name or policy.name
        self.check_every = check_every
        self.sessions = [SessionState(s) for s in sessions]
        if span_s is None:
            span_s = max((s.arrival_s for s in sessions), default=0.0)
        self.parts = p = build_parts(node, policy, self.sessions, Alone() if role is None else role,
                                     reveal_true_wait=reveal_true_wait, progress=progress,
                                     record_rounds=record_rounds,
                                     occupancy_dt=max(0.05, span_s / max(1, occupancy_points)))
        self.clock, self.m, self.ledger, self.lifecycle = p.clock, p.m, p.ledger, p.lifecycle
        self._wall0 = 0.0

    # ---------------------------------------------------------------- driving
    def start(self) -> None:
        """Queue every session's arrival (call once, before :meth:`step`)."""
        self._wall0 = _time.perf_counter()
        for x in self.sessions:
            self.clock.push(x.s.arrival_s, EventKind.ARRIVE, x, 0)

    def add_session(self, session: Session, at_s: float | None = None) -> SessionState:
        """Add a session arriving at ``at_s`` (default: its own arrival, never before now); for an
        outer loop that routes sessions to nodes.  Returns its state."""
        x = SessionState(session)
        self.sessions.append(x)
        self.clock.push(max(self.clock.now, session.arrival_s if at_s is None else at_s), EventKind.ARRIVE, x, 0)
        return x

    def arrive(self, session: Session, now: float) -> SessionState:
        """``session`` arrives here at ``now``, handed over by an outer loop (what an ARRIVE
        event does, counted as one).  Returns its state."""
        x = SessionState(session)
        self.sessions.append(x)
        self.clock.jump(now, counted=True)
        x.phase = NEW_Q
        self.parts.queues.new.append(x)
        self.parts.admission.pump()
        return x

    def adopt(self, session: Session, k: int, ctx: int, now: float) -> SessionState:
        """``session`` resumes here with round ``k`` and ``ctx`` private context tokens, its tool
        having returned at ``now``; nothing of its state is local.  Queued for admission; the
        caller runs :meth:`pump` (after handing over what goes with the session)."""
        y = SessionState(session)
        y.k, y.ctx = k, ctx
        y.phase = RESUME_Q
        y.place = None
        y.return_t = y.idle_mark = now
        self.sessions.append(y)
        self.clock.jump(now, counted=False)
        self.parts.queues.resume.append(y)
        return y

    def pump(self) -> None:
        """Admit what fits now (see :meth:`Admission.pump`)."""
        self.parts.admission.pump()

    def next_event_time(self) -> float | None:
        """Time of the next queued event (None when the node has nothing left to do)."""
        return self.clock.next_time()

    def step(self) -> None:
        """Handle the next event.  Raises IndexError when none is queued."""
        kind, obj, tok = self.clock.pop()
        if kind == EventKind.ENGINE:
            if tok == self.parts.starts.engine.epoch:
                self.parts.ends.on_engine()
        elif kind == EventKind.XFER:
            self.parts.landings.on_xfer(obj)
        elif kind == EventKind.RETURN:
            if tok == obj.epoch and obj.phase == PAUSED:
                self.parts.returns.returned(obj)
        elif kind == EventKind.TIMER:
            self.lifecycle.fire(obj[0], obj[1], obj[2], self.clock.now)   # lease, staging, reload
        elif kind == EventKind.FILL:
            self.parts.landings.on_fill(obj)
        elif kind == EventKind.ARRIVE:
            obj.phase = NEW_Q
            self.parts.queues.new.append(obj)
            self.parts.admission.pump()
        if self.check_every and self.clock.handled % self.check_every == 0:
            self.ledger.check_integrity()

    def check_integrity(self) -> None:
        """See :meth:`Ledger.check_integrity`.  Raises AssertionError."""
        self.ledger.check_integrity()

    @property
    def done(self) -> int:
        """Sessions finished here."""
        return self.parts.ends.done

    @property
    def last_done(self) -> float:
        """When the latest session finished here."""
        return self.parts.ends.last_done

    def finish(self) -> SimResult:
        """Close the run once no event is left.  Raises SimulationStalled if a session is unfinished."""
        stuck = [x for x in self.sessions if x.phase not in (DONE, REJECTED)]
        if stuck:
            raise SimulationStalled(self._stall_report(stuck))
        if self.parts.transfers.fg_inflight != 0:
            raise AssertionError(f"{self.parts.transfers.fg_inflight} foreground transfers still counted in flight "
                                 f"at the end")
        led, m = self.ledger, self.m
        self.clock.jump(max(self.parts.ends.last_done, led.used_mark), counted=False)
        led.set_used(0)
        led.check_integrity()
        wall = _time.perf_counter() - self._wall0
        first = min((x.s.arrival_s for x in self.sessions), default=0.0)
        metrics = summary(m, first_arrival=first, last_done=self.parts.ends.last_done, hbm_total=led.hbm_total,
                          block_bytes=led.bb, write_through=led.wt, moved_bytes=self.parts.transfers.xs.moved_bytes,
                          events=self.clock.handled, wall=wall)
        return SimResult(self.name, metrics, tuple(led.occ), tuple(m.stalls), tuple(m.jcts), tuple(m.round_log))

    def run(self) -> SimResult:
        """Replay the whole trace.  Raises SimulationStalled (a deadlocked node)."""
        self.start()
        heap, step = self.clock.heap, self.step
        while heap:
            step()
        return self.finish()

    def _stall_report(self, stuck: list[SessionState]) -> str:
        names = {NEW_Q: "waiting admission", RUNNING: "running", PAUSED: "paused", RESUME_Q: "waiting to resume"}
        by: dict[str, int] = {}
        for x in stuck:
            k = names.get(x.phase, str(x.phase))
            by[k] = by.get(k, 0) + 1
        parts = ", ".join(f"{v} {k}" for k, v in sorted(by.items()))
        led = self.ledger
        return (f"policy {self.name}: the event queue emptied at t={self.clock.now:.1f} s with {len(stuck)} of "
                f"{len(self.sessions)} sessions unfinished ({parts}); HBM {led.used}/{led.hbm_total} blocks, "
                f"host {led.host_used}/{led.host_total}, NVMe {led.nvme_used}/{led.nvme_total} "
                f"(a simulator bug: every session must finish or be rejected)")


def simulate(sessions: Sequence[Session], node: NodeConfig, policy: Policy, **kw) -> SimResult:
    """Convenience: one run of one policy."""
    return Simulator(sessions, node, policy, **kw).run()
