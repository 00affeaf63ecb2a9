"""The one interface every remote backend implements.

A backend stores opaque values, one per name: a value is a short header
followed by a payload (see ``store/record.py``).  Backends move bytes; they
neither verify nor interpret them -- :class:`~kvtier.store.remote.tier.RemoteTier`
does, and turns every failure into a miss.

Batch calls are the only data path (one pipeline / one batch call per
``batch_bytes``, never a round trip per value).  Payloads are read from and
written into the caller's buffers: the backend copies at most once on a get
(Redis hands back a bytes object) and never on a put.

Threading: every method may be called from any thread, concurrently; a
backend owns its connections and guards them itself.

Errors: a method either returns its result or raises :class:`RemoteUnavailable`
(the server could not be reached, timed out, or failed the whole call).  No
call blocks longer than the bound its backend documents.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Callable, Sequence

from ..errors import StoreError

MISSING = -1          # get_many: no value under that name (or it could not be read)
CORRUPT = -2          # get_many: a value is there but cannot be ours (wrong size): delete it


class RemoteUnavailable(StoreError):
    """The remote server could not be reached or did not answer in time.
    ``RemoteTier`` catches it (a miss, the circuit breaker opens); it reaches
    a caller only from a backend used directly."""


class RemoteAuthFailed(RemoteUnavailable):
    """The server rejected the credentials (wrong or missing password, an ACL
    user without the needed commands).  The message never holds a secret."""


class RemoteBackend(ABC):
    """Batch put/get of header + payload values into the caller's buffers."""

    name: str = "remote"
    # None: the tier makes one call per batch and hashes inline (headers computed
    # as they are read, ``done`` verifies each value).  An int: the tier sends
    # parts of that many payload bytes and hashes/verifies one part on a helper
    # thread while the next is on the wire (for I/O that releases the GIL on
    # the calling thread, as socket reads do).
    part_bytes: int | None = None

    @abstractmethod
    def put_many(self, names: Sequence[bytes], heads: Sequence[bytes],
                 bodies: Sequence[memoryview]) -> list[bool]:
        """Store ``heads[i] + bodies[i]`` under ``names[i]`` (overwriting).

        Returns, per value, whether the server accepted it (False: full,
        refused, evicted at once).  Raises ``RemoteUnavailable``."""

    @abstractmethod
    def get_many(self, names: Sequence[bytes], heads: Sequence[memoryview],
                 bodies: Sequence[memoryview],
                 done: Callable[[int, int], None] | None = None, loan=None) -> list[int]:
        """Read values into ``heads[i]`` (the header's bytes) and ``bodies[i]``.

        ``loan`` (an ``arenas.Loan``, or None): ``bodies`` are the caller's
        registered memory, lent past the call -- a backend whose calls can
        outlive their deadline may then write straight into them (calling
        ``loan.hold()`` / ``loan.end()`` around an abandoned call); without a
        loan it must never write into ``bodies`` after returning or raising.

        Returns, per value, its total length on the server, ``MISSING`` or
        ``CORRUPT``.
        The buffers hold the value only where the length equals
        ``len(heads[i]) + len(bodies[i])``; other lengths leave them
        unspecified (the caller treats the value as corrupt).
        ``done(i, length)`` is called, on the calling thread and before
        ``get_many`` returns, once for every value of that exact length, as
        soon as its buffers hold it (a caller verifies there, the bytes still
        in cache).  Raises ``RemoteUnavailable``."""

    @abstractmethod
    def exists(self, names: Sequence[bytes]) -> list[bool]:
        """Whether each name has a value (no bytes move).  Raises ``RemoteUnavailable``."""

    @abstractmethod
    def delete(self, names: Sequence[bytes]) -> None:
        """Remove the values (absent names are fine).  Raises ``RemoteUnavailable``."""

    @abstractmethod
    def health(self) -> bool:
        """One cheap round trip: True if the server answers now.

        Raises:
            RemoteAuthFailed: the server answers but rejects the credentials
                (nothing else is raised: any other failure is False)."""

    def register(self, address: int, nbytes: int) -> None:
        """Announce a long-lived memory region (the host frame pool) that
        buffers will come from; backends with zero-copy transfers register it.
        Default: nothing to do.  Never raises."""

    @abstractmethod
    def close(self) -> None:
        """Release connections.  Idempotent; later calls raise ``RemoteUnavailable``."""
