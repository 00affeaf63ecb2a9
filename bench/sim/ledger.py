"""The node's memory ledger: HBM blocks, host frames, NVMe slots, and the host cache lists.

:class:`Ledger` is the one owner of the memory counts (one owner, the node's
event loop; not thread-safe).  It keeps:

* ``used`` / ``host_used`` / ``nvme_used``: blocks held per tier, equal at every
  event to what the sessions hold (:meth:`Ledger.check_integrity`);
* ``pending_free``: HBM blocks of victims whose copy-out is under way;
* ``shared_loaded``: the shared prefixes resident in HBM (loaded once, kept);
* ``clean``: host copies that duplicate what their session has in HBM again
  (droppable, oldest first);
* ``durable`` (write-through): host copies fully written to NVMe and not clean,
  droppable for free because their NVMe backing (``SessionState.nv``) stays;
* the HBM occupancy samples and the idle HBM integral (``SimCounters``).

Other parts change the counts only through its methods; they read the counts.
"""
from __future__ import annotations

from kvtier.tiering.model.costmodel import GB
from kvtier.util.tiers import Tier

from kvtier.bench.sim.events import EventKind, EventQueue
from kvtier.bench.sim.metrics import SimCounters
from kvtier.bench.sim.node import DONE, PAUSED, REJECTED, NodeConfig, SessionState
from kvtier.bench.sim.residents import PausedResidents
from kvtier.bench.sim.transfers import COPY_OUT


class Ledger:
    """Tier accounting of one node (see the module docstring).

    ``sessions`` is the node's list of every session it has seen (read by
    :meth:`check_integrity`; the node appends to it).  ``occupancy_dt``: the
    least time between two HBM occupancy samples.
    """

    def __init__(self, node: NodeConfig, clock: EventQueue, m: SimCounters, sessions: list[SessionState],
                 residents: PausedResidents, *, occupancy_dt: float) -> None:
        self._clock = clock
        self._m = m
        self._sessions = sessions
        self._residents = residents
        self.bt = node.block_tokens
        self.bb = node.block_bytes
        self.hbm_total = node.hbm_blocks
        self.host_total = node.host_blocks
        self.nvme_total = node.nvme_blocks
        self.ceiling_blocks = int(node.admission_ceiling * self.hbm_total)
        self.wt = bool(node.write_through)
        self.used = 0
        self.host_used = 0
        self.nvme_used = 0
        self.pending_free = 0
        self.shared_loaded: dict[str, int] = {}
        self.clean: dict[SessionState, None] = {}          # host copies also resident in HBM, oldest first
        self.clean_blocks = 0
        self.durable: dict[SessionState, int] = {}         # write-through: host copies durable on NVMe
        self.durable_blocks = 0
        self.used_mark = 0.0
        self.occ: list[tuple[float, float]] = []
        self.occ_dt = occupancy_dt
        self.occ_last = float("-inf")

    def blocks(self, tokens: int) -> int:
        """Blocks holding ``tokens`` tokens (rounded up).  Pure."""
        return -(-tokens // self.bt)

    def free(self) -> int:
        """HBM blocks free now."""
        return self.hbm_total - self.used

    def shared_total(self) -> int:
        """HBM blocks the resident shared prefixes hold."""
        return sum(self.shared_loaded.values())

    # ------------------------------------------------------------ HBM
    def set_used(self, delta: int) -> None:
        """Change the HBM blocks held by ``delta`` (time above the ceiling, the peak and the
        occupancy samples follow)."""
        now = self._clock.now
        m = self._m
        if self.used > self.ceiling_blocks:
            m.above_ceiling_s += now - self.used_mark
        self.used_mark = now
        self.used += delta
        if self.used > m.peak_used:
            m.peak_used = self.used
        if now - self.occ_last >= self.occ_dt:
            self.occ.append((now, self.used / self.hbm_total))
            self.occ_last = now

    def pending(self, delta: int) -> None:
        """Change the HBM blocks on their way to free (a victim's copy-out started: > 0; it landed,
        or the victim resumed and keeps them: < 0)."""
        self.pending_free += delta

    def load_shared(self, prefix_id: str, blocks: int) -> None:
        """The shared prefix ``prefix_id`` (``blocks`` blocks) is resident from now on."""
        self.shared_loaded[prefix_id] = blocks
        self.set_used(blocks)

    def idle_flush(self, x: SessionState) -> None:
        """Count x's paused HBM holding up to now (idle HBM, its pause record) and restart it."""
        now = self._clock.now
        if x.phase == PAUSED and x.hbm:
            held = x.hbm * (now - x.idle_mark)
            self._m.idle_blocks_s += held
            if x.rec is not None:
                x.rec.hold_gbs += held * self.bb / GB
        x.idle_mark = now

    def hbm(self, x: SessionState, blocks: int) -> None:
        """Set x's HBM holding to ``blocks`` (allocating or freeing the difference)."""
        self.idle_flush(x)
        self.set_used(blocks - x.hbm)
        x.hbm = blocks

    # ------------------------------------------------------------ lower-tier copies
    def set_copy(self, x: SessionState, tier: Tier | None, blocks: int) -> None:
        """Replace x's lower-tier copy (frees the old one).  The new copy is not clean.

        A host copy that grows keeps its NVMe backing (write-through; KV is
        append-only, so a written prefix stays valid); any other change releases it."""
        if x in self.clean:
            del self.clean[x]
            self.clean_blocks -= x.copy_blocks
        if x in self.durable:
            self.durable_blocks -= self.durable.pop(x)
        if x.nv and not (tier is Tier.HOST and x.copy_tier is Tier.HOST):
            self._release_nv(x)
        if x.copy_tier is Tier.HOST:
            self.host_used -= x.copy_blocks
        elif x.copy_tier is Tier.NVME:
            self.nvme_used -= x.copy_blocks
        x.copy_tier, x.copy_blocks = (tier, blocks) if tier else (None, 0)
        if tier is Tier.HOST:
            self.host_used += blocks
        elif tier is Tier.NVME:
            self.nvme_used += blocks
        self.refresh_durable(x)

    def _release_nv(self, x: SessionState) -> None:
        self.nvme_used -= x.nv
        x.nv = x.nv_ok = 0
        x.nv_gen += 1

    def reserve_nv(self, x: SessionState, blocks: int) -> None:
        """Write-through: reserve NVMe slots behind x's host copy up to ``blocks`` (the caller
        writes them)."""
        self.nvme_used += blocks - x.nv
        x.nv = blocks

    def refresh_durable(self, x: SessionState) -> None:
        """Keep ``durable`` = host copies fully written to NVMe and not clean (droppable for free)."""
        want = (self.wt and x.copy_tier is Tier.HOST and x.copy_blocks > 0 and x.nv_ok >= x.copy_blocks
                and x not in self.clean and x.phase not in (DONE, REJECTED))
        if x in self.durable:
            if want and self.durable[x] == x.copy_blocks:
                return
            self.durable_blocks -= self.durable.pop(x)
        if want:
            self.durable[x] = x.copy_blocks
            self.durable_blocks += x.copy_blocks

    def host_to_nvme(self, x: SessionState) -> None:
        """Drop x's durable host copy; its NVMe backing becomes its only copy (no data moves)."""
        blocks = x.nv
        if x in self.durable:
            self.durable_blocks -= self.durable.pop(x)
        if x in self.clean:
            del self.clean[x]
            self.clean_blocks -= x.copy_blocks
        self.host_used -= x.copy_blocks
        x.copy_tier, x.copy_blocks = Tier.NVME, blocks
        x.nv = x.nv_ok = 0
        x.nv_gen += 1
        if x.phase == PAUSED and x.place is Tier.HOST:
            x.place = Tier.NVME

    def nvme_to_host(self, x: SessionState, blocks: int) -> None:
        """x's NVMe copy was read into a new host copy of ``blocks``; under write-through the
        NVMe copy stays behind it (so the host copy is droppable), else it is released."""
        old = x.copy_blocks if x.copy_tier is Tier.NVME else 0
        self.set_copy(x, Tier.HOST, blocks)
        if self.wt and old:
            self.nvme_used += old
            x.nv = x.nv_ok = min(old, blocks)
            self.nvme_used -= old - x.nv
            self.refresh_durable(x)

    def mark_clean(self, x: SessionState) -> None:
        """x's host copy duplicates what it now has in HBM: droppable when host room runs out."""
        if x.copy_tier is Tier.HOST and x not in self.clean:
            if x in self.durable:
                self.durable_blocks -= self.durable.pop(x)
            self.clean[x] = None
            self.clean_blocks += x.copy_blocks

    def unmark_clean(self, x: SessionState) -> None:
        """x's host copy no longer duplicates HBM (x gave its HBM up): not droppable as clean."""
        if x in self.clean:
            del self.clean[x]
            self.clean_blocks -= x.copy_blocks
            self.refresh_durable(x)

    # ------------------------------------------------------------ integrity
    def check_integrity(self) -> None:
        """Blocks are conserved: each tier's used count equals what sessions hold.  Raises AssertionError."""
        sessions = self._sessions
        live = [x for x in sessions if x.phase not in (DONE, REJECTED)]
        hbm = sum(self.shared_loaded.values()) + sum(x.hbm for x in live)
        host = sum(x.copy_blocks for x in live if x.copy_tier is Tier.HOST)
        nvme = sum(x.copy_blocks for x in live if x.copy_tier is Tier.NVME) + sum(x.nv for x in live)
        if hbm != self.used or host != self.host_used or nvme != self.nvme_used:
            raise AssertionError(f"block accounting broken: hbm {hbm} vs {self.used}, "
                                 f"host {host} vs {self.host_used}, nvme {nvme} vs {self.nvme_used}")
        if not (0 <= self.used <= self.hbm_total and 0 <= self.host_used <= self.host_total
                and 0 <= self.nvme_used <= self.nvme_total):
            raise AssertionError(f"tier over capacity or negative: hbm {self.used}/{self.hbm_total}, "
                                 f"host {self.host_used}/{self.host_total}, nvme {self.nvme_used}/{self.nvme_total}")
        for x in sessions:
            if x.phase in (DONE, REJECTED) and (x.hbm or x.copy_blocks):
                raise AssertionError(f"finished session {x.s.id} still holds blocks")
        self._check_cache_lists(sessions)
        pend = sum(x.moving.victim_blocks for x in live if x.moving is not None)
        if pend != self.pending_free:
            raise AssertionError(f"blocks on their way to free miscounted: {self.pending_free} vs {pend}")
        self._check_paused(live)

    def _check_cache_lists(self, sessions: list[SessionState]) -> None:
        if self.clean_blocks != sum(x.copy_blocks for x in self.clean) or \
                any(x.copy_tier is not Tier.HOST for x in self.clean):
            raise AssertionError("clean host copies miscounted")
        for x in self.clean:
            if not x.hbm:
                raise AssertionError(f"session {x.s.id}: its host copy is marked clean (a droppable duplicate) "
                                     f"but it holds nothing in HBM")
        if self.durable_blocks != sum(self.durable.values()) or any(
                x.copy_tier is not Tier.HOST or x in self.clean or x.nv_ok < x.copy_blocks or b != x.copy_blocks
                for x, b in self.durable.items()):
            raise AssertionError("durable host copies miscounted")
        for x in sessions:
            if x.nv and (x.copy_tier is not Tier.HOST or not (0 <= x.nv_ok <= x.nv <= x.copy_blocks)):
                raise AssertionError(f"session {x.s.id}: NVMe backing {x.nv_ok}/{x.nv} of a "
                                     f"{x.copy_tier} copy of {x.copy_blocks} blocks")

    def _check_paused(self, live: list[SessionState]) -> None:
        copying = {tr.sess for kind, tr, _ in self._clock.pending()
                   if kind == EventKind.XFER and tr.fg and tr.then in COPY_OUT and tr.epoch == tr.sess.epoch}
        for x in self._residents:
            if x.phase != PAUSED or not x.hbm:
                raise AssertionError(f"session {x.s.id} listed as paused in HBM but is not")
            if x in copying:
                raise AssertionError(f"session {x.s.id} is listed as evictable with its copy-out in flight")
        for x in live:
            if x.phase != PAUSED or x.moving is not None:
                continue
            if x.place is Tier.DEVICE and x.hbm and x not in self._residents:
                # retained state nothing moves is an eviction candidate; unlisted it would hold
                # HBM through the whole wait, however long the admission queue
                raise AssertionError(f"session {x.s.id} is paused in HBM with nothing moving but is not "
                                     f"listed as evictable")
            if (x.place is Tier.HOST and x.copy_tier is not Tier.HOST) or \
                    (x.place is Tier.NVME and x.copy_tier is not Tier.NVME):
                raise AssertionError(f"session {x.s.id} is paused on {x.place} but its copy is "
                                     f"{x.copy_tier or 'gone'}")
