"""Queries and lifetime control: contains/lookup/where/locate, pin/unpin, demote, drop.

The bodies of ``TieredStore``'s query and lifetime methods (their contracts:
``store/protocol.py`` and ``TieredStore``'s docstrings); keys come validated.
Queries have no side effects.

Threads: any store caller thread; each method takes the store lock
(``BlockTable.lock``) for its whole run -- ``demote`` releases it while the
slab writes run (``Placement.demote``).  ``Lifetime`` holds no state of its own.
Lock order: store lock -> index keeper -> the index's write lock.
"""
from __future__ import annotations

from .blocks import BlockTable
from .errors import StoreError
from .expiry import Expiry
from .indexing import IndexKeeper
from .placement import Placement
from .types import HostFrames, Tier


class Lifetime:
    """Queries, pins, demotion and drop over the store's ``BlockTable``."""

    def __init__(self, table: BlockTable, keeper: IndexKeeper, placement: Placement, expiry: Expiry,
                 pool, nvme) -> None:
        self._table, self._keeper, self._placement, self._expiry = table, keeper, placement, expiry
        self._pool, self._nvme = pool, nvme

    # ---------------------------------------------------------------- queries
    def contains(self, k: bytes) -> bool:
        """True if the block is stored (in any tier) and readable now."""
        with self._table.lock:
            self._table.check_open()
            e = self._keeper.find(k)
            return e is not None and e.visible

    def lookup(self, ks: list[bytes]) -> int:
        """Length of the longest prefix of ``keys`` that is stored.  No side effects."""
        with self._table.lock:
            self._table.check_open()
            find = self._keeper.finder()
            n = 0
            for k in ks:
                e = find(k)
                if e is None or not e.visible:
                    break
                n += 1
            return n

    def where(self, k: bytes) -> frozenset[Tier]:
        """Tiers currently holding the block (empty if none)."""
        with self._table.lock:
            self._table.check_open()
            e = self._keeper.find(k)
            if e is None or not e.visible:
                return frozenset()
            return frozenset(t for t, has in ((Tier.HOST, e.frame is not None),
                                              (Tier.NVME, e.slot is not None)) if has)

    def host_mask(self, ks: list[bytes]) -> list[bool]:
        """For each key, whether its block is in the host tier now: ``where``
        for many keys under one lock hold.  Raises BadKey, StoreClosed."""
        with self._table.lock:
            self._table.check_open()
            find = self._keeper.finder()
            out = []
            for k in ks:
                e = find(k)
                out.append(e is not None and e.visible and e.frame is not None)
            return out

    def host_frames(self) -> HostFrames:
        """Host frames in all and in use, and the demotions counted so far,
        without ``stats()``'s scan of every block.  Raises StoreClosed."""
        with self._table.lock:
            self._table.check_open()
            return HostFrames(self._pool.n_frames, self._pool.used_count, self._table.counters["demotions"])

    def locate(self, k: bytes) -> tuple[str, int] | None:
        """(slab file path, byte offset) of a block's NVMe copy, or None.
        For tools and fault-injection tests; the store itself never needs it."""
        with self._table.lock:
            self._table.check_open()
            e = self._keeper.find(k)
            if e is None or not e.visible or e.slot is None:
                return None
            path, off = self._nvme.locate(e.slot)
            return str(path), off

    # ---------------------------------------------------------------- pins, demote, drop
    def pin(self, ks: list[bytes]) -> int:
        """Protect stored blocks from eviction (e.g. a prefix shared by live
        trajectories).  Returns how many were pinned; pins nest; undo with ``unpin``."""
        with self._table.lock:
            self._table.check_open()
            n = 0
            for k in ks:
                e = self._keeper.find(k)
                if e is not None and e.visible:
                    self._table.pin(e, user=True)
                    n += 1
            return n

    def unpin(self, ks: list[bytes]) -> None:
        """Undo one ``pin`` per key.  A block dropped while pinned stays
        unpinnable even after its key was stored again: its older pins are
        released first, and the last one frees its frame and slot.  Raises
        ``StoreError`` for a key with no ``pin`` to undo (nothing changed for
        that key; keys before it were unpinned)."""
        with self._table.lock:
            self._table.check_open()
            for k in ks:
                e = self._table.dead_pinned_by_user(k)
                if e is None:
                    e = self._keeper.find(k)
                if e is None or e.user_pins == 0:
                    raise StoreError(f"unpin of a block that is not pinned: {k.hex()}")
                self._table.unpin(e, e.frame, user=True)

    def demote(self, ks: list[bytes], keep_host: bool = False) -> int:
        """Write host-resident blocks to NVMe (lease-based demotion); unless
        ``keep_host``, their host frames are freed.  Pinned blocks keep their
        frames.  Returns how many blocks are now on NVMe that were not before."""
        with self._table.lock:
            self._table.check_open()
            todo = []
            for k in ks:
                e = self._keeper.find(k)
                if e is not None and e.visible and e.frame is not None and e.slot is None and e not in todo:
                    todo.append(e)
            done = self._placement.demote(todo) if todo else []
            if not keep_host:
                for k in dict.fromkeys(ks):
                    e = self._keeper.find(k)
                    if e is not None and e.frame is not None and e.slot is not None and e.pins == 0:
                        self._placement.release_frame(e)
            return len(done)

    def drop(self, ks: list[bytes]) -> int:
        """Forget blocks in every tier (they are recomputable).  Returns how many
        were dropped; a pinned block disappears now and frees its space at the last unpin."""
        with self._table.lock:
            self._table.check_open()
            es = [e for e in map(self._keeper.find, dict.fromkeys(ks)) if e is not None and e.visible]
            self._expiry.drop(es, reason="drop")
            return len(es)
