"""Any damaged byte is a miss or a StoreError, and nothing intact is lost (property-based).

Hypothesis picks bytes anywhere in the slab files (slot headers and
payloads) or in the LMDB index file and flips them; the store is reopened
in a subprocess (a SIGBUS/SIGSEGV shows as a signal, not a dead pytest) and
every block is read back.  The claims, for every example:

* ``open`` succeeds and nothing but ``StoreError`` subclasses is raised;
* no block reads back wrong bytes;
* a block none of whose bytes (slot header or payload) was touched reads
  back bit-exact -- the index may be damaged: the slot headers describe
  themselves.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvtier.store import StoreConfig, TieredStore

pytestmark = pytest.mark.faults

BLOCK = 4096
N = 96

PRELUDE = textwrap.dedent("""
    import json, sys, numpy as np
    from kvtier.store import StoreConfig, TieredStore, StoreError
    BLOCK, N = 4096, 96
    def key(i): return b"prop-%05d" % i
    def block(i): return np.random.default_rng(i).integers(0, 256, BLOCK, dtype=np.uint8)
    def cfg(root): return StoreConfig(root=root, host_bytes=0, nvme_bytes=256 * (BLOCK + 4096),
                                      block_bytes=BLOCK, slab_bytes=64 * (BLOCK + 4096),
                                      io_engine="threads", queue_depth=4)
""")

READER = PRELUDE + textwrap.dedent("""
    out = {"ok": [], "wrong": [], "missing": [], "errors": [], "raw": None}
    try:
        with TieredStore.open(cfg(sys.argv[1])) as s:
            buf = np.empty(BLOCK, np.uint8)
            for i in range(N):
                try:
                    got = s.get(key(i), buf)
                except StoreError as exc:
                    out["errors"].append(type(exc).__name__)
                    continue
                if not got:
                    out["missing"].append(i)
                elif np.array_equal(buf, block(i)):
                    out["ok"].append(i)
                else:
                    out["wrong"].append(i)
    except StoreError as exc:
        out["errors"].append(type(exc).__name__)
    except BaseException as exc:
        out["raw"] = f"{type(exc).__name__}: {exc}"
    print(json.dumps(out))
""")


def _key(i):
    return b"prop-%05d" % i


def _block(i):
    return np.random.default_rng(i).integers(0, 256, BLOCK, dtype=np.uint8)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    root = tmp_path_factory.mktemp("pristine") / "store"
    cfg = StoreConfig(root=root, host_bytes=0, nvme_bytes=256 * (BLOCK + 4096), block_bytes=BLOCK,
                      slab_bytes=64 * (BLOCK + 4096), io_engine="threads", queue_depth=4)
    with TieredStore.open(cfg) as s:
        s.put_many([_key(i) for i in range(N)], [_block(i) for i in range(N)])
    return root


def _read_back(root: Path) -> dict:
    p = subprocess.run([sys.executable, "-c", READER, str(root)], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONSAFEPATH": "1"})
    assert p.returncode == 0, (p.returncode, p.stderr[-2000:])
    return json.loads(p.stdout.strip().splitlines()[-1])


def _owners(root: Path) -> tuple[dict[int, set[int]], list[int]]:
    """(block index -> the offsets, in the slab files concatenated by name, of its
    slot header(s) and payload; every slot-header offset)."""
    owners: dict[int, set[int]] = {}
    headers: list[int] = []
    base = 0
    for f in sorted((root / "slabs").iterdir()):
        data = f.read_bytes()
        for i in range(N):
            pos = data.find(_block(i).tobytes())
            if pos >= 0:
                owners.setdefault(i, set()).update(range(base + pos, base + pos + BLOCK))
            kpos = data.find(_key(i))
            while kpos >= 0:                       # the key sits at offset 40 of its slot header
                hdr = base + kpos - 40
                owners.setdefault(i, set()).update(range(hdr, hdr + 112))
                headers.extend(range(hdr, hdr + 112))
                kpos = data.find(_key(i), kpos + 1)
        base += len(data)
    return owners, headers


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_flipped_slab_bytes(tmp_path_factory, pristine, data):
    root = tmp_path_factory.mktemp("slab") / "store"
    shutil.copytree(pristine, root)
    files = sorted((root / "slabs").iterdir())
    sizes = [f.stat().st_size for f in files]
    owners, headers = _owners(root)
    # flips anywhere, plus flips aimed at slot headers (what describes a block)
    flips = data.draw(st.lists(st.integers(0, sum(sizes) - 1), max_size=16), label="anywhere")
    flips += data.draw(st.lists(st.sampled_from(headers), min_size=1, max_size=8), label="in headers")
    hit: set[int] = set()
    for off in flips:
        i, base = 0, 0
        while off >= base + sizes[i]:
            base += sizes[i]
            i += 1
        with open(files[i], "r+b") as fh:
            fh.seek(off - base)
            b = fh.read(1)
            fh.seek(off - base)
            fh.write(bytes([b[0] ^ data.draw(st.integers(1, 255), label="mask")]))
        hit.update(k for k, s in owners.items() if off in s)
    res = _read_back(root)
    assert res["raw"] is None, res["raw"]
    assert not res["wrong"], res
    lost = [i for i in range(N) if i not in hit and i not in res["ok"]]
    assert not lost, (lost, res)


def _record_bytes(raw: bytes) -> list[int]:
    """Offsets in an index file of the block keys and the 48-byte records after them."""
    out = []
    for i in range(N):
        pos = raw.find(_key(i))
        if pos >= 0:
            out.extend(range(pos, pos + len(_key(i)) + 48))
    return out


@settings(max_examples=24, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_flipped_index_bytes(tmp_path_factory, pristine, data):
    root = tmp_path_factory.mktemp("index") / "store"
    shutil.copytree(pristine, root)
    f = root / "index" / "data.mdb"
    raw = bytearray(f.read_bytes())
    # flips anywhere in the file, plus flips aimed at keys and records (what names a block)
    flips = data.draw(st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(1, 255)), max_size=16),
                      label="anywhere")
    flips += data.draw(st.lists(st.tuples(st.sampled_from(_record_bytes(raw)), st.integers(1, 255)),
                                min_size=1, max_size=4), label="in records")
    for off, mask in flips:
        raw[off % len(raw)] ^= mask
    f.write_bytes(bytes(raw))
    res = _read_back(root)
    assert res["raw"] is None, res["raw"]
    assert not res["wrong"], res
    assert len(res["ok"]) == N, res      # every slot is intact, and slots describe themselves
