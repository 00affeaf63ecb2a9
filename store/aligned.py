"""Page-aligned scratch buffers (bounce buffers for O_DIRECT)."""
from __future__ import annotations

import mmap
import threading


class AlignedBuffer:
    """One page-aligned anonymous mapping; ``view(a, b)`` gives writable slices."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self._mm = mmap.mmap(-1, max(nbytes, mmap.PAGESIZE))
        self._mv = memoryview(self._mm)

    def view(self, start: int = 0, stop: int | None = None) -> memoryview:
        return self._mv[start:self.nbytes if stop is None else stop]

    def close(self) -> None:
        self._mv.release()
        try:
            self._mm.close()
        except BufferError:
            pass


class BouncePool:
    """Per-thread reusable aligned buffer that grows to the largest request."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._all: list[AlignedBuffer] = []
        self._lock = threading.Lock()

    def get(self, nbytes: int) -> AlignedBuffer:
        buf = getattr(self._local, "buf", None)
        if buf is None or buf.nbytes < nbytes:
            buf = AlignedBuffer(nbytes)
            self._local.buf = buf
            with self._lock:
                self._all.append(buf)
        return buf

    def close(self) -> None:
        with self._lock:
            for b in self._all:
                b.close()
            self._all.clear()
