"""The store's KV events (store/events.py) against a real TieredStore.

The promise checked after every step: the replayed events say a block is in a
medium exactly when ``where`` says it is in that tier, so every advertised hash
is retrievable by ``get`` and nothing is advertised that is not.
"""

import numpy as np
import pytest

from kvtier_testutil import key, random_block

from kvtier.store import StoreConfig, StoreFull, TieredStore
from kvtier.store.events import MEDIUM_OF_TIER, BlockRemoved, BlockStored, EventLog, KVEventBatch

BLOCK = 16 << 10


def block(i: int) -> np.ndarray:
    return random_block(i, BLOCK)


def cfg(tmp_path, **kw) -> StoreConfig:
    base = dict(root=tmp_path / "store", host_bytes=4 * BLOCK, nvme_bytes=4 * BLOCK,
                block_bytes=BLOCK, slab_bytes=4 * BLOCK, queue_depth=4, io_bytes=64 << 10)
    base.update(kw)
    return StoreConfig(**base)


class Mirror:
    """What a directory learns from the events: key -> set of mediums."""

    def __init__(self) -> None:
        self.held: dict[bytes, set[str]] = {}
        self.stored = self.removed = 0

    def apply(self, batches: list[KVEventBatch]) -> None:
        for b in batches:
            for ev in b.events:
                if isinstance(ev, BlockStored):
                    self.stored += 1
                    for h in ev.block_hashes:
                        self.held.setdefault(h, set()).add(ev.medium)
                elif isinstance(ev, BlockRemoved):
                    self.removed += 1
                    for h in ev.block_hashes:
                        self.held.get(h, set()).discard(ev.medium)

    def advertised(self) -> set[bytes]:
        return {k for k, m in self.held.items() if m}


def check_agrees(st: TieredStore, mirror: Mirror, keys: list[bytes]) -> None:
    for k in keys:
        told = mirror.held.get(k, set())
        assert told == {MEDIUM_OF_TIER[str(t)] for t in st.where(k)}, k.hex()
    out = np.empty(BLOCK, np.uint8)
    for k in mirror.advertised():
        assert st.get(k, out), f"advertised but not retrievable: {k.hex()}"


def test_stored_then_evicted_blocks_are_advertised_and_withdrawn(tmp_path):
    keys = [key(i) for i in range(12)]
    log, mirror = EventLog(), Mirror()
    with TieredStore.open(cfg(tmp_path)) as st:
        st.events.subscribe(log)
        # 4 host frames, 4 NVMe slots: puts 0..3 fill the host tier
        for i in range(4):
            st.put(keys[i], block(i))
        mirror.apply(log.take())
        assert mirror.advertised() == set(keys[:4])
        assert all(mirror.held[k] == {"CPU"} for k in keys[:4])
        check_agrees(st, mirror, keys)
        # 8 more puts: the oldest are demoted to NVMe (stored DISK, removed CPU), then dropped
        for i in range(4, 12):
            st.put(keys[i], block(i))
        mirror.apply(log.take())
        assert mirror.removed > 0
        assert keys[0] not in mirror.advertised() and not st.contains(keys[0])
        check_agrees(st, mirror, keys)
        # an explicit drop withdraws the block from every medium it was in
        live = sorted(mirror.advertised())
        st.drop([live[0]])
        mirror.apply(log.take())
        assert live[0] not in mirror.advertised()
        check_agrees(st, mirror, keys)
        st.check_integrity()


def test_demote_advertises_disk_and_withdraws_cpu(tmp_path):
    log, mirror = EventLog(), Mirror()
    with TieredStore.open(cfg(tmp_path)) as st:
        st.events.subscribe(log)
        st.put(key(1), block(1))
        st.demote([key(1)])
        batches = log.take()
        mirror.apply(batches)
        kinds = [(type(e).__name__, e.medium) for b in batches for e in b.events]
        assert kinds == [("BlockStored", "CPU"), ("BlockStored", "DISK"), ("BlockRemoved", "CPU")]
        assert mirror.held[key(1)] == {"DISK"}
        check_agrees(st, mirror, [key(1)])


def test_nothing_is_advertised_for_a_write_that_did_not_complete(tmp_path):
    log = EventLog()
    with TieredStore.open(cfg(tmp_path, host_bytes=0)) as st:
        st.events.subscribe(log)
        # a two-phase store abandoned by the engine (its DMA failed)
        res = st.prepare_store([key(7)])
        assert len(res.slots) == 1
        assert st.complete_store(res.handle, success=False) == 0
        assert log.take() == [] and not st.contains(key(7))
        # NVMe full of pinned blocks: the put raises and advertises nothing
        for i in range(4):
            st.put(key(i), block(i))
        held = [key(i) for i in range(4) if st.contains(key(i))]
        assert st.pin(held) == len(held)
        log.take()
        with pytest.raises(StoreFull):
            st.put(key(9), block(9))
        assert log.take() == [] and not st.contains(key(9))
        st.unpin(held)
        st.check_integrity()


def test_unsubscribe_and_a_raising_listener_never_fail_the_store(tmp_path):
    log = EventLog()

    def broken(batch):
        raise RuntimeError("listener bug")

    with TieredStore.open(cfg(tmp_path)) as st:
        st.events.subscribe(broken)
        stop = st.events.subscribe(log)
        assert st.put(key(1), block(1))
        assert [e.block_hashes for b in log.take() for e in b.events] == [(key(1),)]
        stop()
        stop()
        assert st.put(key(2), block(2))
        assert log.take() == []
        assert st.contains(key(2))


def test_shared_tier_events_advertise_only_values_a_fresh_node_can_read(tmp_path):
    """The shared tier's events (medium "REMOTE"), on a real redis-server: a published block is
    advertised once the server accepted it, and a node with an empty local store reads every
    advertised one; a value dropped from the shared tier is withdrawn."""
    from remote_servers import RedisServer, redis_binary
    if redis_binary() is None:
        pytest.skip("redis-server is not installed")
    srv = RedisServer(tmp_path / "redis").start()
    try:
        url = srv.url
        log = EventLog()
        with TieredStore.open(cfg(tmp_path, remote_url=url)) as a:
            assert a.remote.wait_ready(10)
            a.events.subscribe(log)
            ks = [key(i) for i in range(4)]
            assert a.put_many(ks, [block(i) for i in range(4)], tier="remote") == 4
            a.remote.drop(ks[3:])
        held: set[bytes] = set()
        for batch in log.take():
            for ev in batch.events:
                if ev.medium == "REMOTE":
                    (held.update if isinstance(ev, BlockStored) else held.difference_update)(ev.block_hashes)
        assert held == set(ks[:3])
        with TieredStore.open(cfg(tmp_path, root=tmp_path / "node-b", remote_url=url)) as b:
            assert b.remote.wait_ready(10)
            out = np.empty(BLOCK, dtype=np.uint8)
            for i, k in enumerate(ks[:3]):
                assert b.get(k, out) and np.array_equal(out, block(i))
            assert not b.get(ks[3], out)
    finally:
        srv.stop()
