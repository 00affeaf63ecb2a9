"""A slower NVMe device, emulated: an I/O engine whose batches take at least
their bytes over a set rate.

Benchmarks ask how a policy does on a disk slower than the one at hand (a
shared or network-attached volume, a busy device).  :class:`ThrottledEngine`
wraps the store's real engine (the I/O still happens, O_DIRECT and all) and
models one device of ``bytes_per_s``: each batch reserves the device for
``nbytes / bytes_per_s`` seconds after every earlier batch's reservation, and
its ``wait`` returns no earlier than the reservation's end.  Batches of
several threads queue behind one another as on a real device.  The real
device's own time overlaps the reservation, so the effective rate is the
lower of the two.

Set by ``StoreConfig.nvme_throttle_gbps`` (``KVTIER_NVME_THROTTLE_GBPS``);
off (None) by default.

Threading: ``start`` and ``wait`` from any threads (one lock around the
device's reservation clock).
"""
from __future__ import annotations

import threading
import time
from typing import Callable, Iterable, Sequence

from .io import IoBatch, IoEngine, IoOp, make_engine


class _ThrottledBatch(IoBatch):
    def __init__(self, inner: IoBatch, ends_at: float) -> None:
        self._inner, self._ends_at = inner, ends_at

    def wait(self, on_done: Callable[[int], None] | None = None,
             work: Iterable[Callable[[], None]] = ()) -> None:
        try:
            self._inner.wait(on_done, work)
        finally:
            left = self._ends_at - time.monotonic()
            if left > 0:
                time.sleep(left)


class ThrottledEngine(IoEngine):
    """``inner`` as a device of ``bytes_per_s`` (module doc).

    Raises ValueError for a rate that is not a positive finite number."""

    def __init__(self, inner: IoEngine, bytes_per_s: float) -> None:
        if not (isinstance(bytes_per_s, (int, float)) and 0 < bytes_per_s < float("inf")):
            raise ValueError(f"a throttle needs a positive rate, got {bytes_per_s!r}")
        self.inner, self.bytes_per_s = inner, float(bytes_per_s)
        self.name = f"{inner.name}, throttled to {bytes_per_s / 1e9:g} GB/s"
        self._lock = threading.Lock()
        self._free_at = 0.0

    def start(self, ops: Sequence[IoOp]) -> IoBatch:
        took = sum(op.nbytes for op in ops) / self.bytes_per_s
        with self._lock:
            begin = max(time.monotonic(), self._free_at)
            self._free_at = end = begin + took
        return _ThrottledBatch(self.inner.start(ops), end)

    def close(self) -> None:
        self.inner.close()


def store_engine(cfg) -> IoEngine:
    """The I/O engine of a store with ``cfg`` (a StoreConfig): its named engine,
    throttled when ``cfg.nvme_throttle_gbps`` is set.  Raises as :func:`~.io.make_engine`."""
    engine = make_engine(cfg.io_engine, cfg.queue_depth)
    if cfg.nvme_throttle_gbps is None:
        return engine
    return ThrottledEngine(engine, cfg.nvme_throttle_gbps * 1e9)
