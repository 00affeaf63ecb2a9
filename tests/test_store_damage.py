"""The fault script: a hostile disk against real files.

Each case fills a store, damages it on disk (the LMDB index in seven ways,
slot headers, block bytes), then reopens it in a *subprocess* -- so a SIGBUS
or SIGSEGV would show as a signal instead of killing pytest -- and reads
every block back.  The claims: the process never dies of a signal, ``open``
succeeds, at least 99% of the blocks written before the damage read back
bit-exact, and none reads back wrong.  Then SIGKILL rounds during
``put_many``, with the index rebuilt from the slot headers on every reopen:
0 wrong bytes, every completed block found.
"""
import json
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from kvtier.store import StoreConfig, TieredStore

BLOCK = 4096
N = 2000

CHILD_PRELUDE = textwrap.dedent("""
    import json, sys, numpy as np
    from kvtier.store import StoreConfig, TieredStore
    BLOCK = 4096
    def key(i): return i.to_bytes(8, "little") + b"damage-t"
    def block(i): return np.random.default_rng(i).integers(0, 256, BLOCK, dtype=np.uint8)
    def cfg(root): return StoreConfig(root=root, host_bytes=0, nvme_bytes=4096 * (BLOCK + 4096),
                                      block_bytes=BLOCK, slab_bytes=1024 * (BLOCK + 4096),
                                      io_engine="threads", queue_depth=4)
""")

READER = CHILD_PRELUDE + textwrap.dedent("""
    root, n = sys.argv[1], int(sys.argv[2])
    with TieredStore.open(cfg(root)) as st:
        s = st.stats()                      # waits for a background load / rebuild
        out = np.empty(BLOCK, np.uint8)
        ok, wrong, missing = [], [], []
        for i in range(n):
            if not st.get(key(i), out):
                missing.append(i)
            elif np.array_equal(out, block(i)):
                ok.append(i)
            else:
                wrong.append(i)
        st.check_integrity()
        print(json.dumps({"ok": len(ok), "wrong": wrong, "missing": missing,
                          "rebuilds": st.stats().index_rebuilds}))
""")


def key(i: int) -> bytes:
    return i.to_bytes(8, "little") + b"damage-t"


def block(i: int) -> np.ndarray:
    return np.random.default_rng(i).integers(0, 256, BLOCK, dtype=np.uint8)


def cfg(root) -> StoreConfig:
    return StoreConfig(root=root, host_bytes=0, nvme_bytes=4096 * (BLOCK + 4096), block_bytes=BLOCK,
                       slab_bytes=1024 * (BLOCK + 4096), io_engine="threads", queue_depth=4)


def fill(root, n: int = N) -> int:
    """Store blocks 0..n-1; returns how many were new."""
    new = 0
    with TieredStore.open(cfg(root)) as st:
        for lo in range(0, n, 250):
            hi = min(n, lo + 250)
            new += st.put_many([key(i) for i in range(lo, hi)], [block(i) for i in range(lo, hi)])
    return new


def reopen_and_read(root, n: int = N) -> dict:
    """Open in a child process and read every block; a signal fails the test."""
    p = subprocess.run([sys.executable, "-c", READER, str(root), str(n)], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode >= 0, f"reader died of signal {-p.returncode}: {p.stderr[-2000:]}"
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def used_pages(mdb: str) -> int:
    """Pages the newest meta page names (what a damaged file must hold)."""
    with open(mdb, "rb") as f:
        head = f.read(8192)
    return max(struct.unpack_from("<Q", head, 136)[0], struct.unpack_from("<Q", head, 4096 + 136)[0]) + 1


def damage_index(root, mode: str, seed: int) -> None:
    mdb = os.path.join(root, "index", "data.mdb")
    rng = random.Random(seed)
    b = bytearray(open(mdb, "rb").read())
    pages = used_pages(mdb)
    if mode == "truncate":
        os.truncate(mdb, pages * 4096 // 2)
        return
    if mode == "zero_meta0":
        b[0:4096] = bytes(4096)
    elif mode == "zero_meta1":
        b[4096:8192] = bytes(4096)
    elif mode == "zero_both_metas":
        b[0:8192] = bytes(8192)
    elif mode == "flip_data_pages":         # 16 random bytes in each of a few data pages
        for _ in range(4):
            pg = rng.randrange(2, pages)
            off = pg * 4096 + rng.randrange(0, 4096 - 16)
            for j in range(16):
                b[off + j] ^= rng.randrange(1, 256)
    elif mode == "garbage":
        b[:] = rng.randbytes(len(b))
    elif mode == "delete":
        shutil.rmtree(os.path.join(root, "index"))
        return
    else:
        raise AssertionError(mode)
    with open(mdb, "wb") as f:
        f.write(b)


_slow = pytest.mark.slow
INDEX_DAMAGE = ["truncate", pytest.param("zero_meta0", marks=_slow), pytest.param("zero_meta1", marks=_slow),
                "zero_both_metas", "flip_data_pages", pytest.param("garbage", marks=_slow), "delete"]


@pytest.mark.parametrize("mode", INDEX_DAMAGE)
def test_damaged_index_opens_and_every_block_reads_back(tmp_path, mode):
    root = tmp_path / "store"
    assert fill(root) == N
    damage_index(str(root), mode, seed=1)
    r = reopen_and_read(root)
    assert r["wrong"] == []
    assert r["ok"] == N, (r["ok"], r["missing"][:10])
    # the damaged index was set aside for inspection (flipped bytes may also land
    # where LMDB never looks: then there is nothing to rebuild)
    aside = [p.name for p in root.iterdir() if p.name.startswith("index.corrupt-")]
    if mode not in ("delete", "flip_data_pages"):
        assert r["rebuilds"] >= 1 and len(aside) == 1
    # and the healed store reopens cleanly with no further rebuild
    r2 = reopen_and_read(root)
    assert r2["wrong"] == [] and r2["ok"] == r["ok"] and r2["rebuilds"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("seed", [2, 3, 4])
def test_random_flips_in_index_pages_never_crash_or_serve_wrong_bytes(tmp_path, seed):
    root = tmp_path / "store"
    fill(root)
    damage_index(str(root), "flip_data_pages", seed=seed)
    r = reopen_and_read(root)
    assert r["wrong"] == [] and r["ok"] == N, (r["ok"], r["missing"][:10])


def _edit_index(root, fn) -> None:
    """Apply ``fn(txn, blocks_db, meta_db)`` to a closed store's index with plain LMDB."""
    import lmdb
    env = lmdb.open(str(root / "index"), max_dbs=4)
    try:
        with env.begin(write=True) as txn:
            fn(txn, env.open_db(b"blocks", txn=txn), env.open_db(b"meta", txn=txn))
    finally:
        env.close()


def test_an_index_whose_records_carry_no_checks_is_rebuilt_once(tmp_path):
    # an older kvtier's index: the same records, no record_format marker
    root = tmp_path / "store"
    fill(root, 300)
    _edit_index(root, lambda txn, blocks, meta: txn.delete(b"record_format", db=meta))
    # the first open rebuilds it from the slot headers; the next one does not
    r = reopen_and_read(root, 300)
    assert r["wrong"] == [] and r["ok"] == 300 and r["rebuilds"] == 1
    r = reopen_and_read(root, 300)
    assert r["ok"] == 300 and r["rebuilds"] == 0


@pytest.mark.parametrize("mark", [b"9x", b"-1", b"12"])
def test_a_damaged_high_water_mark_is_damage_not_lost_blocks(tmp_path, mark):
    # b"12": a number, but records name slots past it -- before, those blocks
    # were dropped as "not fitting"; now the index is rebuilt and all come back
    root = tmp_path / "store"
    fill(root, 300)
    _edit_index(root, lambda txn, blocks, meta: txn.put(b"slot_hw", mark, db=meta))
    r = reopen_and_read(root, 300)
    assert r["wrong"] == [] and r["ok"] == 300 and r["rebuilds"] == 1


def test_a_record_that_fails_its_check_falls_back_to_the_slot_headers(tmp_path):
    # a record rewritten to name another block's slot (a flipped slot field that
    # still decodes): the check catches it, the headers say where each block is
    root = tmp_path / "store"
    fill(root, 300)

    def swap(txn, blocks, meta):
        a, b = bytearray(txn.get(key(7), db=blocks)), txn.get(key(8), db=blocks)
        a[8:16] = b[8:16]
        txn.put(key(7), bytes(a), db=blocks)
    _edit_index(root, swap)
    r = reopen_and_read(root, 300)
    assert r["wrong"] == [] and r["ok"] == 300 and r["rebuilds"] == 1


def _slot_offsets(root, ids) -> dict[int, tuple[str, int, int]]:
    """Per block: (slab path, offset of its bytes, offset of its header sector)."""
    c = cfg(root)
    sps, hdr_region = c.slots_per_slab, c.slots_per_slab * 4096
    out = {}
    with TieredStore.open(c) as st:
        for i in ids:
            path, off = st.locate(key(i))
            slot_in_slab = (off - hdr_region) // c.frame_bytes
            assert 0 <= slot_in_slab < sps
            out[i] = (path, off, slot_in_slab * 4096)
    return out


def _flip(path: str, off: int, n: int = 8) -> None:
    fd = os.open(path, os.O_RDWR)
    try:
        b = bytearray(os.pread(fd, n, off))
        os.pwrite(fd, bytes(x ^ 0x5A for x in b), off)
        os.fsync(fd)
    finally:
        os.close(fd)


def test_flipped_slot_headers_are_free_slots_after_a_rebuild(tmp_path):
    root = tmp_path / "store"
    fill(root)
    bad = list(range(0, N, 200))                       # 10 blocks
    for i, (path, _, hdr) in _slot_offsets(root, bad).items():
        _flip(path, hdr + 20 + i % 60)                 # inside the record header
    # with the index intact the headers are not read: every block is there
    r = reopen_and_read(root)
    assert r["wrong"] == [] and r["ok"] == N
    # forced rebuild: a header that fails its checksum is a free slot -> those blocks miss
    shutil.rmtree(root / "index")
    r = reopen_and_read(root)
    assert r["wrong"] == [] and sorted(r["missing"]) == bad and r["ok"] == N - len(bad)


def test_flipped_block_bytes_are_misses_with_or_without_the_index(tmp_path):
    root = tmp_path / "store"
    fill(root)
    bad = list(range(7, N, 200))
    for i, (path, off, _) in _slot_offsets(root, bad).items():
        _flip(path, off + 1000 + i % 2000)
    r = reopen_and_read(root)
    assert r["wrong"] == [] and sorted(r["missing"]) == bad and r["ok"] == N - len(bad)
    assert fill(root) == len(bad)                       # the misses are stored again
    for i, (path, off, _) in _slot_offsets(root, bad[:5]).items():
        _flip(path, off + 3000)
    shutil.rmtree(root / "index")                       # rebuild: headers are fine, bytes are not
    r = reopen_and_read(root)
    assert r["wrong"] == [] and sorted(r["missing"]) == bad[:5]


WRITER = CHILD_PRELUDE + textwrap.dedent("""
    root, start, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    with TieredStore.open(cfg(root)) as st:
        for lo in range(start, start + n, 40):
            hi = min(start + n, lo + 40)
            st.put_many([key(i) for i in range(lo, hi)], [block(i) for i in range(lo, hi)])
            print(hi, flush=True)           # every block below hi is complete
""")


@pytest.mark.slow
def test_sigkill_during_put_many_with_rebuild_forced_on_every_reopen(tmp_path):
    root = tmp_path / "store"
    rng = random.Random(7)
    done = 0
    required: set[int] = set()               # blocks whose put_many returned, over all rounds
    for rnd in range(4):
        p = subprocess.Popen([sys.executable, "-c", WRITER, str(root), str(done), "800"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        completed = done
        deadline = time.monotonic() + 30
        kill_after = rng.randint(3, 12)          # batches to let through before the kill
        seen = 0
        last, batch_s = time.monotonic(), 0.05  # batch_s: the interval between the last two lines
        for line in p.stdout:
            completed = int(line)
            seen += 1
            now = time.monotonic()
            batch_s, last = now - last, now
            if seen >= kill_after or now > deadline:
                break
        # land the kill inside the next put_many: a fixed wait let a fast disk finish all 800
        # blocks first (the writer exited 0), so wait a fraction of the batch interval seen here
        time.sleep(rng.random() * batch_s)
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
        for line in p.stdout.read().splitlines():   # batches that finished before the kill landed
            completed = int(line)
        assert p.returncode == -signal.SIGKILL, p.stderr.read()[-2000:]
        required |= set(range(done, completed))
        # force a rebuild from the slot headers on every reopen
        shutil.rmtree(root / "index", ignore_errors=True)
        r = reopen_and_read(root, completed + 80)
        assert r["wrong"] == [], f"round {rnd}: wrong bytes in {r['wrong'][:5]}"
        found = set(range(completed + 80)) - set(r["missing"])
        assert required <= found, f"round {rnd}: completed blocks missing: {sorted(required - found)[:5]}"
        done = completed + 80                   # skip the keys of the killed batch
