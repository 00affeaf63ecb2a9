"""A small cluster on 127.0.0.1: N ``vllm serve`` engines with kvtier on one shared Redis tier,
behind kvtier's router (one in-process router per routing policy).

    spec = ClusterSpec(model=path, engines=2, engine_blocks=24, workdir=tmp)
    with Cluster(spec, policies=("prefix-load", "sticky"), progress=print) as c:
        c.router_urls["sticky"]        # a router on every engine, routing by that policy
        c.engine_urls                  # the engines' own base URLs

::

    redis-server (127.0.0.1:R, no persistence) <── kvtier in every engine (write-through)
    engine i: python -m vllm.entrypoints.openai.api_server   127.0.0.1:P_i
              kvtier's connector (data dir workdir/engine-i), KV events on ipc://workdir/events-i
    routers (this process, uvicorn threads): one per policy, each polling every engine's
              /metrics and subscribing to every engine's event stream

Every process is started in its own session and stopped by its PID (SIGTERM, then SIGKILL after
``stop_grace_s``).  :meth:`Cluster.close` runs on leaving the ``with`` block however it is left:
an error, Ctrl-C (KeyboardInterrupt), or SIGTERM, which the cluster turns into KeyboardInterrupt
while it runs in the main thread.  Engines start at once; progress lines (``progress``) say
which is up.  Each engine runs one OpenMP thread, unbound (``OMP_NUM_THREADS=1``,
``VLLM_CPU_OMP_THREADS_BIND=nobind``), and without ``PYTHONHASHSEED`` (vLLM's fixed hash seed,
the router's default).  Each engine's output goes to ``workdir/engine-i.log``.

Not thread-safe: one owner starts and stops it.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

HOST = "127.0.0.1"


class ClusterError(RuntimeError):
    """A part of the cluster is missing or did not come up (the message says which, with its log's tail)."""


@dataclass(frozen=True)
class ClusterSpec:
    """What to start.  ``engine_blocks``: each engine's KV cache in blocks of ``block_tokens``
    (``--num-gpu-blocks-override``); the served context is ``max_model_len`` at most, and at most
    ``engine_blocks - 1`` blocks (vLLM refuses a cache that cannot hold one request);
    ``kvtier``: kvtier's config in each engine, to which the cluster adds ``data_dir`` and the
    shared tier's ``remote_url``.  Raises ValueError."""

    model: str
    workdir: Path
    engines: int = 2
    engine_blocks: int = 24
    block_tokens: int = 32
    max_model_len: int = 2048
    cpu_bytes: int = 1 << 20
    kvtier: Mapping[str, Any] = field(default_factory=lambda: {"nvme_gb": 0.05, "host_gb": 0.002,
                                                               "remote_write": "through"})
    python: str = sys.executable
    start_timeout_s: float = 600.0
    stop_grace_s: float = 30.0

    def __post_init__(self) -> None:
        if self.engines < 1:
            raise ValueError(f"engines must be >= 1, got {self.engines}")
        if self.engine_blocks < 2 or self.block_tokens < 1:
            raise ValueError("engine_blocks must be >= 2 and block_tokens >= 1")
        if "data_dir" in self.kvtier or "remote_url" in self.kvtier:
            raise ValueError("the cluster sets kvtier's data_dir and remote_url itself")

    @property
    def context_tokens(self) -> int:
        """The longest context the engines serve (``--max-model-len``)."""
        return min(self.max_model_len, (self.engine_blocks - 1) * self.block_tokens)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 a moment ago."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def redis_binary() -> str:
    """redis-server's path.  Raises ClusterError when it is not installed."""
    path = shutil.which("redis-server")
    if path is None:
        raise ClusterError("redis-server is not installed (Debian/Ubuntu: apt-get install redis-server); "
                           "the engines' shared tier runs on it")
    return path


def start_redis_server(workdir: Path, port: int, timeout_s: float = 15.0) -> subprocess.Popen:
    """redis-server on ``HOST:port`` without persistence, its log and dir ``workdir``, in its own
    session; returns once it answers PING.  Raises ClusterError (not installed, exited, not
    answering within ``timeout_s``; a server that started is stopped first)."""
    workdir.mkdir(parents=True, exist_ok=True)
    with open(workdir / "redis.log", "ab") as log:
        proc = subprocess.Popen([redis_binary(), "--port", str(port), "--bind", HOST, "--save", "",
                                 "--appendonly", "no", "--dir", str(workdir), "--protected-mode", "yes"],
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    deadline = time.monotonic() + timeout_s
    while not _pong(port):
        if proc.poll() is not None:
            raise ClusterError(f"redis-server exited with {proc.returncode}: {_tail(workdir / 'redis.log')}")
        if time.monotonic() > deadline:
            _stop(proc, 2.0)
            raise ClusterError(f"redis-server is not answering on {HOST}:{port} after {timeout_s:g} s")
        time.sleep(0.05)
    return proc


def _pong(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=0.5) as s:
            s.sendall(b"*1\r\n$4\r\nPING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def _stop(proc: subprocess.Popen | None, grace_s: float) -> None:
    """SIGTERM by PID, then SIGKILL after ``grace_s``."""
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def _tail(path: Path, n: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return "(no log)"


class Cluster:
    """See the module docstring.  ``policies``: one router per name (:data:`kvtier.tiering.
    routing.policies.POLICIES`).  :meth:`start` raises ClusterError (redis-server missing, an
    engine that exits or is not healthy within ``start_timeout_s``, a router that does not
    start) after stopping whatever it started; ValueError for an unknown policy."""

    def __init__(self, spec: ClusterSpec, policies: Sequence[str] = ("prefix-load",), *,
                 progress: Callable[[str], None] = lambda m: None) -> None:
        from kvtier.tiering.routing.policies import POLICIES
        unknown = [p for p in policies if p not in POLICIES]
        if unknown or not policies:
            raise ValueError(f"unknown routing policy {unknown[0]!r}; known: {', '.join(POLICIES)}" if unknown
                             else "give at least one routing policy")
        self.spec, self.policies, self.progress = spec, tuple(policies), progress
        self.workdir = Path(spec.workdir)
        self.redis: subprocess.Popen | None = None
        self.redis_url = ""
        self.engines: list[subprocess.Popen] = []
        self.engine_urls: list[str] = []
        self.events: list[str] = []
        self.routers: dict[str, Any] = {}            # policy -> RouterApp
        self.router_urls: dict[str, str] = {}
        self._servers: list[Any] = []
        self._old_sigterm: Any = None

    # ------------------------------------------------------------------ start
    def start(self) -> "Cluster":
        try:
            self._start_redis()
            self._start_engines()
            self._start_routers()
        except BaseException:
            self.close()
            raise
        return self

    def _start_redis(self) -> None:
        port = free_port()
        self.redis = start_redis_server(self.workdir / "redis", port)
        self.redis_url = f"redis://{HOST}:{port}"
        self.progress(f"redis-server pid {self.redis.pid} at {self.redis_url}")

    def _engine_command(self, i: int, port: int, events: str) -> list[str]:
        s = self.spec
        kv = {"kv_connector": "KvtierConnector", "kv_role": "kv_both",
              "kv_connector_extra_config": {"cpu_bytes_to_use": int(s.cpu_bytes),
                                            "kvtier": {**s.kvtier, "data_dir": str(self.workdir / f"engine-{i}"),
                                                       "remote_url": self.redis_url}}}
        ev = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": events}
        return [s.python, "-m", "vllm.entrypoints.openai.api_server", "--model", s.model, "--host", HOST,
                "--port", str(port), "--block-size", str(s.block_tokens),
                "--num-gpu-blocks-override", str(s.engine_blocks), "--max-model-len", str(s.context_tokens),
                "--dtype", "float32", "--enforce-eager", "--gpu-memory-utilization", "0.05",
                "--enable-prompt-tokens-details", "--kv-transfer-config", json.dumps(kv),
                "--kv-events-config", json.dumps(ev)]

    def _start_engines(self) -> None:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
        env.update(OMP_NUM_THREADS="1", VLLM_CPU_OMP_THREADS_BIND="nobind", VLLM_CPU_KVCACHE_SPACE="1")
        logs = []
        for i in range(self.spec.engines):
            port = free_port()
            events = f"ipc://{self.workdir}/events-{i}"
            log_path = self.workdir / f"engine-{i}.log"
            with open(log_path, "ab") as log:
                proc = subprocess.Popen(self._engine_command(i, port, events), stdout=log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, env=env, start_new_session=True)
            self.engines.append(proc)
            self.engine_urls.append(f"http://{HOST}:{port}")
            self.events.append(events)
            logs.append(log_path)
            self.progress(f"engine {i + 1}/{self.spec.engines}: pid {proc.pid} starting at {self.engine_urls[-1]} "
                          f"(log {log_path})")
        t0 = time.monotonic()
        waiting = set(range(self.spec.engines))
        while waiting:
            for i in sorted(waiting):
                proc = self.engines[i]
                if proc.poll() is not None:
                    raise ClusterError(f"engine {i + 1} exited with {proc.returncode}:\n{_tail(logs[i])}")
                if _healthy(self.engine_urls[i]):
                    waiting.discard(i)
                    self.progress(f"engine {i + 1}/{self.spec.engines} up after {time.monotonic() - t0:.0f} s")
            if waiting and time.monotonic() - t0 > self.spec.start_timeout_s:
                i = min(waiting)
                raise ClusterError(f"engine {i + 1} is not healthy after {self.spec.start_timeout_s:.0f} s:\n"
                                   f"{_tail(logs[i])}")
            if waiting:
                time.sleep(1.0)

    def _start_routers(self) -> None:
        from kvtier.tiering.routing.config import EngineSpec, RouterConfig
        from kvtier.tiering.routing.proxy import RouterApp
        from kvtier.tiering.service.server import ServiceServer
        engines = tuple(EngineSpec(f"{HOST}:{u.rsplit(':', 1)[1]}", u, ev)
                        for u, ev in zip(self.engine_urls, self.events))
        for name in self.policies:
            app = RouterApp(RouterConfig(engines, block_size=self.spec.block_tokens, policy=name,
                                         poll_interval_s=0.5))
            server = ServiceServer(app, host=HOST, port=0)
            try:
                url = server.start()
            except RuntimeError as exc:
                raise ClusterError(f"router {name}: {exc}") from None
            self._servers.append(server)
            self.routers[name], self.router_urls[name] = app, url
            self.progress(f"router {name} at {url}")

    # ------------------------------------------------------------------ stop
    def close(self) -> None:
        """Stop the routers, then the engines (at once), then redis-server.  Safe to call twice."""
        for server in reversed(self._servers):
            with contextlib.suppress(Exception):
                server.stop()
        self._servers.clear()
        for proc in self.engines:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGTERM)
        for proc in self.engines:
            _stop(proc, self.spec.stop_grace_s)
        _stop(self.redis, 5.0)

    def __enter__(self) -> "Cluster":
        if threading.current_thread() is threading.main_thread():
            self._old_sigterm = signal.signal(signal.SIGTERM, _sigterm)
        try:
            return self.start()
        except BaseException:
            self._restore()
            raise

    def __exit__(self, *exc: object) -> None:
        try:
            self.close()
        finally:
            self._restore()

    def _restore(self) -> None:
        if self._old_sigterm is not None:
            signal.signal(signal.SIGTERM, self._old_sigterm)
            self._old_sigterm = None


def _sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _healthy(url: str) -> bool:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url + "/health", timeout=2) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False
