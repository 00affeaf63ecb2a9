"""kvtier's tiers in vLLM's KV event stream (engine_adapter/vllm_events.py).

First on a real ``TieredStore`` (host frames, NVMe slabs; a real redis-server
for the shared tier): what the store does is what vLLM is told, keyed by
offload keys.  Then through vLLM's own classes (0.33, main env):
``TieringOffloadingManager.take_events`` yields kvtier's events, and vLLM's
``OffloadingEventsTracker`` turns them into the ``BlockStored`` /
``BlockRemoved`` a subscriber of ``--kv-events-config`` decodes.
"""
from __future__ import annotations

import uuid

import numpy as np
import pytest

from engines import need_engine

need_engine("vllm")

import kvtier.engine_adapter.vllm as kv  # noqa: E402
from kvtier.engine_adapter.vllm_driver import SchedulerDriver  # noqa: E402
from kvtier.engine_adapter.vllm_events import NoTierEvents, TierEvents  # noqa: E402
from kvtier.engine_adapter.plugin_common import store_key  # noqa: E402
from kvtier.store import Namespace, StoreConfig, Tier, TieredStore  # noqa: E402
from remote_servers import redis_server  # noqa: E402,F401 (fixture)
from vllm.distributed.kv_events import BlockRemoved, BlockStored  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.events import OffloadingEventsTracker  # noqa: E402
from vllm.utils.hashing import sha256_cbor  # noqa: E402
from vllm.v1.core.kv_cache_utils import hash_block_tokens, init_none_hash, maybe_convert_block_hash  # noqa: E402
from vllm.v1.kv_offload.base import (Locality, LookupResult, Medium, OffloadingKVEventsConfig,  # noqa: E402
                                     get_offload_block_hash, make_offload_key)
from vllm.v1.kv_offload.config import (OffloadingCacheConfig, OffloadingConfig, OffloadingGroupConfig,  # noqa: E402
                                       OffloadingModelConfig, OffloadingParallelConfig)

BLOCK = 4096


def okey(i: int) -> bytes:
    """An offload key (a 32-byte block hash || group 0)."""
    return make_offload_key(i.to_bytes(32, "big"), 0)


NS = Namespace(model_id="m", dtype="float32", layout="vllm:chunk1x16:w1", tp_rank=0)


def skey(i: int) -> bytes:
    """Its store key (what the tier's memo makes of it)."""
    return store_key(NS, okey(i))


def data(i: int) -> np.ndarray:
    return np.full(BLOCK, i % 251, np.uint8)


def open_store(tmp_path, host_blocks: int, nvme_blocks: int) -> TieredStore:
    slot = 2 * BLOCK                      # a block and its record's sector, rounded
    return TieredStore.open(StoreConfig(root=tmp_path / "s", host_bytes=host_blocks * BLOCK,
                                        nvme_bytes=nvme_blocks * slot, block_bytes=BLOCK,
                                        slab_bytes=nvme_blocks * slot, io_engine="threads"))


def events_of(store, **kw) -> TierEvents:
    return TierEvents(store.events, lambda k: store_key(NS, k), "KvtierTier", **kw)


def flat(evs) -> list[tuple[str, str, bool, list[bytes]]]:
    """(medium, locality, removed, keys) of each event, in order."""
    return [(e.medium.value, e.locality.value, e.removed, list(e.keys)) for e in evs]


def put(store, ev, ids, tier):
    ev.note([okey(i) for i in ids], [skey(i) for i in ids])
    store.put_many([skey(i) for i in ids], [data(i) for i in ids], tier=tier)


def test_host_nvme_moves_become_offload_key_events(tmp_path):
    with open_store(tmp_path, host_blocks=2, nvme_blocks=2) as st:
        ev = events_of(st)
        # store [0, 1] in host frames -> stored CPU/LOCAL, keyed by offload keys
        put(st, ev, [0, 1], Tier.HOST)
        out = ev.take()
        assert flat(out) == [("CPU", "LOCAL", False, [okey(0), okey(1)])]
        assert out[0].ownership == "KvtierTier:host" and out[0].removal_expected
        assert ev.take() == []                                   # taken once
        # store [2] in host: the LRU [0] is demoted to NVMe (stored there) and leaves its frame
        put(st, ev, [2], Tier.HOST)
        got = flat(ev.take())
        assert ("STORAGE", "LOCAL", False, [okey(0)]) in got and ("CPU", "LOCAL", True, [okey(0)]) in got
        assert ("CPU", "LOCAL", False, [okey(2)]) in got
        assert st.where(skey(0)) == {Tier.NVME}                  # the events say what the store did
        # [3, 4] straight to NVMe (2 slots): [0] is evicted from NVMe, so it is nowhere
        put(st, ev, [3, 4], Tier.NVME)
        got = flat(ev.take())
        assert ("STORAGE", "LOCAL", True, [okey(0)]) in got
        assert not st.contains(skey(0))
        c = ev.counts()
        assert c.stored == 6 and c.removed == 2 and c.dropped == 0 and c.unmapped == 0
        # what is advertised now is exactly what the store holds
        assert c.advertised == sum(st.contains(skey(i)) for i in range(5)) == 4
        ev.close()
        st.check_integrity()


def test_blocks_this_tier_did_not_store_are_not_advertised(tmp_path):
    with open_store(tmp_path, host_blocks=4, nvme_blocks=4) as st:
        ev = events_of(st)
        st.put_many([skey(7)], [data(7)], tier=Tier.HOST)        # no offload key known for it
        assert ev.take() == [] and ev.counts().unmapped == 1
        ev.missing([okey(9), b"", 5])                            # unknown and bad keys: nothing, no raise
        assert ev.take() == []


def test_a_miss_withdraws_every_tier_the_key_was_advertised_on(tmp_path):
    with open_store(tmp_path, host_blocks=2, nvme_blocks=4) as st:
        ev = events_of(st)
        put(st, ev, [0], Tier.HOST)
        st.put_many([skey(0)], [data(0)], tier=Tier.NVME)        # already stored: the store skips it
        ev.take()
        ev.missing([okey(0)])                                    # a lookup found it nowhere
        assert flat(ev.take()) == [("CPU", "LOCAL", True, [okey(0)])]
        ev.missing([okey(0)])                                    # withdrawn once only
        assert ev.take() == [] and ev.counts().advertised == 0


def test_bounds_drop_stores_never_removals(tmp_path):
    with open_store(tmp_path, host_blocks=8, nvme_blocks=8) as st:
        ev = events_of(st, cap=2, queue_cap=8)
        put(st, ev, [0, 1], Tier.HOST)
        assert flat(ev.take()) == [("CPU", "LOCAL", False, [okey(0), okey(1)])]
        put(st, ev, [2], Tier.HOST)                              # a third key is past the cap: not advertised
        assert ev.take() == [] and ev.counts().dropped == 1
        st.drop([skey(0), skey(1), skey(2)])                     # removals of the advertised ones all come
        got = flat(ev.take())
        assert sorted(k for _, _, removed, ks in got if removed for k in ks) == [okey(0), okey(1)]
        # the queue bound: with nothing taken, at most queue_cap stores wait
        ev2 = events_of(st, cap=100, queue_cap=3)
        put(st, ev2, [10, 11, 12, 13, 14], Tier.HOST)
        assert sum(len(e.keys) for e in ev2.take()) == 3 and ev2.counts().dropped == 2
        for e in (ev, ev2):
            e.close()
    with pytest.raises(ValueError):
        TierEvents(None, bytes, "x", cap=0)


# ---------------------------------------------------------------- through vLLM's own classes
BLOCK_TOKENS, BLOCKS_PER_CHUNK, WORKER_BLOCK_BYTES = 16, 1, 4096
N_CHUNKS = 4


def offloading_config(extra: dict, events: bool) -> OffloadingConfig:
    return OffloadingConfig(
        groups=(OffloadingGroupConfig(tokens_per_block=BLOCK_TOKENS, layer_names=("l0", "l1"), group_id=0),),
        worker_kv_bytes_per_block=WORKER_BLOCK_BYTES, enable_kv_cache_events=events,
        extra_config={"cpu_bytes_to_use": N_CHUNKS * WORKER_BLOCK_BYTES, **extra},
        engine_id=uuid.uuid4().hex,
        model=OffloadingModelConfig(name="Qwen/Qwen3-0.6B", dtype="bfloat16"),
        cache=OffloadingCacheConfig(tokens_per_hash=BLOCK_TOKENS, blocks_per_chunk=BLOCKS_PER_CHUNK),
        parallel=OffloadingParallelConfig(rank=0, world_size=1, tp_size=1, pp_size=1, pcp_size=1, dcp_size=1,
                                          data_parallel_index=0, data_parallel_size=1,
                                          data_parallel_rank_local=None, is_parallelism_agnostic=True))


def chunk_keys(first: int, n: int) -> list:
    init_none_hash(sha256_cbor)
    parent, out = None, []
    for i in range(n):
        parent = hash_block_tokens(sha256_cbor, parent, list(range(first + i * BLOCK_TOKENS,
                                                                   first + (i + 1) * BLOCK_TOKENS)))
        out.append(make_offload_key(parent, 0))
    return out


class Engine(SchedulerDriver):
    def __init__(self, data_dir, events: bool = True, **opts) -> None:
        super().__init__(kv.KvtierOffloadingSpec(offloading_config(
            {"spec_name": "KvtierOffloadingSpec", "spec_module_path": "kvtier.engine_adapter.vllm",
             "kvtier": {"data_dir": str(data_dir), "nvme_gb": 0.0001, "policy": "off", **opts}}, events)))
        self.tier = self.tiers[0]

    def offload_all(self, keys, seed: int) -> None:
        rng = np.random.default_rng(seed)
        ctx = self.new_request(f"r{seed}")
        self.offload(ctx, keys, {k: rng.integers(0, 256, WORKER_BLOCK_BYTES, dtype=np.uint8) for k in keys})
        self.settle()
        self.finish(ctx)

    def kvtier_events(self) -> list:
        with self.lock:
            return [e for e in self.mgr.take_events() if e.ownership and e.ownership.startswith("KvtierTier:")]


def test_vllms_manager_publishes_kvtiers_tiers_and_its_tracker_names_them(tmp_path):
    e = Engine(tmp_path)
    assert isinstance(e.tier.events, TierEvents)
    keys = chunk_keys(0, 3)
    # a request's 3 chunks go to vLLM's CPU tier and cascade to kvtier's NVMe
    e.offload_all(keys, 1)
    evs = e.kvtier_events()
    assert [(ev.medium, ev.locality, ev.removed, ev.ownership) for ev in evs] == \
        [(Medium.STORAGE, Locality.LOCAL, False, "KvtierTier:nvme")]
    assert list(evs[0].keys) == keys
    # vLLM's scheduler turns them into the stream's BlockStored: the chunk's block hash, medium STORAGE
    tracker = OffloadingEventsTracker(OffloadingKVEventsConfig(enable_kv_cache_events=True,
                                                               self_describing_kv_events=False))
    stored = list(tracker.take_events(evs))
    assert all(isinstance(x, BlockStored) and x.medium == "STORAGE" and x.locality == "LOCAL" and
               x.ownership == "KvtierTier:nvme" for x in stored)
    assert [x.block_hashes for x in stored] == [[maybe_convert_block_hash(get_offload_block_hash(k))] for k in keys]
    # each advertised chunk is served: kvtier's lookup answers HIT for every one
    ctx = e.new_request("probe")
    assert [e.tier.lookup(k, ctx) for k in evs[0].keys] == [LookupResult.HIT] * 3
    # more chunks than NVMe's slots: the oldest are evicted and withdrawn, and those miss
    more = chunk_keys(10_000, 40)
    for i in range(0, len(more), 4):
        e.offload_all(more[i:i + 4], 10 + i)
    evs = e.kvtier_events()
    gone = [k for ev in evs if ev.removed for k in ev.keys]
    assert set(keys) <= set(gone)
    removed = [x for x in tracker.take_events(evs) if isinstance(x, BlockRemoved)]
    assert removed and all(r.medium == "STORAGE" and r.ownership == "KvtierTier:nvme" for r in removed)
    assert [e.tier.lookup(k, ctx) for k in keys] == [LookupResult.MISS] * 3
    # nothing advertised that a lookup would not answer
    advertised = {k for ev in evs for k in ev.keys if not ev.removed} - set(gone)
    assert advertised and all(e.tier.lookup(k, ctx) is LookupResult.HIT for k in advertised)
    e.finish(ctx)
    e.shutdown()


def test_with_kv_events_off_the_tier_records_nothing(tmp_path):
    e = Engine(tmp_path, events=False)
    assert isinstance(e.tier.events, NoTierEvents)
    e.offload_all(chunk_keys(0, 2), 1)
    assert e.kvtier_events() == [] and e.tier.stats()["chunks_stored"] == 2
    e.shutdown()


def test_the_shared_tier_is_remote_and_a_value_gone_from_the_server_is_withdrawn(tmp_path, redis_server):
    redis_server.client().flushall()
    e = Engine(tmp_path, remote_url=redis_server.url, remote_write="through")
    assert e.tier.store.remote.wait_ready(15)
    keys = chunk_keys(50_000, 2)
    e.offload_all(keys, 3)
    evs = e.kvtier_events()
    remote = [ev for ev in evs if ev.locality is Locality.REMOTE]
    assert [(ev.medium, ev.removed, ev.ownership, list(ev.keys)) for ev in remote] == \
        [(Medium.STORAGE, False, "KvtierTier:remote", keys)]
    # the values vanish from the server behind kvtier's back, and the NVMe copies are dropped
    redis_server.client().flushall()
    e.tier.store.drop([e.tier._memo.one(k) for k in keys])
    assert {(ev.locality, ev.removed) for ev in e.kvtier_events()} == {(Locality.LOCAL, True)}
    # the next lookup misses: the shared tier's advertisement is withdrawn too
    ctx = e.new_request("probe")
    assert e.tier.lookup(keys[0], ctx) is LookupResult.MISS
    evs = e.kvtier_events()
    assert [(ev.locality, ev.removed, list(ev.keys)) for ev in evs] == [(Locality.REMOTE, True, keys[:1])]
    e.finish(ctx)
    e.shutdown()
