"""The live soak's data-dir faults on real parts: a loop-mounted ext4 of a few MiB (root only),
a real TieredStore on it filled to the last block and freed, and every file kvtier keeps under
its root damaged -- while a store has it open, and before the next open."""
from __future__ import annotations

import hashlib
import os
import random
import shutil
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from kvtier.bench.soak_live.faults import FaultError
from kvtier.bench.soak_live.faults_files import FILLER, FilesDamage, FsFull, damage_file, kvtier_files
from kvtier.bench.soak_live.fsmount import MountError, SizeLimitedMount, why_not
from kvtier.store import StoreConfig, StoreError, TieredStore

B = 16 << 10
N = 40


def key(i: int) -> bytes:
    return hashlib.blake2b(i.to_bytes(8, "little"), digest_size=16).digest()


def block(i: int) -> np.ndarray:
    return np.random.default_rng(i).integers(0, 256, B, dtype=np.uint8)


def config(root: Path) -> StoreConfig:
    # two small slabs (32 slots each): the whole tier is ~1.4 MiB on disk
    return StoreConfig(root=root, host_bytes=4 * B, nvme_bytes=64 * (B + 4096), block_bytes=B,
                       slab_bytes=32 * (B + 4096), index_map_bytes=1 << 20)


def served(st: TieredStore, ids) -> tuple[int, int]:
    """(intact, wrong) among ``ids``: a miss is neither."""
    out = np.empty(B, np.uint8)
    ok = bad = 0
    for i in ids:
        if st.get(key(i), out):
            ok, bad = (ok + 1, bad) if np.array_equal(out, block(i)) else (ok, bad + 1)
    return ok, bad


@pytest.fixture
def mount(tmp_path):
    reason = why_not()
    if reason is not None:
        pytest.skip(reason)
    m = SizeLimitedMount(tmp_path / "engine-0", 24)
    try:
        m.mount()
    except MountError as exc:        # a container without loop devices
        pytest.skip(str(exc))
    yield m
    m.close()


# ------------------------------------------------------------------ the mount
def test_mount_is_a_small_ext4_that_takes_o_direct_and_closes_twice(mount):
    # 1. a real mount point, about the size asked for
    assert os.path.ismount(mount.path)
    st = os.statvfs(mount.path)
    assert 16 << 20 < st.f_blocks * st.f_frsize <= 24 << 20
    # 2. O_DIRECT works there (the store's slabs use it)
    fd = os.open(mount.path / "probe", os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o644)
    os.close(fd)
    # 3. close unmounts and removes the image; a second close is a no-op
    mount.close()
    assert not os.path.ismount(mount.path) and not mount.image.exists()
    mount.close()


def test_close_of_a_mount_never_made_is_a_no_op(tmp_path):
    m = SizeLimitedMount(tmp_path / "d", 16)
    m.close()
    assert not m.image.exists()
    with pytest.raises(ValueError):
        SizeLimitedMount(tmp_path / "d", 1)


# ------------------------------------------------------------------ fs-full
def test_fs_full_needs_a_mount(tmp_path):
    (tmp_path / "engine-0").mkdir()
    with pytest.raises(FaultError, match="not a size-limited mount"):
        FsFull().inject(SimpleNamespace(data_dir=tmp_path / "engine-0"), random.Random(0))


def test_fs_full_leaves_no_block_and_recover_frees_them(mount):
    rig, rng = SimpleNamespace(data_dir=mount.path), random.Random(0)
    before = mount.free_bytes()
    said = FsFull().inject(rig, rng)
    # 1. nothing left for a writer: even one 4 KiB write is refused
    assert mount.free_bytes() == 0, said
    with pytest.raises(OSError) as exc:
        with open(mount.path / "one-more", "wb") as f:
            f.write(bytes(4096))
            f.flush()
            os.fsync(f.fileno())
    assert exc.value.errno == 28
    (mount.path / "one-more").unlink(missing_ok=True)
    # 2. recover deletes the filler: the space is back
    FsFull().recover(rig, rng)
    assert not (mount.path / FILLER).exists()
    assert mount.free_bytes() >= before - (64 << 10)


def test_a_store_on_a_full_filesystem_degrades_and_works_again_once_freed(mount):
    rig, rng = SimpleNamespace(data_dir=mount.path), random.Random(1)
    cfg = config(mount.path / "model-w1")
    with TieredStore.open(cfg) as st:
        # 1. both slabs exist (a store that has served a while), 24 blocks on NVMe
        st.put_many([key(i) for i in range(24)], [block(i) for i in range(24)], tier="nvme")
        # 2. the filesystem fills: new blocks need index pages and get ENOSPC
        FsFull().inject(rig, rng)
        failed = 0
        for b in range(24, 200, 8):
            ids = range(b, b + 8)
            try:
                st.put_many([key(i) for i in ids], [block(i) for i in ids], tier="nvme")
            except StoreError:       # DiskFull: a skipped offload; never another exception
                failed += 1
        assert failed > 0
        # 3. what was stored reads back exactly or misses; the books balance
        assert served(st, range(200))[1] == 0
        st.check_integrity()
        # 4. freed: puts succeed and read back
        FsFull().recover(rig, rng)
        for b in range(1000, 1064, 8):
            ids = range(b, b + 8)
            assert st.put_many([key(i) for i in ids], [block(i) for i in ids], tier="nvme") == 8
        assert served(st, range(1056, 1064)) == (8, 0)
        st.check_integrity()
    # 5. the next open finds them
    with TieredStore.open(cfg) as st:
        assert served(st, range(1056, 1064)) == (8, 0)


# ------------------------------------------------------------------ files-damage
def open_store_root(tmp_path) -> tuple[TieredStore, Path]:
    """A store with N blocks on NVMe, left open, and the engine's stats file beside it."""
    data_dir = tmp_path / "engine-0"
    st = TieredStore.open(config(data_dir / "model-w1"))
    st.put_many([key(i) for i in range(N)], [block(i) for i in range(N)], tier="nvme")
    (st.config.root_path / "kvtier-stats.json").write_text('{"time": 1, "pid": 1, "stats": {}}')
    return st, data_dir


def test_kvtier_files_are_every_file_but_slabs_and_the_lmdb_data(tmp_path):
    st, data_dir = open_store_root(tmp_path)
    try:
        names = {str(p.relative_to(data_dir / "model-w1")) for p in kvtier_files(data_dir)}
        # LMDB runs without its lock file (store/index.py): no index/lock.mdb to damage
        assert names == {"FORMAT", "LOCK", "OPEN", "kvtier-stats.json"}
        # what was set aside is never read again: not offered for damage
        (data_dir / "model-w1.unreadable" / "slabs").mkdir(parents=True)
        (data_dir / "model-w1.unreadable" / "FORMAT").write_text("x")
        (data_dir / "model-w1" / "index.corrupt-1").mkdir()
        (data_dir / "model-w1" / "index.corrupt-1" / "data.mdb").write_text("x")
        (data_dir / "model-w1" / "index.corrupt-1" / "lock.mdb").write_text("x")
        assert len(kvtier_files(data_dir)) == 4
    finally:
        st.close()


def test_files_damage_while_the_store_serves_never_serves_wrong_bytes(tmp_path):
    st, data_dir = open_store_root(tmp_path)
    hit = set()
    try:
        for seed in range(12):
            said = FilesDamage().inject(SimpleNamespace(data_dir=data_dir), random.Random(seed))
            hit.add(said.split(":")[0])
            ok, bad = served(st, range(N))
            assert bad == 0 and ok == N, said
        st.check_integrity()
    finally:
        st.close()
    assert len(hit) >= 3     # the seed spreads the damage over several files


def test_files_damage_with_no_file_is_a_fault_error(tmp_path):
    (tmp_path / "engine-0").mkdir()
    with pytest.raises(FaultError, match="no kvtier file"):
        FilesDamage().inject(SimpleNamespace(data_dir=tmp_path / "engine-0"), random.Random(0))


# ------------------------------------------------------------------ the next open
@pytest.fixture(scope="module")
def killed_root(tmp_path_factory) -> Path:
    """A store root as an engine SIGKILLed while serving leaves it (OPEN present)."""
    tmp = tmp_path_factory.mktemp("killed")
    st, data_dir = open_store_root(tmp)
    copy = tmp / "copy"
    shutil.copytree(st.config.root_path, copy)   # every commit is in the page cache: what a kill leaves
    st.close()
    (copy / "index" / "lock.mdb").write_bytes(bytes(range(256)) * 32)   # an older kvtier's LMDB lock file
    return copy


@pytest.mark.parametrize("rel", ["FORMAT", "LOCK", "OPEN", "index/lock.mdb", "kvtier-stats.json"])
@pytest.mark.parametrize("seed", range(4))
def test_a_damaged_file_at_the_next_open_is_a_clean_open_or_one_store_error(killed_root, tmp_path, rel, seed):
    # regression: a FORMAT or OPEN with bytes that are not UTF-8 raised UnicodeDecodeError from open
    root = tmp_path / "model-w1"
    shutil.copytree(killed_root, root)
    said = damage_file(root / rel, random.Random(seed))
    try:
        st = TieredStore.open(config(root))
    except StoreError as exc:
        # only the format marker may refuse the root, with one line that names it
        assert rel == "FORMAT" and "FORMAT" in str(exc), (said, exc)
        return
    with st:
        assert served(st, range(N)) == (N, 0), said
        st.check_integrity()


def test_a_format_marker_of_non_utf8_bytes_is_one_store_error(killed_root, tmp_path):
    root = tmp_path / "model-w1"
    shutil.copytree(killed_root, root)
    (root / "FORMAT").write_bytes(b"\xff\xfe kvtier store format 2\n")
    with pytest.raises(StoreError, match="FORMAT is damaged"):
        TieredStore.open(config(root))


def test_an_open_marker_of_non_utf8_bytes_is_a_rebuild(killed_root, tmp_path):
    root = tmp_path / "model-w1"
    shutil.copytree(killed_root, root)
    (root / "OPEN").write_bytes(b"kvtier open \xff\xfe\n")
    with TieredStore.open(config(root)) as st:
        assert st.stats().index_rebuilds == 1
        assert served(st, range(N)) == (N, 0)


def test_an_index_rebuild_that_fails_on_a_full_disk_is_tried_again_once_freed(mount, monkeypatch):
    # regression: the failed rebuild left the index closed: stats() raised a raw lmdb.Error and the
    # index was never rebuilt for the rest of the run
    import kvtier.store.indexing as indexing
    monkeypatch.setattr(indexing, "REBUILD_RETRY_S", 0.2)
    rig, rng = SimpleNamespace(data_dir=mount.path), random.Random(2)
    cfg = config(mount.path / "model-w1")
    with TieredStore.open(cfg) as st:
        st.put_many([key(i) for i in range(24)], [block(i) for i in range(24)], tier="nvme")
        # 1. the disk is full when damage turns up: the rebuild cannot write a new index
        FsFull().inject(rig, rng)
        keeper = st.parts.keeper
        with st.parts.table.lock:
            with keeper._ilock:
                keeper._damaged("damage found while the disk is full")
        keeper.join()
        assert st.stats().index_rebuilds == 0
        assert served(st, range(24)) == (24, 0)
        # 2. freed: the next commit (a put) retries the rebuild, which now succeeds
        FsFull().recover(rig, rng)
        time.sleep(0.3)
        st.put_many([key(i) for i in range(100, 108)], [block(i) for i in range(100, 108)], tier="nvme")
        keeper.join()
        assert st.stats().index_rebuilds == 1
        st.put_many([key(i) for i in range(200, 208)], [block(i) for i in range(200, 208)], tier="nvme")
        st.check_integrity()
    # 3. the rebuilt index holds every block at the next open
    with TieredStore.open(cfg) as st:
        assert st.stats().index_rebuilds == 0
        assert served(st, list(range(100, 108)) + list(range(200, 208))) == (16, 0)


def test_a_tier_capped_by_a_full_filesystem_gets_its_capacity_back_once_freed(mount, monkeypatch):
    # regression: the cap was for the store's lifetime: a disk full before the first slab left
    # the NVMe tier at 0 slots until the engine restarted
    import kvtier.store.nvme as nvme
    monkeypatch.setattr(nvme, "UNCAP_EVERY_S", 0.0)
    rig, rng = SimpleNamespace(data_dir=mount.path), random.Random(3)
    cfg = config(mount.path / "model-w1")
    with TieredStore.open(cfg) as st:
        # 1. full before any slab exists: the tier is capped at 0 slots, NVMe puts are refused
        FsFull().inject(rig, rng)
        with pytest.raises(StoreError):
            st.put_many([key(i) for i in range(8)], [block(i) for i in range(8)], tier="nvme")
        s = st.stats()
        assert s.nvme_full and s.nvme_slots_total == 0
        with pytest.raises(StoreError):
            st.put_many([key(i) for i in range(8)], [block(i) for i in range(8)], tier="nvme")
        st.check_integrity()
        # 2. freed: the configured capacity is back and NVMe puts land
        FsFull().recover(rig, rng)
        assert st.put_many([key(i) for i in range(8)], [block(i) for i in range(8)], tier="nvme") == 8
        s = st.stats()
        assert not s.nvme_full and s.nvme_slots_total == cfg.nvme_slots and s.nvme_blocks == 8
        assert served(st, range(8)) == (8, 0)
        st.check_integrity()
        # 3. the second slab too, once the first is used up
        st.put_many([key(i) for i in range(8, 56)], [block(i) for i in range(8, 56)], tier="nvme")
        assert served(st, range(56)) == (56, 0)
        st.check_integrity()


def test_slot_allocator_grow_undoes_cap():
    from kvtier.store.slots import SlotAllocator
    a = SlotAllocator(64, used=[3])
    a.cap(32)
    assert a.total == 32 and a.free_count == 31
    a.grow(64)       # the slots past the cap are free again, merged with the run below them
    assert a.total == 64 and a.free_count == 63
    assert a.extents() == [(0, 3), (4, 60)]
    a.grow(16)       # not larger: nothing changes
    assert a.total == 64 and a.free_count == 63


def test_the_index_keeps_no_lmdb_lock_file_that_damage_could_reach(tmp_path):
    # regression: LMDB's lock.mdb is shared memory it trusts: cut short while the store served,
    # the next commit died of SIGBUS; a damaged writer mutex hung the next commit
    st, data_dir = open_store_root(tmp_path)
    try:
        assert not (st.config.root_path / "index" / "lock.mdb").exists()
        st.put_many([key(i) for i in range(100, 108)], [block(i) for i in range(100, 108)], tier="nvme")
        assert served(st, range(100, 108)) == (8, 0)
    finally:
        st.close()


def test_a_store_killed_and_reopened_on_a_full_filesystem_opens_and_serves(mount):
    # regression: writing the OPEN marker got ENOSPC and the open failed: an engine restarted on a
    # full disk did not come up
    from kvtier.store import unclean
    rig, rng = SimpleNamespace(data_dir=mount.path), random.Random(4)
    cfg = config(mount.path / "model-w1")
    with TieredStore.open(cfg) as st:
        st.put_many([key(i) for i in range(24)], [block(i) for i in range(24)], tier="nvme")
    unclean.mark_open(cfg.root_path)          # the marker a SIGKILLed store leaves
    FsFull().inject(rig, rng)
    assert mount.free_bytes() == 0
    with TieredStore.open(cfg) as st:
        assert served(st, range(24)) == (24, 0)
        st.check_integrity()
    FsFull().recover(rig, rng)
