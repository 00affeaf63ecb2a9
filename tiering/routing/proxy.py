"""The router's HTTP face: an ASGI app that proxies OpenAI requests to the engine the score picks.

::

    POST /v1/chat/completions, /v1/completions
        read the body (<= max_body_bytes; 413) -> JSON object with messages / prompt (else 400)
        -> tokens from an engine's /tokenize -> block hashes -> Router.choose (503: none up)
        -> forward to the winner; a refused connection takes it out and tries the next
        -> the upstream's status, headers and body bytes back as they come (SSE chunk by chunk)
    GET /v1/models   forwarded to an engine that is up
    GET /health      200 while an engine is up, else 503; JSON of each engine's state
    GET /metrics     the router's Prometheus counters and gauges

Every response carries ``x-kvtier-engine`` (the engine's name) when an engine answered it.  A
client that disconnects cancels the forward: the upstream response is closed, so the engine
sees its client go and aborts the request.  Errors are the router's own only where no engine
answered (OpenAI's shape: ``{"error": {"message", "type", "code"}}``); an engine's errors pass
through unchanged.

Lifespan: start-up polls the engines once (so a router that accepts requests knows which are
up), then starts the poll loop and the event subscriber; shutdown stops both and closes the
HTTP client.  One event loop thread runs everything here; the subscriber's thread only feeds
the directory (which has its own lock).
"""
from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from kvtier.extras import require

from .config import RouterConfig
from .conversation import ConversationTap, NoTap, RequestTap
from .directory import BlockDirectory
from .hashing import BlockHasher
from .policies import make_policy, trajectory_key
from .pool import Engine, EnginePool
from .router import NoEngine, Router
from .tokens import prompt_tokens

log = logging.getLogger(__name__)

Scope = dict
Receive = Callable[[], Awaitable[dict]]
Send = Callable[[dict], Awaitable[None]]

POST_PATHS = {"/v1/chat/completions": "chat", "/v1/completions": "completions"}
_HOP = frozenset({b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te",
                  b"trailers", b"transfer-encoding", b"upgrade", b"host", b"content-length"})
_HOP_BACK = _HOP - {b"content-length"}


@dataclass
class Counters:
    """The router's own counts (event-loop thread only)."""

    bad_requests: int = 0
    no_engine: int = 0
    retries: int = 0
    upstream_errors: int = 0
    client_disconnects: int = 0
    tokenize_failures: int = 0
    prompt_tokens: int = 0
    matched_tokens: int = 0
    saved_tokens: float = 0.0


class _BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class RouterApp:
    """See the module docstring.  Raises ValueError (at start-up) for an events endpoint ZMQ
    cannot connect to."""

    def __init__(self, config: RouterConfig) -> None:
        self._httpx = require("httpx", feature="kvtier route")
        self.config = config
        self.directory = BlockDirectory(config.tiers, config.max_hashes)
        self.pool = EnginePool(config.engines)
        self.router = Router(self.directory, self.pool, BlockHasher(config.hash_algo, config.hash_seed),
                             weights=config.weights, load_max=config.load_max, block_size=config.block_size,
                             policy=make_policy(config.policy, weights=config.weights, load_max=config.load_max))
        self.counters = Counters()
        self.conversation = ConversationTap()      # hints for chat requests with tools (conversation.py)
        self.subscriber: Any = None
        self._client: Any = None
        self._poller: asyncio.Task | None = None

    # ------------------------------------------------------------------ lifespan
    async def startup(self) -> None:
        httpx = self._httpx
        self._client = httpx.AsyncClient(timeout=httpx.Timeout(10.0, read=None),
                                         limits=httpx.Limits(max_connections=None, max_keepalive_connections=256))
        await self.pool.poll_once(self._client, self.config.poll_timeout_s)
        self._poller = asyncio.create_task(self.pool.run(self._client, self.config.poll_interval_s,
                                                         self.config.poll_timeout_s))
        feeds = {e.name: e.events for e in self.config.engines if e.events}
        if feeds:
            from .subscriber import EventSubscriber
            self.subscriber = EventSubscriber(feeds, self.directory.apply, on_restart=self.directory.clear)
            self.subscriber.start()

    async def shutdown(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            await asyncio.gather(self._poller, return_exceptions=True)
        if self.subscriber is not None:
            self.subscriber.stop()
        await self.conversation.close()
        if self._client is not None:
            await self._client.aclose()

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                try:
                    await self.startup()
                except Exception as exc:
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                await self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    # ------------------------------------------------------------------ dispatch
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        if path in POST_PATHS:
            if method != "POST":
                await _error(send, 405, f"{path} takes POST")
                return
            await self._guarded(scope, receive, send, POST_PATHS[path])
        elif path in ("/health", "/metrics", "/v1/models"):
            if method != "GET":
                await _error(send, 405, f"{path} takes GET")
            elif path == "/health":
                await self._health(send)
            elif path == "/metrics":
                await _respond(send, 200, self.metrics_text().encode(), b"text/plain; version=0.0.4")
            else:
                await self._models(scope, receive, send)
        else:
            await _error(send, 404, f"no route {path}; the router serves /v1/chat/completions, "
                                    "/v1/completions, /v1/models, /health and /metrics", "not_found_error")

    async def _guarded(self, scope: Scope, receive: Receive, send: Send, kind: str) -> None:
        """Read the body, then run the forward while watching for the client to go."""
        try:
            body = await _read_body(receive, self.config.max_body_bytes)
        except _BadRequest as exc:
            self.counters.bad_requests += 1
            await _error(send, exc.status, str(exc))
            return
        except _Gone:
            self.counters.client_disconnects += 1
            return
        work = asyncio.create_task(self._route(scope, send, kind, body))
        gone = asyncio.create_task(_wait_disconnect(receive))
        done, _ = await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
        if work in done:
            gone.cancel()
            await asyncio.gather(gone, return_exceptions=True)
            work.result()
            return
        self.counters.client_disconnects += 1
        work.cancel()
        await asyncio.gather(work, return_exceptions=True)

    # ------------------------------------------------------------------ routing
    async def _route(self, scope: Scope, send: Send, kind: str, body: bytes) -> None:
        try:
            doc = _check_request(kind, body)
        except _BadRequest as exc:
            self.counters.bad_requests += 1
            await _error(send, exc.status, str(exc))
            return
        headers = _forward_headers(scope)
        up = sorted(self.pool.up(), key=lambda e: e.load)
        if not up:
            self.counters.no_engine += 1
            await _error(send, 503, "no engine is up", "service_unavailable")
            return
        auth = {k: v for k, v in headers.items() if k == "authorization"}
        tokens = await prompt_tokens(self._client, up[0].spec.url, kind, doc, auth, self.config.poll_timeout_s * 5)
        salt = doc.get("cache_salt")
        if tokens is None or not (salt is None or isinstance(salt, str)):
            self.counters.tokenize_failures += tokens is None
            hashes: dict[int, list[int]] = {}
        else:
            sizes = set(self.router.block_sizes(up).values())
            hashes = await asyncio.to_thread(self.router.hashes, tokens, sizes, salt)
        n_tokens = len(tokens) if tokens else 0
        tap = self.conversation.request(kind, doc, body, self._client, auth)   # forwards tap.body
        first = next((h[0] for h in hashes.values() if h), None)
        key = trajectory_key(doc, first)
        failed: set[str] = set()
        while True:
            try:
                d = self.router.choose(n_tokens, hashes, exclude=failed, key=key)
            except NoEngine as exc:
                self.counters.no_engine += 1
                await _error(send, 502 if failed else 503, f"{exc}" + (f" ({', '.join(sorted(failed))})"
                                                                         if failed else ""),
                             "bad_gateway" if failed else "service_unavailable")
                return
            e = d.engine
            if await self._forward(e, "POST", scope, tap.body, headers, send, tap):
                self.counters.prompt_tokens += n_tokens
                self.counters.matched_tokens += d.match.tokens
                self.counters.saved_tokens += d.match.saved_tokens
                return
            failed.add(e.name)
            self.counters.retries += 1

    async def _models(self, scope: Scope, receive: Receive, send: Send) -> None:
        for e in sorted(self.pool.up(), key=lambda e: e.load):
            if await self._forward(e, "GET", scope, b"", _forward_headers(scope), send):
                return
        self.counters.no_engine += 1
        await _error(send, 503, "no engine is up", "service_unavailable")

    async def _forward(self, e: Engine, method: str, scope: Scope, body: bytes, headers: dict[str, str],
                       send: Send, tap: RequestTap | NoTap = NoTap(b"")) -> bool:
        """Send the request to ``e`` and stream its answer back.  False when ``e`` could not be
        reached (it is taken out; nothing was sent to the client); True once the client has
        an answer (the engine's, or a 502 for a failure after connecting).  ``tap`` reads the
        answer after the client has each chunk (never raises)."""
        httpx = self._httpx
        url = e.spec.url + scope["path"]
        if scope.get("query_string"):
            url += "?" + scope["query_string"].decode("latin-1")
        req = self._client.build_request(method, url, content=body or None, headers=headers)
        e.in_flight += 1
        try:
            try:
                resp = await self._client.send(req, stream=True)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                self.pool.mark_down(e, f"{type(exc).__name__}: {exc}")
                return False
            except httpx.HTTPError as exc:
                self.counters.upstream_errors += 1
                await _error(send, 502, f"engine {e.name} failed: {type(exc).__name__}: {exc}", "bad_gateway")
                return True
            e.routed += 1
            try:
                hdrs = [(k, v) for k, v in resp.headers.raw if k.lower() not in _HOP_BACK]
                await send({"type": "http.response.start", "status": resp.status_code,
                            "headers": hdrs + [(b"x-kvtier-engine", e.name.encode())]})
                tap.start(e.spec.url, resp.status_code, resp.headers)
                try:
                    async for chunk in resp.aiter_raw():
                        await send({"type": "http.response.body", "body": chunk, "more_body": True})
                        tap.chunk(chunk)
                except httpx.HTTPError as exc:      # the engine went mid-answer: end what was sent
                    self.counters.upstream_errors += 1
                    log.warning("engine %s broke off its answer: %s", e.name, exc)
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                tap.end()
            finally:
                await resp.aclose()
            return True
        finally:
            e.in_flight -= 1

    # ------------------------------------------------------------------ reports
    async def _health(self, send: Send) -> None:
        engines = [{"engine": e.name, "url": e.spec.url, "up": e.up, "load": e.load, "waiting": e.waiting,
                    "running": e.running, "in_flight": e.in_flight, "routed": e.routed,
                    "last_error": e.last_error or None, "events": e.spec.events,
                    "held_blocks": self.directory.held_by(e.name)} for e in self.pool.engines]
        ok = any(e.up for e in self.pool.engines)
        await _respond(send, 200 if ok else 503, json.dumps({"status": "ok" if ok else "unavailable",
                                                             "engines": engines}).encode())

    def metrics_text(self) -> str:
        """The Prometheus page of ``GET /metrics``."""
        out: list[str] = []

        def fam(name: str, kind: str, help_: str, rows: list[tuple[str, float]]) -> None:
            out.append(f"# HELP {name} {help_}")
            out.append(f"# TYPE {name} {kind}")
            out.extend(f"{name}{lab} {val:g}" for lab, val in rows)

        per = [(f'{{engine="{e.name}"}}', e) for e in self.pool.engines]
        fam("kvtier_router_engine_up", "gauge", "1 while the engine answers /metrics",
            [(lab, float(e.up)) for lab, e in per])
        fam("kvtier_router_engine_load", "gauge", "the load the score sees: max(waiting + running, in flight)",
            [(lab, e.load) for lab, e in per])
        fam("kvtier_router_requests_total", "counter", "requests forwarded to the engine",
            [(lab, e.routed) for lab, e in per])
        fam("kvtier_router_engine_taken_out_total", "counter", "times the engine was taken out",
            [(lab, e.taken_out) for lab, e in per])
        fam("kvtier_router_engine_put_back_total", "counter", "times the engine was put back",
            [(lab, e.put_back) for lab, e in per])
        fam("kvtier_router_engine_held_blocks", "gauge", "block hashes the engine published locally",
            [(lab, self.directory.held_by(e.name)) for lab, e in per])
        stats = self.subscriber.stats if self.subscriber is not None else {}
        for name, attr, help_ in (("events", "events", "KV events applied"),
                                  ("event_batches", "batches", "KV event batches applied"),
                                  ("malformed_frames", "malformed", "KV event messages skipped as malformed"),
                                  ("skipped_events", "skipped_events", "events of unknown type or undecodable"),
                                  ("event_gaps", "gaps", "gaps in the publisher's sequence numbers"),
                                  ("publisher_restarts", "restarts", "publisher restarts seen")):
            fam(f"kvtier_router_{name}_total", "counter", help_,
                [(f'{{engine="{n}"}}', getattr(s, attr)) for n, s in stats.items()])
        fam("kvtier_router_directory_hashes", "gauge", "block hashes in the directory", [("", len(self.directory))])
        fam("kvtier_router_directory_forgotten_total", "counter", "hashes forgotten past the bound",
            [("", self.directory.forgotten)])
        c = self.counters
        for name, val, help_ in (("bad_requests", c.bad_requests, "requests refused as malformed"),
                                 ("no_engine", c.no_engine, "requests refused with no engine up"),
                                 ("retries", c.retries, "forwards retried after a refused connection"),
                                 ("upstream_errors", c.upstream_errors, "engine failures after connecting"),
                                 ("client_disconnects", c.client_disconnects, "clients gone before the end"),
                                 ("tokenize_failures", c.tokenize_failures, "requests routed on load alone"),
                                 ("prompt_tokens", c.prompt_tokens, "prompt tokens of routed requests"),
                                 ("matched_tokens", c.matched_tokens, "prefix tokens the winner held"),
                                 ("saved_tokens", c.saved_tokens, "tier-weighted prefix tokens the winner held")):
            fam(f"kvtier_router_{name}_total", "counter", help_, [("", val)])
        for name, kind, help_, val in self.conversation.metrics():
            fam(f"kvtier_router_{name}", kind, help_, [("", val)])
        return "\n".join(out) + "\n"


# ---------------------------------------------------------------------- helpers
class _Gone(Exception):
    """The client disconnected while sending its body."""


async def _read_body(receive: Receive, limit: int) -> bytes:
    parts, size = [], 0
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            raise _Gone()
        chunk = msg.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _BadRequest(413, f"request body over {limit} bytes")
        parts.append(chunk)
        if not msg.get("more_body", False):
            return b"".join(parts)


async def _wait_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def _check_request(kind: str, body: bytes) -> dict:
    """The body as a JSON object that names what to complete.  Raises _BadRequest (400)."""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise _BadRequest(400, f"the body is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise _BadRequest(400, f"the body must be a JSON object, got {type(doc).__name__}")
    if kind == "chat":
        msgs = doc.get("messages")
        if not isinstance(msgs, list) or not msgs or not all(isinstance(m, dict) for m in msgs):
            raise _BadRequest(400, "'messages' must be a non-empty list of message objects")
    else:
        p = doc.get("prompt")
        if not (isinstance(p, str) or (isinstance(p, list) and p)):
            raise _BadRequest(400, "'prompt' must be a string, a list of strings or a list of token ids")
    return doc


def _forward_headers(scope: Scope) -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in scope.get("headers", []):
        if k.lower() not in _HOP:
            out[k.decode("latin-1").lower()] = v.decode("latin-1")
    return out


async def _respond(send: Send, status: int, body: bytes, ctype: bytes = b"application/json") -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", ctype), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def _error(send: Send, status: int, message: str, kind: str = "invalid_request_error") -> None:
    await _respond(send, status, json.dumps({"error": {"message": message, "type": kind, "code": status}}).encode())
