"""The one circuit breaker (kvtier/util/breaker.py).

Without a probe (the service policy's shape) the state machine runs on a fake
clock; with a probe (the remote tier's shape) a real daemon thread retries,
and the tests wait for states, never for durations.
"""
from __future__ import annotations

import logging
import subprocess
import sys
import threading

import pytest

from kvtier.util.breaker import AUTH_LOG_EVERY_S, AuthRejected, CircuitBreaker

WAIT_S = 10.0          # a generous bound for a background thread to get somewhere


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def advance(self, s: float) -> None:
        self.t += s


def callers_breaker(clock: FakeClock, threshold: int = 3) -> CircuitBreaker:
    return CircuitBreaker(threshold=threshold, base_s=10.0, max_s=40.0, name="svc", clock=clock)


def auth_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and "credentials" in r.getMessage()]


# -- without a probe: the caller's next call after the cooldown is the retry

def test_threshold_consecutive_failures_take_it_down_and_a_success_resets_the_count():
    clock = FakeClock()
    b = callers_breaker(clock)
    assert b.state == "up" and b.allow()
    b.failure("timeout")
    b.failure("timeout")
    b.success()                                    # not consecutive: the count starts again
    assert b.state == "up" and b.failures == 0
    b.failure("timeout")
    b.failure("timeout")
    assert b.state == "up" and b.failures == 2 and b.trips == 0
    b.failure("refused")                           # the third in a row
    assert b.state == "down" and b.trips == 1 and b.failures == 3
    assert b.last_error == "refused" and b.down_since == clock.t


def test_the_retry_comes_after_the_cooldown_and_only_one_caller_gets_it():
    clock = FakeClock()
    b = callers_breaker(clock, threshold=1)
    b.failure()
    # during the cooldown nobody goes through
    clock.advance(9.9)
    assert not b.would_allow() and not b.allow()
    # after it: one caller is the retry, the others keep skipping
    clock.advance(0.1)
    assert b.would_allow()
    assert b.allow()
    assert not b.allow() and not b.would_allow() and b.state == "down"
    # the retry succeeds: up, everyone goes through
    b.success()
    assert b.state == "up" and b.failures == 0 and b.down_since is None
    assert b.allow() and b.allow()


def test_failed_retries_double_the_cooldown_up_to_the_cap():
    clock = FakeClock()
    b = callers_breaker(clock, threshold=1)        # base 10 s, cap 40 s
    b.failure()
    waits = []
    for _ in range(5):
        waited = 0.0
        while not b.allow():
            clock.advance(1.0)
            waited += 1.0
        waits.append(waited)
        b.failure("still dead")                    # the retry fails
    assert waits == [10.0, 20.0, 40.0, 40.0, 40.0]
    assert b.state == "down" and b.trips == 1 and b.failures == 6
    # back up, and up for longer than settle_s: the next trip starts again from the base cooldown
    clock.advance(40.0)
    assert b.allow()
    b.success()
    clock.advance(b.settle_s)
    b.failure()
    clock.advance(10.0)
    assert b.allow() and b.trips == 2 and b.flaps == 0


def test_a_server_that_answers_the_retry_but_fails_the_next_call_backs_off_further():
    # a flap: a slow server lets the retry (a small request) through, then times out the next real
    # call; each such trip waits twice the last cooldown instead of the base, up to the cap
    clock = FakeClock()
    b = callers_breaker(clock, threshold=1)        # base 10 s, cap 40 s, settle_s 80 s
    b.failure("timeout")
    waits = []
    for _ in range(4):
        waited = 0.0
        while not b.allow():
            clock.advance(1.0)
            waited += 1.0
        waits.append(waited)
        b.success()                                # the retry goes through ...
        clock.advance(1.5)
        b.failure("timeout")                       # ... and the next call times out
    assert waits == [10.0, 20.0, 40.0, 40.0]
    assert b.trips == 5 and b.flaps == 4 and b.state == "down"


def test_a_late_failure_while_down_is_counted_but_does_not_move_the_retry():
    clock = FakeClock()
    b = callers_breaker(clock, threshold=1)
    b.failure()
    clock.advance(5.0)
    b.failure("a call that started before the trip")
    assert b.failures == 2 and b.trips == 1
    clock.advance(5.0)
    assert b.allow()                               # still 10 s after the trip


def test_a_rejected_password_is_auth_failed_at_once_with_one_warning_per_minute(caplog):
    clock = FakeClock()
    b = CircuitBreaker(threshold=3, base_s=10.0, max_s=40.0, name="svc",
                       label="service http://host:1", clock=clock)
    with caplog.at_level(logging.WARNING, logger="kvtier.util.breaker"):
        b.auth_failure("WRONGPASS")                # one is enough, whatever the threshold
        assert b.state == "auth_failed" and b.trips == 1 and b.auth_failures == 1
        assert len(auth_warnings(caplog)) == 1
        assert "service http://host:1" in auth_warnings(caplog)[0]
        # the retry waits the longest cooldown, and fails the same way: no second WARNING yet
        clock.advance(39.0)
        assert not b.allow()
        clock.advance(1.0)
        assert b.allow()
        b.auth_failure("WRONGPASS")
        assert b.auth_failures == 2 and len(auth_warnings(caplog)) == 1
        # a minute later it is said again
        clock.advance(AUTH_LOG_EVERY_S)
        b.auth_failure("WRONGPASS")
        assert len(auth_warnings(caplog)) == 2
        # fixed: the retry succeeds, and a later rejection is news again
        clock.advance(40.0)
        assert b.allow()
        b.success()
        assert b.state == "up" and b.trips == 1
        b.auth_failure("WRONGPASS")
        assert len(auth_warnings(caplog)) == 3 and b.trips == 2


def test_closed_is_final():
    clock = FakeClock()
    b = callers_breaker(clock)
    b.close()
    b.success()
    b.failure()
    b.auth_failure("x")
    clock.advance(1000.0)
    assert b.state == "closed" and not b.allow() and not b.would_allow()
    assert b.failures == 0 and b.auth_failures == 0
    assert b.wait_up(0.0) is False
    b.close()                                      # idempotent


@pytest.mark.parametrize("kw", [dict(threshold=0), dict(base_s=0.0), dict(base_s=5.0, max_s=1.0)])
def test_bad_settings_are_rejected(kw):
    with pytest.raises(ValueError, match="threshold"):
        CircuitBreaker(**kw)


# -- with a probe: a daemon thread retries while it is not up

class Server:
    """What the probe sees: up or not, or rejecting the password; counts the probes."""

    def __init__(self, answer) -> None:
        self.answer = answer
        self.probes = 0
        self.reached = threading.Condition()

    def probe(self):
        with self.reached:
            self.probes += 1
            self.reached.notify_all()
        answer = self.answer
        if isinstance(answer, Exception):
            raise answer
        return answer

    def wait_probes(self, n: int) -> bool:
        with self.reached:
            return self.reached.wait_for(lambda: self.probes >= n, WAIT_S)


def probed(server: Server, **kw) -> CircuitBreaker:
    return CircuitBreaker(threshold=1, base_s=0.001, max_s=0.004, probe=server.probe, name="fake", **kw)


def probe_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "kvtier-fake-probe"]


def test_the_probe_connects_in_the_background_and_stops_once_up():
    server = Server(False)
    b = probed(server)
    try:
        assert b.state == "connecting" and not b.allow()
        assert server.wait_probes(3)               # failed probes keep coming
        assert b.state == "connecting" and not b.up and b.last_error == "probe failed"
        server.answer = True
        assert b.wait_up(WAIT_S)
        assert b.failures == 0 and b.trips == 0 and b.down_since is None
        for t in probe_threads():
            t.join(WAIT_S)
        assert probe_threads() == []               # no thread while up
    finally:
        b.close()


def test_a_failed_call_trips_it_and_the_probe_brings_it_back():
    server = Server(True)
    b = probed(server)
    try:
        assert b.wait_up(WAIT_S)
        server.answer = False
        b.failure("ConnectionResetError")          # threshold 1: the first failure trips it
        assert b.state == "down" and b.trips == 1 and not b.allow()
        seen = server.probes
        assert server.wait_probes(seen + 2)
        assert b.state == "down"
        server.answer = True
        assert b.wait_up(WAIT_S) and b.trips == 1 and b.failures == 0
    finally:
        b.close()


def test_a_probe_that_raises_is_a_failed_probe_and_the_thread_lives_on():
    server = Server(OSError("boom"))
    b = probed(server)
    try:
        assert server.wait_probes(2)
        assert b.state == "connecting" and b.last_error == "OSError"
        server.answer = True
        assert b.wait_up(WAIT_S)
    finally:
        b.close()


def test_a_probe_that_reports_a_rejected_password_is_auth_failed_with_one_warning(caplog):
    server = Server(AuthRejected("WRONGPASS"))
    with caplog.at_level(logging.WARNING, logger="kvtier.util.breaker"):
        b = probed(server, label="remote tier redis://host:6379")
        try:
            assert server.wait_probes(3)           # rejected again and again...
            assert b.state == "auth_failed" and b.auth_failures >= 2
            assert len(auth_warnings(caplog)) == 1  # ...said once
            assert "remote tier redis://host:6379" in auth_warnings(caplog)[0]
            server.answer = True
            assert b.wait_up(WAIT_S) and b.last_error == "WRONGPASS"
        finally:
            b.close()


def test_close_stops_the_probe_thread():
    server = Server(False)
    b = probed(server)
    assert server.wait_probes(1)
    b.close()
    assert b.state == "closed" and probe_threads() == []
    assert b.wait_up(WAIT_S) is False and not b.allow()   # closed: answers at once, never up


def test_the_module_imports_no_store_tiering_or_torch(tmp_path):
    code = ("import sys, kvtier.util.breaker; "
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith(('kvtier.store', "
            "'kvtier.tiering'))))")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


# -- the service policy's breaker over a real refused connection, on a fake clock

def test_the_service_policy_stops_asking_a_refused_service_and_retries_after_the_cooldown():
    pytest.importorskip("httpx", reason="the client extra is not installed")
    import socket
    import time

    from kvtier.tiering import make_policy
    from kvtier.tiering.lifecycle.service_policy import ServicePolicy
    from kvtier.tiering.model.decision import PauseContext
    from kvtier.tiering.model.presets import DEFAULT_NODE, get_node, get_preset
    with socket.socket() as s:                     # a port nobody listens on: refused at once
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    clock = FakeClock()
    local = make_policy("breakeven", geometry=get_preset("qwen3-0.6b"), hardware=get_node(DEFAULT_NODE))
    pol = ServicePolicy(f"http://127.0.0.1:{port}", "qwen3-0.6b", local=local, timeout_s=2.0, clock=clock)

    def settled(failures: int) -> bool:            # the fetch thread has reported `failures` failures
        deadline = time.monotonic() + WAIT_S
        while pol.counters["fetch_failures"] < failures and time.monotonic() < deadline:
            time.sleep(0.01)
        return pol.counters["fetch_failures"] == failures

    def ask(tool: str) -> None:
        pol.decide(PauseContext(tool=tool, kv_bytes=1 << 20, context_tokens=1000))

    try:
        assert pol.stats()["breaker"] == "up"
        for tool in ("a", "b", "c"):               # three failures in a row take it down
            ask(tool)
            assert settled(["a", "b", "c"].index(tool) + 1)
        assert pol.stats()["breaker"] == "down" and pol.stats()["breaker_trips"] == 1
        # during the 10 s cooldown nothing is asked
        clock.advance(9.0)
        ask("d")
        assert pol.counters["breaker_skips"] == 1
        # after it, the next call is the retry; it fails, and the wait doubles
        clock.advance(1.0)
        ask("e")
        assert settled(4) and pol.stats()["breaker"] == "down"
        clock.advance(10.0)
        ask("f")
        assert pol.counters["breaker_skips"] == 2
        clock.advance(10.0)
        ask("g")
        assert settled(5) and pol.stats()["breaker_trips"] == 1
    finally:
        pol.close()
