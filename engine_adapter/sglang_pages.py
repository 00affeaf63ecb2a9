"""The SGLang backend's page I/O path: host-pool pages <-> store buffers.

Kept apart from the backend's bookkeeping (``sglang.py``) so the data path can
be read, benchmarked (``bench/bench_sglang.py``) and changed on its own.
"""
from __future__ import annotations

import mmap
import threading
from typing import Any

import numpy as np


class Staging:
    """A reusable, pre-faulted, 4096-aligned area of page slots.

    Fresh memory costs a page fault per 4 KiB on first touch (measured here:
    copies into fresh memory ran at 0.6 GB/s, into warm memory at 4-6 GB/s),
    so pages are gathered into this area, which lives as long as the backend.
    ``lock`` is held by the one thread using it (SGLang's backup and prefetch
    threads each get their own area)."""

    MAX_BYTES = 256 << 20   # one put_many (one fdatasync) per SGLang batch of <= 128 pages up to 2 MiB each

    @staticmethod
    def max_pages(page_bytes: int) -> int:
        return max(1, Staging.MAX_BYTES // round4k(page_bytes))

    def __init__(self, page_bytes: int, n: int) -> None:
        self.page_bytes, self.slot, self.n = page_bytes, round4k(page_bytes), n
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)
        self._mm = mmap.mmap(-1, self.n * self.slot, flags=flags)
        self._mv = memoryview(self._mm)
        self.lock = threading.Lock()

    def view(self, j: int) -> memoryview:
        return self._mv[j * self.slot: j * self.slot + self.page_bytes]


def round4k(n: int) -> int:
    return -(-n // 4096) * 4096


class PageIO:
    """Copies one page between SGLang's host pool and a store buffer.

    Uses ``get_data_page(i, flat=False)`` when it is a view into the pool
    (MHA/MLA pools slice their buffer): bytes move with one strided numpy copy
    (contiguous runs coalesce to memcpy).  Otherwise falls back to the pool's
    flat-page methods (one extra copy)."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.page_size = int(pool.page_size)
        flat = pool.get_dummy_flat_data_page()
        self.page_bytes = int(flat.numel() * flat.element_size())
        self.dtype = flat.dtype
        buf = getattr(pool, "kv_buffer", None)
        self._lo = self._hi = 0
        if buf is not None and hasattr(buf, "untyped_storage"):
            st = buf.untyped_storage()
            self._lo, self._hi = st.data_ptr(), st.data_ptr() + st.nbytes()

    def _view(self, index: int) -> np.ndarray | None:
        t = self.pool.get_data_page(index, flat=False)
        nbytes = t.numel() * t.element_size()
        if nbytes != self.page_bytes or not (self._lo <= t.data_ptr() < self._hi):
            return None
        try:
            return t.view(torch_uint8()).numpy()
        except (RuntimeError, TypeError):
            return None

    def read_page(self, index: int, dst: memoryview) -> None:
        """Pool page at token index ``index`` -> ``dst`` (writable, page_bytes)."""
        out = np.frombuffer(dst, dtype=np.uint8)
        v = self._view(index)
        if v is not None:
            np.copyto(out.reshape(v.shape), v)
        else:
            flat = self.pool.get_data_page(index, flat=True).contiguous()
            np.copyto(out, flat.view(torch_uint8()).numpy())

    def write_page(self, index: int, src: memoryview) -> None:
        """``src`` (page_bytes) -> pool page at token index ``index``."""
        inp = np.frombuffer(src, dtype=np.uint8)
        v = self._view(index)
        if v is not None:
            np.copyto(v, inp.reshape(v.shape))
        else:
            import torch
            t = torch.empty(self.page_bytes, dtype=torch.uint8)
            t.numpy()[:] = inp
            self.pool.set_from_flat_data_page(index, t.view(self.dtype))


def torch_uint8():
    import torch
    return torch.uint8


def tensor_bytes(t: Any) -> np.ndarray | None:
    """A flat uint8 numpy view of a CPU tensor (None if it is not one)."""
    try:
        if t is None or t.device.type != "cpu" or not t.is_contiguous():
            return None
        return t.view(-1).view(torch_uint8()).numpy()
    except (AttributeError, RuntimeError, TypeError):
        return None
