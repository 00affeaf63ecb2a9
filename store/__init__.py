"""kvtier store: KV blocks as bytes in host DRAM and on NVMe.

    from kvtier.store import TieredStore, StoreConfig
    with TieredStore.open(StoreConfig(root="data", host_bytes=1 << 30,
                                      nvme_bytes=8 << 30, block_bytes=1 << 20)) as st:
        st.put(key, data); st.get(key, out); st.lookup(keys)

Never imports torch at module level (the pinned-memory path imports it lazily).
"""
from .config import StoreConfig
from .errors import (BadBuffer, BadHandle, BadKey, ConfigMismatch, CorruptRecord, DiskFull, IndexCorrupt,
                     IntegrityError, OldLayout, RootLocked, StoreClosed, StoreError, StoreFull, StoreIOError)
from .protocol import BlockStore
from .keys import Namespace, block_key, chain_keys
from .tiered import TieredStore, use_remote_store
from .types import (IntegrityReport, LoadSlot, PrepareLoadResult, PrepareStoreResult, StoreSlot,
                    StoreStats, HostFrames, Tier, checksum)



def _open_remote_store(config: StoreConfig) -> TieredStore:
    """A store with the remote tier below (imported only when a config names a remote)."""
    from .remote.store import RemoteTieredStore
    return RemoteTieredStore(config)


use_remote_store(_open_remote_store)

__all__ = [
    "TieredStore", "BlockStore", "StoreConfig", "Tier", "StoreStats", "HostFrames", "IntegrityReport",
    "PrepareStoreResult", "PrepareLoadResult", "StoreSlot", "LoadSlot",
    "Namespace", "block_key", "chain_keys", "checksum",
    "StoreError", "StoreClosed", "BadKey", "BadBuffer", "BadHandle", "StoreFull", "DiskFull",
    "StoreIOError", "ConfigMismatch", "RootLocked", "IntegrityError",
    "CorruptRecord", "IndexCorrupt", "OldLayout",
]
