"""Timing helpers shared by the benchmarks: best-of timing and the raw O_DIRECT baseline."""
from __future__ import annotations

import mmap
import os
import time
from pathlib import Path
from typing import Callable


def best_of(fn: Callable[[], object], repeat: int) -> float:
    """Shortest wall time in seconds of ``repeat`` calls of ``fn()`` (the least disturbed run)."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def timed(fn: Callable[[], object]) -> float:
    """Wall time in seconds of one call of ``fn()``."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


class RawDirect:
    """Plain sequential O_DIRECT on a preallocated file: the disk's limit for ``n``
    I/Os of ``io_bytes``, one at a time (``pwritev``/``preadv``, QD1) and at
    ``queue_depth`` through the store's own I/O engine (what kvtier's NVMe tier
    issues).  Writes end with one ``fdatasync``, like a durable put.

    The engine benchmarks measure it inside every repeat, interleaved with the
    backends, so machine noise hits baseline and backends alike; the baseline
    is the better of QD1 and QD (the same rule as ``kvtier bench tiers``).
    Not thread-safe; ``close()`` removes the file."""

    def __init__(self, path: Path, io_bytes: int, n: int, queue_depth: int = 16, engine: str = "auto") -> None:
        from kvtier.store.io import make_engine
        self.io_bytes, self.n, self.path = io_bytes, n, Path(path)
        self._buf = mmap.mmap(-1, io_bytes * min(n, queue_depth))
        self._buf.write(os.urandom(len(self._buf)))
        self._views = [memoryview(self._buf)[i * io_bytes:(i + 1) * io_bytes] for i in range(min(n, queue_depth))]
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o644)
        os.posix_fallocate(self._fd, 0, io_bytes * n)
        self._engine = make_engine(engine, queue_depth)
        self.t = {"write_qd1": float("inf"), "write_qd": float("inf"),
                  "read_qd1": float("inf"), "read_qd": float("inf")}

    def _ops(self, write: bool):
        from kvtier.store.io import IoOp
        return [IoOp(write, self._fd, i * self.io_bytes, (self._views[i % len(self._views)],)) for i in range(self.n)]

    def _write_qd1(self) -> None:
        for i in range(self.n):
            os.pwritev(self._fd, [self._views[i % len(self._views)]], i * self.io_bytes)
        os.fdatasync(self._fd)

    def _read_qd1(self) -> None:
        for i in range(self.n):
            os.preadv(self._fd, [self._views[i % len(self._views)]], i * self.io_bytes)

    def _write_qd(self) -> None:
        self._engine.run(self._ops(True))
        os.fdatasync(self._fd)

    def _read_qd(self) -> None:
        self._engine.run(self._ops(False))

    def measure_write(self) -> None:
        """One QD1 and one QD write round; keeps the best of each so far."""
        self.t["write_qd1"] = min(self.t["write_qd1"], timed(self._write_qd1))
        self.t["write_qd"] = min(self.t["write_qd"], timed(self._write_qd))

    def measure_read(self) -> None:
        """One QD1 and one QD read round (the file must have been written); keeps the best."""
        self.t["read_qd1"] = min(self.t["read_qd1"], timed(self._read_qd1))
        self.t["read_qd"] = min(self.t["read_qd"], timed(self._read_qd))

    def limits(self) -> dict:
        """GB/s: ``raw_write_gbps``/``raw_read_gbps`` (the better of QD1 and QD) and each one."""
        nb = self.io_bytes * self.n
        g = {k: nb / v / 1e9 if 0 < v < float("inf") else None for k, v in self.t.items()}
        best = lambda a, b: max(x for x in (a, b) if x is not None) if (a or b) else None  # noqa: E731
        return {"raw_write_gbps": best(g["write_qd1"], g["write_qd"]), "raw_read_gbps": best(g["read_qd1"], g["read_qd"]),
                "raw_write_qd1_gbps": g["write_qd1"], "raw_read_qd1_gbps": g["read_qd1"],
                "raw_write_qd_gbps": g["write_qd"], "raw_read_qd_gbps": g["read_qd"], "raw_io_bytes": self.io_bytes}

    def close(self) -> None:
        self._engine.close()
        os.close(self._fd)
        self.path.unlink(missing_ok=True)
        self._views = []
        self._buf.close()
