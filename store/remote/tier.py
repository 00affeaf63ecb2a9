"""RemoteTier: verified, isolated, fault-tolerant blocks on a shared remote store.

What a block looks like remotely::

    name  = b"kvtier:" + hex(blake2b(block key, key=name salt, 16 bytes))
    value = record header (store/record.py, 112 bytes) + seal + raw payload
            header.namespace = the isolation domain's 8-byte tag
            seal = 32 bytes with a key (a MAC over header and payload), else none;
            with ``encrypt`` header and payload are AES-256-GCM ciphertext (auth.py)

* **Verified on every read.**  Header checksum, magic, version, the block's
  own key, the domain tag and the length must match, and then the seal (with
  a key) or the payload's xxh3 (without); anything else is a miss, the value
  is deleted and the caller's buffer zeroed.
* **Trust.**  With a secret key (``StoreConfig.remote_key``, a key file or
  ``KVTIER_REMOTE_KEY``; auth.py) the name salt, the tag and the MAC key
  derive from the key and the domain: a client of the server without the
  key can neither find a domain's values nor forge one.  Without a key the
  tier trusts every client of its server (the checks above only catch
  damage) and logs that once when it starts.  With ``encrypt`` (and a key)
  a client without the key reads no payload byte and no block key either;
  the ciphertext is staged in parts of ``STAGE_BYTES`` (values.Staging).
* **Isolation domain.**  ``domain`` (a deployment or tenant salt; "" by
  default) keys the names and sets the header tag: two domains never read
  each other's values.
* **Faults are misses.**  Calls go through a :class:`CircuitBreaker`; while it
  is not up they return at once (misses, nothing stored); a failing call
  trips it.  A rejected password is the breaker's ``auth_failed`` state.
  No method raises because of the remote; ``stats()`` tells.  Bytes of a
  value that did not verify, or of a call that failed part-way, never stay
  in the caller's buffer (zeroed before ``fetch`` returns).

Threading: every method is thread-safe; counters are guarded by ``_lock``;
the backend guards its own connections.
"""
from __future__ import annotations

import hashlib
import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

from kvtier.util.breaker import AuthRejected, CircuitBreaker

from .. import record
from .arenas import Loan
from .auth import DomainKeys
from .backend import MISSING, RemoteAuthFailed, RemoteBackend, RemoteUnavailable
from .url import RemoteSpec, parse_remote_url
from .values import ArenaPool, HeaderCheck, Heads, Staging

log = logging.getLogger(__name__)
RECORD = record.HEADER_BYTES
STAGE_BYTES = 16 << 20       # an encrypting tier's ciphertext is staged in parts of this many bytes


def domain_tag(domain: str, secret: bytes | None = None) -> bytes:
    """The 8-byte tag of an isolation domain (the header's namespace field)."""
    return DomainKeys(secret, domain).tag


def make_backend(spec: RemoteSpec) -> RemoteBackend:
    """The backend for a parsed URL (lazy imports: redis / mooncake)."""
    if spec.kind == "mooncake":
        from .mooncake_backend import MooncakeBackend
        return MooncakeBackend(spec)
    from .redis_backend import RedisBackend
    return RedisBackend(spec)


@dataclass(frozen=True)
class RemoteStats:
    url: str                 # redacted: never a password
    backend: str
    state: str               # up | down | connecting | auth_failed | closed
    trips: int               # times the breaker opened
    consecutive_failures: int  # failed calls + probes since it was last up
    last_error: str | None
    down_for_s: float | None
    puts: int                # values accepted by the server
    put_failures: int        # refused (full, OOM) or lost to a failed call
    hits: int
    misses: int
    corrupt_dropped: int     # values that failed verification (deleted)
    skipped_while_down: int  # blocks answered without a call because the tier was down
    bytes_put: int
    bytes_read: int
    keyed: bool = False      # values sealed with a secret key
    encrypted: bool = False  # values written encrypted (AES-256-GCM)
    auth_failures: int = 0   # times the server rejected the credentials

    def as_dict(self) -> dict:
        return asdict(self)


class RemoteTier:
    """See the module docstring.  ``block_bytes``: the payload size of every value."""

    def __init__(self, backend: RemoteBackend, block_bytes: int, domain: str = "",
                 url: str | None = None, secret: bytes | None = None, encrypt: bool = False) -> None:
        self.backend = backend
        self.block_bytes = block_bytes
        self.url = url or backend.name
        keys = DomainKeys(secret, domain)
        self._salt, self._tag = keys.salt, keys.tag
        self._sealer = keys.sealer(encrypt)        # BadRemoteKey: encrypt without a key
        self.head_bytes = RECORD + self._sealer.seal_bytes
        self._lock = threading.Lock()
        self._seq = itertools.count(time.time_ns())
        self._c = dict(puts=0, put_failures=0, hits=0, misses=0, corrupt_dropped=0,
                       skipped_while_down=0, bytes_put=0, bytes_read=0)
        self._pool: ThreadPoolExecutor | None = None    # hashing helper of pipelined (part_bytes) backends
        self._arenas: ArenaPool | None = None           # an encrypting tier's staging
        # the owning store's KV events: keys the server accepted / values deleted (store/events.py)
        self.on_stored: Callable[[list[bytes]], None] | None = None
        self.on_removed: Callable[[list[bytes]], None] | None = None
        self._check = HeaderCheck(self._tag, block_bytes)
        self.breaker = CircuitBreaker(threshold=1, base_s=0.25, max_s=4.0, probe=self._probe,
                                      name=backend.name, label=f"remote tier {self.url}")
        if not keys.keyed:
            log.warning("remote tier %s has no key: it trusts every client of the server (any of "
                        "them can read, replace or forge values); set KVTIER_REMOTE_KEY or "
                        "StoreConfig.remote_key to authenticate values (docs/reliability.md)", self.url)

    @property
    def keyed(self) -> bool:
        """True when values are sealed with a secret key."""
        return self._sealer.keyed

    @property
    def encrypted(self) -> bool:
        """True when this tier writes encrypted values."""
        return self._sealer.stages

    @classmethod
    def from_url(cls, url: str, block_bytes: int, domain: str = "",
                 secret: bytes | None = None, encrypt: bool = False) -> "RemoteTier":
        """Parse ``url`` and build the tier; never touches the network (the
        breaker connects in the background).  Raises ``BadRemoteURL``,
        ``BadRemoteKey`` (``encrypt`` without ``secret``) and ``MissingExtra``
        (client library not installed)."""
        spec = parse_remote_url(url)
        keys = DomainKeys(secret, domain)
        keys.sealer(encrypt)                       # BadRemoteKey before a backend exists
        return cls(make_backend(spec), block_bytes, domain, url=spec.redacted(), secret=secret, encrypt=encrypt)

    # ------------------------------------------------------------ helpers
    def name(self, key: bytes) -> bytes:
        """The remote name of a block key in this tier's domain."""
        return b"kvtier:" + hashlib.blake2b(key, digest_size=16, key=self._salt).hexdigest().encode()

    def _count(self, **kw: int) -> None:
        with self._lock:
            for k, v in kw.items():
                self._c[k] += v

    def _probe(self) -> bool | AuthRejected:
        """The breaker's probe (its thread only): the backend's health check,
        a rejected password as ``AuthRejected``."""
        try:
            return self.backend.health()
        except RemoteAuthFailed as exc:
            return AuthRejected(str(exc))

    def _call(self, fn, *args):
        """Run a backend call through the breaker: (ok, result)."""
        if not self.breaker.up:
            return False, None
        try:
            return True, fn(*args)
        except RemoteAuthFailed as exc:
            self.breaker.auth_failure(str(exc))
            return False, None
        except RemoteUnavailable as exc:
            self.breaker.failure(str(exc))
            return False, None
        except Exception as exc:           # a client library bug must not reach the engine
            log.warning("remote tier %s: %s during %s", self.url, type(exc).__name__, fn.__name__)
            self.breaker.failure(type(exc).__name__)
            return False, None

    # ------------------------------------------------------------ data path
    def _per_part(self, n: int, put: bool = False) -> int:
        """Blocks per part: all ``n``, or ``backend.part_bytes`` of payload.  A put
        whose sealer holds the GIL seals each value on the sending thread right
        before it goes out (one part, ``auth.Sealer.hashes_beside``); an
        encrypting tier stages its ciphertext in parts of at most ``STAGE_BYTES``."""
        limit = self.backend.part_bytes
        if put and not self._sealer.hashes_beside:
            limit = None
        if put and self._sealer.stages:
            limit = min(limit or STAGE_BYTES, STAGE_BYTES)
        return n if not limit else max(1, limit // max(1, self.block_bytes))

    def _parts(self, n: int, put: bool = False) -> list[range]:
        """The batch's parts (``_per_part`` blocks each)."""
        per = self._per_part(n, put)
        return [range(lo, min(n, lo + per)) for lo in range(0, n, per)]

    def _staging(self) -> ArenaPool:
        """The encrypting tier's staging arenas (one part each)."""
        with self._lock:
            if self._arenas is None:
                self._arenas = ArenaPool(self._per_part(1 << 30, put=True) * self.block_bytes)
            return self._arenas

    def _helper(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvtier-remote-hash")
            return self._pool

    def publish(self, keys: Sequence[bytes], bufs: Sequence[memoryview],
                sums: Sequence[int | None] | None = None) -> int:
        """Store blocks (each exactly ``block_bytes``); returns how many the
        server accepted.  Never raises for remote faults (0 while down).
        ``sums``: payload xxh3s already known (None entries are hashed here);
        a wrong one only makes the value a miss for its readers.

        A block's header (its payload's xxh3) is computed when first read
        (``values.Heads``).  One backend call per batch, whose backend reads a
        header right after moving its payload (in cache); or, for a backend
        with ``part_bytes``, parts whose headers a helper thread computes
        while the previous part is on the wire."""
        if not keys:
            return 0
        if not self.breaker.up:
            self._count(skipped_while_down=len(keys), put_failures=len(keys))
            return 0
        staged = self._sealer.stages
        per = self._per_part(len(keys), put=True)
        bodies = Staging(len(keys), self.block_bytes, per, self._staging()) if staged else bufs
        heads = Heads(keys, bufs, self._tag, next(self._seq), sums, self._sealer, bodies)
        names = [self.name(k) for k in keys]
        parts = self._parts(len(keys), put=True)
        n = 0
        accepted: list[bytes] = []
        for j, part in enumerate(parts):
            ahead = (self._helper().submit(heads.compute, parts[j + 1])
                     if j + 1 < len(parts) else None)
            lo, hi = part.start, part.stop
            try:
                if len(parts) == 1 and not staged:   # lazy headers: the backend hashes each in its copy loop
                    ok, res = self._call(self.backend.put_many, names, heads, bufs)
                else:                                # heads[lo:hi] computes (and encrypts) what is left
                    ok, res = self._call(self.backend.put_many, names[lo:hi], heads[lo:hi], bodies[lo:hi])
            finally:
                if ahead is not None:
                    ahead.result()               # never leave a thread on the buffers
                if staged:
                    bodies.release(j)
            if not ok:
                break
            n += sum(res)
            accepted.extend(k for k, r in zip(keys[lo:hi], res) if r)
        self._count(puts=n, put_failures=len(keys) - n, bytes_put=n * self.block_bytes)
        if accepted and self.on_stored is not None:
            self.on_stored(accepted)
        return n

    def fetch(self, keys: Sequence[bytes], outs: Sequence[memoryview], loan: Loan | None = None) -> list[bool]:
        """Read and verify blocks into ``outs`` (writable, ``block_bytes`` each).
        Returns per block whether ``outs[i]`` now holds it.  A value that
        fails verification is deleted and its buffer zeroed.  Never raises for
        remote faults (all False while down).  Each value is verified as soon
        as the backend has put it in place (``done``, while it is in cache);
        for a backend with ``part_bytes``, part i is verified on a helper
        thread while part i+1 is read.

        ``loan``: ``outs`` are registered memory the caller keeps reserved
        until ``loan.release`` gives it back (host frames); a zero-copy
        backend may then read straight into them, and a call it abandons at
        its deadline delays that give-back until the call has ended (see
        ``arenas.Loan``).  Without a loan no byte reaches ``outs`` after
        ``fetch`` returns."""
        n = len(keys)
        if not n:
            return []
        if not self.breaker.up:
            self._count(skipped_while_down=n, misses=n)
            return [False] * n
        names = [self.name(k) for k in keys]
        head = self.head_bytes
        arena = memoryview(bytearray(n * head))
        heads = [arena[i * head:(i + 1) * head] for i in range(n)]
        good = [False] * n
        lengths = [MISSING] * n
        called = [False] * n                     # a call that may have written into outs[i]
        want = head + self.block_bytes

        def check(i: int, length: int) -> None:
            good[i] = length == want and self._verify(keys[i], heads[i], outs[i])

        parts = self._parts(n)
        inline = len(parts) == 1 and not self.backend.part_bytes
        futs = []
        try:
            for part in parts:
                lo, hi = part.start, part.stop
                called[lo:hi] = [True] * (hi - lo)
                ok, got = self._call(self.backend.get_many, names[lo:hi], heads[lo:hi], outs[lo:hi],
                                     check if inline else None, loan)
                if not ok:
                    break
                lengths[lo:hi] = got
                called[lo:hi] = [c != MISSING for c in got]     # a nil reply wrote nothing
                if not inline:
                    futs.append(self._helper().submit(self._check_part, check, lo, got, want))
        finally:
            for f in futs:                       # never leave a thread on the buffers
                f.result()
        bad = [i for i, length in enumerate(lengths) if length != MISSING and not good[i]]
        for i in range(n):
            if called[i] and not good[i] and (lengths[i] != MISSING or loan is None):
                outs[i][:] = bytes(outs[i].nbytes)      # unverified bytes never stay behind
        if bad:
            log.warning("remote tier %s: %d value(s) failed verification; deleting them", self.url, len(bad))
            self._call(self.backend.delete, [names[i] for i in bad])
            if self.on_removed is not None:
                self.on_removed([keys[i] for i in bad])
        hits = sum(good)
        self._count(hits=hits, misses=n - hits, corrupt_dropped=len(bad), bytes_read=hits * self.block_bytes)
        return good

    @staticmethod
    def _check_part(check, lo: int, got: list[int], want: int) -> None:
        """Verify a part's values (on the helper thread)."""
        for j, length in enumerate(got):
            if length == want:
                check(lo + j, length)

    def _verify(self, key: bytes, head: memoryview, body: memoryview) -> bool:
        """The header's fields, then the seal (an encrypted value is decrypted in
        place) or, without a key, the payload's xxh3 (auth.py)."""
        return body.nbytes == self.block_bytes and self._sealer.open(self._check, key, head, body)

    def contains(self, keys: Sequence[bytes]) -> list[bool]:
        """Whether each block has a value (unverified; ``fetch`` decides)."""
        if not keys:
            return []
        ok, res = self._call(self.backend.exists, [self.name(k) for k in keys])
        return list(res) if ok else [False] * len(keys)

    def lookup(self, keys: Sequence[bytes]) -> int:
        """Length of the longest prefix of ``keys`` with values (0 while down)."""
        n = 0
        for present in self.contains(keys):
            if not present:
                break
            n += 1
        return n

    def drop(self, keys: Sequence[bytes]) -> None:
        """Delete blocks' values (best effort; nothing while down)."""
        if keys:
            self._call(self.backend.delete, [self.name(k) for k in keys])
            if self.on_removed is not None:
                self.on_removed(list(keys))

    # ------------------------------------------------------------ state
    def register(self, address: int, nbytes: int) -> None:
        """Memory that buffers will come from (the host frame pool); zero-copy backends register it."""
        self.backend.register(address, nbytes)

    def wait_ready(self, timeout: float = 10.0) -> bool:
        """Block until the tier is up or ``timeout`` passes (tests, benchmarks, CLI)."""
        return self.breaker.wait_up(timeout)

    def stats(self) -> RemoteStats:
        b = self.breaker
        with self._lock:
            c = dict(self._c)
        down = None if b.down_since is None else round(time.monotonic() - b.down_since, 3)
        return RemoteStats(url=self.url, backend=self.backend.name, state=b.state, trips=b.trips,
                           consecutive_failures=b.failures, last_error=b.last_error, down_for_s=down,
                           keyed=self._sealer.keyed, encrypted=self._sealer.stages,
                           auth_failures=b.auth_failures, **c)

    def close(self, backend: bool = True) -> None:
        """Stop the breaker's probe and the hashing helper; close the backend
        too unless ``backend=False`` (a backend shared by several tiers)."""
        self.breaker.close()
        if backend:
            self.backend.close()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
