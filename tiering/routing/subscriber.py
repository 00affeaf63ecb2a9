"""The engines' KV event streams, read by one thread: one ZMQ SUB socket per engine.

::

    engine A PUB ──SUB──┐
    engine B PUB ──SUB──┼── poller (thread "kvtier-events") ── decode ── sink(engine, events)
    engine C PUB ──SUB──┘

Each SUB connects to the engine's ``--kv-events-config`` endpoint (``tcp://host:port``; the
engine binds ``tcp://*:port``) and takes every topic.  ZMQ reconnects on its own (100 ms,
backing off to 5 s), so an engine that restarts is read again; its sequence numbers start over,
which the thread reads as a restart and calls ``on_restart(engine)`` (the directory forgets what
that engine held locally).  A gap in the sequence (batches lost to the publisher's high-water
mark) is counted.  Memory is bounded: at most ``hwm`` messages queue per socket and a message
over ``max_message_bytes`` drops the connection (ZMQ reconnects).  A message that does not
decode, or that the sink rejects, is counted and skipped: nothing a publisher sends stops the
thread.

Fields: ``stats`` is written by the thread and read by anyone (ints; a reader may see one
batch behind).  ``start``/``stop`` from the owner's thread.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from kvtier.extras import require

from .events import Event, MalformedFrame, decode_frames

log = logging.getLogger(__name__)

Sink = Callable[[str, Sequence[Event]], object]


@dataclass
class StreamStats:
    """One engine's stream, as the thread saw it."""

    endpoint: str
    batches: int = 0
    events: int = 0
    malformed: int = 0
    skipped_events: int = 0
    gaps: int = 0
    restarts: int = 0
    last_seq: int = -1


class EventSubscriber:
    """See the module docstring.  ``endpoints``: engine name -> ZMQ endpoint.
    Raises ValueError for an endpoint ZMQ cannot connect to (at :meth:`start`)."""

    def __init__(self, endpoints: Mapping[str, str], sink: Sink, *,
                 on_restart: Callable[[str], object] | None = None, hwm: int = 10_000,
                 max_message_bytes: int = 64 << 20, poll_ms: int = 100) -> None:
        self._zmq = require("zmq", extra="router", feature="the KV event subscriber")
        self.endpoints = dict(endpoints)
        self.sink = sink
        self.on_restart = on_restart
        self.hwm, self.max_message_bytes, self.poll_ms = hwm, max_message_bytes, poll_ms
        self.stats = {name: StreamStats(ep) for name, ep in self.endpoints.items()}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._ctx = None

    def start(self) -> None:
        """Connect every socket and start the thread.  Raises ValueError for a bad endpoint."""
        zmq = self._zmq
        self._ctx = zmq.Context()
        socks = {}
        try:
            for name, ep in self.endpoints.items():
                s = self._ctx.socket(zmq.SUB)
                s.setsockopt(zmq.LINGER, 0)
                s.setsockopt(zmq.RCVHWM, self.hwm)
                s.setsockopt(zmq.MAXMSGSIZE, self.max_message_bytes)
                s.setsockopt(zmq.RECONNECT_IVL, 100)
                s.setsockopt(zmq.RECONNECT_IVL_MAX, 5000)
                s.setsockopt(zmq.SUBSCRIBE, b"")
                socks[s] = name
                try:
                    s.connect(ep)
                except zmq.ZMQError as exc:
                    raise ValueError(f"cannot connect to KV events of {name} at {ep!r}: {exc}") from None
        except BaseException:
            for s in socks:
                s.close(0)
            self._ctx.term()
            raise
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, args=(socks,), name="kvtier-events", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the thread and close the sockets (idempotent)."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(timeout_s)
        self._thread = None

    def _run(self, socks: dict) -> None:
        zmq = self._zmq
        poller = zmq.Poller()
        for s in socks:
            poller.register(s, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                for s, _ in poller.poll(self.poll_ms):
                    name = socks[s]
                    while True:
                        try:
                            frames = s.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        self._one(name, frames)
        finally:
            for s in socks:
                s.close(0)
            self._ctx.term()

    def _one(self, name: str, frames: list[bytes]) -> None:
        st = self.stats[name]
        try:
            batch = decode_frames(frames)
        except MalformedFrame as exc:
            st.malformed += 1
            log.debug("KV events of %s: %s", name, exc)
            return
        if batch.seq < st.last_seq and st.last_seq >= 0:
            st.restarts += 1
            if self.on_restart is not None:
                self.on_restart(name)
        elif st.last_seq >= 0 and batch.seq > st.last_seq + 1:
            st.gaps += 1
        st.last_seq = batch.seq
        st.skipped_events += batch.unknown + batch.bad
        try:
            self.sink(name, batch.events)
        except Exception as exc:        # a sink error skips the batch, never the thread
            st.malformed += 1
            log.warning("KV events of %s: batch %d skipped: %s", name, batch.seq, exc)
            return
        st.batches += 1
        st.events += len(batch.events)
