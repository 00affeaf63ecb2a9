"""The controller's timer thread: runs due lease ends, demotions and stagings
on a kvtier thread, never on an engine thread."""
from __future__ import annotations

import logging
import threading

from .controller import LifecycleController

log = logging.getLogger("kvtier.lifecycle")


class LifecycleTimer:
    """A daemon thread ("kvtier-lifecycle") calling ``controller.tick()`` when
    the next timer is due (at least every ``idle_s`` of the clock's wall time).
    Start with :meth:`start`; :meth:`close` stops and joins it (idempotent)."""

    def __init__(self, controller: LifecycleController, idle_s: float = 0.5) -> None:
        self.ctl = controller
        self.idle_s = idle_s
        self._wake = threading.Event()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="kvtier-lifecycle", daemon=True)
        controller.set_waker(self._wake.set)

    def start(self) -> "LifecycleTimer":
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop:
            clock = self.ctl.clock
            due = self.ctl.next_due()
            now = clock.now()
            if due is None or due > now:
                self._wake.clear()
                if due is None:
                    self._wake.wait(self.idle_s)
                else:
                    clock.sleep_until(due, self._wake)
                continue
            try:
                self.ctl.tick()
            except Exception as exc:  # pragma: no cover - tick never raises
                log.warning("kvtier: lifecycle tick failed: %s", exc)

    def close(self) -> None:
        self._stop = True
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
