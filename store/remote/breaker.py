"""A circuit breaker for the remote tier: calls go through only while it is up.

States::

    connecting ──probe ok──> up ──a call fails──> down ──probe ok──> up
        │                                           ▲  │
        └────────────probe fails────────────────────┘  └─ probe fails: backoff x2

    any of them ──credentials rejected (probe or call)──> auth_failed ──probe ok──> up

While not ``up`` every call is answered at once (as a miss by the tier), so
a dead server costs the engine nothing after the one call that noticed.  A
daemon thread probes in the background with exponential backoff, from
``base_s`` to at most ``max_s`` (0.25 s .. 4 s): the tier is back at most
``max_s`` plus one probe after the server returns (well under 10 s).

``auth_failed`` is ``down`` with a reason an operator must act on: the
server answers but rejects the password or ACL user.  Entering it logs one
WARNING (at most one per ``AUTH_LOG_EVERY_S`` while it lasts) naming the
redacted URL, never a secret; the probe keeps trying at ``max_s``.

Threading: any thread may call every method; ``_lock`` guards the state;
the probe thread is the only one that calls ``probe``.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from .backend import RemoteAuthFailed

UP, DOWN, CONNECTING, CLOSED, AUTH_FAILED = "up", "down", "connecting", "closed", "auth_failed"
AUTH_LOG_EVERY_S = 60.0
log = logging.getLogger(__name__)


class CircuitBreaker:
    def __init__(self, probe: Callable[[], bool], base_s: float = 0.25, max_s: float = 4.0,
                 name: str = "remote", url: str | None = None) -> None:
        self._probe = probe
        self.base_s, self.max_s = base_s, max_s
        self._name = name
        self._url = url or name          # redacted: what the WARNING names
        self._auth_logged_at: float | None = None
        self.auth_failures = 0           # credential rejections seen (calls and probes)
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self.state = CONNECTING
        self.trips = 0                  # times it went from up to down
        self.failures = 0               # consecutive failed calls and probes (0 while up)
        self.last_error: str | None = None
        self.down_since: float | None = time.monotonic()
        self._thread: threading.Thread | None = None
        self._probing = False           # a probe thread runs (set and cleared under the lock)
        with self._lock:
            self._start_probing()

    @property
    def up(self) -> bool:
        return self.state == UP

    def failure(self, reason: str) -> None:
        """A call failed: go down (if up) and probe in the background."""
        with self._lock:
            self.last_error = reason
            self.failures += 1
            if self.state != UP:
                return
            self.state = DOWN
            self.trips += 1
            self.down_since = time.monotonic()
            self._start_probing()

    def auth_failure(self, reason: str) -> None:
        """The server rejected the credentials: state ``auth_failed``, one
        rate-limited WARNING, probing in the background."""
        with self._lock:
            if self.state == CLOSED:
                return
            self._auth_failed_locked(reason)
            self._start_probing()

    def _auth_failed_locked(self, reason: str) -> None:
        self.last_error = reason
        self.failures += 1
        self.auth_failures += 1
        if self.state == UP:
            self.trips += 1
            self.down_since = time.monotonic()
        self.state = AUTH_FAILED
        now = time.monotonic()
        if self._auth_logged_at is None or now - self._auth_logged_at >= AUTH_LOG_EVERY_S:
            self._auth_logged_at = now
            log.warning("remote tier %s: the server rejected the credentials (%s); every remote "
                        "lookup is a miss until they are fixed", self._url, reason)

    def wait_up(self, timeout: float) -> bool:
        """Block until up (or ``timeout`` seconds); True if up."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self.state not in (UP, CLOSED):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._wake.wait(left)
            return self.state == UP

    def close(self) -> None:
        with self._lock:
            self.state = CLOSED
            self._wake.notify_all()
            t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout=self.max_s + 1)

    # lock held
    def _start_probing(self) -> None:
        if not self._probing:
            self._probing = True
            self._thread = threading.Thread(target=self._run, name=f"kvtier-{self._name}-probe",
                                            daemon=True)
            self._thread.start()

    def _run(self) -> None:
        delay = 0.0
        while True:
            with self._lock:
                if delay:
                    self._wake.wait(delay)
                if self.state in (UP, CLOSED):
                    self._probing = False
                    return
            auth = None
            try:
                ok = bool(self._probe())
            except RemoteAuthFailed as exc:
                ok, err, auth = False, None, str(exc)
            except Exception as exc:       # a probe never kills the thread
                ok, err = False, type(exc).__name__
            else:
                err = None if ok else "probe failed"
            with self._lock:
                if self.state == CLOSED:
                    self._probing = False
                    return
                if auth is not None:
                    self._auth_failed_locked(auth)
                    delay = self.max_s
                    continue
                if ok:
                    self.state = UP
                    self._auth_logged_at = None
                    self.failures = 0
                    self.down_since = None
                    self._probing = False
                    self._wake.notify_all()
                    return
                self.last_error = err or self.last_error
                self.failures += 1
            delay = self.base_s if not delay else min(self.max_s, delay * 2)
