"""Placement: host frames and NVMe slots found for new blocks, by evicting LRU
victims; demotion (host -> NVMe); publishing new blocks in their tier.

Threads: the store's caller threads.  Every method is called with the store
lock (``BlockTable.lock``) held -- ``demote`` releases it while the slab
writes run (see there), and so may ``alloc_frames``, which demotes, and
``alloc_slots``, which waits for the index load -- except
``write_new_to_nvme`` and ``set_host_victim_order``, which take it.  It moves
blocks between the table's LRUs and the frame pool / slot allocator.  Its own
fields, owned by the store lock: an optional host victim order
(:meth:`Placement.set_host_victim_order`; host frames are then taken from the
blocks that order names first, and from the LRU only after it; no order:
LRU), the position reached in it, and the count of demotions in flight.

Lock order: store lock -> index keeper (commits).  The victim order this
placement is given is the store's ``VictimSnapshot`` (store/tiered.py): it is
called with the store lock held, takes no lock and calls no one.  The
owner's order behind it is read by ``TieredStore.put_many`` /
``prepare_store`` before the store lock is taken.
"""
from __future__ import annotations

import logging
from typing import Callable, Sequence

from .blockio import BlockIO
from .blocks import BlockTable
from .entry import Entry as _Entry
from .errors import StoreError, StoreFull
from .events import EventHub
from .expiry import Expiry
from .indexing import IndexKeeper, record_of
from .types import Tier

log = logging.getLogger("kvtier.store.tiered")


class Placement:
    """Allocation, eviction and demotion over the store's ``BlockTable``."""

    def __init__(self, cfg, table: BlockTable, keeper: IndexKeeper, io: BlockIO, expiry: Expiry,
                 events: EventHub, pool, nvme) -> None:
        self._cfg, self._table, self._keeper, self._io, self._expiry = cfg, table, keeper, io, expiry
        self._events, self._pool, self._nvme = events, pool, nvme
        self._victim_order: Callable[[], Sequence[bytes] | None] | None = None
        # (the order last walked, how many of its first keys are out of host frames)
        self._victim_seen: tuple = (None, 0)
        self._demotions_in_flight = 0

    def set_host_victim_order(self, order: Callable[[], Sequence[bytes] | None] | None) -> None:
        """Choose host-frame victims by ``order`` instead of recency (None: LRU, the default).

        ``order()`` returns block keys, the one to give up its frame first
        first, or None (LRU this time).  The store takes victims from it in
        that order, skipping keys not in host frames or pinned, then from the
        LRU for whatever it names too few of.  It is called with the store's
        lock held, once per eviction batch.  The store passes its
        ``VictimSnapshot`` (store/tiered.py): a list read from the owner's
        order before the store lock was taken, returned without a lock or a
        call.  An exception from ``order`` counts as None.  Thread-safe."""
        with self._table.lock:
            self._victim_order = order
            self._victim_seen = (None, 0)

    def _host_victims(self, batch: int, need: int | None = None) -> list[_Entry]:
        """Up to ``batch`` unpinned host blocks to evict: the victim order's
        first, then LRU -- while an order is given, the LRU only up to
        ``need`` (the frames wanted now), so a batch never evicts blocks the
        order spared just to round the batch up.  Lock held.  O(victims) per
        call: the order's keys already out of host frames are skipped once,
        not at every batch."""
        table = self._table
        victims: list[_Entry] = []
        chosen: set[bytes] = set()
        order = self._victim_order
        seq = None
        if order is not None:
            try:
                seq = order()
            except Exception as exc:
                log.debug("host victim order failed (%s): LRU this time", exc)
        if seq:
            last, pos = self._victim_seen
            i = pos = pos if last is seq else 0
            head = True
            while i < len(seq) and len(victims) < batch:
                e = table.get(seq[i])
                if e is None or e.frame is None or not e.visible:
                    if head:
                        pos = i + 1
                else:
                    head = False
                    if e.pins == 0 and e.key not in chosen:
                        victims.append(e)
                        chosen.add(e.key)
                i += 1
            self._victim_seen = (seq, pos)
        upto = batch if not seq or need is None else min(batch, max(need, len(victims)))
        if len(victims) < upto:
            for k in table.host_keys():
                e = table.get(k)
                if e.pins == 0 and k not in chosen:
                    victims.append(e)
                    if len(victims) >= upto:
                        break
        return victims

    def alloc_frames(self, n: int) -> list[int]:
        """``n`` host frames, evicting (demoting) unpinned host blocks (LRU, or
        the victim order's first: :meth:`set_host_victim_order`).

        Called with the lock held exactly once; it is released while demotion
        writes run (see ``demote``), so callers must have made their own
        pending state visible (entries inserted, ``BlockTable.enter``) before calling.
        Raises ``StoreFull`` if pins leave too few evictable frames -- counted
        *before* anything is evicted, so a put that cannot fit loses nothing."""
        if n > self._pool.n_frames:
            raise StoreFull(f"{n} blocks exceed the host tier's {self._pool.n_frames} frames")
        need = n - self._pool.free_count
        if need > 0 and not self._demotions_in_flight \
                and self._table.count_unpinned(self._table.host_keys(), need) < need:
            raise StoreFull(f"host tier full: {need} more frames needed and too few host blocks "
                            f"are unpinned (nothing was evicted)")
        while self._pool.free_count < n:
            need = n - self._pool.free_count
            batch = max(need, min(self._cfg.slots_per_io, max(1, self._pool.n_frames // 4)))
            victims = self._host_victims(batch, need)
            if not victims:
                if self._demotions_in_flight:   # their frames come free when they finish
                    self._table.changed.wait()
                    self._table.check_open()
                    continue
                raise StoreFull("host tier full and every host block is pinned or in flight")
            self._evict_host(victims)
        return self._pool.alloc_many(n)

    def _evict_host(self, victims: list[_Entry]) -> None:
        """Remove ``victims`` from the host tier: blocks already on NVMe just lose
        their frame; the others are demoted to NVMe if it has room, else dropped.
        Lock held once; released during the demotion writes."""
        to_demote = [e for e in victims if e.slot is None]
        for e in victims:
            if e.slot is not None:
                self.release_frame(e)
        if not to_demote:
            return
        self._nvme.uncap()
        if self._nvme.capacity > 0:
            try:
                self.demote(to_demote)
            except StoreError as exc:
                log.warning("demotion to NVMe failed (%s); dropping %d host blocks", exc, len(to_demote))
        # the lock was released: only touch victims that are still ours to evict
        for e in to_demote:
            if not self._table.is_current(e) or e.frame is None or e.pins:
                continue            # dropped, already evicted, or pinned by a reader meanwhile
            if e.slot is not None:
                self.release_frame(e)
            else:
                self._expiry.drop([e], reason="evict")

    def release_frame(self, e: _Entry) -> None:
        """``e`` gives up its host frame (it keeps its NVMe copy).  Lock held."""
        self._table.release_frame(e)
        if e.visible:
            self._events.emit_removed([e.key], Tier.HOST)

    def demote(self, entries: list[_Entry]) -> list[_Entry]:
        """Write host blocks to NVMe; returns the entries now on NVMe (they keep
        their frames).  Two-phase, so the slab I/O runs without the lock:

        1. (lock) reserve slots (evicting NVMe LRU blocks if needed) and pin the
           blocks (``demote_slot`` set): readers keep reading the host copy, and
           nothing can evict, demote or free the frames meanwhile;
        2. (no lock) write the frames, checksum them on the hashing threads, fdatasync;
        3. (lock) for blocks still alive, commit their index records (durable
           before visible) and record the slot; free the slots of blocks dropped
           meanwhile; unpin.

        Called with the lock held exactly once.  Raises ``StoreFull``/``DiskFull``
        (no room) or ``StoreIOError``; on raise no block changed tier."""
        entries = [e for e in entries if e.demote_slot is None and e.slot is None and e.frame is not None]
        if not entries:
            return []
        table = self._table
        table.enter()
        try:
            slots = self.alloc_slots(len(entries), protect=entries)
        except BaseException:
            table.leave()
            raise
        for e, s in zip(entries, slots):
            e.demote_slot = s
            table.pin(e)
        self._demotions_in_flight += 1
        err: BaseException | None = None
        sums: list[int] = []
        seq0 = self._keeper.next_seqs(len(entries))
        table.lock.release()
        try:
            self._io.write_frames(entries, slots, seq0)
            sums = [e.checksum for e in entries]
        except BaseException as exc:
            err = exc
        finally:
            table.lock.acquire()
        alive: list[_Entry] = []
        try:
            for e, s, c in zip(entries, slots, sums or [None] * len(entries)):
                e.demote_slot = None
                if err is None and not e.dead and table.is_current(e):
                    e.slot, e.checksum = s, c
                    alive.append(e)
                else:
                    self._nvme.free([s])
            if alive:
                try:
                    self._keeper.commit(puts=[(e.key, record_of(e)) for e in alive], slots=[e.slot for e in alive])
                except BaseException as exc:
                    for e in alive:
                        self._nvme.free([e.slot])
                        e.slot = e.checksum = None
                    alive, err = [], exc
            for e in alive:
                table.on_nvme(e)
            self._events.emit_stored([e.key for e in alive], Tier.NVME)
            table.counters["demotions"] += len(alive)
        finally:
            for e in entries:
                table.unpin(e, e.frame)
            self._demotions_in_flight -= 1
            table.leave()
            table.changed.notify_all()
        if err is not None:
            raise err
        return alive


    def alloc_slots(self, n: int, protect: Sequence[_Entry] = ()) -> list[int]:
        """``n`` NVMe slots, evicting unpinned NVMe LRU blocks if needed.  Lock held.
        Raises ``StoreFull`` (not enough evictable) or ``DiskFull`` (filesystem full)."""
        nv = self._nvme
        nv.uncap()                  # a tier capped by a full filesystem that has room again
        if n > nv.capacity:
            raise StoreFull(f"{n} blocks exceed the NVMe tier's {nv.capacity} slots")
        while True:
            if nv.free_slots < n and self._keeper.loading:
                # the free map below the high-water mark is still being loaded
                self._table.changed.wait(0.05)
                self._table.check_open()
                continue
            if nv.free_slots < n:
                need = n - nv.free_slots
                prot = {id(e) for e in protect}
                victims = []
                for k in self._table.nvme_keys():
                    e = self._table.get(k)
                    if e.pins == 0 and id(e) not in prot:
                        victims.append(e)
                        if len(victims) >= need:
                            break
                if len(victims) < need:
                    raise StoreFull(f"NVMe tier full: {need} more slots needed, "
                                    f"{len(victims)} evictable (others pinned)")
                self._evict_nvme(victims)
            slots = nv.alloc(n)  # may raise DiskFull (tier capped; loop again next call)
            if slots is not None:
                return slots

    def _evict_nvme(self, victims: list[_Entry]) -> None:
        keep = [e for e in victims if e.frame is not None]   # still cached on host
        gone = [e for e in victims if e.frame is None]
        if keep:
            self._keeper.commit(deletes=[e.key for e in keep])
            for e in keep:
                self._table.release_slot(e)
            self._events.emit_removed([e.key for e in keep], Tier.NVME)
        if gone:
            self._expiry.drop(gone, reason="evict")


    def publish(self, entries: Sequence[_Entry], t: Tier) -> None:
        """Make new blocks visible in tier ``t`` (lock held): newest in its LRU, one KV event."""
        self._table.publish(entries, on_host=t is Tier.HOST)
        self._events.emit_stored([e.key for e in entries], t)

    def write_new_to_nvme(self, entries: list[_Entry], srcs: list[memoryview],
                          addrs: list[int] | None = None) -> None:
        """Write pending entries' bytes to NVMe, flush, then commit their index
        records (durable before visible).  Called without the lock; takes it for
        slot allocation (and write sequence numbers) only.

        Raises:
            StoreFull, DiskFull: no room (nothing was evicted for a raise before the write).
            StoreIOError, StoreError: the write or the commit failed (the caller aborts the entries).
        """
        with self._table.lock:
            slots = self.alloc_slots(len(entries))
            for e, s in zip(entries, slots):
                e.slot = s
            seq0 = self._keeper.next_seqs(len(entries))
        records = self._io.write_new(entries, srcs, addrs, slots, seq0)
        self._keeper.commit(puts=list(zip([e.key for e in entries], records)), packed=True, slots=slots)
