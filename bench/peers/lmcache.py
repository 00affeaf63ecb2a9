"""LMCache as a peer of ``kvtier bench tiers`` (``--peer lmcache``), in its own environment.

LMCache pins packages kvtier's users must not be forced onto (``numpy<=2.2.6``,
``prometheus_client<=0.24.1``), so the peer never runs in kvtier's interpreter:
:func:`ensure_env` creates (first use: a few minutes, from PyPI) or reuses a
plain virtual environment, without the system site-packages, under
``<peer env dir>/lmcache-<version>``, and :func:`measure` runs
``lmcache_driver.py`` there as a subprocess on the same bytes and block sizes
as kvtier's rows.  The peer env dir is ``--peer-env-dir``, else
``$KVTIER_PEER_ENV_DIR``, else ``$XDG_CACHE_HOME/kvtier/peers`` (``~/.cache/kvtier/peers``).

What is installed there: CPU torch, ``lmcache==<version> --no-deps`` (its
CUDA extension is only imported on CUDA hosts) and the packages its storage
layer imports (found by importing until nothing was missing), with LMCache's
own pins.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

LMCACHE_VERSION = "0.5.6"
TORCH_SPEC = "torch==2.13.0"          # pip picks the CPU build where it is on offer (the +cpu local version)
STORAGE_DEPS = ("pyyaml", "requests", "cachetools", "sortedcontainers", "numba", "numpy<=2.2.6",
                "prometheus_client<=0.24.1", "py-cpuinfo", "psutil", "aiohttp", "aiofile", "msgspec", "pyzmq",
                "transformers", "cryptography", "redis")
IMPORT_CHECK = ("import lmcache.v1.storage_backend.local_disk_backend, lmcache.v1.storage_backend.remote_backend, "
                "lmcache.v1.storage_backend.connector.redis_connector")
ENV_DIR_VAR = "KVTIER_PEER_ENV_DIR"
DRIVER = Path(__file__).with_name("lmcache_driver.py")
MARKER = "kvtier-peer.json"           # written last: an env without it is half-built and is rebuilt


class PeerUnavailable(RuntimeError):
    """The peer's environment cannot be built here (no PyPI, no venv); the message says why."""


def default_env_dir() -> Path:
    """``$KVTIER_PEER_ENV_DIR``, else ``$XDG_CACHE_HOME/kvtier/peers`` (``~/.cache/kvtier/peers``)."""
    from kvtier.util.paths import cache_dir
    return Path(os.environ.get(ENV_DIR_VAR) or cache_dir("peers"))


def _spec() -> dict:
    return {"lmcache": LMCACHE_VERSION, "torch": TORCH_SPEC, "deps": list(STORAGE_DEPS)}


def env_path(base: Path) -> Path:
    return Path(base) / f"lmcache-{LMCACHE_VERSION}"


def env_ready(base: Path) -> bool:
    """True when the env under ``base`` was built completely for this spec."""
    m = env_path(base) / MARKER
    try:
        return json.loads(m.read_text()) == _spec()
    except (OSError, ValueError):
        return False


def ensure_env(base: Path, log: Callable[[str], None] = lambda s: None) -> Path:
    """The peer env's python, building the env first if it is missing or half-built.

    Raises:
        PeerUnavailable: ``venv`` or ``pip`` failed (the last line of its output
            says why, e.g. PyPI cannot be reached)."""
    py = env_path(base) / "bin" / "python"
    if env_ready(base):
        return py
    try:
        Path(base).mkdir(parents=True, exist_ok=True)
        lock = open(Path(base) / f".lmcache-{LMCACHE_VERSION}.lock", "w")
    except OSError as exc:
        raise PeerUnavailable(f"cannot create the peer env dir {base}: {exc}") from None
    with lock:                        # one builder at a time (another process may be building it now)
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not env_ready(base):
            _build(env_path(base), py, log)
    return py


def _build(env: Path, py: Path, log: Callable[[str], None]) -> None:
    log(f"building LMCache {LMCACHE_VERSION}'s environment in {env} (first use; a few minutes)")
    t0 = time.perf_counter()
    steps = [("venv", [sys.executable, "-m", "venv", "--clear", str(env)]),
             ("torch (CPU)", [str(py), "-m", "pip", "install", "-q", TORCH_SPEC]),
             (f"lmcache=={LMCACHE_VERSION} --no-deps",
              [str(py), "-m", "pip", "install", "-q", "--no-deps", f"lmcache=={LMCACHE_VERSION}"]),
             ("LMCache's storage imports", [str(py), "-m", "pip", "install", "-q", *STORAGE_DEPS]),
             ("import check", [str(py), "-c", IMPORT_CHECK])]
    for i, (what, cmd) in enumerate(steps, 1):
        log(f"  [{i}/{len(steps)}] {what} ({time.perf_counter() - t0:.0f} s)")
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise PeerUnavailable(f"{what}: {exc}") from None
        if res.returncode:
            lines = [ln for ln in (res.stderr + res.stdout).splitlines()
                     if ln.strip() and not ln.startswith("WARNING: Location")]
            raise PeerUnavailable(f"{what} failed: {lines[-1] if lines else f'exit {res.returncode}'}")
    (env / MARKER).write_text(json.dumps(_spec()))
    log(f"  LMCache environment ready in {time.perf_counter() - t0:.0f} s")


def run_driver(py: Path, request: dict, src: bytes, work: Path, log: Callable[[str], None] = lambda s: None,
               timeout_s: float = 1800) -> dict:
    """Run the driver on ``src`` (written to ``work/src.bin``); returns its result document.

    Raises:
        RuntimeError: the driver failed (its last stderr line), timed out, or
            printed no result."""
    work.mkdir(parents=True, exist_ok=True)
    src_path = work / "src.bin"
    src_path.write_bytes(src)
    req = {**request, "src": str(src_path), "src_sha256": hashlib.sha256(src).hexdigest(),
           "data_dir": str(work)}
    envv = {**os.environ, "LMCACHE_LOG_LEVEL": os.environ.get("LMCACHE_LOG_LEVEL", "ERROR"),
            "PYTHONNOUSERSITE": "1"}
    envv.pop("PYTHONPATH", None)
    try:
        proc = subprocess.Popen([str(py), "-I", str(DRIVER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=envv, cwd=str(work))
    except OSError as exc:
        src_path.unlink(missing_ok=True)
        raise RuntimeError(f"cannot start the peer driver: {exc}") from None
    tail: list[str] = []

    def read_stderr() -> None:        # progress lines as they come; the last lines for an error
        for ln in proc.stderr:
            if ln.startswith("progress: "):
                log(ln.removeprefix("progress: ").strip())
            elif ln.strip():
                tail[:] = (tail + [ln.rstrip()])[-5:]
    reader = threading.Thread(target=read_stderr, name="peer-stderr", daemon=True)
    reader.start()
    killer = threading.Timer(timeout_s, proc.kill)
    killer.start()
    try:
        proc.stdin.write(json.dumps(req))
        proc.stdin.close()
        out = proc.stdout.read()
        rc = proc.wait()
    finally:
        killer.cancel()
        reader.join(10)
        src_path.unlink(missing_ok=True)
    if rc:
        why = f"ran past {timeout_s:.0f} s" if rc == -9 else (tail[-1] if tail else "")
        raise RuntimeError(f"peer driver exit {rc}: {why}")
    try:
        return json.loads(out)
    except ValueError:
        raise RuntimeError("the peer driver printed no result document") from None


PEER_BYTES = 64 << 20                 # per block size: the first 64 MiB of kvtier's source bytes (as the SGLang peer)
NOTE = ("LMCache {v} in its own environment ({env}); per block size the first {mib} MiB of the bytes kvtier's rows "
        "put, {w} untimed warm-up round(s), best of {r}, fresh keys per round, every block checked bit-exact. "
        "Each put allocates a MemoryObj from LMCache's CPU allocator, copies the block in and is timed until every "
        "completion callback fired; a get is batched_get_blocking plus the copy out. cpu: LocalCPUBackend hot cache. "
        "disk: LocalDiskBackend, one file per key, buffered writes, never fsynced (put_synced adds one os.sync() "
        "after the last callback, inside the timing; os.sync flushes the whole machine); read warm = just written, "
        "from the page cache; cold = after os.sync + POSIX_FADV_DONTNEED. disk_odirect: use_odirect (reads cold). "
        "redis: RemoteBackend, naive serde, over --remote with LMCache's redis:// connector; redis_resp: the same server "
        "through its native resp:// client. kvtier's side: NVMe put is durable (O_DIRECT, fdatasync, "
        "checksummed, LMDB index committed) and its get is O_DIRECT and checksum-verified, i.e. always cold; cpu "
        "rows compare kvtier's host tier.")


def _ratio(a, b):
    return a / b if a and b else None


def _with_kvtier(row: dict, host: dict, nvme: dict, remote: dict) -> dict:
    """Add the kvtier figures of the same block size and kvtier-over-peer ratios."""
    size = row["block_bytes"]
    kind = row["backend"]
    kv = (host if kind == "cpu" else remote if kind.startswith("redis") else nvme).get(size)
    if kv is None:
        return row
    out = {**row, "kvtier_row": "host" if kind == "cpu" else "remote" if kind.startswith("redis") else "nvme",
           "kvtier_put_gbps": kv["put_gbps"], "kvtier_get_gbps": kv["get_gbps"],
           "kvtier_put_vs_peer": _ratio(kv["put_gbps"], row["put_gbps"]),
           "kvtier_get_vs_peer": _ratio(kv["get_gbps"], row["get_gbps"])}
    if "put_synced_gbps" in row:
        out["kvtier_put_vs_peer_synced"] = _ratio(kv["put_gbps"], row["put_synced_gbps"])
    return out


def _single_redis(url: str | None) -> tuple[str | None, str | None]:
    """(the URL LMCache's Redis connectors take, None) or (None, why there is no redis row)."""
    if not url:
        return None, "--remote names no Redis server"
    from urllib.parse import urlsplit
    try:
        u = urlsplit(url)
        host, port = u.hostname, u.port or 6379
    except ValueError:
        return None, "--remote is not a redis:// URL"
    if u.scheme != "redis" or not host or "," in u.netloc:
        return None, "LMCache's peer rows drive one Redis server (redis://host:port), not " + u.scheme
    auth = f"{u.username or ''}:{u.password}@" if u.password else ""
    return f"redis://{auth}{host}:{port}", None


def lmcache_peer(sizes, total: int, repeat: int, src, host_rows, nvme_rows, data_dir: Path, *,
                 remote_url: str | None = None, remote_rows=(), env_dir: Path | None = None, warmup: int = 1,
                 log: Callable[[str], None] = lambda s: None) -> dict | str:
    """The ``peers.lmcache`` section: ``{"lmcache_version", "note", "rows"}``, or a one-line reason.

    ``src`` is kvtier's source buffer (bytes-like; its first ``min(total, 64 MiB)``
    bytes are used); ``*_rows`` are kvtier's rows of this run, by ``block_bytes``.
    Never raises: an environment that cannot be built is ``"unavailable: ..."``,
    a driver failure (including bytes that came back wrong) ``"failed: ..."``."""
    base = Path(env_dir) if env_dir else default_env_dir()
    redis_url, why_not = _single_redis(remote_url)
    try:
        py = ensure_env(base, log)
    except PeerUnavailable as exc:
        return f"unavailable: {exc}"
    nb = min(total, PEER_BYTES)
    sizes = [s for s in sizes if s <= nb]
    work = Path(data_dir) / "lmcache-peer"
    try:
        doc = run_driver(py, {"sizes": sizes, "total_bytes": nb, "repeat": repeat, "warmup": warmup,
                              "remote_url": redis_url}, bytes(memoryview(src)[:nb]), work, log)
    except RuntimeError as exc:
        return f"failed: {exc}"
    finally:
        import shutil
        shutil.rmtree(work, ignore_errors=True)
    src_mv = memoryview(src)
    for r in doc["rows"]:            # the driver's own check, repeated here on the bytes it read back
        if r.get("read_sha256") != hashlib.sha256(src_mv[:nb // r["block_bytes"] * r["block_bytes"]]).hexdigest():
            return f"failed: {r['backend']} {r['block_bytes']} B blocks: the bytes read back differ from the source"
    by = lambda rows: {r["block_bytes"]: r for r in rows}  # noqa: E731
    host, nvme, remote = by(host_rows), by(nvme_rows), by(remote_rows)
    note = NOTE.format(v=doc.get("lmcache_version"), env=env_path(base), mib=nb >> 20, w=warmup, r=repeat)
    note += f" Peer env torch {doc.get('torch_version')}."
    if why_not:
        note += f" No redis rows: {why_not}."
    return {"lmcache_version": doc.get("lmcache_version"), "note": note,
            "rows": [_with_kvtier(r, host, nvme, remote) for r in doc["rows"]]}


def print_rows(con, res: dict) -> None:
    """The ``peers.lmcache`` section as a rich table on ``con``."""
    from rich.table import Table
    t = Table(title=f"LMCache {res['lmcache_version']} beside kvtier (GB/s; ratio = kvtier / LMCache)")
    for c in ("backend", "read", "block", "put", "put+sync", "get", "kvtier put", "kvtier get",
              "put vs synced", "get vs peer"):
        t.add_column(c, justify="right")
    f = lambda v, x="": "" if v is None else f"{v:.2f}{x}"  # noqa: E731
    for r in res["rows"]:
        b = r["block_bytes"]
        t.add_row(r["backend"], r["read"], f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB",
                  f(r["put_gbps"]), f(r.get("put_synced_gbps")), f(r["get_gbps"]), f(r.get("kvtier_put_gbps")),
                  f(r.get("kvtier_get_gbps")), f(r.get("kvtier_put_vs_peer_synced"), "x"),
                  f(r.get("kvtier_get_vs_peer"), "x"))
    con.print(t)
    con.print(f"  ({res['note']})")
