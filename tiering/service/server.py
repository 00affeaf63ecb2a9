"""Running the app under uvicorn: in a background thread (tests, benchmarks,
embedding in a harness) or in the foreground (``kvtier serve``).

The listening socket is bound here, before uvicorn starts, so ``port=0``
yields a free ephemeral port whose number is known up front.
"""
from __future__ import annotations

import contextlib
import socket
import threading
import time
from typing import Any, Callable, Iterator

from .security import check_bind


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on (host, port); port 0 picks a free one.

    Raises: OSError (address in use, cannot bind).
    """
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    # proto=IPPROTO_TCP matters: asyncio sets TCP_NODELAY on accepted sockets
    # only when their proto says TCP; with proto 0 every response waits out
    # Nagle + delayed ACK (~40 ms per request).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def _uvicorn_server(app: Any, log_level: str, on_ready: Callable[[], None] | None = None) -> Any:
    import uvicorn

    class _Server(uvicorn.Server):
        """uvicorn, plus: a callback once start-up (state open) finished, and a
        graceful SIGINT/SIGTERM stop that ends the process with status 0
        instead of re-raising the signal after shutdown."""

        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets=sockets)
            if on_ready is not None and not self.should_exit:
                on_ready()

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            with super().capture_signals():
                try:
                    yield
                finally:
                    captured = getattr(self, "_captured_signals", None)
                    if isinstance(captured, list):
                        captured.clear()

    cfg = uvicorn.Config(app, log_level=log_level, access_log=False, lifespan="on",
                         timeout_keep_alive=30, backlog=2048)
    return _Server(cfg)


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class ServiceServer:
    """uvicorn serving ``app`` in a daemon thread.  Context manager.

    ``start()`` returns once the app's lifespan start-up finished (state
    open) and the socket accepts; ``stop()`` shuts down gracefully (the state
    is flushed and closed) and joins the thread.

    Raises (start): ValueError for a non-loopback host without ``token``
    (pass the app's token so the guard can check it), RuntimeError if the
    server did not come up.
    """

    def __init__(self, app: Any, *, host: str = "127.0.0.1", port: int = 0,
                 token: str | None = None, log_level: str = "warning") -> None:
        check_bind(host, token)
        self.app = app
        self.host, self.port = host, port
        self.log_level = log_level
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self.url = ""

    def start(self, timeout_s: float = 30.0) -> str:
        sock = bind_socket(self.host, self.port)
        self.url = url_of(sock)
        self._server = _uvicorn_server(self.app, self.log_level)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]},
                                        name="kvtier-service", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self._server.should_exit = True
                self._thread.join(5)
                sock.close()
                raise RuntimeError(f"kvtier service did not start on {self.url}")
            time.sleep(0.01)
        self._sock = sock
        return self.url

    def stop(self, timeout_s: float = 30.0) -> None:
        if self._server is None or self._thread is None:
            return
        self._server.should_exit = True
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise RuntimeError("kvtier service did not stop in time")
        self._sock.close()
        self._server = self._thread = None

    def __enter__(self) -> "ServiceServer":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve_foreground(app: Any, sock: socket.socket, log_level: str = "info",
                     on_ready: Callable[[], None] | None = None) -> None:
    """Serve on an already-bound socket until SIGINT/SIGTERM, then shut down
    gracefully (state flushed) and return.  ``on_ready`` runs once the app's
    start-up finished.

    Raises: RuntimeError if the app failed to start (its log says why).
    """
    server = _uvicorn_server(app, log_level, on_ready)
    server.run(sockets=[sock])
    if not server.started:
        raise RuntimeError("the service failed to start (see the log above)")
