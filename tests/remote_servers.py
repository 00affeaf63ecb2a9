"""Real remote servers for the remote-tier tests, on 127.0.0.1 with explicit free ports.

* :class:`RedisServer` -- one ``redis-server`` (no persistence).
* :func:`redis_cluster` -- three ``redis-server`` masters joined into a Redis
  Cluster (slots split in three, no replicas).
* :class:`MooncakeCluster` -- a Mooncake master (its built-in metadata server
  off), the separate loopback ``mooncake.http_metadata_server`` and one storage
  node (a child process contributing a small segment).

Every process is started with ``subprocess.Popen`` and stopped by its PID
(SIGTERM, then SIGKILL).  A fixture skips, with the reason, only when the
binary or the wheel cannot be found; in CI ``ci/test.sh`` installs both.

Run as a script, this file is the Mooncake storage node:
``python remote_servers.py node MASTER_PORT METADATA_PORT SEGMENT_BYTES``.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

HOST = "127.0.0.1"


def free_port(below: int = 65536) -> int:
    """A TCP port under ``below`` that was free on 127.0.0.1 a moment ago."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind((HOST, 0))
            port = s.getsockname()[1]
        if port < below:
            return port
    raise RuntimeError(f"no free port below {below}")


def _cluster_port(taken: set[int]) -> int:
    """A port whose cluster bus port (+10000) is free too (Redis needs both <= 65535),
    clear of the ports and bus ports in ``taken`` (the other nodes': none is bound
    yet, so the kernel may hand out the same free port twice).  Adds both to ``taken``."""
    for _ in range(200):
        port = free_port(below=55536)
        if port in taken or port + 10000 in taken:
            continue
        with contextlib.suppress(OSError), socket.socket() as s:
            s.bind((HOST, port + 10000))
            taken.update((port, port + 10000))
            return port
    raise RuntimeError("no free port pair for a Redis Cluster node")


def _wait_port(port: int, proc: subprocess.Popen, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server on port {port} exited with {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection((HOST, port), timeout=0.2):
            return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {HOST}:{port} after {timeout} s")


def stop(proc: subprocess.Popen | None, sig: int = signal.SIGTERM) -> None:
    """Stop one process by its PID: ``sig``, then SIGKILL after 5 s."""
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, sig)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)


# ---------------------------------------------------------------- Redis
def redis_binary() -> str | None:
    return shutil.which("redis-server") or (
        "/usr/bin/redis-server" if os.access("/usr/bin/redis-server", os.X_OK) else None)


class RedisServer:
    """One redis-server on 127.0.0.1:``port`` with its files under ``workdir``."""

    def __init__(self, workdir: Path, port: int | None = None, extra: tuple[str, ...] = ()) -> None:
        self.binary = redis_binary()
        if self.binary is None:
            raise FileNotFoundError("redis-server not found (ci/test.sh installs it from Debian as root)")
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.extra = extra
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}"

    def start(self) -> "RedisServer":
        args = [self.binary, "--port", str(self.port), "--bind", HOST, "--save", "",
                "--appendonly", "no", "--dir", str(self.workdir), "--protected-mode", "yes",
                *self.extra]
        log = open(self.workdir / f"redis-{self.port}.log", "ab")
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        _wait_port(self.port, self.proc)
        return self

    def kill(self) -> None:
        """SIGKILL (a crash): the server loses everything."""
        stop(self.proc, signal.SIGKILL)

    def stop(self) -> None:
        stop(self.proc)

    def client(self):
        import redis
        return redis.Redis(host=HOST, port=self.port, socket_timeout=5)


@contextlib.contextmanager
def redis_cluster(workdir: Path, masters: int = 3):
    """Yield the seed-node URL of a fresh ``masters``-node Redis Cluster."""
    import redis
    taken: set[int] = set()
    nodes = [RedisServer(Path(workdir) / f"node{i}", port=_cluster_port(taken), extra=(
        "--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{i}.conf",
        "--cluster-node-timeout", "2000")) for i in range(masters)]
    try:
        for n in nodes:
            n.start()
        clients = [n.client() for n in nodes]
        per = 16384 // masters
        for i, c in enumerate(clients):
            hi = 16383 if i == masters - 1 else (i + 1) * per - 1
            c.execute_command("CLUSTER", "ADDSLOTSRANGE", i * per, hi)
        for n in nodes[1:]:
            clients[0].execute_command("CLUSTER", "MEET", HOST, n.port)
        deadline = time.monotonic() + 20
        while not all(c.execute_command("CLUSTER", "INFO").decode().count("cluster_state:ok")
                      and len(c.execute_command("CLUSTER", "NODES").decode().strip().splitlines()) == masters
                      for c in clients):
            if time.monotonic() > deadline:
                raise RuntimeError("redis cluster did not converge in 20 s")
            time.sleep(0.1)
        for c in clients:
            c.close()
        yield "redis://" + ",".join(f"{HOST}:{n.port}" for n in nodes), nodes
    finally:
        for n in nodes:
            n.stop()


# ---------------------------------------------------------------- Mooncake
def mooncake_master_binary() -> str | None:
    """The master binary inside the installed wheel, or None if the wheel
    (or a library it needs, such as libibverbs) is missing."""
    import importlib.util
    spec = importlib.util.find_spec("mooncake")
    if spec is None or not spec.submodule_search_locations:
        return None
    for d in spec.submodule_search_locations:
        p = Path(d) / "mooncake_master"
        if p.exists():
            return str(p)
    return None


def mooncake_missing() -> str | None:
    """Why the Mooncake tests cannot run here, or None."""
    if mooncake_master_binary() is None:
        return "mooncake-transfer-engine-non-cuda is not installed (pip install 'kvtier[remote]')"
    try:
        import mooncake.store  # noqa: F401  (needs libibverbs1 even without RDMA)
    except ImportError as exc:
        return f"mooncake.store cannot load: {exc} (apt-get install libibverbs1)"
    return None


def _env() -> dict:
    env = dict(os.environ)
    env.setdefault("MC_TCP_BIND_ADDRESS", HOST)
    return env


class MooncakeCluster:
    """Master + loopback metadata server + one storage node, all on 127.0.0.1."""

    def __init__(self, workdir: Path, segment_bytes: int = 64 << 20, deadline_s: float | None = None) -> None:
        self.master_bin = mooncake_master_binary()
        self.deadline_s = deadline_s          # the URL's ``deadline`` (None: the tier's default)
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.segment_bytes = segment_bytes
        self.master_port, self.metrics_port, self.metadata_port = free_port(), free_port(), free_port()
        self.master = self.metadata = self.node = None

    @property
    def url(self) -> str:
        return (f"mooncake://{HOST}:{self.master_port}"
                f"?metadata=http://{HOST}:{self.metadata_port}/metadata&protocol=tcp"
                + ("" if self.deadline_s is None else f"&deadline={self.deadline_s:g}"))

    def _popen(self, args: list[str], name: str) -> subprocess.Popen:
        log = open(self.workdir / f"{name}.log", "ab")
        p = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             env=_env(), cwd=self.workdir)
        log.close()
        return p

    def start_master(self) -> None:
        self.master = self._popen([self.master_bin, f"-rpc_address={HOST}", f"-rpc_port={self.master_port}",
                                   f"-metrics_host={HOST}", f"-metrics_port={self.metrics_port}",
                                   "-enable_http_metadata_server=false"], "master")
        _wait_port(self.master_port, self.master)

    def start(self) -> "MooncakeCluster":
        self.metadata = self._popen([sys.executable, "-m", "mooncake.http_metadata_server", "--host", HOST,
                                     "--port", str(self.metadata_port), "--log-level", "WARNING"], "metadata")
        _wait_port(self.metadata_port, self.metadata)
        self.start_master()
        self.node = self._popen([sys.executable, __file__, "node", str(self.master_port),
                                 str(self.metadata_port), str(self.segment_bytes)], "node")
        deadline = time.monotonic() + 20
        while not (self.workdir / "node.ready").exists():
            if self.node.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"mooncake storage node did not start; see {self.workdir / 'node.log'}")
            time.sleep(0.05)
        return self

    def kill_master(self) -> None:
        stop(self.master, signal.SIGKILL)

    def pause_master(self) -> None:
        """SIGSTOP: the master still accepts connections (the kernel does) but answers nothing.

        Returns once the kernel reports the master stopped (state ``T`` in
        ``/proc/PID/stat``, at most 2 s): on a loaded machine the signal can
        take effect after the caller's next request was already answered."""
        os.kill(self.master.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            try:
                with open(f"/proc/{self.master.pid}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] in ("T", "t"):
                        return
            except OSError:
                return
            time.sleep(0.005)

    def resume_master(self) -> None:
        if self.master is not None and self.master.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.master.pid, signal.SIGCONT)

    def stop(self) -> None:
        self.resume_master()              # a stopped process would ignore SIGTERM until SIGKILL
        for p in (self.node, self.master, self.metadata):
            stop(p)


def _storage_node(master_port: int, metadata_port: int, segment_bytes: int) -> None:
    from mooncake.store import MooncakeDistributedStore
    store = MooncakeDistributedStore()
    rc = store.setup(HOST, f"http://{HOST}:{metadata_port}/metadata", segment_bytes, 16 << 20,
                     "tcp", "", f"{HOST}:{master_port}")
    if rc != 0:
        sys.exit(f"storage node setup failed: {rc}")
    Path("node.ready").write_text("ok")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        time.sleep(3600)


# ---------------------------------------------------------------- pytest fixtures
# Test modules import the ones they use: ``from remote_servers import redis_server, ...``.
import pytest  # noqa: E402


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory):
    """One redis-server for a test module (tests use their own keys)."""
    if redis_binary() is None:
        pytest.skip("redis-server not found (ci/test.sh installs it from Debian as root)")
    srv = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield srv
    srv.stop()


@pytest.fixture
def fresh_redis(tmp_path):
    """A redis-server of the test's own (fault tests kill and restart it)."""
    if redis_binary() is None:
        pytest.skip("redis-server not found (ci/test.sh installs it from Debian as root)")
    srv = RedisServer(tmp_path / "redis").start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def redis_cluster_url(tmp_path_factory):
    """(seed-node URL, [RedisServer, ...]) of a three-master Redis Cluster."""
    if redis_binary() is None:
        pytest.skip("redis-server not found (ci/test.sh installs it from Debian as root)")
    with redis_cluster(tmp_path_factory.mktemp("cluster")) as (url, nodes):
        yield url, nodes


def _mooncake(path, deadline_s: float | None = None):
    why = mooncake_missing()
    if why:
        pytest.skip(why)
    return MooncakeCluster(path, deadline_s=deadline_s).start()


FUNCTIONAL_DEADLINE_S = 30.0


@pytest.fixture(scope="module")
def mooncake_cluster(tmp_path_factory):
    """Master + loopback metadata server + one 64 MiB storage node for a module.

    Its URL sets ``deadline=30``: these tests check what calls do, not how
    fast.  Under the tier's default (1.5 s) a call the loaded test machine
    makes slower is abandoned as a miss -- correct behaviour, and a false
    failure of a functional test: kvtier's call workers wait at nice +10
    over the process (calls.WAITER_NICE), so a pytest run under ``nice -n 10``
    waits at nice 19 and loses the core to any nice-0 process; measured with
    a busy loop beside it, 3 x 64 KiB puts took 0.5-1.3 s.  The deadline's
    own behaviour is tested with ``fresh_mooncake`` at the default
    (test_remote_faults.py) and on Redis (test_remote_deadlines.py)."""
    mc = _mooncake(tmp_path_factory.mktemp("mooncake"), deadline_s=FUNCTIONAL_DEADLINE_S)
    yield mc
    mc.stop()


@pytest.fixture
def fresh_mooncake(tmp_path):
    """A Mooncake cluster of the test's own (fault tests kill its master)."""
    mc = _mooncake(tmp_path / "mooncake")
    yield mc
    mc.stop()


if __name__ == "__main__" and len(sys.argv) == 5 and sys.argv[1] == "node":
    _storage_node(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
