"""Remote tier URLs, parsed once into a frozen :class:`RemoteSpec`.

Accepted forms::

    redis://[user[:password]@]host[:port][/db]          one Redis server
    rediss://...                                        the same over TLS
    unix://[:password@]/path/to/redis.sock[?db=N]       one server on a Unix socket
    redis://host1:port1,host2:port2,host3:port3         Redis Cluster (several seed nodes)
    redis+cluster://host:port[,host:port...]            Redis Cluster (one seed is enough)
    mooncake://master-host:port?metadata=http://host:port/metadata&protocol=tcp
                               [&local=127.0.0.1][&segment_mb=0]   Mooncake Store

Common query options: ``deadline`` (seconds one whole remote call --
connect, send and receive together -- may take before it is cut and
answered as a miss; default 1.5, so an engine-facing get stays within the
documented 2 s), ``timeout`` (seconds per read of a fresh connection's
handshake; default 0.5), ``connect_timeout`` (TCP connect; default 0.5),
``batch_mb`` (largest pipeline or batch call, default 64).  ``rediss://``
also takes ``tls_ca=/path/ca.pem`` (or ``KVTIER_REMOTE_TLS_CA``): the CA
that signed the server's certificate, when it is not in the system store.

Credentials come from the URL or from ``KVTIER_REMOTE_USERNAME`` /
``KVTIER_REMOTE_PASSWORD`` (the URL wins).  A password may hold any
character, ``/ ? @ % :`` included, raw or percent-encoded: the credentials
are everything before the *last* ``@`` of a Redis URL.
:meth:`RemoteSpec.redacted` is the only form that may reach a log line or
``stats()``; no error message repeats any part of the credentials.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from urllib.parse import parse_qs, unquote, urlsplit

from ..errors import StoreError

SCHEMES = ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster", "mooncake")
DEFAULT_TIMEOUT_S = 0.5
DEFAULT_DEADLINE_S = 1.5     # < the documented 2 s bound on any engine-facing call


class BadRemoteURL(StoreError, ValueError):
    """A ``remote_url`` that cannot be parsed (the message never repeats a password)."""


@dataclass(frozen=True)
class RemoteSpec:
    """Where the remote tier is and how to talk to it.  Immutable.

    kind:     "redis" (one server), "redis-cluster" or "mooncake".
    hosts:    ((host, port), ...): the server, the cluster's seed nodes, or the
              Mooncake master.
    """
    kind: str
    hosts: tuple[tuple[str, int], ...] = ()
    tls: bool = False
    unix_path: str | None = None
    db: int = 0
    username: str | None = field(default=None, repr=False)
    password: str | None = field(default=None, repr=False)
    tls_ca: str | None = None            # rediss: CA file that signed the server's certificate
    timeout_s: float = DEFAULT_TIMEOUT_S
    connect_timeout_s: float = DEFAULT_TIMEOUT_S
    batch_bytes: int = 64 << 20
    deadline_s: float = DEFAULT_DEADLINE_S   # mooncake: one call, worker-enforced
    metadata_url: str | None = None      # mooncake
    protocol: str = "tcp"                # mooncake
    local_hostname: str = "127.0.0.1"    # mooncake: this client's address as the store sees it
    segment_bytes: int = 0               # mooncake: memory this client contributes (0: client only)

    def redacted(self) -> str:
        """The URL without credentials: safe for logs, errors and stats."""
        if self.kind == "mooncake":
            h, p = self.hosts[0]
            return f"mooncake://{h}:{p}?metadata={self.metadata_url}&protocol={self.protocol}"
        scheme = "rediss" if self.tls else "redis"
        if self.unix_path is not None:
            return f"unix://{self.unix_path}?db={self.db}"
        if self.kind == "redis-cluster":
            scheme += "+cluster"
        hosts = ",".join(f"{h}:{p}" for h, p in self.hosts)
        return f"{scheme}://{hosts}/{self.db}" if self.kind == "redis" else f"{scheme}://{hosts}"


def _hosts(netloc: str, default_port: int, url_for_errors: str) -> tuple[tuple[str, int], ...]:
    out = []
    for part in netloc.split(","):
        part = part.strip()
        if not part:
            continue
        if part.startswith("["):            # [v6-address]:port
            host, _, port = part[1:].partition("]")
            port = port.lstrip(":")
        else:
            host, _, port = part.partition(":")
        try:
            out.append((host, int(port) if port else default_port))
        except ValueError:
            raise BadRemoteURL(f"bad port in remote URL {url_for_errors}") from None
    if not out:
        raise BadRemoteURL(f"remote URL {url_for_errors} names no host")
    return tuple(out)


def _float(q: dict, name: str, default: float, url: str) -> float:
    if name not in q:
        return default
    try:
        v = float(q[name][-1])
    except ValueError:
        raise BadRemoteURL(f"remote URL option {name}={q[name][-1]!r} is not a number ({url})") from None
    if not 0 < v <= 60:
        raise BadRemoteURL(f"remote URL option {name} must be in (0, 60] seconds ({url})")
    return v


def parse_remote_url(url: str, env: dict | None = None) -> RemoteSpec:
    """Parse ``url`` (see the module docstring).  Pure apart from reading
    ``env`` (default ``os.environ``) for credentials.

    Raises:
        BadRemoteURL: unknown scheme, no host, bad port/db/option.  The message
            shows the URL without its password.
    """
    env = os.environ if env is None else env
    if not isinstance(url, str) or "://" not in url:
        raise BadRemoteURL("remote_url must look like redis://host:port, unix:///path or mooncake://host:port")
    scheme, rest = url.split("://", 1)
    scheme = scheme.lower()
    if scheme not in SCHEMES:
        raise BadRemoteURL(f"unknown remote URL scheme {scheme!r}; known: {', '.join(SCHEMES)}")
    # credentials: everything before the last "@" (a Redis URL's query has none; a
    # Mooncake URL's metadata URL may, so there only before the first "?"),
    # removed before anything is echoed
    username = password = None
    scope = rest.partition("?")[0] if scheme == "mooncake" else rest
    at = scope.rfind("@")
    if at >= 0:
        cred, rest = rest[:at], rest[at + 1:]
        user, _, pw = cred.partition(":")
        username, password = unquote(user) or None, unquote(pw) or None
    before_q, qmark, query = rest.partition("?")
    head, slash, tail = before_q.partition("/")
    tail += qmark + query
    safe = f"{scheme}://{head}{slash}{tail.split('?')[0]}"
    parts = urlsplit(f"x://{head}{slash}{tail}")
    q = parse_qs(parts.query)
    username = username or env.get("KVTIER_REMOTE_USERNAME") or None
    password = password or env.get("KVTIER_REMOTE_PASSWORD") or None
    common = dict(username=username, password=password,
                  timeout_s=_float(q, "timeout", DEFAULT_TIMEOUT_S, safe),
                  connect_timeout_s=_float(q, "connect_timeout", DEFAULT_TIMEOUT_S, safe),
                  deadline_s=_float(q, "deadline", DEFAULT_DEADLINE_S, safe))
    if "batch_mb" in q:
        try:
            common["batch_bytes"] = max(1, int(q["batch_mb"][-1])) << 20
        except ValueError:
            raise BadRemoteURL(f"remote URL option batch_mb is not an int ({safe})") from None
    if scheme == "mooncake":
        md = q.get("metadata", [None])[-1]
        if not md:
            raise BadRemoteURL(f"mooncake URL needs ?metadata=http://host:port/metadata ({safe})")
        try:
            seg = int(q.get("segment_mb", ["0"])[-1]) << 20
        except ValueError:
            raise BadRemoteURL(f"mooncake URL option segment_mb is not an int ({safe})") from None
        return RemoteSpec(kind="mooncake", hosts=_hosts(head, 50051, safe)[:1], metadata_url=md,
                          protocol=q.get("protocol", ["tcp"])[-1],
                          local_hostname=q.get("local", ["127.0.0.1"])[-1], segment_bytes=seg, **common)
    db = 0
    path = parts.path.strip("/")
    if scheme == "unix":
        if not parts.path:
            raise BadRemoteURL(f"unix URL needs a socket path ({safe})")
        db_s = q.get("db", ["0"])[-1]
        try:
            db = int(db_s)
        except ValueError:
            raise BadRemoteURL(f"bad db {db_s!r} in remote URL ({safe})") from None
        return RemoteSpec(kind="redis", unix_path=parts.path, db=db, **common)
    if path:
        try:
            db = int(path)
        except ValueError:
            raise BadRemoteURL(f"bad db {path!r} in remote URL ({safe})") from None
    hosts = _hosts(head, 6379, safe)
    cluster = scheme.endswith("+cluster") or len(hosts) > 1
    if cluster and db:
        raise BadRemoteURL(f"Redis Cluster has only db 0 ({safe})")
    tls = scheme.startswith("rediss")
    ca = (q.get("tls_ca", [None])[-1] or env.get("KVTIER_REMOTE_TLS_CA") or None) if tls else None
    return RemoteSpec(kind="redis-cluster" if cluster else "redis", hosts=hosts,
                      tls=tls, tls_ca=ca, db=db, **common)
