"""The one circuit breaker: calls go through only while it is ``up``.

States (the one vocabulary: remote stats, metrics and ``ServicePolicy.stats()`` report them)::

    connecting ──retry ok──> up ──threshold failures in a row──> down ──retry ok──> up
      └─┘ retry fails                                              └─┘ retry fails

    any but closed ──credentials rejected──> auth_failed ──retry ok──> up
    any ──close()──> closed (final)

While not ``up`` callers skip the call and answer at once (a miss, a local
decision), so a dead server costs them nothing after the calls that noticed.
A retry waits a cooldown first: ``base_s`` after a trip, doubling after each
failed retry up to ``max_s``; ``max_s`` after a rejected password (an operator
must act).  A trip less than ``settle_s`` after the breaker came up is a flap
(a server that answers a probe but not the calls, e.g. one that trickles large
replies): its cooldown goes on doubling from the last one instead of starting
again at ``base_s``, so a slow server costs callers one deadline per cooldown
of up to ``max_s``, not one per ``base_s``.  ``connecting`` (never up yet) tries the first time at once.  Who retries:

* **with a probe** (the remote tier): a daemon thread calls ``probe()`` while
  the breaker is not up.  ``probe`` answers ``True`` (up), ``False`` (still
  down) or :class:`AuthRejected`; an exception counts as ``False``.  The
  breaker starts ``connecting``; callers only read :attr:`up`.
* **without** (the service policy): the breaker starts ``up``; once the
  cooldown has passed, :meth:`allow` lets exactly one caller through, and that
  caller's :meth:`success` or :meth:`failure` is the retry's outcome.

Any :meth:`success` means up.  Entering ``auth_failed`` logs one WARNING (at
most one per ``AUTH_LOG_EVERY_S`` while it lasts) naming ``label``, which must
hold no secret.

Threading: any thread may call every method; ``_lock`` guards every field
(single reads of ``state`` and the counters are not locked); the probe thread
is the only one that calls ``probe``.  ``clock`` times cooldowns, ``down_since``
and the WARNING's rate limit; :meth:`wait_up` and :meth:`close` wait in real time.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable, Union

UP, DOWN, CONNECTING, AUTH_FAILED, CLOSED = "up", "down", "connecting", "auth_failed", "closed"
AUTH_LOG_EVERY_S = 60.0
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AuthRejected:
    """A probe's answer: the server answers but rejects the credentials (``reason`` holds no secret)."""
    reason: str


ProbeResult = Union[bool, AuthRejected]


class CircuitBreaker:
    """See the module doc.  ``threshold``: consecutive failures that take it
    from up to down.  ``base_s`` .. ``max_s``: the cooldown before a retry.
    ``probe``: retried on a daemon thread named ``kvtier-<name>-probe``; without
    it the caller's next call after the cooldown is the retry.

    Raises:
        ValueError: ``threshold`` < 1, or not 0 < ``base_s`` <= ``max_s``.
    """

    def __init__(self, *, threshold: int = 1, base_s: float = 0.25, max_s: float = 4.0,
                 probe: Callable[[], ProbeResult] | None = None, name: str = "breaker",
                 label: str | None = None, clock: Callable[[], float] = time.monotonic,
                 settle_s: float | None = None) -> None:
        if threshold < 1 or not 0 < base_s <= max_s:
            raise ValueError(f"a breaker needs threshold >= 1 and 0 < base_s <= max_s, "
                             f"got threshold={threshold}, base_s={base_s}, max_s={max_s}")
        self.threshold, self.base_s, self.max_s = int(threshold), float(base_s), float(max_s)
        self.settle_s = 2 * self.max_s if settle_s is None else float(settle_s)
        self.flaps = 0                   # trips within settle_s of coming up
        self._probe, self._name, self._clock = probe, name, clock
        self.label = label or name
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self.trips = 0                   # times it went from up to down or auth_failed
        self.failures = 0                # consecutive failed calls and retries (0 after a success)
        self.auth_failures = 0           # credential rejections seen (calls and probes)
        self.last_error: str | None = None
        self._auth_logged_at: float | None = None
        self._retry_at = clock()         # no retry before this (clock time)
        self._next_wait_s = self.base_s  # the cooldown after the next failed retry
        self._up_at: float | None = None  # when it last came up (clock time)
        self._flap_wait_s = self.base_s  # a flap's cooldown: the one after the last trip's
        self._trial = False              # without a probe: a caller holds the retry
        self._thread: threading.Thread | None = None
        self._probing = False            # a probe thread runs
        if probe is None:
            self.state, self.down_since = UP, None
        else:
            self.state, self.down_since = CONNECTING, clock()
            with self._lock:
                self._start_probing()

    @property
    def up(self) -> bool:
        return self.state == UP

    def would_allow(self) -> bool:
        """True if :meth:`allow` would answer True now; takes nothing.  Never raises."""
        with self._lock:
            return self.state == UP or self._retry_due()

    def allow(self) -> bool:
        """May the caller make its call now?  True while up; without a probe,
        also True for exactly one caller once the cooldown has passed (the retry:
        that caller must report :meth:`success` or :meth:`failure`).  Never raises."""
        with self._lock:
            if self.state == UP:
                return True
            if not self._retry_due():
                return False
            self._trial = True
            return True

    def success(self) -> None:
        """A call went through: up (unless closed), consecutive failures 0."""
        with self._lock:
            if self.state != CLOSED:
                self._up()

    def failure(self, reason: str = "call failed") -> None:
        """A call failed: counted; the ``threshold``-th in a row takes it down
        (and starts the probe).  A failed retry doubles the cooldown."""
        with self._lock:
            if self.state == CLOSED:
                return
            self.last_error = reason
            self.failures += 1
            if self.state == UP:
                if self.failures >= self.threshold:
                    self._trip(DOWN, self.base_s)
            elif self._trial:
                self._trial = False
                self._schedule(self._next_wait_s)

    def auth_failure(self, reason: str) -> None:
        """The server rejected the credentials: ``auth_failed`` at once (any
        threshold), one rate-limited WARNING, the next retry after ``max_s``."""
        with self._lock:
            if self.state != CLOSED:
                self._auth_failed(reason)

    def wait_up(self, timeout: float) -> bool:
        """Block until up, closed, or ``timeout`` seconds; True if up."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self.state not in (UP, CLOSED):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._wake.wait(left)
            return self.state == UP

    def close(self) -> None:
        """``closed`` for good; stops the probe thread (waits up to ``max_s`` + 1 s
        for a probe in progress).  Idempotent."""
        with self._lock:
            self.state = CLOSED
            self._wake.notify_all()
            t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout=self.max_s + 1)

    # -- the state machine (lock held)
    def _retry_due(self) -> bool:
        return (self._probe is None and self.state not in (UP, CLOSED) and not self._trial
                and self._clock() >= self._retry_at)

    def _schedule(self, wait_s: float) -> None:
        self._retry_at = self._clock() + wait_s
        self._next_wait_s = min(self.max_s, 2 * wait_s)

    def _up(self) -> None:
        if self.state != UP:
            self._up_at, self._flap_wait_s = self._clock(), self._next_wait_s
        self.state, self.failures, self.down_since = UP, 0, None
        self._trial, self._auth_logged_at, self._next_wait_s = False, None, self.base_s
        self._wake.notify_all()

    def _trip(self, state: str, wait_s: float) -> None:
        if self.state == UP:
            self.trips += 1
            self.down_since = self._clock()
            if self._up_at is not None and self.down_since - self._up_at < self.settle_s:
                self.flaps += 1
                wait_s = max(wait_s, self._flap_wait_s)
        self.state, self._trial = state, False
        self._schedule(wait_s)
        self._start_probing()

    def _auth_failed(self, reason: str) -> None:
        self.last_error = reason
        self.failures += 1
        self.auth_failures += 1
        self._trip(AUTH_FAILED, self.max_s)
        now = self._clock()
        if self._auth_logged_at is None or now - self._auth_logged_at >= AUTH_LOG_EVERY_S:
            self._auth_logged_at = now
            log.warning("%s: the server rejected the credentials (%s); calls are skipped "
                        "until they are fixed", self.label, reason)

    def _start_probing(self) -> None:
        if self._probe is not None and not self._probing and self.state != CLOSED:
            self._probing = True
            self._thread = threading.Thread(target=self._run, name=f"kvtier-{self._name}-probe",
                                            daemon=True)
            self._thread.start()

    # -- the probe thread
    def _run(self) -> None:
        assert self._probe is not None
        while True:
            with self._lock:
                while self.state not in (UP, CLOSED):
                    left = self._retry_at - self._clock()
                    if left <= 0:
                        break
                    self._wake.wait(left)
                if self.state in (UP, CLOSED):
                    self._probing = False
                    return
            try:
                answer = self._probe()
                err = "probe failed"
            except Exception as exc:         # a probe never kills the thread
                answer, err = False, type(exc).__name__
            with self._lock:
                if self.state in (UP, CLOSED):   # a call's success got there first, or closed
                    self._probing = False
                    return
                if isinstance(answer, AuthRejected):
                    self._auth_failed(answer.reason)
                elif answer:
                    self._up()
                    self._probing = False
                    return
                else:
                    self.last_error = err
                    self.failures += 1
                    self._schedule(self._next_wait_s)
