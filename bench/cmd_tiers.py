"""``kvtier bench tiers``: host and NVMe tier bandwidth beside the raw limits.

Bad input raises ``ValueError`` (exit 2, one line; also under ``python -m kvtier``).

Every number is measured in this run, on this machine, under ``--data-dir``:

* host tier: ``put_many`` / ``get_many`` of page-aligned blocks lying back to
  back ("batch", the headline), the same blocks scattered in memory, and one
  ``put``/``get`` call per block ("single"), vs memcpy -- bulk (one copy of the
  whole working set, the best of numpy and libc memcpy, between the benchmark's
  buffers and to/from huge-page memory like the store's pool: the limit) and
  per block (the same copies one call per block, shown for reference).
* NVMe tier (``host_bytes=0``: every put goes to the slabs, durably): ``put_many``
  / ``get_many`` vs raw sequential O_DIRECT on a preallocated file of the same
  filesystem, at the same I/O size: one op at a time (``pwritev``/``preadv``) and
  at the store's queue depth through the same I/O engine.  The baseline is the
  better of the two.  Both sides end their writes with one ``fdatasync``; the
  store also commits its LMDB index (data pages flushed) before a put returns.
  Scattered and single-call rows as for the host tier (single puts over the
  first 8 MiB of each size: each one is written, flushed and committed on its
  own; also shown against raw ``pwritev`` + ``fdatasync`` of each block).
* index: longest-prefix ``lookup`` of 1,000 stored keys (target < 1 ms).
* remote (``--remote URL``): the remote tier's publish/fetch beside the raw
  client on the same bytes (``kvtier.bench.remote_bench``); JSON ``"remote"``.
* peers (``--peer sglang``): SGLang's HiCacheFile backend on the same pages,
  when ``sglang`` is importable; otherwise ``"unavailable: <reason>"``.
  ``--peer lmcache``: LMCache's CPU, disk (buffered and O_DIRECT) and, with
  ``--remote redis://...``, Redis backends, run in LMCache's own environment
  (built from PyPI on first use under ``--peer-env-dir``; see
  ``kvtier.bench.peers.lmcache``).

Each figure is the best of ``--repeat`` runs (the same rule for every
column); headline GB/s are total bytes over total time across block sizes.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import time
from pathlib import Path

from kvtier.util.args import ensure_dir, png_path, pos_int
from kvtier.util.cmd import CommandGroups, add_json_flag, emit_json

from .remote_bench import remote_url_arg

KIB, MIB = 1 << 10, 1 << 20
DEFAULT_SIZES = ("64K", "256K", "1M", "4M", "8M")
SINGLE_BYTES = 8 * MIB     # NVMe single-put row: this many bytes, one durable put per block


def parse_size(text: str) -> int:
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": KIB, "M": MIB, "G": 1 << 30}.get(t[-1:], 1)
    try:
        n = int(float(t[:-1] if t[-1:] in "KMG" else t) * mult)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a size like 64K or 4M, got {text!r}") from None
    if n <= 0 or n % 4096:
        raise argparse.ArgumentTypeError(f"block sizes must be positive multiples of 4096, got {text!r}")
    return n


def register(groups: CommandGroups) -> None:
    p = groups.bench.add_parser(
        "tiers", help="host and NVMe tier put/get GB/s beside memcpy and raw O_DIRECT",
        description=__doc__.split("\n\n")[2] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", required=True, help="directory on the filesystem to measure (created)")
    p.add_argument("--sizes", type=parse_size, nargs="+", default=[parse_size(s) for s in DEFAULT_SIZES],
                   metavar="SIZE", help="block sizes (default: 64K 256K 1M 4M 8M)")
    p.add_argument("--total-mib", type=pos_int, default=256,
                   help="bytes moved per measurement, MiB (default 256)")
    p.add_argument("--repeat", type=pos_int, default=3, help="runs per figure; the best is kept (default 3)")
    p.add_argument("--queue-depth", type=pos_int, default=None,
                   help="store and raw-baseline queue depth (default $KVTIER_QUEUE_DEPTH, else 16)")
    p.add_argument("--io-mib", type=pos_int, default=4, help="largest coalesced I/O, MiB (default 4)")
    p.add_argument("--io-engine", choices=("auto", "io_uring", "threads"), default=None,
                   help="store NVMe I/O engine (default $KVTIER_IO_ENGINE, else auto)")
    p.add_argument("--lookup-keys", type=pos_int, default=1000, help="keys in the lookup benchmark")
    p.add_argument("--remote", metavar="URL", type=remote_url_arg,
                   help="also measure the remote tier at URL (redis://, a Redis Cluster, mooncake://) "
                        "beside its raw client (kvtier.bench.remote_bench)")
    p.add_argument("--peer", action="append", default=[], choices=("sglang", "lmcache"),
                   help="also measure a peer backend on the same pages (repeatable)")
    p.add_argument("--peer-env-dir", metavar="DIR",
                   help="where --peer lmcache builds/reuses LMCache's own virtual environment "
                        "(default $KVTIER_PEER_ENV_DIR, else $XDG_CACHE_HOME/kvtier/peers, i.e. ~/.cache/kvtier/peers)")
    p.add_argument("--plot", metavar="PNG", help="write a GB/s-vs-block-size plot")
    p.add_argument("--keep", action="store_true", help="keep the files written under --data-dir")
    add_json_flag(p)
    p.set_defaults(handler=run)


# ------------------------------------------------------------------ helpers
def _gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9 if seconds > 0 else float("inf")


class _Aligned:
    """Page-aligned, pre-faulted bytes with numpy/memoryview block views."""

    def __init__(self, nbytes: int, fill_seed: int | None = None, huge: bool = False) -> None:
        import ctypes
        import mmap

        import numpy as np
        self.mm = mmap.mmap(-1, nbytes)
        if huge:        # like the store's frame pool: transparent huge pages where allowed
            try:
                self.mm.madvise(mmap.MADV_HUGEPAGE)
            except (AttributeError, OSError):
                pass
        self.arr = np.frombuffer(self.mm, dtype=np.uint8)
        self.addr = ctypes.addressof(ctypes.c_char.from_buffer(self.mm))
        if fill_seed is None:
            self.arr[::4096] = 0
        else:
            self.arr[:] = np.random.default_rng(fill_seed).integers(0, 256, nbytes, dtype=np.uint8)
        self.mv = memoryview(self.mm)

    def blocks(self, size: int) -> list[memoryview]:
        return [self.mv[o:o + size] for o in range(0, len(self.mm) - size + 1, size)]


# ------------------------------------------------------------------ measurements
def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _memcpy_variants(src, dst, scratch, nbytes):
    """The bulk-copy limit, measured several ways on the same bytes: numpy and
    libc memcpy, between the benchmark's buffers and to/from memory set up like
    the store's frame pool (huge-page advised).  The best of them is the baseline."""
    import ctypes

    import numpy as np
    mm = ctypes.memmove
    return {
        "np": lambda: np.copyto(dst.arr[:nbytes], src.arr[:nbytes]),
        "libc": lambda: mm(dst.addr, src.addr, nbytes),
        "to_pool_like": lambda: mm(scratch.addr, src.addr, nbytes),
        "from_pool_like": lambda: mm(dst.addr, scratch.addr, nbytes),
    }


def _host_rows(sizes, total, repeat, src, dst, data_dir, tick):
    """Per block size: bulk memcpy, per-block memcpy, and the store's put/get as
    an engine calls them -- ``put_many``/``get_many`` of a trajectory's blocks
    lying back to back in memory ("batch"), the same batch with the blocks
    scattered in memory ("scattered": no two adjacent, so no copy can coalesce),
    and one ``put``/``get`` call per block ("single") -- interleaved in every
    repeat so machine noise hits all columns alike."""
    import numpy as np

    from kvtier.store import StoreConfig, TieredStore
    rows = []
    scratch = _Aligned(total, huge=True)
    for size in sizes:
        n = total // size
        nbytes = n * size
        sb, db = src.blocks(size)[:n], dst.blocks(size)[:n]
        sa = [np.frombuffer(b, dtype=np.uint8) for b in sb]
        da = [np.frombuffer(b, dtype=np.uint8) for b in db]
        perm = _scatter_order(n)
        ssb, sdb = [sb[i] for i in perm], [db[i] for i in perm]

        def memcpy_blocks():
            for d, s in zip(da, sa):
                np.copyto(d, s)
        keys = [i.to_bytes(16, "little") for i in range(n)]
        root = data_dir / f"host-{size}"
        shutil.rmtree(root, ignore_errors=True)
        cfg = StoreConfig(root=root, host_bytes=nbytes, nvme_bytes=0, block_bytes=size)
        t = {k: float("inf") for k in ("bulk", "block", "put", "get", "put_sc", "get_sc", "put_1", "get_1")}

        def singles(fn, bufs):
            for k, b in zip(keys, bufs):
                fn(k, b)
        variants = _memcpy_variants(src, dst, scratch, nbytes)
        with TieredStore.open(cfg) as st:
            for _ in range(repeat):
                for fn in variants.values():
                    t["bulk"] = min(t["bulk"], _timed(fn))
                t["block"] = min(t["block"], _timed(memcpy_blocks))
                st.drop(keys)                     # untimed bookkeeping
                t["put"] = min(t["put"], _timed(lambda: st.put_many(keys, sb)))
                t["get"] = min(t["get"], _timed(lambda: st.get_many(keys, db)))
                st.drop(keys)
                t["put_sc"] = min(t["put_sc"], _timed(lambda: st.put_many(keys, ssb)))
                t["get_sc"] = min(t["get_sc"], _timed(lambda: st.get_many(keys, sdb)))
                st.drop(keys)
                t["put_1"] = min(t["put_1"], _timed(lambda: singles(st.put, sb)))
                t["get_1"] = min(t["get_1"], _timed(lambda: singles(st.get, db)))
            if bytes(db[-1]) != bytes(sb[-1]) or bytes(sdb[0]) != bytes(ssb[0]):
                raise RuntimeError("host tier returned wrong bytes")
        shutil.rmtree(root, ignore_errors=True)
        g = {k: _gbps(nbytes, v) for k, v in t.items()}
        rows.append(dict(block_bytes=size, bytes=nbytes, put_s=t["put"], get_s=t["get"], memcpy_s=t["bulk"],
                         put_gbps=g["put"], get_gbps=g["get"], memcpy_gbps=g["bulk"], memcpy_block_gbps=g["block"],
                         put_scattered_gbps=g["put_sc"], get_scattered_gbps=g["get_sc"],
                         put_single_gbps=g["put_1"], get_single_gbps=g["get_1"],
                         put_scattered_s=t["put_sc"], get_scattered_s=t["get_sc"],
                         put_single_s=t["put_1"], get_single_s=t["get_1"]))
        tick()
    return rows


def _scatter_order(n: int) -> list[int]:
    """Blocks 0, 2, 4, ..., then 1, 3, 5, ...: no block is followed by its
    neighbour in memory, so no two copies (or iovec entries) can coalesce."""
    return list(range(0, n, 2)) + list(range(1, n, 2))


def _raw_file(path: Path, nbytes: int) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o644)
    os.posix_fallocate(fd, 0, nbytes)
    return fd


def _nvme_rows(sizes, total, repeat, qd, io_bytes, engine_name, src, dst, data_dir, tick):
    from kvtier.store import StoreConfig, TieredStore
    from kvtier.store.io import IoOp, make_engine
    engine = make_engine(engine_name, qd)
    rows = []
    info = {}
    try:
        for size in sizes:
            n = total // size
            nbytes = n * size
            io_size = max(size, min(io_bytes, 1024 * size, nbytes) // size * size)   # the store's coalesced I/O
            sb, db = src.blocks(size)[:n], dst.blocks(size)[:n]
            rsrc, rdst = src.blocks(io_size), dst.blocks(io_size)
            rsrc, rdst = rsrc[:nbytes // io_size], rdst[:nbytes // io_size]
            raw_bytes = len(rsrc) * io_size
            raw_path = data_dir / f"raw-{size}.bin"
            fd = _raw_file(raw_path, raw_bytes)
            try:
                offs = [i * io_size for i in range(len(rsrc))]

                def raw_write_qd1():
                    for o, b in zip(offs, rsrc):
                        os.pwritev(fd, [b], o)
                    os.fdatasync(fd)

                def raw_read_qd1():
                    for o, b in zip(offs, rdst):
                        os.preadv(fd, [b], o)

                def raw_write_qd():
                    engine.run([IoOp(True, fd, o, (b,)) for o, b in zip(offs, rsrc)])
                    os.fdatasync(fd)

                def raw_write_each():      # the single-put baseline: one block, one fdatasync
                    for i in range(n1):
                        os.pwritev(fd, [sb[i]], i * size)
                        os.fdatasync(fd)

                def raw_read_qd():
                    engine.run([IoOp(False, fd, o, (b,)) for o, b in zip(offs, rdst)])

                keys = [i.to_bytes(16, "little") for i in range(n)]
                root = data_dir / f"store-{size}"
                shutil.rmtree(root, ignore_errors=True)
                slots = StoreConfig(root=root, block_bytes=size).slot_bytes * n   # slot headers included
                cfg = StoreConfig(root=root, host_bytes=0, nvme_bytes=slots, block_bytes=size,
                                  slab_bytes=slots, queue_depth=qd, io_bytes=io_bytes,
                                  io_engine=engine_name, direct_io="auto")
                t = {k: float("inf") for k in ("w1", "wq", "r1", "rq", "put", "get", "put_sc", "get_sc",
                                               "put_1", "get_1", "w_each")}
                perm = _scatter_order(n)
                ssb, sdb = [sb[i] for i in perm], [db[i] for i in perm]
                n1 = min(n, max(2, SINGLE_BYTES // size))     # single puts: each one is durable on its own
                k1 = keys[:n1]

                def singles(fn, bufs):
                    for k, b in zip(k1, bufs):
                        fn(k, b)
                with TieredStore.open(cfg) as st:
                    # every repeat measures all columns back to back (noise hits all alike)
                    for _ in range(repeat):
                        t["w1"] = min(t["w1"], _timed(raw_write_qd1))
                        t["wq"] = min(t["wq"], _timed(raw_write_qd))
                        st.drop(keys)                 # untimed bookkeeping
                        t["put"] = min(t["put"], _timed(lambda: st.put_many(keys, sb)))
                        t["r1"] = min(t["r1"], _timed(raw_read_qd1))
                        t["rq"] = min(t["rq"], _timed(raw_read_qd))
                        t["get"] = min(t["get"], _timed(lambda: st.get_many(keys, db)))
                        st.drop(keys)
                        t["put_sc"] = min(t["put_sc"], _timed(lambda: st.put_many(keys, ssb)))
                        t["get_sc"] = min(t["get_sc"], _timed(lambda: st.get_many(keys, sdb)))
                        st.drop(keys)
                        t["w_each"] = min(t["w_each"], _timed(raw_write_each))
                        t["put_1"] = min(t["put_1"], _timed(lambda: singles(st.put, sb)))
                        t["get_1"] = min(t["get_1"], _timed(lambda: singles(st.get, db)))
                    st.drop(keys)
                    st.put_many(keys, sb)
                    if not all(st.get_many(keys[-1:], db[-1:])) or bytes(db[-1]) != bytes(sb[-1]):
                        raise RuntimeError("NVMe tier returned wrong bytes")
                    s = st.stats()
                    info = dict(io_engine=s.io_engine, direct_io=s.direct_io)
                shutil.rmtree(root, ignore_errors=True)
            finally:
                os.close(fd)
                raw_path.unlink(missing_ok=True)
            tick()
            rw1, rwq, rr1, rrq, t_put, t_get = t["w1"], t["wq"], t["r1"], t["rq"], t["put"], t["get"]
            rows.append(dict(
                block_bytes=size, bytes=nbytes, io_bytes=io_size, put_s=t_put, get_s=t_get,
                put_gbps=_gbps(nbytes, t_put), get_gbps=_gbps(nbytes, t_get),
                raw_write_qd1_gbps=_gbps(raw_bytes, rw1), raw_read_qd1_gbps=_gbps(raw_bytes, rr1),
                raw_write_qd_gbps=_gbps(raw_bytes, rwq), raw_read_qd_gbps=_gbps(raw_bytes, rrq),
                raw_write_gbps=_gbps(raw_bytes, min(rw1, rwq)), raw_read_gbps=_gbps(raw_bytes, min(rr1, rrq)),
                raw_write_s=min(rw1, rwq) * nbytes / raw_bytes, raw_read_s=min(rr1, rrq) * nbytes / raw_bytes,
                put_scattered_gbps=_gbps(nbytes, t["put_sc"]), get_scattered_gbps=_gbps(nbytes, t["get_sc"]),
                put_scattered_s=t["put_sc"], get_scattered_s=t["get_sc"],
                single_bytes=n1 * size, put_single_gbps=_gbps(n1 * size, t["put_1"]),
                get_single_gbps=_gbps(n1 * size, t["get_1"]),
                raw_write_each_sync_gbps=_gbps(n1 * size, t["w_each"])))
            tick()
    finally:
        engine.close()
    return rows, info


def _lookup_bench(n_keys: int, data_dir: Path) -> dict:
    import numpy as np

    from kvtier.store import Namespace, StoreConfig, TieredStore, chain_keys
    ns = Namespace("kvtier-bench", "float16")
    keys = chain_keys(np.arange(n_keys * 16) % 50_000, 16, ns)
    root = data_dir / "lookup"
    shutil.rmtree(root, ignore_errors=True)
    cfg = StoreConfig(root=root, host_bytes=n_keys * 4096, nvme_bytes=0, block_bytes=4096)
    with TieredStore.open(cfg) as st:
        zero = np.zeros(4096, np.uint8)
        st.put_many(keys, [zero] * n_keys)
        times = []
        for _ in range(200):
            t0 = time.perf_counter()
            hit = st.lookup(keys)
            times.append(time.perf_counter() - t0)
        assert hit == n_keys
    shutil.rmtree(root, ignore_errors=True)
    times.sort()
    return dict(keys=n_keys, median_ms=statistics.median(times) * 1e3,
                p99_ms=times[int(0.99 * (len(times) - 1))] * 1e3, target_ms=1.0)


def _sglang_peer(sizes, total, repeat, src, nvme_rows, data_dir: Path) -> dict | str:
    """SGLang's HiCacheFile (one file per page, buffered writes, no fsync) on the
    same bytes the store's rows put, through ``batch_set``/``batch_get`` as
    SGLang's cache controller calls it.  Imported with
    ``kvtier.engine_adapter.sglang.import_sglang_storage`` (the storage modules without
    SGLang's front-end ``__init__``, which needs a GPU stack)."""
    try:
        import dataclasses

        import torch

        from kvtier.engine_adapter.sglang import SGLANG_VERSION, import_sglang_storage
        hs = import_sglang_storage()
    except Exception as exc:  # ImportError, or sglang failing to import its own deps
        return f"unavailable: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}".rstrip(": ")
    try:
        store_rows = {r["block_bytes"]: r for r in nvme_rows}
        rows = []
        for size in sizes:
            n = max(1, total // size)
            root = data_dir / f"sglang-{size}"
            shutil.rmtree(root, ignore_errors=True)
            defaults = dict(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
                            is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
                            model_name="kvtier-bench", extra_config={"file_storage_path": str(root)})
            fields = {f.name for f in dataclasses.fields(hs.HiCacheStorageConfig)}
            conf = hs.HiCacheStorageConfig(**{k: v for k, v in defaults.items() if k in fields})
            be = hs.HiCacheFile(conf, file_path=str(root))
            pages = [torch.frombuffer(b, dtype=torch.uint8) for b in src.blocks(size)[:n]]
            outs = [torch.empty(size, dtype=torch.uint8) for _ in range(n)]
            t_put = t_sync = t_get = float("inf")
            for r in range(repeat):          # fresh keys each repeat: HiCacheFile skips existing ones
                keys = [f"k{size}_{r}_{i}" for i in range(n)]
                t0 = time.perf_counter()
                ok = be.batch_set(keys, pages)
                t1 = time.perf_counter()
                os.sync()                    # what durability would cost it (it never fsyncs)
                t_put, t_sync = min(t_put, t1 - t0), min(t_sync, time.perf_counter() - t0)
                t_get = min(t_get, _timed(lambda: be.batch_get(keys, outs)))
                if not ok or not all(torch.equal(o, p) for o, p in zip(outs[-1:], pages[-1:])):
                    raise RuntimeError("HiCacheFile returned wrong bytes")
            shutil.rmtree(root, ignore_errors=True)
            nb = n * size
            row = dict(block_bytes=size, bytes=nb, put_gbps=_gbps(nb, t_put), put_synced_gbps=_gbps(nb, t_sync),
                       get_gbps=_gbps(nb, t_get))
            sr = store_rows.get(size)
            if sr is not None:
                row.update(kvtier_put_gbps=sr["put_gbps"], kvtier_get_gbps=sr["get_gbps"],
                           kvtier_put_vs_peer_synced=sr["put_gbps"] / row["put_synced_gbps"],
                           kvtier_get_vs_peer=sr["get_gbps"] / row["get_gbps"])
            rows.append(row)
        return dict(backend="sglang HiCacheFile", sglang_version=SGLANG_VERSION, rows=rows,
                    note="same bytes as the store's rows; batch_set/batch_get; fresh keys per repeat (best of "
                         f"{repeat}); put: buffered writes, no fsync (put_synced adds os.sync()); get reads "
                         "files just written, usually from the page cache (kvtier's get is O_DIRECT and "
                         "checksum-verified)")
    except Exception as exc:
        return f"failed: {type(exc).__name__}: {exc}"


def _agg(rows, bytes_key, time_key) -> float:
    return _gbps(sum(r[bytes_key] for r in rows), sum(r[time_key] for r in rows))


# ------------------------------------------------------------------ command
def run(args: argparse.Namespace) -> int:
    from kvtier.util.console import make_console as Console  # width rules: pipes not cut
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    if args.plot:
        png_path(args.plot)
    from kvtier.settings import layered          # flag > KVTIER_* > config file > default
    store = layered(("io_engine", "queue_depth"), {"io_engine": args.io_engine, "queue_depth": args.queue_depth},
                    source="the command line")
    args.io_engine, args.queue_depth = store.get("io_engine", "auto"), store.get("queue_depth", 16)
    data_dir = Path(ensure_dir(args.data_dir, "--data-dir"))
    sizes = sorted(set(args.sizes))
    total = args.total_mib * MIB
    if total < max(sizes):
        raise ValueError(f"--total-mib {args.total_mib} is smaller than the largest block size")
    total = total // max(sizes) * max(sizes)
    free = shutil.disk_usage(data_dir).free
    if free < 2 * total + 64 * MIB:
        raise ValueError(f"--data-dir needs about {2 * total // MIB + 64} MiB free, has {free // MIB} MiB")

    err = Console(stderr=True)
    src, dst = _Aligned(total, fill_seed=1), _Aligned(total)
    steps = 3 * len(sizes) + len(args.peer) + 1 + (len(sizes) if args.remote else 0)
    with Progress(TextColumn("[progress.description]{task.description}"), BarColumn(), TimeElapsedColumn(),
                  console=err, transient=True) as prog:
        task = prog.add_task("host tier", total=steps)
        tick = lambda: prog.advance(task)  # noqa: E731
        host_rows = _host_rows(sizes, total, args.repeat, src, dst, data_dir, tick)
        prog.update(task, description="NVMe tier")
        nvme_rows, info = _nvme_rows(sizes, total, args.repeat, args.queue_depth, args.io_mib * MIB,
                                     args.io_engine, src, dst, data_dir, tick)
        prog.update(task, description="lookup")
        lookup = _lookup_bench(args.lookup_keys, data_dir)
        tick()
        remote = None
        if args.remote:                 # the remote tier beside its raw client (bench/remote_bench.py)
            prog.update(task, description="remote tier")
            from kvtier.bench.remote_bench import remote_section
            remote = remote_section(args.remote, sizes, total, args.repeat, src, dst, tick)
        peers = {}
        for peer in dict.fromkeys(args.peer):
            prog.update(task, description=f"peer {peer}")
            if peer == "lmcache":
                from kvtier.bench.peers.lmcache import lmcache_peer
                peers[peer] = lmcache_peer(sizes, total, args.repeat, src.mm, host_rows, nvme_rows, data_dir,
                                           remote_url=args.remote, remote_rows=(remote or {}).get("rows", ()),
                                           env_dir=args.peer_env_dir,
                                           log=lambda s: prog.console.print(f"lmcache: {s}"))
            else:
                peers[peer] = _sglang_peer(sizes, min(total, 64 * MIB), args.repeat, src, nvme_rows, data_dir)
            tick()
    if not args.keep:
        for p in data_dir.glob("raw-*.bin"):
            p.unlink(missing_ok=True)

    memcpy = _agg(host_rows, "bytes", "memcpy_s")
    host_put = _agg(host_rows, "bytes", "put_s")
    host_get = _agg(host_rows, "bytes", "get_s")
    nv_put, nv_get = _agg(nvme_rows, "bytes", "put_s"), _agg(nvme_rows, "bytes", "get_s")
    raw_w, raw_r = _agg(nvme_rows, "bytes", "raw_write_s"), _agg(nvme_rows, "bytes", "raw_read_s")
    nb = sum(r["bytes"] for r in nvme_rows)
    plain_w = nb / sum(r["bytes"] / r["raw_write_qd1_gbps"] for r in nvme_rows)
    plain_r = nb / sum(r["bytes"] / r["raw_read_qd1_gbps"] for r in nvme_rows)
    h_sc_put, h_sc_get = _agg(host_rows, "bytes", "put_scattered_s"), _agg(host_rows, "bytes", "get_scattered_s")
    h_1_put, h_1_get = _agg(host_rows, "bytes", "put_single_s"), _agg(host_rows, "bytes", "get_single_s")
    n_sc_put, n_sc_get = _agg(nvme_rows, "bytes", "put_scattered_s"), _agg(nvme_rows, "bytes", "get_scattered_s")
    sb_total = sum(r["single_bytes"] for r in nvme_rows)
    n_1_put = sb_total / sum(r["single_bytes"] / r["put_single_gbps"] for r in nvme_rows)
    n_1_get = sb_total / sum(r["single_bytes"] / r["get_single_gbps"] for r in nvme_rows)
    raw_each = sb_total / sum(r["single_bytes"] / r["raw_write_each_sync_gbps"] for r in nvme_rows)
    ratio = lambda a, b: a / b  # noqa: E731
    doc = {
        "host": {"put_gbps": host_put, "get_gbps": host_get, "memcpy_gbps": memcpy,
                 "put_vs_memcpy": host_put / memcpy, "get_vs_memcpy": host_get / memcpy,
                 "api": "put_many/get_many of each size's blocks lying back to back in memory",
                 "scattered": {"put_gbps": h_sc_put, "get_gbps": h_sc_get,
                               "put_vs_memcpy": ratio(h_sc_put, memcpy), "get_vs_memcpy": ratio(h_sc_get, memcpy),
                               "api": "put_many/get_many, blocks scattered in memory (no copy coalesces)"},
                 "single": {"put_gbps": h_1_put, "get_gbps": h_1_get,
                            "put_vs_memcpy": ratio(h_1_put, memcpy), "get_vs_memcpy": ratio(h_1_get, memcpy),
                            "api": "one put/get call per block"},
                 "rows": [{**r, "put_vs_memcpy": r["put_gbps"] / r["memcpy_gbps"],
                           "get_vs_memcpy": r["get_gbps"] / r["memcpy_gbps"],
                           "put_scattered_vs_memcpy": r["put_scattered_gbps"] / r["memcpy_gbps"],
                           "get_scattered_vs_memcpy": r["get_scattered_gbps"] / r["memcpy_gbps"],
                           "put_single_vs_memcpy": r["put_single_gbps"] / r["memcpy_gbps"],
                           "get_single_vs_memcpy": r["get_single_gbps"] / r["memcpy_gbps"]} for r in host_rows]},
        "nvme": {"put_gbps": nv_put, "get_gbps": nv_get, "raw_write_gbps": raw_w, "raw_read_gbps": raw_r,
                 "io_engine": info.get("io_engine"), "direct_io": info.get("direct_io"),
                 "queue_depth": args.queue_depth, "io_bytes": args.io_mib * MIB,
                 "put_vs_raw": nv_put / raw_w, "get_vs_raw": nv_get / raw_r,
                 "raw_write_qd1_gbps": plain_w, "raw_read_qd1_gbps": plain_r,
                 "put_vs_qd1": nv_put / plain_w, "get_vs_qd1": nv_get / plain_r,
                 "api": "put_many/get_many of each size's blocks lying back to back in memory (host_bytes=0)",
                 "scattered": {"put_gbps": n_sc_put, "get_gbps": n_sc_get,
                               "put_vs_raw": ratio(n_sc_put, raw_w), "get_vs_raw": ratio(n_sc_get, raw_r),
                               "api": "put_many/get_many, blocks scattered in memory"},
                 "single": {"put_gbps": n_1_put, "get_gbps": n_1_get, "bytes": sb_total,
                            "put_vs_raw": ratio(n_1_put, raw_w), "get_vs_raw": ratio(n_1_get, raw_r),
                            "raw_write_each_sync_gbps": raw_each,
                            "put_vs_raw_each_sync": ratio(n_1_put, raw_each),
                            "api": f"one put/get call per block over the first {SINGLE_BYTES // MIB} MiB "
                                   "of each size; every put is durable on its own (write, fdatasync, index commit)",
                            "baselines": "put_vs_raw: the batch raw write (one fdatasync per batch); "
                                         "put_vs_raw_each_sync: raw pwritev + fdatasync of each block, "
                                         "the same flush granularity as a single put"},
                 "rows": [{**r, "put_vs_raw": r["put_gbps"] / r["raw_write_gbps"],
                           "get_vs_raw": r["get_gbps"] / r["raw_read_gbps"]} for r in nvme_rows]},
        "lookup": lookup,
        "peers": peers,
        "config": {"data_dir": str(data_dir), "total_bytes": total, "sizes": sizes, "repeat": args.repeat},
    }
    if remote is not None:
        doc["remote"] = remote
    for section in ("host", "nvme"):
        for r in doc[section]["rows"]:
            for k in [k for k in r if k.endswith("_s")]:
                del r[k]
    if args.plot:
        _plot(doc, args.plot)
    if args.json:
        emit_json(doc)
    else:
        _print_tables(doc)
    return 0


def _fmt_size(n: int) -> str:
    return f"{n // MIB} MiB" if n >= MIB else f"{n // KIB} KiB"


def _print_tables(doc: dict) -> None:
    from kvtier.util.console import fit_table, make_console  # width rules: pipes not cut
    con = make_console()
    bold = lambda cells: [f"[bold]{c}[/bold]" if c else c for c in cells]  # noqa: E731
    h = doc["host"]
    x = lambda g, m: f"{g:.2f} ({g / m:.2f}x)"  # noqa: E731
    rows = []
    for r in h["rows"]:
        m = r["memcpy_gbps"]
        rows.append([_fmt_size(r["block_bytes"]), f"{m:.2f}", f"{r['memcpy_block_gbps']:.2f}",
                     x(r["put_gbps"], m), x(r["get_gbps"], m), x(r["put_scattered_gbps"], m),
                     x(r["get_scattered_gbps"], m), x(r["put_single_gbps"], m), x(r["get_single_gbps"], m)])
    m = h["memcpy_gbps"]
    rows.append(bold(["all", f"{m:.2f}", "", x(h["put_gbps"], m), x(h["get_gbps"], m),
                      x(h["scattered"]["put_gbps"], m), x(h["scattered"]["get_gbps"], m),
                      x(h["single"]["put_gbps"], m), x(h["single"]["get_gbps"], m)]))
    cols = [(c, "right") for c in ("block", "memcpy", "memcpy/block", "batch put", "batch get", "scattered put",
                                   "scattered get", "single put", "single get")]
    _print_fitted(con, fit_table, cols, rows,
                  ("single put", "single get", "scattered put", "scattered get", "memcpy/block"),
                  "host tier vs memcpy (same run, interleaved); put/get GB/s and ratio to bulk memcpy")
    nv = doc["nvme"]
    rows = [[_fmt_size(r["block_bytes"]), _fmt_size(r["io_bytes"]), f"{r['put_gbps']:.2f}",
             f"{r['get_gbps']:.2f}", f"{r['raw_write_gbps']:.2f}", f"{r['raw_read_gbps']:.2f}",
             f"{r['put_vs_raw']:.2f}x", f"{r['get_vs_raw']:.2f}x"] for r in nv["rows"]]
    rows.append(bold(["all", "", f"{nv['put_gbps']:.2f}", f"{nv['get_gbps']:.2f}", f"{nv['raw_write_gbps']:.2f}",
                      f"{nv['raw_read_gbps']:.2f}", f"{nv['put_vs_raw']:.2f}x", f"{nv['get_vs_raw']:.2f}x"]))
    cols = [(c, "right") for c in ("block", "I/O", "put GB/s", "get GB/s", "raw write", "raw read",
                                   "put/raw", "get/raw")]
    _print_fitted(con, fit_table, cols, rows, ("I/O", "raw write", "raw read"),
                  f"NVMe tier vs raw sequential O_DIRECT ({nv['io_engine']}, "
                  f"{'O_DIRECT' if nv['direct_io'] else 'buffered'}, QD {nv['queue_depth']})")
    for name in ("scattered", "single"):
        v = nv[name]
        con.print(f"NVMe {name} ({v['api']}): put {v['put_gbps']:.2f} GB/s ({v['put_vs_raw']:.2f}x raw), "
                  f"get {v['get_gbps']:.2f} GB/s ({v['get_vs_raw']:.2f}x raw)")
    v = nv["single"]
    con.print(f"NVMe single put vs raw write + fdatasync per block ({v['raw_write_each_sync_gbps']:.2f} GB/s): "
              f"{v['put_vs_raw_each_sync']:.2f}x")
    con.print(f"raw = the better of one-at-a-time pwritev/preadv and the store's engine at QD "
              f"{nv['queue_depth']}; vs one-at-a-time only: put {nv['put_vs_qd1']:.2f}x, get {nv['get_vs_qd1']:.2f}x")
    lk = doc["lookup"]
    con.print(f"lookup of {lk['keys']} keys: median {lk['median_ms']:.3f} ms, p99 {lk['p99_ms']:.3f} ms "
              f"(target < {lk['target_ms']} ms)")
    if doc.get("remote"):
        from kvtier.bench.remote_bench import print_remote
        print_remote(con, doc["remote"])
    for name, res in doc["peers"].items():
        if isinstance(res, str):
            con.print(f"peer {name}: {res}")
        elif name == "lmcache":
            from kvtier.bench.peers.lmcache import print_rows
            print_rows(con, res)
        else:
            for r in res["rows"]:
                con.print(f"peer {name} {_fmt_size(r['block_bytes'])}: put {r['put_gbps']:.2f} GB/s "
                          f"({r['put_synced_gbps']:.2f} with os.sync), get {r['get_gbps']:.2f} GB/s; "
                          f"kvtier put {r.get('kvtier_put_gbps', float('nan')):.2f}, "
                          f"get {r.get('kvtier_get_gbps', float('nan')):.2f}")
            con.print(f"  ({res['note']})")


def _print_fitted(con, fit_table, columns, rows, drop, title) -> None:
    """One table through ``fit_table``: a narrow terminal leaves out ``drop`` (least telling
    first) rather than cut cells, and says so."""
    t, dropped = fit_table(con, columns, rows, drop=drop, title=title)
    con.print(t)
    if dropped:
        con.print(f"(narrow terminal: columns {', '.join(dropped)} left out; --json has every field)",
                  style="dim", highlight=False)


def _plot(doc: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    hx = [r["block_bytes"] / KIB for r in doc["host"]["rows"]]
    a.plot(hx, [r["put_gbps"] for r in doc["host"]["rows"]], "o-", label="host put")
    a.plot(hx, [r["get_gbps"] for r in doc["host"]["rows"]], "s-", label="host get")
    a.plot(hx, [r["memcpy_gbps"] for r in doc["host"]["rows"]], "--", c="k", label="memcpy (bulk)")
    a.plot(hx, [r["memcpy_block_gbps"] for r in doc["host"]["rows"]], ":", c="gray", label="memcpy per block")
    a.set(xscale="log", xlabel="block KiB", ylabel="GB/s", title="host tier")
    a.legend()
    nx = [r["block_bytes"] / KIB for r in doc["nvme"]["rows"]]
    b.plot(nx, [r["put_gbps"] for r in doc["nvme"]["rows"]], "o-", label="NVMe put")
    b.plot(nx, [r["get_gbps"] for r in doc["nvme"]["rows"]], "s-", label="NVMe get")
    b.plot(nx, [r["raw_write_gbps"] for r in doc["nvme"]["rows"]], "--", label="raw O_DIRECT write (best)")
    b.plot(nx, [r["raw_write_qd1_gbps"] for r in doc["nvme"]["rows"]], ":", label="raw write, one at a time")
    b.plot(nx, [r["raw_read_gbps"] for r in doc["nvme"]["rows"]], "--", label="raw O_DIRECT read")
    b.set(xscale="log", xlabel="block KiB", ylabel="GB/s", title=f"NVMe tier ({doc['nvme']['io_engine']})")
    b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
