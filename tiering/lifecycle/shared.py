"""What the lifecycle core shares with its collaborators: the narrow view.

The core (:class:`~.core.ControllerCore`) owns the registry, its lock and the
clock; its moves (:class:`~.backend.Moves`), the pruner and the store's victim
order work on the same trajectories.  They get this object, not the
controller: the registry under ``lock``, the clock, the counters, the host
fill the policy is shown, and the few core services a move needs (record an
event, a trajectory's victim key, the way back after an eviction, a wake of
the timer thread).  The services are the core's, bound when it is built.

Threading: ``reg`` and every :class:`~.registry.Trajectory` in it are owned
by ``lock``; ``key``, ``restage_at`` and ``order_changed`` are called with ``lock`` held,
``event`` with or without it, ``plan_return`` and ``wake`` without it.  The
fill notes (``host_frames``, ``host_free_share``, ``tokens_per_block``) are
plain floats written by one thread at a time (the lifecycle's, or a store
job's ``plan_blocks``) and read without a lock.
"""
from __future__ import annotations

import threading
from collections import Counter
from typing import Callable

from .clock import Clock
from .registry import Registry, Trajectory


class Shared:
    """See the module doc.  Built by :class:`~.core.ControllerCore`."""

    def __init__(self, reg: Registry, clock: Clock, *, event: Callable[[Trajectory, str, "str | Callable[[], str]"], None],
                 key: Callable[[Trajectory, float], float], plan_return: Callable[[Trajectory], None],
                 order_changed: Callable[[], None],
                 restage_at: Callable[[Trajectory, float], float | None] = lambda t, now: now) -> None:
        self.reg = reg
        self.lock = threading.Lock()
        self.clock = clock
        self.counters: Counter[str] = Counter()
        self.event = event                  # (t, what, detail): one lifecycle event
        self.key = key                      # (t, now) -> the schedule's victim key (lock held)
        self.plan_return = plan_return      # (t): the schedule's way back after an eviction
        self.order_changed = order_changed  # the store's victim order is stale (lock held)
        self.restage_at = restage_at        # (t, now) -> clock time to stage t's pushed-out blocks, None: never (lock held)
        self.wake: Callable[[], None] = lambda: None   # a timer may be due earlier
        self.host_frames = 0                # the store's host frames (at the last fill read)
        self.host_free_share = 1.0          # their free share
        self.tokens_per_block = 0.0         # the plugin's tokens per block (0: not told yet)

    def note_fill(self, total: int, used: int) -> None:
        """The store's host frames now: ``total``, ``used``."""
        self.host_frames = total
        self.host_free_share = (total - used) / total if total > 0 else 0.0

    def current(self, t: Trajectory, no: int) -> bool:
        """``t`` is still in its pause number ``no`` (not resumed meanwhile).  Takes ``lock``."""
        with self.lock:
            return t.pause_no == no and t.paused_at is not None
