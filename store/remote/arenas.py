"""Memory a zero-copy backend's calls may write after their caller stopped waiting.

A call that its caller abandoned at the deadline may still move bytes into
its buffers when it finally runs.  Two kinds of memory are handed to calls:

* :class:`Arenas` -- registered staging buffers owned by the backend, one
  per call in flight; an arena is handed to exactly one call and comes back
  only when that call has ended: ``give`` (in time) or ``retire`` (from the
  abandoned call's completion).
* :class:`Loan` -- the caller's own registered memory (host frames) lent to
  a call past its return: the backend may write straight into it, and the
  caller gives it back through ``Loan.release``, which waits for any call
  abandoned on it to end.

Threading: every method is thread-safe (each class guards itself with ``_lock``).
"""
from __future__ import annotations

import logging
import threading
from typing import Callable

from ..aligned import AlignedBuffer
from ..hostpool import buffer_address as _address

log = logging.getLogger(__name__)


class Arenas:
    """Registered staging buffers: one per call in flight, reused.

    ``backend`` registers memory (``register(address, nbytes)`` /
    ``unregister(address)``).  ``take(n)`` hands out a free arena of at
    least ``n`` bytes (allocating and registering one if none fits); ``give``
    returns it; ``retire`` (an arena an abandoned call still uses, called when
    that call ends) unregisters and frees it.  Thread-safe."""

    KEEP = 4                  # free arenas kept for reuse (a pipelined batch uses up to three)

    def __init__(self, backend, min_bytes: int) -> None:
        self._backend = backend
        self._min = min_bytes
        self._lock = threading.Lock()
        self._free: list[AlignedBuffer] = []
        self._closed = False

    def take(self, nbytes: int) -> AlignedBuffer:
        with self._lock:
            for j, a in enumerate(self._free):
                if a.nbytes >= nbytes:
                    a.lent = False
                    return self._free.pop(j)
        a = AlignedBuffer(max(nbytes, self._min))
        a.lent = False                # set when a call abandoned at its deadline may still use it
        a.address = _address(a.view())
        self._backend.register(a.address, a.nbytes)
        return a

    def give(self, a: AlignedBuffer) -> None:
        with self._lock:
            if not self._closed and len(self._free) < self.KEEP:
                self._free.append(a)
                return
        self.retire(a)

    def retire(self, a: AlignedBuffer) -> None:
        self._backend.unregister(a.address)
        a.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            free, self._free = self._free, []
        for a in free:
            self.retire(a)


class Loan:
    """The caller's memory lent to remote calls, beyond their deadline if need be.

    A caller that owns its destination buffers (host frames it can keep
    reserved) passes a ``Loan`` with them; the backend may then transfer
    straight into them, no staging copy.  When the backend abandons a call
    that may still write into them it calls ``hold()`` (before the caller
    regains control) and ``end()`` when that call has really ended (from the
    call's worker thread).  The caller never reuses the buffers directly: it
    calls ``release(give_back)``, which runs ``give_back`` at once when no
    abandoned call is outstanding, or later, on the thread of the last such
    call's ``end()``.  ``give_back`` must not raise (it is logged and dropped
    if it does).  Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._late = 0
        self._after: list[Callable[[], None]] = []
        self.abandoned = 0          # calls abandoned on this loan (ever)

    def hold(self) -> None:
        """Backend: a call that may still write into the memory was abandoned."""
        with self._lock:
            self._late += 1
            self.abandoned += 1

    def end(self) -> None:
        """Backend: an abandoned call has ended; runs the pending give-backs if it was the last."""
        with self._lock:
            self._late -= 1
            run = self._after if self._late == 0 else []
            if self._late == 0:
                self._after = []
        for fn in run:
            _quietly(fn)

    @property
    def outstanding(self) -> int:
        """Abandoned calls that have not ended yet."""
        with self._lock:
            return self._late

    def release(self, give_back: Callable[[], None]) -> bool:
        """Give the memory back: now (returns True) or when the last abandoned
        call ends (returns False)."""
        with self._lock:
            if self._late:
                self._after.append(give_back)
                return False
        _quietly(give_back)
        return True


def _quietly(fn: Callable[[], None]) -> None:
    try:
        fn()
    except Exception as exc:                 # a give-back runs on a transfer worker: never raise there
        log.warning("remote loan give-back failed: %s", exc)
