"""Expiry: blocks leave the store -- dropped, evicted with nowhere to go, or corrupt.

Threads: called on any store thread with the store lock (``BlockTable.lock``)
held; it holds no state of its own.  The index commit of a removal runs
under the index keeper's lock (lock order: store lock -> index keeper).
"""
from __future__ import annotations

from typing import Sequence

from .blocks import BlockTable
from .entry import Entry
from .events import EventHub
from .indexing import IndexKeeper
from .types import Tier

_COUNTED = {"corrupt": "corrupt_dropped", "evict": "evictions_dropped"}


class Expiry:
    """Forgets blocks: the index first (durably), then memory and the tiers' space."""

    def __init__(self, table: BlockTable, keeper: IndexKeeper, events: EventHub) -> None:
        self._table, self._keeper, self._events = table, keeper, events

    def drop(self, entries: Sequence[Entry], reason: str) -> None:
        """Forget ``entries`` (``reason``: "drop", "evict" or "corrupt", counted).
        Pinned ones free their slot at the last unpin; their frame lives on via
        the pins' references.  Lock held.

        Raises:
            DiskFull, StoreError: the index commit failed (memory is unchanged).
        """
        entries = [e for e in entries if not e.dead]
        on_disk = [e.key for e in entries if e.slot is not None and e.visible]
        in_host = [e.key for e in entries if e.frame is not None and e.visible]
        self._keeper.commit(deletes=on_disk)
        self._events.emit_removed(in_host, Tier.HOST)
        self._events.emit_removed(on_disk, Tier.NVME)
        counter = _COUNTED.get(reason)
        for e in entries:
            if self._table.forget(e):
                self._keeper.forget(e.key)
            if counter is not None:
                self._table.counters[counter] += 1
