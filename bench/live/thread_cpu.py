"""What kvtier's own threads cost a turn of an in-process engine.

On vLLM's CPU platform the engine's forward pass, its Python loop and kvtier's
threads (the store's I/O pool and hasher, the lifecycle's timer) share the
cores and the interpreter lock.  Per engine call, a :class:`TurnMeter` reads
the CPU time every ``kvtier-*`` thread ran meanwhile
(``/proc/self/task/<tid>/schedstat``, nanoseconds) and the calling thread's
voluntary context switches (``getrusage(RUSAGE_THREAD)``: each one a wait,
for the interpreter lock, a lock or a sleep).  The benchmark reports both per
resume, so a difference in a resume's time to the first token can be set
beside the work kvtier's threads did inside it (docs/live.md).

Linux only: elsewhere ``TurnMeter.available`` is False and nothing is measured.
"""
from __future__ import annotations

import resource
import sys
import threading
from dataclasses import dataclass

KVTIER_PREFIX = "kvtier-"


@dataclass(frozen=True)
class Mark:
    """A meter's reading at a turn's start."""
    cpu_ns: dict[int, int]      # native thread id -> CPU ns so far, kvtier's threads
    waits: int                  # the calling thread's voluntary context switches so far


@dataclass(frozen=True)
class TurnCost:
    kvtier_cpu_s: float         # CPU seconds kvtier's threads ran during the turn
    engine_waits: int           # the calling thread's voluntary context switches during it


class TurnMeter:
    """Reads :class:`TurnCost` around an engine call.  Threading: :meth:`start`
    and :meth:`stop` are called on the thread that calls the engine (its
    context switches are the ones counted).  Never raises: a thread that ends
    during a turn loses its CPU from the count; one that starts counts whole."""

    available = sys.platform.startswith("linux") and hasattr(resource, "RUSAGE_THREAD")

    def __init__(self, prefix: str = KVTIER_PREFIX) -> None:
        self.prefix = prefix

    def _cpu(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for t in threading.enumerate():
            tid = t.native_id
            if tid is None or not t.name.startswith(self.prefix):
                continue
            try:
                with open(f"/proc/self/task/{tid}/schedstat") as f:
                    out[tid] = int(f.read().split()[0])
            except (OSError, ValueError, IndexError):
                continue
        return out

    def start(self) -> Mark | None:
        if not self.available:
            return None
        return Mark(self._cpu(), resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw)

    def stop(self, mark: Mark | None) -> TurnCost | None:
        if mark is None:
            return None
        waits = resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw - mark.waits
        ns = sum(v - mark.cpu_ns.get(tid, 0) for tid, v in self._cpu().items())
        return TurnCost(kvtier_cpu_s=max(0, ns) / 1e9, engine_waits=waits)
