"""A misbehaving Redis server on 127.0.0.1: it speaks enough RESP for the remote
tier to connect (PING, EXISTS, CLIENT, SELECT, ...) and answers every GET
the way its ``mode`` says:

* ``trickle``: the whole value, ``chunk`` bytes every ``gap_s`` seconds;
* ``stall``:   half the value, then nothing (the connection stays open);
* ``close``:   half the value, then the connection is closed;
* ``garbage``: a reply that is no RESP at all;
* ``half_line``: half a reply line, then nothing.

The value it serves is the one given (a real, valid value for the block, so
only the server's behaviour can make the read fail).  One thread per
connection; ``stop()`` closes everything.
"""
from __future__ import annotations

import socket
import threading
import time

HOST = "127.0.0.1"


def _read_command(f) -> list[bytes] | None:
    line = f.readline()
    if not line:
        return None
    if not line.startswith(b"*"):
        return [line.strip()]
    args = []
    for _ in range(int(line[1:])):
        n = int(f.readline()[1:])
        args.append(f.read(n + 2)[:-2])
    return args


class MisbehavingRedis:
    def __init__(self, mode: str, value: bytes, chunk: int = 2048, gap_s: float = 0.1) -> None:
        self.mode, self.value, self.chunk, self.gap_s = mode, value, chunk, gap_s
        self._srv = socket.create_server((HOST, 0))
        self.port = self._srv.getsockname()[1]
        self._stop = threading.Event()
        self._conns: list[socket.socket] = []
        self.gets = 0
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}"

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                c, _ = self._srv.accept()
            except OSError:
                return
            self._conns.append(c)
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c: socket.socket) -> None:
        f = c.makefile("rb")
        try:
            while not self._stop.is_set():
                cmd = _read_command(f)
                if cmd is None:
                    return
                name = cmd[0].upper()
                if name == b"PING":
                    c.sendall(b"+PONG\r\n")
                elif name == b"HELLO":     # a RESP2-only server: the client falls back
                    c.sendall(b"-ERR unknown command 'HELLO'\r\n")
                elif name == b"EXISTS":
                    c.sendall(b":%d\r\n" % (len(cmd) - 1))
                elif name == b"GET":
                    self.gets += 1
                    if not self._get(c):
                        return
                else:                       # CLIENT SETINFO, SELECT, UNLINK, SET ...
                    c.sendall(b":0\r\n" if name in (b"UNLINK", b"DEL") else b"+OK\r\n")
        except OSError:
            return
        finally:
            f.close()

    def _get(self, c: socket.socket) -> bool:
        reply = b"$%d\r\n%s\r\n" % (len(self.value), self.value)
        half = reply[:len(reply) // 2]
        if self.mode == "trickle":
            for i in range(0, len(reply), self.chunk):
                if self._stop.wait(self.gap_s):
                    return False
                c.sendall(reply[i:i + self.chunk])
            return True
        if self.mode == "stall":
            c.sendall(half)
            self._stop.wait(30)
            return False
        if self.mode == "close":
            c.sendall(half)
            c.shutdown(socket.SHUT_RDWR)
            c.close()
            return False
        if self.mode == "garbage":
            c.sendall(b"!#% this is no RESP\r\n")
            return True
        if self.mode == "half_line":
            c.sendall(b"$6553")
            self._stop.wait(30)
            return False
        c.sendall(reply)
        return True

    def stop(self) -> None:
        self._stop.set()
        self._srv.close()
        for c in self._conns:
            try:
                c.close()
            except OSError:
                pass
        time.sleep(0.05)
