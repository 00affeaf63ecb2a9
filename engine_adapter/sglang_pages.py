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

    def rows(self, j: int, k: int) -> np.ndarray:
        """Slots ``j .. j+k-1`` as one ``(k, page_bytes)`` uint8 array (a view)."""
        base = np.frombuffer(self._mm, dtype=np.uint8, count=self.n * self.slot)
        return base.reshape(self.n, self.slot)[j:j + k, :self.page_bytes]


def _shaped(a: np.ndarray, shape: tuple) -> np.ndarray:
    """``a`` viewed as ``shape`` -- never a copy (setting ``.shape`` raises if
    it would need one), so a copy into the result lands in ``a``."""
    v = a.view()
    v.shape = shape
    return v


def round4k(n: int) -> int:
    return -(-n // 4096) * 4096


class PageIO:
    """Copies pages between SGLang's host pool and a store buffer.

    Uses ``get_data_page(i, flat=False)`` when it is a view into the pool
    (MHA/MLA pools slice their buffer): bytes move with one strided numpy copy
    (contiguous runs coalesce to memcpy).  Otherwise falls back to the pool's
    flat-page methods (one extra copy).

    Runs of pages (:meth:`read_pages` / :meth:`write_pages`): when the pool's
    page views are *linear* in the token index (same shape and strides for
    every page, the start moving by a constant number of bytes per token --
    checked at construction on three pages), a run of pages whose indices
    step by exactly ``page_size`` is one strided view of the pool, so the run
    moves with one numpy copy instead of one view and one copy per page (in
    a resume of 1,900 pages the per-page views and copies were most of the
    engine-side time).  Anything else goes page by page."""

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
        self._linear = self._probe_linear()

    def _probe_linear(self) -> tuple[int, tuple, tuple, int] | None:
        """(token stride bytes, page shape, page strides, page-0 address) if the
        pool's page views are linear in the token index (see the class doc)."""
        size = int(getattr(self.pool, "size", 0) or 0)
        if size < 3 * self.page_size:
            return None
        try:
            views = [self._view(i * self.page_size) for i in range(3)]
        except Exception:   # a pool whose get_data_page rejects an index: page by page
            return None
        if any(v is None for v in views):
            return None
        a0, a1, a2 = (v.__array_interface__["data"][0] for v in views)
        if len({(v.shape, v.strides) for v in views}) != 1 or a1 - a0 != a2 - a1 or a1 <= a0:
            return None
        if any(s <= 0 for s in views[0].strides):
            return None
        step = a1 - a0
        if step % self.page_size:
            return None
        return step // self.page_size, views[0].shape, views[0].strides, a0

    def _run(self, index: int, k: int) -> np.ndarray | None:
        """Pages at token indices ``index, index+page_size, ...`` (``k`` of them)
        as one ``(k, *page shape)`` uint8 view of the pool, or None (not linear,
        or the run would leave the pool's buffer)."""
        lin = self._linear
        if lin is None or index < 0:
            return None
        tok, shape, strides, a0 = lin
        start = a0 + index * tok
        ext = sum((n - 1) * s for n, s in zip(shape, strides) if s > 0)
        if start < self._lo or start + (k - 1) * self.page_size * tok + ext >= self._hi:
            return None
        v = self._view(index)
        if v is None or v.__array_interface__["data"][0] != start:
            return None
        return np.lib.stride_tricks.as_strided(v, shape=(k, *shape), strides=(self.page_size * tok, *strides),
                                               writeable=True)

    def _runs(self, idx: list[int]):
        """``(a, b)`` spans of ``idx`` whose indices step by exactly ``page_size``."""
        a, n, ps = 0, len(idx), self.page_size
        while a < n:
            b = a + 1
            while b < n and idx[b] == idx[b - 1] + ps:
                b += 1
            yield a, b
            a = b

    def write_pages(self, idx: list[int], stg: "Staging", j0: int = 0) -> None:
        """Staging slots ``j0, j0+1, ...`` -> pool pages at token indices ``idx``
        (``len(idx)`` pages), a run of contiguous pages per numpy copy."""
        for a, b in self._runs(idx):
            run = self._run(idx[a], b - a)
            if run is None:
                for j in range(a, b):
                    self.write_page(idx[j], stg.view(j0 + j))
            else:
                np.copyto(run, _shaped(stg.rows(j0 + a, b - a), run.shape))

    def read_pages(self, idx: list[int], stg: "Staging", j0: int = 0) -> None:
        """Pool pages at token indices ``idx`` -> staging slots ``j0, j0+1, ...``."""
        for a, b in self._runs(idx):
            run = self._run(idx[a], b - a)
            if run is None:
                for j in range(a, b):
                    self.read_page(idx[j], stg.view(j0 + j))
            else:
                np.copyto(_shaped(stg.rows(j0 + a, b - a), run.shape), run)

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
