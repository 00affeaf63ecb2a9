"""Mooncake Store as a remote backend (``mooncake-transfer-engine-non-cuda``).

Every Mooncake call runs on a worker thread and the caller waits at most
``spec.deadline_s`` (1.5 s; URL ``deadline=``): a call that overruns is
abandoned -- ``RemoteUnavailable``, which the tier answers as a miss and
trips its breaker on -- and keeps running on its worker until Mooncake's own
RPC timeout (about 4-5 s with a hung master).  An abandoned call can still
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
Below ``SMALL_VALUE`` a get into lent frames that follow one another in
memory reads each value in place, its header into the tail of the frame
before (``inplace.py``: two calls, one request per value, the overwritten
tails saved and restored); only a run's first frame goes through the arena.
Without a loan a get lands in the arena and is copied out only when the
call returned in time.  The copy loop is also where the payload is hashed
(``heads[i]`` of the tier hashes on demand, and ``done`` verifies right
after the copy), while the block is in cache.

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
``Arenas`` guards its own lists; calls run on ``_workers``.
"""
from __future__ import annotations

import ctypes
import logging
import os
import socket
import threading
import time
from contextlib import contextmanager
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Callable, Sequence

from ...extras import require
from ..aligned import AlignedBuffer
from ..hostpool import buffer_address as _address
from . import inplace
from .arenas import Arenas, Loan
from .backend import CORRUPT, MISSING, RemoteBackend, RemoteUnavailable
from .url import RemoteSpec

log = logging.getLogger(__name__)

SETUP_TIMEOUT_S = 5.0
PROBE_EVERY_S = 0.1
TOO_SMALL, RPC_FAIL = -600, -900      # batch call codes: buffers too small; RPC failed
SMALL_VALUE = 512 << 10   # smaller values are put from the arena: one transfer slice instead of two
WORKERS = 4               # calls in flight at once (an abandoned one holds its worker until it ends)
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
        self._arenas = Arenas(self, spec.batch_bytes)
        self._workers = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="kvtier-mooncake")
        self._late = 0                # abandoned calls still running (guarded by _lock)

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

    @contextmanager
    def _arena(self, nbytes: int):
        """An arena for one call: given back afterwards, unless ``_run``
        lent it to a call it abandoned (that call retires it when it ends)."""
        arena = self._arenas.take(nbytes)
        arena.lent = False
        try:
            yield arena
        finally:
            if not arena.lent:
                self._arenas.give(arena)

    def _run(self, what: str, arena: AlignedBuffer | None, fn: Callable, *args, loan: Loan | None = None):
        """``fn(*args)`` on a worker, waited for at most ``deadline_s``; the
        call uses ``arena`` (or no memory of ours when None) and, with a
        ``loan``, the caller's lent buffers.  At the deadline the call is
        abandoned: ``arena.lent`` is set and the arena retired when the call
        ends; ``loan.hold()`` now, ``loan.end()`` when the call ends (so the
        caller's buffers are given back only then).  Raises
        ``RemoteUnavailable`` (closed, deadline)."""
        try:
            fut = self._workers.submit(fn, *args)
        except RuntimeError:                 # shut down by close()
            raise RemoteUnavailable("remote tier is closed") from None
        try:
            return fut.result(timeout=self.spec.deadline_s)
        except FutureTimeout:
            self._last_probe = 0.0
            if not fut.cancel():             # running: it may still move bytes into its memory
                if arena is not None:
                    arena.lent = True
                if loan is not None:
                    loan.hold()
                with self._lock:
                    self._late += 1
                fut.add_done_callback(lambda _f: self._ended_late(arena, loan))
            raise RemoteUnavailable(f"{self.spec.redacted()}: {what} took longer than "
                                    f"{self.spec.deadline_s:g} s (abandoned)") from None

    def _ended_late(self, arena: AlignedBuffer | None, loan: Loan | None) -> None:
        with self._lock:
            self._late -= 1
        if arena is not None:
            self._arenas.retire(arena)
        if loan is not None:
            loan.end()

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
    def put_many(self, names, heads, bodies) -> list[bool]:
        """Values below ``SMALL_VALUE`` are laid out header + payload in an
        arena (one copy; ``heads[i]`` is read right after payload i is copied,
        so a tier hashing on demand reads it from cache); larger ones send the
        arena header and the caller's payload as two slices (zero-copy)."""
        store = self._client()
        keys = self._names(names)
        ok = [False] * len(keys)
        if not keys:
            return ok
        bn = bodies[0].nbytes
        for part in self._chunks(len(keys), bn):
            k = len(part)
            hn = len(heads[part[0]])
            size = hn + bn
            small = size < SMALL_VALUE
            with self._arena(size * k if small else hn * k) as arena:
                base = arena.address
                if small:
                    ptrs = [base + j * size for j in range(k)]
                    for p, i in zip(ptrs, part):
                        _memmove(p + hn, _address(bodies[i]), bn)
                        _memmove(p, heads[i], hn)
                    codes = self._run("put", arena, store.batch_put_from, [keys[i] for i in part],
                                      ptrs, [size] * k)
                else:
                    hptrs = [base + j * hn for j in range(k)]
                    for p, i in zip(hptrs, part):
                        _memmove(p, heads[i], hn)
                    codes = self._run("put", arena, store.batch_put_from_multi_buffers,
                                      [keys[i] for i in part],
                                      [[hp, _address(bodies[i])] for hp, i in zip(hptrs, part)],
                                      [[hn, bn]] * k)
            self._unavailable_if_all(codes, "put")
            for i, c in zip(part, codes):
                ok[i] = c == 0
        return ok

    def get_many(self, names, heads, bodies, done=None, loan: Loan | None = None) -> list[int]:
        """Without a ``loan``, values land in an arena (one request each) and
        are copied into ``heads[i]``/``bodies[i]`` only after the call
        returned in time.  With a loan: from ``SMALL_VALUE`` the header lands
        in the arena and the payload straight in ``bodies[i]`` (two requests,
        no copy); below it, values whose body follows another body of the
        batch in memory are read in place, header into the frame before
        (``inplace.py``: two calls, one request each, no copy).
        ``done(i, length)`` once each value is in place (a copied block
        still in cache)."""
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
        for part in self._chunks(len(keys), bn):
            if loan is not None and size >= SMALL_VALUE:
                self._get_split(store, keys, heads, bodies, list(part), loan, finish)
                continue
            pl = inplace.plan([_address(bodies[i]) for i in part], bn) if loan is not None else None
            if pl is not None and pl.in_place:
                self._get_in_place(store, keys, heads, bodies, list(part), pl, loan, finish)
            else:
                self._get_staged(store, keys, heads, bodies, list(part), finish)
        return out

    def _get_staged(self, store, keys, heads, bodies, idx, finish) -> None:
        """Values ``idx`` through an arena, each copied out then finished."""
        hn, bn = heads[0].nbytes, bodies[0].nbytes
        size = hn + bn
        with self._arena(size * len(idx)) as arena:
            ptrs = [arena.address + j * size for j in range(len(idx))]
            codes = self._run("get", arena, store.batch_get_into, [keys[i] for i in idx], ptrs, [size] * len(idx))
            self._unavailable_if_all(codes, "get")
            for p, i, c in zip(ptrs, idx, codes):
                if c == size:
                    _memmove(_address(heads[i]), p, hn)
                    _memmove(_address(bodies[i]), p + hn, bn)
                finish(i, c)

    def _get_split(self, store, keys, heads, bodies, idx, loan, finish) -> None:
        """Values ``idx`` as [header -> arena, payload -> lent body] requests."""
        hn, bn = heads[0].nbytes, bodies[0].nbytes
        with self._arena(hn * len(idx)) as arena:
            hptrs = [arena.address + j * hn for j in range(len(idx))]
            codes = self._run("get", arena, store.batch_get_into_multi_buffers, [keys[i] for i in idx],
                              [[hp, _address(bodies[i])] for hp, i in zip(hptrs, idx)],
                              [[hn, bn]] * len(idx), loan=loan)
            self._unavailable_if_all(codes, "get")
            for p, i, c in zip(hptrs, idx, codes):
                if c == hn + bn:
                    _memmove(_address(heads[i]), p, hn)
                finish(i, c)

    def _get_in_place(self, store, keys, heads, bodies, idx, pl, loan, finish) -> None:
        """Values ``idx`` by ``pl`` (an ``inplace.InPlacePlan`` over positions
        in ``idx``): round A (staged + in place), round B in place with the
        overwritten frame tails saved and restored; finished at the end."""
        hn, bn = heads[0].nbytes, bodies[0].nbytes
        size = hn + bn
        at = [_address(bodies[i]) for i in idx]
        staged, ra, rb = pl.staged, pl.round_a, pl.round_b
        with self._arena(size * max(1, len(staged))) as arena:
            sp = [arena.address + j * size for j in range(len(staged))]
            codes_a = self._run("get", arena, store.batch_get_into, [keys[idx[q]] for q in staged + ra],
                                sp + [at[q] - hn for q in ra], [size] * (len(staged) + len(ra)), loan=loan)
            self._unavailable_if_all(codes_a, "get")
            got = dict(zip(staged + ra, codes_a))
            for q in ra:                          # headers out of the frames before they are written
                if got[q] == size:
                    _memmove(_address(heads[idx[q]]), at[q] - hn, hn)
            for p, q in zip(sp, staged):
                if got[q] == size:
                    _memmove(_address(heads[idx[q]]), p, hn)
                    _memmove(at[q], p + hn, bn)
        if rb:
            side = (ctypes.c_char * (hn * len(pl.saved)))()
            base = ctypes.addressof(side)
            for k, q in enumerate(pl.saved):
                _memmove(base + k * hn, at[q] + bn - hn, hn)
            codes_b = self._run("get", None, store.batch_get_into, [keys[idx[q]] for q in rb],
                                [at[q] - hn for q in rb], [size] * len(rb), loan=loan)
            self._unavailable_if_all(codes_b, "get")
            got.update(zip(rb, codes_b))
            for q in rb:
                if got[q] == size:
                    _memmove(_address(heads[idx[q]]), at[q] - hn, hn)
            for k, q in enumerate(pl.saved):
                _memmove(at[q] + bn - hn, base + k * hn, hn)
        for q, i in enumerate(idx):
            finish(i, got[q])

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
        self._workers.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            late = self._late
        if store is not None and not late:
            try:
                store.close()
            except Exception:
                pass
        elif late:
            log.warning("mooncake: %d call(s) past their deadline still running at close", late)
        self._arenas.close()
