"""The store's books: ``stats()`` and ``check_integrity()``.

Threads: any store caller thread; both take the store lock
(``BlockTable.lock``), wait for a background index load or rebuild to
settle, and change nothing.  ``Books`` holds no state of its own.
Lock order: store lock -> index keeper.
"""
from __future__ import annotations

import bisect

from .blocks import BlockTable
from .errors import IntegrityError
from .indexing import IndexKeeper
from .twophase import TwoPhase, _LoadJob
from .types import IntegrityReport, StoreStats


class Books:
    """Counts and integrity checks over the store's parts (read only)."""

    def __init__(self, cfg, table: BlockTable, keeper: IndexKeeper, jobs: TwoPhase, pool, nvme, engine) -> None:
        self._cfg, self._table, self._keeper, self._jobs = cfg, table, keeper, jobs
        self._pool, self._nvme, self._engine = pool, nvme, engine

    def stats(self) -> StoreStats:
        table = self._table
        with table.lock:
            table.check_open()
            self._keeper.wait_settled()
            live = [e for e in table.entries() if e.visible]
            staging = self._jobs.staging_pool
            index = self._keeper.index
            return StoreStats(
                block_bytes=self._cfg.block_bytes, slot_bytes=self._cfg.slot_bytes,
                io_engine=self._engine.name, direct_io=bool(self._nvme.direct),
                host_pinned=self._pool.pinned,
                host_frames_total=self._pool.n_frames, host_frames_used=self._pool.used_count,
                host_blocks=sum(e.frame is not None for e in live),
                nvme_slots_total=self._nvme.capacity,
                nvme_slots_used=self._nvme.capacity - self._nvme.free_slots,
                nvme_blocks=sum(e.slot is not None for e in live), nvme_full=self._nvme.full,
                index_map_bytes=index.map_size, index_grows=index.grows,
                pinned_blocks=sum(e.pins > 0 for e in live),
                staging_frames_total=staging.n_frames if staging else 0,
                staging_frames_used=staging.used_count if staging else 0,
                frame_bytes=self._cfg.frame_bytes, index_rebuilds=self._keeper.rebuilds,
                blocks_recovered=self._keeper.blocks_recovered,
                **table.counters)

    def wait_prepared(self, timeout_s: float = 30.0) -> bool:
        """Wait until the slot preparer (``StoreConfig.prepare_slots``) has nothing
        left to zero within a slab of the allocation watermark; True if so (also
        when preparation is off), False on timeout.  Takes no store lock; any thread."""
        prep = self._nvme.prep
        return True if prep is None else prep.wait_idle(timeout_s)

    def check_integrity(self) -> IntegrityReport:
        """Verify the books balance: free + used == total for host frames, NVMe
        slots and index entries; every frame/slot has exactly one owner; frame
        refcounts equal 1 + pins; every pin is held by something that can
        release it (a ``pin()`` call, a load handle, or a call in flight); the
        LMDB index matches the NVMe-resident blocks.  Waits for a background
        index load or rebuild to finish first.  Raises ``IntegrityError``
        listing every problem; returns the counts."""
        table = self._table
        with table.lock:
            table.check_open()
            self._keeper.wait_settled()
            problems = []
            owners = list(table.entries()) + list(table.dead())
            frames = [e.frame for e in owners if e.frame is not None]
            frames += list(self._jobs.private_frames())      # load jobs' unpromoted landing frames
            slots = [e.slot for e in owners if e.slot is not None]
            slots += [e.demote_slot for e in owners if e.demote_slot is not None]   # demotions in flight
            pool, nv = self._pool, self._nvme
            if pool.free_count + pool.used_count != pool.n_frames:
                problems.append("host: free + used != total")
            if len(set(frames)) != len(frames):
                problems.append("host: a frame has two owners")
            if len(frames) != pool.used_count:
                problems.append(f"host: {pool.used_count} frames used but {len(frames)} owned")
            for e in owners:
                if e.frame is not None:
                    want = e.pins + (0 if e.dead else 1)
                    if pool.refcount(e.frame) != want:
                        problems.append(f"host: frame {e.frame} refcount {pool.refcount(e.frame)} != {want}")
            if not table.busy:
                problems += self._unheld_pins(owners)
            used_slots = nv.capacity - nv.free_slots
            if len(set(slots)) != len(slots):
                problems.append("nvme: a slot has two owners")
            if len(slots) != used_slots:
                problems.append(f"nvme: {used_slots} slots used but {len(slots)} owned")
            free_from_extents = sum(n for _, n in nv.alloc_map.extents())
            if free_from_extents != nv.free_slots:
                problems.append("nvme: free-extent map disagrees with its count")
            ext = nv.alloc_map.extents()
            starts = [st for st, _ in ext]
            for s in slots:
                i = bisect.bisect_right(starts, s) - 1
                if i >= 0 and s < ext[i][0] + ext[i][1]:
                    problems.append(f"nvme: slot {s} is used and free")
                    break
            disk = dict(self._keeper.index.items())
            want = {e.key: e for e in table.entries() if e.visible and e.slot is not None}
            if set(disk) != set(want):
                problems.append(f"index: {len(disk)} records but {len(want)} NVMe-resident blocks")
            for k, rec in disk.items():
                e = want.get(k)
                if e is not None and (rec.slot != e.slot or rec.checksum != e.checksum):
                    problems.append(f"index: record of {k.hex()} disagrees with memory")
            for e in table.entries():
                if e.visible and e.frame is None and e.slot is None:
                    problems.append(f"block {e.key.hex()} visible but in no tier")
            sp = self._jobs.staging_pool
            if sp is not None:
                leased = sum(len(j.staging.frames) for j in table.jobs()
                             if j.staging is not None and j.staging.frames is not None)
                if sp.free_count + sp.used_count != sp.n_frames:
                    problems.append("staging: free + used != total")
                if not table.busy and leased != sp.used_count:
                    problems.append(f"staging: {sp.used_count} frames used but {leased} held by handles")
            if problems:
                raise IntegrityError("; ".join(problems))
            return IntegrityReport(
                host_frames_total=pool.n_frames, host_frames_free=pool.free_count,
                host_frames_used=pool.used_count, nvme_slots_total=nv.capacity,
                nvme_slots_free=nv.free_slots, nvme_slots_used=used_slots,
                index_entries=len(disk), live_blocks=sum(e.visible for e in table.entries()))



    def _unheld_pins(self, owners) -> list[str]:
        """Pins no ``pin()`` call and no load handle holds (lock held, nothing in flight)."""
        held: dict[int, int] = {}
        for job in self._table.jobs():
            for e in job.entries if isinstance(job, _LoadJob) else ():
                held[id(e)] = held.get(id(e), 0) + 1
        bad = [e for e in owners if e.pins != e.user_pins + held.get(id(e), 0)]
        if not bad:
            return []
        return [f"pins: {len(bad)} blocks hold pins nothing can release "
                f"(e.g. {bad[0].key.hex()}: {bad[0].pins} pins, {bad[0].user_pins} from pin(), "
                f"{held.get(id(bad[0]), 0)} from load handles)"]
