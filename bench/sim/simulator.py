"""Discrete-event simulator of one serving node replaying an agent trace.

Pure Python (no torch, no store): a heap of timed events, whole-round jobs
(never per-token events), and the pause policies plugged in unchanged through
:class:`kvtier.tiering.decision.Policy`.

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

Metrics (per policy)
--------------------
``jct`` is session completion minus arrival.  ``resume stall`` of a
resumed round is what the placement of its state costs it: the time from
the tool's return until its context is resident again in HBM (waiting for
room, reloading from host or NVMe), plus, when the state was dropped, the
prefill time of the context it must recompute.  ``resume delay`` (extra) is
wider: tool return to the end of the round's prefill, minus the prefill of
its new tokens alone, so it also holds queueing behind other prefills.  ``recomputed_tokens`` counts context prefilled
again because state was dropped.  ``hbm_idle_gb_s`` integrates HBM bytes
held by paused trajectories over time.
"""
from __future__ import annotations

import heapq
import math
import time as _time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

from kvtier.tiering.costmodel import GB, HardwareProfile, ModelGeometry
from kvtier.tiering.decision import Action, Decision, PauseContext, Policy

from kvtier.bench.sim.trace import Session

# event kinds
_ARRIVE, _RETURN, _PREFETCH, _LEASE, _XFER, _ENGINE, _STAGE = range(7)
# session phases
NEW_Q, RUNNING, PAUSED, RESUME_Q, DONE, REJECTED = range(6)
# where a paused session's state lives
P_HBM, P_HOST, P_NVME, P_NONE = "hbm", "host", "nvme", "none"


@dataclass(frozen=True)
class NodeConfig:
    """One serving node: model, hardware and engine knobs (every field is a CLI flag)."""

    geometry: ModelGeometry
    hardware: HardwareProfile
    hbm_bw_bps: float = 26.8e12        # 8 x H100 SXM5 HBM3 (the texts' table 7)
    block_tokens: int = 16
    chunk_tokens: int = 2048
    admission_ceiling: float = 0.88    # tau_high of the texts' figure 12
    quadratic_attention: bool = False
    write_through: bool = False        # host copies written through to NVMe: droppable host cache
    # a prefetch is speculative: while new sessions wait, it may not lift occupancy past the
    # admission ceiling (it is then deferred: reload on demand at resume).  True: the old rule
    # (a prefetch may fill the pool to 100% whenever the blocks are free).
    prefetch_past_ceiling: bool = False

    def __post_init__(self) -> None:
        if not (self.hbm_bw_bps > 0 and math.isfinite(self.hbm_bw_bps)):
            raise ValueError(f"hbm bandwidth must be positive, got {self.hbm_bw_bps}")
        if self.block_tokens < 1 or self.chunk_tokens < 1:
            raise ValueError("block_tokens and chunk_tokens must be >= 1")
        if not 0.0 < self.admission_ceiling <= 1.0:
            raise ValueError(f"admission ceiling must be in (0, 1], got {self.admission_ceiling}")
        if self.hardware.kv_pool_bytes <= 0:
            raise ValueError("no HBM left for the KV pool (weights + runtime >= HBM)")
        if self.hbm_blocks < 1:
            raise ValueError("the KV pool holds less than one block")

    @property
    def token_bytes(self) -> int:
        return self.geometry.token_bytes

    @property
    def block_bytes(self) -> int:
        return self.block_tokens * self.geometry.token_bytes

    @property
    def hbm_blocks(self) -> int:
        return int(min(self.hardware.kv_pool_bytes // self.block_bytes, 2**62))

    @property
    def host_blocks(self) -> int:
        return int(min(self.hardware.host_bytes // self.block_bytes, 2**62))

    @property
    def nvme_blocks(self) -> int:
        return int(min(self.hardware.nvme_bytes // self.block_bytes, 2**62))


@dataclass(frozen=True)
class SimResult:
    """Outcome of one policy on one trace (plain data; ``metrics`` is JSON-ready)."""

    policy: str
    metrics: dict
    occupancy: tuple[tuple[float, float], ...]   # (time s, HBM pool utilisation)
    stalls: tuple[float, ...]                    # per resumed round, seconds
    jcts: tuple[float, ...]
    round_log: tuple[tuple[str, int, float, float], ...] = ()  # (session, round, start, end) if recorded


class _S:
    """Runtime state of one session (mutable, owned by the simulator)."""

    __slots__ = ("s", "rounds", "k", "ctx", "shared", "hbm", "copy_tier", "copy_blocks", "phase",
                 "place", "moving", "decision", "pause_t", "return_t", "epoch", "idle_mark",
                 "prefetch_pending", "waiting_reload", "dec_kv", "need_prefill", "recompute",
                 "evictable", "start_t", "pf_due", "st_due", "stage_pending", "nv", "nv_ok", "nv_gen")

    def __init__(self, s: Session) -> None:
        self.s = s
        self.rounds = s.rounds
        self.k = 0
        self.ctx = 0                  # private context tokens (rounds < k)
        self.shared = s.shared_prefix_tokens
        self.hbm = 0                  # HBM blocks held (private)
        self.copy_tier = None         # lower-tier copy: None | "host" | "nvme"
        self.copy_blocks = 0
        self.phase = NEW_Q
        self.place = P_HBM
        self.moving = None            # transfer in flight for this session
        self.decision = None
        self.pause_t = 0.0
        self.return_t = 0.0
        self.epoch = 0
        self.idle_mark = 0.0
        self.prefetch_pending = False
        self.waiting_reload = False
        self.dec_kv = 0
        self.need_prefill = 0
        self.recompute = 0
        self.evictable = False
        self.start_t = 0.0
        self.pf_due = -1.0            # time of the prefetch the current decision planned
        self.st_due = -1.0            # time of the NVMe -> host staging it planned
        self.stage_pending = False
        self.nv = 0                   # write-through: NVMe blocks reserved behind the host copy
        self.nv_ok = 0                # ... of which written (durable)
        self.nv_gen = 0               # bumped when the NVMe backing is released


class _Xfer:
    """A transfer in flight (plain data); ``victim_blocks`` > 0 if it frees HBM under pressure."""

    __slots__ = ("kind", "sess", "blocks", "epoch", "then", "victim_blocks", "gen", "target", "shift0", "fg")

    def __init__(self, kind: str, sess: _S, blocks: int, epoch: int, then: str, victim_blocks: int = 0) -> None:
        self.kind, self.sess, self.blocks, self.epoch, self.then = kind, sess, blocks, epoch, then
        self.victim_blocks = victim_blocks
        self.gen = 0
        self.target = 0
        self.shift0 = 0.0
        self.fg = True                # foreground (not a write-through): counted in Simulator.fg_inflight


class Simulator:
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
        self.sessions = [_S(s) for s in sessions]
        g, hw = node.geometry, node.hardware
        self.tb = node.token_bytes
        self.bt = node.block_tokens
        self.bb = node.block_bytes
        self.hbm_total = node.hbm_blocks
        self.host_total = node.host_blocks
        self.nvme_total = node.nvme_blocks
        self.ceiling_blocks = int(node.admission_ceiling * self.hbm_total)
        self.flop_tok = 2.0 * g.compute_params
        self.t_weights = hw.weights_bytes / node.hbm_bw_bps
        self.kv_s_per_token = self.tb / node.hbm_bw_bps
        self.comp_s_per_token = self.flop_tok / hw.prefill_flops
        self.chunk = node.chunk_tokens
        self.d2h = self.bb / hw.link_d2h_bps        # seconds per block
        self.h2d = self.bb / hw.link_h2d_bps
        self.nw = self.bb / hw.nvme_write_bps
        self.nr = self.bb / hw.nvme_read_bps
        # state
        self.now = 0.0
        self.heap: list = []
        self.seq = 0
        self.used = 0
        self.host_used = 0
        self.nvme_used = 0
        self.pending_free = 0
        self.shared_loaded: dict[str, int] = {}
        self.paused_hbm: dict[_S, None] = {}          # insertion order = oldest pause first
        self.clean: dict[_S, None] = {}               # host copies also resident in HBM, oldest first
        self.clean_blocks = 0
        self.clean_dropped = 0
        self.wt = bool(node.write_through)
        self.durable: dict[_S, int] = {}              # write-through: host copies durable on NVMe (not clean)
        self.durable_blocks = 0
        self.wt_dropped = 0
        self.wt_written_blocks = 0
        self.wt_skipped = 0
        self.resume_q: deque[_S] = deque()
        self.new_q: deque[_S] = deque()
        self.res_free = {"d2h": 0.0, "h2d": 0.0, "nw": 0.0, "nr": 0.0, "wt": 0.0}
        self.wt_shift = 0.0                           # total foreground NVMe write time that preempted write-through
        # engine
        self.I = 0.0
        self.t_I = 0.0
        self.T_it = 0.0
        self.eng_epoch = 0
        self.eng_target = 0.0
        self.pf_resume: deque[_S] = deque()
        self.pf_new: deque[_S] = deque()
        self.pf_cur: _S | None = None
        self.pf_target = 0.0
        self.dec_heap: list = []
        self.n_dec = 0
        self.kv_dec = 0
        # metrics
        self.jcts: list[float] = []
        self.stalls: list[float] = []
        self.delays: list[float] = []
        self.round_log: list = []
        self.recomputed = 0
        self.out_tokens = 0
        self.idle_blocks_s = 0.0
        self.actions: dict[str, int] = {}
        self.lease_redecisions = 0
        self.victims: dict[str, int] = {}
        self.fallbacks = 0
        self.emergency = 0
        self.queue_preempted = 0
        self.fg_inflight = 0                          # foreground transfers in flight (each ends in a _pump)
        self.rejected = 0
        self.prefetch_deferred = 0
        self.pf_ceiling = not node.prefetch_past_ceiling
        self.staged = 0
        self.stage_skipped = 0
        self._default_victims = type(policy).victim_priority is Policy.victim_priority
        self.bytes_d2h = 0
        self.bytes_h2d = 0
        self.bytes_nvme = 0
        self.admit_waits: list[float] = []
        self.events = 0
        self.peak_used = 0
        self.above_ceiling_s = 0.0
        self.used_mark = 0.0
        span = max((s.arrival_s for s in sessions), default=0.0)
        self.occ_dt = max(0.05, span / max(1, occupancy_points))
        self.occ: list[tuple[float, float]] = []
        self.occ_last = -math.inf
        self.done = 0
        self.last_done = 0.0

    # ---------------------------------------------------------------- helpers
    def _push(self, t: float, kind: int, obj, tok: int) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, obj, tok))

    def blocks(self, tokens: int) -> int:
        return -(-tokens // self.bt)

    def _set_used(self, delta: int) -> None:
        now = self.now
        if self.used > self.ceiling_blocks:
            self.above_ceiling_s += now - self.used_mark
        self.used_mark = now
        self.used += delta
        if self.used > self.peak_used:
            self.peak_used = self.used
        if now - self.occ_last >= self.occ_dt:
            self.occ.append((now, self.used / self.hbm_total))
            self.occ_last = now

    def _idle_flush(self, x: _S) -> None:
        if x.phase == PAUSED and x.hbm:
            self.idle_blocks_s += x.hbm * (self.now - x.idle_mark)
        x.idle_mark = self.now

    def _hbm(self, x: _S, blocks: int) -> None:
        """Set x's HBM holding to ``blocks`` (allocating or freeing the difference)."""
        self._idle_flush(x)
        self._set_used(blocks - x.hbm)
        x.hbm = blocks

    def _free(self) -> int:
        return self.hbm_total - self.used

    def _set_copy(self, x: _S, tier: str | None, blocks: int) -> None:
        """Replace x's lower-tier copy (frees the old one).  The new copy is not clean.

        A host copy that grows keeps its NVMe backing (write-through; KV is
        append-only, so a written prefix stays valid); any other change releases it."""
        if x in self.clean:
            del self.clean[x]
            self.clean_blocks -= x.copy_blocks
        if x in self.durable:
            self.durable_blocks -= self.durable.pop(x)
        if x.nv and not (tier == "host" and x.copy_tier == "host"):
            self._release_nv(x)
        if x.copy_tier == "host":
            self.host_used -= x.copy_blocks
        elif x.copy_tier == "nvme":
            self.nvme_used -= x.copy_blocks
        x.copy_tier, x.copy_blocks = (tier, blocks) if tier else (None, 0)
        if tier == "host":
            self.host_used += blocks
        elif tier == "nvme":
            self.nvme_used += blocks
        self._refresh_durable(x)

    def _release_nv(self, x: _S) -> None:
        self.nvme_used -= x.nv
        x.nv = x.nv_ok = 0
        x.nv_gen += 1

    def _refresh_durable(self, x: _S) -> None:
        """Keep ``durable`` = host copies fully written to NVMe and not clean (droppable for free)."""
        want = (self.wt and x.copy_tier == "host" and x.copy_blocks > 0 and x.nv_ok >= x.copy_blocks
                and x not in self.clean and x.phase not in (DONE, REJECTED))
        if x in self.durable:
            if want and self.durable[x] == x.copy_blocks:
                return
            self.durable_blocks -= self.durable.pop(x)
        if want:
            self.durable[x] = x.copy_blocks
            self.durable_blocks += x.copy_blocks

    def _write_through(self, x: _S) -> None:
        """Write-through: copy the part of x's host copy not yet on NVMe to NVMe in the
        background (the NVMe write server is shared, FIFO; x.moving is not set)."""
        if not self.wt or x.copy_tier != "host" or x.nv >= x.copy_blocks:
            return
        delta = x.copy_blocks - x.nv
        if self.nvme_used + delta > self.nvme_total:
            self.wt_skipped += 1
            return
        self.nvme_used += delta
        x.nv = x.copy_blocks
        tr = self._xfer("nw", x, delta, "written", track=False, background=True)
        tr.gen, tr.target = x.nv_gen, x.nv

    def _host_to_nvme(self, x: _S) -> None:
        """Drop x's durable host copy; its NVMe backing becomes its only copy (no data moves)."""
        blocks = x.nv
        if x in self.durable:
            self.durable_blocks -= self.durable.pop(x)
        if x in self.clean:
            del self.clean[x]
            self.clean_blocks -= x.copy_blocks
        self.host_used -= x.copy_blocks
        x.copy_tier, x.copy_blocks = "nvme", blocks
        x.nv = x.nv_ok = 0
        x.nv_gen += 1
        if x.phase == PAUSED and x.place == P_HOST:
            x.place = P_NVME

    def _nvme_to_host(self, x: _S, blocks: int) -> None:
        """x's NVMe copy was read into a new host copy of ``blocks``; under write-through the
        NVMe copy stays behind it (so the host copy is droppable), else it is released."""
        old = x.copy_blocks if x.copy_tier == "nvme" else 0
        self._set_copy(x, "host", blocks)
        if self.wt and old:
            self.nvme_used += old
            x.nv = x.nv_ok = min(old, blocks)
            self.nvme_used -= old - x.nv
            self._refresh_durable(x)

    def _mark_clean(self, x: _S) -> None:
        """x's host copy duplicates what it now has in HBM: droppable when host room runs out."""
        if x.copy_tier == "host" and x not in self.clean:
            if x in self.durable:
                self.durable_blocks -= self.durable.pop(x)
            self.clean[x] = None
            self.clean_blocks += x.copy_blocks

    def _host_room(self, need: int, exclude: _S, above: float | None = None) -> bool:
        """Make ``need`` host blocks free, dropping clean copies oldest first, then (write-through)
        durable copies of paused trajectories in the policy's ``victim_priority`` order (highest
        first; default: the longest-paused first), only those ranked above ``above`` if given.
        True if the room is there."""
        if self.host_used + need <= self.host_total:
            return True
        for v in list(self.clean):
            if v is exclude:
                continue
            self._set_copy(v, None, 0)
            self.clean_dropped += 1
            if self.host_used + need <= self.host_total:
                return True
        if not self.durable or self.host_used - self.durable_blocks + need > self.host_total:
            return False
        cands = [v for v in self.durable if v is not exclude and v.phase == PAUSED and v.moving is None]
        if self._default_victims:
            cands.sort(key=lambda v: v.pause_t)
            keyed = [(self.now - v.pause_t, v) for v in cands]
        else:
            pri, now = self.policy.victim_priority, self.now
            keyed = [(float(pri(self._ctx(v, with_truth=True), now - v.pause_t)), v) for v in cands]
            keyed.sort(key=lambda kv: -kv[0])
        for p, v in keyed:
            if above is not None and p <= above:
                break
            self._host_to_nvme(v)
            self.wt_dropped += 1
            if self.host_used + need <= self.host_total:
                return True
        return False

    def _xfer(self, kind: str, x: _S, blocks: int, then: str, victim_blocks: int = 0, *,
              track: bool = True, background: bool = False) -> _Xfer:
        """Queue a transfer on its FIFO server.  ``background`` (write-through, NVMe write
        only): it uses the write server's spare time; every foreground write preempts the
        background queue, delaying each unfinished background write by its own duration."""
        per = {"d2h": self.d2h, "h2d": self.h2d, "nw": self.nw, "nr": self.nr}[kind]
        dur = blocks * per
        if background:
            start = max(self.now, self.res_free["wt"], self.res_free["nw"])
            done = start + dur
            self.res_free["wt"] = done
        else:
            start = max(self.now, self.res_free[kind])
            done = start + dur
            self.res_free[kind] = done
            if kind == "nw" and self.res_free["wt"] > start:
                self.res_free["wt"] += dur
                self.wt_shift += dur
        nbytes = blocks * self.bb
        if kind == "d2h":
            self.bytes_d2h += nbytes
        elif kind == "h2d":
            self.bytes_h2d += nbytes
        else:
            self.bytes_nvme += nbytes
        tr = _Xfer(kind, x, blocks, x.epoch, then, victim_blocks)
        tr.shift0 = self.wt_shift
        tr.fg = not background
        if tr.fg:
            self.fg_inflight += 1
        if track:
            x.moving = tr
        self._push(done, _XFER, tr, 0)
        return tr

    def _ctx(self, x: _S, *, with_truth: bool) -> PauseContext:
        r = x.rounds[x.k]
        kvb = x.ctx * self.tb
        stored = min(x.copy_blocks * self.bt, x.ctx) if x.copy_tier else 0
        return PauseContext(
            tool=r.tool or "?", kv_bytes=kvb, context_tokens=x.ctx,
            new_bytes=(x.ctx - stored) * self.tb,
            hbm_pressure=min(1.0, self.used / self.hbm_total),
            host_free_bytes=float(max(0, self.host_total - self.host_used + self.clean_blocks
                                      + self.durable_blocks) * self.bb),
            nvme_free_bytes=float(max(0, self.nvme_total - self.nvme_used) * self.bb),
            now_s=self.now, true_wait_s=r.tool_wait_s if (with_truth and self.reveal) else None,
            trajectory_id=x.s.id, evictable=True, write_through=self.wt,
            host_droppable_bytes=float((self.clean_blocks + self.durable_blocks) * self.bb),
            admission_waiting_bytes=self._new_q_bytes())

    def _new_q_bytes(self) -> float:
        """KV bytes the head of the admission queue needs (0.0 when nothing waits)."""
        if not self.new_q:
            return 0.0
        r = self.new_q[0].rounds[0]
        return float(self.blocks(r.new_tokens + r.output_tokens) * self.bb)

    # ---------------------------------------------------------------- engine
    def _eng_advance(self) -> None:
        if self.T_it > 0:
            self.I += (self.now - self.t_I) / self.T_it
        self.t_I = self.now

    def _eng_reschedule(self) -> None:
        if self.pf_cur is None:
            nxt = self.pf_resume.popleft() if self.pf_resume else (self.pf_new.popleft() if self.pf_new else None)
            if nxt is not None:
                self.pf_cur = nxt
                self.pf_target = self.I + nxt.need_prefill / self.chunk
        pf = self.pf_cur is not None
        if not pf and not self.n_dec:
            self.T_it = 0.0
            self.eng_epoch += 1
            return
        t_mem = self.t_weights + self.kv_dec * self.kv_s_per_token
        t_comp = ((self.chunk if pf else 0) + self.n_dec) * self.comp_s_per_token
        self.T_it = max(t_mem, t_comp)
        target = self.pf_target if pf else math.inf
        if self.dec_heap and self.dec_heap[0][0] < target:
            target = self.dec_heap[0][0]
        self.eng_epoch += 1
        self.eng_target = target
        self._push(self.now + max(0.0, target - self.I) * self.T_it, _ENGINE, None, self.eng_epoch)

    def _on_engine(self) -> None:
        self._eng_advance()
        # the job this event was scheduled for is due, whatever float rounding of time says
        if self.I < self.eng_target:
            self.I = self.eng_target
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
        if pf_done is not None:
            self._prefill_done(pf_done)
        for x in finished:
            self._decode_done(x)
        self._eng_reschedule()
        self._pump()

    def _enqueue_prefill(self, x: _S) -> None:
        self._eng_advance()
        (self.pf_resume if x.k > 0 else self.pf_new).append(x)
        if self.pf_cur is None:
            self._eng_reschedule()

    def _prefill_done(self, x: _S) -> None:
        r = x.rounds[x.k]
        if x.k > 0:
            ideal = r.new_tokens * self.comp_s_per_token
            self.delays.append(max(0.0, self.now - x.return_t - ideal))
        if r.output_tokens <= 0:
            self._decode_done(x)
            return
        x.dec_kv = x.shared + x.ctx + r.new_tokens + r.output_tokens // 2
        self.kv_dec += x.dec_kv
        self.n_dec += 1
        self.seq += 1
        heapq.heappush(self.dec_heap, (self.I + r.output_tokens, self.seq, x))

    # ---------------------------------------------------------------- rounds
    def _start_round(self, x: _S) -> None:
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
            self.recomputed += x.ctx
            self._resumed(x, x.ctx * self.comp_s_per_token)
            self._enqueue_prefill(x)
            return
        x.need_prefill = r.new_tokens
        mv = x.moving
        if mv is not None and mv.kind in ("h2d", "nr"):
            x.waiting_reload = True                  # prefetch under way
            return
        if x.place == P_HBM or (mv is not None and mv.then in ("to_host", "to_nvme", "via_nvme")):
            self._resumed(x, 0.0)
            self._enqueue_prefill(x)                 # data still in HBM
            return
        self._reload(x)                              # demand reload (blocks already reserved)
        x.waiting_reload = True

    def _resumed(self, x: _S, rebuild_s: float) -> None:
        """x's state is resident (or its recompute queued): record the resume stall."""
        self.stalls.append(self.now - x.return_t + rebuild_s)

    def _reload(self, x: _S) -> None:
        if x.copy_tier == "nvme":
            self._xfer("nr", x, x.copy_blocks, "then_h2d")
        else:
            self._xfer("h2d", x, self.blocks(x.ctx), "loaded")

    def _decode_done(self, x: _S) -> None:
        r = x.rounds[x.k]
        if self.record_rounds:
            self.round_log.append((x.s.id, x.k, x.start_t, self.now))
        x.ctx += r.new_tokens + r.output_tokens
        self.out_tokens += r.output_tokens
        x.recompute = 0
        if x.k == len(x.rounds) - 1:
            x.phase = DONE
            self._hbm(x, 0)
            self._set_copy(x, None, 0)
            self.jcts.append(self.now - x.s.arrival_s)
            self.last_done = self.now
            self.done += 1
            if self.progress is not None and self.done % 200 == 0:
                self.progress(self.done, len(self.sessions))
            return
        self._pause(x)

    # ---------------------------------------------------------------- pauses
    def _pause(self, x: _S) -> None:
        r = x.rounds[x.k]
        x.epoch += 1
        self._idle_flush(x)
        x.phase = PAUSED
        x.place = P_HBM
        x.pause_t = self.now
        x.return_t = self.now + (r.tool_wait_s or 0.0)
        x.prefetch_pending = False
        x.stage_pending = False
        x.waiting_reload = False
        self._push(x.return_t, _RETURN, x, x.epoch)
        d = self.policy.decide(self._ctx(x, with_truth=True))
        x.decision = d
        a = d.action.value if isinstance(d.action, Action) else str(d.action)
        self.actions[a] = self.actions.get(a, 0) + 1
        self._apply(x, d, initial=True)
        self._pump()

    def _apply(self, x: _S, d: Decision, *, initial: bool) -> None:
        act = Action(d.action)
        if act == Action.RETAIN:
            self._make_resident_paused(x)
        elif act == Action.RECOMPUTE:
            self._drop(x)
        else:
            self._offload(x, act)
        self._plan_stage(x, d)
        if d.prefetch_at_s is not None and act in (Action.OFFLOAD_HOST, Action.OFFLOAD_NVME):
            self._plan_prefetch(x, x.pause_t + max(0.0, float(d.prefetch_at_s)))
        if d.demote_at_s is not None:
            t = x.pause_t + float(d.demote_at_s)
            if t > self.now or initial:
                self._push(max(t, self.now), _LEASE, x, x.epoch)

    def _plan_prefetch(self, x: _S, t: float) -> None:
        """Schedule x's prefetch at ``t``; a later plan (lease re-decision) supersedes it."""
        x.pf_due = t
        self._push(t, _PREFETCH, x, x.epoch)

    def _make_resident_paused(self, x: _S) -> None:
        if x.place == P_HBM and x.moving is None and x not in self.paused_hbm:
            self.paused_hbm[x] = None
            x.evictable = True

    def _unlist(self, x: _S) -> None:
        if x in self.paused_hbm:
            del self.paused_hbm[x]
        x.evictable = False

    def _drop(self, x: _S) -> None:
        self._unlist(x)
        self._hbm(x, 0)
        self._set_copy(x, None, 0)
        x.place = P_NONE

    def _offload(self, x: _S, act: Action) -> bool:
        """Start moving x's HBM state down.  Returns False if it had to drop instead."""
        self._unlist(x)
        need = self.blocks(x.ctx)
        if act == Action.OFFLOAD_HOST:
            have = x.copy_blocks if x.copy_tier == "host" else 0
            if self._host_room(need - have, x):
                delta = need - have
                if x.copy_tier == "nvme":
                    if self.wt:                         # the NVMe copy stays as the host copy's backing
                        self._nvme_to_host(x, need)
                    else:
                        self._set_copy(x, None, 0)
                self._set_copy(x, "host", need)         # reserve host frames now
                if delta:
                    self._xfer("d2h", x, delta, "to_host")
                else:
                    self._offloaded(x, P_HOST)
                    self._write_through(x)
                return True
            self.fallbacks += 1
            act = Action.OFFLOAD_NVME
        have = x.copy_blocks if x.copy_tier == "nvme" else 0
        if x.copy_tier == "host" and x.nv_ok and x.nv == x.nv_ok:
            have = x.nv_ok                              # write-through: its durable prefix is on NVMe
        if self.nvme_used - (x.nv if x.copy_tier == "host" else have) + need <= self.nvme_total:
            delta = need - have
            if x.copy_tier == "host":
                if x.nv_ok and x.nv == x.nv_ok:
                    self._host_to_nvme(x)               # keep the durable prefix, drop the host copy
                else:
                    self._set_copy(x, None, 0)
                    delta = need
            self._set_copy(x, "nvme", need)
            if delta:
                self._xfer("d2h", x, delta, "via_nvme")
            else:
                self._offloaded(x, P_NVME)
            return True
        self.fallbacks += 1
        self._drop(x)
        return False

    def _offloaded(self, x: _S, place: str) -> None:
        """The copy is complete: if x is still in the same pause, free its HBM blocks."""
        if x.phase == PAUSED:
            x.place = place
            self._hbm(x, 0)
            if x.stage_pending:
                x.stage_pending = False
                self._try_stage(x)
            if x.prefetch_pending:
                x.prefetch_pending = False
                self._try_prefetch(x)

    def _on_xfer(self, tr: _Xfer) -> None:
        x = tr.sess
        if tr.then == "written" and self.wt_shift > tr.shift0:
            # foreground writes preempted the write-through queue since this one was queued
            d, tr.shift0 = self.wt_shift - tr.shift0, self.wt_shift
            self._push(self.now + d, _XFER, tr, 0)
            return
        if tr.fg:
            self.fg_inflight -= 1
        if x.moving is tr:
            x.moving = None
        live = x.epoch == tr.epoch and x.phase == PAUSED
        then = tr.then
        if then == "via_nvme":
            # HBM -> bounce buffers done; the NVMe write follows (HBM held until it completes)
            nxt = self._xfer("nw", x, tr.blocks, "to_nvme", tr.victim_blocks)
            nxt.epoch = tr.epoch
            if not live and x.moving is nxt:
                x.moving = None               # x is running again; the write just completes the copy
            return
        if then in ("to_host", "to_nvme"):
            self.pending_free -= tr.victim_blocks
            if live:
                self._offloaded(x, P_HOST if then == "to_host" else P_NVME)
            elif then == "to_host" and x.phase not in (DONE, REJECTED):
                self._mark_clean(x)            # resumed meanwhile: the copy duplicates HBM
            if then == "to_host" and x.phase not in (DONE, REJECTED):
                self._write_through(x)
        elif then == "written":                        # write-through of a host copy landed
            if tr.gen == x.nv_gen and x.copy_tier == "host" and x.nv >= tr.target:
                x.nv_ok = max(x.nv_ok, tr.target)
                self.wt_written_blocks += tr.blocks
                self._refresh_durable(x)
            return
        elif then == "demoted":                        # host -> NVMe lease demotion finished
            if x.copy_tier == "host":
                if self.nvme_used + x.copy_blocks <= self.nvme_total:
                    self._set_copy(x, "nvme", x.copy_blocks)
                else:
                    self.fallbacks += 1
                    self._set_copy(x, None, 0)
                if live and x.place == P_HOST:
                    x.place = P_NVME if x.copy_tier == "nvme" else P_NONE
            if live and x.stage_pending:
                x.stage_pending = False
                self._try_stage(x)
            if live and x.prefetch_pending:
                x.prefetch_pending = False
                self._try_prefetch(x)
        elif then == "staged":                         # NVMe -> host staging finished
            if x.copy_tier == "nvme" and x.phase not in (DONE, REJECTED):
                if self._host_room(tr.blocks, x, self._stage_rank(x)):
                    self._nvme_to_host(x, tr.blocks)       # the NVMe copy is released (kept: write-through)
                    self.staged += 1
                else:
                    self.stage_skipped += 1
            if live:
                x.place = P_HOST if x.copy_tier == "host" else x.place
                if x.prefetch_pending:
                    x.prefetch_pending = False
                    self._try_prefetch(x)
            elif x.phase == RUNNING and x.waiting_reload:
                nxt = self._xfer("h2d", x, self.blocks(x.ctx), "loaded")   # the round came back mid-staging
                nxt.epoch = tr.epoch
                return
        elif then == "then_h2d":
            nxt = self._xfer("h2d", x, self.blocks(x.ctx), "loaded")
            nxt.epoch = tr.epoch
            return
        elif then == "loaded":
            x.place = P_HBM
            self._mark_clean(x)
            if live:
                self._make_resident_paused(x)
            elif x.phase == RUNNING and x.waiting_reload:
                x.waiting_reload = False
                self._resumed(x, 0.0)
                self._enqueue_prefill(x)
        self._pump()

    def _try_prefetch(self, x: _S) -> None:
        if x.phase != PAUSED or x.place not in (P_HOST, P_NVME):
            return
        if x.moving is not None:
            x.prefetch_pending = True
            return
        need = self.blocks(x.ctx)
        if need > self._free() or self.resume_q or (
                self.pf_ceiling and self.new_q and self.used + need > self.ceiling_blocks):
            # no room now, or it would take room under the ceiling that waiting admissions need:
            self.prefetch_deferred += 1       # reload on demand at resume
            return
        self._hbm(x, need)
        self._reload(x)

    def _try_stage(self, x: _S) -> None:
        """Copy x's NVMe state up to host DRAM ahead of its return (Decision.stage_at_s)."""
        if x.phase != PAUSED or x.place != P_NVME or x.copy_tier != "nvme":
            return
        if x.moving is not None:
            x.stage_pending = True                 # still on its way down: stage when it lands
            return
        if not self._host_room(x.copy_blocks, x, self._stage_rank(x)):
            self.stage_skipped += 1                # no host room: it will reload from NVMe
            return
        self._xfer("nr", x, x.copy_blocks, "staged")

    def _stage_rank(self, x: _S) -> float | None:
        """A staging may push out only host copies the policy ranks above x itself."""
        if not self.wt or not self.durable:
            return None
        if self._default_victims:
            return self.now - x.pause_t
        return float(self.policy.victim_priority(self._ctx(x, with_truth=True), self.now - x.pause_t))

    def _plan_stage(self, x: _S, d: Decision) -> None:
        st = getattr(d, "stage_at_s", None)
        if st is None or Action(d.action) != Action.OFFLOAD_NVME:
            return
        t = max(self.now, x.pause_t + max(0.0, float(st)))
        x.st_due = t
        self._push(t, _STAGE, x, x.epoch)

    def _on_lease(self, x: _S) -> None:
        cur = x.decision
        nd = self.policy.on_lease_expiry(self._ctx(x, with_truth=True), self.now - x.pause_t, cur)
        if nd is None:
            return
        self.lease_redecisions += 1
        x.decision = nd
        act = Action(nd.action)
        a = "lease_" + act.value
        self.actions[a] = self.actions.get(a, 0) + 1
        if x.moving is not None:
            return                                   # coming back, or still on its way down: plan stands
        x.pf_due = -1.0                              # the new decision's prefetch plan replaces the old
        x.st_due = -1.0
        x.stage_pending = False
        if x.place == P_HBM:
            self._apply(x, nd, initial=False)
        elif x.place == P_HOST:
            if act == Action.OFFLOAD_NVME and x in self.durable:
                self._host_to_nvme(x)                   # already on NVMe: drop the host copy
            elif act == Action.OFFLOAD_NVME and x.copy_tier == "host" \
                    and self.nvme_used + x.copy_blocks <= self.nvme_total:
                self._xfer("nw", x, x.copy_blocks, "demoted")
            elif act == Action.RECOMPUTE:
                self._drop(x)
            self._plan_stage(x, nd)
            if nd.prefetch_at_s is not None:
                self._plan_prefetch(x, max(self.now, x.pause_t + float(nd.prefetch_at_s)))
            if nd.demote_at_s is not None and x.pause_t + nd.demote_at_s > self.now:
                self._push(x.pause_t + nd.demote_at_s, _LEASE, x, x.epoch)
        elif x.place == P_NVME:
            if act == Action.RECOMPUTE:
                self._drop(x)
            else:
                self._plan_stage(x, nd)
                if nd.prefetch_at_s is not None:
                    self._plan_prefetch(x, max(self.now, x.pause_t + float(nd.prefetch_at_s)))

    def _on_return(self, x: _S) -> None:
        r = x.rounds[x.k]
        self.policy.observe(r.tool or "?", float(r.tool_wait_s or 0.0))
        self._idle_flush(x)
        self._unlist(x)
        x.epoch += 1
        x.prefetch_pending = False
        x.stage_pending = False
        x.k += 1
        x.phase = RESUME_Q
        self.resume_q.append(x)
        self._pump()

    # ---------------------------------------------------------------- admission
    def _evict(self, deficit: int, exclude: _S | None) -> int:
        """Evict paused HBM-resident victims (oldest first) until ``deficit`` blocks are freed
        or on their way.  Returns blocks freed or pending."""
        got = 0
        cands = [v for v in self.paused_hbm if v is not exclude and v.evictable and v.moving is None]
        if not self._default_victims and len(cands) > 1:
            # the policy's eviction order (highest priority first; ties: oldest pause first)
            pri = self.policy.victim_priority
            now = self.now
            keyed = [(-float(pri(self._ctx(v, with_truth=True), now - v.pause_t)), i, v)
                     for i, v in enumerate(cands)]
            keyed.sort()
            cands = [v for _, _, v in keyed]
        for v in cands:
            if got >= deficit:
                break
            if not v.evictable or v.moving is not None:
                continue
            act = Action(self.policy.victim_action(self._ctx(v, with_truth=True)))
            self.victims[act.value] = self.victims.get(act.value, 0) + 1
            if act == Action.RETAIN:
                v.evictable = False                    # pinned for this pause
                continue
            blocks = v.hbm
            if act == Action.RECOMPUTE:
                self._drop(v)
            else:
                self._offload(v, act)
                if v.moving is not None and v.hbm:       # freed when the transfer completes
                    v.moving.victim_blocks = blocks
                    self.pending_free += blocks
            got += blocks
        return got

    def _emergency(self, exclude: _S) -> bool:
        for v in self.paused_hbm:
            if v is not exclude and v.moving is None and v.hbm:
                self.emergency += 1
                self._drop(v)
                return True
        return False

    def _wedged(self) -> bool:
        """Nothing is running and no foreground transfer is in flight: no event will free HBM
        (tool returns and arrivals only add demand), so a blocked queue head waits forever."""
        return (self.pending_free <= 0 and not self.n_dec and self.pf_cur is None
                and self.fg_inflight == 0)

    def _preempt_queued(self, head: _S, need: int) -> bool:
        """Wedge breaker: resumed rounds queued behind ``head`` may hold HBM (their state was
        still resident, or came back, when their tool returned) and are not paused, so no
        victim rule reaches them; when they fill the pool the node deadlocks.  Free their HBM,
        latest return first, until ``need`` fits: a complete lower-tier copy is kept (reloaded
        when the round starts), otherwise the state is dropped (recomputed).  Counted in
        ``emergency_preemptions`` and ``resume_queue_preemptions``.  True if anything was freed."""
        freed = False
        for v in reversed(self.resume_q):
            if need <= self._free():
                break
            if v is head or not v.hbm or v.moving is not None:
                continue
            self.emergency += 1
            self.queue_preempted += 1
            freed = True
            if v.copy_tier is not None and v.copy_blocks >= self.blocks(v.ctx):
                if v in self.clean:                  # no longer a duplicate of HBM
                    del self.clean[v]
                    self.clean_blocks -= v.copy_blocks
                    self._refresh_durable(v)
                self._hbm(v, 0)
                v.place = P_HOST if v.copy_tier == "host" else P_NVME
            else:
                self._drop(v)
        return freed

    def _pump(self) -> None:
        while self.resume_q:
            x = self.resume_q[0]
            r = x.rounds[x.k]
            total = self.blocks(x.ctx + r.new_tokens + r.output_tokens)
            if total + sum(self.shared_loaded.values()) > self.hbm_total:
                self.resume_q.popleft()
                self._reject(x)
                continue
            need = total - x.hbm
            if need <= self._free():
                self.resume_q.popleft()
                self._hbm(x, x.hbm + need)
                self._start_round(x)
                continue
            deficit = need - self._free() - self.pending_free
            if deficit > 0:
                self._evict(deficit, x)
                if need <= self._free():
                    continue
                if self.pending_free <= 0 and not self.n_dec and self.pf_cur is None \
                        and self._emergency(x):
                    continue
                if self._wedged() and self._preempt_queued(x, need):
                    continue
            break
        if self.resume_q:
            return
        while self.new_q:
            x = self.new_q[0]
            r = x.rounds[0]
            sp = x.s.shared_prefix_id
            sh = 0 if (sp is None or sp in self.shared_loaded) else self.blocks(x.shared)
            need = sh + self.blocks(r.new_tokens + r.output_tokens)
            if need + sum(self.shared_loaded.values()) > self.hbm_total:
                self.new_q.popleft()
                self._reject(x)
                continue
            shared_total = sum(self.shared_loaded.values())
            if self.used + need <= self.ceiling_blocks or (self.used == shared_total and need <= self._free()):
                # under the ceiling, or alone on an otherwise empty node (a session bigger than the
                # ceiling would otherwise wait forever)
                self.new_q.popleft()
                if sh:
                    self.shared_loaded[sp] = sh
                    self._set_used(sh)
                    x.recompute = x.shared      # the first user prefills the shared prefix
                self._hbm(x, need - sh)
                self.admit_waits.append(self.now - x.s.arrival_s)
                self._start_round(x)
                continue
            deficit = self.used + need - self.ceiling_blocks - self.pending_free
            if deficit > 0:
                self._evict(deficit, None)
                if self.used + need <= self.ceiling_blocks:
                    continue
            break

    def _reject(self, x: _S) -> None:
        x.phase = REJECTED
        self._idle_flush(x)
        self._unlist(x)
        self._hbm(x, 0)
        self._set_copy(x, None, 0)
        self.rejected += 1

    # ---------------------------------------------------------------- run
    def run(self) -> SimResult:
        wall0 = _time.perf_counter()
        for x in self.sessions:
            self._push(x.s.arrival_s, _ARRIVE, x, 0)
        heap = self.heap
        pop = heapq.heappop
        n = 0
        while heap:
            t, _, kind, obj, tok = pop(heap)
            self.now = t
            n += 1
            if kind == _ENGINE:
                if tok == self.eng_epoch:
                    self._on_engine()
            elif kind == _XFER:
                self._on_xfer(obj)
            elif kind == _RETURN:
                if tok == obj.epoch and obj.phase == PAUSED:
                    self._on_return(obj)
            elif kind == _PREFETCH:
                if tok == obj.epoch and obj.phase == PAUSED and t == obj.pf_due:
                    self._try_prefetch(obj)
            elif kind == _STAGE:
                if tok == obj.epoch and obj.phase == PAUSED and t == obj.st_due:
                    self._try_stage(obj)
            elif kind == _LEASE:
                if tok == obj.epoch and obj.phase == PAUSED:
                    self._on_lease(obj)
            elif kind == _ARRIVE:
                obj.phase = NEW_Q
                self.new_q.append(obj)
                self._pump()
            if self.check_every and n % self.check_every == 0:
                self.check_integrity()
        self.events = n
        stuck = [x for x in self.sessions if x.phase not in (DONE, REJECTED)]
        if stuck:
            raise SimulationStalled(self._stall_report(stuck))
        if self.fg_inflight != 0:
            raise AssertionError(f"{self.fg_inflight} foreground transfers still counted in flight at the end")
        self.now = max(self.last_done, self.used_mark)
        self._set_used(0)
        self.check_integrity()
        wall = _time.perf_counter() - wall0
        return SimResult(self.name, self._metrics(wall), tuple(self.occ), tuple(self.stalls),
                         tuple(self.jcts), tuple(self.round_log))

    def _stall_report(self, stuck: list[_S]) -> str:
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

    def check_integrity(self) -> None:
        """Blocks are conserved: each tier's used count equals what sessions hold.  Raises AssertionError."""
        live = [x for x in self.sessions if x.phase not in (DONE, REJECTED)]
        hbm = sum(self.shared_loaded.values()) + sum(x.hbm for x in live)
        host = sum(x.copy_blocks for x in live if x.copy_tier == "host")
        nvme = sum(x.copy_blocks for x in live if x.copy_tier == "nvme") + sum(x.nv for x in live)
        if hbm != self.used or host != self.host_used or nvme != self.nvme_used:
            raise AssertionError(f"block accounting broken: hbm {hbm} vs {self.used}, "
                                 f"host {host} vs {self.host_used}, nvme {nvme} vs {self.nvme_used}")
        if not (0 <= self.used <= self.hbm_total and 0 <= self.host_used <= self.host_total
                and 0 <= self.nvme_used <= self.nvme_total):
            raise AssertionError(f"tier over capacity or negative: hbm {self.used}/{self.hbm_total}, "
                                 f"host {self.host_used}/{self.host_total}, nvme {self.nvme_used}/{self.nvme_total}")
        for x in self.sessions:
            if x.phase in (DONE, REJECTED) and (x.hbm or x.copy_blocks):
                raise AssertionError(f"finished session {x.s.id} still holds blocks")
        if self.clean_blocks != sum(x.copy_blocks for x in self.clean) or \
                any(x.copy_tier != "host" for x in self.clean):
            raise AssertionError("clean host copies miscounted")
        if self.durable_blocks != sum(self.durable.values()) or any(
                x.copy_tier != "host" or x in self.clean or x.nv_ok < x.copy_blocks or b != x.copy_blocks
                for x, b in self.durable.items()):
            raise AssertionError("durable host copies miscounted")
        for x in self.sessions:
            if x.nv and (x.copy_tier != "host" or not (0 <= x.nv_ok <= x.nv <= x.copy_blocks)):
                raise AssertionError(f"session {x.s.id}: NVMe backing {x.nv_ok}/{x.nv} of a "
                                     f"{x.copy_tier} copy of {x.copy_blocks} blocks")
        for x in self.paused_hbm:
            if x.phase != PAUSED or not x.hbm:
                raise AssertionError(f"session {x.s.id} listed as paused in HBM but is not")

    def _metrics(self, wall: float) -> dict:
        j = sorted(self.jcts)
        st = sorted(self.stalls)
        dl = sorted(self.delays)
        first = min((x.s.arrival_s for x in self.sessions), default=0.0)
        span = max(1e-9, self.last_done - first)
        aw = self.admit_waits
        return {
            "jct_mean_s": _mean(j),
            "jct_p99_s": _q(j, 0.99),
            "resume_stall_p50_s": _q(st, 0.50),
            "resume_stall_p99_s": _q(st, 0.99),
            "throughput_tokens_per_s": self.out_tokens / span,
            "recomputed_tokens": int(self.recomputed),
            "hbm_idle_gb_s": self.idle_blocks_s * self.bb / GB,
            # extras
            "jct_p50_s": _q(j, 0.50),
            "resume_stall_mean_s": _mean(st),
            "resume_delay_p50_s": _q(dl, 0.50),
            "resume_delay_p99_s": _q(dl, 0.99),
            "sessions_done": len(j),
            "sessions_rejected": self.rejected,
            "resumes": len(st),
            "admission_wait_mean_s": _mean(aw),
            "hbm_peak_util": self.peak_used / self.hbm_total,
            "time_above_ceiling_frac": self.above_ceiling_s / span,
            "actions": dict(sorted(self.actions.items())),
            "victims": dict(sorted(self.victims.items())),
            "lease_redecisions": self.lease_redecisions,
            "offload_fallbacks": self.fallbacks,
            "emergency_preemptions": self.emergency,
            "resume_queue_preemptions": self.queue_preempted,
            "prefetch_deferred": self.prefetch_deferred,
            "staged_to_host": self.staged,
            "staging_skipped": self.stage_skipped,
            "host_clean_copies_dropped": self.clean_dropped,
            "write_through": {"on": self.wt, "written_gb": self.wt_written_blocks * self.bb / GB,
                              "host_copies_dropped": self.wt_dropped, "skipped_nvme_full": self.wt_skipped},
            "moved_gb": {"d2h": self.bytes_d2h / GB, "h2d": self.bytes_h2d / GB, "nvme": self.bytes_nvme / GB},
            "makespan_s": span,
            "events": self.events,
            "sim_wall_s": wall,
        }


class SimulationStalled(RuntimeError):
    """The event queue emptied with sessions neither finished nor rejected (a deadlock in the
    simulated node).  Raised by :meth:`Simulator.run` instead of reporting metrics that would
    cover only the finished sessions."""


def _mean(xs: Sequence[float]) -> float:
    return float(sum(xs) / len(xs)) if xs else 0.0


def _q(sorted_xs: Sequence[float], p: float) -> float:
    if not sorted_xs:
        return 0.0
    i = min(len(sorted_xs) - 1, max(0, int(math.ceil(p * len(sorted_xs))) - 1))
    return float(sorted_xs[i])


def simulate(sessions: Sequence[Session], node: NodeConfig, policy: Policy, **kw) -> SimResult:
    """Convenience: one run of one policy."""
    return Simulator(sessions, node, policy, **kw).run()
