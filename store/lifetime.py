"""Queries and lifetime control: contains/lookup/where/locate, pin/unpin, demote, drop.

Mixed into ``TieredStore``; each method takes the store lock.  Queries have
no side effects; ``pin``/``unpin``/``drop``/``demote`` are part of the
store's contract (``store/protocol.py``).
"""
from __future__ import annotations

from typing import Sequence

from .errors import StoreError
from .types import HostFrames, Tier


class Lifetime:
    """Queries, pins, demotion and drop (a mixin of ``TieredStore``)."""

    # ---------------------------------------------------------------- queries
    def contains(self, key) -> bool:
        """True if the block is stored (in any tier) and readable now."""
        k = self._key(key)
        with self._lock:
            self._check_open()
            e = self._find(k)
            return e is not None and e.visible

    def lookup(self, keys: Sequence) -> int:
        """Length of the longest prefix of ``keys`` that is stored.  No side effects."""
        ks = [self._key(k) for k in keys]
        with self._lock:
            self._check_open()
            find = self._find if self._loading else self._entries.get
            n = 0
            for k in ks:
                e = find(k)
                if e is None or not e.visible:
                    break
                n += 1
            return n

    def where(self, key) -> frozenset[Tier]:
        """Tiers currently holding the block (empty if none)."""
        k = self._key(key)
        with self._lock:
            self._check_open()
            e = self._find(k)
            if e is None or not e.visible:
                return frozenset()
            return frozenset(t for t, has in ((Tier.HOST, e.frame is not None),
                                              (Tier.NVME, e.slot is not None)) if has)

    def host_mask(self, keys: Sequence) -> list[bool]:
        """For each key, whether its block is in the host tier now: ``where``
        for many keys under one lock hold.  Raises BadKey, StoreClosed."""
        ks = [self._key(k) for k in keys]
        with self._lock:
            self._check_open()
            find = self._find if self._loading else self._entries.get
            out = []
            for k in ks:
                e = find(k)
                out.append(e is not None and e.visible and e.frame is not None)
            return out

    def host_frames(self) -> HostFrames:
        """Host frames in all and in use, and the demotions counted so far,
        without ``stats()``'s scan of every block.  Raises StoreClosed."""
        with self._lock:
            self._check_open()
            return HostFrames(self._pool.n_frames, self._pool.used_count, self._counters["demotions"])

    def locate(self, key) -> tuple[str, int] | None:
        """(slab file path, byte offset) of a block's NVMe copy, or None.
        For tools and fault-injection tests; the store itself never needs it."""
        k = self._key(key)
        with self._lock:
            self._check_open()
            e = self._find(k)
            if e is None or not e.visible or e.slot is None:
                return None
            path, off = self._nvme.locate(e.slot)
            return str(path), off

    # ---------------------------------------------------------------- pins, demote, drop
    def pin(self, keys: Sequence) -> int:
        """Protect stored blocks from eviction (e.g. a prefix shared by live
        trajectories).  Returns how many were pinned; pins nest; undo with ``unpin``."""
        ks = [self._key(k) for k in keys]
        with self._lock:
            self._check_open()
            n = 0
            for k in ks:
                e = self._find(k)
                if e is not None and e.visible:
                    self._pin(e)
                    e.user_pins += 1
                    n += 1
            return n

    def unpin(self, keys: Sequence) -> None:
        """Undo one ``pin`` per key.  A block dropped while pinned stays
        unpinnable even after its key was stored again: its older pins are
        released first, and the last one frees its frame and slot.  Raises
        ``StoreError`` for a key with no ``pin`` to undo (nothing changed for
        that key; keys before it were unpinned)."""
        ks = [self._key(k) for k in keys]
        with self._lock:
            self._check_open()
            for k in ks:
                e = next((d for d in self._dead if d.key == k and d.user_pins > 0), None)
                if e is None:
                    e = self._find(k)
                if e is None or e.user_pins == 0:
                    raise StoreError(f"unpin of a block that is not pinned: {k.hex()}")
                e.user_pins -= 1
                self._unpin(e, e.frame)

    def demote(self, keys: Sequence, keep_host: bool = False) -> int:
        """Write host-resident blocks to NVMe (lease-based demotion); unless
        ``keep_host``, their host frames are freed.  Pinned blocks keep their
        frames.  Returns how many blocks are now on NVMe that were not before."""
        ks = [self._key(k) for k in keys]
        with self._lock:
            self._check_open()
            todo = []
            for k in ks:
                e = self._find(k)
                if e is not None and e.visible and e.frame is not None and e.slot is None and e not in todo:
                    todo.append(e)
            done = self._demote(todo) if todo else []
            if not keep_host:
                for k in dict.fromkeys(ks):
                    e = self._find(k)
                    if e is not None and e.frame is not None and e.slot is not None and e.pins == 0:
                        self._release_frame(e)
            return len(done)

    def drop(self, keys: Sequence) -> int:
        """Forget blocks in every tier (they are recomputable).  Returns how many
        were dropped; a pinned block disappears now and frees its space at the last unpin."""
        ks = [self._key(k) for k in keys]
        with self._lock:
            self._check_open()
            es = [e for e in map(self._find, dict.fromkeys(ks)) if e is not None and e.visible]
            self._drop(es, reason="drop")
            return len(es)
