"""RESP commands to a redis-server on 127.0.0.1, standard library only (the soak's own
control line, not kvtier's client).

    command(port, "CONFIG", "SET", "maxmemory", "1mb")   # -> b"OK"

Raises RedisCtlError on a refused connection, a timeout or an error reply."""
from __future__ import annotations

import socket


class RedisCtlError(RuntimeError):
    """redis-server could not be reached or answered an error (its text included)."""


def command(port: int, *args: str, timeout_s: float = 2.0) -> bytes:
    """Send one command; returns a simple-string, integer or bulk reply's bytes."""
    payload = f"*{len(args)}\r\n".encode() + b"".join(
        f"${len(a.encode())}\r\n".encode() + a.encode() + b"\r\n" for a in args)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as s:
            s.sendall(payload)
            f = s.makefile("rb")
            line = f.readline()
            if not line:
                raise RedisCtlError(f"redis at port {port} closed the connection")
            kind, rest = line[:1], line[1:].rstrip(b"\r\n")
            if kind == b"-":
                raise RedisCtlError(f"redis at port {port}: {rest.decode(errors='replace')}")
            if kind == b"$":
                n = int(rest)
                return b"" if n < 0 else f.read(n + 2)[:n]
            return rest
    except OSError as exc:
        raise RedisCtlError(f"redis at port {port}: {exc}") from None
