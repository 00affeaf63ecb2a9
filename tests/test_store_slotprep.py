"""Slot preparation (``StoreConfig.prepare_slots``, store/slotprep.py): zeros over
new slabs' never-used slots in idle time, so first puts overwrite written extents.

What must hold: prepared slots really are written extents (FIEMAP says so; the
control without preparation shows unwritten ones), the preparer never touches a
stored block (puts racing it, reopen, rebuild from the headers), and a SIGKILL
after acknowledged puts, while it is still zeroing, loses nothing.
"""
import array
import fcntl
import hashlib
import struct
import textwrap
import time

import numpy as np
import pytest

from kvtier_testutil import kill_when_idle
from kvtier.store import StoreConfig, TieredStore

BLOCK = 64 << 10
FS_IOC_FIEMAP = 0xC020660B
FIEMAP_FLAG_SYNC = 1
FIEMAP_EXTENT_UNWRITTEN = 0x800


def key(i: int) -> bytes:
    return hashlib.blake2b(i.to_bytes(8, "little"), digest_size=16).digest()


def block(i: int) -> np.ndarray:
    return np.random.default_rng(i).integers(0, 256, BLOCK, dtype=np.uint8)


def cfg_of(root, **kw) -> StoreConfig:
    return StoreConfig(root=root, host_bytes=0, nvme_bytes=256 * (BLOCK + 4096), block_bytes=BLOCK,
                       slab_bytes=64 * (BLOCK + 4096), queue_depth=4, io_bytes=256 << 10, **kw)


def unwritten_bytes(path, start: int, end: int) -> int:
    """Bytes of [start, end) of ``path`` in unwritten (fallocated, never written) extents."""
    n_ext = 512
    req = struct.pack("=QQIIII", 0, 1 << 62, FIEMAP_FLAG_SYNC, 0, n_ext, 0) + bytes(56 * n_ext)
    buf = array.array("B", req)
    with open(path, "rb") as f:
        fcntl.ioctl(f.fileno(), FS_IOC_FIEMAP, buf)
    mapped = struct.unpack_from("=I", buf, 20)[0]
    total = 0
    for j in range(mapped):
        logical, _phys, length = struct.unpack_from("=QQQ", buf, 32 + 56 * j)
        flags = struct.unpack_from("=I", buf, 32 + 56 * j + 40)[0]
        if flags & FIEMAP_EXTENT_UNWRITTEN:
            total += max(0, min(end, logical + length) - max(start, logical))
    return total


def slab0_block_region(st) -> tuple[object, int, int]:
    nv = st._nvme
    path, first = nv.locate(0)
    return path, first, first + nv.sps * nv.frame_bytes


@pytest.mark.parametrize("prepare", [True, False])
def test_prepared_slots_are_written_extents(tmp_path, prepare):
    with TieredStore.open(cfg_of(tmp_path, prepare_slots=prepare)) as st:
        st.put(key(0), block(0))                  # creates slab 0 (fallocated)
        assert st.wait_prepared(30.0)
        path, lo, hi = slab0_block_region(st)
        try:
            left = unwritten_bytes(path, lo, hi)
        except OSError as exc:
            pytest.skip(f"no FIEMAP here: {exc}")
        out = np.empty(BLOCK, np.uint8)
        assert st.get(key(0), out) and np.array_equal(out, block(0))   # slot 0 untouched
    if prepare:
        assert left == 0, f"{left} bytes of slab 0's block region still unwritten"
    elif left == 0:
        pytest.skip("this filesystem has no unwritten extents (nothing to prepare)")
    else:
        assert left >= (hi - lo) // 2      # the control: fallocated space stays unwritten


def test_preparer_never_touches_a_stored_block(tmp_path):
    """Puts race the preparer over several slabs (pauses let it run between them);
    every block reads back exact, after reopen too, and after a rebuild from the headers."""
    ids = list(range(200))
    with TieredStore.open(cfg_of(tmp_path, prepare_slots=True)) as st:
        rng = np.random.default_rng(7)
        i = 0
        while i < len(ids):
            n = int(rng.integers(1, 9))
            batch = ids[i:i + n]
            st.put_many([key(j) for j in batch], [block(j) for j in batch])
            i += n
            time.sleep(float(rng.choice([0.0, 0.03, 0.1])))   # idle gaps: the preparer zeroes ahead
        assert st.wait_prepared(30.0)
        assert st._nvme.prep.prepared_slots > 0
        st.check_integrity()
    for rebuild in (False, True):
        if rebuild:
            TieredStore.rebuild(cfg_of(tmp_path))
        out = np.empty(BLOCK, np.uint8)
        with TieredStore.open(cfg_of(tmp_path)) as st:
            bad = [j for j in ids if not (st.get(key(j), out) and np.array_equal(out, block(j)))]
            assert bad == [], f"blocks lost or wrong after {'rebuild' if rebuild else 'reopen'}: {bad[:10]}"
            assert st.stats().nvme_blocks == len(ids)


WRITER = textwrap.dedent("""
    import hashlib, sys, time
    import numpy as np
    from kvtier.store import StoreConfig, TieredStore
    def key(i): return hashlib.blake2b(i.to_bytes(8, "little"), digest_size=16).digest()
    def block(i): return np.random.default_rng(i).integers(0, 256, {block}, dtype=np.uint8)
    cfg = StoreConfig(root=sys.argv[1], host_bytes=0, nvme_bytes=256 * ({block} + 4096), block_bytes={block},
                      slab_bytes=64 * ({block} + 4096), queue_depth=4, io_bytes=256 << 10, prepare_slots=True)
    st = TieredStore.open(cfg)
    for b in range(0, 150, 5):
        ids = list(range(b, b + 5))
        st.put_many([key(j) for j in ids], [block(j) for j in ids])
        print("done", *ids, flush=True)
        time.sleep(0.03)          # idle: the preparer is zeroing ahead of the next put
    print("idle", st._nvme.prep.pending(), flush=True)
    time.sleep(60)
""").format(block=BLOCK)


def test_sigkill_while_preparing_loses_no_acknowledged_put(tmp_path):
    root = tmp_path / "store"
    done = kill_when_idle(WRITER, str(root))
    assert done == set(range(150))
    out = np.empty(BLOCK, np.uint8)
    with TieredStore.open(cfg_of(root, prepare_slots=True)) as st:
        bad = [j for j in sorted(done) if not (st.get(key(j), out) and np.array_equal(out, block(j)))]
        assert bad == []
        st.put_many([key(j) for j in range(150, 170)], [block(j) for j in range(150, 170)])   # still writable
        assert st.wait_prepared(30.0)
        st.check_integrity()
    with TieredStore.open(cfg_of(root)) as st:
        assert all(st.get(key(j), out) and np.array_equal(out, block(j)) for j in range(170))


def test_env_override_and_default_off(tmp_path, monkeypatch):
    assert StoreConfig(root=tmp_path).prepare_slots is False
    monkeypatch.setenv("KVTIER_PREPARE_SLOTS", "1")
    assert StoreConfig.from_env(tmp_path).prepare_slots is True
    monkeypatch.setenv("KVTIER_PREPARE_SLOTS", "yes")
    with pytest.raises(ValueError, match="KVTIER_PREPARE_SLOTS"):
        StoreConfig.from_env(tmp_path)
    with TieredStore.open(cfg_of(tmp_path / "off")) as st:
        st.put(key(1), block(1))
        assert st._nvme.prep is None and st.wait_prepared(0.0)


def test_wait_prepared_means_zeros_flushed(tmp_path):
    """wait_prepared returns only after the preparer's fdatasync of its zeros, so the
    first put after it does not drain them in its own flush (vLLM-shaped puts: 0.32 vs
    0.42 GB/s, docs/peers.md "What we tried")."""
    with TieredStore.open(cfg_of(tmp_path, prepare_slots=True)) as st:
        st.put(key(0), block(0))
        assert st.wait_prepared(30.0)
        prep = st._nvme.prep
        assert prep.prepared_slots > 0
        assert prep.unsynced_bytes == 0 and not prep.pending()
        st.put_many([key(j) for j in range(1, 9)], [block(j) for j in range(1, 9)])
        assert st.wait_prepared(30.0) and prep.unsynced_bytes == 0
        st.check_integrity()


def test_a_read_keeps_the_preparer_off_the_disk_like_a_write(tmp_path):
    """A resume's NVMe reads make the disk busy: the zeros wait for idle time
    after them too (they used to wait only after writes)."""
    with TieredStore.open(cfg_of(tmp_path, prepare_slots=True)) as st:
        st.put(key(0), block(0))
        assert st.wait_prepared(30.0)
        prep = st._nvme.prep
        before = prep.last_io
        time.sleep(0.01)
        out = np.empty(BLOCK, dtype=np.uint8)
        assert st.get(key(0), out) and np.array_equal(out, block(0))
        assert prep.last_io > before
