"""The lifecycle controller: a tool-wait forecast carried out on the store over time.

One controller per store.  The engine plugins (vLLM, SGLang, the HF hook)
feed it hints and pauses; it asks its :class:`~.schedules.Schedule` once per
pause and then acts on the store through the ``BlockStore`` protocol only::

    engine thread (cheap, no I/O)         kvtier threads (store I/O)
    -----------------------------         --------------------------------------
    hint(tid, tool)                       make_room(n)   host victims -> NVMe,
    plan_blocks(tid, keys, tpb) -> Plan                  by forecast (largest
      (a store job: its blocks, its plan)                victim_key first)
    pause(tid)      -> timers             tick()         LEASE  -> re-ask policy
    resume(tid)     -> observed wait,                    DEMOTE -> host -> NVMe
                       learned by the policy             STAGE  -> NVMe -> host frames
                       before its next answer            EXPIRE -> drop
                       (learn(): each tick, and first in every schedule answer;
                       a caller without a timer thread calls it after resume)

Engine-facing methods take the controller's lock, touch only the registry
and the schedule (a policy's ``decide`` is cheap and never blocks), and
never raise for a trajectory they do not know.  Store I/O runs in
:meth:`make_room` (before a staging into host frames, or by a caller that
wants room ahead of a write; the plugins' own host writes take frames as the
store makes room) and :meth:`tick` (the :class:`~.timer.LifecycleTimer`
thread, or a test driving a :class:`~.clock.ManualClock`).

The HF hook, which keeps a retained cache on its device and runs its own
device reload, passes :class:`~.device.DeviceHooks`: a lease end of a
``Tier.DEVICE`` pause and an ``Event.RELOAD`` timer go to it.

The registry, the schedule and the timers' dispatch are
:class:`~.core.ControllerCore`'s, shared with the simulator's controller
(``bench/sim/lifecycle.py``); this class is that core holding
:class:`~.moves.StoreMoves` (its :class:`~.backend.Moves`), which with the
:class:`~.pruning.Pruner` and the store's victim order (:mod:`.victims`)
works on the core's :class:`~.shared.Shared` view, not on the controller::

    LifecycleController (ControllerCore)      engine calls, timers, dispatch
      |-- shared: Shared                      registry + lock, clock, counters
      |-- moves: StoreMoves(store, shared)    demote / stage / drop / make room
      |     |-- io: YieldingStore             store calls in slices, engine loads first
      |     |-- pruner: Pruner                forgets idle trajectories (ticks)
      |-- victims: OversizeVictims | None     the store's host victim order

Threading: every public method is thread-safe.  Locks: ``Shared.lock``
(``_lock``) owns the registry, every trajectory in it and the moves' notes
(stagings to retry, displaced and released trajectories); ``_io`` serialises
move sequences (``tick``, ``settle``, ``make_room``); the moves call the store
holding ``_io`` but never ``_lock``.  Under a forecast schedule a store writer
reads the victim order (which takes ``_lock``) *before* it takes the store's
lock, never under it: the lock order is ``_io`` -> store lock, and ``_lock`` is
never held together with the store's lock.
"""
from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Callable

from .clock import Clock
from .core import _PLAN, ControllerCore  # noqa: F401  (_PLAN: pause()'s default, re-exported)
from .device import DeviceHooks
from .foreground import Foreground
from .moves import StoreMoves
from .pruning import Pruner
from .schedules import Schedule
from .victims import OversizeVictims

if TYPE_CHECKING:  # the protocol has no dependencies; imported for types only
    from kvtier.store.protocol import BlockStore


class LifecycleController(ControllerCore):
    """See the module doc.

    store:        the BlockStore the plugin writes to (demote, prepare_load /
                  complete_load, drop, stats are used).
    schedule:     a Schedule (ForecastSchedule over a policy, or TTLSchedule).
    clock:        a Clock; MonotonicClock by default.
    price_bytes:  tokens -> the KV bytes a policy should price a pause at
                  (default: the blocks' stored bytes).
    host_price_bytes: the host DRAM the policy's hardware model has; a pause's
                  ``host_free_bytes`` is that times the free share of the store's
                  host frames, so the policy sees kvtier's host tier fill up
                  (None: ``host_free_bytes`` is left unbounded).
    pool_price_bytes: the engine's KV pool the policy's hardware model has; a
                  pause's ``hbm_pressure`` is every paused trajectory's KV over
                  it, at most 1 (None: 0).
    pruner:       forgets idle trajectories on the ticks (:class:`~.pruning.Pruner`;
                  default: untouched 600 clock seconds with nothing in host frames,
                  at most 20,000 trajectories).
    Raises ValueError for ``block_bytes <= 0`` or ``pool_price_bytes <= 0``.
    """

    def __init__(self, store: "BlockStore", schedule: Schedule, *, clock: Clock | None = None,
                 block_bytes: int, price_bytes: Callable[[int], int] | None = None,
                 host_price_bytes: float | None = None, pool_price_bytes: float | None = None,
                 history: int = 1024, device: DeviceHooks | None = None, pruner: Pruner | None = None) -> None:
        pruner = Pruner() if pruner is None else pruner
        super().__init__(schedule, clock=clock, block_bytes=block_bytes, price_bytes=price_bytes,
                         host_price_bytes=host_price_bytes, pool_price_bytes=pool_price_bytes,
                         history=history, device=device,
                         moves=lambda shared: StoreMoves(store, shared, schedule, block_bytes=block_bytes,
                                                         pruner=pruner))
        self.moves: StoreMoves
        self.store = store
        try:                                   # now (a store with no host frames is full from the start)
            f = store.host_frames()
            self.shared.note_fill(int(f.total), int(f.used))
        except Exception:                      # a broken store: refreshed at the next tick
            pass
        # a forecast schedule also orders the store's own evictions (an engine's host write): victims.py
        if schedule.oversize_victims:
            self.victims = OversizeVictims(self.moves)
            store.set_host_victim_order(self.victims)

    # ------------------------------------------------------------ the plugins' settings of the moves
    @property
    def foreground(self) -> Foreground | None:
        """The engine-load gate the moves yield to (None: they never wait)."""
        return self.moves.io.foreground

    @foreground.setter
    def foreground(self, fg: Foreground | None) -> None:
        self.moves.io.foreground = fg

    @property
    def move_log(self) -> deque | None:
        """A deque receiving ``(t0, t1, kind, tid, blocks)`` per store move (None: not recorded)."""
        return self.moves.io.move_log

    @move_log.setter
    def move_log(self, log: deque | None) -> None:
        self.moves.io.move_log = log

    # ------------------------------------------------------------ kvtier side (store I/O)
    def make_room(self, n_blocks: int, *, for_tid: str | None = None) -> bool:
        """Free host frames for ``n_blocks`` more blocks by demoting paused
        trajectories, largest ``victim_key`` first -- and only those whose key
        is larger than ``for_tid``'s own (a pause never displaces one the
        forecast wants more).  Nothing is demoted when the room cannot be made
        that way.  Returns whether the room is there now.  Never raises."""
        with self._io:
            return self.moves.make_room(n_blocks, for_tid)
