"""Retention in vLLM's own KV cache: a paused trajectory's blocks held for its lease.

The seed's first option for a pause is to keep its state resident.  When the
policy answers ``retain`` for the pause that starts as a request finishes,
:class:`BlockHolds` takes one reference on each of the request's full blocks in
the engine's block pool (the connector API's ``bind_gpu_block_pool``: "inc/dec
ref counts").  The scheduler then frees the request as usual, but a held block
is neither free nor evictable: it stays in vLLM's prefix cache, so the
trajectory's next request finds its whole prefix there (a device hit: no load,
no recompute).  The blocks also went on to the CPU tier below as they always
do, so releasing a hold early loses nothing: the next request loads them.

A hold ends (its references dropped, the blocks back in the free queue as
cached blocks, evictable) at:

* ``LEASE``: the lease the policy gave (``demote_at_s``), on the lifecycle's clock;
  checked at every engine step (an idle engine needs no blocks, so a lease that
  ends while it is idle is released at its next step);
* ``PRESSURE``: a waiting request the free blocks cannot take, or a running one
  that cannot grow (vLLM asks ``has_pending_block_frees`` before it preempts);
  the hold whose lease ends last goes first;
* ``STALL``: the engine scheduled nothing for a while with holds in place (a
  request is waiting for blocks in a way no hook above saw): one at a time,
  the last lease first, until it schedules again;
* ``CAP``: a new hold would take the held blocks past ``share`` of the pool;
* ``RESUMED``: the trajectory's next request was allocated (it holds the blocks now);
* ``REPLACED``: the trajectory finished another request while still held;
* ``REPLANNED``: a router's retag planned the pause again, and its new plan does
  not retain it (one that still does keeps the hold, on the new plan's lease);
* ``ERROR``, ``SHUTDOWN``, ``RESET``: a fault in kvtier (the firewall's rule: a
  fault releases, never raises), the engine stopping, or a prefix-cache reset.

Why references and not ``delay_free_blocks``: a request whose blocks the
connector delays stays in the scheduler's ``requests``, and vLLM 0.32's
``has_finished_requests`` then keeps the engine loop stepping (every 1 ms) for
as long as it is held; its release also has to travel through the worker's
``get_finished``.  A reference needs neither, and is released the moment it
must be.

Threads: every method runs on vLLM's scheduler thread (the connector's
scheduler-side calls), except :meth:`counts`, which any thread may call
(the counters are read under ``_lock``).
"""
from __future__ import annotations

import enum
import math
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence


class Release(str, enum.Enum):
    """Why a hold ended."""
    LEASE = "lease"
    PRESSURE = "pressure"
    STALL = "stall"
    CAP = "cap"
    RESUMED = "resumed"
    REPLACED = "replaced"
    REPLANNED = "replanned"
    ERROR = "error"
    SHUTDOWN = "shutdown"
    RESET = "reset"

    def __str__(self) -> str:
        return self.value


@dataclass
class Hold:
    """One held pause: the blocks (vLLM ``KVCacheBlock`` objects, tail first:
    the order they are freed in), their ids, when it was taken and when its
    lease ends (the lifecycle clock's seconds; ``inf``: no lease)."""
    tid: str
    blocks: list
    ids: frozenset
    since: float
    until: float


class BlockHolds:
    """Held pauses in one engine's block pool (see the module doc).

    ``share``: the most of the pool's blocks held at once (0 < share < 1);
    ``clock``: the lifecycle clock's ``now`` (lease ends are on it).  Nothing
    is held until :meth:`bind` gives the pool."""

    def __init__(self, share: float, clock: Callable[[], float]) -> None:
        if not (0.0 < share < 1.0):
            raise ValueError(f"hold share must be in (0, 1), got {share!r}")
        self.share, self._now = float(share), clock
        self._pool: Any = None
        self._holds: dict[str, Hold] = {}
        self._held = 0
        self._lock = threading.Lock()
        self._c = {"holds": 0, "refused": 0, "served_resumes": 0, "served_blocks": 0, "peak_blocks": 0}
        self._released: dict[str, int] = {str(r): 0 for r in Release}

    # ------------------------------------------------------------ binding
    def bind(self, block_pool: Any) -> None:
        """The engine's ``BlockPool`` (from ``bind_gpu_block_pool``)."""
        self._pool = block_pool

    @property
    def capacity(self) -> int:
        """Blocks that may be held at once (0 before :meth:`bind`)."""
        if self._pool is None:
            return 0
        return int(self.share * (len(self._pool.blocks) - 1))   # less the null block

    @property
    def held_blocks(self) -> int:
        return self._held

    def held(self, tid: str) -> bool:
        return tid in self._holds

    def held_count(self, tid: str) -> int:
        """Blocks ``tid``'s hold keeps (0: none)."""
        h = self._holds.get(tid)
        return 0 if h is None else len(h.blocks)

    def free_blocks(self) -> int:
        """The pool's free blocks (held ones are not)."""
        return 0 if self._pool is None else int(self._pool.get_num_free_blocks())

    def usage(self) -> float:
        """The pool's use in [0, 1], held blocks included (vLLM's ``get_usage``);
        0 before :meth:`bind`.  Any thread (one integer read)."""
        return 0.0 if self._pool is None else float(self._pool.get_usage())

    # ------------------------------------------------------------ holding
    def hold(self, tid: str, block_ids: Iterable[Sequence[int]], lease_s: float | None) -> int:
        """Hold ``tid``'s blocks (``block_ids``: one list per KV-cache group, as
        ``request_finished_all_groups`` gives them) for ``lease_s`` seconds of
        the lifecycle clock (None: until something else ends it).  Only full
        blocks are held (a partial block is never a prefix hit).  A hold that
        would pass the cap first releases the holds whose leases end last;
        one larger than the cap is refused.  Returns the blocks held (0: none).
        Raises what vLLM's pool raises (the caller's firewall releases all)."""
        if self._pool is None:
            return 0
        if tid in self._holds:
            self.release(tid, Release.REPLACED)
        seen: set[int] = set()
        blocks = []
        for group in block_ids:
            for bid in group:
                b = self._pool.blocks[bid]
                if b.is_null or b.block_hash is None or bid in seen:
                    continue
                seen.add(bid)
                blocks.append(b)
        n = len(blocks)
        if n == 0:
            return 0
        cap = self.capacity
        if n > cap:
            self._count("refused")
            return 0
        while self._held + n > cap and self._holds:
            self.release(self._last_lease(), Release.CAP)
        self._pool.touch(blocks)
        now = self._now()
        self._holds[tid] = Hold(tid, blocks[::-1], frozenset(seen), now, _lease_end(now, lease_s))
        self._held += n
        with self._lock:
            self._c["holds"] += 1
            self._c["peak_blocks"] = max(self._c["peak_blocks"], self._held)
        return n

    def relet(self, tid: str, lease_s: float | None) -> bool:
        """``tid``'s hold now ends ``lease_s`` after it was taken (its pause was planned
        again); a lease already past is released at the next :meth:`release_due`.
        False if ``tid`` is not held."""
        h = self._holds.get(tid)
        if h is None:
            return False
        h.until = _lease_end(h.since, lease_s)
        return True

    def release(self, tid: str, why: Release) -> int:
        """End ``tid``'s hold (its blocks back in the free queue, still cached).  Returns blocks released."""
        h = self._holds.pop(tid, None)
        if h is None:
            return 0
        self._held -= len(h.blocks)
        with self._lock:
            self._released[str(why)] += 1
        self._pool.free_blocks(h.blocks)
        return len(h.blocks)

    def release_all(self, why: Release) -> int:
        """End every hold.  Returns blocks released."""
        return sum(self.release(tid, why) for tid in list(self._holds))

    def release_due(self) -> int:
        """End the holds whose leases have ended.  Returns blocks released."""
        if not self._holds:
            return 0
        now = self._now()
        return sum(self.release(h.tid, Release.LEASE) for h in list(self._holds.values()) if h.until <= now)

    def make_room(self, needed: int, *, keep: str | None = None, why: Release = Release.PRESSURE) -> int:
        """Release holds (counted as ``why``), the one whose lease ends last first,
        until ``needed`` blocks are free or nothing else is held (``keep``: a
        trajectory whose hold stays: the request being placed is its own resume).
        Returns blocks released."""
        out = 0
        while self.free_blocks() < needed:
            tid = self._last_lease(skip=keep)
            if tid is None:
                break
            out += self.release(tid, why)
        return out

    def resumed(self, tid: str, block_ids: Iterable[Sequence[int]]) -> int:
        """``tid``'s next request was allocated ``block_ids``: count the held blocks
        it took from its hold (a resume served on the device) and end the hold.
        Returns the blocks it took."""
        h = self._holds.get(tid)
        if h is None:
            return 0
        took = sum(1 for group in block_ids for bid in group if bid in h.ids)
        if took:
            with self._lock:
                self._c["served_resumes"] += 1
                self._c["served_blocks"] += took
        self.release(tid, Release.RESUMED)
        return took

    def _last_lease(self, skip: str | None = None) -> str | None:
        best: Hold | None = None
        for h in self._holds.values():
            if h.tid != skip and (best is None or h.until > best.until):
                best = h
        return None if best is None else best.tid

    def _count(self, name: str) -> None:
        with self._lock:
            self._c[name] += 1

    # ------------------------------------------------------------ reading
    def counts(self) -> dict[str, Any]:
        """``held_blocks``/``held_pauses`` now, ``capacity``, and the counters:
        ``holds``, ``refused`` (larger than the cap), ``served_resumes`` and
        ``served_blocks`` (resumes whose prefix came from a hold), ``peak_blocks``,
        ``released`` by cause.  Any thread."""
        with self._lock:
            return {"held_blocks": self._held, "held_pauses": len(self._holds), "capacity": self.capacity,
                    **self._c, "released": dict(self._released)}


def _lease_end(start: float, lease_s: float | None) -> float:
    """When a lease of ``lease_s`` seconds from ``start`` ends (None or not finite: never)."""
    return math.inf if lease_s is None or not math.isfinite(lease_s) else start + max(0.0, lease_s)
