"""Iovecs for the io_uring engine that keep no hold on the caller's buffers.

The PyPI ``liburing`` binding (2026.3.30) takes the buffer of every object
passed to ``Iovec([...])`` and never gives it back: a memoryview gains a
reference and an export that outlive the Iovec, a bytearray an export.  One
I/O op therefore leaked one memoryview, and with it a pin on the buffer it
views, for the life of the process (an engine process runs millions of ops),
and an mmap whose slice went through a ring could never be closed
(``BufferError: cannot close exported pointers exist``).

So the engine never hands the binding a caller's buffer.  :class:`IovecPool`
builds each Iovec once, over dummy ``bytes`` (which the binding reads without
a leak), and rewrites its C ``struct iovec`` array in place with the
addresses and lengths of an op's buffers; the Iovec goes back to the pool when
the op completes.  The op's buffers are kept alive meanwhile by the batch,
which holds the op.  Writing into the binding's object needs its memory
layout, a 16-byte object header then ``(usize len, iovec *array)``:
:func:`layout_problem` checks it on a real Iovec before the engine is used,
and io_uring is declined (threads instead) if it does not hold.
"""
from __future__ import annotations

import ctypes
import sys
from typing import Sequence

_HEAD = 2 * ctypes.sizeof(ctypes.c_void_p)          # ob_refcnt, ob_type
_BYTES_DATA = sys.getsizeof(b"") - 1                 # offset of a bytes object's first byte


class _Iov(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def _fields(iov: object) -> tuple[ctypes.c_size_t, int]:
    """The Iovec's length field (writable) and the address of its iovec array."""
    at = id(iov) + _HEAD
    return ctypes.c_size_t.from_address(at), ctypes.c_void_p.from_address(at + ctypes.sizeof(ctypes.c_size_t)).value


def buffer_address(buf) -> int:
    """Address of ``buf``'s first byte, taking no lasting hold on it.  Raises TypeError for an
    object without the buffer protocol or a non-contiguous buffer."""
    if isinstance(buf, bytes):
        return id(buf) + _BYTES_DATA
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(buf))
    except TypeError:              # read-only: numpy reads any contiguous buffer, and lets it go
        import numpy as np
        return np.frombuffer(buf, np.uint8).ctypes.data


def layout_problem(L) -> str | None:
    """None if ``L.Iovec`` has the layout :class:`IovecPool` writes into, else what differs.
    Checks a real Iovec over two known bytes objects.  Pure (creates and frees one Iovec)."""
    a, b = bytes(range(7)), bytes(range(13))
    try:
        iov = L.Iovec([a, b])
        if type(iov).__basicsize__ < _HEAD + 2 * ctypes.sizeof(ctypes.c_void_p):
            return f"Iovec objects are {type(iov).__basicsize__} bytes, too small for (len, array)"
        n, arr = _fields(iov)
        if n.value != 2 or not arr:
            return f"Iovec's length field reads {n.value}, not 2"
        got = [(e.base, e.len) for e in (_Iov * 2).from_address(arr)]
    except Exception as exc:       # the binding changed shape: decline it
        return f"Iovec layout check failed: {exc}"
    want = [(id(a) + _BYTES_DATA, 7), (id(b) + _BYTES_DATA, 13)]
    if got != want:
        return f"Iovec's iovec array reads {got}, expected {want}"
    return None


class IovecPool:
    """Reusable Iovecs, one pool per ring (so per thread: not thread-safe).

    :meth:`take` an Iovec for an op's buffers; :meth:`give` it back once the
    kernel has completed the op.  Only valid after :func:`layout_problem`
    returned None for the same binding."""

    def __init__(self, L) -> None:
        self._L = L
        self._free: dict[int, list] = {}           # capacity -> idle Iovecs
        self._cap: dict[int, int] = {}             # id(Iovec) -> its capacity
        self._dummy = b"\0"

    def take(self, bufs: Sequence) -> object:
        """An Iovec describing ``bufs`` in order.  Raises ValueError on no buffers."""
        n = len(bufs)
        if n == 0:
            raise ValueError("an I/O op needs at least one buffer")
        cap = 1 << (n - 1).bit_length()
        free = self._free.get(cap)
        if free:
            iov = free.pop()
        else:
            iov = self._L.Iovec([self._dummy] * cap)
            self._cap[id(iov)] = cap
        length, arr = _fields(iov)
        entries = (_Iov * n).from_address(arr)
        for e, b in zip(entries, bufs):
            nb = memoryview(b).nbytes if not isinstance(b, memoryview) else b.nbytes
            e.base = buffer_address(b) if nb else None
            e.len = nb
        length.value = n
        return iov

    def give(self, iov) -> None:
        """Return an Iovec from :meth:`take` whose op has completed."""
        self._free.setdefault(self._cap[id(iov)], []).append(iov)
