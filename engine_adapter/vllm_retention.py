"""The connector's side of retention: which finished requests' blocks to hold in
vLLM's KV cache, and when to let them go (:mod:`kvtier.engine_adapter.vllm_holds`).

:class:`Retention` is called by ``KvtierConnector`` at the scheduler's hooks:

* ``finished``: a request finished; if the policy retains the pause it starts
  (``Lifecycle.retained``), its full blocks are held for the lease;
* ``waiting``: the scheduler considers a waiting request (its local prefix hit
  known): holds give way, the last lease first, until the free blocks cover
  every block vLLM may ask for it (its whole sequence, evictable cached hits
  included, less the hits its own hold keeps) and vLLM's watermark, so a hold
  never queues a request for blocks;
* ``blocked``: a running request cannot grow (vLLM asks before preempting):
  one hold gives way and the scheduler waits a step instead of preempting;
* ``allocated``: a request was allocated: its trajectory's hold (a resume) ends,
  counted as served by the hold when it took held blocks;
* ``step``: every engine step: a hold whose pause a router's retag planned again
  follows the new plan (released if it no longer retains, else on its lease);
  holds whose leases ended are released, and an
  engine that has scheduled nothing for ``stall_s`` while it holds (a request
  waits for blocks no hook saw it need) releases a hold a step until it
  schedules again: a hold never stalls the engine;
* ``close`` (shutdown), ``reset`` (prefix-cache reset).

Each call is guarded: an exception releases every hold and is counted by the
tier's firewall; nothing raises into the scheduler.

Threads: vLLM's scheduler thread, for every call.
"""
from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any, Callable

from kvtier.engine_adapter.vllm_holds import BlockHolds, Release

if TYPE_CHECKING:
    from kvtier.engine_adapter.vllm import KvtierTier


def _ids_of(blocks: Any) -> tuple:
    """A ``KVCacheBlocks`` (or the block-id tuple vLLM hands ``request_finished``) as lists of ids per group."""
    get = getattr(blocks, "get_block_ids", None)
    return tuple(get()) if get is not None else tuple(blocks)


class Retention:
    """See the module doc.  ``tier``: kvtier's tier (its lifecycle decides, its
    firewall counts faults); ``holds``: the engine's held blocks; ``block_tokens``:
    tokens per engine block; ``groups``: KV-cache groups (a token takes a block
    slot in each); ``watermark_blocks``: vLLM's admission headroom; ``stall_s``:
    seconds of steps that schedule nothing after which holds give way;
    ``clock``: monotonic seconds (the stall is on real time)."""

    STALL_S = 1.0

    def __init__(self, tier: "KvtierTier", holds: BlockHolds, *, block_tokens: int, groups: int = 1,
                 watermark_blocks: int = 0, stall_s: float = STALL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.tier, self.holds = tier, holds
        self.block_tokens, self.groups, self.watermark = int(block_tokens), max(1, int(groups)), int(watermark_blocks)
        self.stall_s, self._clock = float(stall_s), clock
        self._idle_since: float | None = None

    @classmethod
    def of(cls, tier: "KvtierTier | None", block_pool: Any, *, block_tokens: int, groups: int = 1,
           watermark_blocks: int = 0) -> "Retention | None":
        """Retention over ``block_pool`` for ``tier`` (its holds' counters joined to the
        tier's), or None where nothing is held: no kvtier tier, ``hold_share`` 0, or
        no forecast lifecycle to decide."""
        if tier is None or tier.cfg.hold_share <= 0 or getattr(tier.lifecycle, "controller", None) is None:
            return None
        holds = BlockHolds(tier.cfg.hold_share, tier.lifecycle.now)
        holds.bind(block_pool)
        tier.attach_holds(holds)
        return cls(tier, holds, block_tokens=block_tokens, groups=groups, watermark_blocks=watermark_blocks)

    def _guard(self, what: str, fn: Callable[[], Any], fallback: Any = None) -> Any:
        try:
            return fn()
        except Exception as exc:
            self.tier.firewall.contain(f"retention.{what}", exc)
            try:
                self.holds.release_all(Release.ERROR)
            except Exception as exc2:
                self.tier.firewall.contain("retention.release", exc2)
            return fallback

    def finished(self, request: Any, block_ids: Any) -> None:
        def go() -> None:
            tid = self.tier.trajectory_of(request.request_id)
            if tid is None:
                return
            keep = self.tier.lifecycle.retained(tid)
            if keep is None:
                if self.holds.held(tid):
                    self.holds.release(tid, Release.REPLACED)
                return
            self.holds.hold(tid, _ids_of(block_ids), keep.lease_s)
        self._guard("finished", go)

    def waiting(self, request: Any, num_computed_tokens: int) -> None:
        def go() -> None:
            if not self.holds.held_blocks:
                return
            tid = self.tier.trajectory_of(request.request_id)
            need = self.blocks_for(request, num_computed_tokens, tid) + self.watermark + 1
            if self.holds.free_blocks() < need:
                self.holds.make_room(need, keep=tid if num_computed_tokens > 0 else None)
        self._guard("waiting", go)

    def blocks_for(self, request: Any, num_computed_tokens: int, tid: str | None) -> int:
        """The most free blocks vLLM may ask to admit ``request``: a slot per group
        for each block of its whole sequence (vLLM reserves the full input, and a
        cached hit that is free counts as one to allocate), less the hit blocks
        its trajectory's own hold keeps out of the free queue."""
        total = self.groups * math.ceil(max(int(request.num_tokens), 1) / self.block_tokens)
        own = self.holds.held_count(tid) if tid is not None else 0
        hit = self.groups * (max(int(num_computed_tokens), 0) // self.block_tokens)
        return max(total - min(own, hit), 1)

    def blocked(self) -> bool:
        """A running request cannot grow: release the hold whose lease ends last.
        True if blocks were freed (the scheduler then waits a step, no preemption)."""
        def go() -> bool:
            if not self.holds.held_blocks:
                return False
            return self.holds.make_room(self.holds.free_blocks() + 1) > 0
        return bool(self._guard("blocked", go, False))

    def allocated(self, request: Any, blocks: Any) -> None:
        def go() -> None:
            tid = self.tier.trajectory_of(request.request_id)
            if tid is not None and self.holds.held(tid):
                self.holds.resumed(tid, _ids_of(blocks))
        self._guard("allocated", go)

    def step(self, scheduled_tokens: int) -> None:
        """An engine step that scheduled ``scheduled_tokens``."""
        def go() -> None:
            for tid in self.tier.lifecycle.take_replanned():
                if self.holds.held(tid):
                    keep = self.tier.lifecycle.retained(tid)
                    if keep is None:
                        self.holds.release(tid, Release.REPLANNED)
                    else:
                        self.holds.relet(tid, keep.lease_s)
            self.holds.release_due()
            if scheduled_tokens > 0 or not self.holds.held_blocks:
                self._idle_since = None
                return
            now = self._clock()
            if self._idle_since is None:
                self._idle_since = now
            elif now - self._idle_since >= self.stall_s:
                self.holds.make_room(self.holds.free_blocks() + 1, why=Release.STALL)
        self._guard("step", go)

    def close(self, why: Release = Release.SHUTDOWN) -> None:
        self._guard("close", lambda: self.holds.release_all(why))
