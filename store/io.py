"""I/O engines: execute batches of vectored positional reads/writes.

An engine runs plain :class:`IoOp` descriptions; it decides nothing.  Two
implementations, chosen by name through :func:`make_engine`:

* ``io_uring`` -- PyPI ``liburing``: one ring per thread, ``readv``/``writev``
  SQEs over aligned memory, up to ``queue_depth`` in flight, batch submits.
* ``threads``  -- a pool of ``queue_depth`` threads calling ``os.preadv`` /
  ``os.pwritev`` (fallback when io_uring is unavailable, e.g. seccomp).

Ordering: ops within a batch may complete in any order; ``wait()`` returns
only when every op of the batch has completed (even after an error, so no
buffer is still in use by the kernel when it raises).  A thread may have at
most one batch in flight per engine.
"""
from __future__ import annotations

import errno
import logging
import os
import threading
from abc import ABC, abstractmethod
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from .config import IoEngineKind
from .errors import DiskFull, StoreError, StoreIOError
from .uring_iovec import IovecPool, layout_problem

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class IoOp:
    """One vectored positional I/O: ``bufs`` are filled from / written to
    ``fd`` starting at ``offset``.  ``prepare`` (optional) is called by the
    engine right before the op is issued, on the thread that issues it (a
    write's slot headers are filled there, so their checksums are computed
    while earlier ops of the batch are in flight); if it raises, the op is
    not issued and fails with ``StoreIOError``."""

    write: bool
    fd: int
    offset: int
    bufs: tuple[memoryview, ...]
    prepare: Callable[[], None] | None = None

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.bufs)


Prepare = Callable[[list], Callable[[], None]]
"""Factory of an op's ``prepare``: given the indices an op covers, the callable to run before it."""


def _io_error(op: IoOp, err: int) -> StoreError:
    kind = "write" if op.write else "read"
    msg = f"{kind} of {op.nbytes} bytes at offset {op.offset} failed: {os.strerror(err)}"
    if err in (errno.ENOSPC, errno.EDQUOT):
        return DiskFull(msg)
    return StoreIOError(msg)


def _run_prepare(op: IoOp) -> None:
    try:
        op.prepare()
    except StoreError:
        raise
    except Exception as exc:
        raise StoreIOError(f"preparing the {'write' if op.write else 'read'} at offset {op.offset} "
                           f"failed: {exc!r}") from exc


def _short(op: IoOp, done: int) -> StoreIOError:
    kind = "write" if op.write else "read"
    return StoreIOError(f"short {kind}: {done} of {op.nbytes} bytes at offset {op.offset}")


class IoBatch(ABC):
    """Ops started together (:meth:`IoEngine.start`), waited together.

    ``groups``: what each op covers, set by the caller that coalesced them
    (:meth:`~kvtier.store.nvme.NvmeTier.start_io`: ``groups[i]`` lists the block
    indices op ``i`` covers); empty until a caller sets it."""

    groups: Sequence[Sequence[int]] = ()

    @abstractmethod
    def wait(self, on_done: Callable[[int], None] | None = None,
             work: Iterable[Callable[[], None]] = ()) -> None:
        """Block until every op completed (all are attempted even after a failure).
        Raises DiskFull/StoreIOError for the first failure (or the first exception
        of ``on_done``/``work``, but only after every op has completed, so no
        buffer is still in use by the kernel when it raises).

        ``work`` items are run first, in order, in this thread, while the ops are
        in flight (e.g. checksums of the blocks being written); between items,
        completed ops are reaped and the queue refilled without blocking.
        ``on_done(i)`` is called (in this thread) for each op ``i`` that completed
        fully, as soon as it is reaped, while later ops are still in flight -- so
        CPU work such as checksum verification or index commits overlaps the
        remaining I/O.
        """


class IoEngine(ABC):
    name: str

    @abstractmethod
    def start(self, ops: Sequence[IoOp]) -> IoBatch:
        """Submit ``ops`` (some may be queued until ``wait``); does not block on completion."""

    def run(self, ops: Sequence[IoOp]) -> None:
        self.start(ops).wait()

    @abstractmethod
    def close(self) -> None: ...


# ---------------------------------------------------------------- threads
class _FutureBatch(IoBatch):
    def __init__(self, futures) -> None:
        self._futures = futures

    def wait(self, on_done: Callable[[int], None] | None = None,
             work: Iterable[Callable[[], None]] = ()) -> None:
        self._error: StoreError | None = None          # first I/O failure
        self._cb_error: BaseException | None = None    # first on_done/work failure
        pending = dict((f, i) for i, f in enumerate(self._futures))
        try:
            for item in work:
                self._reap(pending, on_done, [f for f in pending if f.done()])
                item()
        except BaseException as exc:   # drain before raising: buffers are in use
            self._cb_error = exc
            for f in pending:
                f.cancel()             # not started yet: nothing to drain
        self._reap(pending, on_done, as_completed(list(pending)))
        if self._error is not None:
            raise self._error
        if self._cb_error is not None:
            raise self._cb_error

    def _reap(self, pending: dict, on_done, ready) -> None:
        for f in ready:
            i = pending.pop(f)
            if f.cancelled():
                continue
            try:
                f.result()
            except StoreError as exc:
                self._error = self._error or exc
                continue
            if on_done is not None and self._cb_error is None:
                try:
                    on_done(i)
                except BaseException as exc:
                    self._cb_error = exc


class ThreadEngine(IoEngine):
    """``preadv``/``pwritev`` on a thread pool of ``queue_depth`` workers."""

    name = "threads"

    def __init__(self, queue_depth: int) -> None:
        self._pool = ThreadPoolExecutor(max_workers=queue_depth, thread_name_prefix="kvtier-io")

    @staticmethod
    def _do(op: IoOp) -> None:
        if op.prepare is not None:
            _run_prepare(op)
        want = op.nbytes
        try:
            if op.write:
                done = os.pwritev(op.fd, op.bufs, op.offset)
            else:
                done = os.preadv(op.fd, op.bufs, op.offset)
        except OSError as exc:
            raise _io_error(op, exc.errno or errno.EIO) from None
        if done != want:
            raise _short(op, done)

    def start(self, ops: Sequence[IoOp]) -> IoBatch:
        return _FutureBatch([self._pool.submit(self._do, op) for op in ops])

    def close(self) -> None:
        self._pool.shutdown(wait=True)


# ---------------------------------------------------------------- io_uring
class _RingState:
    def __init__(self, L, entries: int) -> None:
        self.L = L
        self.ring = L.Ring()
        self.cqe = L.Cqe()
        L.io_uring_queue_init(entries, self.ring)
        # The liburing binding keeps the GIL inside io_uring_wait_cqe, which would
        # stall every other Python thread (the hashing thread) for the whole
        # wait.  Completions also signal this eventfd; ``wait_ready`` blocks in
        # os.eventfd_read, which releases the GIL.
        self.efd = -1
        try:
            self.efd = os.eventfd(0, os.EFD_CLOEXEC)
            L.io_uring_register_eventfd(self.ring, self.efd)
        except Exception:   # no eventfd here: fall back to io_uring_wait_cqe
            if self.efd >= 0:
                os.close(self.efd)
            self.efd = -1
        self.busy = False
        self.closed = False
        self.iovecs = IovecPool(L)     # Iovecs that hold no buffer (store/uring_iovec.py)

    def wait_ready(self) -> None:
        """Block until at least one CQE is ready, without holding the GIL."""
        L = self.L
        if self.efd < 0:
            L.io_uring_wait_cqe(self.ring, self.cqe)
            return
        while not L.io_uring_cq_ready(self.ring):
            os.eventfd_read(self.efd)   # a stale count only means one more check

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.L.io_uring_queue_exit(self.ring)
            if self.efd >= 0:
                os.close(self.efd)
                self.efd = -1


class _UringBatch(IoBatch):
    def __init__(self, rs: _RingState, ops: Sequence[IoOp], depth: int) -> None:
        self._rs, self._ops, self._depth = rs, list(ops), depth
        self._iovs: dict[int, object] = {}   # op index -> its Iovec, until the op completes
        self._next = 0
        self._inflight = 0
        self._error: StoreError | None = None          # first I/O failure
        self._cb_error: BaseException | None = None    # first on_done/work failure
        rs.busy = True
        self._fill()

    def _fill(self) -> None:
        L, rs = self._rs.L, self._rs
        n = 0
        while self._inflight < self._depth and self._next < len(self._ops):
            i = self._next
            op = self._ops[i]
            if op.prepare is not None:
                try:
                    _run_prepare(op)
                except StoreError as exc:
                    self._error = self._error or exc
                    self._next = len(self._ops)    # issue nothing more
                    break
            sqe = L.io_uring_get_sqe(rs.ring)
            if sqe is None:
                break
            iov = rs.iovecs.take(op.bufs)
            self._iovs[i] = iov
            (L.io_uring_prep_writev if op.write else L.io_uring_prep_readv)(sqe, op.fd, iov, op.offset)
            L.io_uring_sqe_set_data64(sqe, i)
            self._next += 1
            self._inflight += 1
            n += 1
        if n:
            L.io_uring_submit(rs.ring)

    def _reap(self, on_done, block: bool) -> None:
        """Reap ready completions (waiting for one first if ``block``), refill the
        queue, then run ``on_done`` for the ops that completed fully."""
        L, rs = self._rs.L, self._rs
        if block:
            rs.wait_ready()
        done = []
        # walk every ready CQE (the CQ ring wraps: never index past cqe[0])
        ready = 0
        it = L.io_uring_cqe_iter_init(rs.ring)
        while L.io_uring_cqe_iter_next(it, rs.cqe):
            ready += 1
            c = rs.cqe[0]
            i = L.io_uring_cqe_get_data64(c)
            res = c.res
            op = self._ops[i]
            if res < 0:
                self._error = self._error or _io_error(op, -res)
            elif res != op.nbytes:
                self._error = self._error or _short(op, res)
            else:
                done.append(i)
            rs.iovecs.give(self._iovs.pop(i))
        if ready:
            L.io_uring_cq_advance(rs.ring, ready)
            self._inflight -= ready
        self._fill()          # keep the queue full before doing CPU work
        if on_done is not None:
            for i in done:
                if self._cb_error is not None:
                    break     # a callback failed: only drain from now on
                try:
                    on_done(i)
                except BaseException as exc:  # keep draining: buffers are in use
                    self._cb_error = exc

    def wait(self, on_done: Callable[[int], None] | None = None,
             work: Iterable[Callable[[], None]] = ()) -> None:
        try:
            try:
                for item in work:
                    if self._inflight:
                        self._reap(on_done, block=False)
                    item()
            except BaseException as exc:
                self._cb_error = self._cb_error or exc
                self._next = len(self._ops)      # submit nothing more
            while self._inflight:
                self._reap(on_done, block=True)
        finally:
            self._rs.busy = False
        if self._error is not None:
            raise self._error
        if self._cb_error is not None:
            raise self._cb_error


class UringEngine(IoEngine):
    """io_uring through PyPI ``liburing``; one ring per calling thread."""

    name = "io_uring"

    def __init__(self, queue_depth: int) -> None:
        import liburing
        self._L = liburing
        self._depth = queue_depth
        self._local = threading.local()
        self._rings: list[_RingState] = []
        self._lock = threading.Lock()

    def _ring(self) -> _RingState:
        rs = getattr(self._local, "rs", None)
        if rs is None or rs.closed:
            rs = _RingState(self._L, max(8, self._depth))
            self._local.rs = rs
            with self._lock:
                self._rings.append(rs)
        return rs

    def start(self, ops: Sequence[IoOp]) -> IoBatch:
        rs = self._ring()
        if rs.busy:
            raise StoreError("io_uring: this thread already has a batch in flight")
        return _UringBatch(rs, ops, self._depth)

    def close(self) -> None:
        with self._lock:
            for rs in self._rings:
                if not rs.busy:
                    rs.close()
            self._rings.clear()


# The PyPI liburing wheel is a native build that can use instructions this CPU
# lacks (seen: AVX-512 code on an AVX2-only EPYC, SIGILL at the first Ring()).
# An illegal instruction would kill the engine process that loaded us, so the
# binding is first exercised in a child process; only if the child survives a
# ring and a NOP is it used here.  Once per process.
_PROBE = """
import liburing as L
r = L.Ring(); c = L.Cqe()
L.io_uring_queue_init(4, r)
s = L.io_uring_get_sqe(r); L.io_uring_prep_nop(s); L.io_uring_submit(r)
L.io_uring_wait_cqe(r, c); L.io_uring_cqe_seen(r, c[0]); L.io_uring_queue_exit(r)
"""
_probe_result: list[str | None] = []
_probe_lock = threading.Lock()


def _probe_in_child() -> str | None:
    import signal
    import subprocess
    import sys

    with _probe_lock:
        if not _probe_result:
            try:
                r = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True,
                                   timeout=30, stdin=subprocess.DEVNULL)
                if r.returncode == 0:
                    why = None
                elif r.returncode < 0:
                    why = f"the liburing binding dies of {signal.Signals(-r.returncode).name} on this CPU"
                else:
                    last = (r.stderr.strip().splitlines() or ["exit %d" % r.returncode])[-1]
                    why = f"liburing probe failed: {last}"
            except (OSError, subprocess.SubprocessError) as exc:
                why = f"liburing probe could not run: {exc}"
            _probe_result.append(why)
        return _probe_result[0]


def io_uring_unavailable_reason() -> str | None:
    """``None`` if a ring can be created and a NOP completes here, else why not.

    The binding is tried in a child process first (see ``_PROBE``), so a
    native crash is reported as a reason, never taken in this process."""
    why = _probe_in_child()
    if why is not None:
        return why
    try:
        import liburing as L
    except Exception as exc:
        return f"liburing not importable: {exc}"
    try:
        rs = _RingState(L, 4)
    except Exception as exc:
        return f"io_uring_queue_init failed: {exc}"
    try:
        sqe = L.io_uring_get_sqe(rs.ring)
        L.io_uring_prep_nop(sqe)
        L.io_uring_submit(rs.ring)
        L.io_uring_wait_cqe(rs.ring, rs.cqe)
        res = rs.cqe[0].res
        L.io_uring_cqe_seen(rs.ring, rs.cqe[0])
        if res < 0:
            return f"io_uring NOP failed: {os.strerror(-res)}"
    except Exception as exc:
        return f"io_uring NOP failed: {exc}"
    finally:
        rs.close()
    return layout_problem(L)


ENGINES: dict[IoEngineKind, Callable[[int], IoEngine]] = {IoEngineKind.IO_URING: UringEngine,
                                                          IoEngineKind.THREADS: ThreadEngine}


def make_engine(name: IoEngineKind | str, queue_depth: int) -> IoEngine:
    """Engine by kind (or its name); ``AUTO`` prefers io_uring and logs why when it falls back.

    Raises:
        ValueError: an unknown name.
        StoreError: io_uring asked for but unavailable.
    """
    try:
        kind = IoEngineKind(name)
    except ValueError:
        raise ValueError(f"unknown io engine {name!r}; known: {', '.join(k.value for k in IoEngineKind)}") from None
    if kind is IoEngineKind.AUTO:
        why = io_uring_unavailable_reason()
        if why is None:
            return UringEngine(queue_depth)
        log.warning("io_uring unavailable (%s); using the thread-pool preadv/pwritev engine", why)
        return ThreadEngine(queue_depth)
    if kind is IoEngineKind.IO_URING:
        why = io_uring_unavailable_reason()
        if why is not None:
            raise StoreError(f"io_engine='io_uring' requested but unavailable: {why}")
    return ENGINES[kind](queue_depth)
