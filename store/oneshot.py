"""The one-shot paths: ``put_many`` and ``get_many`` (``TieredStore``'s bodies).

Threads: any store caller thread, several at once.  Each call takes the store
lock (``BlockTable.lock``) to reserve (pending entries, frames) or pin, copies
and does its NVMe I/O without it, and takes it again to publish or unpin.
``OneShot`` holds no state of its own.  Lock order: store lock -> index keeper.
"""
from __future__ import annotations

import time
from typing import Callable, Sequence

from .blockio import BlockIO
from .blocks import BlockTable
from .entry import Entry
from .expiry import Expiry
from .indexing import IndexKeeper
from .placement import Placement
from .types import Tier


class OneShot:
    """Batch put and get over the store's parts; inputs come validated.
    ``tier_of`` resolves a caller's ``tier=`` (raising ``ValueError``)."""

    def __init__(self, cfg, table: BlockTable, keeper: IndexKeeper, placement: Placement, io: BlockIO,
                 expiry: Expiry, pool, tier_of: Callable[[object], Tier]) -> None:
        self._cfg, self._table, self._keeper, self._placement = cfg, table, keeper, placement
        self._io, self._expiry, self._pool, self._tier_of = io, expiry, pool, tier_of

    def put_many(self, ks: list[bytes], srcs: list[memoryview], src_addrs: list[int], ns: bytes, tier) -> int:
        """See ``TieredStore.put_many``.  All-or-nothing on raise."""
        table = self._table
        bb = self._cfg.block_bytes
        with table.lock:
            table.check_open()
            t = self._tier_of(tier)
            now = time.time()
            entries, new_srcs, new_addrs = [], [], []
            find = self._keeper.find_new if self._keeper.loading else table.get
            batch: dict[bytes, Entry] = {}
            for k, s, a in zip(ks, srcs, src_addrs):
                e = find(k)
                if e is not None:      # stored or being stored
                    if e.visible:
                        table.touch(e, now)
                    continue
                if k in batch:         # a repeat within this batch
                    continue
                e = batch[k] = Entry(k, bb, ns, now)
                entries.append(e)
                new_srcs.append(s)
                new_addrs.append(a)
            # pending (invisible) until published: concurrent puts of these keys skip them
            table.add_pending(batch)
            if not entries:
                return 0
            table.enter()
            if t is Tier.HOST:
                try:
                    frames = self._placement.alloc_frames(len(entries))   # may demote (lock released meanwhile)
                except BaseException:
                    table.abort(entries)
                    table.leave()
                    raise
                for e, f in zip(entries, frames):
                    e.frame = f
        try:
            if t is Tier.HOST:
                self._io.copy_frames(frames, new_srcs, new_addrs, into=True)
            else:
                self._placement.write_new_to_nvme(entries, new_srcs, new_addrs)
        except BaseException:
            with table.lock:
                table.abort(entries)
                table.leave()
            raise
        with table.lock:
            self._placement.publish(entries, t)
            table.counters["puts"] += len(entries)
            table.leave()
        return len(entries)

    def get_many(self, ks: list[bytes], dsts: list[memoryview], dst_addrs: list[int]) -> list[Tier | None]:
        """See ``TieredStore.get_many_served``: per key, the tier that served it
        (``Tier.HOST`` a host-frame copy, ``Tier.NVME`` an NVMe read whose
        checksum held), None a miss."""
        table = self._table
        result: list[Tier | None] = [None] * len(ks)
        with table.lock:
            table.check_open()
            # pinned: never evicted or freed while we copy
            host, nvme, misses = table.pin_reads(ks, self._keeper.finder(), time.time())
            if host:
                self._pool.incref_many([f for _, _, f in host])
            table.counters["misses"] += misses
            table.enter()

        def host_copies() -> None:
            self._io.copy_frames([f for _, _, f in host], [dsts[i] for i, _, _ in host],
                                 [dst_addrs[i] for i, _, _ in host], into=False)
            for i, _, _ in host:
                result[i] = Tier.HOST

        checked = False      # the NVMe reads' checksums are in (a raise before: nothing is corrupt)
        try:
            if nvme:     # a mixed batch: its DRAM copies run while its NVMe reads are in flight
                ok = self._io.read_verified([e for _, e, _ in nvme], [dsts[i] for i, _, _ in nvme],
                                            [dst_addrs[i] for i, _, _ in nvme],
                                            while_reading=host_copies if host else None)
                checked = True
                for (i, _, _), good in zip(nvme, ok):
                    result[i] = Tier.NVME if good else None
            elif host:
                host_copies()
        finally:
            with table.lock:
                self._release_reads(host, nvme, result, checked)
        return result

    def _release_reads(self, host: Sequence, nvme: Sequence, result: list[Tier | None], checked: bool) -> None:
        """Unpin a get's blocks, count its hits, drop the NVMe copies that failed (lock held)."""
        table = self._table
        try:
            if host:
                self._pool.decref_many([f for _, _, f in host])
            table.unpin_reads(host, nvme)
            bad = [e for i, e, _ in nvme if checked and result[i] is None and e.frame is None]
            table.counters["hits_host"] += len(host)
            table.counters["hits_nvme"] += sum(result[i] is not None for i, _, _ in nvme)
            table.counters["misses"] += len(bad)
            if bad:
                self._expiry.drop(bad, reason="corrupt")
        finally:
            table.leave()
