"""Whether speculative staging pays on this engine: the share of staged blocks
still in host frames when their trajectory came back.

A staging (NVMe -> host frames during a pause) saves its trajectory's resume
the NVMe read of those blocks, but only if they are still in host frames when
it resumes.  Where the host tier is much smaller than the paused working set
and every finished request writes its context to host frames, newer writes
push staged blocks out again before they are read, and the staging only spent
disk time, a core and the interpreter lock beside the engine.  Measured on the
live CPU engine (``kvtier bench live``, Mooncake-derived workload, docs/live.md):
breakeven staged 1,106 blocks a run, its resumes read 73 blocks from host frames,
and its median resume TTFT trailed ``lru`` (which moves nothing) by 6 +- 2 ms.

:class:`StagingPayoff` keeps the keys each pause staged; once that trajectory
has resumed, the lifecycle thread looks up which of them are in host frames
(a resume reads them and evicts nothing) and adds ``(staged, kept)`` to a
window of the last ``window`` pauses that staged.  While at least ``min_pauses``
are in the window and they kept less than ``min_kept`` of what they staged,
:meth:`allow` refuses the *speculative* stagings (the plugins' "bring the rest
of a host plan back at the pause" and the restores of pushed-out pauses) but
every ``probe_every``-th, so the measure follows the workload.  Stagings a
lease or a plan's timer asks for always run.

Threading: every method is called from the lifecycle's threads with the
core's ``_io`` held (one move at a time), or with ``Shared.lock`` held for
:meth:`allow` from a pause; a small lock of its own guards the state.
"""
from __future__ import annotations

import threading
from collections import deque


class StagingPayoff:
    """See the module doc.  Raises ValueError for a bad bound."""

    def __init__(self, *, window: int = 16, min_pauses: int = 4, min_kept: float = 0.5,
                 probe_every: int = 8) -> None:
        if window < 1 or min_pauses < 1 or probe_every < 1 or not 0.0 <= min_kept <= 1.0:
            raise ValueError("window, min_pauses, probe_every >= 1 and 0 <= min_kept <= 1")
        self.window, self.min_pauses, self.min_kept, self.probe_every = window, min_pauses, min_kept, probe_every
        self._lock = threading.Lock()
        self._open: dict[str, tuple[int, list[bytes]]] = {}   # tid -> (pause number, keys staged in it)
        self._done: deque[tuple[int, int]] = deque(maxlen=window)
        self._refused = 0

    def staged(self, tid: str, pause_no: int, keys: list[bytes]) -> None:
        """``keys`` of ``tid`` went to host frames in its pause ``pause_no``."""
        if not keys:
            return
        with self._lock:
            no, old = self._open.get(tid, (pause_no, []))
            self._open[tid] = (pause_no, (old if no == pause_no else []) + list(keys))

    def forget(self, tid: str) -> None:
        with self._lock:
            self._open.pop(tid, None)

    def due(self, pause_of: "dict[str, int | None]") -> list[tuple[str, list[bytes]]]:
        """The staged keys of trajectories that resumed since (``pause_of``: each
        tracked tid's current pause number, None when it is gone); those entries
        leave the ledger (a gone trajectory's without a verdict)."""
        out = []
        with self._lock:
            for tid, (no, keys) in list(self._open.items()):
                now = pause_of.get(tid, None)
                if now is None or now != no:
                    del self._open[tid]
                    if now is not None:
                        out.append((tid, keys))
        return out

    def tracked(self) -> list[str]:
        with self._lock:
            return list(self._open)

    def resumed(self, staged: int, kept: int) -> None:
        """A pause that staged ``staged`` blocks resumed with ``kept`` of them in host frames."""
        if staged > 0:
            with self._lock:
                self._done.append((staged, max(0, min(staged, kept))))

    def pays(self) -> bool:
        """Staging kept at least ``min_kept`` of its blocks until the resume (or too few pauses to say)."""
        with self._lock:
            if len(self._done) < self.min_pauses:
                return True
            staged = sum(s for s, _ in self._done)
            return sum(k for _, k in self._done) >= self.min_kept * staged

    def allow(self) -> bool:
        """May a speculative staging run now (module doc)?"""
        if self.pays():
            return True
        with self._lock:
            self._refused += 1
            return self._refused % self.probe_every == 0
