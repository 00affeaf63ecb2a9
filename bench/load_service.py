"""Load benchmark of the control-plane service, loopback only, bounded in
request count and time.

1. Start ``kvtier serve --port 0 --json`` as a subprocess on 127.0.0.1 with a
   fresh data dir (or the one given) and teach it a few tools' durations.
2. Hammer each endpoint with ``clients`` concurrent asyncio clients (a lean
   HTTP/1.1 keep-alive client, one connection each) until ``requests``
   answers or ``max_seconds``:
   ``GET /healthz`` first, as the ceiling of the HTTP stack in this run, then
   ``GET /v1/tools/{tool}/forecast``, ``POST /v1/decisions`` and a
   ``pause`` + ``resume`` cycle.  Every answer must be 2xx (errors counted).
3. In-process (no HTTP): register ``paused`` trajectories in a
   :class:`ServiceState`, then time ``decide`` + ``forecast`` per pause.

Numbers are ratios against the healthz ceiling measured in the same run; the
load generator shares the machine's cores with the server, so absolute
requests/s understate a dedicated server.
"""
from __future__ import annotations

import asyncio
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable

from kvtier.util.stats import percentile

TOOLS = ("bash", "str_replace_editor", "web_search", "python", "human_review")
# (median seconds, log-sd) per tool: shapes after the TraceLab aggregates
# (per-call p50 0.3 s, long tail to minutes) and SWE-agent step times.
_SHAPES = {"bash": (0.5, 1.0), "str_replace_editor": (0.001, 0.5), "web_search": (2.0, 0.8),
           "python": (3.0, 1.2), "human_review": (80.0, 1.5)}
MODEL = "llama-3.1-8b"


@dataclass(frozen=True)
class LoadConfig:
    clients: int = 64
    requests: int = 4000          # per endpoint
    max_seconds: float = 60.0     # per endpoint
    paused: int = 10_000          # in-process timing: trajectories paused first
    data_dir: str | None = None
    seed: int = 7


def _start_server(data_dir: str) -> tuple[subprocess.Popen, str]:
    env = dict(os.environ)
    env.pop("KVTIER_TOKEN", None)
    proc = subprocess.Popen([sys.executable, "-m", "kvtier", "serve", "--host", "127.0.0.1", "--port", "0",
                             "--data-dir", data_dir, "--json", "--log-level", "warning"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            cwd=str(Path(__file__).resolve().parent.parent))
    line = proc.stdout.readline() if proc.stdout else ""
    if not line:
        err = proc.stderr.read() if proc.stderr else ""
        proc.kill()
        raise RuntimeError(f"kvtier serve did not start: {err.strip()[-500:]}")
    return proc, json.loads(line)["url"]


class _Conn:
    """A minimal HTTP/1.1 keep-alive client on one asyncio connection.

    The load generator shares the CPU with the server; httpx's async client
    spends several CPU-milliseconds per request at 64 connections, which would
    measure the client, not the service.  This one spends tens of microseconds:
    it writes one request and reads one Content-Length-framed answer.
    """

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        head = f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\n"
        if body is not None:
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        self.writer.write(head.encode() + b"\r\n" + (body or b""))
        assert self.reader is not None
        status_line = await self.reader.readline()
        if not status_line:
            raise ConnectionError("server closed the connection")
        status = int(status_line.split()[1])
        length = 0
        close = False
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"connection" and value.strip().lower() == b"close":
                close = True
        data = await self.reader.readexactly(length) if length else b""
        if close:
            await self.close()
        return status, data

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            try:
                await self.writer.wait_closed()
            except OSError:
                pass
        self.reader = self.writer = None


async def _hammer(url: str, clients: int, total: int, max_s: float,
                  make: Callable[[_Conn, int], Awaitable[int]], on_done: Callable[[], None] | None) -> dict:
    from urllib.parse import urlsplit
    u = urlsplit(url)
    conns = [_Conn(u.hostname or "127.0.0.1", u.port or 80) for _ in range(clients)]
    lat: list[float] = []
    errors = 0
    issued = 0
    deadline = time.perf_counter() + max_s

    async def worker(conn: _Conn) -> None:
        nonlocal issued, errors
        while issued < total and time.perf_counter() < deadline:
            i = issued
            issued += 1
            t0 = time.perf_counter()
            try:
                status = await make(conn, i)
            except (OSError, ConnectionError, ValueError, asyncio.IncompleteReadError):
                status = 599
                await conn.close()
            lat.append(time.perf_counter() - t0)
            if not (200 <= status < 300):
                errors += 1
            if on_done:
                on_done()

    # Connect every client first, so connection set-up is not timed.
    await asyncio.gather(*(c.request("GET", "/healthz") for c in conns))
    t_start = time.perf_counter()
    await asyncio.gather(*(worker(c) for c in conns))
    elapsed = time.perf_counter() - t_start
    await asyncio.gather(*(c.close() for c in conns))
    n = len(lat)
    return {"requests": n, "errors": errors, "seconds": elapsed, "rps": n / elapsed if elapsed > 0 else 0.0,
            "p50_ms": percentile(lat, 0.50) * 1e3, "p99_ms": percentile(lat, 0.99) * 1e3}


def _endpoints() -> dict[str, Callable[[_Conn, int], Awaitable[int]]]:
    async def healthz(c: _Conn, i: int) -> int:
        return (await c.request("GET", "/healthz"))[0]

    async def forecast(c: _Conn, i: int) -> int:
        return (await c.request("GET", f"/v1/tools/{TOOLS[i % len(TOOLS)]}/forecast"))[0]

    async def decision(c: _Conn, i: int) -> int:
        body = {"tool": TOOLS[i % len(TOOLS)], "context_tokens": 1000 + (i * 7919) % 120_000, "model": MODEL,
                "hbm_pressure": (i % 10) / 10}
        return (await c.request("POST", "/v1/decisions", json.dumps(body).encode()))[0]

    async def pause_resume(c: _Conn, i: int) -> int:
        tid = f"load-{i}"
        body = {"tool": TOOLS[i % len(TOOLS)], "context_tokens": 4096, "model": MODEL}
        st, _ = await c.request("POST", f"/v1/trajectories/{tid}/pause", json.dumps(body).encode())
        if st != 200:
            return st
        return (await c.request("POST", f"/v1/trajectories/{tid}/resume", b'{"wait_s": 0.5}'))[0]

    return {"healthz": healthz, "forecast": forecast, "decision": decision, "pause_resume": pause_resume}


def _teach(url: str, rng: random.Random, per_tool: int = 64) -> None:
    import httpx
    with httpx.Client(base_url=url, timeout=30.0) as http:
        for tool in TOOLS:
            med, sd = _SHAPES[tool]
            for _ in range(per_tool):
                r = http.post(f"/v1/tools/{tool}/observations", json={"wait_s": med * math.exp(rng.gauss(0, sd))})
                r.raise_for_status()


def _in_process(cfg: LoadConfig, data_dir: str, rng: random.Random) -> dict:
    from kvtier.tiering.service.state import DecideRequest, ServiceState, StateConfig
    with ServiceState(StateConfig(data_dir=Path(data_dir) / "inproc")) as st:
        for tool in TOOLS:
            med, sd = _SHAPES[tool]
            for _ in range(64):
                st.observe(tool, med * math.exp(rng.gauss(0, sd)))
        t0 = time.perf_counter()
        for i in range(cfg.paused):
            st.pause(f"p{i}", TOOLS[i % len(TOOLS)],
                     DecideRequest(tool=TOOLS[i % len(TOOLS)], context_tokens=2048 + i % 50_000, model=MODEL))
        pause_s = time.perf_counter() - t0
        lat: list[float] = []
        n = min(cfg.requests, 5000)
        for i in range(n):
            req = DecideRequest(tool=TOOLS[i % len(TOOLS)], context_tokens=1000 + (i * 7919) % 120_000,
                                model=MODEL, hbm_pressure=(i % 10) / 10)
            t = time.perf_counter()
            st.decide(req)
            st.forecast(req.tool)
            lat.append(time.perf_counter() - t)
        return {"paused": st.stats()["paused"], "pause_per_s": cfg.paused / pause_s if pause_s > 0 else 0.0,
                "calls": n, "decide_forecast_p50_us": percentile(lat, 0.5) * 1e6,
                "decide_forecast_p99_us": percentile(lat, 0.99) * 1e6}


def run_load(cfg: LoadConfig, *, progress: bool = False) -> dict:
    """Run the whole benchmark; returns the JSON-ready result."""
    rng = random.Random(cfg.seed)
    with tempfile.TemporaryDirectory(prefix="kvtier-load-") as tmp:
        data_dir = cfg.data_dir or tmp
        proc, url = _start_server(str(Path(data_dir) / "served"))
        out: dict[str, Any] = {"clients": cfg.clients, "requests_per_endpoint": cfg.requests, "endpoints": {}}
        try:
            _teach(url, rng)
            eps = _endpoints()
            bar = None
            if progress:
                from rich.progress import Progress
                bar = Progress(transient=True, console=_stderr_console())
                bar.start()
            try:
                for name, make in eps.items():
                    task = bar.add_task(name, total=cfg.requests) if bar else None
                    cb = (lambda t=task: bar.advance(t)) if bar else None
                    out["endpoints"][name] = asyncio.run(_hammer(url, cfg.clients, cfg.requests, cfg.max_seconds,
                                                                 make, cb))
            finally:
                if bar:
                    bar.stop()
        finally:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
        ceiling = out["endpoints"]["healthz"]["rps"]
        for name, r in out["endpoints"].items():
            r["rps_vs_healthz"] = r["rps"] / ceiling if ceiling > 0 else math.nan
        if cfg.paused > 0:
            out["in_process"] = _in_process(cfg, data_dir, rng)
        out["cpu_count"] = os.cpu_count()
        return out


def _stderr_console() -> Any:
    from kvtier.util.console import make_console
    return make_console(stderr=True)


def print_table(result: dict) -> None:
    from rich.table import Table

    from kvtier.util.console import make_console
    t = Table(title=f"kvtier service under load ({result['clients']} concurrent clients, loopback)")
    for c in ("endpoint", "requests", "errors", "req/s", "x healthz", "p50 ms", "p99 ms"):
        t.add_column(c, justify="right" if c != "endpoint" else "left")
    for name, r in result["endpoints"].items():
        t.add_row(name, str(r["requests"]), str(r["errors"]), f"{r['rps']:.0f}", f"{r['rps_vs_healthz']:.2f}",
                  f"{r['p50_ms']:.1f}", f"{r['p99_ms']:.1f}")
    con = make_console()
    con.print(t)
    ip = result.get("in_process")
    if ip:
        con.print(f"in-process decide+forecast with {ip['paused']} paused trajectories: "
                  f"p50 {ip['decide_forecast_p50_us']:.0f} us, p99 {ip['decide_forecast_p99_us']:.0f} us "
                  f"({ip['calls']} calls)")


if __name__ == "__main__":  # pragma: no cover
    from kvtier.cli.main import main
    sys.exit(main(["bench", "service", *sys.argv[1:]]))
