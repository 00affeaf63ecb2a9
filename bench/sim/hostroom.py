"""Host room: free host frames for a new host copy by dropping copies that are not needed.

:class:`HostRoom` drops clean copies (duplicates of what their session holds in
HBM again) oldest first, then, under write-through, durable copies of paused
trajectories (their NVMe backing becomes their only copy) in the policy's
``victim_priority`` order (:class:`~kvtier.bench.sim.contexts.VictimRanking`).
One owner, the node's event loop; not thread-safe.
"""
from __future__ import annotations

from kvtier.bench.sim.contexts import VictimRanking
from kvtier.bench.sim.ledger import Ledger
from kvtier.bench.sim.metrics import SimCounters
from kvtier.bench.sim.node import PAUSED, SessionState


class HostRoom:
    """Makes host room on the :class:`Ledger` (see the module docstring)."""

    def __init__(self, ledger: Ledger, ranking: VictimRanking, m: SimCounters) -> None:
        self._ledger = ledger
        self._ranking = ranking
        self._m = m

    def make(self, need: int, exclude: SessionState, above: float | None = None) -> bool:
        """Make ``need`` host blocks free, dropping clean copies oldest first, then (write-through)
        durable copies of paused trajectories in the policy's ``victim_priority`` order (highest
        first; default: the longest-paused first), only those ranked above ``above`` if given.
        Never x's own (``exclude``).  True if the room is there."""
        led = self._ledger
        if led.host_used + need <= led.host_total:
            return True
        for v in list(led.clean):
            if v is exclude:
                continue
            led.set_copy(v, None, 0)
            self._m.clean_dropped += 1
            if led.host_used + need <= led.host_total:
                return True
        if not led.durable or led.host_used - led.durable_blocks + need > led.host_total:
            return False
        cands = [v for v in led.durable if v is not exclude and v.phase == PAUSED and v.moving is None]
        for p, v in self._ranking.host_order(cands):
            if above is not None and p <= above:
                break
            led.host_to_nvme(v)
            self._m.wt_dropped += 1
            if led.host_used + need <= led.host_total:
                return True
        return False
