"""Slot preparation: zeros over never-used slots of new slab files, in idle disk time.

Why.  A slab file is ``posix_fallocate``\\d, so its extents start *unwritten*
on ext4 (and XFS): the first O_DIRECT write into them converts the extents at
I/O completion and the next ``fdatasync`` commits that conversion in the
journal.  Measured on this project's VM disk (vLLM-shaped puts: 16 x 1.75 MiB
per ``put_many``, two threads, fresh store): 0.36-0.38 GB/s into fallocated
slots against 0.46-0.57 into the same slots once written (docs/peers.md).  An
overwrite pays neither, so a store that has been running a while (its slots
reused) stores faster than a new one.  Writing zeros over a new slab's free
slots while the disk is idle moves that first-write cost off the put path.

What it may touch.  Only slots of slab files this ``NvmeTier`` created itself
(fresh files: no slot in them ever held a block) and only at or above the
allocation watermark (the highest slot ever handed out + 1), so it never
overwrites a block, a header, or a slot a put could be writing: the watermark
and the zero write of one chunk are under ``lock``, which ``NvmeTier.alloc``
holds around the allocator.  A zero header is a free slot (store/record.py),
so a crash in the middle leaves nothing to clean up.

Flushed, not only written.  On a disk with a volatile write cache (this VM's
virtio disk: ``write back``) an O_DIRECT write is acknowledged from the
cache; the zeros reach the media only at a flush.  Left unflushed, they are
drained by the next put's ``fdatasync`` -- the put pays for the preparer's
bytes.  So the preparer flushes every ``SYNC_BYTES`` and before it goes idle,
and ``pending()`` (hence ``TieredStore.wait_prepared``) stays true until its
zeros are flushed.  Measured (docs/peers.md): vLLM-shaped puts right
after ``wait_prepared`` stored at 0.32 GB/s (median of 8) when the last
zeros were still unflushed, 0.42 when they were flushed.

Threading: one daemon thread ("kvtier-slot-prep"), started with the first
fresh slab.  It writes a chunk only when no NVMe read or write was started in
the last ``idle_s`` (``note_io``; reads too: a resume's
reads beside its zeros and flushes were slower), so it uses idle time, not the
puts' or the loads' bandwidth; an
``alloc`` waits for at most one chunk write (a few ms).  At most
``SYNC_BYTES`` of its zeros are ever unflushed, which bounds what a put that
starts mid-preparation pays for them.  I/O errors stop it (one warning);
nothing raises into callers.
"""
from __future__ import annotations

import logging
import mmap
import os
import threading
import time

log = logging.getLogger(__name__)

CHUNK_BYTES = 8 << 20        # block bytes zeroed per step (rounded to whole slots)
SYNC_BYTES = 32 << 20        # fdatasync after this many bytes: the most a put's flush can inherit


class SlotPreparer:
    """Zero-fills never-used slots of fresh slabs ahead of the allocator.

    ``tier`` is the owning ``NvmeTier`` (its ``_fds``, ``sps``, ``hdr_region``,
    ``frame_bytes``); ``ahead_slots`` bounds how far past the watermark it goes."""

    def __init__(self, tier, ahead_slots: int, idle_s: float = 0.02) -> None:
        self.tier = tier
        self.ahead = max(1, ahead_slots)
        self.idle_s = idle_s
        self.lock = threading.Lock()         # held by NvmeTier.alloc around the allocator
        self._cv = threading.Condition(threading.Lock())
        self._mark = 0                       # allocation watermark: slots below it were handed out
        self._next = 0                       # next slot to prepare
        self._fresh = (0, 0)                 # [lo, hi) slots of slab files this tier created
        self.last_io = 0.0           # monotonic time the last NVMe read or write started (note_io)
        self._closed = False
        self._failed = False
        self._thread: threading.Thread | None = None
        self.prepared_slots = 0
        self.unsynced_bytes = 0              # zeros written and not yet flushed (``lock`` held to change)
        fb = tier.frame_bytes
        self._per = max(1, CHUNK_BYTES // fb)
        self._zeros = mmap.mmap(-1, self._per * fb)      # anonymous: zero, page-aligned
        self._hdr_zeros = mmap.mmap(-1, self._per * 4096)

    # -- called by NvmeTier (alloc under self.lock) ---------------------------------
    def note_alloc(self, slots) -> None:
        """Slots handed out (``lock`` held): never prepare at or below them."""
        if slots:
            self._mark = max(self._mark, max(slots) + 1)

    def note_created(self, first_slot: int, end_slot: int) -> None:
        """A slab this tier created holds slots [first_slot, end_slot) (``lock`` held)."""
        lo, hi = self._fresh
        self._fresh = (first_slot, end_slot) if hi != first_slot or lo == hi else (lo, end_slot)
        if self._thread is None and not self._closed:
            self._thread = threading.Thread(target=self._run, name="kvtier-slot-prep", daemon=True)
            self._thread.start()
        self.wake()

    def note_io(self) -> None:
        """An NVMe read or write starts now (any thread): the disk is busy."""
        self.last_io = time.monotonic()

    def wake(self) -> None:
        with self._cv:
            self._cv.notify_all()

    # -- state ---------------------------------------------------------------------
    def _target(self) -> tuple[int, int]:
        """The next chunk [a, b) to zero (a == b: nothing to do).  ``lock`` held."""
        lo, hi = self._fresh
        a = max(self._next, self._mark, lo)
        b = min(hi, self._mark + self.ahead, a + self._per)
        sps = self.tier.sps
        b = min(b, (a // sps + 1) * sps)        # one slab per write
        return a, max(a, b)

    def pending(self) -> bool:
        """True while slots within ``ahead_slots`` of the watermark are left to zero,
        or zeros already written are not yet flushed (False once stopped or closed)."""
        with self.lock:
            a, b = self._target()
            dirty = self.unsynced_bytes > 0
        return (a < b or dirty) and not self._failed and not self._closed

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait until nothing is left to prepare (within ``ahead_slots`` of the
        watermark) and the zeros written are flushed; True if so, False on
        timeout.  Any thread but the preparer's."""
        deadline = time.monotonic() + timeout_s
        while self.pending():
            if time.monotonic() >= deadline:
                return False
            self.wake()
            time.sleep(0.01)
        return True

    # -- the thread ------------------------------------------------------------------
    def _run(self) -> None:
        unsynced: set[int] = set()
        while True:
            with self._cv:
                if self._closed:
                    break
                idle_for = time.monotonic() - self.last_io
                if idle_for < self.idle_s:
                    self._cv.wait(self.idle_s - idle_for)
                    continue
            with self.lock:
                a, b = self._target()
                if a < b and not self._closed:
                    try:
                        fd = self._zero(a, b)
                    except OSError as exc:
                        self._failed = True
                        log.warning("slot preparation stopped: %s", exc)
                        break
                    unsynced.add(fd)
                    self.unsynced_bytes += (b - a) * self.tier.slot_bytes   # header sector + block
                    self._next = b
                    self.prepared_slots += b - a
                since_sync = self.unsynced_bytes
            if a < b and since_sync < SYNC_BYTES:
                continue
            for fd in unsynced:                       # flush the zeros (and their conversions) off the put path
                try:
                    os.fdatasync(fd)
                except OSError:
                    pass
            unsynced.clear()
            with self.lock:
                self.unsynced_bytes -= since_sync    # zeros written meanwhile stay counted
            if a >= b:
                with self._cv:
                    if not self._closed:
                        self._cv.wait(0.5)

    def _zero(self, a: int, b: int) -> int:
        """Write zeros over slots [a, b) (one slab): headers, then blocks.  Returns the fd."""
        t = self.tier
        fd = t._fds[a // t.sps]
        n = b - a
        for buf, off in ((memoryview(self._hdr_zeros)[:n * 4096], (a % t.sps) * 4096),
                         (memoryview(self._zeros)[:n * t.frame_bytes], t.hdr_region + (a % t.sps) * t.frame_bytes)):
            done = os.pwritev(fd, [buf], off)
            if done != buf.nbytes:
                raise OSError(f"short write: {done} of {buf.nbytes} bytes at offset {off}")
        return fd

    def close(self) -> None:
        """Stop the thread (after at most one chunk write).  Idempotent."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        try:
            self._zeros.close()
            self._hdr_zeros.close()
        except BufferError:
            pass
