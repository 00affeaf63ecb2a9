"""Registered staging buffers for a zero-copy backend, one per call in flight.

A call that its caller abandoned at the deadline may still move bytes into
its arena when it finally runs, so an arena is handed to exactly one call and
comes back only when that call has ended: ``give`` (in time) or ``retire``
(from the abandoned call's completion).

Threading: every method is thread-safe (``_lock`` guards the free list).
"""
from __future__ import annotations

import threading

from ..aligned import AlignedBuffer
from ..hostpool import buffer_address as _address


class Arenas:
    """Registered staging buffers: one per call in flight, reused.

    ``backend`` registers memory (``register(address, nbytes)`` /
    ``unregister(address)``).  ``take(n)`` hands out a free arena of at
    least ``n`` bytes (allocating and registering one if none fits); ``give``
    returns it; ``retire`` (an arena an abandoned call still uses, called when
    that call ends) unregisters and frees it.  Thread-safe."""

    KEEP = 2                  # free arenas kept for reuse

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
                    return self._free.pop(j)
        a = AlignedBuffer(max(nbytes, self._min))
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
