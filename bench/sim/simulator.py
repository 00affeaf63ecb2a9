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

Rooms
-----
``node.py`` (config, session state, results), ``ledger.py`` (tier accounting),
``transfers.py`` (FIFO servers, transfer data), ``moves.py`` (the transfer state
machine), ``engine.py`` (the iteration clock), ``lifecycle.py`` (the node on the engines' lifecycle
controller: SimMoves, SimDevice, its timers as heap events), ``pauses.py`` (decisions, leases,
prefetch, staging), ``admission.py`` (queues, victims, wedge breaker),
``metrics.py`` (counters and the summary), ``attribution.py`` (per-pause cost
against the policy's expectation), ``bound.py`` (the exact offline optimum on small
traces, the envelope), ``sweep.py`` (``--sweep-link``).  This module wires them into
one event loop.  Policies see the transfer queues through ``PauseContext``
(``link_out_queue_s`` = the device->host backlog now, ``link_in_queue_s`` = the mean
wait reloads found, the NVMe equivalents, ``link_utilisation``) and how often it has evicted
paused HBM-resident state (``eviction_rate_per_s``, :class:`~kvtier.bench.sim.admission.EvictionRate`).

Driving a node from outside
---------------------------
:meth:`Simulator.run` is ``start()``, then ``step()`` until
``next_event_time()`` is None, then ``finish()``.  An outer loop (a cluster of
nodes) may interleave several simulators by always stepping the one with the
earliest ``next_event_time()``, and inject sessions with :meth:`add_session`.
Hooks a subclass may override: :meth:`Simulator._on_return` (where a resumed
round lands) and :meth:`Simulator._reload` (where its state loads from).

"""
from __future__ import annotations

import heapq
import math
import time as _time
from collections import deque
from typing import Callable, Sequence

from kvtier.tiering.model.decision import Policy

from kvtier.bench.sim.admission import Admission, EvictionRate
from kvtier.bench.sim.engine import EngineClock
from kvtier.bench.sim.ledger import MemoryLedger
from kvtier.bench.sim.metrics import SimCounters, summary
from kvtier.bench.sim.moves import XFER_EVENT, TransferStateMachine
from kvtier.bench.sim.node import (DONE, NEW_Q, P_HBM, P_NONE, PAUSED, REJECTED, RESUME_Q, RUNNING,
                                   NodeConfig, SessionState, SimResult, SimulationStalled)
from kvtier.bench.sim.lifecycle import CTL_EVENT, SimController
from kvtier.bench.sim.pauses import RETURN_EVENT, PauseHandling
from kvtier.bench.sim.trace import Session
from kvtier.bench.sim.transfers import Leg, Then, TransferServers

__all__ = ["NodeConfig", "SimResult", "SimulationStalled", "Simulator", "simulate"]

# event kinds (the heap orders by time, then by push order; kinds only dispatch)
ARRIVE_EVENT, ENGINE_EVENT = 0, 5
assert len({ARRIVE_EVENT, RETURN_EVENT, XFER_EVENT, ENGINE_EVENT, CTL_EVENT}) == 5


class Simulator(MemoryLedger, TransferStateMachine, PauseHandling, Admission):
    """Replays ``sessions`` through ``policy`` on ``node``.  Use :meth:`run` once.

    ``reveal_true_wait`` puts the real wait into every PauseContext (the
    oracle).  ``progress(done, total)`` is called now and then.  ``record_rounds``
    keeps a per-round log (tests).  Not thread-safe; one run per instance.
    """

    def __init__(self, sessions: Sequence[Session], node: NodeConfig, policy: Policy, *,
                 name: str | None = None, reveal_true_wait: bool = False,
                 progress: Callable[[int, int], None] | None = None,
                 record_rounds: bool = False, check_every: int = 0,
                 occupancy_points: int = 4000) -> None:
        self.node = node
        self.policy = policy
        self.name = name or getattr(policy, "name", type(policy).__name__)
        self.reveal = reveal_true_wait
        self.progress = progress
        self.record_rounds = record_rounds
        self.check_every = check_every
        self.sessions = [SessionState(s) for s in sessions]
        g, hw = node.geometry, node.hardware
        self.tb = node.token_bytes
        self.bt = node.block_tokens
        self.bb = node.block_bytes
        self.hbm_total = node.hbm_blocks
        self.host_total = node.host_blocks
        self.nvme_total = node.nvme_blocks
        self.ceiling_blocks = int(node.admission_ceiling * self.hbm_total)
        self.comp_s_per_token = 2.0 * g.compute_params / hw.prefill_flops
        self.eng = EngineClock(t_weights=hw.weights_bytes / node.hbm_bw_bps,
                               kv_s_per_token=self.tb / node.hbm_bw_bps,
                               comp_s_per_token=self.comp_s_per_token, chunk=node.chunk_tokens)
        self.xs = TransferServers(self.bb, hw)
        self.m = SimCounters()
        # event loop
        self.now = 0.0
        self.heap: list = []
        self.seq = 0
        self.events = 0
        # ledgers (see ledger.py)
        self.used = 0
        self.host_used = 0
        self.nvme_used = 0
        self.pending_free = 0                         # HBM blocks of victims whose copy is under way
        self.shared_loaded: dict[str, int] = {}
        self.paused_hbm: dict[SessionState, None] = {}    # insertion order = oldest pause first
        self.evr = EvictionRate()                     # how often paused_hbm members are made to leave
        self.clean: dict[SessionState, None] = {}         # host copies also resident in HBM, oldest first
        self.clean_blocks = 0
        self.wt = bool(node.write_through)
        self.durable: dict[SessionState, int] = {}        # write-through: host copies durable on NVMe (not clean)
        self.durable_blocks = 0
        self.used_mark = 0.0
        # queues
        self.resume_q: deque[SessionState] = deque()
        self.new_q: deque[SessionState] = deque()
        self.fg_inflight = 0                          # foreground transfers in flight (each ends in a _pump)
        self.pf_ceiling = not node.prefetch_past_ceiling
        self.holders_first = bool(node.holders_first)
        self._default_victims = type(policy).victim_priority is Policy.victim_priority
        span = max((s.arrival_s for s in sessions), default=0.0)
        self.occ_dt = max(0.05, span / max(1, occupancy_points))
        self.occ: list[tuple[float, float]] = []
        self.occ_last = -math.inf
        self.done = 0
        self.last_done = 0.0
        self._wall0 = 0.0
        self.lifecycle = SimController(self)          # every pause runs on the engines' controller

    def _close_record(self, x: SessionState) -> None:
        """x's last pause is over (it paused again, finished or was rejected): count its record."""
        if x.rec is not None:
            self.m.attr.close(x.rec)
            x.rec = None

    def _push(self, t: float, kind: int, obj, tok: int) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, obj, tok))

    # ---------------------------------------------------------------- engine
    def _eng_push(self, t: float | None) -> None:
        if t is not None:
            self._push(t, ENGINE_EVENT, None, self.eng.epoch)

    def _on_engine(self) -> None:
        pf_done, finished = self.eng.due(self.now)
        if pf_done is not None:
            self._prefill_done(pf_done)
        for x in finished:
            self._decode_done(x)
        self._eng_push(self.eng.reschedule(self.now))
        self._pump()

    def _enqueue_prefill(self, x: SessionState) -> None:
        if x.hit_k != x.k:                       # equation (2) of 000: counted once per round
            x.hit_k = x.k
            self.m.prompt_tokens += x.shared + x.ctx + x.rounds[x.k].new_tokens
            self.m.prefilled_tokens += x.need_prefill
        self._eng_push(self.eng.enqueue_prefill(x, x.k > 0, self.now))

    def _prefill_done(self, x: SessionState) -> None:
        r = x.rounds[x.k]
        if x.k > 0:
            ideal = r.new_tokens * self.comp_s_per_token
            self.m.delays.append(max(0.0, self.now - x.return_t - ideal))
        if r.output_tokens <= 0:
            self._decode_done(x)
            return
        x.dec_kv = x.shared + x.ctx + r.new_tokens + r.output_tokens // 2
        self.eng.start_decode(x, r.output_tokens)

    # ---------------------------------------------------------------- rounds
    def _start_round(self, x: SessionState) -> None:
        """Memory is reserved; get the state resident and queue the prefill."""
        r = x.rounds[x.k]
        x.phase = RUNNING
        x.start_t = self.now
        if x.k == 0:
            x.need_prefill = r.new_tokens + x.recompute
            self._enqueue_prefill(x)
            return
        if x.place == P_NONE:
            x.need_prefill = x.ctx + r.new_tokens
            self.m.recomputed += x.ctx
            self._resumed(x, x.ctx * self.comp_s_per_token)
            self._enqueue_prefill(x)
            return
        x.need_prefill = r.new_tokens
        mv = x.moving
        if mv is not None and mv.kind in (Leg.H2D, Leg.NVME_READ):
            x.waiting_reload = True                  # prefetch under way
            return
        if x.place == P_HBM or (mv is not None and mv.then in (Then.TO_HOST, Then.TO_NVME, Then.VIA_NVME)):
            self._resumed(x, 0.0)
            self._enqueue_prefill(x)                 # data still in HBM
            return
        self._reload(x)                              # demand reload (blocks already reserved)
        x.waiting_reload = True

    def _resumed(self, x: SessionState, rebuild_s: float) -> None:
        """x's state is resident (or its recompute queued): record the resume stall."""
        wait = self.now - x.return_t
        self.m.stalls.append(wait + rebuild_s)
        rec = x.rec
        if rec is not None:
            rec.stall_s += wait
            rec.recompute_s += rebuild_s

    def _decode_done(self, x: SessionState) -> None:
        r = x.rounds[x.k]
        if self.record_rounds:
            self.m.round_log.append((x.s.id, x.k, x.start_t, self.now))
        x.ctx += r.new_tokens + r.output_tokens
        self.m.out_tokens += r.output_tokens
        x.recompute = 0
        if x.k == len(x.rounds) - 1:
            x.phase = DONE
            self._close_record(x)
            self._hbm(x, 0)
            self._set_copy(x, None, 0)
            self.m.jcts.append(self.now - x.s.arrival_s)
            self.last_done = self.now
            self.done += 1
            if self.progress is not None and self.done % 200 == 0:
                self.progress(self.done, len(self.sessions))
            return
        self._pause(x)

    # ---------------------------------------------------------------- driving
    def start(self) -> None:
        """Queue every session's arrival (call once, before :meth:`step`)."""
        self._wall0 = _time.perf_counter()
        for x in self.sessions:
            self._push(x.s.arrival_s, ARRIVE_EVENT, x, 0)

    def add_session(self, session: Session, at_s: float | None = None) -> SessionState:
        """Add a session arriving at ``at_s`` (default: its own arrival, never before now); for an
        outer loop that routes sessions to nodes.  Returns its state."""
        x = SessionState(session)
        self.sessions.append(x)
        self._push(max(self.now, session.arrival_s if at_s is None else at_s), ARRIVE_EVENT, x, 0)
        return x

    def next_event_time(self) -> float | None:
        """Time of the next queued event (None when the node has nothing left to do)."""
        return self.heap[0][0] if self.heap else None

    def step(self) -> None:
        """Handle the next event.  Raises IndexError when none is queued."""
        t, _, kind, obj, tok = heapq.heappop(self.heap)
        self.now = t
        self.events += 1
        if kind == ENGINE_EVENT:
            if tok == self.eng.epoch:
                self._on_engine()
        elif kind == XFER_EVENT:
            self._on_xfer(obj)
        elif kind == RETURN_EVENT:
            if tok == obj.epoch and obj.phase == PAUSED:
                self._on_return(obj)
        elif kind == CTL_EVENT:
            self.lifecycle.fire(obj[0], obj[1], obj[2], t)   # a controller timer: lease, staging, reload
        elif kind == ARRIVE_EVENT:
            obj.phase = NEW_Q
            self.new_q.append(obj)
            self._pump()
        if self.check_every and self.events % self.check_every == 0:
            self.check_integrity()

    def finish(self) -> SimResult:
        """Close the run once no event is left.  Raises SimulationStalled if a session is unfinished."""
        stuck = [x for x in self.sessions if x.phase not in (DONE, REJECTED)]
        if stuck:
            raise SimulationStalled(self._stall_report(stuck))
        if self.fg_inflight != 0:
            raise AssertionError(f"{self.fg_inflight} foreground transfers still counted in flight at the end")
        self.now = max(self.last_done, self.used_mark)
        self._set_used(0)
        self.check_integrity()
        wall = _time.perf_counter() - self._wall0
        first = min((x.s.arrival_s for x in self.sessions), default=0.0)
        metrics = summary(self.m, first_arrival=first, last_done=self.last_done, hbm_total=self.hbm_total,
                          block_bytes=self.bb, write_through=self.wt, moved_bytes=self.xs.moved_bytes,
                          events=self.events, wall=wall)
        return SimResult(self.name, metrics, tuple(self.occ), tuple(self.m.stalls),
                         tuple(self.m.jcts), tuple(self.m.round_log))

    def run(self) -> SimResult:
        """Replay the whole trace.  Raises SimulationStalled (a deadlocked node)."""
        self.start()
        heap, step = self.heap, self.step
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
        return (f"policy {self.name}: the event queue emptied at t={self.now:.1f} s with {len(stuck)} of "
                f"{len(self.sessions)} sessions unfinished ({parts}); HBM {self.used}/{self.hbm_total} blocks, "
                f"host {self.host_used}/{self.host_total}, NVMe {self.nvme_used}/{self.nvme_total} "
                f"(a simulator bug: every session must finish or be rejected)")


def simulate(sessions: Sequence[Session], node: NodeConfig, policy: Policy, **kw) -> SimResult:
    """Convenience: one run of one policy."""
    return Simulator(sessions, node, policy, **kw).run()
