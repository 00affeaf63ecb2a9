"""The store as the lifecycle's moves call it: in slices, engine loads first, logged.

A move (a demotion, a staging, a release of a running trajectory's frames)
is many store calls.  :class:`YieldingStore` is how each of them is made by a
background move on a machine an engine is using:

* at most ``slice_bytes`` per call (:meth:`slice`, in blocks);
* before each, :meth:`yield_to_engine` waits (bounded) while the plugin's
  :class:`~.foreground.Foreground` gate says an engine load is in progress;
  a host-frame lookup (:meth:`host_mask`) does the same per ``MASK_STEP`` keys;
* each call is appended to ``move_log`` when one is set.

Threading: called from kvtier threads only (the lifecycle timer, a plugin's
I/O pool) with the core's ``_io`` held, never ``Shared.lock``; the store is
thread-safe.
"""
from __future__ import annotations

import logging
import time
from collections import deque
from typing import TYPE_CHECKING

from .foreground import Foreground
from .shared import Shared

if TYPE_CHECKING:  # the protocol has no dependencies; imported for types only
    from kvtier.store.protocol import BlockStore

log = logging.getLogger("kvtier.lifecycle")


class YieldingStore:
    """``store`` as the moves call it (see the module doc); ``shared``: the core's
    view (the host fill is noted there at each read of the frames).

    Attributes a plugin (or a replay) may set:
    ``foreground`` -- the engine-load gate (None: moves never wait);
    ``move_log`` -- a deque receiving ``(t0, t1, kind, tid, blocks)`` per
    store move in ``time.perf_counter`` seconds (None: not recorded);
    ``slice_bytes`` -- the most bytes one store call of a move handles.
    """

    slice_bytes: int = 2 << 20
    MASK_STEP = 256                  # keys looked up per step of host_mask between yields to engine loads

    def __init__(self, store: "BlockStore", shared: Shared, *, block_bytes: int) -> None:
        self.store = store
        self.block_bytes = int(block_bytes)
        self.foreground: Foreground | None = None
        self.move_log: deque | None = None
        self._shared = shared

    def slice(self) -> int:
        """Blocks per store call of a move."""
        return max(1, int(self.slice_bytes) // max(1, int(self.block_bytes)))

    def yield_to_engine(self) -> None:
        """Wait (bounded) while an engine load is in progress."""
        fg = self.foreground
        if fg is not None:
            fg.wait_idle()

    def log(self, kind: str, tid: str, blocks: int, t0: float) -> None:
        """Record one store move of ``tid`` that began at ``t0`` (``time.perf_counter``)."""
        ml = self.move_log
        if ml is not None:
            ml.append((t0, time.perf_counter(), kind, tid, blocks))

    def free_frames(self) -> int | None:
        """The store's free host frames now (None: it could not say); notes the fill."""
        try:
            f = self.store.host_frames()
        except Exception as exc:
            log.debug("kvtier: host_frames failed: %s", exc)
            return None
        total, used = int(f.total), int(f.used)
        self._shared.note_fill(total, used)
        return total - used

    def host_mask(self, keys: list[bytes]) -> list[bool]:
        """Which of ``keys`` are in host frames (``BlockStore.host_mask``, a step
        of keys per store call), waiting (bounded, like a slice) before a step
        while an engine load is in progress or an engine call was marked in the
        last ``quiet_s`` (:meth:`~.foreground.Foreground.touch`): the store's
        lock and the interpreter lock are the engine load's too."""
        out: list[bool] = []
        fg = self.foreground
        for lo in range(0, len(keys), self.MASK_STEP):
            if fg is not None and not fg.idle():
                fg.wait_idle()
            out.extend(self.store.host_mask(keys[lo:lo + self.MASK_STEP]))
        return out

    def host_tail(self, keys: list[bytes], limit: int | None) -> list[bytes]:
        """The last ``limit`` of ``keys`` in host frames (all of them: None), in
        context order: a victim keeps its prefix, which a resume reads first."""
        in_host = [k for k, h in zip(keys, self.host_mask(keys)) if h]
        return in_host if limit is None else in_host[max(0, len(in_host) - max(0, int(limit))):]
