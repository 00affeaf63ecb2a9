"""The soak's processes: one redis-server and one ``vllm serve`` with kvtier, each on a port fixed
for the whole run, so that a restarted redis-server or engine is found where the other expects it.

The engine's command is :class:`~kvtier.bench.live.cluster.Cluster`'s (one engine, kvtier's
data dir ``workdir/engine-0``); redis-server runs without persistence, as there.  The engine
reaches Redis through a :class:`~kvtier.bench.soak_live.trickle.TrickleProxy` (the
``remote-trickle`` fault slows it); the soak's own control line talks to redis-server directly.
With ``data_mib``, kvtier's data dir is a size-limited ext4 loop mount
(:class:`~kvtier.bench.soak_live.fsmount.SizeLimitedMount`, the ``fs-full`` fault fills it).
Every process runs in its own session and is stopped by its PID.

Not thread-safe: the faults thread owns restarts; others only read ``engine_pid`` and
``redis_pid`` (ints, replaced whole) and call :meth:`engine_alive`.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

from kvtier.bench.live.cluster import (HOST, Cluster, ClusterError, ClusterSpec, _healthy, _stop, _tail,
                                       free_port, start_redis_server)
from kvtier.bench.soak_live.fsmount import MountError, SizeLimitedMount
from kvtier.bench.soak_live.trickle import TrickleProxy


class Rig:
    """``spec``: the engine's shape (``engines`` is ignored: one engine).  ``data_mib``: the
    size of the data dir's own filesystem (None: the work dir's).  :meth:`prepare`,
    :meth:`start_redis` and :meth:`start_engine` raise ClusterError (no mount, redis-server
    missing, an engine that exits or is not healthy in time)."""

    def __init__(self, spec: ClusterSpec, progress=lambda m: None, *, data_mib: int | None = None) -> None:
        self.spec, self.progress = spec, progress
        self.workdir = Path(spec.workdir)
        self.redis_port, self.engine_port = free_port(), free_port()
        self.redis: subprocess.Popen | None = None
        self.engine: subprocess.Popen | None = None
        self.serving = False                          # the engine answered /health since its start
        self.redis_proxy = TrickleProxy(self.redis_port, port=free_port())
        self._cluster = Cluster(spec)                 # only its engine command
        self._cluster.redis_url = f"redis://{HOST}:{self.redis_proxy.port}"
        self.data_dir = self.workdir / "engine-0"
        self.mount = SizeLimitedMount(self.data_dir, data_mib) if data_mib else None
        self.engine_log = self.workdir / "engine-0.log"
        self.url = f"http://{HOST}:{self.engine_port}"

    def prepare(self) -> None:
        """Mount the data dir's filesystem (with ``data_mib``) and start the Redis proxy; before
        the first engine.  Raises ClusterError when the mount cannot be made."""
        if self.mount is not None:
            try:
                self.mount.mount()
            except MountError as exc:
                raise ClusterError(f"kvtier's data dir could not be size-limited: {exc}") from None
            self.progress(f"kvtier's data dir {self.data_dir} is its own {self.mount.mib} MiB ext4")
        self.redis_proxy.start()

    # ------------------------------------------------------------------ redis
    def start_redis(self) -> None:
        """redis-server on the rig's port (a restart comes back where the engine expects it).
        Raises ClusterError."""
        self.redis = start_redis_server(self.workdir / "redis", self.redis_port)

    def signal_redis(self, sig: int) -> None:
        if self.redis is not None and self.redis.poll() is None:
            os.kill(self.redis.pid, sig)
        if sig == signal.SIGKILL and self.redis is not None:
            self.redis.wait(timeout=10)

    # ------------------------------------------------------------------ engine
    def start_engine(self) -> float:
        """Start the engine and wait until it is healthy; returns the seconds that took."""
        env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
        env.update(OMP_NUM_THREADS="1", VLLM_CPU_OMP_THREADS_BIND="nobind", VLLM_CPU_KVCACHE_SPACE="1")
        cmd = self._cluster._engine_command(0, self.engine_port, f"ipc://{self.workdir}/events-0")
        t0 = time.monotonic()
        self.serving = False
        with open(self.engine_log, "ab") as log:
            self.engine = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                           env=env, start_new_session=True)
        while not _healthy(self.url):
            if self.engine.poll() is not None:
                raise ClusterError(f"the engine exited with {self.engine.returncode}:\n{_tail(self.engine_log)}")
            if time.monotonic() - t0 > self.spec.start_timeout_s:
                raise ClusterError(f"the engine is not healthy after {self.spec.start_timeout_s:.0f} s:\n"
                                   f"{_tail(self.engine_log)}")
            time.sleep(0.5)
        self.serving = True
        self.progress(f"engine pid {self.engine.pid} up at {self.url} after {time.monotonic() - t0:.0f} s")
        return time.monotonic() - t0

    def kill_engine(self) -> None:
        """SIGKILL the engine's whole process group (its engine-core child too)."""
        if self.engine is None:
            return
        self.serving = False
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.engine.pid, signal.SIGKILL)
        self.engine.wait(timeout=30)

    def engine_alive(self) -> bool:
        return self.engine is not None and self.engine.poll() is None

    def engine_pids(self) -> list[int]:
        """The engine's process and its descendants (vLLM's engine core runs kvtier); none while
        it starts (until healthy) or is down."""
        if not (self.serving and self.engine_alive()):
            return []
        out, todo = [], [self.engine.pid]
        while todo:
            pid = todo.pop()
            out.append(pid)
            with contextlib.suppress(OSError):
                for task in os.listdir(f"/proc/{pid}/task"):
                    with open(f"/proc/{pid}/task/{task}/children") as f:
                        todo.extend(int(c) for c in f.read().split())
        return out

    def close(self) -> None:
        if self.engine is not None and self.engine.poll() is None:
            _stop(self.engine, self.spec.stop_grace_s)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if self.engine is not None:
                os.killpg(self.engine.pid, signal.SIGKILL)
        if self.redis is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.redis.pid, signal.SIGCONT)
            _stop(self.redis, 5.0)
        self.redis_proxy.close()
        if self.mount is not None:
            try:
                self.mount.close()
            except MountError as exc:
                self.progress(f"kvtier's data dir stays mounted: {exc}")


def proc_stats(pids: list[int]) -> dict[str, float]:
    """RSS (MiB), open fds and threads summed over ``pids`` (from /proc; a vanished pid counts 0)."""
    rss = fds = threads = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        rss += int(line.split()[1])
                    elif line.startswith("Threads:"):
                        threads += int(line.split()[1])
            fds += len(os.listdir(f"/proc/{pid}/fd"))
    return {"rss_mib": rss / 1024, "fds": fds, "threads": threads}
