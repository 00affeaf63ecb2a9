"""StoreParts: a ``TieredStore``'s parts, built in order and closed in reverse.

Which part owns what (each module's header has the details)::

    BlockTable   entries, LRUs, pins, handles, counters, the store lock   (blocks.py)
    IndexKeeper  the LMDB index: background load, commits, rebuilds      (indexing.py)
    BlockIO      frame copies, NVMe writes, verified reads (no lock)      (blockio.py)
    Expiry       blocks leaving: drop, evict, corrupt                     (expiry.py)
    Placement    frames and slots for new blocks; eviction, demotion      (placement.py)
    TwoPhase     prepare/complete jobs and their staging memory           (twophase.py)
    OneShot      put_many / get_many                                      (oneshot.py)
    Lifetime     queries, pin/unpin, demote, drop                         (lifetime.py)
    Books        stats, integrity                                         (books.py)

Threads: :func:`open_parts` and :meth:`StoreParts.close` run on the thread
that opens or closes the store, with the root's flock held and no call in
flight; the fields are set once and never reassigned.
"""
from __future__ import annotations

import errno
import functools
import logging
from dataclasses import dataclass

from . import unclean
from .blockio import BlockIO
from .blocks import BlockTable
from .books import Books
from .config import StoreConfig
from .entry import check_tier
from .events import EventHub
from .expiry import Expiry
from .hostpool import FramePool
from .index_setup import layout_of, open_index
from .indexing import IndexKeeper
from .throttle import store_engine
from .layout import check_format
from .lifetime import Lifetime
from .nvme import NvmeTier
from .oneshot import OneShot
from .placement import Placement
from .twophase import TwoPhase

log = logging.getLogger("kvtier.store.tiered")


@dataclass
class StoreParts:
    """A store's parts (see the module doc); ``TieredStore.parts`` for tools and white-box tests."""
    engine: object
    nvme: NvmeTier
    pool: FramePool
    table: BlockTable
    keeper: IndexKeeper
    io: BlockIO
    expiry: Expiry
    placement: Placement
    jobs: TwoPhase
    oneshot: OneShot
    lifetime: Lifetime
    books: Books
    marked_open: bool    # the root's OPEN marker is ours to remove at a clean close (store/unclean.py)

    def close(self, cfg: StoreConfig) -> None:
        """Stop the index load, close every part, mark a clean close.  Once."""
        self.keeper.stop()
        self.keeper.join()
        self.jobs.close()
        for part in (self.nvme, self.engine, self.pool):
            part.close()
        flushed = self.keeper.close()
        if self.marked_open and flushed:     # the index holds every commit now: a clean close
            try:
                unclean.mark_closed(cfg.root_path)
            except OSError as exc:
                log.warning("could not remove %s/OPEN (the next open rebuilds only after a restart): %s",
                            cfg.root_path, exc.strerror)
            self.marked_open = False
        self.io.close()


def _mark_open(cfg: StoreConfig) -> bool:
    """Write the root's OPEN marker; False (one WARNING) if the filesystem is full: the store
    opens anyway -- a marker a killed store left stays, and without one a power loss before
    the next clean open costs misses, never wrong bytes (every read is verified).
    Raises ``OSError`` for other failures."""
    try:
        unclean.mark_open(cfg.root_path)
        return True
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        log.warning("%s: no space for the OPEN marker (%s); opening without it", cfg.root_path, exc.strerror)
        return False


def open_parts(cfg: StoreConfig, events: EventHub) -> StoreParts:
    """Build the parts of the store at ``cfg.root`` (its flock held by the caller);
    on a raise everything built so far is closed.  Raises as ``TieredStore.open``."""
    closers: list = []
    try:
        check_format(cfg.root_path, layout_of(cfg))
        engine = store_engine(cfg)
        closers.append(engine.close)
        nvme = NvmeTier(cfg, engine, ())
        closers.append(nvme.close)
        pool = FramePool(cfg.host_frames, cfg.frame_bytes, pin=cfg.pin_host)
        closers.append(pool.close)
        table = BlockTable(pool, nvme)
        recovered: list = []
        index = open_index(cfg, nvme, recovered)
        closers.append(index.close)
        # NVMe blocks come from the index in the background (see indexing.py)
        keeper = IndexKeeper(cfg, table, nvme, index, recovered)
        marked = False
        if not (cfg.durable and cfg.index_metasync):   # commits are flushed later: see store/unclean.py
            marked = _mark_open(cfg)
        io = BlockIO(cfg, pool, nvme)
    except BaseException:
        for close in reversed(closers):
            close()
        raise
    expiry = Expiry(table, keeper, events)
    placement = Placement(cfg, table, keeper, io, expiry, events, pool, nvme)
    tier_of = functools.partial(check_tier, host_frames=pool.n_frames, nvme_slots=cfg.nvme_slots)
    jobs = TwoPhase(cfg, table, keeper, placement, io, expiry, events, pool, tier_of)
    return StoreParts(engine, nvme, pool, table, keeper, io, expiry, placement, jobs,
                      OneShot(cfg, table, keeper, placement, io, expiry, pool, tier_of),
                      Lifetime(table, keeper, placement, expiry, pool, nvme),
                      Books(cfg, table, keeper, jobs, pool, nvme, engine), marked)
