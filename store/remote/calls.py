"""Blocking client calls on worker threads: a deadline, abandonment, a pipeline, and a polite wait.

A Mooncake batch call blocks its calling thread until the transfer ends, and
the wheel's client waits by *polling*: the calling thread spins on the batch
status (``TransferEngineOperationState::wait_for_completion``, built without
event-driven completion) -- one core busy for the whole call, measured here
as 95 ms of user CPU for a 64 MiB call that takes 127 ms.  On a host whose
cores the transfer itself needs (the client's TCP thread, the storage
node's), that spinner competes with the very threads it waits for.

:class:`Calls` runs every call on its own worker threads, and each worker
lowers its own scheduling priority once (``WAITER_NICE``; Linux applies
``setpriority`` to the one thread).  The spinning wait then only uses CPU
nothing else wants: the transfer threads, the engine and kvtier's own
hashing run first.  Only the workers are affected (the client's transfer
threads are created at setup, on another thread); a worker does nothing but
wait inside the client.

:class:`Batch`: the calls of one batch, at most ``depth`` in flight, each
collected in order on the caller's thread, so the caller prepares part k+1
(a put's copy and hash) or verifies part k (a get) while another part is on
the wire.

Deadlines: each call is waited for at most ``deadline_s`` from its
submission.  A call that overruns is *abandoned*, and so is every other call
of its batch still in flight: they keep running on their workers (a hung
master holds them for the client's RPC timeout) and may still move bytes into
their memory, so an arena lent to one is marked ``lent`` and retired only
when the call ends, and a ``Loan`` is held until then (``arenas.py``).

Threading: ``Calls`` is thread-safe; a ``Batch`` belongs to the thread that
opened it.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Callable

from .backend import RemoteUnavailable

log = logging.getLogger(__name__)

WAITER_NICE = 10          # added to a worker's nice value: its spinning wait yields to the transfer threads
WORKERS = 4               # calls in flight at once (an abandoned one holds its worker until it ends)


def lower_own_priority(nice: int) -> None:
    """Thread initializer: this thread's nice value + ``nice`` (Linux: per thread).  Never raises."""
    if nice <= 0:
        return
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))
    except (AttributeError, OSError):     # not Linux, or not permitted: wait at normal priority
        pass


class Calls:
    """Worker threads for blocking client calls.  ``retire(arena)``: what to do
    with an arena an abandoned call used, once that call has ended;
    ``on_deadline()``: called when a call overran (before the batch raises)."""

    def __init__(self, label: str, deadline_s: float, retire: Callable, nice: int = WAITER_NICE,
                 workers: int = WORKERS, on_deadline: Callable[[], None] = lambda: None) -> None:
        self.label, self.deadline_s, self._retire, self.on_deadline = label, deadline_s, retire, on_deadline
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kvtier-remote-call",
                                        initializer=lower_own_priority, initargs=(nice,))
        self._lock = threading.Lock()
        self._late = 0                    # abandoned calls still running (guarded by _lock)

    @property
    def late(self) -> int:
        with self._lock:
            return self._late

    def submit(self, fn: Callable, *args) -> Future:
        """Raises ``RemoteUnavailable`` once shut down."""
        try:
            return self._pool.submit(fn, *args)
        except RuntimeError:
            raise RemoteUnavailable("remote tier is closed") from None

    def run(self, what: str, arena, fn: Callable, *args, loan=None):
        """``fn(*args)`` on a worker, waited for at most ``deadline_s``; see
        the module docstring for ``arena`` and ``loan``.  Raises
        ``RemoteUnavailable`` (closed, deadline)."""
        with self.batch(what, loan, depth=1) as b:
            box: list = []
            b.add(arena, fn, *args, then=box.append)
        return box[0]

    def batch(self, what: str, loan=None, depth: int = 2) -> "Batch":
        return Batch(self, what, loan, depth)

    def abandon(self, fut: Future, arena, loan) -> None:
        """``fut`` will not be waited for: if it is still running, its memory
        stays reserved until it ends."""
        if fut.cancel():
            return
        if arena is not None:
            arena.lent = True
        if loan is not None:
            loan.hold()
        with self._lock:
            self._late += 1
        fut.add_done_callback(lambda _f: self._ended_late(arena, loan))

    def _ended_late(self, arena, loan) -> None:
        with self._lock:
            self._late -= 1
        if arena is not None:
            self._retire(arena)
        if loan is not None:
            loan.end()

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class Batch:
    """The calls of one batch: ``add`` submits one (its ``arena`` -- or None
    -- is the memory it owns, given back with ``give`` after it was
    collected, after its ``then``); ``then(result)`` runs on the caller's
    thread when it is collected, in submission order.  At most ``depth`` calls are in flight:
    ``add`` first collects the oldest when it would be more.  Leaving the
    ``with`` block collects the rest; on any exception (a deadline, a
    ``then`` that raised) every call still in flight is abandoned instead.
    Raises ``RemoteUnavailable`` (deadline: ``what took longer than ...``)."""

    def __init__(self, calls: Calls, what: str, loan, depth: int) -> None:
        self.calls, self.what, self.loan, self.depth = calls, what, loan, max(1, depth)
        self._pending: deque = deque()
        self.give: Callable | None = None      # set by the owner: returns an arena after its call

    def __enter__(self) -> "Batch":
        return self

    def add(self, arena, fn: Callable, *args, then: Callable) -> None:
        try:
            while len(self._pending) >= self.depth:
                self._collect()         # may raise (a deadline, a ``then``): ``arena`` was never lent
            fut = self.calls.submit(fn, *args)
        except BaseException:
            if arena is not None and self.give is not None:
                self.give(arena)
            raise
        self._pending.append((fut, time.monotonic() + self.calls.deadline_s, arena, then))

    def _collect(self) -> None:
        fut, due, arena, then = self._pending[0]
        try:
            result = fut.result(timeout=max(0.0, due - time.monotonic()))
        except FutureTimeout:
            self.calls.on_deadline()
            raise RemoteUnavailable(f"{self.calls.label}: {self.what} took longer than "
                                    f"{self.calls.deadline_s:g} s (abandoned)") from None
        self._pending.popleft()
        try:
            then(result)
        finally:
            if arena is not None and self.give is not None:
                self.give(arena)

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            try:
                while self._pending:
                    self._collect()
                return
            except BaseException:
                self._abandon_all()
                raise
        self._abandon_all()

    def _abandon_all(self) -> None:
        while self._pending:
            fut, _due, arena, _then = self._pending.popleft()
            self.calls.abandon(fut, arena, self.loan)
            if arena is not None and not arena.lent and self.give is not None:
                self.give(arena)             # the call never started: the arena is free
