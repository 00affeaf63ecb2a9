"""LMCache's storage backends on given bytes: run INSIDE the peer's own environment.

    <peer-env>/bin/python lmcache_driver.py < request.json > result.json

This file imports nothing from kvtier (the peer environment does not have it):
the host side (:mod:`kvtier.bench.peers.lmcache`) writes the source bytes to a
file, sends a request document on stdin and reads one result document from
stdout.  Progress lines (``progress: ...``) and LMCache's own log go to stderr.

Request::

    {"src": PATH, "src_sha256": HEX, "sizes": [BYTES...], "total_bytes": N,
     "repeat": R, "warmup": W, "data_dir": DIR, "remote_url": "redis://h:p" | null}

Per block size every backend moves ``total_bytes`` of the source file, block by
block, the way LMCache's ``StorageManager`` does for an engine: ``allocate`` a
``MemoryObj`` from the ``LocalCPUBackend`` allocator, copy the block in,
``batched_submit_put_task`` with a per-key completion callback, drop the
caller's reference; gets are ``batched_get_blocking`` and a copy out into the
caller's buffer.  A put is timed until every completion callback fired; on the
disk backends a second figure adds one ``os.sync()`` (LMCache never fsyncs).
``W`` untimed rounds come first, then the best of ``R`` timed rounds, fresh keys
every round.  Every round checks every block that came back against the source
(a miss or a wrong byte is an error, never a fast row).

Rows: ``cpu`` (hot cache: copy in, copy out), ``disk`` with buffered I/O (get
``warm``: just written, in the page cache; ``cold``: after ``os.sync`` and
``POSIX_FADV_DONTNEED`` on its files), ``disk_odirect`` (``use_odirect``: reads
are cold by construction), ``redis`` (``RemoteBackend`` over ``remote_url``
with LMCache's ``redis://`` connector, redis-py asyncio) and ``redis_resp``
(the same server through its native ``resp://`` client, LMCache's fast path).
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sys
import threading
import time

CHUNK_TOKENS = 256
TIMEOUT_S = float(os.environ.get("KVTIER_PEER_TIMEOUT_S", "120"))


def _progress(text: str) -> None:
    print(f"progress: {text}", file=sys.stderr, flush=True)


class _Peer:
    """One LMCache backend of one kind plus the CPU allocator it stages through.

    Thread ownership: the caller's thread runs every method; LMCache's own
    event-loop thread and disk/redis workers fire the completion callbacks."""

    def __init__(self, kind: str, block_bytes: int, total: int, rounds: int, disk_dir: str, remote_url) -> None:
        import torch
        from lmcache.v1.config import LMCacheEngineConfig
        from lmcache.v1.metadata import LMCacheMetadata
        from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
        self.kind, self.torch, self.remote_url = kind, torch, remote_url
        gib = 1 << 30
        extra = {"use_odirect": kind == "disk_odirect"}
        cfg = LMCacheEngineConfig.from_defaults(
            chunk_size=CHUNK_TOKENS, local_cpu=kind == "cpu",
            max_local_cpu_size=(2 * total + 4 * block_bytes) / gib,
            local_disk=disk_dir if kind.startswith("disk") else None,
            # remove() does not give bytes back to the disk budget (LMCache 0.5.6), so it covers every round
            max_local_disk_size=((rounds + 1) * total + 4 * block_bytes) / gib,
            remote_url=remote_url if kind.startswith("redis") else None, remote_serde="naive", extra_config=extra)
        md = LMCacheMetadata(model_name="kvtier-bench", world_size=1, local_world_size=1, worker_id=0,
                             local_worker_id=0, kv_dtype=torch.uint8,
                             kv_shape=(1, 2, CHUNK_TOKENS, 1, max(1, block_bytes // (2 * CHUNK_TOKENS))))
        self.cpu = LocalCPUBackend(cfg, md, dst_device="cpu")
        self.loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(target=self.loop.run_forever, name="lmcache-loop", daemon=True)
        self._loop_thread.start()
        if kind == "cpu":
            self.backend = self.cpu
        elif kind.startswith("disk"):
            from lmcache.v1.storage_backend.local_disk_backend import LocalDiskBackend
            self.backend = LocalDiskBackend(cfg, self.loop, self.cpu, dst_device="cpu", metadata=md)
        else:
            from lmcache.v1.storage_backend.remote_backend import RemoteBackend
            self.backend = RemoteBackend(cfg, md, self.loop, self.cpu, dst_device="cpu")
        self.shape = torch.Size([block_bytes])

    def keys(self, tag: int, n: int) -> list:
        from lmcache.utils import CacheEngineKey
        return [CacheEngineKey("kvtier-bench", 1, 0, tag * 10_000_000 + i, self.torch.uint8) for i in range(n)]

    def put(self, keys, blocks) -> None:
        """Copy each block into a fresh MemoryObj, submit all, wait for every callback."""
        from lmcache.v1.memory_management import MemoryFormat
        done, lock, left = threading.Event(), threading.Lock(), [len(keys)]

        def on_complete(_key) -> None:
            with lock:
                left[0] -= 1
                if left[0] == 0:
                    done.set()
        objs = []
        for b in blocks:
            mo = self.cpu.allocate(self.shape, self.torch.uint8, MemoryFormat.KV_2LTD)
            if mo is None:
                raise RuntimeError("LMCache's CPU allocator returned no memory")
            mo.tensor.copy_(b)
            objs.append(mo)
        self.backend.batched_submit_put_task(keys, objs, on_complete_callback=on_complete)
        for mo in objs:               # the caller's reference (StorageManager.batched_put does the same)
            mo.ref_count_down()
        if not done.wait(TIMEOUT_S):
            raise RuntimeError(f"{self.kind}: {left[0]} of {len(keys)} put callbacks never fired")

    def get(self, keys, outs) -> int:
        """``batched_get_blocking`` and a copy out; returns how many blocks came back."""
        objs = self.backend.batched_get_blocking(keys)
        got = 0
        for mo, out in zip(objs, outs):
            if mo is not None:
                out.copy_(mo.tensor.view(-1)[:out.numel()])
                mo.ref_count_down()
                got += 1
        return got

    def remove(self, keys) -> None:
        if self.kind.startswith("redis"):   # its connectors have no remove: delete the two entries it writes per key
            import redis
            with redis.Redis.from_url(self.remote_url.replace("resp://", "redis://", 1)) as r:
                # redis:// writes NAME+"metadata" and NAME+"kv_bytes"; resp:// writes NAME
                names = [k.to_string() + part for k in keys for part in ("", "metadata", "kv_bytes")]
                for lo in range(0, len(names), 512):
                    r.delete(*names[lo:lo + 512])
            return
        for k in keys:
            self.backend.remove(k)

    def files(self) -> list[str]:
        root = getattr(self.backend, "path", None)
        return [os.path.join(root, f) for f in os.listdir(root)] if root else []

    def close(self) -> None:
        # RemoteBackend.close() deadlocks in 0.5.6 (its connector's close waits, on the
        # event loop, for a job of that same loop): the redis backend is left to process exit
        if self.backend is not self.cpu and not self.kind.startswith("redis"):
            self.backend.close()
        self.cpu.close()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._loop_thread.join(10)


def _drop_page_cache(paths) -> None:
    os.sync()
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _check(kind, got, n, outs, blocks) -> None:
    if got != n:
        raise RuntimeError(f"{kind}: {n - got} of {n} blocks did not come back")
    import torch
    bad = sum(not torch.equal(o, b) for o, b in zip(outs, blocks))
    if bad:
        raise RuntimeError(f"{kind}: {bad} of {n} blocks came back with wrong bytes")


def _measure(kind: str, size: int, req: dict, src) -> list[dict]:
    """Warm-up rounds, then the best of ``repeat`` rounds of put (+sync) and get(s)."""
    import torch
    n = req["total_bytes"] // size
    blocks = [src[i * size:(i + 1) * size] for i in range(n)]
    outs = [torch.empty(size, dtype=torch.uint8) for _ in range(n)]
    disk_dir = os.path.join(req["data_dir"], f"{kind}-{size}")
    rounds = req["warmup"] + req["repeat"]
    url = req.get("remote_url")
    if kind == "redis_resp":          # the same server through LMCache's native RESP client
        url = "resp://" + url.split("://", 1)[1]
    peer = _Peer(kind, size, n * size, rounds, disk_dir, url)
    t = {"put": float("inf"), "sync": float("inf"), "warm": float("inf"), "cold": float("inf")}
    try:
        for r in range(rounds):
            timed = r >= req["warmup"]
            keys = peer.keys(r + 1, n)
            for o in outs:
                o.zero_()
            t0 = time.perf_counter()
            peer.put(keys, blocks)
            t1 = time.perf_counter()
            if kind.startswith("disk"):
                os.sync()
            t2 = time.perf_counter()
            if kind == "disk":            # buffered: the just-written files are in the page cache
                t3 = time.perf_counter()
                got = peer.get(keys, outs)
                t4 = time.perf_counter()
                _check(kind, got, n, outs, blocks)
                if timed:
                    t["warm"] = min(t["warm"], t4 - t3)
                _drop_page_cache(peer.files())
                for o in outs:
                    o.zero_()
                slot = "cold"
            else:
                slot = "cold" if kind == "disk_odirect" else "warm"
            t3 = time.perf_counter()
            got = peer.get(keys, outs)
            t4 = time.perf_counter()
            _check(kind, got, n, outs, blocks)
            if timed:
                t["put"], t["sync"] = min(t["put"], t1 - t0), min(t["sync"], t2 - t0)
                t[slot] = min(t[slot], t4 - t3)
            if r == rounds - 1:           # the host re-checks what came back against its own bytes
                h = hashlib.sha256()
                for o in outs:
                    h.update(o.numpy().tobytes())
                digest = h.hexdigest()
            peer.remove(keys)             # untimed: frees the allocator / the disk budget
    finally:
        peer.close()
    nb = n * size
    g = lambda s: nb / s / 1e9 if s < float("inf") else None  # noqa: E731
    base = {"block_bytes": size, "bytes": nb, "put_gbps": g(t["put"])}
    if kind.startswith("disk"):
        base["put_synced_gbps"] = g(t["sync"])
    rows = []
    for read in ("warm", "cold"):
        if t[read] < float("inf"):
            rows.append({"backend": kind, "read": read, **base, "get_gbps": g(t[read]), "bit_exact": True,
                         "read_sha256": digest})
    return rows


def main() -> int:
    req = json.load(sys.stdin)
    import lmcache
    import torch
    with open(req["src"], "rb") as f:
        raw = f.read()
    if hashlib.sha256(raw).hexdigest() != req["src_sha256"]:
        raise RuntimeError("the source bytes file does not match its checksum")
    src = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    kinds = ["cpu", "disk", "disk_odirect"] + (["redis", "redis_resp"] if req.get("remote_url") else [])
    rows = []
    for kind in kinds:
        for size in req["sizes"]:
            _progress(f"{kind} {size // 1024} KiB")
            rows.extend(_measure(kind, size, req, src))
    version = getattr(lmcache, "__version__", None)
    json.dump({"lmcache_version": version, "torch_version": torch.__version__, "rows": rows}, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
