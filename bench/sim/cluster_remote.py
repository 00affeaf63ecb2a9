"""The cluster's shared remote tier (a Redis / Mooncake Store of KV blocks), modelled.

Every node reaches it through its own NIC: one FIFO server each way per node,
``gbps`` GB/s (10^9 B/s), plus ``latency_s`` per transfer (one batch of
blocks).  The store keeps, per trajectory, the prefix of its private KV
blocks that has been published (content-addressed: a later pause publishes
only the blocks added since, as the node's lower tiers do); shared prefixes
are not published (every node keeps its own resident).  Blocks of one publish
land one after another at the NIC rate, so a reader sees the prefix landed so
far.  A reader may also wait for a publish still under way
(``RemoteConfig.stream_inflight``): its fetch then streams the published
blocks, each one leaving the store once it has landed (:meth:`RemoteTier.fetch`
with ``stream=True``), as a reader that finds the writer's pending marker
waits for the batch put instead of missing.  A store with finite ``capacity_bytes`` evicts whole trajectories,
oldest publish first, never one being read (Mooncake's full segments and
Redis' ``allkeys-lru`` evict silently); a publish that still does not fit is
skipped.  A finished trajectory's values are released.

Plain arithmetic, no events: transfers are booked on the servers' free-at
times and the caller schedules what follows.  Not thread-safe (the cluster's
event loop owns it).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from kvtier.tiering.model.costmodel import GB


@dataclass(frozen=True)
class RemoteConfig:
    """The remote tier as every node sees it (every field is a CLI flag)."""

    gbps: float                        # per node, each way, GB/s
    latency_s: float = 1e-3            # per transfer
    capacity_bytes: float = math.inf   # the whole store
    stream_inflight: bool = True       # a fill may wait for blocks still landing (False: landed ones only)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.gbps) and self.gbps > 0):
            raise ValueError(f"remote bandwidth must be a positive number of GB/s, got {self.gbps!r}")
        if not (math.isfinite(self.latency_s) and self.latency_s >= 0):
            raise ValueError(f"remote latency must be a finite number >= 0, got {self.latency_s!r}")
        if not (self.capacity_bytes > 0):
            raise ValueError(f"remote capacity must be positive, got {self.capacity_bytes!r}")
        if not isinstance(self.stream_inflight, bool):
            raise ValueError(f"stream_inflight must be true or false, got {self.stream_inflight!r}")


class _Entry:
    """One trajectory's published blocks: segments (lo, hi, t0, per): block j of [lo, hi)
    has landed at t0 + (j - lo + 1) * per."""

    __slots__ = ("segs", "blocks", "readers")

    def __init__(self) -> None:
        self.segs: list[tuple[int, int, float, float]] = []
        self.blocks = 0
        self.readers = 0


class RemoteTier:
    """The shared store and the nodes' NIC servers.  ``node`` arguments are node indices."""

    def __init__(self, cfg: RemoteConfig, block_bytes: int, nodes: int) -> None:
        if block_bytes < 1 or nodes < 1:
            raise ValueError("block_bytes and nodes must be >= 1")
        self.cfg = cfg
        self.bb = block_bytes
        self.per_block = block_bytes / (cfg.gbps * GB)
        self.lat = cfg.latency_s
        self.cap_blocks = math.inf if math.isinf(cfg.capacity_bytes) else int(cfg.capacity_bytes // block_bytes)
        self.used = 0
        self.peak = 0
        self.entries: dict[str, _Entry] = {}        # insertion order = oldest publish first
        self.put_free = [0.0] * nodes
        self.get_free = [0.0] * nodes
        self.blocks_put = 0
        self.blocks_got = 0
        self.publishes = 0
        self.fetches = 0
        self.evicted = 0
        self.skipped = 0

    # ------------------------------------------------------------ writes
    def publish(self, node: int, sid: str, blocks: int, now: float) -> int:
        """Queue trajectory ``sid``'s blocks up to ``blocks`` on ``node``'s NIC (those not
        already published or on their way).  Returns the blocks queued (0: nothing new, or no
        room even after evicting)."""
        e = self.entries.get(sid)
        have = e.blocks if e is not None else 0
        delta = blocks - have
        if delta <= 0:
            return 0
        if not self._room(delta, sid):
            self.skipped += 1
            return 0
        if e is None:
            e = self.entries[sid] = _Entry()
        else:                                        # most recently published goes last
            del self.entries[sid]
            self.entries[sid] = e
        start = max(now, self.put_free[node])
        t0 = start + self.lat
        self.put_free[node] = t0 + delta * self.per_block
        e.segs.append((have, blocks, t0, self.per_block))
        e.blocks = blocks
        self.used += delta
        self.peak = max(self.peak, self.used)
        self.blocks_put += delta
        self.publishes += 1
        return delta

    def _room(self, need: int, keep: str) -> bool:
        if self.used + need <= self.cap_blocks:
            return True
        for sid in list(self.entries):
            e = self.entries[sid]
            if sid == keep or e.readers:
                continue
            self._remove(sid)
            self.evicted += 1
            if self.used + need <= self.cap_blocks:
                return True
        return False

    def _remove(self, sid: str) -> None:
        e = self.entries.pop(sid)
        self.used -= e.blocks

    def release(self, sid: str) -> None:
        """The trajectory finished: its values go (no-op if it has none)."""
        if sid in self.entries:
            self._remove(sid)

    # ------------------------------------------------------------ reads
    def available(self, sid: str, now: float) -> int:
        """Blocks of ``sid``'s prefix that have landed by ``now``."""
        e = self.entries.get(sid)
        if e is None:
            return 0
        got = 0
        for lo, hi, t0, per in e.segs:
            k = hi - lo if now >= t0 + (hi - lo) * per else max(0, int((now - t0) / per))
            got = lo + min(k, hi - lo)
            if k < hi - lo:
                break
        return got

    def published(self, sid: str) -> int:
        """Blocks of ``sid``'s prefix published so far, landed or still on their way."""
        e = self.entries.get(sid)
        return e.blocks if e is not None else 0

    def landing_bound(self, sid: str, blocks: int) -> float:
        """The earliest a streamed read of ``sid``'s first ``blocks`` blocks can finish, from the
        landing times alone: max over j < blocks of land_j + (blocks - j) x per_block (block j
        cannot leave before it has landed; the rest follow it one per_block each).  -inf when
        nothing bounds it.  Pure."""
        e = self.entries.get(sid)
        out = -math.inf
        if e is None:
            return out
        for lo, hi, t0, per in e.segs:
            if lo >= blocks:
                break
            top = min(hi, blocks)
            # land_j + (blocks - j) * pb is linear in j: its maximum is at an end of the segment
            for j in (lo, top - 1):
                out = max(out, t0 + (j - lo + 1) * per + (blocks - j) * self.per_block)
        return out

    def fetch_done_at(self, node: int, blocks: int, now: float, sid: str | None = None) -> float:
        """When a fetch of ``blocks`` queued now on ``node``'s NIC would finish (books nothing).
        ``sid``: a streamed read of that trajectory, which also waits for its blocks to land."""
        done = max(now, self.get_free[node]) + self.lat + blocks * self.per_block
        if sid is not None:
            done = max(done, self.landing_bound(sid, blocks))
        return done

    def fetch(self, node: int, sid: str, blocks: int, now: float, *, stream: bool = False) -> float:
        """Book a fetch of ``blocks`` of ``sid`` on ``node``'s NIC; the entry is pinned until
        :meth:`end_read`.  ``stream``: the blocks may still be landing (the NIC is booked until the
        last one is through).  Returns the time it finishes.  Raises KeyError if ``sid`` has none."""
        e = self.entries[sid]
        done = self.fetch_done_at(node, blocks, now, sid if stream else None)
        self.get_free[node] = done
        e.readers += 1
        self.blocks_got += blocks
        self.fetches += 1
        return done

    def end_read(self, sid: str) -> None:
        e = self.entries.get(sid)
        if e is not None and e.readers:
            e.readers -= 1

    def stats(self) -> dict:
        gb = self.bb / GB
        return {"gbps_per_node": self.cfg.gbps, "latency_s": self.lat, "stream_inflight": self.cfg.stream_inflight,
                "capacity_gb": None if math.isinf(self.cap_blocks) else self.cap_blocks * gb,
                "published_gb": self.blocks_put * gb, "fetched_gb": self.blocks_got * gb,
                "publishes": self.publishes, "fetches": self.fetches, "peak_gb": self.peak * gb,
                "evicted_trajectories": self.evicted, "publishes_skipped_full": self.skipped}
