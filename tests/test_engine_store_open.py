"""An engine's store open (kvtier.engine_adapter.store_open): a root the store refuses (its
format marker deleted or garbled, another layout) is deleted and a new store opens; a root
another process holds is still refused.  Real stores on real files."""
from __future__ import annotations

import hashlib

import numpy as np
import pytest

from kvtier.engine_adapter.store_open import ASIDE_SUFFIX, open_engine_store
from kvtier.store import RootLocked, StoreConfig, StoreError, TieredStore

BLOCK = 16 << 10


def key(i: int) -> bytes:
    return hashlib.blake2b(i.to_bytes(8, "little"), digest_size=16).digest()


def cfg(tmp_path, **kw) -> StoreConfig:
    base = dict(root=tmp_path / "store", host_bytes=0, nvme_bytes=32 * (BLOCK + 4096), block_bytes=BLOCK,
                slab_bytes=16 * (BLOCK + 4096), queue_depth=4, io_engine="threads")
    base.update(kw)
    return StoreConfig(**base)


def _fill(c: StoreConfig, n: int = 6) -> None:
    with TieredStore.open(c) as st:
        st.put_many([key(i) for i in range(n)],
                    [np.full(BLOCK, i, dtype=np.uint8) for i in range(n)])


@pytest.mark.parametrize("damage", ["deleted", "garbled", "other-version"])
def test_a_root_with_a_bad_format_marker_is_discarded_and_a_new_store_opens(tmp_path, damage, caplog):
    c = cfg(tmp_path)
    _fill(c)
    marker = c.root_path / "FORMAT"
    if damage == "deleted":
        marker.unlink()
    elif damage == "garbled":
        marker.write_bytes(b"\xff\xfe" + bytes(30))
    else:
        marker.write_text("kvtier store format 9\n")
    with pytest.raises(StoreError):
        TieredStore.open(c).close()                  # the store itself refuses it
    with open_engine_store(c) as st:                 # the engine's open does not
        assert not st.contains(key(0))               # a new, empty store: every block a miss
        st.put_many([key(99)], [np.ones(BLOCK, dtype=np.uint8)])
        assert st.contains(key(99))
    assert [p.name for p in tmp_path.iterdir()] == ["store"]      # nothing left beside it
    assert any("Deleted it" in r.getMessage() for r in caplog.records)


def test_another_layout_is_discarded_too_and_a_half_deleted_one_is_removed_next_time(tmp_path):
    _fill(cfg(tmp_path))
    other = cfg(tmp_path, block_bytes=2 * BLOCK, nvme_bytes=32 * (2 * BLOCK + 4096),
                slab_bytes=16 * (2 * BLOCK + 4096))
    open_engine_store(other).close()                 # ConfigMismatch -> deleted, new root
    leftover = tmp_path / ("store" + ASIDE_SUFFIX)   # what a crash mid-delete would leave
    (leftover / "slabs").mkdir(parents=True)
    (cfg(tmp_path).root_path / "FORMAT").unlink()    # damage the new root as well
    open_engine_store(other).close()
    assert [p.name for p in tmp_path.iterdir()] == ["store"]


def test_a_root_another_store_holds_is_still_refused(tmp_path):
    c = cfg(tmp_path)
    with TieredStore.open(c):
        with pytest.raises(RootLocked):
            open_engine_store(c)
    assert not c.root_path.with_name(c.root_path.name + ASIDE_SUFFIX).exists()
