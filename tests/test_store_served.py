"""``get_many_served``: per key, the tier a read was served from (host frames, NVMe, or None),
and ``get_many``'s bools built from it.  Real files, real LMDB."""
from __future__ import annotations

import numpy as np

from kvtier.store import Tier, TieredStore
from test_store import BLOCK, block, cfg, key


def outs(n: int) -> list[np.ndarray]:
    return [np.full(BLOCK, 7, np.uint8) for _ in range(n)]


def test_each_key_names_the_tier_that_served_it(tmp_path):
    with TieredStore.open(cfg(tmp_path, io_engine="threads")) as st:
        st.put_many([key(0), key(1)], [block(0), block(1)], tier=Tier.HOST)
        st.put_many([key(2), key(3)], [block(2), block(3)], tier=Tier.NVME)
        ks = [key(2), key(0), key(9), key(3), key(1)]     # mixed order, one unknown key
        got = outs(len(ks))
        served = st.get_many_served(ks, got)
        assert served == [Tier.NVME, Tier.HOST, None, Tier.NVME, Tier.HOST]
        for i, o in zip([2, 0, 3, 1], [got[0], got[1], got[3], got[4]]):
            assert o.tobytes() == block(i).tobytes()
        assert st.get_many(ks, outs(len(ks))) == [True, True, False, True, True]
        s = st.stats()
        assert (s.hits_host, s.hits_nvme, s.misses) == (4, 4, 2)
        st.check_integrity()


def test_a_corrupt_nvme_block_is_served_by_no_tier(tmp_path):
    with TieredStore.open(cfg(tmp_path, io_engine="threads")) as st:
        st.put_many([key(0), key(1)], [block(0), block(1)], tier=Tier.NVME)
        path, off = st.locate(key(1))
        with open(path, "r+b") as f:
            f.seek(off + 10)
            f.write(b"\x00\xff" * 4)
        got = outs(2)
        assert st.get_many_served([key(0), key(1)], got) == [Tier.NVME, None]
        assert got[0].tobytes() == block(0).tobytes() and not got[1].any()
        assert st.where(key(1)) == frozenset()          # dropped: recomputable
        st.check_integrity()
