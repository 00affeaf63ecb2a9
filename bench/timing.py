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

    ``fresh=True``: every timed write goes to a newly created, preallocated
    file (created untimed), as a first write into a fresh store directory
    does: on ext4 that write pays the conversion of unwritten extents (and
    its ``fdatasync`` the journal commit), which an overwrite does not.  The
    overwrite of that file is timed too (``raw_write_overwrite_gbps``).
    Not thread-safe; ``close()`` removes the file."""

    def __init__(self, path: Path, io_bytes: int, n: int, queue_depth: int = 16, engine: str = "auto",
                 fresh: bool = False) -> None:
        from kvtier.store.io import make_engine
        self.io_bytes, self.n, self.path, self.fresh = io_bytes, n, Path(path), fresh
        self._buf = mmap.mmap(-1, io_bytes * min(n, queue_depth))
        self._buf.write(os.urandom(len(self._buf)))
        self._views = [memoryview(self._buf)[i * io_bytes:(i + 1) * io_bytes] for i in range(min(n, queue_depth))]
        self._fd = -1
        self._new_file()
        self._engine = make_engine(engine, queue_depth)
        self.t = {"write_qd1": float("inf"), "write_qd": float("inf"),
                  "read_qd1": float("inf"), "read_qd": float("inf"), "write_over": float("inf")}

    def _new_file(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self.path.unlink(missing_ok=True)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o644)
        os.posix_fallocate(self._fd, 0, self.io_bytes * self.n)

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
        """One QD1 and one QD write round (``fresh``: each into a new file, then
        one overwrite at each depth); keeps the best of each so far."""
        if not self.fresh:
            self.t["write_qd1"] = min(self.t["write_qd1"], timed(self._write_qd1))
            self.t["write_qd"] = min(self.t["write_qd"], timed(self._write_qd))
            return
        self._new_file()
        self.t["write_qd1"] = min(self.t["write_qd1"], timed(self._write_qd1))
        self._new_file()
        self.t["write_qd"] = min(self.t["write_qd"], timed(self._write_qd))
        self.t["write_over"] = min(self.t["write_over"], timed(self._write_qd1), timed(self._write_qd))

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
                "raw_write_qd_gbps": g["write_qd"], "raw_read_qd_gbps": g["read_qd"], "raw_io_bytes": self.io_bytes,
                **({"raw_write_fresh_file": True, "raw_write_overwrite_gbps": g["write_over"]} if self.fresh else {})}

    def close(self) -> None:
        self._engine.close()
        os.close(self._fd)
        self.path.unlink(missing_ok=True)
        self._views = []
        self._buf.close()


# (module, class or None, attribute, label): the stages of kvtier's engine data paths.  A name
# that no longer exists (the code moved) is skipped, so the profile degrades, never breaks.
KVTIER_STAGES = (
    ("kvtier.store.tiered", "TieredStore", "put_many", "store.put_many"),
    ("kvtier.store.tiered", "TieredStore", "get_many", "store.get_many"),
    ("kvtier.store.blockio", "BlockIO", "_write_slots", "store.write_direct (I/O + checksums + fdatasync)"),
    ("kvtier.store.blockio", "BlockIO", "_write_bounced", "store.write_bounced (copy + I/O + fdatasync)"),
    ("kvtier.store.blockio", "BlockIO", "_read_verified", "store.read_verified (I/O + checksums)"),
    ("kvtier.store.nvme", "NvmeTier", "sync", "store.fdatasync"),
    ("kvtier.store.indexing", "IndexKeeper", "_commit", "store.index_commit (LMDB)"),
    ("kvtier.engine_adapter.sglang_pages", "PageIO", "read_page", "sglang.gather (pool -> staging copy)"),
    ("kvtier.engine_adapter.sglang_pages", "PageIO", "write_page", "sglang.scatter (staging -> pool copy)"),
    ("kvtier.engine_adapter.sglang_pages", "Staging", "__init__", "sglang.staging_alloc (MAP_POPULATE)"),
    ("kvtier.engine_adapter.vllm_io", None, "store_rows", "vllm.store_job (one put_many)"),
    ("kvtier.engine_adapter.vllm_io", None, "load_rows", "vllm.load_job (one get_many)"),
)


class StageTimers:
    """Wall time and calls per stage of the code under measurement, from any thread.

    A context manager that wraps the named functions for its duration (this
    process only; restored on exit), so a benchmark can show where the time of
    a path goes without a sampling profiler.  ``report()`` gives, per label:
    ``s`` (summed wall time; concurrent calls add up), ``calls`` and ``span_s``
    (first start to last end: the stage's wall-clock footprint).  Thread-safe."""

    def __init__(self, stages=KVTIER_STAGES) -> None:
        import threading
        self._stages, self._lock = stages, threading.Lock()
        self._acc: dict[str, list[float]] = {}
        self._saved: list[tuple[object, str, object]] = []

    def _wrap(self, fn, label: str):
        import functools

        @functools.wraps(fn)
        def timed_call(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                t1 = time.perf_counter()
                with self._lock:
                    acc = self._acc.setdefault(label, [0.0, 0, t0, t1])
                    acc[0] += t1 - t0
                    acc[1] += 1
                    acc[2], acc[3] = min(acc[2], t0), max(acc[3], t1)
        return timed_call

    def __enter__(self) -> "StageTimers":
        import importlib
        import sys
        for mod_name, cls_name, attr, label in self._stages:
            try:
                mod = importlib.import_module(mod_name)
            except ImportError:
                continue
            owner = getattr(mod, cls_name, None) if cls_name else mod
            fn = getattr(owner, attr, None) if owner is not None else None
            if fn is None:
                continue
            self._saved.append((owner, attr, fn))
            setattr(owner, attr, self._wrap(fn, label))
            if cls_name is None:      # a module function may also have been imported by name elsewhere
                for name, m in list(sys.modules.items()):
                    if m is not mod and name.startswith("kvtier.") and getattr(m, attr, None) is fn:
                        self._saved.append((m, attr, fn))
                        setattr(m, attr, getattr(owner, attr))
        return self

    def __exit__(self, *exc) -> None:
        for owner, attr, fn in reversed(self._saved):
            setattr(owner, attr, fn)
        self._saved.clear()

    def reset(self) -> None:
        with self._lock:
            self._acc.clear()

    def report(self) -> dict:
        with self._lock:
            return {k: {"s": round(v[0], 4), "calls": v[1], "span_s": round(v[3] - v[2], 4)}
                    for k, v in self._acc.items()}
