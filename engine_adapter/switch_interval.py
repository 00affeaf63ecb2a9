"""The engine process's thread switch interval, lowered while kvtier's threads share it.

CPython hands the interpreter lock from a thread running Python to one that
wants it only when the holder blocks or when the switch interval (5 ms by
default, ``sys.getswitchinterval``) has passed since the waiter asked.  An
engine's step loop runs Python almost all the time, and while a request waits
for its KV it spins steps, so every time a kvtier I/O thread comes back from a
call that released the lock (an ``io_uring`` wait, a checksum, a ``memmove``)
it may wait a whole interval to go on.  A vLLM resume's load job makes tens of
such calls: measured on the live CPU engine (``kvtier bench live``, Mooncake
workload, one run each, idle 2-core machine) a load job took 56-63 ms at 5 ms,
15 ms at 1 ms, 8-10 ms at 0.5 ms and 6-8 ms at 0.2 ms, and the resume TTFT's
median fell from 155-164 ms to 95-109 ms.

The interval costs nothing while no other thread waits for the lock, so a
lower one only changes how quickly kvtier's threads get their turn when they
have work.  The plugins lower it at their start (``switch_interval_ms``, 0.5 by
default; 0 leaves the process's own); it is never raised.

Threading: called from an engine thread at a plugin's construction.
"""
from __future__ import annotations

import logging
import math
import sys

log = logging.getLogger("kvtier.engine")


def lower_switch_interval(ms: float) -> float | None:
    """Lower the process's switch interval to ``ms`` milliseconds if it is higher now.

    Returns the interval it replaced, in seconds (None: left as it was, for
    ``ms == 0`` or a process already at ``ms`` or lower).

    Raises:
        ValueError: ``ms`` negative or not finite.
    """
    if isinstance(ms, bool) or not isinstance(ms, (int, float)) or not math.isfinite(ms) or ms < 0:
        raise ValueError(f"switch_interval_ms must be a number >= 0, got {ms!r}")
    if ms == 0:
        return None
    was = sys.getswitchinterval()
    want = ms / 1000.0
    if was <= want:
        return None
    sys.setswitchinterval(want)
    log.info("kvtier: thread switch interval %.3g ms -> %.3g ms (switch_interval_ms; 0 leaves it)", was * 1e3, ms)
    return was
