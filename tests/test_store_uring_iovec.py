"""The io_uring engine keeps no hold on the buffers it reads into and writes from.

The PyPI liburing binding leaks a reference and a buffer export for every
object passed to ``Iovec``; the engine passes it none of ours
(store/uring_iovec.py).  Real rings, real files on the test's filesystem.
"""
from __future__ import annotations

import gc
import mmap
import os

import numpy as np
import pytest

from kvtier.store.io import IoOp, io_uring_unavailable_reason, make_engine


def _liburing():
    why = io_uring_unavailable_reason()
    if why is not None:
        pytest.skip(f"io_uring unusable here: {why}")
    import liburing
    return liburing


def _memoryviews() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is memoryview)


def test_buffer_address_is_the_first_byte_of_every_kind_of_buffer():
    from kvtier.store.uring_iovec import buffer_address
    arr = np.arange(64, dtype=np.uint8)
    ba = bytearray(b"abcdef")
    b = bytes(range(9))
    assert buffer_address(arr) == arr.ctypes.data
    assert buffer_address(memoryview(arr)[8:16]) == arr.ctypes.data + 8
    assert buffer_address(memoryview(arr)[8:16].toreadonly()) == arr.ctypes.data + 8
    assert buffer_address(ba) == np.frombuffer(ba, np.uint8).ctypes.data
    assert buffer_address(b) == np.frombuffer(b, np.uint8).ctypes.data
    ba.extend(b"g")          # no export is left behind: the bytearray can still grow
    with pytest.raises(TypeError):
        buffer_address(12)


def test_pooled_iovecs_describe_each_ops_buffers_and_are_reused():
    L = _liburing()
    from kvtier.store.uring_iovec import IovecPool, _Iov, _fields, layout_problem
    assert layout_problem(L) is None
    pool = IovecPool(L)
    a, c = np.zeros(4096, np.uint8), np.zeros(8192, np.uint8)
    iov = pool.take((memoryview(a), memoryview(c)[4096:]))
    n, arr = _fields(iov)
    assert n.value == 2
    assert [(e.base, e.len) for e in (_Iov * 2).from_address(arr)] == [(a.ctypes.data, 4096),
                                                                      (c.ctypes.data + 4096, 4096)]
    pool.give(iov)
    again = pool.take((memoryview(c), memoryview(a)[:512]))
    assert again is iov                       # same capacity class: the idle one comes back
    assert [(e.base, e.len) for e in (_Iov * 2).from_address(_fields(again)[1])] == [(c.ctypes.data, 8192),
                                                                                    (a.ctypes.data, 512)]
    three = pool.take((memoryview(a),) * 3)   # a larger class (4 entries), 3 of them used
    assert three is not iov and _fields(three)[0].value == 3
    with pytest.raises(ValueError):
        pool.take(())


def test_reads_and_writes_through_a_ring_leak_no_memoryview_and_free_the_buffer(tmp_path):
    _liburing()
    eng = make_engine("io_uring", 8)
    path = tmp_path / "f"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    buf = mmap.mmap(-1, 64 * 4096)
    try:
        src = np.frombuffer(buf, np.uint8)
        src[:] = np.arange(src.size) % 251
        del src
        before = _memoryviews()
        for rnd in range(20):
            ops = [IoOp(rnd % 2 == 0, fd, i * 8192, (memoryview(buf)[i * 8192:i * 8192 + 4096],
                                                     memoryview(buf)[i * 8192 + 4096:(i + 1) * 8192]))
                   for i in range(32)]
            eng.start(ops).wait()
            del ops
        assert _memoryviews() == before       # the binding alone kept 1-2 per op alive
        assert np.array_equal(np.fromfile(path, np.uint8), np.arange(64 * 4096) % 251)
    finally:
        eng.close()
        os.close(fd)
    buf.close()                               # raised BufferError while exports leaked
