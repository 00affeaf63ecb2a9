"""BlockTable: the one owner of a store's block metadata.

It holds every block's ``Entry`` by key, the host and NVMe LRUs, the blocks
dropped while pinned, the keys whose access time changed, the two-phase jobs
by handle, the call counters, and the lock that guards all of it.  The other
parts of a ``TieredStore`` (placement, I/O, the index keeper, the two-phase
jobs, the books) are handed this table and change block metadata only through
its methods.

Threads: any thread.  ``lock`` (re-entrant) owns every field here and every
``Entry`` field; each method below expects it held unless it says otherwise,
and so do ``counters`` (public, one count per event) and the two conditions:
``idle`` (no call in flight) and ``changed`` (a demotion, an index load or a
rebuild finished, or the store is closing).  A frame's reference count
(``FramePool``) and a slot's freedom (``NvmeTier``) change here only as part
of a pin, an unpin or a removal, under the same lock.

Lock order: ``lock`` -> the index keeper's lock -> the index's own write lock;
the host victim order ``Placement`` calls with ``lock`` held is the store's
``VictimSnapshot`` (store/tiered.py), which takes no lock and calls no one
(the owner's order is read by ``TieredStore.put_many``/``prepare_store``
before ``lock`` is taken).
"""
from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from types import MappingProxyType
from typing import Callable, Iterable, Iterator, Mapping, Sequence

from .entry import Entry
from .errors import StoreClosed, StoreError

COUNTERS = ("puts", "hits_host", "hits_nvme", "misses", "demotions", "evictions_dropped", "corrupt_dropped",
            "promotions", "staging_fallbacks")


class BlockTable:
    """Entries, LRUs, pins, handles and the store lock (see the module doc).

    ``pool`` is the host ``FramePool`` (pins hold frame references);
    ``nvme`` the ``NvmeTier`` (a removed block's slot is freed there)."""

    def __init__(self, pool, nvme) -> None:
        self.lock = threading.RLock()
        self.idle = threading.Condition(self.lock)
        self.changed = threading.Condition(self.lock)
        self.counters: dict[str, int] = dict.fromkeys(COUNTERS, 0)
        self._pool, self._nvme = pool, nvme
        self._closed = True
        self._busy = 0
        self._entries: dict[bytes, Entry] = {}
        self._host_lru: OrderedDict[bytes, None] = OrderedDict()
        self._nvme_lru: OrderedDict[bytes, None] = OrderedDict()
        self._dead: set[Entry] = set()
        self._touched: set[bytes] = set()
        self._handles: dict[int, object] = {}
        self._handle_ids = itertools.count(1)
        # get(k): the entry in memory under ``k`` (visible or pending), or None -- the dict's own
        # lookup, so a batch's per-key lookups cost no extra call
        self.get: Callable[[bytes], Entry | None] = self._entries.get

    # ------------------------------------------------------------ open, closed, calls in flight
    @property
    def closed(self) -> bool:
        """Read without the lock too (a flag)."""
        return self._closed

    def open(self) -> None:
        self._closed = False

    def shut(self) -> bool:
        """Mark the table closed; False if it already was."""
        if self._closed:
            return False
        self._closed = True
        return True

    def check_open(self) -> None:
        """Raises: StoreClosed after ``shut``."""
        if self._closed:
            raise StoreClosed("store is closed")

    @property
    def busy(self) -> int:
        """Calls in flight (between ``enter`` and ``leave``)."""
        return self._busy

    def enter(self) -> None:
        """Count a call in flight.  Raises: StoreClosed."""
        self.check_open()
        self._busy += 1

    def leave(self) -> None:
        self._busy -= 1
        if not self._busy:
            self.idle.notify_all()

    def wait_idle(self) -> None:
        """Wait until no call is in flight."""
        while self._busy:
            self.idle.wait()

    # ------------------------------------------------------------ entries
    def __contains__(self, k: bytes) -> bool:
        return k in self._entries

    def entries(self) -> Iterable[Entry]:
        """Every entry in memory (a live view: do not change the table while iterating)."""
        return self._entries.values()

    def mapping(self) -> Mapping[bytes, Entry]:
        """A read-only view of the entries by key."""
        return MappingProxyType(self._entries)

    def is_current(self, e: Entry) -> bool:
        return self._entries.get(e.key) is e

    def add_pending(self, entries: Mapping[bytes, Entry]) -> None:
        """New, invisible entries by key: concurrent stores of their keys skip them
        until they are published or aborted."""
        self._entries.update(entries)

    def adopt(self, e: Entry, front: bool) -> None:
        """A visible NVMe block from the index (``front``: at the LRU's old end)."""
        self._entries[e.key] = e
        self._nvme_lru[e.key] = None
        if front:
            self._nvme_lru.move_to_end(e.key, last=False)

    def publish(self, entries: Sequence[Entry], on_host: bool) -> None:
        """Make pending entries visible, newest in their tier's LRU."""
        for e in entries:
            e.visible = True
        (self._host_lru if on_host else self._nvme_lru).update(dict.fromkeys([e.key for e in entries]))

    def abort(self, entries: Sequence[Entry]) -> None:
        """Forget pending entries and free what they reserved."""
        for e in entries:
            if self._entries.get(e.key) is e:
                del self._entries[e.key]
            if e.frame is not None:
                self._pool.decref(e.frame)
                e.frame = None
            if e.slot is not None:
                self._nvme.free([e.slot])
                e.slot = None

    def forget(self, e: Entry) -> bool:
        """Remove ``e`` from memory: its frame's owner reference goes, its slot is
        freed -- at its last unpin if it is pinned (it is then ``dead``).
        Returns whether ``e`` was the entry under its key."""
        current = self._entries.get(e.key) is e
        if current:
            del self._entries[e.key]
        self._host_lru.pop(e.key, None)
        self._nvme_lru.pop(e.key, None)
        self._touched.discard(e.key)
        if e.frame is not None:
            self._pool.decref(e.frame)   # the owner's reference
            if e.pins == 0:
                e.frame = None
        if e.pins:
            e.dead = True
            self._dead.add(e)
        elif e.slot is not None:
            self._nvme.free([e.slot])
            e.slot = None
        return current

    def dead(self) -> Iterable[Entry]:
        """Blocks dropped while pinned, not yet unpinned."""
        return self._dead

    def dead_pinned_by_user(self, k: bytes) -> Entry | None:
        """A dropped block of key ``k`` that still holds a ``pin()``."""
        return next((d for d in self._dead if d.key == k and d.user_pins > 0), None)

    # ------------------------------------------------------------ recency
    def host_keys(self) -> Iterator[bytes]:
        """Host blocks' keys, least recently used first."""
        return iter(self._host_lru)

    def nvme_keys(self) -> Iterator[bytes]:
        """NVMe blocks' keys, least recently used first."""
        return iter(self._nvme_lru)

    def count_unpinned(self, keys: Iterator[bytes], need: int) -> int:
        """Unpinned blocks among ``keys``, counted up to ``need``."""
        n = 0
        entries = self._entries
        for k in keys:
            if entries[k].pins == 0:
                n += 1
                if n >= need:
                    break
        return n

    def touch(self, e: Entry, now: float) -> None:
        """A use of ``e``: newest in its LRUs; its access time is persisted at close."""
        e.last_access = now
        if e.frame is not None:
            self._host_lru.move_to_end(e.key)
        if e.slot is not None:
            self._nvme_lru.move_to_end(e.key)
            self._touched.add(e.key)

    def touched(self) -> list[Entry]:
        """Visible NVMe blocks whose access time changed since open."""
        out = []
        for k in self._touched:
            e = self._entries.get(k)
            if e is not None and e.slot is not None and e.visible:
                out.append(e)
        return out

    def on_nvme(self, e: Entry) -> None:
        """``e`` got an NVMe copy (a demotion): newest in the NVMe LRU."""
        self._nvme_lru[e.key] = None

    def release_frame(self, e: Entry) -> None:
        """``e`` leaves the host tier (its NVMe copy stays)."""
        self._host_lru.pop(e.key, None)
        self._pool.decref(e.frame)
        e.frame = None

    def release_slot(self, e: Entry) -> None:
        """``e`` leaves the NVMe tier (its host copy stays)."""
        self._nvme_lru.pop(e.key, None)
        self._nvme.free([e.slot])
        e.slot = e.checksum = None

    # ------------------------------------------------------------ pins
    def pin(self, e: Entry, user: bool = False) -> None:
        """Keep ``e`` from eviction; a host block's frame gains a reference.
        ``user``: a ``pin()`` call's (undone by ``unpin()``)."""
        e.pins += 1
        if user:
            e.user_pins += 1
        if e.frame is not None:
            self._pool.incref(e.frame)

    def pin_reads(self, ks: Sequence[bytes], find: Callable[[bytes], Entry | None],
                  now: float) -> tuple[list[tuple[int, Entry, int]], list[tuple[int, Entry, None]], int]:
        """A reader's pins on the visible blocks of ``ks`` (``find``: the lookup to use);
        each is used now.  Returns ``(host, nvme, misses)``: (request index, entry,
        frame) of the blocks in host frames -- the caller takes their frame
        references, batched -- (request index, entry, None) of the others, and
        how many keys missed."""
        host_lru, nvme_lru, touched = self._host_lru, self._nvme_lru, self._touched
        host: list[tuple[int, Entry, int]] = []
        nvme: list[tuple[int, Entry, None]] = []
        misses = 0
        for i, k in enumerate(ks):
            e = find(k)
            if e is None or not e.visible:
                misses += 1
                continue
            e.pins += 1
            e.last_access = now
            f = e.frame
            if f is not None:
                host_lru.move_to_end(k)
                host.append((i, e, f))
            else:
                nvme.append((i, e, None))
            if e.slot is not None:
                nvme_lru.move_to_end(k)
                touched.add(k)
        return host, nvme, misses

    def unpin(self, e: Entry, had_frame: int | None, user: bool = False) -> None:
        """Undo a pin (``had_frame``: the frame it held a reference on; ``user``:
        a ``pin()`` call's); a dead block's slot is freed at its last unpin.
        Raises: StoreError for an unpinned block."""
        if user:
            e.user_pins -= 1
        if e.pins <= 0:
            raise StoreError(f"unpin of an unpinned block {e.key.hex()}")
        e.pins -= 1
        if had_frame is not None:
            self._pool.decref(had_frame)
        if e.dead and e.pins == 0:
            self._dead.discard(e)
            if e.slot is not None:
                self._nvme.free([e.slot])
                e.slot = None

    def unpin_reads(self, *reads: Sequence[tuple[int, Entry, int | None]]) -> None:
        """Undo ``pin_reads`` (``reads``: the lists it returned; the frame references
        are returned by the caller)."""
        for batch in reads:
            for _, e, _ in batch:
                if e.pins > 0 and not e.dead:   # the common case; unpin frees dead blocks
                    e.pins -= 1
                else:
                    self.unpin(e, None)

    # ------------------------------------------------------------ two-phase jobs
    def add_job(self, job: object) -> int:
        """Keep ``job`` until it is taken; returns its handle."""
        h = next(self._handle_ids)
        self._handles[h] = job
        return h

    def take_job(self, handle: int, kind: type) -> object | None:
        """The job of ``handle`` if it is a ``kind``, removed from the table; else None."""
        job = self._handles.get(handle)
        if not isinstance(job, kind):
            return None
        del self._handles[handle]
        return job

    def jobs(self) -> Iterable[object]:
        """The jobs in flight."""
        return self._handles.values()
