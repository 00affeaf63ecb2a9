"""A block's in-memory bookkeeping and the checks every public call makes on its input.

``Entry`` fields are owned by the store lock (see ``TieredStore``).  The input
helpers raise ``BadKey``/``BadBuffer``/``ValueError`` and touch no store state.
"""
from __future__ import annotations

import ctypes
from typing import Sequence

from .errors import BadBuffer, BadKey
from .hostpool import buffer_address
from .keys import Namespace
from .types import Tier

MAX_KEY_BYTES = 64
NO_NAMESPACE = bytes(8)


class Entry:
    """A block's bookkeeping.  Owned by the store lock."""
    __slots__ = ("key", "length", "ns", "frame", "slot", "checksum", "last_access", "pins", "user_pins",
                 "visible", "dead", "demote_slot")

    def __init__(self, key: bytes, length: int, ns: bytes, now: float) -> None:
        self.key = key
        self.length = length
        self.ns = ns
        self.frame: int | None = None
        self.slot: int | None = None
        self.checksum: int | None = None
        self.last_access = now
        self.pins = 0
        self.user_pins = 0     # of ``pins``: the ones taken by ``pin()`` (released by ``unpin()``)
        self.visible = False   # False while a store is in flight
        self.dead = False      # dropped while pinned: resources freed at the last unpin
        self.demote_slot: int | None = None   # NVMe slot reserved by a demotion in flight





def check_key(key) -> bytes:
    """``key`` as bytes.  Raises ``BadKey`` unless it is 1..MAX_KEY_BYTES bytes."""
    if not isinstance(key, (bytes, bytearray, memoryview)):
        raise BadKey(f"keys are bytes, got {type(key).__name__}")
    key = bytes(key)
    if not 0 < len(key) <= MAX_KEY_BYTES:
        raise BadKey(f"keys are 1..{MAX_KEY_BYTES} bytes, got {len(key)}")
    return key


def check_keys(keys: Sequence) -> list[bytes]:
    """Validated keys (fast path for plain bytes of an allowed length).  Raises ``BadKey``."""
    out = []
    for k in keys:
        if type(k) is bytes and 0 < len(k) <= MAX_KEY_BYTES:
            out.append(k)
        else:
            out.append(check_key(k))
    return out


def check_namespace(namespace) -> bytes:
    """The 8-byte namespace tag.  Raises ``ValueError`` for anything but a
    ``Namespace``, up to 8 bytes, or None."""
    if namespace is None:
        return NO_NAMESPACE
    if isinstance(namespace, Namespace):
        return namespace.tag
    if isinstance(namespace, (bytes, bytearray)) and len(namespace) <= 8:
        return bytes(namespace).ljust(8, b"\0")
    raise ValueError("namespace must be a keys.Namespace, up to 8 bytes, or None")


def check_tier(tier, *, host_frames: int, nvme_slots: int) -> Tier:
    """The tier a call's ``tier=`` names in a store with ``host_frames`` frames and
    ``nvme_slots`` slots (None: host if it has frames, else NVMe).  Raises
    ``ValueError`` for an unknown tier, "remote" (a store with a remote tier
    handles it before this point) or a tier the store does not have."""
    if tier is None:
        return Tier.HOST if host_frames else Tier.NVME
    try:
        t = Tier(tier)
    except ValueError:
        raise ValueError(f"unknown tier {tier!r}; known: host, nvme, remote") from None
    if t is Tier.DEVICE:
        raise ValueError("tier='device': a store holds host, nvme and remote blocks (Tier.stored)")
    if t is Tier.REMOTE:
        raise ValueError("tier='remote' but this store has no remote_url")
    if t is Tier.HOST and not host_frames:
        raise ValueError("tier='host' but this store has host_bytes=0")
    if t is Tier.NVME and not nvme_slots:
        raise ValueError("tier='nvme' but this store has nvme_bytes=0")
    return t


def check_buffer(obj, block_bytes: int, writable: bool, what: str) -> memoryview:
    """A 1-D byte view of ``obj`` (exactly ``block_bytes``).  Raises ``BadBuffer``."""
    try:
        mv = memoryview(obj)
    except TypeError:
        mv = _tensor_view(obj, what)
        if mv is None:
            raise BadBuffer(f"{what} must support the buffer protocol or be a CPU torch.Tensor, "
                            f"got {type(obj).__name__}") from None
    if not mv.c_contiguous:
        raise BadBuffer(f"{what} must be C-contiguous")
    if writable and mv.readonly:
        raise BadBuffer(f"{what} is read-only")
    if mv.nbytes != block_bytes:
        raise BadBuffer(f"{what} is {mv.nbytes} bytes; this store's block_bytes is {block_bytes}")
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B")
    return mv


def _tensor_view(obj, what: str) -> memoryview | None:
    """A byte view of a contiguous CPU ``torch.Tensor`` (pinned or not) over its
    own memory -- no copy; the view keeps the tensor alive.  None if ``obj`` is
    no tensor (torch is never imported here: a tensor's class names its module).
    Raises ``BadBuffer`` for a tensor on another device or not contiguous."""
    if not type(obj).__module__.startswith("torch") or not hasattr(obj, "is_contiguous"):
        return None
    import torch

    if not isinstance(obj, torch.Tensor):
        return None
    if obj.device.type != "cpu":
        raise BadBuffer(f"{what} is a tensor on {obj.device}; the store takes CPU tensors")
    if not obj.is_contiguous():
        raise BadBuffer(f"{what} must be C-contiguous")
    flat = obj.detach().reshape(-1)
    if flat.numel() == 0:
        return memoryview(b"")
    return memoryview(flat.view(torch.uint8).numpy())


def check_buffers(objs: Sequence, block_bytes: int, writable: bool,
                  what: str) -> tuple[list[memoryview], list[int]]:
    """Validated 1-D byte views of ``objs`` and their addresses, in one pass
    (the batch hot path: a well-formed memoryview is taken as is).  Raises
    ``BadBuffer`` exactly as ``check_buffer`` does."""
    bb = block_bytes
    from_buffer, addressof = ctypes.c_char.from_buffer, ctypes.addressof
    views: list[memoryview] = []
    addrs: list[int] = []
    add_v, add_a = views.append, addrs.append
    for o in objs:
        if type(o) is not memoryview or o.nbytes != bb or o.ndim != 1 or o.format != "B" \
                or not o.c_contiguous or (writable and o.readonly):
            o = check_buffer(o, bb, writable, what)
        add_a(buffer_address(o) if o.readonly else addressof(from_buffer(o)))
        add_v(o)
    return views, addrs
