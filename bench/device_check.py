"""Device check: run when a GPU is lent (``python -m kvtier.bench.device_check``).

1. Runs the CUDA-marked tests and the dma/hf tests on the device.
2. Measures scattered-block D2H and H2D through kvtier's movers (vLLM layout,
   blocks picked at random from a large pool, both copy strategies, then the
   calibrated one) against a plain pinned ``cudaMemcpyAsync`` of the same
   bytes (one contiguous device buffer <-> one pinned buffer) measured in the
   same run, and prints the ratio (target >= 0.9).

Without CUDA it runs the CPU parts (the same movers on CPU tensors, so the
ratios are against a CPU memcpy) and exits 0 saying "no CUDA".
Output: a table on stderr, one JSON document on stdout.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time


def _bench(cuda: bool, *, blocks: int = 512, pool_blocks: int = 4096, repeats: int = 5) -> dict:
    import torch

    from kvtier.dma.layouts import FrameFormat, VllmLayout
    from kvtier.dma.movers import DeviceToHostMover, HostToDeviceMover
    from kvtier.dma.spec import DeviceBlocks, HostFrames, TransferSpec
    from kvtier.dma.staging import FramePool

    dev = "cuda" if cuda else "cpu"
    # a Llama-8B-like layer slice: 16-token blocks, 8 kv heads x 128, bf16, 8 layers -> 512 KiB frames
    fmt = FrameFormat(layers=8, block_tokens=16, kv_heads=8, head_dim=128,
                      dtype=torch.bfloat16 if cuda else torch.float32)
    if not cuda:
        blocks, pool_blocks = 64, 256
    lay = VllmLayout.allocate(fmt, pool_blocks, device=dev)
    for t in lay.tensors:
        t.normal_()
    g = torch.Generator().manual_seed(0)
    ids = torch.randperm(pool_blocks, generator=g)[:blocks].tolist()
    pool = FramePool(fmt, blocks)
    frames = pool.alloc(blocks)
    nbytes = blocks * fmt.frame_bytes

    def sync():
        if cuda:
            torch.cuda.synchronize()

    # baseline: one contiguous buffer <-> one pinned buffer of the same bytes
    dbuf = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    hbuf = torch.empty(nbytes, dtype=torch.uint8, pin_memory=cuda)
    stream = torch.cuda.Stream() if cuda else None

    def raw(direction: str) -> float:
        best = float("inf")
        for _ in range(repeats):
            sync()
            t0 = time.perf_counter()
            if cuda:
                with torch.cuda.stream(stream):
                    (hbuf.copy_(dbuf, non_blocking=True) if direction == "d2h" else dbuf.copy_(hbuf, non_blocking=True))
                stream.synchronize()
            else:
                hbuf.copy_(dbuf) if direction == "d2h" else dbuf.copy_(hbuf)
            best = min(best, time.perf_counter() - t0)
        return nbytes / best / 1e9

    out: dict = {"device": torch.cuda.get_device_name() if cuda else "cpu", "blocks": blocks,
                 "frame_bytes": fmt.frame_bytes, "bytes": nbytes,
                 "raw_d2h_gbps": raw("d2h"), "raw_h2d_gbps": raw("h2d")}
    with DeviceToHostMover(pool) as d2h, HostToDeviceMover(pool) as h2d:
        d2h.register_layout("v", lay)
        h2d.register_layout("v", lay)
        for name, mover, spec in (
                ("d2h", d2h, TransferSpec(DeviceBlocks("v", ids), HostFrames(frames))),
                ("h2d", h2d, TransferSpec(HostFrames(frames), DeviceBlocks("v", ids), layer_groups=4))):
            for strategy in ("batched", "per_block"):
                mover.strategy = strategy
                best = float("inf")
                for r in range(repeats):
                    sync()
                    t0 = time.perf_counter()
                    res = mover.transfer_async(1000 + r, spec).result()
                    best = min(best, time.perf_counter() - t0)
                    assert res.ok, res.error
                out[f"{name}_{strategy}_gbps"] = nbytes / best / 1e9
            out[f"{name}_ratio"] = max(out[f"{name}_batched_gbps"], out[f"{name}_per_block_gbps"]) / out[f"raw_{name}_gbps"]
            mover.calibrate("v", ids, frames, repeats=2)
            out[f"{name}_kept"] = mover.strategy
    # correctness on the device: a reload into other blocks equals the original
    sample = torch.empty((4, *fmt.shape), dtype=fmt.dtype, device=dev)
    lay.gather(ids[:4], sample)
    out["roundtrip_ok"] = bool(torch.equal(sample.cpu(), pool.frames[list(frames[:4])]))
    return out


def main() -> int:
    import torch
    from rich.console import Console
    from rich.table import Table

    err = Console(stderr=True)
    cuda = torch.cuda.is_available()
    doc: dict = {"cuda": cuda}
    if not cuda:
        err.print("no CUDA: running the CPU parts only (movers on CPU tensors vs a CPU memcpy)")
    else:
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "cuda or not cuda",
                            "tests/test_dma.py", "tests/test_hf.py", "tests/test_hf_leases.py", "-x",
                            "-p", "no:cacheprovider"],
                           capture_output=True, text=True)
        doc["tests_rc"] = r.returncode
        doc["tests_tail"] = r.stdout.strip().splitlines()[-1:] if r.stdout else []
        err.print(f"tests on the device: rc={r.returncode} {doc['tests_tail']}")
    doc["bench"] = b = _bench(cuda)
    t = Table(title=f"scattered blocks ({b['blocks']} x {b['frame_bytes'] // 1024} KiB) vs one plain "
                    f"{'pinned cudaMemcpyAsync' if cuda else 'memcpy'} of the same bytes ({b['device']})")
    for c in ("direction", "raw GB/s", "batched GB/s", "per-block GB/s", "best / raw", "kept"):
        t.add_column(c)
    for d in ("d2h", "h2d"):
        t.add_row(d, f"{b[f'raw_{d}_gbps']:.2f}", f"{b[f'{d}_batched_gbps']:.2f}", f"{b[f'{d}_per_block_gbps']:.2f}",
                  f"{b[f'{d}_ratio']:.2f}", str(b[f"{d}_kept"]))
    err.print(t)
    # the two offload paths (staged vs two-phase into the store's buffers), same run
    import tempfile

    from kvtier.bench.bench_offload import measure
    try:
        with tempfile.TemporaryDirectory(prefix="kvtier-devcheck-") as d:
            doc["offload"] = o = measure(d, blocks=64, repeat=3)
        err.print(f"offload two-phase / staged: host {o['host']['two_phase_vs_staged']:.2f}x, "
                  f"NVMe {o['nvme']['two_phase_vs_staged']:.2f}x ({o['device']})")
    except Exception as exc:  # reported, not fatal: the mover tests above carry the verdict
        doc["offload"] = {"error": f"{type(exc).__name__}: {exc}"}
        err.print(f"offload bench failed: {doc['offload']['error']}")
    print(json.dumps(doc, indent=2))
    if not cuda:
        err.print("no CUDA")
        return 0
    return 0 if doc.get("tests_rc") == 0 and b["roundtrip_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
