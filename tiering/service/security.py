"""Guards of the service: bind address, bearer token, body size, data-dir confinement.

Pure functions and one small ASGI middleware; no FastAPI state.  Every guard
fails with a one-line message (``ValueError`` at start-up, an HTTP 4xx at run
time) so ``kvtier serve`` can report it without a traceback.
"""
from __future__ import annotations

import hmac
import ipaddress
import json
import os
import socket
from pathlib import Path
from typing import Awaitable, Callable

__all__ = [
    "is_loopback", "check_token", "check_bind", "token_matches", "confined_path", "check_data_dir",
    "BodyLimitMiddleware",
]


def is_loopback(host: str) -> bool:
    """True if every address ``host`` resolves to is a loopback address.

    ``localhost`` and 127.0.0.0/8, ``::1`` are loopback; ``0.0.0.0``, ``::``
    and any routable or unresolvable name are not (fail closed).
    """
    h = host.strip().strip("[]")
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(h, None)
    except OSError:
        return False
    addrs = {info[4][0] for info in infos}
    return bool(addrs) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addrs)


MIN_TOKEN_CHARS = 16


def check_token(token: str | None) -> None:
    """Refuse a bearer token nobody could present.

    ``None`` (no token: an open server) passes.  A client's header value is
    stripped before it is compared, so a token with leading or trailing
    whitespace, or one of whitespace only, would start a server nobody can
    authenticate to.

    Raises:
        ValueError: the token is empty, whitespace only, padded with
            whitespace, or shorter than 16 characters.
    """
    if token is None:
        return
    if not token.strip():
        raise ValueError("the bearer token is empty or whitespace only "
                         "(give at least 16 characters, or no token for an open loopback server)")
    if token != token.strip():
        raise ValueError("the bearer token starts or ends with whitespace (clients could never present it)")
    if len(token) < MIN_TOKEN_CHARS:
        raise ValueError(f"the bearer token must be at least {MIN_TOKEN_CHARS} characters long")


def check_bind(host: str, token: str | None) -> None:
    """Refuse to serve on a non-loopback address without a bearer token.

    ``token=""`` is taken as no token (as ``ServiceConfig.make`` does).

    Raises:
        ValueError: ``host`` is not loopback and there is no token, or the
            token fails :func:`check_token`.
    """
    check_token(token or None)
    if not is_loopback(host) and not token:
        raise ValueError(f"refusing to bind non-loopback address {host!r} without a token "
                         "(pass --token or set KVTIER_TOKEN)")


def token_matches(header_value: str | None, token: str) -> bool:
    """Constant-time check of an ``Authorization: Bearer <token>`` header value."""
    if not header_value:
        return False
    scheme, _, presented = header_value.partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(presented.strip().encode(), token.encode())


def confined_path(root: Path, *parts: str) -> Path:
    """``root / parts...`` resolved, refusing anything that escapes ``root``.

    Symlinks are resolved before the check, so a link pointing outside the
    root is refused too.

    Raises:
        ValueError: the resolved path is not inside the resolved root.
    """
    base = Path(root).resolve()
    p = base.joinpath(*parts).resolve()
    if p != base and base not in p.parents:
        raise ValueError(f"path {p} escapes the data root {base}")
    return p


def check_data_dir(data_dir: str | os.PathLike[str], root: str | os.PathLike[str] | None) -> Path:
    """Validate the service data directory, create it if missing, return it resolved.

    With ``root`` set (``--data-root`` / ``KVTIER_DATA_ROOT``) a relative
    ``data_dir`` is taken relative to the root, and the result must resolve
    inside it (symlinks followed).

    Raises:
        ValueError: outside the root, exists and is not a directory, cannot
            be created, or is not writable.
    """
    d = Path(data_dir).expanduser()
    if root is not None:
        r = Path(root).expanduser()
        d = confined_path(r, str(d))  # an absolute d replaces r, then must still be inside
    else:
        d = d.resolve()
    if d.exists() and not d.is_dir():
        raise ValueError(f"data dir {d} exists and is not a directory")
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"cannot create data dir {d}: {exc.strerror or exc}") from None
    if not os.access(d, os.W_OK | os.X_OK):
        raise ValueError(f"data dir {d} is not writable")
    return d


ASGIApp = Callable[[dict, Callable[[], Awaitable[dict]], Callable[[dict], Awaitable[None]]], Awaitable[None]]


class BodyLimitMiddleware:
    """Reject HTTP request bodies larger than ``max_bytes`` with 413.

    Checks ``Content-Length`` up front and counts streamed (chunked) bytes as
    they arrive, so a body without a length header cannot slip past.  The
    downstream app never sees a truncated body: it either gets all of it or
    the request is answered 413 before the handler runs.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = int(max_bytes)

    async def __call__(self, scope: dict, receive: Callable[[], Awaitable[dict]],
                       send: Callable[[dict], Awaitable[None]]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    n = int(value)
                except ValueError:
                    await _reply(send, 400, "invalid Content-Length header")
                    return
                if n > self.max_bytes:
                    await _reply(send, 413, f"request body of {n} bytes exceeds the limit of {self.max_bytes}")
                    return
        # Buffer the whole body (bounded) before calling the app, so an
        # oversized chunked body is refused before any handler side effect.
        chunks: list[bytes] = []
        total = 0
        more = True
        while more:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            body = msg.get("body", b"")
            total += len(body)
            if total > self.max_bytes:
                await _reply(send, 413, f"request body exceeds the limit of {self.max_bytes} bytes")
                return
            chunks.append(body)
            more = msg.get("more_body", False)
        whole = b"".join(chunks)
        sent = False

        async def replay() -> dict:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": whole, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


async def _reply(send: Callable[[dict], Awaitable[None]], status: int, message: str) -> None:
    body = json.dumps({"detail": message}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})
