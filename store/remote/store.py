"""RemoteTieredStore: a TieredStore with a shared remote tier below host and NVMe.

``TieredStore.open(config)`` returns one when ``config.remote_url`` is set::

    put(key, data, tier="remote") ──> remote (published; not kept locally)
    get / get_many / get_many_served:
                     host ──> NVMe ──> remote ──(hit lands in a host frame);
                     get_many_served names a remote hit ``Tier.REMOTE``
    lookup:          local prefix, continued on the remote (one EXISTS batch)
    prepare_load:    the remote continuation of the local prefix is staged
                     into host frames first (zero-copy: the remote writes
                     straight into the frames), then loaded as usual;
                     its LoadSlots say ``tier=Tier.REMOTE``
    publish(keys):   copy locally stored blocks to the remote (a pause that
                     will likely resume on another node)
    stage_from_remote(keys): bring the remote continuation into host frames
                     ahead of a predicted return (the lifecycle controller)

``remote_write="through"`` also publishes every put.  The remote never makes
a local call fail: it answers misses while down (see remote/tier.py), and
``open`` succeeds while it is unreachable.  ``stats().remote`` shows it.

Threading: like ``TieredStore``; the remote calls run without the store lock.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Sequence

from aiofiles.os import wrap as aio_wrap

from ..config import RemoteWrite, StoreConfig
from ..entry import check_keys
from ..errors import StoreClosed, StoreError
from ..tiered import TieredStore
from ..types import PrepareLoadResult, StoreStats, Tier
from .arenas import Loan
from .auth import load_encrypt, load_key
from .tier import RemoteTier

log = logging.getLogger(__name__)


def _is_remote(tier) -> bool:
    return tier == Tier.REMOTE


class RemoteTieredStore(TieredStore):
    """See the module docstring."""

    def __init__(self, config: StoreConfig) -> None:
        super().__init__(config)
        try:
            secret = load_key(config.remote_key, config.remote_key_file)
            self.remote = RemoteTier.from_url(config.remote_url, config.block_bytes, config.remote_domain,
                                              secret=secret, encrypt=load_encrypt(config.remote_encrypt))
        except BaseException:
            super().close()
            raise
        pool = self._pool
        if pool.n_frames:
            self.remote.register(pool.address, pool.n_frames * pool.frame_bytes)
        # the shared tier's KV events: a value is advertised once the server accepted it (readable
        # by every node), withdrawn when deleted (failed verification, or dropped)
        self.remote.on_stored = lambda keys: self.events.emit_stored(keys, Tier.REMOTE)
        self.remote.on_removed = lambda keys: self.events.emit_removed(keys, Tier.REMOTE)
        self._counters["hits_remote"] = 0

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.remote.close()

    # ---------------------------------------------------------------- put
    def put_many(self, keys: Sequence, datas: Sequence, *, namespace=None, tier=None) -> int:
        """As ``TieredStore.put_many``; ``tier="remote"`` publishes the blocks to
        the remote tier only and returns how many it accepted (0 while it is down)."""
        if _is_remote(tier):
            if len(keys) != len(datas):
                raise ValueError(f"{len(keys)} keys but {len(datas)} buffers")
            ks = check_keys(keys)
            srcs, _ = self._views(datas, False, "data")
            self._check_open()
            return self.remote.publish(ks, srcs)
        n = super().put_many(keys, datas, namespace=namespace, tier=tier)
        if self.config.remote_write is RemoteWrite.THROUGH:
            self.remote.publish(check_keys(keys), self._views(datas, False, "data")[0])
        return n

    def prepare_store(self, keys: Sequence, *, namespace=None, tier=None):
        if _is_remote(tier):
            raise ValueError("prepare_store cannot target the remote tier; put(tier='remote') or publish()")
        return super().prepare_store(keys, namespace=namespace, tier=tier)

    def publish(self, keys: Sequence) -> int:
        """Copy the longest locally stored prefix of ``keys`` to the remote
        (straight from host frames / the load buffers).  A block with an
        NVMe record publishes that record's payload xxh3 (its load just
        verified it) instead of hashing it again.  Returns how many the
        remote accepted; 0 while it is down.  Raises ``BadKey``, ``StoreClosed``."""
        job = super().prepare_load(keys)
        try:
            ks = [s.key for s in job.slots]
            with self._lock:
                es = [self._entries.get(k) for k in ks]
                sums = [e.checksum if e is not None and e.length == self.config.block_bytes else None
                        for e in es]
            return self.remote.publish(ks, [s.buffer for s in job.slots], sums)
        finally:
            self.complete_load(job.handle)

    # ---------------------------------------------------------------- get
    def get_many_served(self, keys: Sequence, outs: Sequence) -> list[Tier | None]:
        """As ``TieredStore.get_many_served``, then local misses are read from
        the remote into ``outs`` (verified) and kept in host frames; those
        hits are ``Tier.REMOTE``."""
        result = super().get_many_served(keys, outs)
        if all(t is not None for t in result) or not self.remote.breaker.up:
            return result
        miss = [i for i, t in enumerate(result) if t is None]
        ks = check_keys([keys[i] for i in miss])
        dsts, _ = self._views([outs[i] for i in miss], True, "out")
        got = self.remote.fetch(ks, dsts)
        hit = [j for j, g in enumerate(got) if g]
        if not hit:
            return result
        for j in hit:
            result[miss[j]] = Tier.REMOTE
        with self._lock:
            self._counters["misses"] -= len(hit)
            self._counters["hits_remote"] += len(hit)
        if self._pool.n_frames:
            try:
                super().put_many([ks[j] for j in hit], [dsts[j] for j in hit], tier=Tier.HOST)
            except StoreError as exc:       # the caller has its bytes; keeping a copy is optional
                log.debug("remote hit not kept in host frames: %s", exc)
        return result

    def contains(self, key) -> bool:
        if super().contains(key):
            return True
        return self.remote.contains([self._key(key)])[0]

    def lookup(self, keys: Sequence) -> int:
        """Longest stored prefix: local, then continued on the remote."""
        n = super().lookup(keys)
        if n < len(keys) and self.remote.breaker.up:
            n += self.remote.lookup(check_keys(keys[n:]))
        return n

    # ---------------------------------------------------------------- staging
    def stage_from_remote(self, keys: Sequence) -> list[bytes]:
        """Bring the remote continuation of the local prefix of ``keys`` into
        host frames (the remote writes straight into them).  Returns the keys
        staged.  A value that fails verification ends the continuation (the
        batch is discarded: its blocks read as misses).  Never raises for
        remote faults; ``StoreFull`` (every frame pinned) also stages nothing.

        The frames are lent to the fetch (``Loan``): a call the backend
        abandons at its deadline may still write into them, so a discarded
        batch's frames stay reserved until that call has ended and are only
        then given back (``_end_staging``, maybe on a transfer thread)."""
        ks = check_keys(keys)
        n = super().lookup(ks)
        rest = ks[n:]
        if not rest or not self._pool.n_frames or not self.remote.breaker.up:
            return []
        m = self.remote.lookup(rest)
        if not m:
            return []
        try:
            job = super().prepare_store(rest[:m], tier=Tier.HOST)
        except StoreError as exc:
            log.debug("no host frames to stage remote blocks into: %s", exc)
            return []
        slots = job.slots
        loan = Loan()
        got = self.remote.fetch([s.key for s in slots], [s.buffer for s in slots], loan=loan)
        ok = bool(slots) and all(got) and not loan.outstanding
        if ok:
            self.complete_store(job.handle, success=True)
        else:
            loan.release(lambda: self._end_staging(job))
            return []
        with self._lock:
            self._counters["hits_remote"] += len(slots)
        return [s.key for s in slots]

    def _end_staging(self, job) -> None:
        """Discard a staging job whose frames no remote call writes any more
        (``job`` holds the frames' views: the mapping outlives a close until then)."""
        try:
            self.complete_store(job.handle, success=False)
        except StoreClosed:
            pass

    def prepare_load(self, keys: Sequence) -> PrepareLoadResult:
        """As ``TieredStore.prepare_load``, after ``stage_from_remote``; blocks that
        came from the remote have ``LoadSlot.tier == Tier.REMOTE``."""
        staged = set(self.stage_from_remote(keys))
        res = super().prepare_load(keys)
        if not staged:
            return res
        return dataclasses.replace(res, slots=tuple(
            dataclasses.replace(s, tier=Tier.REMOTE) if s.key in staged else s for s in res.slots))

    # ---------------------------------------------------------------- stats
    def stats(self) -> StoreStats:
        s = super().stats()
        return dataclasses.replace(s, remote=self.remote.stats().as_dict())


for _name in ("put", "put_many", "get", "get_many", "get_many_served", "contains", "lookup", "prepare_store",
              "prepare_load", "publish", "stage_from_remote"):
    setattr(RemoteTieredStore, "a" + _name, aio_wrap(getattr(RemoteTieredStore, _name)))
del _name
