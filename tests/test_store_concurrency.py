"""Eviction writes run outside the store lock: readers and writers keep going
while a demotion is writing, and nothing they see is ever wrong.

Real files, real io_uring, real LMDB.  One test holds a demotion between its
slab write and its flush (a gate wrapped around the real ``fdatasync`` call)
to make the interleaving deterministic; the other is a free-running mix.
"""
import threading

import numpy as np

from kvtier.store import StoreConfig, StoreFull, Tier, TieredStore
from kvtier_testutil import key, random_block

BLOCK = 16 << 10


def block(i: int) -> np.ndarray:
    return random_block(i, BLOCK)


def cfg(tmp_path, **kw) -> StoreConfig:
    base = dict(root=tmp_path / "store", host_bytes=4 * BLOCK, nvme_bytes=64 * BLOCK, block_bytes=BLOCK,
                slab_bytes=16 * BLOCK, queue_depth=4, io_bytes=64 << 10)
    base.update(kw)
    return StoreConfig(**base)


def run_in_thread(fn):
    box = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as exc:  # surfaced by the caller's assertions
            box["error"] = exc
    t = threading.Thread(target=target, daemon=True)
    t.start()
    return t, box


def test_reads_drops_and_integrity_proceed_while_a_demotion_is_writing(tmp_path):
    c = cfg(tmp_path, host_bytes=8 * BLOCK)
    st = TieredStore.open(c)
    try:
        # 1. fill the 8-frame host tier (eviction then demotes the 2 LRU blocks, 0 and 1)
        st.put_many([key(i) for i in range(8)], [block(i) for i in range(8)])
        # 2. gate the real fdatasync of the slab: the demotion's write is done,
        #    its flush and index commit wait until we open the gate
        writing, gate = threading.Event(), threading.Event()
        real_sync = st._nvme.sync

        def gated_sync(slots):
            writing.set()
            assert gate.wait(30), "test gate never opened"
            real_sync(slots)
        st._nvme.sync = gated_sync
        # 3. a writer puts block 8: the host tier must evict, so it demotes LRU blocks
        writer, wbox = run_in_thread(lambda: st.put(key(8), block(8)))
        assert writing.wait(30), f"no demotion started: {wbox}"
        # 4. mid-demotion (store lock free): every block reads back exactly, from
        #    its host frame; a victim can be dropped; the books still balance
        def reads():
            out = np.empty(BLOCK, np.uint8)
            got = {}
            for i in range(8):
                got[i] = st.get(key(i), out) and np.array_equal(out, block(i))
            return got
        reader, rbox = run_in_thread(reads)
        reader.join(30)
        assert not reader.is_alive(), "a get waited for the demotion's I/O (store lock held)"
        assert rbox.get("value") == {i: True for i in range(8)}, rbox
        assert writer.is_alive()                      # still held at the gate
        assert st.drop([key(0)]) == 1                 # key 0 is the LRU victim being demoted
        rep = st.check_integrity()                    # reserved demotion slots are accounted for
        assert rep.nvme_slots_used >= 1 and st.stats().demotions == 0
        # 5. open the gate: the demotion finishes, the put completes
        gate.set()
        writer.join(30)
        assert not writer.is_alive() and wbox.get("value") is True, wbox
        st._nvme.sync = real_sync
        # 6. the dropped victim is gone everywhere (no index record); the others moved to NVMe intact
        assert not st.contains(key(0)) and st.locate(key(0)) is None
        assert st.stats().demotions >= 1
        out = np.empty(BLOCK, np.uint8)
        for i in range(1, 9):
            assert st.get(key(i), out) and np.array_equal(out, block(i))
        on_nvme = {i for i in range(1, 9) if Tier.NVME in st.where(key(i))}
        assert 1 in on_nvme, "the surviving victim was not demoted"
        st.check_integrity()
    finally:
        st.close()
    # 7. reopen: the demoted blocks are durable, the dropped one never reappears
    with TieredStore.open(c) as st:
        assert not st.contains(key(0))
        for i in on_nvme:
            assert st.get(key(i), out) and np.array_equal(out, block(i))
        st.check_integrity()


def test_concurrent_puts_gets_demotes_during_eviction_read_exact_bytes(tmp_path):
    # a 6-frame host tier under 3 writers: nearly every put evicts (demotes) while
    # readers, an explicit demoter and a pinner run; NVMe is big enough that no
    # block is ever dropped, so every block once stored must read back exactly
    c = cfg(tmp_path, host_bytes=6 * BLOCK, nvme_bytes=256 * BLOCK, slab_bytes=64 * BLOCK)
    n_keys = 48
    stored = set()
    stored_lock = threading.Lock()
    errors = []
    with TieredStore.open(c) as st:
        def writer(seed):
            rng = np.random.default_rng(seed)
            for _ in range(40):
                ids = sorted({int(x) for x in rng.integers(0, n_keys, int(rng.integers(1, 4)))})
                try:
                    st.put_many([key(i) for i in ids], [block(i) for i in ids])
                except StoreFull:      # every frame pinned at that instant: legitimate
                    continue
                # a key another writer is still storing was skipped (put_many counts it
                # as "being stored"): only keys visible now must stay readable
                visible = [i for i in ids if st.contains(key(i))]
                with stored_lock:
                    stored.update(visible)

        def reader(seed):
            rng = np.random.default_rng(seed)
            out = np.empty(BLOCK, np.uint8)
            for _ in range(120):
                i = int(rng.integers(0, n_keys))
                with stored_lock:
                    must = i in stored
                hit = st.get(key(i), out)
                if hit and not np.array_equal(out, block(i)):
                    errors.append(f"key {i}: wrong bytes")
                if must and not hit:
                    errors.append(f"key {i}: stored but missed")

        def demoter(seed):
            rng = np.random.default_rng(seed)
            for _ in range(40):
                st.demote([key(int(i)) for i in rng.integers(0, n_keys, 3)])

        def pinner(seed):
            rng = np.random.default_rng(seed)
            for _ in range(60):
                ks = [key(int(rng.integers(0, n_keys)))]
                if st.pin(ks):
                    st.unpin(ks)

        def guard(fn, seed):
            def run():
                try:
                    fn(seed)
                except Exception as exc:
                    errors.append(f"{fn.__name__}: {exc!r}")
            return threading.Thread(target=run)
        ts = ([guard(writer, s) for s in (1, 2, 3)] + [guard(reader, s) for s in (4, 5)]
              + [guard(demoter, 6), guard(pinner, 7)])
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert errors == [], st.stats()
        assert st.stats().demotions > 0 and st.stats().evictions_dropped == 0
        out = np.empty(BLOCK, np.uint8)
        for i in sorted(stored):
            assert st.get(key(i), out) and np.array_equal(out, block(i)), i
        st.check_integrity()
