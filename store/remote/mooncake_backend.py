"""Mooncake Store as a remote backend (``mooncake-transfer-engine-non-cuda``).

Every Mooncake call runs on a worker thread (``calls.py``: at lowered
priority, because the client waits for a transfer by spinning) and the
caller waits at most ``spec.deadline_s`` (1.5 s; URL ``deadline=``): a call
that overruns is abandoned -- ``RemoteUnavailable``, which the tier answers
as a miss and trips its breaker on -- and keeps running on its worker until
Mooncake's own RPC timeout (about 4-5 s with a hung master).  An abandoned call can still
move bytes when it finally runs, so no call is ever handed memory its caller
keeps: transfers go to and from a registered staging arena (:class:`Arenas`)
that the call owns; an arena lent to an abandoned call is retired when that
call ends, and later calls get another.

Layout in an arena: value i at ``i * (header + payload)``, header first, one
transfer request per value (``batch_put_from`` / ``batch_get_into``).  On TCP
a request costs about one loopback round trip (~50-70 us here), so one
request per value beats the zero-copy two-buffer calls (header + payload,
``*_multi_buffers``: two requests) below ``SMALL_VALUE`` (512 KiB), where
copying the payload is cheaper than a second request.  From 512 KiB a put
sends the caller's payload zero-copy beside an arena header (a late send of
a since-changed payload fails verification on read: a miss), and a get
whose caller lends its buffers (``loan``: host frames it keeps reserved
until every call on them has ended) reads the payload straight into them.
Below it (and without a loan) a get lands in the arena and is copied out
only when the call returned in time.  The copy loop is also where the
payload is hashed (``heads[i]`` of the tier hashes on demand, and ``done``
verifies right after the copy), while the block is in cache.

Pipelining: a batch that goes through arenas moves in calls of
``PART_BYTES`` (16 MiB) of payload, ``DEPTH`` (2) in flight
(``calls.Batch``), so the copy and hash of part k+1 (put) or the copy-out
and verification of part k (get) overlap another part's transfer; the
zero-copy calls (from ``SMALL_VALUE``) stay one per ``batch_bytes``: their
only extra work is the hash, and at 1-4 MiB one call measured faster than
16 MiB parts.  This pays only because the waiting worker yields: with
the spinner at normal priority the same split was measured slower than one
call (docs/remote.md, rounds 3-4).

TCP chunking: Mooncake's TCP transport moves a request in chunks of
``MC_TCP_SLICE_SIZE`` bytes (64 KiB by default), one event-loop round each,
so a 64 KiB block + its 112-byte header is two chunks where the bare block
is one (measured: 0.77-0.96x of the bare value's rate; docs/remote.md).  Unless the
operator set it, the backend sets ``MC_TCP_SLICE_SIZE`` to
``TCP_CHUNK_BYTES`` (16 MiB) before its client starts: one chunk per value.
The variable is process-wide and read once, so every Mooncake client of the
process (the benchmark's raw client too) moves values the same way.

What this wraps (measured with 0.3.13.post1, TCP, no CUDA):

* ``setup()`` blocks while no master is up: it runs only after a TCP probe of
  the master's port succeeds, on a helper thread with a deadline
  (``SETUP_TIMEOUT_S``, in the breaker's probe thread only); a setup that
  overruns is abandoned.
* after the master dies, the first call fails at once (-900) but later calls
  try to reconnect for about 4 s each; so every batch is preceded (at most
  every ``PROBE_EVERY_S``) by a TCP probe of the master, and a refused probe
  fails the call at once.  ``health_check()`` reports 0 with the master gone,
  so ``health()`` is that probe plus a cheap existence query.
* a master that accepts connections but stops answering (SIGSTOP) holds a
  call for the RPC timeout: the deadline above bounds what the caller sees.
* ``get`` reports a miss and an error alike; the batch calls return
  per-key codes: -704 no such object, -600 value larger than the buffers,
  -800 value smaller (transfer failure), -900 RPC failure, -200 no segment.
* a master restart forgets every object (reads become misses); storage
  nodes re-mount their segments by themselves within about 2 s.
* a full segment evicts old objects silently (the master's eviction); a put
  the master cannot place returns -200.

Threading: Mooncake's client is thread-safe; ``_lock`` guards (re)connects;
``Arenas`` guards its own lists; calls run on ``_calls``' workers.
"""
from __future__ import annotations

import ctypes
import logging
import os
import socket
import threading
import time
from typing import Callable, Sequence

from ...extras import require
from ..aligned import AlignedBuffer
from ..hostpool import buffer_address as _address
from .arenas import Arenas, Loan
from .backend import CORRUPT, MISSING, RemoteBackend, RemoteUnavailable
from .calls import Calls
from .url import RemoteSpec

log = logging.getLogger(__name__)

SETUP_TIMEOUT_S = 5.0
PROBE_EVERY_S = 0.1
TOO_SMALL, RPC_FAIL = -600, -900      # batch call codes: buffers too small; RPC failed
SMALL_VALUE = 512 << 10   # smaller values are put from the arena: one transfer slice instead of two
PART_BYTES = 16 << 20     # payload per call: part k+1 is copied / hashed / verified while part k moves
DEPTH = 2                 # calls of one batch in flight at once
TCP_CHUNK_BYTES = 16 << 20   # MC_TCP_SLICE_SIZE unless set: a value (header + block) moves as one chunk
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
        self._arenas = Arenas(self, min(spec.batch_bytes, PART_BYTES) + (PART_BYTES >> 4))
        self._calls = Calls(spec.redacted(), spec.deadline_s, self._arenas.retire, on_deadline=self._timed_out)

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
        """The set-up client, creating it if needed (the breaker's probe thread
        does; a data call finds it).  Raises ``RemoteUnavailable``."""
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
            if s.protocol == "tcp":            # read once, at the process's first transfer
                os.environ.setdefault("MC_TCP_SLICE_SIZE", str(TCP_CHUNK_BYTES))
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

    def _batch(self, what: str, loan: Loan | None = None, depth: int | None = None):
        """The calls of one batch (``calls.Batch``): arenas go back to the pool after each call."""
        b = self._calls.batch(what, loan, DEPTH if depth is None else depth)
        b.give = self._arenas.give
        return b

    def _run(self, what: str, arena: AlignedBuffer | None, fn: Callable, *args, loan: Loan | None = None):
        """One call, waited for at most ``deadline_s`` (``calls.Calls.run``; the
        arena stays the caller's).  Raises ``RemoteUnavailable``."""
        return self._calls.run(what, arena, fn, *args, loan=loan)

    def _timed_out(self) -> None:
        self._last_probe = 0.0               # probe before the next call

    @staticmethod
    def _names(names: Sequence[bytes]) -> list[str]:
        return [n.decode("ascii") for n in names]

    def _unavailable_if_all(self, codes: list[int], what: str) -> None:
        if codes and all(c == RPC_FAIL for c in codes):
            self._last_probe = 0.0     # probe before the next call
            raise RemoteUnavailable(f"{self.spec.redacted()}: {what} failed (RPC)")

    def _chunks(self, n: int, body: int, limit: int | None = None) -> list[range]:
        """Calls of at most ``limit`` (default ``PART_BYTES``, at most
        ``batch_bytes``) bytes of payload (headers ride along: 16 MiB of
        64 KiB blocks is one call, not 255 + 1)."""
        limit = min(self.spec.batch_bytes, PART_BYTES if limit is None else limit)
        per = max(1, limit // max(1, body))
        return [range(lo, min(n, lo + per)) for lo in range(0, n, per)]

    # ------------------------------------------------------------ data path
    def put_many(self, names, heads, bodies) -> list[bool]:
        """Values below ``SMALL_VALUE`` are laid out header + payload in an
        arena (one copy; ``heads[i]`` is read right after payload i is copied,
        so a tier hashing on demand reads it from cache); larger ones send the
        arena header and the caller's payload as two slices (zero-copy).
        Small values move in parts of ``PART_BYTES``, ``DEPTH`` calls in
        flight: part k+1 is copied and hashed while part k is on the wire;
        zero-copy ones in one call per ``batch_bytes`` (measured faster)."""
        store = self._client()
        keys = self._names(names)
        ok = [False] * len(keys)
        if not keys:
            return ok
        bn, hn = bodies[0].nbytes, len(heads[0])
        size = hn + bn
        small = size < SMALL_VALUE

        def accepted(part: range, codes: list[int]) -> None:
            self._unavailable_if_all(codes, "put")
            for i, c in zip(part, codes):
                ok[i] = c == 0
        with self._batch("put") as b:
            for part in self._chunks(len(keys), bn, None if small else self.spec.batch_bytes):
                k = len(part)
                arena = self._arenas.take(size * k if small else hn * k)
                try:
                    base = arena.address
                    if small:
                        ptrs = [base + j * size for j in range(k)]
                        for p, i in zip(ptrs, part):
                            _memmove(p + hn, _address(bodies[i]), bn)
                            _memmove(p, heads[i], hn)
                        call = (store.batch_put_from, [keys[i] for i in part], ptrs, [size] * k)
                    else:
                        hptrs = [base + j * hn for j in range(k)]
                        for p, i in zip(hptrs, part):
                            _memmove(p, heads[i], hn)
                        call = (store.batch_put_from_multi_buffers, [keys[i] for i in part],
                                [[hp, _address(bodies[i])] for hp, i in zip(hptrs, part)], [[hn, bn]] * k)
                except BaseException:
                    self._arenas.give(arena)
                    raise
                b.add(arena, *call, then=lambda codes, part=part: accepted(part, codes))
        return ok

    def get_many(self, names, heads, bodies, done=None, loan: Loan | None = None) -> list[int]:
        """Without a ``loan``, values land in an arena (one request each) and
        are copied into ``heads[i]``/``bodies[i]`` only after the call
        returned in time.  With a loan and from ``SMALL_VALUE``, the header
        lands in the arena and the payload straight in ``bodies[i]`` (two
        requests, no copy).  ``done(i, length)`` once each value is in place
        (a copied block still in cache), part k while part k+1 moves."""
        store = self._client()
        keys = self._names(names)
        out = [MISSING] * len(keys)
        if not keys:
            return out
        hn, bn = heads[0].nbytes, bodies[0].nbytes
        size = hn + bn

        def finish(i: int, c: int) -> None:
            if c == size:
                out[i] = c
                if done is not None:
                    done(i, c)
            elif c >= 0 or c == TOO_SMALL:       # not our size: a larger or smaller value
                out[i] = CORRUPT
        split = loan is not None and size >= SMALL_VALUE
        with self._batch("get", loan) as b:
            for part in self._chunks(len(keys), bn, self.spec.batch_bytes if split else None):
                idx = list(part)
                if split:
                    arena = self._arenas.take(hn * len(idx))
                    ptrs = [arena.address + j * hn for j in range(len(idx))]
                    b.add(arena, store.batch_get_into_multi_buffers, [keys[i] for i in idx],
                          [[hp, _address(bodies[i])] for hp, i in zip(ptrs, idx)], [[hn, bn]] * len(idx),
                          then=lambda c, ptrs=ptrs, idx=idx: self._got(c, ptrs, idx, size, heads, None, finish))
                else:
                    arena = self._arenas.take(size * len(idx))
                    ptrs = [arena.address + j * size for j in range(len(idx))]
                    b.add(arena, store.batch_get_into, [keys[i] for i in idx], ptrs, [size] * len(idx),
                          then=lambda c, ptrs=ptrs, idx=idx: self._got(c, ptrs, idx, size, heads, bodies, finish))
        return out

    def _got(self, codes, ptrs, idx, size, heads, bodies, finish) -> None:
        """A part's call returned in time: headers (and, with ``bodies``, payloads)
        out of its arena at ``ptrs``, then ``finish`` each value."""
        self._unavailable_if_all(codes, "get")
        hn = heads[0].nbytes
        for p, i, c in zip(ptrs, idx, codes):
            if c == size:
                _memmove(_address(heads[i]), p, hn)
                if bodies is not None:
                    _memmove(_address(bodies[i]), p + hn, bodies[i].nbytes)
            finish(i, c)

    def exists(self, names) -> list[bool]:
        codes = self._run("exists", None, self._client().batch_is_exist, self._names(names))
        self._unavailable_if_all(codes, "exists")
        return [c == 1 for c in codes]

    def delete(self, names) -> None:
        if names:
            codes = self._run("delete", None, self._client().batch_remove, self._names(names), True)
            self._unavailable_if_all(codes, "delete")

    def health(self) -> bool:
        try:
            store = self._connect()
            if not self._probe():
                return False
            return self._run("probe", None, store.batch_is_exist, ["kvtier:health"])[0] in (0, 1)
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
        """Release the client; calls abandoned at their deadline are left to end
        on their workers (the client is then not closed under them: it goes
        with the process)."""
        with self._lock:
            self._closed = True
            store, self._store = self._store, None
        self._calls.shutdown()
        late = self._calls.late
        if store is not None and not late:
            try:
                store.close()
            except Exception:
                pass
        elif late:
            log.warning("mooncake: %d call(s) past their deadline still running at close", late)
        self._arenas.close()
