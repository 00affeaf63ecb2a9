"""Holds of paused requests' blocks in vLLM's own block pool (the real ``BlockPool``)."""
from __future__ import annotations

import pytest

from engines import need_engine

need_engine("vllm")

from vllm.v1.core.block_pool import BlockPool  # noqa: E402
from vllm.v1.core.kv_cache_utils import BlockHash, make_block_hash_with_group_id  # noqa: E402

from kvtier.engine_adapter.vllm_holds import BlockHolds, Release  # noqa: E402

POOL = 21          # 20 usable blocks and vLLM's null block


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def request_blocks(pool: BlockPool, n: int, tag: bytes, *, full: bool = True) -> list[int]:
    """``n`` blocks a request was allocated, full and cached (prefix-cache hashes) unless ``full`` is False."""
    blocks = pool.get_new_blocks(n)
    if full:
        for i, b in enumerate(blocks):
            b.set_block_hash(make_block_hash_with_group_id(BlockHash(tag + bytes([i]) * 31), 0))
    return [b.block_id for b in blocks]


def finish(pool: BlockPool, ids: list[int]) -> None:
    """The scheduler frees a finished request's blocks (tail first, as vLLM does)."""
    pool.free_blocks([pool.blocks[i] for i in reversed(ids)])


@pytest.fixture
def setup():
    pool, clock = BlockPool(POOL, True, 16), Clock()
    holds = BlockHolds(0.5, clock)
    holds.bind(pool)
    return pool, holds, clock


def test_a_held_request_keeps_its_blocks_cached_and_out_of_the_free_queue(setup):
    pool, holds, clock = setup
    ids = request_blocks(pool, 6, b"a")
    assert holds.hold("t", [ids], 5.0) == 6
    finish(pool, ids)
    assert pool.get_num_free_blocks() == 20 - 6            # nothing the request had is free
    assert all(pool.blocks[i].ref_cnt == 1 and pool.blocks[i].block_hash is not None for i in ids)
    got = pool.get_new_blocks(pool.get_num_free_blocks())   # allocate everything else: the held blocks survive
    assert not set(ids) & {b.block_id for b in got}
    assert all(pool.blocks[i].block_hash is not None for i in ids)
    assert holds.usage() == pytest.approx(1.0)


def test_the_lease_end_releases_the_blocks_as_cached_evictable_blocks(setup):
    pool, holds, clock = setup
    ids = request_blocks(pool, 4, b"a")
    holds.hold("t", [ids], 2.0)
    finish(pool, ids)
    clock.t = 1.9
    assert holds.release_due() == 0 and holds.held("t")
    clock.t = 2.0
    assert holds.release_due() == 4 and not holds.held("t")
    assert pool.get_num_free_blocks() == 20
    assert all(pool.blocks[i].ref_cnt == 0 and pool.blocks[i].block_hash is not None for i in ids)
    assert holds.counts()["released"]["lease"] == 1


def test_partial_and_shared_blocks_are_held_once_and_only_when_full(setup):
    pool, holds, _ = setup
    full = request_blocks(pool, 3, b"a")
    tail = request_blocks(pool, 1, b"", full=False)
    assert holds.hold("t", [full + tail, full], None) == 3   # the partial tail never hits; a block once
    finish(pool, full + tail)
    assert pool.blocks[tail[0]].ref_cnt == 0 and all(pool.blocks[i].ref_cnt == 1 for i in full)


def test_pressure_releases_the_last_lease_first_and_keeps_the_requesters_own(setup):
    pool, holds, _ = setup
    a, b, c = request_blocks(pool, 3, b"a"), request_blocks(pool, 3, b"b"), request_blocks(pool, 3, b"c")
    holds.hold("a", [a], 10.0)
    holds.hold("b", [b], None)          # no lease: the last
    holds.hold("c", [c], 30.0)
    for ids in (a, b, c):
        finish(pool, ids)
    assert pool.get_num_free_blocks() == 11
    assert holds.make_room(14, keep="b") == 3          # c (lease 30) goes; b is the requester's own
    assert holds.held("a") and holds.held("b") and not holds.held("c")
    assert holds.make_room(17) == 3 and not holds.held("b")
    assert holds.counts()["released"]["pressure"] == 2
    assert holds.make_room(100) == 3 and holds.held_blocks == 0


def test_the_cap_bounds_what_is_held(setup):
    pool, holds, _ = setup
    assert holds.capacity == 10
    big = request_blocks(pool, 11, b"x")
    assert holds.hold("big", [big], 1.0) == 0 and holds.counts()["refused"] == 1
    finish(pool, big)
    a, b = request_blocks(pool, 6, b"a"), request_blocks(pool, 6, b"b")
    holds.hold("a", [a], 1.0)
    holds.hold("b", [b], 2.0)            # 12 > 10: a's hold makes way
    assert not holds.held("a") and holds.held_blocks == 6
    assert holds.counts()["released"]["cap"] == 1


def test_a_resume_takes_the_held_blocks_and_ends_the_hold(setup):
    pool, holds, _ = setup
    ids = request_blocks(pool, 5, b"a")
    holds.hold("t", [ids], 9.0)
    finish(pool, ids)
    pool.touch([pool.blocks[i] for i in ids])            # the next request's prefix hit
    new = ids + [b.block_id for b in pool.get_new_blocks(2)]
    assert holds.resumed("t", [new]) == 5
    assert not holds.held("t") and all(pool.blocks[i].ref_cnt == 1 for i in ids)
    c = holds.counts()
    assert c["served_resumes"] == 1 and c["served_blocks"] == 5 and c["released"]["resumed"] == 1
    assert holds.resumed("t", [new]) == 0                 # nothing held any more


def test_a_second_hold_of_a_trajectory_replaces_the_first_and_release_all_empties(setup):
    pool, holds, _ = setup
    a1, a2 = request_blocks(pool, 2, b"a"), request_blocks(pool, 3, b"b")
    holds.hold("t", [a1], 1.0)
    holds.hold("t", [a2], 1.0)
    assert holds.held_blocks == 3 and holds.counts()["released"]["replaced"] == 1
    assert holds.release_all(Release.SHUTDOWN) == 3 and holds.held_blocks == 0


def test_nothing_is_held_before_the_pool_is_bound_and_the_share_is_checked():
    holds = BlockHolds(0.5, Clock())
    assert holds.capacity == 0 and holds.hold("t", [[1, 2]], 1.0) == 0 and holds.usage() == 0.0
    for bad in (0.0, 1.0, -0.1):
        with pytest.raises(ValueError):
            BlockHolds(bad, Clock())
