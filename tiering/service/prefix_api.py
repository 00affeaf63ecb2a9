"""Prefix routing over HTTP: the cluster prefix directory and figure 7's scoring.

    engines / stores ──POST /v1/prefix/events──▶ PrefixDirectory (hash -> worker -> medium)
    router / proxy   ──POST /v1/prefix/route───▶ winner, its match, every candidate's score
    operator         ──GET  /v1/prefix/stats

Events follow vLLM's KV-event schema as JSON (``{"type": "BlockStored", "block_hashes":
[...], "medium": "GPU"}``; hashes as hex strings or integers).  :func:`subscribe_engines` also
feeds the directory from engines' own KV event streams (vLLM's ``--kv-events-config``, ZMQ):
their blocks are keyed by vLLM's block hashes, which a route then gives as ``chunk_hashes``
(vLLM's integers, ``chunk_tokens`` = the engine's block size).  The route takes a
prompt as token ids (hashed here into 16-token chunks, ``namespace`` seeding the chain)
or as its chunk hashes, plus the candidate workers and their loads.  The directory is in
memory (rebuilt from the events after a restart), bounded, and guarded by one lock.
"""
from __future__ import annotations

import threading
from typing import Annotated, Any, Literal, Optional, Union

from fastapi import FastAPI
from pydantic import Field, StringConstraints

from kvtier.tiering.prefix.chunks import chunk_hashes
from kvtier.tiering.prefix.directory import PrefixDirectory
from kvtier.tiering.prefix.score import Weights

from .models import _Request, _Strict
from .state import Unprocessable

MAX_TOKENS = 2_000_000
MAX_CHUNKS = 200_000
MAX_WORKERS = 1024
MAX_EVENTS = 10_000
MAX_HASHES_PER_EVENT = 100_000

Worker = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.:@+\-/]{1,128}$")]
# vLLM's KV-event storage medium ("GPU", "CPU", "DISK", ...), the engine's label, not a kvtier Tier
EventMedium = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_\-]{1,32}$")]
HashIn = Union[Annotated[str, StringConstraints(pattern=r"^[0-9a-fA-F]{2,128}$")],
               Annotated[int, Field(ge=-(2 ** 255), le=2 ** 256)]]


class BlockStoredIn(_Request):
    type: Literal["BlockStored"]
    block_hashes: list[HashIn] = Field(max_length=MAX_HASHES_PER_EVENT)
    parent_block_hash: Optional[HashIn] = None
    token_ids: list[int] = Field(default_factory=list, max_length=MAX_HASHES_PER_EVENT * 64)
    block_size: int = Field(default=0, ge=0, le=1 << 20)
    lora_id: Optional[int] = None
    medium: Optional[EventMedium] = None


class BlockRemovedIn(_Request):
    type: Literal["BlockRemoved"]
    block_hashes: list[HashIn] = Field(max_length=MAX_HASHES_PER_EVENT)
    medium: Optional[EventMedium] = None


class AllBlocksClearedIn(_Request):
    type: Literal["AllBlocksCleared"]


EventIn = Annotated[Union[BlockStoredIn, BlockRemovedIn, AllBlocksClearedIn], Field(discriminator="type")]


class EventBatchIn(_Request):
    worker: Worker
    ts: float = 0.0
    events: list[EventIn] = Field(max_length=MAX_EVENTS)


class EventsOut(_Strict):
    applied: int
    hashes: int


class CandidateIn(_Request):
    worker: Worker
    load: float = Field(ge=0.0, le=1e12)


class RouteIn(_Request):
    tokens: Optional[list[Annotated[int, Field(ge=0, lt=2 ** 32)]]] = Field(default=None, max_length=MAX_TOKENS)
    chunk_hashes: Optional[list[HashIn]] = Field(default=None, max_length=MAX_CHUNKS)
    prompt_tokens: Optional[int] = Field(default=None, ge=0, le=MAX_TOKENS * 8)
    chunk_tokens: int = Field(default=16, ge=1, le=4096)
    namespace: str = Field(default="", max_length=256)
    workers: list[CandidateIn] = Field(min_length=1, max_length=MAX_WORKERS)
    mu: float = Field(default=0.5, ge=0.0, le=1.0)
    gamma: float = Field(default=1.0, gt=0.0, le=100.0)
    load_max: Optional[float] = Field(default=None, gt=0.0, le=1e12)


class RouteOut(_Strict):
    worker: str
    matched_tokens: int
    matched_chunks: int
    prompt_tokens: int
    prefill_tokens: int
    skipped_chunks: int
    hit: float
    scores: dict[str, float]
    matches: dict[str, int]


class PrefixStatsOut(_Strict):
    hashes: int
    workers: list[str]
    events_applied: int
    forgotten: int


def register(app: FastAPI, auth: list, errors: dict[int, Any], directory: PrefixDirectory | None = None) -> None:
    """Add the prefix routes to ``app`` (POSTs behind ``auth``).  The directory and its lock are
    ``app.state.prefix_directory`` / ``app.state.prefix_lock``."""
    d = directory if directory is not None else PrefixDirectory()
    lock = threading.Lock()
    app.state.prefix_directory, app.state.prefix_lock = d, lock

    @app.post("/v1/prefix/events", response_model=EventsOut, dependencies=auth, responses=errors, tags=["prefix"])
    def events(body: EventBatchIn) -> EventsOut:
        """Apply one worker's KV-event batch (vLLM's schema) to the prefix directory."""
        evs = [e.model_dump() for e in body.events]
        with lock:
            try:
                n = d.apply(body.worker, evs)
            except ValueError as exc:
                raise Unprocessable(str(exc)) from None
            return EventsOut(applied=n, hashes=len(d))

    @app.post("/v1/prefix/route", response_model=RouteOut, dependencies=auth, responses=errors, tags=["prefix"])
    def route(body: RouteIn) -> RouteOut:
        """Score the candidate workers for a prompt: mu * Match/S - (1 - mu) * (L/Lmax)^gamma."""
        if (body.tokens is None) == (body.chunk_hashes is None):
            raise Unprocessable("give exactly one of tokens and chunk_hashes")
        if len({w.worker for w in body.workers}) != len(body.workers):
            raise Unprocessable("a worker is listed twice")
        if body.tokens is not None:
            hashes = chunk_hashes(body.tokens, body.chunk_tokens, seed=body.namespace.encode())
            prompt = body.prompt_tokens if body.prompt_tokens is not None else len(body.tokens)
        else:
            hashes = list(body.chunk_hashes)
            prompt = body.prompt_tokens
        with lock:
            try:
                r = d.route(hashes, {w.worker: w.load for w in body.workers}, chunk_tokens=body.chunk_tokens,
                            prompt_tokens=prompt, weights=Weights(body.mu, body.gamma), load_max=body.load_max)
            except ValueError as exc:
                raise Unprocessable(str(exc)) from None
        return RouteOut(worker=r.worker, matched_tokens=r.matched_tokens, matched_chunks=r.matched_chunks,
                        prompt_tokens=r.prompt_tokens, prefill_tokens=r.prefill_tokens,
                        skipped_chunks=r.skipped_chunks, hit=r.hit, scores=r.scores, matches=r.matches)

    @app.get("/v1/prefix/stats", response_model=PrefixStatsOut, tags=["prefix"])
    def stats() -> PrefixStatsOut:
        with lock:
            return PrefixStatsOut(hashes=len(d), workers=d.workers(), events_applied=d.events_applied,
                                  forgotten=d.forgotten)


def subscribe_engines(app: FastAPI, endpoints: dict[str, str]) -> Any:
    """Feed ``app``'s prefix directory from engines' KV event streams (name -> ZMQ endpoint) and
    return the started :class:`~kvtier.tiering.routing.subscriber.EventSubscriber` (the caller
    stops it).  A block with locality ``REMOTE`` counts as the shared tier (medium ``REMOTE``).
    Repeated announcements are not counted here: a block leaves at its first removal (a miss,
    never a wrong route).  Raises ValueError for an endpoint ZMQ cannot connect to."""
    from kvtier.tiering.routing.events import BlockRemoved, BlockStored
    from kvtier.tiering.routing.subscriber import EventSubscriber

    d, lock = app.state.prefix_directory, app.state.prefix_lock

    def medium(ev) -> str:
        return "REMOTE" if (ev.locality or "").upper() == "REMOTE" else (ev.medium or "GPU")

    def sink(worker: str, events) -> None:
        evs = [{"type": "BlockStored", "block_hashes": e.block_hashes, "medium": medium(e)}
               if isinstance(e, BlockStored) else
               {"type": "BlockRemoved", "block_hashes": e.block_hashes, "medium": medium(e)}
               if isinstance(e, BlockRemoved) else {"type": "AllBlocksCleared"} for e in events]
        with lock:
            d.apply(worker, evs)

    def restarted(worker: str) -> None:
        with lock:
            d.cleared(worker)

    sub = EventSubscriber(endpoints, sink, on_restart=restarted)
    sub.start()
    return sub
