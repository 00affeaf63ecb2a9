"""Reading pipelined RESP ``GET`` replies straight into the caller's buffers.

redis-py (with hiredis) turns every bulk reply into a new ``bytes`` object,
which the tier would then copy into the block's buffer: two copies and a
fresh allocation (page faults) per block.  This reader takes the replies off
the connection's socket itself and ``recv_into``-s a value's header and
payload directly into ``heads[i]`` / ``bodies[i]``, so a get moves each byte
once, from the kernel into the host frame.

Reply handling (RESP2/RESP3 alike for GET)::

    $<len>\\r\\n<len bytes>\\r\\n   a value: read into the buffers if len fits, else skipped
    $-1\\r\\n / _\\r\\n             nil: MISSING
    -ERR ...\\r\\n                 an error reply (MOVED, LOADING, ...): MISSING

Raises ``OSError`` (incl. ``socket.timeout``) or ``ProtocolError``; the caller
then discards the connection.  Not thread-safe: one reader per connection
for the duration of one batch.
"""
from __future__ import annotations

import socket
from typing import Sequence

from .backend import MISSING


class ProtocolError(OSError):
    """The server sent something that is not a GET reply."""


class BulkReader:
    def __init__(self, sock: socket.socket, chunk: int = 64 << 10) -> None:
        self.sock = sock
        self.buf = bytearray(chunk)
        self.view = memoryview(self.buf)
        self.lo = self.hi = 0            # unread bytes are buf[lo:hi]

    def _fill(self) -> None:
        if self.lo == self.hi:
            self.lo = self.hi = 0
        elif self.hi == len(self.buf):   # move the unread tail to the front
            n = self.hi - self.lo
            self.buf[:n] = self.buf[self.lo:self.hi]
            self.lo, self.hi = 0, n
        got = self.sock.recv_into(self.view[self.hi:])
        if not got:
            raise ConnectionResetError("connection closed by the server")
        self.hi += got

    def line(self) -> bytes:
        while True:
            i = self.buf.find(b"\r\n", self.lo, self.hi)
            if i >= 0:
                out = bytes(self.buf[self.lo:i])
                self.lo = i + 2
                return out
            if self.hi - self.lo >= len(self.buf) - 2:
                raise ProtocolError("reply line too long")
            self._fill()

    def read_into(self, mv: memoryview) -> None:
        """Exactly ``mv.nbytes`` bytes: the buffered ones, then straight from the socket."""
        n = mv.nbytes
        have = min(n, self.hi - self.lo)
        if have:
            mv[:have] = self.view[self.lo:self.lo + have]
            self.lo += have
        pos = have
        while pos < n:
            got = self.sock.recv_into(mv[pos:])
            if not got:
                raise ConnectionResetError("connection closed by the server")
            pos += got

    def skip(self, n: int) -> None:
        while n:
            if self.lo == self.hi:
                self._fill()
            take = min(n, self.hi - self.lo)
            self.lo += take
            n -= take

    def get_replies(self, heads: Sequence[memoryview], bodies: Sequence[memoryview],
                    done=None) -> list[int]:
        """One reply per (head, body): the value's length or ``MISSING``;
        ``done(j, length)`` right after value j was read into its buffers."""
        out = []
        for j, (h, b) in enumerate(zip(heads, bodies)):
            ln = self.line()
            kind = ln[:1]
            if kind == b"$":
                n = int(ln[1:])
                if n < 0:
                    out.append(MISSING)
                    continue
                fits = n == h.nbytes + b.nbytes
                if fits:
                    self.read_into(h)
                    self.read_into(b)
                else:
                    self.skip(n)
                self.skip(2)             # the value's trailing \r\n
                out.append(n)
                if fits and done is not None:
                    done(j, n)
            elif kind in (b"-", b"_"):
                out.append(MISSING)
            else:
                raise ProtocolError(f"unexpected reply type {kind!r} to GET")
        return out
