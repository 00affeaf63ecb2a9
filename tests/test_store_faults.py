"""Faults against real files: SIGKILLed writers, flipped bytes, a full filesystem."""
import contextlib
import errno
import hashlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from kvtier.store import DiskFull, StoreConfig, StoreError, Tier, TieredStore

BLOCK = 16 << 10


def key(i: int) -> bytes:
    return hashlib.blake2b(i.to_bytes(8, "little"), digest_size=16).digest()


def block(i: int, n: int = BLOCK) -> np.ndarray:
    return np.random.default_rng(i).integers(0, 256, n, dtype=np.uint8)


# ------------------------------------------------------------------ SIGKILL
WRITER = textwrap.dedent("""
    import hashlib, sys
    import numpy as np
    from kvtier.store import StoreConfig, TieredStore

    def key(i): return hashlib.blake2b(i.to_bytes(8, "little"), digest_size=16).digest()
    def block(i): return np.random.default_rng(i).integers(0, 256, {block}, dtype=np.uint8)

    root, seed = sys.argv[1], int(sys.argv[2])
    rng = np.random.default_rng(seed)
    cfg = StoreConfig(root=root, host_bytes=0, nvme_bytes=4096 * {block}, block_bytes={block},
                      slab_bytes=64 * {block}, queue_depth=4, io_bytes=64 << 10)
    with TieredStore.open(cfg) as st:
        i = 0
        while True:
            n = int(rng.integers(1, 6))
            ids = list(range(i, i + n))
            i += n
            print("start", *ids, flush=True)
            if rng.random() < 0.5:
                st.put_many([key(j) for j in ids], [block(j) for j in ids])
            else:  # the engines' two-phase path, straight to NVMe
                ps = st.prepare_store([key(j) for j in ids], tier="nvme")
                for s, j in zip(ps.slots, ids):
                    s.buffer[:] = block(j).tobytes()
                st.complete_store(ps.handle)
            print("done", *ids, flush=True)
""").format(block=BLOCK)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_sigkilled_writer_leaves_exactly_its_completed_blocks(tmp_path, seed):
    rng = np.random.default_rng(seed)
    root = tmp_path / "store"
    env = dict(os.environ, PYTHONPATH=os.getcwd() + os.pathsep + os.environ.get("PYTHONPATH", ""))
    # 1. a writer process stores batches of blocks and reports each finished batch
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(root), str(seed)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    kill_after = int(rng.integers(4, 30))
    lines = []
    while len(lines) < kill_after:
        line = proc.stdout.readline()
        assert line, f"writer died early: {proc.stderr.read()}"
        lines.append(line.split())
    # 2. SIGKILL it at a random moment, most likely in the middle of a batch
    time.sleep(float(rng.uniform(0, 0.02)))
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    lines += [ln.split() for ln in proc.stdout.read().splitlines()]
    started = {int(x) for ln in lines if ln[0] == "start" for x in ln[1:]}
    done = {int(x) for ln in lines if ln[0] == "done" for x in ln[1:]}
    assert done, "the writer completed nothing before the kill"
    # 3. reopen: every completed block is there with its bytes; nothing unknown is visible
    cfg = StoreConfig(root=root, host_bytes=0, nvme_bytes=4096 * BLOCK, block_bytes=BLOCK,
                      slab_bytes=64 * BLOCK, queue_depth=4, io_bytes=64 << 10)
    with TieredStore.open(cfg) as st:
        visible = {i for i in range(max(started) + 10) if st.contains(key(i))}
        assert done <= visible <= started
        out = np.empty(BLOCK, np.uint8)
        for i in visible:
            assert st.get(key(i), out)
            np.testing.assert_array_equal(out, block(i))
        assert st.stats().nvme_blocks == len(visible)
        st.check_integrity()


# ------------------------------------------------------------------ corruption
def flip(path: str, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(8)
        f.seek(offset)
        f.write(bytes(x ^ 0xFF for x in b))
        f.flush()
        os.fsync(f.fileno())


def test_flipped_bytes_read_as_miss_and_are_dropped_never_served(tmp_path):
    cfg = StoreConfig(root=tmp_path / "s", host_bytes=0, nvme_bytes=64 * BLOCK, block_bytes=BLOCK,
                      slab_bytes=16 * BLOCK)
    with TieredStore.open(cfg) as st:
        st.put_many([key(i) for i in range(4)], [block(i) for i in range(4)])
        path1, off1 = st.locate(key(1))
        path2, off2 = st.locate(key(2))
    # 1. flip bytes in block 1 while the store is closed
    flip(path1, off1 + 1000)
    with TieredStore.open(cfg) as st:
        assert st.contains(key(1))                       # the index cannot know yet
        out = np.full(BLOCK, 7, np.uint8)
        # 2. reading it is a miss; the buffer holds zeros, not the corrupt bytes
        assert st.get(key(1), out) is False
        assert not out.any()
        # 3. it is dropped from the index, memory and the free-slot books
        assert not st.contains(key(1)) and st.stats().corrupt_dropped == 1
        st.check_integrity()
        # 4. flip block 2 while open (O_DIRECT reads see it): prepare_load stops the prefix there
        flip(path2, off2 + BLOCK - 8)
        pl = st.prepare_load([key(0), key(2), key(3)])
        assert pl.hits == 1 and bytes(pl.slots[0].buffer) == block(0).tobytes()
        st.complete_load(pl.handle)
        assert not st.contains(key(2))
        # 5. the neighbours are untouched
        assert st.get(key(3), out)
        np.testing.assert_array_equal(out, block(3))
        st.check_integrity()
    with TieredStore.open(cfg) as st:                    # the drops were durable
        assert [st.contains(key(i)) for i in range(4)] == [True, False, False, True]
        st.check_integrity()


def test_truncated_slab_reads_as_miss(tmp_path):
    cfg = StoreConfig(root=tmp_path / "s", host_bytes=0, nvme_bytes=32 * BLOCK, block_bytes=BLOCK,
                      slab_bytes=16 * BLOCK)
    with TieredStore.open(cfg) as st:
        st.put_many([key(i) for i in range(3)], [block(i) for i in range(3)])
        path, off = st.locate(key(2))
        # the file loses its tail under a live store (e.g. an operator's mistake)
        os.truncate(path, off)
        assert st.get(key(2), np.empty(BLOCK, np.uint8)) is False
        assert st.get(key(0), np.empty(BLOCK, np.uint8)) is True
        st.check_integrity()


# ------------------------------------------------------------------ disk full
@contextlib.contextmanager
def small_filesystem(tmp_path, mib: int):
    """A genuinely size-limited ext4, loop-mounted (needs root)."""
    if os.geteuid() != 0 or not shutil.which("mkfs.ext4"):
        pytest.skip("loop-mounting a small ext4 needs root and mkfs.ext4")
    img, mnt = tmp_path / "fs.img", tmp_path / "mnt"
    mnt.mkdir()
    with open(img, "wb") as f:
        f.truncate(mib << 20)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", str(img)], check=True, capture_output=True)
    r = subprocess.run(["mount", "-o", "loop", str(img), str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"mount not permitted here: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False, capture_output=True)


def test_disk_full_is_a_clear_error_marks_the_tier_full_and_damages_nothing(tmp_path):
    big = 64 << 10
    with small_filesystem(tmp_path, 12) as mnt:
        cfg = StoreConfig(root=mnt / "s", host_bytes=0, nvme_bytes=64 << 20, block_bytes=big,
                          slab_bytes=1 << 20, index_map_bytes=1 << 20)
        stored = []
        with TieredStore.open(cfg) as st:
            # 1. fill: batches of 8 blocks (half a slab) until the filesystem refuses
            with pytest.raises(DiskFull, match="no space"):
                for b in range(1000):
                    ids = list(range(8 * b, 8 * b + 8))
                    st.put_many([key(i) for i in ids], [block(i, big) for i in ids])
                    stored += ids
            assert len(stored) >= 16
            # 2. the tier is marked full, capped at what exists
            s = st.stats()
            assert s.nvme_full and s.nvme_slots_total < cfg.nvme_slots
            st.check_integrity()
            # 3. everything stored before the error reads back exactly
            out = np.empty(big, np.uint8)
            for i in stored:
                assert st.get(key(i), out), i
                np.testing.assert_array_equal(out, block(i, big))
            # 4. the capped tier keeps working: new puts evict the oldest blocks
            assert st.put_many([key(10_000 + i) for i in range(8)],
                               [block(10_000 + i, big) for i in range(8)]) == 8
            assert st.contains(key(10_007))
            st.check_integrity()
            survivors = [i for i in stored if st.contains(key(i))]
        # 5. reopen on the full filesystem: everything that was there still is
        with TieredStore.open(cfg) as st:
            out = np.empty(big, np.uint8)
            for i in survivors + [10_000 + i for i in range(8)]:
                assert st.get(key(i), out), i
            st.check_integrity()


# ------------------------------------------------------------------ no O_DIRECT
@contextlib.contextmanager
def filesystem_without_o_direct(tmp_path):
    """A ramfs mount: a real filesystem whose open(O_DIRECT) fails with EINVAL."""
    if os.geteuid() != 0:
        pytest.skip("mounting a ramfs needs root")
    mnt = tmp_path / "ramfs"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "ramfs", "ramfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"mount not permitted here: {r.stderr.strip()}")
    try:
        try:
            os.close(os.open(mnt / "probe", os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o644))
            pytest.skip("ramfs accepts O_DIRECT on this kernel")
        except OSError as exc:
            assert exc.errno == errno.EINVAL, exc
        os.unlink(mnt / "probe")
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False, capture_output=True)


def test_filesystem_refusing_o_direct_falls_back_to_buffered_io_with_a_warning(tmp_path, caplog):
    with filesystem_without_o_direct(tmp_path) as mnt:
        cfg = StoreConfig(root=mnt / "s", host_bytes=2 * BLOCK, nvme_bytes=32 * BLOCK, block_bytes=BLOCK,
                          slab_bytes=8 * BLOCK, queue_depth=4, io_bytes=64 << 10)
        caplog.set_level(logging.WARNING, logger="kvtier.store.nvme")
        with TieredStore.open(cfg) as st:
            # 1. the first slab is created on a filesystem that refuses O_DIRECT:
            #    a logged warning (never silent), then buffered I/O + fdatasync
            st.put_many([key(i) for i in range(6)], [block(i) for i in range(6)], tier="nvme")
            warned = [r for r in caplog.records if "refuses O_DIRECT" in r.getMessage()]
            assert len(warned) == 1 and warned[0].levelno == logging.WARNING
            assert st.stats().direct_io is False
            # 2. unaligned sources are fine in buffered mode; eviction demotes through it too
            odd = np.frombuffer(b"\0" + block(6).tobytes(), np.uint8)[1:]
            assert st.put(key(6), odd)
            for i in range(7, 10):                       # 2 host frames: these evict host blocks
                assert st.put(key(i), block(i))
            assert st.stats().demotions >= 1
            # 3. every block round-trips (checksums verified on every NVMe read)
            out = np.empty(BLOCK, np.uint8)
            for i in range(10):
                assert st.get(key(i), out), i
                np.testing.assert_array_equal(out, block(i))
            on_nvme = {i for i in range(10) if Tier.NVME in st.where(key(i))}
            st.check_integrity()
        # 4. reopen: the slabs open buffered again (warned again) and every NVMe block is back
        caplog.clear()
        with TieredStore.open(cfg) as st:
            assert any("refuses O_DIRECT" in r.getMessage() for r in caplog.records)
            assert {i for i in range(10) if st.contains(key(i))} == on_nvme
            for i in on_nvme:
                assert st.get(key(i), out), i
                np.testing.assert_array_equal(out, block(i))
            st.check_integrity()
        # 5. direct_io="on" refuses the same filesystem with a clear error at open
        with pytest.raises(StoreError, match="refuses O_DIRECT"):
            TieredStore.open(cfg.with_(root=mnt / "strict", direct_io="on"))
        # 6. a fresh store there warns at open, before any block is written
        caplog.clear()
        with TieredStore.open(cfg.with_(root=mnt / "fresh")) as st:
            assert any("refuses O_DIRECT" in r.getMessage() for r in caplog.records)
            assert st.stats().direct_io is False
            st.check_integrity()
