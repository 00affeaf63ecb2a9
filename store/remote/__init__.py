"""kvtier remote tier: KV blocks shared between nodes on an existing distributed store.

    from kvtier.store.remote import RemoteTier
    tier = RemoteTier.from_url("redis://127.0.0.1:6379", block_bytes=1 << 20)
    tier.wait_ready(5)
    tier.publish(keys, bufs); tier.fetch(keys, outs)

Backends: Redis / Redis Cluster (redis-py) and Mooncake Store
(``mooncake-transfer-engine-non-cuda``), both from the ``remote`` extra and
imported only when a URL names them.  See docs/remote.md.
"""
from .auth import BadRemoteKey, DomainKeys, load_encrypt, load_key
from .backend import CORRUPT, MISSING, RemoteAuthFailed, RemoteBackend, RemoteUnavailable
from .gauges import REMOTE_GAUGES, remote_gauges
from .tier import RemoteStats, RemoteTier, domain_tag, make_backend
from .url import BadRemoteURL, RemoteSpec, parse_remote_url

__all__ = ["RemoteTier", "RemoteStats", "RemoteBackend", "RemoteUnavailable", "RemoteSpec",
           "BadRemoteURL", "parse_remote_url", "make_backend", "domain_tag",
           "MISSING", "CORRUPT", "REMOTE_GAUGES", "remote_gauges", "RemoteAuthFailed",
           "BadRemoteKey", "DomainKeys", "load_key", "load_encrypt"]
