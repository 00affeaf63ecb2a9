"""A TCP proxy on 127.0.0.1 in front of the soak's redis-server that can make it trickle.

::

    kvtier (engine) ──> 127.0.0.1:proxy.port ──> 127.0.0.1:target_port (redis-server)
                        one selector thread, both directions of every connection

* **Normal mode**: bytes go both ways as fast as the sockets take them.
* **Trickle mode** (:meth:`TrickleProxy.trickle`): bytes from the server to the client leave in
  pieces of at most ``chunk`` bytes, one piece per ``gap_s`` seconds per connection (by default
  512 B every 0.1 s: a 64 KiB value takes about 13 s, far past kvtier's remote deadline of
  1.5 s, while a PING's reply still passes at once); with ``upstream`` the client's bytes to
  the server too.  A switch applies at once to every open connection.
* **One upstream connection per client connection**, made when the client connects: a
  redis-server restarted on ``target_port`` is found by the next client connection.  When the
  server side closes, resets or refuses the connection, the client side is closed (bytes still
  buffered toward the client are dropped, as a killed server's would be); when the client
  closes, the server side is closed.
* **Bounded**: at most ``max_connections`` open pairs (a client past that is accepted and closed
  at once, counted in ``refused``); at most ``buffer_bytes`` waiting in each direction of a
  pair (a full buffer stops reading from its source, so TCP pushes back).

Threading: :meth:`start` starts one daemon thread, ``kvtier-trickle-<port>``, that owns every
socket, buffer and pacing time; the lock guards the counters and the mode (``_trickle``,
``_upstream``), which any thread may set through :meth:`trickle`.  :meth:`close` (any thread,
idempotent) stops that thread, joins it and closes every socket.
"""
from __future__ import annotations

import contextlib
import errno
import selectors
import socket
import threading
import time
from dataclasses import dataclass

HOST = "127.0.0.1"
READ_BYTES = 64 << 10


@dataclass(frozen=True)
class ProxyStats:
    """A snapshot of the proxy's counters (since :meth:`TrickleProxy.start`)."""
    trickling: bool             # the mode now
    upstream: bool              # client->server trickles too
    connections: int            # client connections accepted and paired
    open: int                   # pairs open now
    refused: int                # clients closed at once: ``max_connections`` pairs were open
    upstream_failures: int      # pairs closed because the server refused or dropped its side
    bytes_up: int               # client -> server, forwarded
    bytes_down: int             # server -> client, forwarded
    trickled_up: int            # of bytes_up, sent while trickling upstream
    trickled_down: int          # of bytes_down, sent while trickling
    buffered_max: int           # most bytes ever waiting in one direction of one pair
    failed: str | None          # the exception that ended the proxy's thread, if one did


class _Side:
    """One direction of a pair: bytes read from ``src`` waiting to go to ``dst``, and the
    earliest time the next trickled piece may leave.  Owned by the proxy's thread."""

    __slots__ = ("src", "dst", "buf", "next_at")

    def __init__(self, src: socket.socket, dst: socket.socket) -> None:
        self.src, self.dst = src, dst
        self.buf = bytearray()
        self.next_at = 0.0


class _Pair:
    """A client connection and its server connection.  Owned by the proxy's thread."""

    __slots__ = ("client", "server", "up", "down", "connecting", "masks")

    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.client, self.server = client, server
        self.up, self.down = _Side(client, server), _Side(server, client)
        self.connecting = True
        self.masks: dict[socket.socket, int] = {client: 0, server: 0}


class TrickleProxy:
    """See the module doc.  ``target_port``: the server's port on 127.0.0.1.  ``port``: where
    to listen (0: a free port, known after :meth:`start`).

    Raises:
        ValueError: ``chunk`` < 1, ``gap_s`` <= 0, ``max_connections`` < 1 or
            ``buffer_bytes`` < ``chunk``.
    """

    def __init__(self, target_port: int, *, port: int = 0, chunk: int = 512, gap_s: float = 0.1,
                 max_connections: int = 64, buffer_bytes: int = 256 << 10) -> None:
        if chunk < 1 or gap_s <= 0 or max_connections < 1 or buffer_bytes < chunk:
            raise ValueError(f"a trickle proxy needs chunk >= 1, gap_s > 0, max_connections >= 1 and "
                             f"buffer_bytes >= chunk, got chunk={chunk}, gap_s={gap_s}, "
                             f"max_connections={max_connections}, buffer_bytes={buffer_bytes}")
        self.target_port, self.port = target_port, port
        self.chunk, self.gap_s = chunk, gap_s
        self.max_connections, self.buffer_bytes = max_connections, buffer_bytes
        self._lock = threading.Lock()
        self._trickle = self._upstream = False
        self._c = dict(connections=0, refused=0, upstream_failures=0, bytes_up=0, bytes_down=0,
                       trickled_up=0, trickled_down=0, buffered_max=0)
        self._open = 0
        self._failed: str | None = None
        self._stop = threading.Event()
        self._listener: socket.socket | None = None
        self._wake_r, self._wake_w = socket.socketpair()
        self._sel = selectors.DefaultSelector()
        self._pairs: list[_Pair] = []
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------ any thread
    def start(self) -> "TrickleProxy":
        """Listen and start the proxy's thread; returns self.

        Raises:
            OSError: the port cannot be bound.
            RuntimeError: started twice, or after :meth:`close`.
        """
        if self._thread is not None or self._stop.is_set():
            raise RuntimeError("a TrickleProxy starts once")
        self._listener = socket.create_server((HOST, self.port), backlog=128)
        self._listener.setblocking(False)
        self.port = self._listener.getsockname()[1]
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel.register(self._listener, selectors.EVENT_READ, None)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._thread = threading.Thread(target=self._run, name=f"kvtier-trickle-{self.port}", daemon=True)
        self._thread.start()
        return self

    def trickle(self, on: bool, upstream: bool = False) -> None:
        """Trickle server->client bytes (and client->server with ``upstream``) or, with
        ``on=False``, forward at full speed again; open connections switch at once."""
        with self._lock:
            self._trickle, self._upstream = bool(on), bool(on and upstream)
        self._wake()

    @property
    def trickling(self) -> bool:
        return self._trickle

    def stats(self) -> ProxyStats:
        with self._lock:
            return ProxyStats(trickling=self._trickle, upstream=self._upstream, open=self._open,
                              failed=self._failed, **self._c)

    def close(self) -> None:
        """Stop and join the proxy's thread, then close every socket (the thread has ended, so
        this thread owns them now).  Idempotent; never raises."""
        self._stop.set()
        self._wake()
        if self._thread is not None:
            self._thread.join()
        for p in self._pairs:
            self._close_pair(p)
        with contextlib.suppress(Exception):
            self._sel.close()
        for s in (self._listener, self._wake_r, self._wake_w):
            if s is not None:
                s.close()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    def _count(self, **kw: int) -> None:
        with self._lock:
            for k, v in kw.items():
                self._c[k] += v

    # ------------------------------------------------------------ the proxy's thread
    def _run(self) -> None:
        try:
            self._loop()
        except Exception as exc:         # a bug here must show in stats(), not vanish with the thread
            with self._lock:
                self._failed = repr(exc)

    def _loop(self) -> None:
        while not self._stop.is_set():
            timeout = self._arm(time.monotonic())
            for key, events in self._sel.select(timeout):
                if key.fileobj is self._listener:
                    self._accept()
                elif key.fileobj is self._wake_r:
                    with contextlib.suppress(OSError):
                        self._wake_r.recv(4096)
                else:
                    self._serve(key.data, key.fileobj, events)
            self._pairs = [p for p in self._pairs if p.client.fileno() >= 0]

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:            # out of fds: leave it in the backlog
                return
            if self._open >= self.max_connections:
                client.close()
                self._count(refused=1)
                continue
            client.setblocking(False)
            server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            server.setblocking(False)
            err = server.connect_ex((HOST, self.target_port))
            if err not in (0, errno.EINPROGRESS, errno.EAGAIN):
                client.close()
                server.close()
                self._count(connections=1, upstream_failures=1)
                continue
            self._pairs.append(_Pair(client, server))
            with self._lock:
                self._c["connections"] += 1
                self._open += 1

    def _arm(self, now: float) -> float | None:
        """Set every socket's interest for this turn; returns the select timeout (the nearest
        trickled piece's time, or None)."""
        with self._lock:
            down, up = self._trickle, self._upstream
        timeout = None
        for p in self._pairs:
            want = {p.client: 0, p.server: 0}
            if p.connecting:
                want[p.server] |= selectors.EVENT_WRITE
            else:
                for side, paced in ((p.up, up), (p.down, down)):
                    if len(side.buf) < self.buffer_bytes:
                        want[side.src] |= selectors.EVENT_READ
                    if side.buf:
                        if not paced or side.next_at <= now:
                            want[side.dst] |= selectors.EVENT_WRITE
                        else:
                            wait = side.next_at - now
                            timeout = wait if timeout is None else min(timeout, wait)
            for s, mask in want.items():
                self._interest(p, s, mask)
        return timeout

    def _interest(self, p: _Pair, s: socket.socket, mask: int) -> None:
        had = p.masks[s]
        if mask == had:
            return
        if not had:
            self._sel.register(s, mask, p)
        elif not mask:
            self._sel.unregister(s)
        else:
            self._sel.modify(s, mask, p)
        p.masks[s] = mask

    def _serve(self, p: _Pair, s: socket.socket, events: int) -> None:
        if p.client.fileno() < 0:                # closed earlier in this turn
            return
        try:
            if p.connecting:
                err = p.server.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if err:
                    raise ConnectionRefusedError(err, "upstream connect failed")
                p.connecting = False
                return
            if events & selectors.EVENT_READ:
                side = p.up if s is p.client else p.down
                data = s.recv(min(READ_BYTES, self.buffer_bytes - len(side.buf)))
                if not data:
                    raise ConnectionAbortedError("closed by its peer")
                side.buf += data
                with self._lock:
                    self._c["buffered_max"] = max(self._c["buffered_max"], len(side.buf))
            if events & selectors.EVENT_WRITE and p.client.fileno() >= 0:
                self._send(p.up if s is p.server else p.down, s is p.server)
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            if s is p.server:
                self._count(upstream_failures=1)
            self._close_pair(p)

    def _send(self, side: _Side, upward: bool) -> None:
        with self._lock:
            paced = self._upstream if upward else self._trickle
        piece = memoryview(side.buf)[:self.chunk] if paced else memoryview(side.buf)
        try:
            n = side.dst.send(piece)
        finally:
            piece.release()
        del side.buf[:n]
        if paced:
            side.next_at = time.monotonic() + self.gap_s
        way = "up" if upward else "down"
        self._count(**{f"bytes_{way}": n, **({f"trickled_{way}": n} if paced else {})})

    def _close_pair(self, p: _Pair) -> None:
        """Unregister and close both sockets of ``p`` (once)."""
        if p.client.fileno() < 0:
            return
        for s in (p.client, p.server):
            if p.masks[s]:
                with contextlib.suppress(Exception):
                    self._sel.unregister(s)
                p.masks[s] = 0
            s.close()
        with self._lock:
            self._open -= 1
