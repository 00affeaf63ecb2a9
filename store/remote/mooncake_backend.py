"""Mooncake Store as a remote backend (``mooncake-transfer-engine-non-cuda``).

Data moves with Mooncake's zero-copy batch calls: a value of 512 KiB or more
is two buffers, the 112-byte record header and the caller's payload buffer
(``batch_put_from_multi_buffers`` / ``batch_get_into_multi_buffers``), so
neither a put nor a get copies its payload.  Every buffer is a transfer
slice of its own, and on TCP a slice costs about one loopback round trip:
smaller values are laid out header + payload in a registered staging arena
(one memcpy) and moved as one slice each (``batch_put_from`` /
``batch_get_into``), which measured faster below 512 KiB.  The host frame
pool is ``register_buffer``-ed once (after every (re)connect).

What this wraps (measured with 0.3.13.post1, TCP, no CUDA):

* ``setup()`` blocks while no master is up: it runs only after a TCP probe of
  the master's port succeeds, on a helper thread with a deadline
  (``SETUP_TIMEOUT_S``); a setup that overruns is abandoned.
* after the master dies, the first call fails at once (-900) but later calls
  try to reconnect for about 4 s each; so every batch is preceded (at most
  every ``PROBE_EVERY_S``) by a TCP probe of the master, and a refused probe
  fails the call at once.  ``health_check()`` reports 0 with the master gone,
  so ``health()`` is that probe plus a cheap existence query.
* ``get`` reports a miss and an error alike; the batch calls return
  per-key codes: -704 no such object, -600 value larger than the buffers,
  -800 value smaller (transfer failure), -900 RPC failure, -200 no segment.
* a master restart forgets every object (reads become misses); storage
  nodes re-mount their segments by themselves within about 2 s.
* a full segment evicts old objects silently (the master's eviction); a put
  the master cannot place returns -200.

Bounds: a call fails at once while the master's port refuses connections;
a master that accepts connections but stops answering can hold a call for
Mooncake's own RPC timeout (about 4-5 s), which its API does not let us
shorten without letting a late transfer write into a returned buffer.

Threading: Mooncake's client is thread-safe; ``_lock`` guards (re)connects.
"""
from __future__ import annotations

import ctypes
import logging
import socket
import threading
import time
from typing import Sequence

from ...extras import require
from ..aligned import AlignedBuffer
from ..hostpool import buffer_address as _address
from .backend import CORRUPT, MISSING, RemoteBackend, RemoteUnavailable
from .url import RemoteSpec

log = logging.getLogger(__name__)

SETUP_TIMEOUT_S = 5.0
PROBE_EVERY_S = 0.1
TOO_SMALL, RPC_FAIL = -600, -900      # batch call codes: buffers too small; RPC failed
SMALL_VALUE = 512 << 10   # smaller values are staged contiguously: one transfer slice instead of two
_memmove = ctypes.memmove


class MooncakeBackend(RemoteBackend):
    """See the module docstring.  Constructing it never touches the network."""

    name = "mooncake"

    def __init__(self, spec: RemoteSpec) -> None:
        self.spec = spec
        self._mc = require("mooncake.store", extra="remote", feature="the Mooncake remote tier")
        self._lock = threading.Lock()
        self._store = None
        self._setup_thread: threading.Thread | None = None
        self._regions: list[tuple[int, int]] = []
        self._last_probe = 0.0
        self._closed = False
        self._arena: AlignedBuffer | None = None   # registered staging for small values (one batch at a time)
        self._arena_addr = 0
        self._arena_lock = threading.Lock()

    # ------------------------------------------------------------ connection
    def _probe(self) -> bool:
        """TCP connect to the master's RPC port (loopback: microseconds)."""
        host, port = self.spec.hosts[0]
        try:
            with socket.create_connection((host, port), timeout=self.spec.connect_timeout_s):
                return True
        except OSError:
            return False

    def _connect(self):
        """The set-up client, creating it if needed.  Raises ``RemoteUnavailable``."""
        with self._lock:
            if self._closed:
                raise RemoteUnavailable("remote tier is closed")
            if self._store is not None:
                return self._store
            if self._setup_thread is not None and self._setup_thread.is_alive():
                raise RemoteUnavailable(f"{self.spec.redacted()}: an earlier setup is still blocked")
            if not self._probe():
                raise RemoteUnavailable(f"{self.spec.redacted()}: master unreachable")
            s = self.spec
            store = self._mc.MooncakeDistributedStore()
            result: list[int] = []
            host, port = s.hosts[0]

            def setup() -> None:
                result.append(store.setup(s.local_hostname, s.metadata_url, s.segment_bytes,
                                          16 << 20, s.protocol, "", f"{host}:{port}"))

            t = threading.Thread(target=setup, name="kvtier-mooncake-setup", daemon=True)
            t.start()
            t.join(SETUP_TIMEOUT_S)
            if t.is_alive():
                self._setup_thread = t        # abandoned; never two at once
                raise RemoteUnavailable(f"{s.redacted()}: setup did not finish in {SETUP_TIMEOUT_S:.0f} s")
            if result != [0]:
                raise RemoteUnavailable(f"{s.redacted()}: setup failed ({result})")
            for addr, n in self._regions:
                store.register_buffer(addr, n)
            self._store = store
            self._last_probe = time.monotonic()
            return store

    def _client(self):
        """The client, after a (throttled) probe that the master is still there."""
        store = self._connect()
        now = time.monotonic()
        if now - self._last_probe > PROBE_EVERY_S:
            if not self._probe():
                raise RemoteUnavailable(f"{self.spec.redacted()}: master unreachable")
            self._last_probe = now
        return store

    @staticmethod
    def _names(names: Sequence[bytes]) -> list[str]:
        return [n.decode("ascii") for n in names]

    def _unavailable_if_all(self, codes: list[int], what: str) -> None:
        if codes and all(c == RPC_FAIL for c in codes):
            self._last_probe = 0.0     # probe before the next call
            raise RemoteUnavailable(f"{self.spec.redacted()}: {what} failed (RPC)")

    def _chunks(self, n: int, body: int) -> list[range]:
        """Batches of at most ``batch_bytes`` of payload (headers ride along:
        64 MiB of 64 KiB blocks is one call, not 1021 + 3)."""
        per = max(1, self.spec.batch_bytes // max(1, body))
        return [range(lo, min(n, lo + per)) for lo in range(0, n, per)]

    # ------------------------------------------------------------ data path
    def _arena_for(self, need: int):
        """The registered staging arena's address, its lock taken (release it),
        or None while another batch uses it.  Grows (registered again) as needed."""
        if not self._arena_lock.acquire(blocking=False):
            return None
        if self._arena is None or self._arena.nbytes < need:
            if self._arena is not None:
                self.unregister(self._arena_addr)
                self._arena.close()
            self._arena = AlignedBuffer(max(need, self.spec.batch_bytes))
            self._arena_addr = _address(self._arena.view())
            self.register(self._arena_addr, self._arena.nbytes)
        return self._arena_addr

    def put_many(self, names, heads, bodies) -> list[bool]:
        store = self._client()
        keys = self._names(names)
        ok = [False] * len(keys)
        hn = len(heads[0]) if keys else 0
        size = hn + bodies[0].nbytes if keys else 0
        small = size < SMALL_VALUE
        for part in self._chunks(len(keys), size - hn):
            k = len(part)
            arena = self._arena_for(size * k if small else hn * k)
            try:
                if arena is not None and small:   # one contiguous slice each (one copy)
                    ptrs = [arena + j * size for j in range(k)]
                    for p, i in zip(ptrs, part):
                        _memmove(p, heads[i], hn)
                        _memmove(p + hn, _address(bodies[i]), bodies[i].nbytes)
                    codes = store.batch_put_from([keys[i] for i in part], ptrs, [size] * k)
                else:                             # header (registered) + the caller's buffer, zero-copy
                    if arena is not None:
                        hptrs = [arena + j * hn for j in range(k)]
                        for p, i in zip(hptrs, part):
                            _memmove(p, heads[i], hn)
                    else:
                        hbufs = [ctypes.create_string_buffer(heads[i], hn) for i in part]
                        hptrs = [ctypes.addressof(hb) for hb in hbufs]
                    codes = store.batch_put_from_multi_buffers(
                        [keys[i] for i in part], [[hp, _address(bodies[i])] for hp, i in zip(hptrs, part)],
                        [[hn, bodies[i].nbytes] for i in part])
            finally:
                if arena is not None:
                    self._arena_lock.release()
            self._unavailable_if_all(codes, "put")
            for i, c in zip(part, codes):
                ok[i] = c == 0
        return ok

    def get_many(self, names, heads, bodies) -> list[int]:
        store = self._client()
        keys = self._names(names)
        out = [MISSING] * len(keys)
        hn = heads[0].nbytes if keys else 0
        size = hn + bodies[0].nbytes if keys else 0
        small = size < SMALL_VALUE
        for part in self._chunks(len(keys), size - hn):
            k = len(part)
            arena = self._arena_for(size * k if small else hn * k)
            try:
                if arena is not None and small:
                    ptrs = [arena + j * size for j in range(k)]
                    codes = store.batch_get_into([keys[i] for i in part], ptrs, [size] * k)
                    for p, i, c in zip(ptrs, part, codes):
                        if c == size:
                            _memmove(_address(heads[i]), p, hn)
                            _memmove(_address(bodies[i]), p + hn, bodies[i].nbytes)
                else:
                    hptrs = ([arena + j * hn for j in range(k)] if arena is not None
                             else [_address(heads[i]) for i in part])
                    codes = store.batch_get_into_multi_buffers(
                        [keys[i] for i in part], [[hp, _address(bodies[i])] for hp, i in zip(hptrs, part)],
                        [[hn, bodies[i].nbytes] for i in part])
                    if arena is not None:
                        for hp, i in zip(hptrs, part):
                            _memmove(_address(heads[i]), hp, hn)
            finally:
                if arena is not None:
                    self._arena_lock.release()
            self._unavailable_if_all(codes, "get")
            for i, c in zip(part, codes):
                if c >= 0:
                    out[i] = c
                elif c == TOO_SMALL:       # a larger value than ours is there
                    out[i] = CORRUPT
        return out

    def exists(self, names) -> list[bool]:
        codes = self._client().batch_is_exist(self._names(names))
        self._unavailable_if_all(codes, "exists")
        return [c == 1 for c in codes]

    def delete(self, names) -> None:
        if names:
            codes = self._client().batch_remove(self._names(names), True)
            self._unavailable_if_all(codes, "delete")

    def health(self) -> bool:
        try:
            store = self._connect()
            if not self._probe():
                return False
            return store.batch_is_exist(["kvtier:health"])[0] in (0, 1)
        except Exception:
            return False

    def register(self, address: int, nbytes: int) -> None:
        with self._lock:
            self._regions.append((address, nbytes))
            store = self._store
        if store is not None:
            try:
                store.register_buffer(address, nbytes)
            except Exception as exc:        # a missed registration only costs speed
                log.warning("mooncake register_buffer failed: %s", type(exc).__name__)

    def unregister(self, address: int) -> None:
        with self._lock:
            self._regions = [r for r in self._regions if r[0] != address]
            store = self._store
        if store is not None:
            try:
                store.unregister_buffer(address)
            except Exception:
                pass

    def close(self) -> None:
        with self._lock:
            self._closed = True
            store, self._store = self._store, None
        if store is not None:
            try:
                store.close()
            except Exception:
                pass
        with self._arena_lock:
            if self._arena is not None:
                self._arena.close()
                self._arena = None
