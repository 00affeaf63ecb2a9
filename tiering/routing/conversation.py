"""The proxy's side of the conversation hints: the hint on the way in, the tool on the way out.

For a chat request with tools (or tool results) the proxy asks :class:`ConversationTap`
for a :class:`RequestTap`, forwards its ``body``, and shows it the engine's answer::

    proxy (event loop)                       RequestTap                      ConversationHints
    request body (JSON)      ------------->  ConversationTap.request  --->   on_request: the hint
    forward tap.body         <-------------  (the forecast hint added unless the client sent one)
    engine answers           ------------->  start(url, status, headers)
    each chunk, after the client has it -->  chunk(bytes)             --->   stream.feed (SSE), or
                                                                               the JSON kept (bounded)
    the answer ends          ------------->  end()                    --->   stream.end / on_response
    (a tool was named that is not the forecast: retag(tid))  ------------>   one Retag per turn
                                             POST engine/v1/completions, in the background

The retag goes to the engine that served the turn (docs/conversation-hints.md: the
lifecycle plans the pause again on the true tool).  Nothing here may fail or delay
the proxied request: every call is guarded (a failure is counted, logged at debug,
and the tap goes quiet), a tap parses a chunk only after the client has it, only
a 200 answer in plain encoding is read, a JSON answer is kept up to ``max_body``
bytes, and at most ``max_retags`` retags are in flight (more are dropped, counted);
each is bounded by ``retag_timeout_s`` and cancelled at :meth:`ConversationTap.close`.
Event-loop thread only (the hints have their own lock).
"""
from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from typing import Any, Mapping

from kvtier.tiering.conversation import ConversationHints, Retag, StreamWatch
from kvtier.tiering.conversation.hint import RETAG_PATH

log = logging.getLogger(__name__)


def carries_tools(kind: str, doc: Mapping[str, Any]) -> bool:
    """A chat request whose conversation the hints read: it offers ``tools``
    (or legacy ``functions``) or carries tool results."""
    if kind != "chat":
        return False
    if doc.get("tools") or doc.get("functions"):
        return True
    msgs = doc.get("messages")
    return isinstance(msgs, list) and any(isinstance(m, Mapping) and m.get("role") in ("tool", "function")
                                          for m in msgs)


class NoTap:
    """A request the hints do not read: forwarded as it came, its answer unread."""

    def __init__(self, body: bytes) -> None:
        self.body = body

    def start(self, url: str, status: int, headers: Mapping[str, str]) -> None:
        pass

    def chunk(self, data: bytes) -> None:
        pass

    def end(self) -> None:
        pass


class RequestTap:
    """One chat request's hint and its answer's reader (see the module doc).  Never raises."""

    def __init__(self, owner: "ConversationTap", body: bytes, tid: str | None, model: object, client: Any,
                 auth: Mapping[str, str]) -> None:
        self.body = body
        self._owner, self._tid, self._model, self._client, self._auth = owner, tid, model, client, dict(auth)
        self._url: str | None = None
        self._watch: StreamWatch | None = None
        self._json: bytearray | None = None

    def start(self, url: str, status: int, headers: Mapping[str, str]) -> None:
        """The engine at ``url`` answers: read a 200 in plain encoding, as SSE or JSON."""
        try:
            if self._tid is None or status != 200 or headers.get("content-encoding", "identity") != "identity":
                return
            self._url = url
            if headers.get("content-type", "").startswith("text/event-stream"):
                self._watch = self._owner.hints.stream(self._tid)
            else:
                self._json = bytearray()
        except Exception as exc:
            self._failed("start", exc)

    def chunk(self, data: bytes) -> None:
        try:
            if self._watch is not None:
                if self._watch.feed(data):
                    self._retag()
            elif self._json is not None:
                if len(self._json) + len(data) > self._owner.max_body:
                    self._json = None
                    self._owner.counters["answers_too_long"] += 1
                else:
                    self._json += data
        except Exception as exc:
            self._failed("chunk", exc)

    def end(self) -> None:
        try:
            if self._watch is not None:
                self._watch.end()
            elif self._json is not None:
                self._owner.hints.on_response(self._tid, json.loads(self._json))
            else:
                return
            self._owner.counters["answers_read"] += 1
            self._retag()
        except Exception as exc:
            self._failed("end", exc)

    def _retag(self) -> None:
        r = self._owner.hints.retag(self._tid)
        if r is not None and self._url is not None:
            self._owner.send_retag(self._client, self._url, r, self._model, self._auth)

    def _failed(self, where: str, exc: Exception) -> None:
        self._watch = self._json = None       # quiet from now on
        self._owner.failed(where, exc)


class ConversationTap:
    """The router's :class:`~kvtier.tiering.conversation.ConversationHints` on its
    requests, and the retags it sends (see the module doc)."""

    def __init__(self, hints: ConversationHints | None = None, *, max_body: int = 8 << 20, max_retags: int = 64,
                 retag_timeout_s: float = 10.0) -> None:
        self.hints = hints if hints is not None else ConversationHints()
        self.max_body, self.max_retags, self.retag_timeout_s = int(max_body), int(max_retags), float(retag_timeout_s)
        self.counters: Counter[str] = Counter()
        self._retags: set[asyncio.Task] = set()

    def request(self, kind: str, doc: Mapping[str, Any], body: bytes, client: Any,
                auth: Mapping[str, str]) -> RequestTap | NoTap:
        """The tap of one request (``doc``: its parsed ``body``; ``client``: the httpx
        client and ``auth`` the headers a retag goes with).  Never raises."""
        try:
            if not carries_tools(kind, doc):
                return NoTap(body)
            fwd = self.hints.on_request(doc)
            if fwd.hint is not None:
                body = json.dumps(fwd.body).encode()
                self.counters["hints_added"] += 1
            return RequestTap(self, body, fwd.trajectory_id, doc.get("model"), client, auth)
        except Exception as exc:
            self.failed("request", exc)
            return NoTap(body)

    def send_retag(self, client: Any, url: str, r: Retag, model: object, auth: Mapping[str, str]) -> None:
        """POST ``r`` to the engine at ``url`` in the background (dropped past ``max_retags``)."""
        if len(self._retags) >= self.max_retags:
            self.counters["retags_dropped"] += 1
            return
        task = asyncio.get_running_loop().create_task(self._post(client, url + RETAG_PATH, r.body(model), auth))
        self._retags.add(task)
        task.add_done_callback(self._retags.discard)

    async def _post(self, client: Any, url: str, body: dict, auth: Mapping[str, str]) -> None:
        try:
            resp = await client.post(url, json=body, headers=dict(auth), timeout=self.retag_timeout_s)
            self.counters["retags_sent" if resp.status_code == 200 else "retags_refused"] += 1
        except Exception as exc:       # the engine gone, a timeout: the pause keeps its forecast plan
            self.counters["retags_failed"] += 1
            log.debug("conversation hints: a retag to %s failed: %s", url, exc)

    def failed(self, where: str, exc: Exception) -> None:
        self.counters[f"errors_{where}"] += 1
        log.debug("conversation hints: %s failed: %s: %s", where, type(exc).__name__, exc)

    async def close(self) -> None:
        """Cancel the retags in flight."""
        tasks = list(self._retags)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def metrics(self) -> list[tuple[str, str, str, float]]:
        """(name, type, help, value) rows for the router's ``/metrics``."""
        c, s = self.counters, self.hints.stats()
        return [("conversation_hints_added_total", "counter", "chat requests forwarded with the router's hint",
                 c["hints_added"]),
                ("conversation_answers_read_total", "counter", "answers whose tool calls were read", c["answers_read"]),
                ("conversation_retags_sent_total", "counter", "retags the engine took", c["retags_sent"]),
                ("conversation_retags_lost_total", "counter", "retags refused, failed or dropped",
                 c["retags_refused"] + c["retags_failed"] + c["retags_dropped"]),
                ("conversation_errors_total", "counter", "tap failures (the request went on)",
                 sum(v for k, v in c.items() if k.startswith("errors_")) + sum(
                     v for k, v in s.items() if isinstance(v, int) and k.startswith("rejected:"))),
                ("conversation_trajectories", "gauge", "trajectories the hints track", s.get("trajectories", 0))]
