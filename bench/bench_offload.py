"""Offload path benchmark: staged (D2H into staging frames, then ``put_many``) vs two-phase
(``prepare_store`` -> gather straight into the store's buffers -> ``complete_store``).

    .venv/bin/python -m kvtier.bench.bench_offload --data-dir DIR [--blocks 64] [--repeat 5] [--json]

A transformers-layout cache (``[1, heads, seq, head_dim]`` per layer, CPU tensors here, the
device on a GPU) is offloaded block by block into a real TieredStore, host tier and NVMe tier,
both paths interleaved in every repeat (best of ``--repeat``), beside the memcpy of the same
bytes measured in the same run.  Fresh keys per repeat; the blocks are dropped afterwards.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time


def measure(data_dir: str, *, blocks: int = 64, repeat: int = 5, layers: int = 8, kv_heads: int = 8,
            head_dim: int = 128, block_tokens: int = 16) -> dict:
    import torch

    from kvtier.dma.layouts import FrameFormat, HFLayout
    from kvtier.dma.movers import DeviceToHostMover, DeviceToStoreMover, HostToStoreMover
    from kvtier.dma.spec import DeviceBlocks, HostFrames, StoreBlocks, TransferSpec
    from kvtier.dma.staging import FramePool
    from kvtier.store.config import StoreConfig
    from kvtier.store.tiered import TieredStore

    fmt = FrameFormat(layers=layers, block_tokens=block_tokens, kv_heads=kv_heads, head_dim=head_dim,
                      dtype=torch.float16)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    seq = blocks * block_tokens
    g = torch.Generator().manual_seed(0)
    ks = [torch.randn(1, kv_heads, seq, head_dim, generator=g).to(dev, torch.float16) for _ in range(layers)]
    vs = [torch.randn(1, kv_heads, seq, head_dim, generator=g).to(dev, torch.float16) for _ in range(layers)]
    layout = HFLayout(ks, vs, fmt)
    nbytes = blocks * fmt.frame_bytes
    src = torch.empty(nbytes, dtype=torch.uint8)
    dst = torch.empty(nbytes, dtype=torch.uint8)
    src.fill_(1)
    cfg = StoreConfig(root=data_dir, host_bytes=2 * blocks * fmt.frame_bytes, nvme_bytes=2 * blocks * fmt.frame_bytes,
                      block_bytes=fmt.frame_bytes)
    best: dict[str, float] = {}
    job = iter(range(1, 1 << 40))
    with TieredStore.open(cfg) as store:
        pool = FramePool(fmt, blocks)
        d2h, put, d2s = DeviceToHostMover(pool), HostToStoreMover(pool, store), DeviceToStoreMover(pool, store)
        for m in (d2h, d2s):
            m.register_layout("c", layout)
        ids = tuple(range(blocks))
        try:
            for r in range(repeat):
                t0 = time.perf_counter()
                dst.copy_(src)
                best["memcpy"] = min(best.get("memcpy", 1e9), time.perf_counter() - t0)
                for tier in ("host", "nvme"):
                    for path in ("staged", "two_phase"):
                        keys = [os.urandom(16) for _ in ids]
                        t0 = time.perf_counter()
                        if path == "staged":
                            frames = pool.alloc(blocks)
                            a = d2h.transfer_async(next(job), TransferSpec(DeviceBlocks("c", ids), HostFrames(frames))).result()
                            b = put.transfer_async(next(job), TransferSpec(HostFrames(frames), StoreBlocks(keys, tier=tier))).result()
                            pool.free(frames)
                            ok = a.ok and b.ok and b.nbytes == nbytes
                        else:
                            c = d2s.transfer_async(next(job), TransferSpec(DeviceBlocks("c", ids), StoreBlocks(keys, tier=tier))).result()
                            ok = c.ok and c.nbytes == nbytes
                        dt = time.perf_counter() - t0
                        if not ok:
                            raise RuntimeError(f"{path} offload to {tier} failed")
                        name = f"{tier}_{path}"
                        best[name] = min(best.get(name, 1e9), dt)
                        store.drop(keys)
        finally:
            for m in (d2h, put, d2s):
                m.close()
        io_engine, direct = store.stats().io_engine, store.stats().direct_io
    gbps = {k: nbytes / v / 1e9 for k, v in best.items()}
    return {"device": dev, "frame_bytes": fmt.frame_bytes, "blocks": blocks, "bytes": nbytes, "repeat": repeat,
            "io_engine": io_engine, "direct_io": direct,
            "memcpy_gbps": gbps["memcpy"],
            "host": {"staged_gbps": gbps["host_staged"], "two_phase_gbps": gbps["host_two_phase"],
                     "two_phase_vs_staged": gbps["host_two_phase"] / gbps["host_staged"]},
            "nvme": {"staged_gbps": gbps["nvme_staged"], "two_phase_gbps": gbps["nvme_two_phase"],
                     "two_phase_vs_staged": gbps["nvme_two_phase"] / gbps["nvme_staged"]}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", default=None, help="store directory on the disk to test (default: a temp dir)")
    ap.add_argument("--blocks", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if a.blocks < 1 or a.repeat < 1:
        print("--blocks and --repeat must be >= 1", file=sys.stderr)
        return 2
    tmp = None
    root = a.data_dir
    if root is None:
        tmp = root = tempfile.mkdtemp(prefix="kvtier-offload-")
    else:
        root = os.path.join(root, "bench-offload")
    try:
        doc = measure(root, blocks=a.blocks, repeat=a.repeat)
    finally:
        shutil.rmtree(tmp or root, ignore_errors=True)
    if a.json:
        print(json.dumps(doc))
        return 0
    from rich.console import Console
    from rich.table import Table
    t = Table(title=f"offload of {doc['blocks']} x {doc['frame_bytes'] // 1024} KiB blocks ({doc['device']}), "
                    f"best of {doc['repeat']}; memcpy {doc['memcpy_gbps']:.2f} GB/s")
    for c in ("tier", "staged GB/s", "two-phase GB/s", "two-phase / staged", "two-phase / memcpy"):
        t.add_column(c, justify="right" if c != "tier" else "left")
    for tier in ("host", "nvme"):
        r = doc[tier]
        t.add_row(tier, f"{r['staged_gbps']:.2f}", f"{r['two_phase_gbps']:.2f}", f"{r['two_phase_vs_staged']:.2f}x",
                  f"{r['two_phase_gbps'] / doc['memcpy_gbps']:.2f}x")
    Console().print(t)
    return 0


if __name__ == "__main__":
    sys.exit(main())
