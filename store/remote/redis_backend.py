"""Redis and Redis Cluster as a remote backend (redis-py + hiredis).

One Redis string per block: the record header followed by the raw payload.
Nothing else is written to the database (no hashes, lists or index keys).

Batches are pipelined on a redis-py connection: the commands of a batch are
sent in one go (``Connection.send_packed_command``) and their replies read
back in order, so a batch costs one round trip per ``batch_bytes`` (per
cluster node), never one per block.  GET replies are read off the socket
straight into the caller's buffers (resp.py): a get copies nothing in Python.  A SET is sent scatter-gather --
``*3 $3 SET $klen key $vlen`` + header, then the caller's payload buffer
itself -- so a put copies nothing in Python (redis-py's own pipeline packs
every value into one new bytes object first).

Bounds: every call (put_many, get_many, exists, delete) has one overall
deadline, the URL's ``deadline`` (1.5 s by default): connecting, sending
and every read share it (resp.Deadline), so a server that trickles bytes,
stalls mid-value or sends half a reply is cut at the deadline, whatever its
pace.  A fresh connection's TCP connect is bounded by ``connect_timeout``
and its handshake (AUTH, SELECT) by ``timeout`` per read, all inside the
same deadline.  Retries are off.  A server that is gone fails a call at
once (connection refused).

Credentials: a rejected password, a missing one, or an ACL user without the
commands (NOAUTH, WRONGPASS, NOPERM) raise ``RemoteAuthFailed`` from calls
and from ``health``: the tier shows ``auth_failed``.  Messages name the
redacted URL and the error class only.

Threading: any thread; each call takes its own connection from redis-py's
pool for the duration of the call.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Sequence

from ...extras import require
from .backend import MISSING, RemoteAuthFailed, RemoteBackend, RemoteUnavailable
from .resp import AuthReply, BulkReader, Deadline, ReplyError
from .url import RemoteSpec

def _bulk(b: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(b), b)


def _cmd(*args: bytes) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(_bulk(a) for a in args)


class RedisBackend(RemoteBackend):
    """See the module docstring.  The client is created lazily: constructing
    the backend never touches the network (``open`` succeeds while the server
    is down); a Redis Cluster client is rebuilt after a failed call."""

    part_bytes = 16 << 20     # the tier hashes one 16 MiB part while the socket moves the next

    def __init__(self, spec: RemoteSpec) -> None:
        self.spec = spec
        self.name = "redis-cluster" if spec.kind == "redis-cluster" else "redis"
        self._redis = require("redis", extra="remote", feature="the Redis remote tier")
        self._lock = threading.Lock()
        self._client = None
        self._closed = False

    # ------------------------------------------------------------ connections
    def _common(self) -> dict:
        from redis.backoff import NoBackoff
        from redis.retry import Retry
        s = self.spec
        kw = dict(socket_timeout=min(s.timeout_s, s.deadline_s),
                  socket_connect_timeout=min(s.connect_timeout_s, s.deadline_s),
                  retry=Retry(NoBackoff(), 0), health_check_interval=0,
                  username=s.username, password=s.password)
        if s.tls:
            kw["ssl"] = True
            if s.tls_ca is not None:
                kw["ssl_ca_certs"] = s.tls_ca
        return kw

    def _get_client(self):
        with self._lock:
            if self._closed:
                raise RemoteUnavailable("remote tier is closed")
            if self._client is None:
                s, r = self.spec, self._redis
                try:
                    if s.kind == "redis-cluster":
                        from redis.cluster import ClusterNode, RedisCluster
                        self._client = RedisCluster(
                            startup_nodes=[ClusterNode(h, p) for h, p in s.hosts],
                            require_full_coverage=False, **self._common())
                    elif s.unix_path is not None:
                        kw = self._common()
                        kw.pop("ssl", None)
                        self._client = r.Redis(unix_socket_path=s.unix_path, db=s.db, **kw)
                    else:
                        (h, p), = s.hosts
                        self._client = r.Redis(host=h, port=p, db=s.db, **self._common())
                except Exception as exc:     # RedisClusterException is no RedisError
                    raise self._failed(exc) from None
            return self._client

    def _reset(self) -> None:
        """Forget a cluster client after a failure (its slot map may be stale)."""
        if self.spec.kind == "redis-cluster":
            self._drop_client(closing=False)

    def _drop_client(self, closing: bool) -> None:
        """Swap the client out under the lock and close it outside; a failing close is ignored."""
        with self._lock:
            self._closed = self._closed or closing
            c, self._client = self._client, None
        if c is not None:
            try:
                c.close()
            except Exception:
                pass

    def _groups(self, names: Sequence[bytes]) -> list[tuple[object, list[int]]]:
        """(redis.Redis of one server, indexes of the names it holds)."""
        client = self._get_client()
        if self.spec.kind != "redis-cluster":
            return [(client, list(range(len(names))))]
        by: dict[str, tuple[object, list[int]]] = {}
        try:
            for i, n in enumerate(names):
                node = client.get_node_from_key(n)
                by.setdefault(node.name, (node, []))[1].append(i)
            return [(client.get_redis_connection(node), idx) for node, idx in by.values()]
        except self._redis.RedisError as exc:
            self._reset()
            raise RemoteUnavailable(f"{self.spec.redacted()}: {type(exc).__name__}") from None

    def _failed(self, exc: BaseException) -> RemoteUnavailable:
        """The exception to raise for a failed call (no secret in it)."""
        r = self._redis
        what = f"{self.spec.redacted()}: {type(exc).__name__}"
        if isinstance(exc, (AuthReply, r.AuthenticationError, r.exceptions.NoPermissionError,
                            r.exceptions.AuthenticationWrongNumberOfArgsError)):
            return RemoteAuthFailed(f"{what} (credentials rejected)")
        return RemoteUnavailable(what)

    @contextmanager
    def _connection(self, server, deadline: Deadline):
        """One pooled connection of ``server``, connected within ``deadline``; a
        socket or protocol failure drops it, forgets a cluster client's slot
        map and raises ``RemoteUnavailable`` (``RemoteAuthFailed``)."""
        r = self._redis
        pool = server.connection_pool
        try:
            conn = pool.get_connection()
            deadline.left()
        except (r.RedisError, OSError) as exc:
            self._reset()
            raise self._failed(exc) from None
        try:
            yield conn
        except (r.RedisError, OSError) as exc:
            conn.disconnect()
            self._reset()
            raise self._failed(exc) from None
        except BaseException:
            conn.disconnect()        # a command may be half sent (a header that failed to build)
            raise
        finally:
            pool.release(conn)

    def _roundtrip(self, server, parts: list, n: int) -> list:
        """Send pre-packed commands on one connection, read ``n`` replies, all
        within one deadline.  Error replies come back as ``ReplyError``, in place."""
        deadline = Deadline(self.spec.deadline_s)
        with self._connection(server, deadline) as conn:
            deadline.sendall(conn._sock, parts)
            reader = BulkReader(conn._sock, chunk=4096, deadline=deadline)
            return [reader.reply() for _ in range(n)]

    def _chunks(self, idx: list[int], bodies: Sequence[memoryview]) -> list[list[int]]:
        """Pipelines of at most ``batch_bytes`` of payload (headers ride along)."""
        out, cur, used = [], [], 0
        for i in idx:
            n = bodies[i].nbytes
            if cur and used + n > self.spec.batch_bytes:
                out.append(cur)
                cur, used = [], 0
            cur.append(i)
            used += n
        if cur:
            out.append(cur)
        return out

    # ------------------------------------------------------------ data path
    def put_many(self, names, heads, bodies) -> list[bool]:
        """The commands are generated while they are sent: ``heads[i]`` is read
        (a lazy header is computed) right after value i-1 went to the socket,
        so the tier's hashing overlaps the server reading the bytes before it."""
        ok = [False] * len(names)
        for server, idx in self._groups(names):
            for chunk in self._chunks(idx, bodies):
                for i, rep in zip(chunk, self._roundtrip(server, self._sets(chunk, names, heads, bodies),
                                                         len(chunk))):
                    ok[i] = rep == b"OK" or rep is True
        return ok

    @staticmethod
    def _sets(chunk, names, heads, bodies):
        """``SET name header+body`` of each value, scatter-gather: prefix + header, then the body itself."""
        tail = b""
        for i in chunk:
            h = heads[i]
            yield b"%s*3\r\n$3\r\nSET\r\n%s$%d\r\n%s" % (tail, _bulk(names[i]), len(h) + bodies[i].nbytes, h)
            yield bodies[i]
            tail = b"\r\n"
        yield tail

    def get_many(self, names, heads, bodies, done=None, loan=None) -> list[int]:
        """Pipelined GETs whose replies are read straight into ``heads``/``bodies``
        (store/remote/resp.py): no bytes object, no copy in Python; ``done``
        right after each value is read.  Every read happens on this thread
        before returning, so a ``loan`` changes nothing."""
        out = [MISSING] * len(names)
        for server, idx in self._groups(names):
            for chunk in self._chunks(idx, bodies):
                parts = [b"".join(_cmd(b"GET", names[i]) for i in chunk)]
                each = None if done is None else (lambda j, n, chunk=chunk: done(chunk[j], n))
                lengths = self._get_roundtrip(server, parts, [heads[i] for i in chunk],
                                              [bodies[i] for i in chunk], each)
                for i, n in zip(chunk, lengths):
                    out[i] = n
        return out

    def _get_roundtrip(self, server, parts: list, heads, bodies, done=None) -> list[int]:
        deadline = Deadline(self.spec.deadline_s)
        with self._connection(server, deadline) as conn:
            deadline.sendall(conn._sock, parts)
            return BulkReader(conn._sock, deadline=deadline).get_replies(heads, bodies, done)

    def exists(self, names) -> list[bool]:
        out = [False] * len(names)
        for server, idx in self._groups(names):
            parts = [b"".join(_cmd(b"EXISTS", names[i]) for i in idx)]
            for i, rep in zip(idx, self._roundtrip(server, parts, len(idx))):
                out[i] = rep == 1
        return out

    def delete(self, names) -> None:
        if not names:
            return
        for server, idx in self._groups(names):
            parts = [b"".join(_cmd(b"UNLINK", names[i]) for i in idx)]
            self._roundtrip(server, parts, len(idx))

    def health(self) -> bool:
        """PING every server; then one EXISTS, so an ACL user who may not
        touch ``kvtier:*`` keys shows as ``RemoteAuthFailed`` too."""
        try:
            for server, _ in self._groups([b"kvtier:health"]):
                rep = self._roundtrip(server, [_cmd(b"PING"), _cmd(b"EXISTS", b"kvtier:health")], 2)
                if rep[0] != b"PONG" or isinstance(rep[1], ReplyError):
                    return False
            if self.spec.kind == "redis-cluster":
                client = self._get_client()
                nodes = client.get_primaries()
                return bool(nodes) and all(client.get_redis_connection(n).ping() for n in nodes)
            return True
        except RemoteAuthFailed:
            raise
        except Exception:
            self._reset()
            return False

    def close(self) -> None:
        self._drop_client(closing=True)
