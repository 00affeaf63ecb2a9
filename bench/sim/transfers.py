"""The node's transfer servers and the transfers in flight (plain data, no policy).

::

    HBM --D2H--> host link --(host frames)          NVME_WRITE: bounce buffers -> NVMe
    HBM <--H2D-- host link <--(host frames)         NVME_READ:  NVMe -> host frames
                                                    background: write-through, NVMe write's spare time

Each leg is a FIFO server with the profile's bandwidth: a transfer occupies it
for ``blocks x seconds-per-block``, starting when the server is free.  The
write-through queue uses the NVMe write server's spare time: each foreground
write queued while it is busy delays every unfinished background write by its
own duration (``wt_shift`` accumulates that delay).

A transfer's ``then`` (:class:`Then`) names what its completion means; the
node's landings (:mod:`.landings`) dispatch on it (one handler per state).
"""
from __future__ import annotations

import enum
import math

from kvtier.tiering.model.costmodel import HardwareProfile


class Leg(enum.IntEnum):
    """A transfer server."""

    D2H = 0          # HBM -> host over the link
    H2D = 1          # host -> HBM over the link
    NVME_WRITE = 2   # bounce buffers / host -> NVMe
    NVME_READ = 3    # NVMe -> host


_BACKGROUND = 4      # index of the write-through queue in TransferServers.free
UTIL_TAU_S = 10.0    # time constant of the busy-fraction estimate
WAIT_EWMA = 0.1      # weight of the newest queue wait in the mean wait a transfer sees


class Then(enum.IntEnum):
    """What the completion of a transfer means (the state of the transfer state machine)."""

    TO_HOST = 0      # D2H of an offload to host: the copy is complete, HBM may be freed
    VIA_NVME = 1     # D2H into bounce buffers: the NVMe write (TO_NVME) follows
    TO_NVME = 2      # NVMe write of an offload: the copy is complete, HBM may be freed
    WRITTEN = 3      # background write-through of a host copy landed
    DEMOTED = 4      # host -> NVMe lease demotion finished
    STAGED = 5       # NVMe -> host staging finished
    THEN_H2D = 6     # NVMe read of a reload: the H2D (LOADED) follows
    LOADED = 7       # H2D of a reload or prefetch: the state is resident in HBM
    FILLED = 8       # a fill from the cluster's remote tier over the NIC (``kind`` None): resident


COPY_OUT = (Then.TO_HOST, Then.VIA_NVME, Then.TO_NVME)    # the states of a copy out of HBM


class Transfer:
    """A transfer in flight (plain data); ``victim_blocks`` > 0 if it frees HBM under pressure.

    ``kind``: its server (None: not one of the node's, the cluster's NIC);
    ``gen``/``target``: write-through generation and the NVMe backing it completes (a fill:
    the tokens its round still recomputes); ``shift0``: :attr:`TransferServers.wt_shift` when
    it was queued; ``fg``: foreground (not a write-through), counted in
    ``TransferEngine.fg_inflight``.
    """

    __slots__ = ("kind", "sess", "blocks", "epoch", "then", "victim_blocks", "gen", "target", "shift0", "fg")

    def __init__(self, kind: Leg | None, sess, blocks: int, epoch: int, then: Then, victim_blocks: int = 0) -> None:
        self.kind, self.sess, self.blocks, self.epoch, self.then = kind, sess, blocks, epoch, then
        self.victim_blocks = victim_blocks
        self.gen = 0
        self.target = 0
        self.shift0 = 0.0
        self.fg = True


class TransferServers:
    """Four FIFO servers plus the background write-through queue (owned by one simulator).

    ``free[leg]`` is the time each server next goes idle; ``moved_bytes[leg]``
    counts bytes queued on it.  Not thread-safe.
    """

    def __init__(self, block_bytes: int, hw: HardwareProfile) -> None:
        self.block_bytes = block_bytes
        self.per_block = (block_bytes / hw.link_d2h_bps, block_bytes / hw.link_h2d_bps,
                          block_bytes / hw.nvme_write_bps, block_bytes / hw.nvme_read_bps)
        self.free = [0.0] * 5
        self.wt_shift = 0.0          # total foreground NVMe write time that preempted write-through
        self.moved_bytes = [0, 0, 0, 0]
        self.busy_s = [0.0, 0.0, 0.0, 0.0]
        self.last_wait = 0.0         # queue wait of the latest transfer queued (seconds)
        self.mean_wait = [0.0, 0.0, 0.0, 0.0]    # EWMA of the queue waits transfers found (arrival view)
        self._busy = [0.0, 0.0, 0.0, 0.0]        # decayed service seconds queued (UTIL_TAU_S)
        self._busy_t = [0.0, 0.0, 0.0, 0.0]
        self.last_dur = 0.0          # ... and its service time

    def queue(self, leg: Leg, blocks: int, now: float, background: bool = False) -> float:
        """Queue ``blocks`` on ``leg`` at ``now``; returns the completion time.  ``background``
        (NVME_WRITE only): the write-through queue, behind every foreground write."""
        dur = blocks * self.per_block[leg]
        free = self.free
        if background:
            start = max(now, free[_BACKGROUND], free[Leg.NVME_WRITE])
            done = start + dur
            free[_BACKGROUND] = done
        else:
            start = max(now, free[leg])
            done = start + dur
            free[leg] = done
            if leg == Leg.NVME_WRITE and free[_BACKGROUND] > start:
                free[_BACKGROUND] += dur
                self.wt_shift += dur
        self.moved_bytes[leg] += blocks * self.block_bytes
        self.busy_s[leg] += dur
        self.last_wait, self.last_dur = start - now, dur
        if not background:
            self.mean_wait[leg] += WAIT_EWMA * (start - now - self.mean_wait[leg])
            self._busy[leg] = self._busy[leg] * math.exp((self._busy_t[leg] - now) / UTIL_TAU_S) + dur
            self._busy_t[leg] = now
        return done

    def utilisation(self, leg: Leg, now: float) -> float:
        """Recent busy fraction of ``leg`` (service queued over the last ~UTIL_TAU_S, capped at 1)."""
        return min(1.0, self._busy[leg] * math.exp((self._busy_t[leg] - now) / UTIL_TAU_S) / UTIL_TAU_S)

    def backlog_s(self, leg: Leg, now: float) -> float:
        """Seconds of queued foreground work on ``leg`` still ahead of a transfer queued at ``now``."""
        return max(0.0, self.free[leg] - now)
