"""A running ``vllm serve`` as a live engine: the in-process engine's
``generate`` contract over vLLM's OpenAI-compatible ``/v1/completions``.

    eng = HttpEngine("http://127.0.0.1:8000")
    info = eng.describe()                         # model, max_model_len, vLLM version
    r = eng.generate(token_ids, max_tokens=8, kv_transfer_params={"kvtier": {"tool": "pytest"}})
    r.tokens, r.cached_tokens, r.ttft_s

Every request is greedy (``temperature 0``, ``ignore_eos``: exactly
``max_tokens`` tokens), its prompt a list of token ids, and streamed: TTFT is
the client's time from sending the request to the first streamed token (the
network and the server's queue included).  The body carries
``kv_transfer_params`` (vLLM hands it to the server's KV connector: kvtier's
tool hints), ``return_token_ids`` (the output's ids in every chunk) and
``stream_options.include_usage`` (a last chunk with ``usage``); the prompt
tokens the server did not compute come from
``usage.prompt_tokens_details.cached_tokens``, which vLLM reports only when
started with ``--enable-prompt-tokens-details``.

Standard library only (``urllib``): the main environment needs no HTTP
package and no vLLM to drive a server.  Connections go straight to the
server, never through a proxy of the environment (``http_proxy``), which
would sit inside every measured TTFT.  Not thread-safe: one caller drives it.
"""
from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Sequence

from kvtier.engine_adapter.vllm_inprocess import Result

DETAILS_HINT = "start the server with --enable-prompt-tokens-details"


class ServerError(RuntimeError):
    """The server could not be reached, answered an HTTP error (its message
    included), timed out, or answered without what the benchmark needs."""


@dataclass(frozen=True)
class ServerInfo:
    """What the server tells about itself (``/v1/models``, ``/version``)."""
    url: str
    model: str
    max_model_len: int | None
    version: str | None


class HttpEngine:
    """A ``vllm serve`` at ``url`` (``http://host:port``, with or without a
    trailing ``/v1``).  ``timeout_s`` bounds every request: connecting, and
    each wait for the next bytes of an answer.  ``cache_salt`` goes with every
    request (vLLM folds it into its block hashes: requests with different
    salts share no cached block, in the engine's cache or a connector's).
    ``model``: the served model's name (default: asked at the first request)."""

    def __init__(self, url: str, *, timeout_s: float = 300.0, cache_salt: str | None = None,
                 model: str | None = None) -> None:
        if not url.startswith(("http://", "https://")):
            raise ServerError(f"{url!r} is not an http:// or https:// URL")
        base = url.rstrip("/")
        self.base = base[:-3] if base.endswith("/v1") else base
        self.timeout_s = timeout_s
        self.cache_salt = cache_salt
        self._model = model
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))   # never a proxy

    # ------------------------------------------------------------ what the server tells
    def describe(self) -> ServerInfo:
        """The served model (the first of ``/v1/models``), its context limit and
        the server's vLLM version (None where ``/version`` is absent).
        Raises ServerError."""
        doc = json.loads(self._get("/v1/models"))
        data = doc.get("data") if isinstance(doc, dict) else None
        if not data or not isinstance(data[0], dict) or "id" not in data[0]:
            raise ServerError(f"{self.base}/v1/models lists no model")
        self._model = str(data[0]["id"])
        mml = data[0].get("max_model_len")
        try:
            version = json.loads(self._get("/version")).get("version")
        except (ServerError, ValueError, AttributeError):   # no /version: not told
            version = None
        return ServerInfo(self.base, self._model, int(mml) if isinstance(mml, int) else None,
                          str(version) if version is not None else None)

    def metrics_text(self) -> str | None:
        """The Prometheus exposition at ``/metrics`` (None when the server has
        none: HTTP 404).  Raises ServerError for any other failure."""
        try:
            return self._get("/metrics")
        except _NotFound:
            return None

    # ------------------------------------------------------------ one request
    def generate(self, prompt: Sequence[int], *, max_tokens: int = 8,
                 kv_transfer_params: Mapping[str, Any] | None = None) -> Result:
        """Greedy decoding of ``prompt`` (token ids), streamed.  Raises
        ServerError (the server's message included) when the request fails or
        the answer lacks the output's token ids or the cached-token count."""
        if self._model is None:
            self.describe()
        body: dict[str, Any] = {
            "model": self._model, "prompt": list(prompt), "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
            "return_token_ids": True}
        if kv_transfer_params is not None:
            body["kv_transfer_params"] = dict(kv_transfer_params)
        if self.cache_salt is not None:
            body["cache_salt"] = self.cache_salt
        tokens: list[int] = []
        usage: Mapping[str, Any] | None = None
        ttft = None
        t0 = time.perf_counter()
        for chunk in self._stream("/v1/completions", body):
            for choice in chunk.get("choices") or ():
                ids = choice.get("token_ids")
                if ids is None and choice.get("text"):
                    raise ServerError("the server does not return the output's token ids (return_token_ids): "
                                      "the benchmark needs a vLLM OpenAI server that does (0.32 does)")
                if ids:
                    if ttft is None:
                        ttft = time.perf_counter() - t0
                    tokens.extend(int(t) for t in ids)
            if chunk.get("usage"):
                usage = chunk["usage"]
        total = time.perf_counter() - t0
        if usage is None:
            raise ServerError("the server's stream ended without usage (stream_options.include_usage)")
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        if cached is None:
            raise ServerError(f"the server does not report cached prompt tokens: {DETAILS_HINT}")
        return Result(tokens=tuple(tokens), prompt_tokens=int(usage.get("prompt_tokens", len(prompt))),
                      cached_tokens=int(cached), ttft_s=ttft if ttft is not None else total, total_s=total)

    # ------------------------------------------------------------ HTTP
    def _open(self, path: str, body: Mapping[str, Any] | None = None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base + path, data=data, method="POST" if data is not None else "GET",
                                     headers={"Content-Type": "application/json"} if data is not None else {})
        try:
            return self._opener.open(req, timeout=self.timeout_s)
        except urllib.error.HTTPError as exc:
            if exc.code == 404 and body is None:
                raise _NotFound(f"{self.base}{path}: HTTP 404: {_server_message(exc)}") from None
            raise ServerError(f"{self.base}{path}: HTTP {exc.code}: {_server_message(exc)}") from None
        except urllib.error.URLError as exc:
            raise ServerError(f"cannot reach {self.base}: {_reason(exc.reason)}") from None
        except (TimeoutError, socket.timeout):
            raise ServerError(f"{self.base}{path}: no answer within {self.timeout_s:g} s") from None
        except OSError as exc:
            raise ServerError(f"cannot reach {self.base}: {_reason(exc)}") from None

    def _get(self, path: str) -> str:
        with self._open(path) as r:
            return self._read(path, r.read).decode("utf-8", "replace")

    def _stream(self, path: str, body: Mapping[str, Any]) -> Iterator[dict]:
        """The JSON objects of a server-sent event stream, up to ``[DONE]``."""
        with self._open(path, body) as r:
            while True:
                line = self._read(path, r.readline)
                if not line:
                    return
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    return
                try:
                    chunk = json.loads(payload)
                except ValueError:
                    raise ServerError(f"{self.base}{path}: not a JSON event: {payload[:200]!r}") from None
                if isinstance(chunk, dict) and "error" in chunk:
                    raise ServerError(f"{self.base}{path}: {_message(chunk)}")
                yield chunk

    def _read(self, path: str, read: Callable[[], bytes]) -> bytes:
        try:
            return read()
        except (TimeoutError, socket.timeout):
            raise ServerError(f"{self.base}{path}: no answer within {self.timeout_s:g} s") from None
        except OSError as exc:
            raise ServerError(f"{self.base}{path}: the connection broke: {_reason(exc)}") from None


class _NotFound(ServerError):
    """A GET of a path the server does not have."""


def _reason(reason: Any) -> str:
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused (is `vllm serve` running there?)"
    if isinstance(reason, (TimeoutError, socket.timeout)):
        return "timed out"
    return getattr(reason, "strerror", None) or str(reason)


def _server_message(exc: urllib.error.HTTPError) -> str:
    try:
        text = exc.read().decode("utf-8", "replace")
    except OSError:
        return exc.reason or "no message"
    try:
        return _message(json.loads(text))
    except ValueError:
        return text.strip()[:500] or str(exc.reason)


def _message(doc: Any) -> str:
    """The message of vLLM's error object (``{"error": {"message": ...}}``, or
    a bare ``{"message": ...}`` / ``{"detail": ...}``)."""
    if isinstance(doc, dict):
        err = doc.get("error", doc)
        if isinstance(err, dict):
            for k in ("message", "detail"):
                if err.get(k):
                    return str(err[k])[:500]
        elif isinstance(err, str):
            return err[:500]
    return json.dumps(doc)[:500]
