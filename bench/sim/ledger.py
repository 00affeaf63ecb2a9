"""The node's memory ledgers: HBM blocks, host frames, NVMe slots, and the host cache lists.

A mixin of :class:`kvtier.bench.sim.simulator.Simulator` (it shares the
simulator's fields; one owner, not thread-safe).  It keeps:

* ``used`` / ``host_used`` / ``nvme_used``: blocks held per tier, equal at every
  event to what the sessions hold (:meth:`check_integrity`);
* ``clean``: host copies that duplicate what their session has in HBM again
  (droppable, oldest first);
* ``durable`` (write-through): host copies fully written to NVMe and not clean,
  droppable for free because their NVMe backing (``SessionState.nv``) stays.
"""
from __future__ import annotations

from kvtier.tiering.model.costmodel import GB

from kvtier.bench.sim.moves import XFER_EVENT
from kvtier.bench.sim.node import DONE, P_HBM, P_HOST, P_NVME, PAUSED, REJECTED, SessionState
from kvtier.bench.sim.transfers import COPY_OUT


class MemoryLedger:
    """Tier accounting of the simulator (a mixin; see the module docstring)."""

    def blocks(self, tokens: int) -> int:
        """Blocks holding ``tokens`` tokens (rounded up)."""
        return -(-tokens // self.bt)

    def _set_used(self, delta: int) -> None:
        now = self.now
        if self.used > self.ceiling_blocks:
            self.m.above_ceiling_s += now - self.used_mark
        self.used_mark = now
        self.used += delta
        if self.used > self.m.peak_used:
            self.m.peak_used = self.used
        if now - self.occ_last >= self.occ_dt:
            self.occ.append((now, self.used / self.hbm_total))
            self.occ_last = now

    def _idle_flush(self, x: SessionState) -> None:
        if x.phase == PAUSED and x.hbm:
            held = x.hbm * (self.now - x.idle_mark)
            self.m.idle_blocks_s += held
            if x.rec is not None:
                x.rec.hold_gbs += held * self.bb / GB
        x.idle_mark = self.now

    def _hbm(self, x: SessionState, blocks: int) -> None:
        """Set x's HBM holding to ``blocks`` (allocating or freeing the difference)."""
        self._idle_flush(x)
        self._set_used(blocks - x.hbm)
        x.hbm = blocks

    def _free(self) -> int:
        return self.hbm_total - self.used

    def _set_copy(self, x: SessionState, tier: str | None, blocks: int) -> None:
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

    def _release_nv(self, x: SessionState) -> None:
        self.nvme_used -= x.nv
        x.nv = x.nv_ok = 0
        x.nv_gen += 1

    def _refresh_durable(self, x: SessionState) -> None:
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

    def _host_to_nvme(self, x: SessionState) -> None:
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

    def _nvme_to_host(self, x: SessionState, blocks: int) -> None:
        """x's NVMe copy was read into a new host copy of ``blocks``; under write-through the
        NVMe copy stays behind it (so the host copy is droppable), else it is released."""
        old = x.copy_blocks if x.copy_tier == "nvme" else 0
        self._set_copy(x, "host", blocks)
        if self.wt and old:
            self.nvme_used += old
            x.nv = x.nv_ok = min(old, blocks)
            self.nvme_used -= old - x.nv
            self._refresh_durable(x)

    def _mark_clean(self, x: SessionState) -> None:
        """x's host copy duplicates what it now has in HBM: droppable when host room runs out."""
        if x.copy_tier == "host" and x not in self.clean:
            if x in self.durable:
                self.durable_blocks -= self.durable.pop(x)
            self.clean[x] = None
            self.clean_blocks += x.copy_blocks

    def _host_room(self, need: int, exclude: SessionState, above: float | None = None) -> bool:
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
            self.m.clean_dropped += 1
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
            self.m.wt_dropped += 1
            if self.host_used + need <= self.host_total:
                return True
        return False

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
        for x in self.clean:
            if not x.hbm:
                raise AssertionError(f"session {x.s.id}: its host copy is marked clean (a droppable duplicate) "
                                     f"but it holds nothing in HBM")
        if self.durable_blocks != sum(self.durable.values()) or any(
                x.copy_tier != "host" or x in self.clean or x.nv_ok < x.copy_blocks or b != x.copy_blocks
                for x, b in self.durable.items()):
            raise AssertionError("durable host copies miscounted")
        for x in self.sessions:
            if x.nv and (x.copy_tier != "host" or not (0 <= x.nv_ok <= x.nv <= x.copy_blocks)):
                raise AssertionError(f"session {x.s.id}: NVMe backing {x.nv_ok}/{x.nv} of a "
                                     f"{x.copy_tier} copy of {x.copy_blocks} blocks")
        pend = sum(x.moving.victim_blocks for x in live if x.moving is not None)
        if pend != self.pending_free:
            raise AssertionError(f"blocks on their way to free miscounted: {self.pending_free} vs {pend}")
        copying = {tr.sess for _, _, kind, tr, _ in self.heap
                   if kind == XFER_EVENT and tr.fg and tr.then in COPY_OUT and tr.epoch == tr.sess.epoch}
        for x in self.paused_hbm:
            if x.phase != PAUSED or not x.hbm:
                raise AssertionError(f"session {x.s.id} listed as paused in HBM but is not")
            if x in copying:
                raise AssertionError(f"session {x.s.id} is listed as evictable with its copy-out in flight")
        for x in live:
            if x.phase != PAUSED or x.moving is not None:
                continue
            if x.place == P_HBM and x.hbm and x not in self.paused_hbm:
                # retained state nothing moves is an eviction candidate; unlisted it would hold
                # HBM through the whole wait, however long the admission queue
                raise AssertionError(f"session {x.s.id} is paused in HBM with nothing moving but is not "
                                     f"listed as evictable")
            if (x.place == P_HOST and x.copy_tier != "host") or (x.place == P_NVME and x.copy_tier != "nvme"):
                raise AssertionError(f"session {x.s.id} is paused on {x.place} but its copy is "
                                     f"{x.copy_tier or 'gone'}")
