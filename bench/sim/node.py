"""The simulated node's plain data: its configuration, one session's runtime state, results.

Session phases are small ints compared on the hot path; where a session's state is, and its
lower-tier copy, are :class:`~kvtier.util.tiers.Tier` members (None: nowhere, the state is gone).
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from kvtier.tiering.model.costmodel import HardwareProfile, ModelGeometry
from kvtier.util.tiers import Tier

from kvtier.bench.sim.trace import Session

# session phases
NEW_Q, RUNNING, PAUSED, RESUME_Q, DONE, REJECTED = range(6)


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
    # admission ceiling (it is then deferred: reload on demand at resume).  True: a prefetch
    # may fill the pool to 100% whenever the blocks are free.
    prefetch_past_ceiling: bool = False
    # resumed rounds whose context is still resident in HBM (retained, prefetched back, or with
    # their copy-out still in flight) are admitted before queued resumes that need room for their
    # context, FIFO within each class (vLLM's scheduler drains requests holding KV blocks first);
    # such a resume keeps its blocks, so a victim's are no longer counted as being freed.
    # False: one FIFO resume queue (the head blocks everyone behind it).
    holders_first: bool = False

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


class SessionState:
    """Runtime state of one session (plain data: the node's parts read and set its fields; one
    owner, the node's event loop; not thread-safe)."""

    __slots__ = ("s", "rounds", "k", "ctx", "shared", "hbm", "copy_tier", "copy_blocks", "phase",
                 "place", "moving", "decision", "pause_t", "return_t", "epoch", "idle_mark",
                 "prefetch_pending", "waiting_reload", "dec_kv", "need_prefill", "recompute",
                 "evictable", "start_t", "pf_due", "st_due", "stage_pending", "nv", "nv_ok", "nv_gen", "rec", "hit_k")

    def __init__(self, s: Session) -> None:
        self.s = s
        self.rounds = s.rounds
        self.k = 0
        self.ctx = 0                  # private context tokens (rounds < k)
        self.shared = s.shared_prefix_tokens
        self.hbm = 0                  # HBM blocks held (private)
        self.copy_tier: Tier | None = None    # lower-tier copy: None, Tier.HOST or Tier.NVME
        self.copy_blocks = 0
        self.phase = NEW_Q
        self.place: Tier | None = Tier.DEVICE   # where a paused session's state is (None: dropped)
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
        self.rec = None               # PauseRecord of the current (or last) pause: attribution.py
        self.hit_k = -1               # the last round counted in the prefix hit rate


class WaitQueues:
    """The node's two admission queues (plain data; the admission owns their order, the
    pause handling and the cluster append to them).  ``resume``: resumed rounds whose tool has
    returned, served first; ``new``: new sessions, FIFO under the admission ceiling."""

    __slots__ = ("resume", "new")

    def __init__(self) -> None:
        self.resume: deque[SessionState] = deque()
        self.new: deque[SessionState] = deque()


class SimulationStalled(RuntimeError):
    """The event queue emptied with sessions neither finished nor rejected (a deadlock in the
    simulated node).  Raised by :meth:`Simulator.run` instead of reporting metrics that would
    cover only the finished sessions."""
