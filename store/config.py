"""Store configuration: one frozen dataclass, validated once.

The settings layer (read only by :meth:`StoreConfig.from_env`, keys in
:data:`ENV_KEYS`): keyword arguments > ``KVTIER_<KEY>`` variables (``KVTIER_IO_ENGINE``,
``KVTIER_QUEUE_DEPTH``, ``KVTIER_DIRECT_IO``, ``KVTIER_PREPARE_SLOTS``, ``KVTIER_DURABLE``,
``KVTIER_REMOTE_URL``, ``KVTIER_REMOTE_DOMAIN``, ``KVTIER_REMOTE_WRITE``, ``KVTIER_REMOTE_KEY``,
``KVTIER_REMOTE_KEY_FILE``, ``KVTIER_REMOTE_ENCRYPT``) > the config file (``KVTIER_CONFIG``) > the defaults; see
:mod:`kvtier.settings` and docs/config.md.  A bad value raises ``ValueError`` naming the key
and its source.  (The remote tier also reads the two key variables itself when a config names
no key: engine plugins that build their ``StoreConfig`` directly get the key from the environment.)
"""
from __future__ import annotations

import enum
import os
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path

from kvtier.util.choices import member

ALIGN = 4096            # O_DIRECT alignment for offsets, lengths and buffer addresses
HEADER_SECTOR = 4096    # the slot header's own sector (store/record.py), ahead of the block


class IoEngineKind(str, enum.Enum):
    """Which I/O engine the NVMe tier runs (``io_engine``)."""
    AUTO = "auto"           # io_uring if the kernel allows it, else threads
    IO_URING = "io_uring"   # io_uring, or fail
    THREADS = "threads"     # the preadv/pwritev thread pool

    def __str__(self) -> str:
        return self.value


class Switch(str, enum.Enum):
    """A feature that is on, off, or on where the machine allows it (``direct_io``, ``pin_host``)."""
    AUTO = "auto"           # on where allowed, else off (with a warning)
    ON = "on"               # on, or fail
    OFF = "off"

    def __str__(self) -> str:
        return self.value


class RemoteWrite(str, enum.Enum):
    """Which blocks go to the remote tier (``remote_write``)."""
    EXPLICIT = "explicit"   # those put with ``tier="remote"`` (the lifecycle publishes them)
    THROUGH = "through"     # also every block written locally

    def __str__(self) -> str:
        return self.value


# the fields the settings layer (KVTIER_* variables, the config file) may set; see from_env
ENV_KEYS = ("io_engine", "direct_io", "queue_depth", "prepare_slots", "durable", "remote_url", "remote_domain",
            "remote_write", "remote_key", "remote_key_file", "remote_encrypt", "nvme_throttle_gbps")


def round_up(n: int, align: int = ALIGN) -> int:
    return -(-n // align) * align


@dataclass(frozen=True)
class StoreConfig:
    """Where and how big.  All sizes are bytes.

    root:        data directory (created if missing): slab files + LMDB index.
    host_bytes:  host frame pool size; 0 is valid (every put goes to NVMe).
    nvme_bytes:  NVMe tier disk budget: slab bytes, slot headers included
                 (slab files grow lazily up to this).  Each slot is one
                 4096-byte header sector (in the slab's header region) plus
                 the block rounded up to 4096 (``slot_bytes``), so the header
                 costs one sector per block: 1/17 of the slots at 64 KiB
                 blocks, 1/257 at 1 MiB.  (The last slab's header region is
                 full-size, up to ``slab_bytes / slot_bytes`` sectors.)
    block_bytes: size of every block; data passed to ``put`` must be exactly
                 this long.  Host frames are it rounded up to 4096 (``frame_bytes``).
    io_engine:   "auto" (io_uring if the kernel allows it, else threads),
                 "io_uring" (fail if unavailable) or "threads" (preadv/pwritev pool).
    queue_depth: I/Os in flight per batch.
    io_bytes:    largest single coalesced I/O (>= 1 MiB recommended).
    slab_bytes:  size of one slab file (rounded to whole slots).
    direct_io:   "auto" (O_DIRECT, buffered+fdatasync with a warning if the
                 filesystem refuses it), "on" (fail if refused), "off".
    durable:     fdatasync slab data before its index entry commits, and
                 commit the index durably (see ``index_metasync``).
    prepare_slots: write zeros over the never-used slots of slab files the
                 store creates, in idle disk time (store/slotprep.py), so first
                 puts overwrite written extents instead of paying the
                 unwritten-extent conversion of a fallocated file (ext4/XFS;
                 measured 1.2-1.5x faster first fills).  Costs one extra write
                 of each new slab, only while the disk is idle.  Default off.
    index_metasync: also flush LMDB's meta page at every commit (two flushes
                 per commit instead of one).  False (default, MDB_NOMETASYNC):
                 the commit's data pages are flushed before it returns, the
                 meta page is flushed by the next commit, a periodic flush or
                 ``close()``.  A SIGKILL loses nothing (the page cache
                 survives); a power loss may roll back the last commit(s)
                 (those blocks read as misses -- never wrong bytes; the index
                 stays consistent).  True: every completed put survives power loss.
    nvme_throttle_gbps: emulate an NVMe device this many GB/s fast (reads and
                 writes together; the real I/O still happens, then waits out the
                 rest: store/throttle.py), for benchmarks of slower disks.  None
                 (default): the disk's own speed.
    pin_host:    "auto" (cudaHostRegister when CUDA is available), "on", "off".
    index_map_bytes: initial LMDB map size; it doubles whenever it fills.
    staging_bytes: reusable, pre-faulted staging memory for ``prepare_store``
                 to NVMe and ``prepare_load`` of NVMe blocks that do not land in
                 host frames (allocated at first use; pinned like the host pool).
                 A request it cannot hold gets fresh memory instead.
    remote_url:  a shared remote tier below host and NVMe (None: none), e.g.
                 ``redis://host:6379``, ``redis://h1:p1,h2:p2`` (Redis Cluster),
                 ``unix:///path.sock``, ``mooncake://master:port?metadata=...``
                 (docs/remote.md).  Never in ``repr`` (it may hold a password).
    remote_domain: isolation domain (deployment or tenant salt) of the remote
                 tier's values; stores with different domains never read each
                 other's blocks.  "" (default): every store naming the remote shares.
    remote_write: "explicit" (blocks go remote via ``put(tier="remote")`` or
                 ``publish``) or "through" (every put is also published).
    remote_key:  the domain's secret (str or bytes, >= 16 bytes): every remote
                 value is sealed with a MAC over header and payload and named
                 from the key (store/remote/auth.py).  None: ``remote_key_file``,
                 then ``KVTIER_REMOTE_KEY`` / ``KVTIER_REMOTE_KEY_FILE``; with
                 none of them the tier trusts every client of the server.
                 Never in ``repr``.
    remote_key_file: a file holding the secret (a trailing newline is ignored).
    remote_encrypt: write remote values encrypted (AES-256-GCM over header and
                 payload) instead of only authenticated; needs a key (``BadRemoteKey``
                 at open without one).  None (default): ``KVTIER_REMOTE_ENCRYPT``
                 (1 / 0) decides when the store opens.
    """

    root: str | os.PathLike
    host_bytes: int = 1 << 30
    nvme_bytes: int = 8 << 30
    block_bytes: int = 1 << 20
    io_engine: IoEngineKind = IoEngineKind.AUTO
    queue_depth: int = 16
    io_bytes: int = 4 << 20
    slab_bytes: int = 1 << 30
    direct_io: Switch = Switch.AUTO
    durable: bool = True
    prepare_slots: bool = False
    index_metasync: bool = False
    pin_host: Switch = Switch.AUTO
    index_map_bytes: int = 16 << 20
    staging_bytes: int = 64 << 20
    remote_url: str | None = field(default=None, repr=False)
    remote_domain: str = field(default="", repr=False)
    remote_write: RemoteWrite = RemoteWrite.EXPLICIT
    remote_key: str | bytes | None = field(default=None, repr=False)
    remote_key_file: str | os.PathLike | None = field(default=None, repr=False)
    remote_encrypt: bool | None = None
    nvme_throttle_gbps: float | None = None

    def __post_init__(self) -> None:
        for name in ("host_bytes", "nvme_bytes", "block_bytes", "queue_depth",
                     "io_bytes", "slab_bytes", "index_map_bytes", "staging_bytes"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"StoreConfig.{name} must be a non-negative int, got {v!r}")
        if self.block_bytes <= 0:
            raise ValueError("StoreConfig.block_bytes must be > 0")
        if self.queue_depth < 1 or self.queue_depth > 4096:
            raise ValueError(f"StoreConfig.queue_depth must be in 1..4096, got {self.queue_depth}")
        for name, kind in (("io_engine", IoEngineKind), ("direct_io", Switch), ("pin_host", Switch),
                           ("remote_write", RemoteWrite)):
            object.__setattr__(self, name, member(kind, getattr(self, name), field=f"StoreConfig.{name}"))
        if self.index_map_bytes < (64 << 10):
            raise ValueError("StoreConfig.index_map_bytes must be >= 64 KiB")
        if self.remote_url is not None:
            from .remote.url import parse_remote_url
            parse_remote_url(self.remote_url)        # BadRemoteURL (a ValueError) names what is wrong
        if not isinstance(self.remote_domain, str):
            raise ValueError("StoreConfig.remote_domain must be a str")
        if self.remote_key is not None:
            from .remote.auth import MIN_KEY_BYTES, BadRemoteKey
            if not isinstance(self.remote_key, (str, bytes)):
                raise BadRemoteKey("StoreConfig.remote_key must be str or bytes")
            if len(self.remote_key.encode() if isinstance(self.remote_key, str) else self.remote_key) < MIN_KEY_BYTES:
                raise BadRemoteKey(f"StoreConfig.remote_key must be at least {MIN_KEY_BYTES} bytes")
        if self.remote_encrypt is not None and not isinstance(self.remote_encrypt, bool):
            raise ValueError(f"StoreConfig.remote_encrypt must be a bool or None, got {self.remote_encrypt!r}")
        t = self.nvme_throttle_gbps
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t < float("inf")):
            raise ValueError(f"StoreConfig.nvme_throttle_gbps must be a number > 0 or None, got {t!r}")

    @classmethod
    def from_env(cls, root: str | os.PathLike, **kw) -> "StoreConfig":
        """Like the constructor, with the settings layer (:mod:`kvtier.settings`) under ``kw``:
        ``kw`` > ``KVTIER_*`` variables > the config file (``KVTIER_CONFIG``) > the defaults, for
        the keys in :data:`ENV_KEYS`.  ``remote_key`` and ``remote_key_file`` are one choice: either
        in ``kw`` keeps both out of the lower layers.

        Raises:
            ValueError: a bad value in a variable or the config file (the key and its source named),
                or a bad configuration (as the constructor).
        """
        from kvtier.settings import layered
        skip = set(kw) | ({"remote_key", "remote_key_file"} if {"remote_key", "remote_key_file"} & set(kw) else set())
        found = layered([k for k in ENV_KEYS if k not in skip])
        if "remote_key" in found and "remote_key_file" in found:
            del found["remote_key_file"]            # the key itself wins over a file naming it
        return cls(root=root, **found, **kw)

    def with_(self, **kw) -> "StoreConfig":
        return replace(self, **kw)

    @cached_property
    def root_path(self) -> Path:
        return Path(self.root)

    @cached_property
    def frame_bytes(self) -> int:
        """Bytes per host frame and per block in a slot (block rounded up to 4096)."""
        return round_up(self.block_bytes)

    @cached_property
    def slot_bytes(self) -> int:
        """Bytes per NVMe slot: the header sector, then the block's frame."""
        return HEADER_SECTOR + self.frame_bytes

    @cached_property
    def host_frames(self) -> int:
        return self.host_bytes // self.frame_bytes

    @cached_property
    def nvme_slots(self) -> int:
        return self.nvme_bytes // self.slot_bytes

    @cached_property
    def slots_per_slab(self) -> int:
        return max(1, self.slab_bytes // self.slot_bytes)

    @cached_property
    def slots_per_io(self) -> int:
        """How many contiguous slots one coalesced I/O may cover (two iovec
        entries per slot, header and block: at most IOV_MAX/2)."""
        return max(1, min(self.io_bytes // self.slot_bytes, 512))
