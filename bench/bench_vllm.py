"""kvtier's vLLM tier beside vLLM's own filesystem tier (``fs``), same chunks.

    python -m kvtier.bench.bench_vllm --data-dir DIR [--chunks 96] [--json]

Each tier is a secondary tier of vLLM 0.33.0's real ``TieringOffloadingManager``
(CPU primary tier in vLLM's shared-memory region), driven by vLLM's
scheduler-side call sequence (:mod:`kvtier.engine_adapter.vllm_driver`):

* warm-up (untimed): one chunk under another key; then kvtier's store is let
  finish zeroing its new slab's free slots (``prepare_slots``, store/slotprep.py:
  it works in idle disk time, as an engine's store has between its start and its
  first store job); the wait is reported (``rounds[i].kvtier.prepare_wait_s``).
* store: ``prepare_store`` + the worker's GPU->CPU copy + ``complete_store``
  cascade every chunk to the tier; timed until the tier has finished
  (both tiers write with O_DIRECT; kvtier also fdatasyncs before indexing --
  the ``kvtier_nosync`` row is kvtier with ``durable: false``, like fs).
  The fs tier never flushes, so its store is also timed with one ``os.sync()``
  after it finished, inside the timing (``store_synced_gbps``: the durable
  figure, the rule of the ``bench tiers`` peers).  ``vllm_fs_store_vs_raw_write_overwrite``
  (best round and paired) is the fs tier as it runs over the raw flushed
  overwrite of the same round -- the ceiling of a durable store into written
  extents: above 1, no durable store of that round could have been ahead of it.
* load: the engine restarts (empty CPU tier, same directory), every chunk is
  looked up, promoted from the tier and read back; timed until all are HIT.
  The fs tier's files are dropped from the page cache first (it falls back to
  buffered I/O where O_DIRECT is refused); kvtier reads with O_DIRECT.
* lookup: then the tier's own ``lookup`` of every stored chunk, as vLLM's
  manager calls it per chunk under its lock (20,000 calls; ``lookup_us`` per
  call, best round; ``kvtier_lookup_time_vs_fs`` below 1: kvtier's is cheaper).

Chunks default to 2 blocks x 16 tokens of a 28-layer, 4-KV-head, 128-dim
bf16 model (1.75 MiB).  Limits measured in the same run on the same directory
(:class:`kvtier.bench.timing.RawDirect`): sequential O_DIRECT write (+fdatasync)
and read at the chunk size, one at a time (QD1) and at ``--queue-depth``
through the store's I/O engine; the better of the two is the baseline (the
rule of ``kvtier bench tiers``).  Like for like with the tiers: the raw write
goes to a fresh preallocated file (a first write: on ext4 it pays the
unwritten-extent conversion an overwrite does not; the overwrite is reported
beside it, ``raw_write_overwrite_gbps``), from one buffer per chunk (as the
tiers write from vLLM's rows), and its read is the first read of that file
after its write and an ``os.sync``, as a tier's load follows its store.
``--repeat`` rounds, each one the raw write + read and every tier (fresh
directories), in an order that alternates; every figure is its best round,
and ``ratios_paired_median`` is the median over rounds of the same-round
ratios (``*_qd``: against the QD figure alone -- the access pattern kvtier
issues, one measurement per round like each tier's, where the better-of-two
baseline is the larger of two draws on a noisy disk).  Every chunk read back is checked bit-exact in every round.
The store timing includes the driver's copy of each chunk into its CPU-tier
row (where vLLM's GPU -> CPU DMA would land), for both tiers alike.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
import uuid
from contextlib import nullcontext
from pathlib import Path

from kvtier.bench.script import run_script

GB = 1e9


def _config(extra: dict, chunks: int, block_bytes: int, blocks_per_chunk: int):
    from vllm.v1.kv_offload.config import (OffloadingCacheConfig, OffloadingConfig, OffloadingGroupConfig,
                                           OffloadingModelConfig, OffloadingParallelConfig)
    return OffloadingConfig(
        groups=(OffloadingGroupConfig(tokens_per_block=16, layer_names=tuple(f"l{i}" for i in range(28)),
                                      group_id=0),),
        worker_kv_bytes_per_block=block_bytes, enable_kv_cache_events=False,
        extra_config={"cpu_bytes_to_use": chunks * block_bytes * blocks_per_chunk + (4 << 20), **extra},
        engine_id=uuid.uuid4().hex, model=OffloadingModelConfig(name="bench/model", dtype="bfloat16"),
        cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=blocks_per_chunk),
        parallel=OffloadingParallelConfig(rank=0, world_size=1, tp_size=1, pp_size=1, pcp_size=1, dcp_size=1,
                                          data_parallel_index=0, data_parallel_size=1,
                                          data_parallel_rank_local=None, is_parallelism_agnostic=True))


def _keys(n: int, blocks_per_chunk: int) -> list:
    from vllm.utils.hashing import sha256_cbor
    from vllm.v1.core.kv_cache_utils import hash_block_tokens, init_none_hash
    from vllm.v1.kv_offload.base import make_offload_key
    init_none_hash(sha256_cbor)
    parent, out = None, []
    for b in range(n * blocks_per_chunk):
        parent = hash_block_tokens(sha256_cbor, parent, list(range(b * 16, b * 16 + 16)))
        if (b + 1) % blocks_per_chunk == 0:
            out.append(make_offload_key(parent, 0))
    return out


def _drop_cache(root: Path) -> None:
    from kvtier.util.pagecache import drop_page_cache
    drop_page_cache([root])


def _driver(tier_cfg: dict, n: int, block_bytes: int, blocks_per_chunk: int):
    """vLLM's real scheduler-side manager with ``tier_cfg`` as its secondary tier, driven as an engine."""
    from kvtier.engine_adapter.vllm_driver import SchedulerDriver
    from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec
    return SchedulerDriver(TieringOffloadingSpec(_config(
        {"spec_name": "TieringOffloadingSpec", "secondary_tiers": [dict(tier_cfg)]}, n, block_bytes, blocks_per_chunk)))


def _measure(tier_cfg: dict, args, data, keys, block_bytes: int, root: Path, synced: bool = False) -> dict:
    import numpy as np

    from vllm.v1.kv_offload.base import LookupResult

    def engine():
        return _driver(tier_cfg, len(keys), block_bytes, args.blocks_per_chunk)

    # warm-up: one chunk under another key, so one-time set-up is not timed
    e = engine()
    wk = _keys(len(keys) + 1, args.blocks_per_chunk)[-1:]
    ctx = e.new_request("warm")
    e.offload(ctx, wk, {wk[0]: data[keys[0]]})
    e.settle()
    e.finish(ctx)
    # an engine's store is open for seconds (model load, warm-up) before its first store job;
    # kvtier zeroes its new slab's free slots in that idle time (store/slotprep.py): let it finish
    t0 = time.perf_counter()
    for t in e.tiers:
        wait = getattr(getattr(t, "store", None), "wait_prepared", None)
        if wait is not None:
            wait(60.0)
    t_prep = time.perf_counter() - t0
    # store: cascade every chunk to the tier
    ctx = e.new_request("store")
    t0 = time.perf_counter()
    for lo in range(0, len(keys), args.batch):
        e.offload(ctx, keys[lo:lo + args.batch], data)
    e.settle()
    t_store = time.perf_counter() - t0
    if synced:        # a tier that never flushes: what its store costs made durable
        os.sync()
    t_synced = time.perf_counter() - t0
    e.finish(ctx)
    e.settle()
    e.shutdown()
    _drop_cache(root)
    # load: a fresh engine promotes every chunk back from the tier
    e = engine()
    ctx = e.new_request("load")
    t0 = time.perf_counter()
    res = e.fetch(ctx, keys)
    t_load = time.perf_counter() - t0
    hits = sum(r is LookupResult.HIT for r in res)
    exact = hits == len(keys) and all(
        b == data[k].tobytes() for k, b in zip(keys, e.read(ctx, keys)))
    # the tier's own lookup, as vLLM's manager calls it per chunk (under its lock), every chunk
    # stored: the per-call cost on the scheduler's thread
    tier, calls = e.tiers[0], max(LOOKUP_CALLS // len(keys), 1) * len(keys)
    with e.lock:
        t0 = time.perf_counter()
        for i in range(calls):
            tier.lookup(keys[i % len(keys)], ctx)
        lookup_us = (time.perf_counter() - t0) / calls * 1e6
    e.finish(ctx)
    e.settle()
    e.shutdown()
    del np
    return {"store_s": t_store, "store_synced_s": t_synced, "load_s": t_load, "hits": hits,
            "bit_exact": bool(exact), "prepare_wait_s": t_prep, "lookup_us": lookup_us}


TIERS = ("vllm_fs", "kvtier", "kvtier_nosync")
LOOKUP_CALLS = 20_000     # tier lookups timed per tier and round


def _raw_round(raw, args, data, keys, block_bytes: int, d: Path) -> None:
    """The raw write and read between vLLM's own CPU-tier memory and the disk:
    written from the rows of one engine (after the driver's copy into them, as a
    tier's store), read into the rows of a fresh engine after an ``os.sync`` (as
    a tier's load after the restart).  The rows are where every tier's bytes
    move from and to, so the baseline moves the same memory."""
    def on_engine_rows(measure, fill: bool) -> None:
        """``measure`` with the raw baseline moving a fresh engine's rows (filled first for a write)."""
        e = _driver({"type": "fs", "root_dir": str(d)}, len(keys), block_bytes, args.blocks_per_chunk)
        if fill:
            for i, k in enumerate(keys):
                e.rows[i] = data[k]
        raw.use_buffers([e.rows[i] for i in range(len(keys))])
        try:
            measure()
        finally:
            raw.use_buffers(None)
            e.shutdown()
    if args.raw_memory == "own":
        raw.measure_write()
        os.sync()
        raw.measure_read()
        return
    on_engine_rows(raw.measure_write, fill=True)
    os.sync()
    on_engine_rows(raw.measure_read, fill=False)
    shutil.rmtree(d, ignore_errors=True)


def _tier_cfg(name: str, root: Path, chunk: int, n: int) -> dict:
    if name == "vllm_fs":
        return {"type": "fs", "root_dir": str(root)}
    cfg = {"type": "KvtierTier", "module_path": "kvtier.engine_adapter.vllm", "data_dir": str(root),
           "nvme_gb": 2 * chunk * (n + 1) / GB + 0.01}
    return {**cfg, "durable": False} if name == "kvtier_nosync" else cfg


def run(args: argparse.Namespace) -> dict:
    import numpy as np
    from rich.console import Console
    from rich.progress import Progress

    from kvtier.bench.timing import RawDirect, StageTimers
    if args.chunks < 1 or args.blocks_per_chunk < 1 or args.batch < 1 or args.repeat < 1:
        raise ValueError("--chunks, --blocks-per-chunk, --batch and --repeat must be >= 1")
    block_bytes = 2 * 16 * 28 * 4 * 128 * 2          # K+V, 16 tokens, 28 layers, 4 heads, 128 dim, bf16
    chunk = block_bytes * args.blocks_per_chunk
    root = Path(args.data_dir) / "bench_vllm"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    keys = _keys(args.chunks, args.blocks_per_chunk)
    rng = np.random.default_rng(0)
    data = {k: rng.integers(0, 256, chunk, dtype=np.uint8) for k in keys}
    out: dict = {"vllm_version": "0.33.0", "chunks": len(keys), "chunk_bytes": chunk,
                 "total_bytes": chunk * len(keys), "repeat": args.repeat}
    best = {t: {"store_s": float("inf"), "store_synced_s": float("inf"), "load_s": float("inf"),
                "lookup_us": float("inf"), "hits": len(keys), "bit_exact": True} for t in TIERS}
    # with --raw-memory engine the raw I/O moves the engine's rows: its own buffers stay a small recycled set
    raw = RawDirect(root / "raw.bin", chunk, len(keys), queue_depth=args.queue_depth, fresh=True,
                    distinct=args.raw_memory == "own")
    per_round: list[dict] = []
    try:
        with Progress(transient=True, console=Console(stderr=True)) as prog:
            task = prog.add_task("rounds", total=args.repeat * (len(TIERS) + 1))
            # every round: the raw write + read and each tier (store, engine restart, load) in an
            # order that alternates, fresh directories and files each round; the best round is kept
            for r in range(args.repeat):
                order = ("raw",) + TIERS
                rnd: dict = {}
                for name in (order if r % 2 == 0 else order[::-1]):
                    prog.update(task, description=f"round {r + 1}: {name}")
                    if name == "raw":       # the raw read follows its write as each tier's load does
                        _raw_round(raw, args, data, keys, block_bytes, root / f"raw-{r}")
                        rnd["raw"] = raw.rounds()[-1]
                        prog.advance(task)
                        continue
                    d = root / f"{name}-{r}"
                    with StageTimers() if args.profile and name == "kvtier" else nullcontext() as prof:
                        m = _measure(_tier_cfg(name, d, chunk, len(keys)), args, data, keys, block_bytes, d,
                                     synced=name == "vllm_fs")
                    if prof is not None:
                        out.setdefault("profile", {})[f"round {r + 1}"] = {
                            "store_s": m["store_s"], "load_s": m["load_s"], "stages": prof.report()}
                    shutil.rmtree(d, ignore_errors=True)
                    rnd[name] = {"store_gbps": chunk * len(keys) / m["store_s"] / GB,
                                 "load_gbps": chunk * len(keys) / m["load_s"] / GB,
                                 "prepare_wait_s": m["prepare_wait_s"], "lookup_us": m["lookup_us"]}
                    b = best[name]
                    for k in ("store_s", "store_synced_s", "load_s", "lookup_us"):
                        b[k] = min(b[k], m[k])
                    b["hits"], b["bit_exact"] = min(b["hits"], m["hits"]), b["bit_exact"] and m["bit_exact"]
                    prog.advance(task)
                per_round.append(rnd)
        out["limits"] = raw.limits()
    finally:
        raw.close()
        shutil.rmtree(root, ignore_errors=True)
    out["rounds"] = per_round
    out["limits"]["raw_memory"] = args.raw_memory
    total = chunk * len(keys)
    for name in TIERS:
        b = best[name]
        out[name] = {"store_gbps": total / b["store_s"] / GB, "load_gbps": total / b["load_s"] / GB,
                     "lookup_us": b["lookup_us"], "hits": b["hits"], "bit_exact": b["bit_exact"]}
    out["vllm_fs"]["store_synced_gbps"] = total / best["vllm_fs"]["store_synced_s"] / GB
    lim, fs, kv = out["limits"], out["vllm_fs"], out["kvtier"]
    out["ratios"] = {"kvtier_store_vs_raw_write": kv["store_gbps"] / lim["raw_write_gbps"],
                     "kvtier_load_vs_raw_read": kv["load_gbps"] / lim["raw_read_gbps"],
                     "kvtier_store_vs_raw_write_qd": kv["store_gbps"] / lim["raw_write_qd_gbps"],
                     "kvtier_load_vs_raw_read_qd": kv["load_gbps"] / lim["raw_read_qd_gbps"],
                     "kvtier_store_vs_raw_write_qd1": kv["store_gbps"] / lim["raw_write_qd1_gbps"],
                     "kvtier_load_vs_raw_read_qd1": kv["load_gbps"] / lim["raw_read_qd1_gbps"],
                     "kvtier_store_vs_raw_write_overwrite": kv["store_gbps"] / lim["raw_write_overwrite_gbps"],
                     "kvtier_store_vs_fs": kv["store_gbps"] / fs["store_gbps"],
                     "kvtier_store_vs_fs_synced": kv["store_gbps"] / fs["store_synced_gbps"],
                     "kvtier_load_vs_fs": kv["load_gbps"] / fs["load_gbps"],
                     "kvtier_lookup_time_vs_fs": kv["lookup_us"] / fs["lookup_us"],
                     "kvtier_nosync_store_vs_fs": out["kvtier_nosync"]["store_gbps"] / fs["store_gbps"],
                     "vllm_fs_store_vs_raw_write_overwrite": fs["store_gbps"] / lim["raw_write_overwrite_gbps"]}
    out["ratios_paired_median"] = _paired(per_round)
    return out


def _paired(per_round: list[dict]) -> dict:
    """Median over rounds of kvtier / raw (and / fs) within the same round: each
    pair measured minutes apart at most, so the disk's drift cancels."""
    import statistics

    def med(f):
        return statistics.median(f(r) for r in per_round)
    return {"kvtier_store_vs_raw_write": med(lambda r: r["kvtier"]["store_gbps"] / r["raw"]["write_gbps"]),
            "kvtier_load_vs_raw_read": med(lambda r: r["kvtier"]["load_gbps"] / r["raw"]["read_gbps"]),
            "kvtier_store_vs_raw_write_qd": med(lambda r: r["kvtier"]["store_gbps"] / r["raw"]["write_qd_gbps"]),
            "kvtier_load_vs_raw_read_qd": med(lambda r: r["kvtier"]["load_gbps"] / r["raw"]["read_qd_gbps"]),
            "kvtier_store_vs_fs": med(lambda r: r["kvtier"]["store_gbps"] / r["vllm_fs"]["store_gbps"]),
            "kvtier_load_vs_fs": med(lambda r: r["kvtier"]["load_gbps"] / r["vllm_fs"]["load_gbps"]),
            "kvtier_lookup_time_vs_fs": med(lambda r: r["kvtier"]["lookup_us"] / r["vllm_fs"]["lookup_us"]),
            "kvtier_store_vs_raw_write_overwrite":
                med(lambda r: r["kvtier"]["store_gbps"] / r["raw"]["write_overwrite_gbps"]),
            # the path without its flush against the fs tier (which never flushes)
            "kvtier_nosync_store_vs_fs": med(lambda r: r["kvtier_nosync"]["store_gbps"] / r["vllm_fs"]["store_gbps"]),
            # > 1: the fs tier as it runs stores faster than a flushed overwrite of the same round,
            # the ceiling of any durable store into written extents (kvtier's prepared slots)
            "vllm_fs_store_vs_raw_write_overwrite":
                med(lambda r: r["vllm_fs"]["store_gbps"] / r["raw"]["write_overwrite_gbps"])}


def _print(doc: dict) -> None:
    from rich.console import Console
    from rich.table import Table
    t = Table(title=f"vLLM {doc['vllm_version']} secondary tiers, {doc['chunks']} chunks x "
                    f"{doc['chunk_bytes'] / 2**20:.2f} MiB")
    for c in ("tier", "store GB/s", "load GB/s", "lookup us", "hits", "bit-exact"):
        t.add_column(c)
    for name in ("vllm_fs", "kvtier", "kvtier_nosync"):
        r = doc[name]
        t.add_row(name, f"{r['store_gbps']:.2f}", f"{r['load_gbps']:.2f}", f"{r['lookup_us']:.2f}", str(r["hits"]),
                  str(r["bit_exact"]))
        if name == "vllm_fs":
            t.add_row("  + os.sync (durable)", f"{r['store_synced_gbps']:.2f}", "", "", "", "")
    lim = doc["limits"]
    t.add_row("raw O_DIRECT (fresh file)", f"{lim['raw_write_gbps']:.2f}", f"{lim['raw_read_gbps']:.2f}", "", "", "")
    t.add_row("  (QD1 only)", f"{lim['raw_write_qd1_gbps']:.2f}", f"{lim['raw_read_qd1_gbps']:.2f}", "", "", "")
    t.add_row("  (overwrite)", f"{lim['raw_write_overwrite_gbps']:.2f}", "", "", "", "")
    Console().print(t)
    Console().print({k: round(v, 2) for k, v in doc["ratios"].items()})
    Console().print("paired (median over rounds of same-round ratios):",
                    {k: round(v, 2) for k, v in doc["ratios_paired_median"].items()})
    _print_profile(doc)


def _print_profile(doc: dict) -> None:
    from rich.console import Console
    for rnd, p in doc.get("profile", {}).items():
        Console().print(f"kvtier stages, {rnd}: " + ", ".join(
            f"{k} {v['s']:.3f} s/{v['calls']} (span {v['span_s']:.3f})" for k, v in p["stages"].items()))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m kvtier.bench.bench_vllm", description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", required=True, help="directory on the disk to test (not tmpfs)")
    p.add_argument("--chunks", type=int, default=96,
                   help="chunks stored and loaded per tier and round (default 96 = 0.18 GB; docs/peers.md has "
                        "the size curve: 288, 576, 1152, 2304 chunks)")
    p.add_argument("--blocks-per-chunk", type=int, default=2)
    p.add_argument("--batch", type=int, default=16, help="chunks per prepare_store (one scheduler step)")
    p.add_argument("--repeat", type=int, default=5,
                   help="rounds (fresh directories each); every figure is the best round, and the paired "
                        "ratios the median over rounds (default 5)")
    p.add_argument("--queue-depth", type=int, default=16, help="queue depth of the raw QD baseline (default 16)")
    p.add_argument("--raw-memory", choices=("engine", "own"), default="engine",
                   help="what the raw baseline writes from and reads into: vLLM's CPU-tier rows, as the "
                        "tiers (engine, default), or its own buffers (own)")
    p.add_argument("--profile", action="store_true",
                   help="also time the kvtier tier's stages (put_many, fdatasync, index commit, ...) per round")
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    return run_script("bench_vllm", p, run, _print, argv)


if __name__ == "__main__":
    sys.exit(main())
