"""The engines behind the router: where each one is, whether it answers, how loaded it is.

Each engine's ``/metrics`` is polled (every ``interval_s``): a 200 puts the engine in (or back)
and sets its queue from vLLM's gauges, summed over their label sets::

    queue = vllm:num_requests_waiting + vllm:num_requests_running

Anything else (refused, timed out, not 200) takes it out until a later poll answers.  The proxy
also takes an engine out at once when a connection to it fails.  The load the score sees is
``max(queue, in_flight)``: ``in_flight`` counts this router's own requests to the engine, so a
burst between two polls is not all sent to the engine that looked idle.

Owned by the proxy's event loop: every field is read and written on that thread only.
"""
from __future__ import annotations

import asyncio
import logging
import math
import re
import time
from dataclasses import dataclass
from typing import Any, Sequence

from .config import EngineSpec

log = logging.getLogger(__name__)

WAITING = "vllm:num_requests_waiting"
RUNNING = "vllm:num_requests_running"
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def parse_queue(text: str) -> tuple[float, float]:
    """(waiting, running) from a Prometheus text page: each gauge summed over its samples,
    0 where absent.  Pure; lines that do not parse are ignored."""
    waiting = running = 0.0
    for line in text.splitlines():
        if not line.startswith("vllm:num_requests_"):
            continue
        m = _SAMPLE.match(line)
        if m is None:
            continue
        try:
            v = float(m.group(3))
        except ValueError:
            continue
        if not math.isfinite(v) or v < 0:
            continue
        if m.group(1) == WAITING:
            waiting += v
        elif m.group(1) == RUNNING:
            running += v
    return waiting, running


@dataclass
class Engine:
    """One engine's state (event-loop thread only)."""

    spec: EngineSpec
    up: bool = False
    waiting: float = 0.0
    running: float = 0.0
    in_flight: int = 0
    routed: int = 0
    taken_out: int = 0
    put_back: int = 0
    last_error: str = "not polled yet"
    last_poll: float = 0.0

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def load(self) -> float:
        return max(self.waiting + self.running, float(self.in_flight))


class EnginePool:
    """The engines, in the order given.  Raises ValueError for no engines or a name twice."""

    def __init__(self, specs: Sequence[EngineSpec]) -> None:
        if not specs:
            raise ValueError("the router needs at least one engine")
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise ValueError(f"an engine is given twice: {sorted(n for n in names if names.count(n) > 1)[0]}")
        self.engines: list[Engine] = [Engine(s) for s in specs]
        self._by_name = {e.name: e for e in self.engines}

    def __getitem__(self, name: str) -> Engine:
        return self._by_name[name]

    def up(self) -> list[Engine]:
        return [e for e in self.engines if e.up]

    def mark_down(self, e: Engine, why: str) -> None:
        if e.up:
            e.taken_out += 1
        e.up, e.last_error = False, why

    def mark_up(self, e: Engine) -> None:
        if not e.up and e.taken_out > e.put_back:
            e.put_back += 1
        e.up, e.last_error = True, ""

    async def poll_once(self, client: Any, timeout_s: float) -> None:
        """Poll every engine's ``/metrics`` at once (``client``: an httpx.AsyncClient)."""
        await asyncio.gather(*(self._poll(client, e, timeout_s) for e in self.engines))

    async def _poll(self, client: Any, e: Engine, timeout_s: float) -> None:
        import httpx
        e.last_poll = time.time()
        try:
            r = await client.get(e.spec.url + "/metrics", timeout=timeout_s)
        except httpx.HTTPError as exc:
            self.mark_down(e, f"/metrics: {type(exc).__name__}: {exc}")
            return
        if r.status_code != 200:
            self.mark_down(e, f"/metrics answered {r.status_code}")
            return
        e.waiting, e.running = parse_queue(r.text)
        self.mark_up(e)

    async def run(self, client: Any, interval_s: float, timeout_s: float) -> None:
        """Poll forever (cancel to stop); a poll that fails unexpectedly is logged, the next one runs."""
        while True:
            try:
                await self.poll_once(client, timeout_s)
            except Exception:
                log.exception("polling the engines failed; polling again in %.1f s", interval_s)
            await asyncio.sleep(interval_s)
