"""Host tier memory: one preallocated, pre-faulted pool of fixed-size frames.

::

    anonymous mmap (page-aligned), n_frames * frame_bytes
    +-----------+-----------+-----------+-- ... --+-----------+
    |  frame 0  |  frame 1  |  frame 2  |         | frame n-1 |
    +-----------+-----------+-----------+-- ... --+-----------+
    ^ 4096-aligned; frame_bytes is a multiple of 4096, so every frame is too

When CUDA is present (and ``pin`` allows) the whole mapping is registered
with ``cudaHostRegister`` so DMA engines can copy to/from it asynchronously;
otherwise it is plain page-aligned memory.  Only the allocator differs.

Frames carry reference counts: ``alloc`` returns a frame with count 1 (the
owner's reference), ``incref`` adds a holder (a reader pin, a trajectory
sharing a prefix block), ``decref`` drops one and frees the frame at zero.
Decref of a free frame raises -- a double free is a bug, never clamped.
Not thread-safe by itself: the owning store serialises calls with its lock.
"""
from __future__ import annotations

import ctypes
from collections.abc import Sequence
import logging
import mmap

import numpy as np

from .config import Switch
from .errors import StoreClosed, StoreError

log = logging.getLogger(__name__)


def buffer_address(buf) -> int:
    """Address of the first byte of a buffer-protocol object (0 if empty)."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(buf))   # writable: fast path
    except (TypeError, ValueError):
        a = np.frombuffer(buf, dtype=np.uint8)
        return a.__array_interface__["data"][0] if a.size else 0


class FramePool:
    """Fixed-size frames over one aligned mapping (see module docstring)."""

    def __init__(self, n_frames: int, frame_bytes: int, pin: Switch = Switch.AUTO) -> None:
        if frame_bytes <= 0 or frame_bytes % mmap.PAGESIZE:
            raise ValueError(f"frame_bytes must be a positive multiple of {mmap.PAGESIZE}")
        self.n_frames = n_frames
        self.frame_bytes = frame_bytes
        self.pinned = False
        self._refs = [0] * n_frames
        # LIFO free list: recently freed frames are warm in cache.
        self._free = list(range(n_frames - 1, -1, -1))
        self._closed = False
        self._mm = None
        self._mv = None
        self.address = 0
        if n_frames == 0:
            return
        self._mm = mmap.mmap(-1, n_frames * frame_bytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        try:
            self._mm.madvise(mmap.MADV_HUGEPAGE)
        except (AttributeError, OSError):
            pass
        # Pre-fault: touch every page now so first use does not pay page faults.
        np.frombuffer(self._mm, dtype=np.uint8)[::mmap.PAGESIZE] = 0
        self._mv = memoryview(self._mm)
        self.address = buffer_address(self._mm)
        pin = Switch(pin)
        if pin is not Switch.OFF:
            self.pinned = self._register_cuda(required=pin is Switch.ON)

    def _register_cuda(self, required: bool) -> bool:
        try:
            import torch  # lazily: store/ never imports torch at module level
            available = torch.cuda.is_available()
        except Exception as exc:  # pragma: no cover - torch missing is unusual here
            available, torch = False, None
            log.debug("torch unavailable for pinning: %s", exc)
        if not available:
            if required:
                raise StoreError("pin_host='on' but CUDA is not available")
            return False
        rc = torch.cuda.cudart().cudaHostRegister(self.address, len(self._mm), 0)
        code = int(getattr(rc, "value", rc))
        if code != 0:
            if required:
                raise StoreError(f"cudaHostRegister failed with error {code}")
            log.warning("cudaHostRegister failed (error %s); host pool stays unpinned", code)
            return False
        return True

    # -- allocator -------------------------------------------------------
    @property
    def free_count(self) -> int:
        return len(self._free)

    @property
    def used_count(self) -> int:
        return self.n_frames - len(self._free)

    def alloc(self) -> int | None:
        """Take a free frame (refcount 1) or return ``None`` if none is free."""
        self._check_open()
        if not self._free:
            return None
        f = self._free.pop()
        self._refs[f] = 1
        return f

    def alloc_many(self, n: int) -> list[int] | None:
        """``n`` free frames (refcount 1 each) in ascending order, or ``None`` if
        fewer are free.  Frames freed together come back together, so a batch
        usually gets one run of adjacent frames (its copies can then coalesce)."""
        self._check_open()
        if n > len(self._free):
            return None
        if n == 0:
            return []
        out = self._free[-n:]
        del self._free[-n:]
        out.sort()
        refs = self._refs
        for f in out:
            refs[f] = 1
        return out

    def incref(self, frame: int) -> None:
        if self._refs[frame] <= 0:
            raise StoreError(f"incref of free frame {frame}")
        self._refs[frame] += 1

    def decref(self, frame: int) -> bool:
        """Drop one reference; returns True if the frame became free.  Raises on double free."""
        r = self._refs[frame]
        if r <= 0:
            raise StoreError(f"double free of frame {frame}")
        self._refs[frame] = r - 1
        if r == 1:
            self._free.append(frame)
            return True
        return False

    def incref_many(self, frames: Sequence[int]) -> None:
        """``incref`` each of ``frames`` (repeats count); raises before changing
        anything if one is free."""
        refs = self._refs
        if any(refs[f] <= 0 for f in frames):
            bad = next(f for f in frames if refs[f] <= 0)
            raise StoreError(f"incref of free frame {bad}")
        for f in frames:
            refs[f] += 1

    def decref_many(self, frames: Sequence[int]) -> None:
        """``decref`` each of ``frames`` (repeats count); frames reaching zero are freed."""
        refs, free = self._refs, self._free
        for f in frames:
            r = refs[f]
            if r <= 0:
                raise StoreError(f"double free of frame {f}")
            refs[f] = r - 1
            if r == 1:
                free.append(f)

    def refcount(self, frame: int) -> int:
        return self._refs[frame]

    def view(self, frame: int, nbytes: int | None = None) -> memoryview:
        """Writable view of a frame's first ``nbytes`` bytes (default: whole frame)."""
        self._check_open()
        if not 0 <= frame < self.n_frames:
            raise IndexError(f"frame {frame} out of range 0..{self.n_frames - 1}")
        start = frame * self.frame_bytes
        return self._mv[start:start + (self.frame_bytes if nbytes is None else nbytes)]

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosed("host frame pool is closed")

    def close(self) -> None:
        """Unregister and unmap.  Idempotent.  Views still held by callers keep
        the mapping alive until they are released (no dangling pointers)."""
        if self._closed:
            return
        self._closed = True
        if self._mm is None:
            return
        if self.pinned:
            try:
                import torch
                torch.cuda.cudart().cudaHostUnregister(self.address)
            except Exception as exc:  # pragma: no cover
                log.warning("cudaHostUnregister failed: %s", exc)
            self.pinned = False
        self._mv.release()
        try:
            self._mm.close()
        except BufferError:
            log.debug("host pool views still exported; mapping freed when they go")
