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

Other replies (``reply``): ``+OK``, ``:1``, ``-ERR ...`` (an error object, in
place), ``$len`` (a small bulk string), nil.  ``-NOAUTH``, ``-WRONGPASS``
and ``-NOPERM`` raise ``AuthReply``: the credentials, not the value, are wrong.

Deadline: every ``send``/``recv`` is given what is left of one
:class:`Deadline` as its timeout, so a server that trickles bytes, stalls
mid-value or answers half a reply is cut when the whole call's time is up,
not after each quiet gap.

Raises ``OSError`` (incl. ``socket.timeout``) or ``ProtocolError``; the caller
then discards the connection.  Not thread-safe: one reader per connection
for the duration of one batch.
"""
from __future__ import annotations

import socket
import time
from typing import Sequence

from .backend import MISSING

AUTH_ERRORS = (b"NOAUTH", b"WRONGPASS", b"NOPERM")
MAX_SMALL_BULK = 1 << 20          # a non-GET bulk reply larger than this is not one of ours


class ProtocolError(OSError):
    """The server sent something that is not the expected reply."""


class AuthReply(OSError):
    """The server refused the command for the credentials (NOAUTH, WRONGPASS, NOPERM)."""


class ReplyError:
    """An error reply to one command of a pipeline (``-ERR ...``), kept in place."""

    __slots__ = ("message",)

    def __init__(self, message: bytes) -> None:
        self.message = message

    def __repr__(self) -> str:
        return f"ReplyError({self.message[:60]!r})"


class Deadline:
    """One call's overall time budget: ``left()`` seconds remain (raises
    ``socket.timeout`` once none do)."""

    __slots__ = ("due", "seconds")

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.due = time.monotonic() + seconds

    def left(self) -> float:
        left = self.due - time.monotonic()
        if left <= 0:
            raise socket.timeout(f"call took longer than its {self.seconds:g} s deadline")
        return left

    def sendall(self, sock: socket.socket, parts) -> None:
        """Send every part within the deadline (a part may be any buffer)."""
        for part in parts:
            if len(part):
                sock.settimeout(self.left())
                sock.sendall(part)


class _NoDeadline:
    def left(self) -> float | None:
        return None


class BulkReader:
    def __init__(self, sock: socket.socket, chunk: int = 64 << 10, deadline: Deadline | None = None) -> None:
        self.sock = sock
        self.deadline = deadline or _NoDeadline()
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
        self.sock.settimeout(self.deadline.left())
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
            self.sock.settimeout(self.deadline.left())
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
                try:
                    n = int(ln[1:])
                except ValueError:
                    raise ProtocolError(f"malformed bulk length {ln[:40]!r}") from None
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
            elif kind == b"-":
                _raise_if_auth(ln)
                out.append(MISSING)
            elif kind == b"_":
                out.append(MISSING)
            else:
                raise ProtocolError(f"unexpected reply type {kind!r} to GET")
        return out

    def reply(self):
        """One non-GET reply: bytes (``+``, ``$``), int (``:``), ``ReplyError``
        (``-``), None (nil).  Raises ``AuthReply``, ``ProtocolError``."""
        ln = self.line()
        kind, rest = ln[:1], ln[1:]
        try:
            if kind == b"+":
                return rest
            if kind == b":":
                return int(rest)
            if kind == b"-":
                _raise_if_auth(ln)
                return ReplyError(rest)
            if kind == b"_":
                return None
            if kind == b"$":
                n = int(rest)
                if n < 0:
                    return None
                if n > MAX_SMALL_BULK:
                    raise ProtocolError(f"bulk reply of {n} bytes where a short one was expected")
                out = bytearray(n + 2)
                self.read_into(memoryview(out))
                return bytes(out[:n])
        except ValueError:
            raise ProtocolError(f"malformed reply line {ln[:40]!r}") from None
        raise ProtocolError(f"unexpected reply type {kind!r}")


def _raise_if_auth(line: bytes) -> None:
    if line[1:].split(b" ", 1)[0] in AUTH_ERRORS:
        raise AuthReply(line[1:].split(b" ", 1)[0].decode())
