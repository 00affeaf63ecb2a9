"""The index is off the durable path: what survives a killed process and a
(simulated) machine restart.

A put is acknowledged once its slab bytes and slot header are flushed; its
LMDB commit is flushed later (background flusher, close).  A SIGKILL loses
nothing (the page cache keeps the commits); a power loss may lose the
unflushed commits, and ``<root>/OPEN`` naming another boot id makes the next
open rebuild the index from the slot headers.  The power loss is simulated the
way it hits the index: its file is rolled back to the last flushed state (a
copy taken after a clean close) and the marker names a boot that is gone.
"""
import hashlib
import shutil
import textwrap

import numpy as np
import pytest

from kvtier_testutil import kill_when_idle
from kvtier.store import StoreConfig, TieredStore
from kvtier.store import unclean

BLOCK = 16 << 10


def key(i: int) -> bytes:
    return hashlib.blake2b(i.to_bytes(8, "little"), digest_size=16).digest()


def block(i: int) -> np.ndarray:
    return np.random.default_rng(i).integers(0, 256, BLOCK, dtype=np.uint8)


def cfg_of(root, **kw) -> StoreConfig:
    return StoreConfig(root=root, host_bytes=0, nvme_bytes=512 * BLOCK, block_bytes=BLOCK,
                       slab_bytes=64 * BLOCK, queue_depth=4, io_bytes=64 << 10, **kw)


# puts ids [lo, hi) in batches of 4, prints each acknowledged batch, then idles until killed
WRITER = textwrap.dedent("""
    import hashlib, sys, time
    import numpy as np
    from kvtier.store import StoreConfig, TieredStore
    def key(i): return hashlib.blake2b(i.to_bytes(8, "little"), digest_size=16).digest()
    def block(i): return np.random.default_rng(i).integers(0, 256, {block}, dtype=np.uint8)
    root, lo, hi = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    cfg = StoreConfig(root=root, host_bytes=0, nvme_bytes=512 * {block}, block_bytes={block},
                      slab_bytes=64 * {block}, queue_depth=4, io_bytes=64 << 10)
    st = TieredStore.open(cfg)
    for b in range(lo, hi, 4):
        ids = list(range(b, min(hi, b + 4)))
        st.put_many([key(j) for j in ids], [block(j) for j in ids])
        print("done", *ids, flush=True)
    print("idle", flush=True)
    time.sleep(60)
""").format(block=BLOCK)


def write_then_kill(root, lo: int, hi: int) -> set[int]:
    """A writer process puts [lo, hi); SIGKILLed right after its last put returned
    (its index commits are not flushed yet: the flusher waits ~1 s).  Returns the
    acknowledged ids."""
    return kill_when_idle(WRITER, str(root), str(lo), str(hi))


def read_back(root, ids) -> tuple[set[int], list[int], int]:
    """(ids found, ids with wrong bytes, index rebuilds at open) of a reopened store."""
    out = np.empty(BLOCK, np.uint8)
    found, wrong = set(), []
    with TieredStore.open(cfg_of(root)) as st:
        for i in ids:
            if st.get(key(i), out):
                found.add(i)
                if not np.array_equal(out, block(i)):
                    wrong.append(i)
        rebuilds = st.stats().index_rebuilds
        st.check_integrity()
    return found, wrong, rebuilds


def test_open_marks_the_root_and_a_clean_close_clears_it(tmp_path):
    # 1. open: OPEN names this boot (commits are flushed later)
    st = TieredStore.open(cfg_of(tmp_path))
    text = (tmp_path / unclean.MARKER).read_text()
    assert text.split()[-1] == unclean.boot_id() != ""
    st.put(key(1), block(1))
    # 2. a clean close flushes the index and removes the marker
    st.close()
    assert not (tmp_path / unclean.MARKER).exists()
    # 3. index_metasync=True flushes every commit: no marker is needed
    with TieredStore.open(cfg_of(tmp_path, index_metasync=True)):
        assert not (tmp_path / unclean.MARKER).exists()


def test_sigkill_right_after_acknowledged_puts_loses_nothing_and_needs_no_rebuild(tmp_path):
    root = tmp_path / "store"
    # 1. puts acknowledged, then SIGKILL before the index flusher ran
    done = write_then_kill(root, 0, 40)
    assert done == set(range(40))
    # 2. the marker names this boot: the index is trusted as it is (the page cache kept it)
    assert unclean.restarted_since_open(root) is None
    found, wrong, rebuilds = read_back(root, range(48))
    assert found == done and wrong == [] and rebuilds == 0


@pytest.mark.parametrize("restarted", [True, False])
def test_power_loss_rolling_the_index_back_is_repaired_from_the_slot_headers(tmp_path, restarted):
    root = tmp_path / "store"
    # 1. a first batch, closed cleanly: its commits are flushed; keep that index as "what the disk held"
    with TieredStore.open(cfg_of(root)) as st:
        st.put_many([key(i) for i in range(20)], [block(i) for i in range(20)])
    flushed = tmp_path / "index-flushed"
    shutil.copytree(root / "index", flushed)
    # 2. a second writer acknowledges 20..60 and is killed before its commits are flushed
    done = write_then_kill(root, 20, 60)
    assert done == set(range(20, 60))
    # 3. the power loss: the unflushed commits never reached the disk (index rolled back);
    #    the marker names the boot that just ended (or, the control, this one)
    shutil.rmtree(root / "index")
    shutil.copytree(flushed, root / "index")
    if restarted:
        (root / unclean.MARKER).write_text("kvtier open 00000000-dead-beef-0000-000000000000\n")
    # 4. reopen: after a restart every acknowledged block is back, bit-exact (rebuilt from headers)
    found, wrong, rebuilds = read_back(root, range(64))
    assert wrong == []
    if restarted:
        assert found == set(range(60)) and rebuilds == 1
        assert list(root.glob("index.corrupt-*")), "the rolled-back index was not set aside"
    else:   # same boot: the index is trusted, so the rolled-back commits would be missing
        assert found == set(range(20)) and rebuilds == 0
    # 5. the next open is clean again
    assert not (root / unclean.MARKER).exists()
