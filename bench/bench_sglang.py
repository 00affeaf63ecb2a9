"""kvtier's SGLang backend beside SGLang's own ``HiCacheFile``, on the same pages.

    python -m kvtier.bench.bench_sglang --data-dir DIR [--pages 192] [--page-tokens 32] [--json]

Both backends get the same host pool (SGLang's MHA ``page_first`` layout,
default geometry 28 layers x 4 KV heads x 128 dim, bf16: 1.75 MiB pages of 32
tokens) and the same SGLang page keys, through the interface SGLang's cache
controller uses for each:

* HiCacheFile: the generic path -- ``batch_set(keys, [pool.get_data_page(i)])``
  and ``batch_get(keys, dummy pages)`` + ``set_from_flat_data_page``.
  It writes with buffered I/O and never flushes, so its put is timed twice:
  as called, and with the ``sync`` that makes it durable.  Its get is timed
  cold (``sync`` + ``POSIX_FADV_DONTNEED`` on its files) and warm.
* kvtier: ``batch_set_v1`` / ``batch_get_v1`` over host indices (what
  ``interface_v1: 1`` selects), durable (O_DIRECT + fdatasync before the index
  commit), reads always from disk (O_DIRECT; checksums verified).

Physical limits measured in the same run, on the same directory: memcpy of
the working set, and sequential O_DIRECT write (+fdatasync) and read at the
page size, one at a time (QD1) and at ``--queue-depth`` through the store's
I/O engine (:class:`kvtier.bench.timing.RawDirect`); the better of the two is
the baseline (the rule of ``kvtier bench tiers``; ``raw_detail`` has both).
Every backend writes into a fresh directory, so the raw write goes to a fresh
preallocated file too (a first write: on ext4 it pays the unwritten-extent
conversion an overwrite does not; ``raw_detail.raw_write_overwrite_gbps`` is
the overwrite of that file).
``--repeat`` rounds, each one the raw write and read and every backend (fresh
directory, a first write of every page), in an order that alternates; the raw
read follows its own write and an ``os.sync`` (as kvtier's get follows its
put), from and into one buffer per page (as kvtier's staging area).  Every
figure is its best round; ``ratios_paired_median`` is the median over rounds
of kvtier / raw within the same round.  Every backend's reads are checked
bit-exact against the pool in every round.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from contextlib import nullcontext
from pathlib import Path

from kvtier.bench.script import run_script
from kvtier.bench.timing import RawDirect, StageTimers, best_of

GB = 1e9


class PageFirstHostPool:
    """SGLang's MHA host KV pool, ``page_first`` layout, reduced to what the
    storage layer touches (sglang 0.5.23 ``pool_host/mha.py``): ``kv_buffer`` is
    (2, size, layer_num, head_num, head_dim) and a page starts at a token index.
    SGLang's own class cannot be built on a CPU-only machine (see docs/engines.md)."""

    layout = "page_first"

    def __init__(self, size_tokens: int, page_size: int, layers: int, heads: int, head_dim: int, dtype=None) -> None:
        import torch
        self.dtype = dtype if dtype is not None else torch.bfloat16
        self.size, self.page_size = size_tokens, page_size
        self.layer_num, self.head_num, self.head_dim = layers, heads, head_dim
        self.kv_buffer = torch.zeros((2, size_tokens, layers, heads, head_dim), dtype=self.dtype)

    def get_size_per_token(self) -> int:
        return 2 * self.head_dim * self.head_num * self.layer_num * self.dtype.itemsize

    def get_data_page(self, index, flat: bool = True):
        page = self.kv_buffer[:, index:index + self.page_size, :, :, :]
        return page.flatten() if flat else page

    def get_dummy_flat_data_page(self):
        import torch
        return torch.zeros((2, self.layer_num, self.page_size, self.head_num, self.head_dim),
                           dtype=self.dtype).flatten()

    def set_from_flat_data_page(self, index: int, data_page) -> None:
        self.kv_buffer[:, index:index + self.page_size, :, :, :] = data_page.reshape(
            2, self.page_size, self.layer_num, self.head_num, self.head_dim)

    def fill_random(self, seed: int) -> None:
        import torch
        g = torch.Generator().manual_seed(seed)
        self.kv_buffer.view(torch.int16).copy_(
            torch.randint(-32768, 32767, self.kv_buffer.shape, generator=g, dtype=torch.int16))


def _gbps(nbytes: int, s: float) -> float:
    return nbytes / s / GB if s > 0 else float("inf")


def _drop_cache(paths) -> None:
    from kvtier.util.pagecache import drop_page_cache
    drop_page_cache(paths)


def run(args: argparse.Namespace) -> dict:
    import numpy as np
    import torch
    from rich.console import Console
    from rich.progress import Progress

    from kvtier.engine_adapter.sglang import SGLANG_VERSION, import_sglang_storage
    hs = import_sglang_storage()
    from sglang.srt.mem_cache.storage import StorageBackendFactory
    from sglang.srt.mem_cache.utils import get_hash_str

    n, ps = args.pages, args.page_tokens
    if n < 1 or ps < 1 or args.repeat < 1:
        raise ValueError("--pages, --page-tokens and --repeat must be >= 1")
    root = Path(args.data_dir)
    root.mkdir(parents=True, exist_ok=True)
    work = root / "bench_sglang"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    src = PageFirstHostPool(n * ps, ps, args.layers, args.kv_heads, args.head_dim)
    dst = PageFirstHostPool(n * ps, ps, args.layers, args.kv_heads, args.head_dim)
    src.fill_random(0)
    page_bytes = src.get_dummy_flat_data_page().numel() * src.dtype.itemsize
    total = n * page_bytes
    keys = get_hash_str(list(range(n * ps)), None, page_size=ps)
    # one page under another key, written first by each backend so that one-time
    # set-up (directories, slab file, staging memory) is not in the timed puts
    warm = get_hash_str([10**6 + t for t in range(ps)], None, page_size=ps)
    idx = torch.arange(n * ps)
    want = src.kv_buffer.view(torch.uint8)

    def conf(extra):
        return hs.HiCacheStorageConfig(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
                                       is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
                                       model_name="bench/model", extra_config=extra)

    out: dict = {"sglang_version": SGLANG_VERSION, "pages": n, "page_tokens": ps, "page_bytes": page_bytes,
                 "total_bytes": total, "repeat": args.repeat}
    t = {k: float("inf") for k in ("hf_put", "hf_sync", "hf_cold", "hf_warm", "kv_put", "kv_get", "kg_put", "kg_get")}
    exact = {"hicachefile": True, "kvtier": True, "kvtier_generic": True}
    info: dict = {}

    def hicachefile(r: int) -> None:      # SGLang's HiCacheFile, generic path (what the controller does for it)
        hf_dir = work / f"hicachefile-{r}"
        hf = hs.HiCacheFile(conf({"file_storage_path": str(hf_dir)}), file_path=str(hf_dir))
        hf.batch_set(warm, [src.get_data_page(0)])
        t0 = time.perf_counter()
        ok = hf.batch_set(keys, [src.get_data_page(i * ps) for i in range(n)])
        t_put = time.perf_counter() - t0
        os.sync()
        t["hf_put"], t["hf_sync"] = min(t["hf_put"], t_put), min(t["hf_sync"], time.perf_counter() - t0)
        files = [str(hf_dir / f) for f in os.listdir(hf_dir) if f.endswith(".bin")]
        assert len(files) == n + 1, f"HiCacheFile wrote {len(files)} files for {n + 1} pages"

        def hf_get():
            pages = hf.batch_get(keys, [src.get_dummy_flat_data_page() for _ in keys])
            for i, pg in enumerate(pages):
                dst.set_from_flat_data_page(i * ps, pg)
        dst.kv_buffer.zero_()
        _drop_cache(files)
        t["hf_cold"] = min(t["hf_cold"], best_of(hf_get, 1))
        exact["hicachefile"] &= bool(ok) and torch.equal(dst.kv_buffer.view(torch.uint8), want)
        t["hf_warm"] = min(t["hf_warm"], best_of(hf_get, 1))
        shutil.rmtree(hf_dir, ignore_errors=True)

    per_round: dict[str, list[float]] = {"kv_put": [], "kv_get": []}

    def keep(name: str, secs: float) -> float:
        per_round[name].append(secs)
        return secs

    def kvtier_v1(r: int) -> None:        # kvtier, v1 path over host indices
        kv = StorageBackendFactory.create_backend("dynamic", conf(extra(r, "v1")), src)
        try:
            kv.register_mem_pool_host(src)
            kv.batch_set_v1(warm, idx[:ps])
            t0 = time.perf_counter()
            ok = all(kv.batch_set_v1(keys, idx))
            t["kv_put"] = min(t["kv_put"], keep("kv_put", time.perf_counter() - t0))
            kv.register_mem_pool_host(dst)      # reopens the store (same directory) on the other pool
            kv.batch_get_v1(warm, idx[:ps])     # untimed: the get path's one-time set-up
            dst.kv_buffer.zero_()
            t["kv_get"] = min(t["kv_get"], keep("kv_get", best_of(lambda: kv.batch_get_v1(keys, idx), 1)))
            exact["kvtier"] &= ok and torch.equal(dst.kv_buffer.view(torch.uint8), want)
            info.update({k: kv.kvtier_stats().get(k) for k in ("io_engine", "direct_io")})
        finally:
            kv.close()
            shutil.rmtree(work / f"kvtier-v1-{r}", ignore_errors=True)

    def kvtier_generic(r: int) -> None:   # kvtier, generic path (flat page tensors): the like-for-like interface
        kv = StorageBackendFactory.create_backend("dynamic", conf(extra(r, "generic")), src)
        try:
            kv.register_mem_pool_host(src)
            kv.batch_set(warm, [src.get_data_page(0)])
            t0 = time.perf_counter()
            ok = kv.batch_set(keys, [src.get_data_page(i * ps) for i in range(n)])
            t["kg_put"] = min(t["kg_put"], time.perf_counter() - t0)
            dst.kv_buffer.zero_()

            def kv_get():
                pages = kv.batch_get(keys, [src.get_dummy_flat_data_page() for _ in keys])
                for i, pg in enumerate(pages):
                    dst.set_from_flat_data_page(i * ps, pg)
            t["kg_get"] = min(t["kg_get"], best_of(kv_get, 1))
            exact["kvtier_generic"] &= bool(ok) and torch.equal(dst.kv_buffer.view(torch.uint8), want)
        finally:
            kv.close()
            shutil.rmtree(work / f"kvtier-generic-{r}", ignore_errors=True)

    def extra(r: int, tag: str) -> dict:
        return {"backend_name": "kvtier", "module_path": "kvtier.engine_adapter.sglang",
                "class_name": "KvtierStorage", "interface_v1": 1, "data_dir": str(work / f"kvtier-{tag}-{r}"),
                "nvme_gb": 2 * total / GB + 0.01}

    legs = [hicachefile, kvtier_v1, kvtier_generic]
    raw = RawDirect(work / "raw.bin", page_bytes, n, queue_depth=args.queue_depth, fresh=True, distinct=True)
    rounds: list[dict] = []

    def raw_leg(r: int) -> None:          # one buffer per page (as kvtier's staging area), read after an os.sync
        raw.measure_write()
        os.sync()
        raw.measure_read()
    try:
        with Progress(transient=True, console=Console(stderr=True)) as prog:
            task = prog.add_task("memcpy", total=1 + args.repeat * (len(legs) + 1))
            scratch = np.empty(total, dtype=np.uint8)
            pages = src.kv_buffer.view(torch.uint8).numpy().reshape(-1)[:total]
            np.copyto(scratch, pages)                      # fault the scratch memory in, untimed
            t_mem = best_of(lambda: np.copyto(scratch, pages), args.repeat)
            scratch = None
            prog.advance(task)
            # every round: the raw write + read (adjacent, as each backend's get follows its put) and
            # each backend (fresh directories), in an order that alternates
            for r in range(args.repeat):
                for leg in ([raw_leg, *legs] if r % 2 == 0 else [*legs[::-1], raw_leg]):
                    prog.update(task, description=f"round {r + 1}: {leg.__name__}")
                    with StageTimers() if args.profile and leg is kvtier_v1 else nullcontext() as prof:
                        leg(r)
                    if prof is not None:
                        out.setdefault("profile", {})[f"round {r + 1}"] = {"stages": prof.report()}
                    prog.advance(task)
                rounds.append({"raw": raw.rounds()[-1], "kvtier": {k: _gbps(total, per_round[k][-1])
                                                                   for k in ("kv_put", "kv_get")}})
        lim = raw.limits()
    finally:
        raw.close()
    g = lambda k: _gbps(total, t[k])  # noqa: E731
    out["limits"] = {"memcpy_gbps": _gbps(total, t_mem), "raw_write_gbps": lim["raw_write_gbps"],
                     "raw_read_gbps": lim["raw_read_gbps"]}
    out["raw_detail"] = {k: v for k, v in lim.items() if k not in out["limits"]}
    out["hicachefile"] = {"put_gbps": g("hf_put"), "put_synced_gbps": g("hf_sync"), "get_cold_gbps": g("hf_cold"),
                          "get_warm_gbps": g("hf_warm"), "durable_put": False, "bit_exact": exact["hicachefile"]}
    out["kvtier"] = {"put_gbps": g("kv_put"), "get_gbps": g("kv_get"), "durable_put": True, **info,
                     "bit_exact": exact["kvtier"]}
    out["kvtier_generic"] = {"put_gbps": g("kg_put"), "get_gbps": g("kg_get"), "bit_exact": exact["kvtier_generic"]}
    shutil.rmtree(work, ignore_errors=True)
    lim, hf_r, kv_r = out["limits"], out["hicachefile"], out["kvtier"]
    out["ratios"] = {
        "kvtier_put_vs_raw_write": kv_r["put_gbps"] / lim["raw_write_gbps"],
        "kvtier_get_vs_raw_read": kv_r["get_gbps"] / lim["raw_read_gbps"],
        "kvtier_put_vs_hicachefile_synced_put": kv_r["put_gbps"] / hf_r["put_synced_gbps"],
        "kvtier_get_vs_hicachefile_cold_get": kv_r["get_gbps"] / hf_r["get_cold_gbps"],
        "kvtier_put_vs_raw_write_qd1": kv_r["put_gbps"] / out["raw_detail"]["raw_write_qd1_gbps"],
        "kvtier_put_vs_raw_write_overwrite": kv_r["put_gbps"] / out["raw_detail"]["raw_write_overwrite_gbps"],
        "kvtier_get_vs_raw_read_qd1": kv_r["get_gbps"] / out["raw_detail"]["raw_read_qd1_gbps"],
    }
    out["rounds"] = rounds
    med = lambda f: statistics.median(f(x) for x in rounds)  # noqa: E731
    out["ratios_paired_median"] = {      # median over rounds of the same-round ratio (the disk's drift cancels)
        "kvtier_put_vs_raw_write": med(lambda x: x["kvtier"]["kv_put"] / x["raw"]["write_gbps"]),
        "kvtier_get_vs_raw_read": med(lambda x: x["kvtier"]["kv_get"] / x["raw"]["read_gbps"])}
    return out


def _print(doc: dict) -> None:
    from rich.console import Console
    from rich.table import Table
    t = Table(title=f"SGLang L3 backends, {doc['pages']} pages x {doc['page_bytes'] / 2**20:.2f} MiB "
                    f"(sglang {doc['sglang_version']})")
    for c in ("backend", "put GB/s", "put durable GB/s", "get GB/s", "bit-exact"):
        t.add_column(c)
    hf, kv, kg, lim = doc["hicachefile"], doc["kvtier"], doc["kvtier_generic"], doc["limits"]
    t.add_row("HiCacheFile", f"{hf['put_gbps']:.2f}", f"{hf['put_synced_gbps']:.2f}",
              f"{hf['get_cold_gbps']:.2f} cold / {hf['get_warm_gbps']:.2f} warm", str(hf["bit_exact"]))
    t.add_row("kvtier (v1)", f"{kv['put_gbps']:.2f}", f"{kv['put_gbps']:.2f}", f"{kv['get_gbps']:.2f} (disk)",
              str(kv["bit_exact"]))
    t.add_row("kvtier (generic)", f"{kg['put_gbps']:.2f}", f"{kg['put_gbps']:.2f}", f"{kg['get_gbps']:.2f} (disk)",
              str(kg["bit_exact"]))
    t.add_row("limits", f"raw O_DIRECT {lim['raw_write_gbps']:.2f} (fresh file)",
              f"overwrite {doc['raw_detail']['raw_write_overwrite_gbps']:.2f}",
              f"raw O_DIRECT {lim['raw_read_gbps']:.2f} / memcpy {lim['memcpy_gbps']:.2f}", "")
    Console().print(t)
    Console().print({k: round(v, 2) for k, v in doc["ratios"].items()})
    Console().print("paired (median over rounds of same-round ratios):",
                    {k: round(v, 2) for k, v in doc["ratios_paired_median"].items()})
    from kvtier.bench.bench_vllm import _print_profile
    _print_profile(doc)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m kvtier.bench.bench_sglang", description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", required=True, help="directory on the disk to test (not tmpfs)")
    p.add_argument("--pages", type=int, default=192)
    p.add_argument("--page-tokens", type=int, default=32)
    p.add_argument("--layers", type=int, default=28)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--repeat", type=int, default=3,
                   help="rounds (fresh directories each); every figure is the best round (default 3)")
    p.add_argument("--queue-depth", type=int, default=16, help="queue depth of the raw QD baseline (default 16)")
    p.add_argument("--profile", action="store_true",
                   help="also time kvtier's v1 stages (gather/scatter copies, put_many, fdatasync, ...) per round")
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    return run_script("bench_sglang", p, run, _print, argv)


if __name__ == "__main__":
    sys.exit(main())
