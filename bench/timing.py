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
    overwrite of that file is timed too (``raw_write_overwrite_gbps``).  The
    QD1 and the QD write each have their own file, so each read that follows
    (``measure_read``) is the first read of that file since its last write --
    as a backend's load is the first read of what it stored.

    ``distinct=True``: one buffer per I/O (``n * io_bytes`` of memory), as an
    engine's rows or pages are, instead of ``queue_depth`` buffers recycled;
    on this VM's virtio disk writing from a small recycled set measured up to
    1.1-1.2x faster than writing the same bytes from their own memory.
    Not thread-safe; ``close()`` removes the files."""

    def __init__(self, path: Path, io_bytes: int, n: int, queue_depth: int = 16, engine: str = "auto",
                 fresh: bool = False, distinct: bool = False) -> None:
        from kvtier.store.io import make_engine
        self.io_bytes, self.n, self.path, self.fresh = io_bytes, n, Path(path), fresh
        nbuf = n if distinct else min(n, queue_depth)
        self._buf = mmap.mmap(-1, io_bytes * nbuf)
        for off in range(0, len(self._buf), 64 << 20):
            self._buf[off:off + (64 << 20)] = os.urandom(min(64 << 20, len(self._buf) - off))
        self._views = [memoryview(self._buf)[i * io_bytes:(i + 1) * io_bytes] for i in range(nbuf)]
        self._own_views = self._views
        self._recycled = False                # did a measurement move fewer buffers than I/Os?
        self._paths = [self.path] + ([self.path.with_name(self.path.name + ".qd")] if fresh else [])
        self._fds = [-1] * len(self._paths)
        for i in range(len(self._paths)):
            self._new_file(i)
        self._engine = make_engine(engine, queue_depth)
        self.t = {"write_qd1": float("inf"), "write_qd": float("inf"),
                  "read_qd1": float("inf"), "read_qd": float("inf"), "write_over": float("inf")}
        self._rounds: list[dict] = []
        self._round: dict = {}

    def use_buffers(self, views=None) -> None:
        """Write from / read into ``views`` (``n`` buffers of ``io_bytes``: e.g. an
        engine's own rows, the memory its tiers move) instead of this object's
        memory; ``None`` goes back to its own.  Drop them (``None``) before their
        owner unmaps them.  Raises ValueError on a wrong count or size."""
        if views is None:
            self._views = self._own_views
            return
        views = [memoryview(v).cast("B") for v in views]
        if len(views) != self.n or any(v.nbytes != self.io_bytes for v in views):
            raise ValueError(f"need {self.n} buffers of {self.io_bytes} bytes")
        self._views = views

    @property
    def _fd(self) -> int:
        return self._fds[0]

    def _new_file(self, i: int = 0) -> None:
        if self._fds[i] >= 0:
            os.close(self._fds[i])
            self._paths[i].unlink(missing_ok=True)
        self._fds[i] = os.open(self._paths[i], os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o644)
        os.posix_fallocate(self._fds[i], 0, self.io_bytes * self.n)

    def _ops(self, write: bool, fd: int):
        from kvtier.store.io import IoOp
        return [IoOp(write, fd, i * self.io_bytes, (self._views[i % len(self._views)],)) for i in range(self.n)]

    def _write_qd1(self, f: int = 0) -> None:
        fd = self._fds[f]
        for i in range(self.n):
            os.pwritev(fd, [self._views[i % len(self._views)]], i * self.io_bytes)
        os.fdatasync(fd)

    def _read_qd1(self, f: int = 0) -> None:
        fd = self._fds[f]
        for i in range(self.n):
            os.preadv(fd, [self._views[i % len(self._views)]], i * self.io_bytes)

    def _write_qd(self, f: int = 0) -> None:
        self._engine.run(self._ops(True, self._fds[f]))
        os.fdatasync(self._fds[f])

    def _read_qd(self, f: int = 0) -> None:
        self._engine.run(self._ops(False, self._fds[f]))

    def measure_write(self) -> None:
        """One QD1 and one QD write round (``fresh``: each into a new file of its
        own, then one overwrite of each at its depth); keeps the best of each so far."""
        self._recycled |= len(self._views) < self.n
        self._round = {}
        self._rounds.append(self._round)
        if not self.fresh:
            self._keep("write_qd1", timed(self._write_qd1))
            self._keep("write_qd", timed(self._write_qd))
            return
        q = 1                                   # the QD file
        self._new_file(0)
        self._keep("write_qd1", timed(lambda: self._write_qd1(0)))
        self._new_file(q)
        self._keep("write_qd", timed(lambda: self._write_qd(q)))
        self._keep("write_over", timed(lambda: self._write_qd1(0)), timed(lambda: self._write_qd(q)))

    def measure_read(self) -> None:
        """One QD1 and one QD read round (the files must have been written; ``fresh``:
        each file read once, at the depth it was written at); keeps the best."""
        self._recycled |= len(self._views) < self.n
        q = 1 if self.fresh else 0
        self._keep("read_qd1", timed(lambda: self._read_qd1(0)))
        self._keep("read_qd", timed(lambda: self._read_qd(q)))

    def _keep(self, name: str, *secs: float) -> None:
        t = min(secs)
        self.t[name] = min(self.t[name], t)
        self._round[name] = t

    def rounds(self) -> list[dict]:
        """Per ``measure_write`` round: ``write_gbps``/``read_gbps`` (the better of
        QD1 and QD in that round) and the QD figures alone (``*_qd_gbps``: one
        measurement, as a backend gets one per round), to pair with the backends
        of the same round; ``fresh``: also ``write_overwrite_gbps``, the better
        overwrite of the two files just written -- a flushed write into written
        extents, the most a durable store into prepared slots can reach)."""
        nb = self.io_bytes * self.n / 1e9
        out = []
        for r in self._rounds:
            w = [r[k] for k in ("write_qd1", "write_qd") if k in r]
            rd = [r[k] for k in ("read_qd1", "read_qd") if k in r]
            out.append({"write_gbps": nb / min(w) if w else None, "read_gbps": nb / min(rd) if rd else None,
                        "write_qd_gbps": nb / r["write_qd"] if "write_qd" in r else None,
                        "read_qd_gbps": nb / r["read_qd"] if "read_qd" in r else None,
                        **({"write_overwrite_gbps": nb / r["write_over"]} if "write_over" in r else {})})
        return out

    def limits(self) -> dict:
        """GB/s: ``raw_write_gbps``/``raw_read_gbps`` (the better of QD1 and QD) and each one."""
        nb = self.io_bytes * self.n
        g = {k: nb / v / 1e9 if 0 < v < float("inf") else None for k, v in self.t.items()}
        best = lambda a, b: max(x for x in (a, b) if x is not None) if (a or b) else None  # noqa: E731
        return {"raw_write_gbps": best(g["write_qd1"], g["write_qd"]), "raw_read_gbps": best(g["read_qd1"], g["read_qd"]),
                "raw_write_qd1_gbps": g["write_qd1"], "raw_read_qd1_gbps": g["read_qd1"],
                "raw_write_qd_gbps": g["write_qd"], "raw_read_qd_gbps": g["read_qd"], "raw_io_bytes": self.io_bytes,
                "raw_distinct_buffers": not self._recycled,
                **({"raw_write_fresh_file": True, "raw_write_overwrite_gbps": g["write_over"]} if self.fresh else {})}

    def close(self) -> None:
        self._engine.close()
        for fd, p in zip(self._fds, self._paths):
            if fd >= 0:
                os.close(fd)
            p.unlink(missing_ok=True)
        self._fds = [-1] * len(self._paths)
        self._views = self._own_views = []
        self._buf.close()


# (module, class or None, attribute, label): the stages of kvtier's engine data paths.  A name
# that no longer exists (the code moved) is skipped, so the profile degrades, never breaks.
KVTIER_STAGES = (
    ("kvtier.store.tiered", "TieredStore", "put_many", "store.put_many"),
    ("kvtier.store.tiered", "TieredStore", "get_many", "store.get_many"),
    ("kvtier.store.tiered", "TieredStore", "get_many_served", "store.get_many_served (inside get_many too)"),
    ("kvtier.store.blockio", "BlockIO", "write_slots", "store.write_direct (I/O + checksums + fdatasync)"),
    ("kvtier.store.blockio", "BlockIO", "_write_bounced", "store.write_bounced (copy + I/O + fdatasync)"),
    ("kvtier.store.blockio", "BlockIO", "read_verified", "store.read_verified (I/O + checksums)"),
    ("kvtier.store.nvme", "NvmeTier", "sync", "store.fdatasync"),
    ("kvtier.store.indexing", "IndexKeeper", "commit", "store.index_commit (LMDB)"),
    ("kvtier.engine_adapter.sglang_pages", "PageIO", "read_page", "sglang.gather (pool -> staging copy)"),
    ("kvtier.engine_adapter.sglang_pages", "PageIO", "write_page", "sglang.scatter (staging -> pool copy)"),
    ("kvtier.engine_adapter.sglang_pages", "Staging", "__init__", "sglang.staging_alloc (MAP_POPULATE)"),
    ("kvtier.engine_adapter.vllm_io", None, "store_rows", "vllm.store_job (one put_many)"),
    ("kvtier.engine_adapter.vllm_io", None, "load_rows", "vllm.load_job (one get_many_served)"),
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
