"""Host staging frames for device <-> host DMA.

One preallocated tensor ``[capacity, L, 2, T, H, D]`` (pinned when CUDA is
present, so copies can be truly asynchronous; plain memory otherwise).  The
allocator hands out frame ids, preferring one contiguous run so a batched
gather moves with a single DMA.  This is scratch space for movers, not a
store: nothing here outlives a transfer's owner.

    frames  [ 0 ][ 1 ][ 2 ][ 3 ][ 4 ][ 5 ] ...   (each frame = one block, layer-major)
    alloc(3) -> (2, 3, 4) if [2..4] is the first free run of length 3
"""
from __future__ import annotations

import threading
from typing import Iterable

import torch

from kvtier.dma.layouts import FrameFormat


class FramePoolFull(RuntimeError):
    """Not enough free staging frames for a request (nothing was allocated)."""


class FramePool:
    """Fixed pool of host frames.  Thread-safe (one lock guards the free set)."""

    def __init__(self, fmt: FrameFormat, capacity: int, *, pin: bool | None = None) -> None:
        if capacity < 1:
            raise ValueError(f"frame pool capacity must be >= 1, got {capacity}")
        pin = torch.cuda.is_available() if pin is None else pin
        self.fmt = fmt
        self.capacity = int(capacity)
        self.pinned = bool(pin)
        self.frames = torch.zeros((self.capacity, *fmt.shape), dtype=fmt.dtype, pin_memory=self.pinned)
        self._lock = threading.Lock()
        self._free: set[int] = set(range(self.capacity))   # guarded by _lock

    @property
    def free_count(self) -> int:
        with self._lock:
            return len(self._free)

    def alloc(self, n: int) -> tuple[int, ...]:
        """Take ``n`` frames (one contiguous run if one exists).  Raises FramePoolFull; allocates nothing then."""
        if n < 0:
            raise ValueError(f"cannot allocate {n} frames")
        with self._lock:
            if n > len(self._free):
                raise FramePoolFull(f"frame pool: {n} frames wanted, {len(self._free)} of {self.capacity} free")
            run = self._first_run(n)
            ids = run if run is not None else tuple(sorted(self._free)[:n])
            self._free.difference_update(ids)
            return ids

    def _first_run(self, n: int) -> tuple[int, ...] | None:
        start, length = None, 0
        for i in range(self.capacity):
            if i in self._free:
                start = i if length == 0 else start
                length += 1
                if length == n:
                    return tuple(range(start, start + n))
            else:
                length = 0
        return None if n else ()

    def free(self, ids: Iterable[int]) -> None:
        """Return frames.  Raises ValueError on an unknown or already-free id (frees nothing then)."""
        ids = tuple(ids)
        with self._lock:
            bad = [i for i in ids if not (0 <= i < self.capacity) or i in self._free]
            if bad or len(set(ids)) != len(ids):
                raise ValueError(f"frame pool: double free or bad frame ids {bad or ids}")
            self._free.update(ids)

    def check_integrity(self) -> None:
        """free + used == capacity and every free id is in range."""
        with self._lock:
            assert all(0 <= i < self.capacity for i in self._free)
            assert len(self._free) <= self.capacity

    def view(self, frame_id: int) -> torch.Tensor:
        """The frame ``[L, 2, T, H, D]`` (a view; writes go to the pool)."""
        return self.frames[frame_id]


def runs(ids: Iterable[int]) -> list[tuple[int, int, int]]:
    """Split a sequence of ids into maximal runs of consecutive ids.

    Returns ``(position, first_id, length)`` triples: ids[position:position+length]
    == range(first_id, first_id+length).
    """
    out: list[tuple[int, int, int]] = []
    for pos, i in enumerate(ids):
        if out and out[-1][1] + out[-1][2] == i:
            p, f, n = out[-1]
            out[-1] = (p, f, n + 1)
        else:
            out.append((pos, i, 1))
    return out
