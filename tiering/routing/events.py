"""vLLM's KV event stream, decoded: one ZMQ message -> a :class:`Batch` of events.

The publisher (``vllm/distributed/kv_events.py``, ``ZmqEventPublisher``) sends each batch as
three frames::

    [topic bytes] [sequence number: 8 bytes, big-endian] [payload: msgpack]
    payload = [ts, [event, ...], data_parallel_rank?]                (array-like KVEventBatch)
    event   = {"type": "BlockStored", "block_hashes": [...], "medium": "CPU", ...}   (tagged map)

The structs here mirror vLLM's field names and keep only what routing reads; msgspec skips the
other fields, so a newer vLLM with more fields decodes too.  Each event is decoded on its own:
an event of a type this module does not know is skipped and counted (``Batch.unknown``), an
event that does not decode is skipped and counted (``Batch.bad``); the rest of the batch
applies.  ``medium`` and ``locality`` are any strings (vLLM's ``GPU``/``CPU``/``STORAGE``,
kvtier's ``DISK``/``REMOTE``, what another tier names itself).  Thread-safe (decoders are
per call).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Union

import msgspec

Hash = Union[bytes, int]


class BlockStored(msgspec.Struct, tag="BlockStored", frozen=True):
    block_hashes: list[Hash] = []
    parent_block_hash: Union[Hash, None] = None
    block_size: int = 0
    medium: Union[str, None] = None
    locality: Union[str, None] = None


class BlockRemoved(msgspec.Struct, tag="BlockRemoved", frozen=True):
    block_hashes: list[Hash] = []
    medium: Union[str, None] = None
    locality: Union[str, None] = None


class AllBlocksCleared(msgspec.Struct, tag="AllBlocksCleared", frozen=True):
    pass


Event = Union[BlockStored, BlockRemoved, AllBlocksCleared]
KNOWN = frozenset({"BlockStored", "BlockRemoved", "AllBlocksCleared"})


class _Payload(msgspec.Struct, array_like=True):
    ts: float
    events: list[msgspec.Raw]
    data_parallel_rank: Union[int, None] = None


@dataclass(frozen=True)
class Batch:
    """One decoded message: its sequence number and the events that decoded, in order."""

    seq: int
    ts: float
    events: tuple[Event, ...]
    unknown: int = 0
    bad: int = 0


class MalformedFrame(ValueError):
    """A message that is not a vLLM KV event batch (wrong frame count, sequence or payload)."""


_payload = msgspec.msgpack.Decoder(_Payload)
_event = msgspec.msgpack.Decoder(Event)
_any = msgspec.msgpack.Decoder()


def decode_frames(frames: list[bytes]) -> Batch:
    """Decode one multipart message.  Raises MalformedFrame."""
    if len(frames) != 3:
        raise MalformedFrame(f"expected 3 frames (topic, seq, payload), got {len(frames)}")
    _topic, seq, payload = frames
    if len(seq) != 8:
        raise MalformedFrame(f"the sequence frame has {len(seq)} bytes, not 8")
    try:
        p = _payload.decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise MalformedFrame(f"payload is not a KVEventBatch: {exc}") from None
    events: list[Event] = []
    unknown = bad = 0
    for raw in p.events:
        try:
            events.append(_event.decode(raw))
        except (msgspec.DecodeError, msgspec.ValidationError):
            if _is_unknown_type(raw):
                unknown += 1
            else:
                bad += 1
    return Batch(int.from_bytes(seq, "big", signed=True), p.ts, tuple(events), unknown, bad)


def _is_unknown_type(raw: msgspec.Raw) -> bool:
    try:
        d = _any.decode(raw)
    except msgspec.DecodeError:
        return False
    return isinstance(d, dict) and isinstance(d.get("type"), str) and d["type"] not in KNOWN
