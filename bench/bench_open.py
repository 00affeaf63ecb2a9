"""Open time of a store against the number of blocks it holds.

    python -m kvtier.bench.bench_open --blocks 10000,100000,1000000 --data-dir D [--json]

For each count N it fills a store under ``D/n<N>`` with N blocks on the NVMe
tier (small blocks: what open costs is the index and the free map, not the
bytes), closes it, then times ``open`` + the first ``contains`` + the first
``put`` (the best of ``--repeat`` reopens, and every reopen's time).  With
``--rebuild`` it also times a rebuild of the index from the slot headers
(``TieredStore.rebuild``) where this kvtier has one.  A store already filled
with N blocks by an earlier run is reused (``--fresh`` refills it).
"""
from __future__ import annotations

import argparse
import json
import shutil
import struct
import sys
import time
from pathlib import Path

BATCH = 4096


def _key(i: int) -> bytes:
    return struct.pack("<8sQ", b"benchopn", i)


def _config(root: Path, n: int, block_bytes: int):
    from kvtier.store import StoreConfig

    probe = StoreConfig(root=root, host_bytes=0, nvme_bytes=0, block_bytes=block_bytes)
    return StoreConfig(root=root, host_bytes=0, nvme_bytes=(n + BATCH) * probe.slot_bytes,
                       block_bytes=block_bytes, slab_bytes=1 << 30, io_engine="threads")


def fill(root: Path, n: int, block_bytes: int, quiet: bool) -> float:
    """Write ``n`` blocks (not durable: this is set-up) and close; returns seconds."""
    from kvtier.store import TieredStore
    from kvtier.store.aligned import AlignedBuffer

    cfg = _config(root, n, block_bytes).with_(durable=False)
    buf = AlignedBuffer(BATCH * cfg.slot_bytes)
    views = [buf.view(j * cfg.slot_bytes, j * cfg.slot_bytes + block_bytes) for j in range(BATCH)]
    t0 = time.perf_counter()
    with TieredStore.open(cfg) as st:
        for lo in range(0, n, BATCH):
            hi = min(n, lo + BATCH)
            st.put_many([_key(i) for i in range(lo, hi)], views[:hi - lo], tier="nvme")
            if not quiet and (lo // BATCH) % 25 == 0:
                print(f"  filled {hi}/{n}", file=sys.stderr)
    (root / "bench-open-count").write_text(str(n))
    return time.perf_counter() - t0


def time_open(root: Path, n: int, block_bytes: int, round_: int) -> float:
    """Seconds for open + first contains + first put (then close, untimed)."""
    from kvtier.store import TieredStore

    cfg = _config(root, n, block_bytes)
    data = bytearray(block_bytes)
    t0 = time.perf_counter()
    st = TieredStore.open(cfg)
    try:
        assert st.contains(_key(n // 2)), "a filled block is missing"
        st.put(_key(10 ** 12 + round_), data, tier="nvme")
        dt = time.perf_counter() - t0
        st.drop([_key(10 ** 12 + round_)])
    finally:
        st.close()
    return dt


def time_rebuild(root: Path, n: int, block_bytes: int) -> float | None:
    from kvtier.store import TieredStore

    rebuild = getattr(TieredStore, "rebuild", None)
    if rebuild is None:
        return None
    t0 = time.perf_counter()
    rebuild(_config(root, n, block_bytes))
    return time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kvtier.bench.bench_open", description=__doc__.split("\n\n")[0])
    ap.add_argument("--blocks", default="10000,100000,1000000", help="comma-separated block counts")
    ap.add_argument("--data-dir", required=True, help="directory for the stores (created)")
    ap.add_argument("--block-bytes", type=int, default=4096, help="block size (small: the index is what matters)")
    ap.add_argument("--repeat", type=int, default=3, help="timed reopens per count (best is reported)")
    ap.add_argument("--rebuild", action="store_true", help="also time a rebuild from the slot headers")
    ap.add_argument("--fresh", action="store_true", help="refill even if a store of that count exists")
    ap.add_argument("--clean", action="store_true", help="delete each store after measuring it")
    ap.add_argument("--json", action="store_true", help="one JSON document on stdout, nothing else")
    a = ap.parse_args(argv)
    counts = [int(x) for x in a.blocks.split(",") if x.strip()]
    base = Path(a.data_dir)
    base.mkdir(parents=True, exist_ok=True)
    rows = []
    for n in counts:
        root = base / f"n{n}"
        marker = root / "bench-open-count"
        fill_s = None
        if a.fresh or not marker.exists() or marker.read_text() != str(n):
            shutil.rmtree(root, ignore_errors=True)
            fill_s = fill(root, n, a.block_bytes, a.json)
        times = [time_open(root, n, a.block_bytes, r) for r in range(a.repeat)]
        row = {"blocks": n, "open_first_contains_put_s": min(times), "runs_s": times, "fill_s": fill_s}
        if a.rebuild:
            row["rebuild_s"] = time_rebuild(root, n, a.block_bytes)
            row["open_after_rebuild_s"] = time_open(root, n, a.block_bytes, a.repeat)
        rows.append(row)
        if a.clean:
            shutil.rmtree(root, ignore_errors=True)
    base_t = rows[0]["open_first_contains_put_s"] if rows else None
    for r in rows:
        r["vs_first"] = r["open_first_contains_put_s"] / base_t if base_t else None
    doc = {"block_bytes": a.block_bytes, "rows": rows}
    if a.json:
        print(json.dumps(doc, indent=2))
    else:
        print(f"{'blocks':>10} {'open+contains+put s':>20} {'x first':>8} {'rebuild s':>10}")
        for r in rows:
            rb = r.get("rebuild_s")
            print(f"{r['blocks']:>10} {r['open_first_contains_put_s']:>20.4f} {r['vs_first']:>8.2f} "
                  f"{'' if rb is None else f'{rb:.2f}':>10}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
