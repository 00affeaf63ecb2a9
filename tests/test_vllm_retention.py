"""Retention's side of vLLM's admission: holds give way so that vLLM's own
``KVCacheManager`` admits a waiting request, and a stalled engine releases them.

The block pool, the manager and the requests are vLLM's own; the tier is the
least :class:`Retention` reads of it (request -> trajectory, kvtier's firewall).
"""
from __future__ import annotations

import logging

import pytest

from engines import need_engine

need_engine("vllm")

import torch  # noqa: E402
from vllm import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_manager import KVCacheManager  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec  # noqa: E402
from vllm.v1.request import Request  # noqa: E402

from kvtier.engine_adapter.firewall import Firewall  # noqa: E402
from kvtier.engine_adapter.vllm_holds import BlockHolds, Release  # noqa: E402
from kvtier.engine_adapter.vllm_retention import Retention  # noqa: E402
from kvtier.engine_adapter.wiring import Retained  # noqa: E402

BS, USABLE = 16, 40
init_none_hash(sha256)
HASHER = get_request_block_hasher(BS, sha256)


class Plans:
    """What Retention reads of the lifecycle: the pauses a retag planned again, and whether
    (and for how long) a pause's plan retains it."""

    def __init__(self) -> None:
        self.replanned: list[str] = []
        self.leases: dict[str, float | None] = {}

    def take_replanned(self) -> list[str]:
        out, self.replanned = self.replanned, []
        return out

    def retained(self, tid: str) -> Retained | None:
        return Retained(self.leases[tid]) if tid in self.leases else None


class Tier:
    """What Retention reads of kvtier's tier: each request's trajectory, the lifecycle's
    plans, and the firewall."""

    def __init__(self) -> None:
        self.trajectories: dict[str, str] = {}
        self.lifecycle = Plans()
        self.firewall = Firewall(logging.getLogger("test"))

    def trajectory_of(self, request_id: str) -> str | None:
        return self.trajectories.get(request_id)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def engine():
    cfg = KVCacheConfig(num_blocks=USABLE + 1, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["layer0"], FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype=torch.float32))])
    manager = KVCacheManager(cfg, max_model_len=4096, scheduler_block_size=BS, hash_block_size=BS, enable_caching=True)
    tier, clock = Tier(), Clock()
    holds = BlockHolds(0.9, clock)
    holds.bind(manager.block_pool)
    return manager, tier, holds, Retention(tier, holds, block_tokens=BS, clock=clock), clock


def run(manager: KVCacheManager, tier: Tier, rid: str, tid: str, tokens: list[int]) -> tuple:
    """A request of trajectory ``tid`` admitted, computed and finished; returns its block ids."""
    tier.trajectories[rid] = tid
    r = Request(rid, tokens, SamplingParams(max_tokens=1), None, block_hasher=HASHER)
    blocks = manager.allocate_slots(r, len(tokens), full_sequence_must_fit=True)
    assert blocks is not None
    r.num_computed_tokens = len(tokens)
    ids = blocks.get_block_ids()
    manager.free(r)
    return ids


def admit(manager: KVCacheManager, retention: Retention, tier: Tier, rid: str, tid: str, tokens: list[int]):
    """vLLM's admission of a waiting request, as its scheduler does it: the local
    hit, the connector's hook, then ``allocate_slots`` with the full input reserved."""
    tier.trajectories[rid] = tid
    r = Request(rid, tokens, SamplingParams(max_tokens=1), None, block_hasher=HASHER)
    hit_blocks, hit, *_ = manager.get_computed_blocks(r)
    retention.waiting(r, hit - hit % BS)
    return hit, manager.allocate_slots(r, len(tokens) - hit, num_new_computed_tokens=hit,
                                       new_computed_blocks=hit_blocks, full_sequence_must_fit=True)


def tokens(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def test_holds_give_way_to_a_resume_whose_own_hit_is_evictable(engine):
    manager, tier, holds, retention, _ = engine
    a = tokens(10_000, 16 * BS)
    run(manager, tier, "a1", "a", a)                     # a's 16 blocks, freed and cached (its hold let go)
    other = run(manager, tier, "o1", "o", tokens(50_000, 24 * BS))
    assert holds.hold("o", other, None) == 24             # another pause keeps the rest of the pool
    assert manager.block_pool.get_num_free_blocks() == 16

    hit, blocks = admit(manager, retention, tier, "a2", "a", a + tokens(20_000, 40))
    assert hit == 16 * BS                                # a's prefix was still cached, but evictable:
    assert blocks is not None                            # vLLM asks for it as free blocks, and got them
    assert not holds.held("o") and holds.counts()["released"]["pressure"] == 1


def test_a_resume_keeps_its_own_hold_when_the_rest_of_the_pool_fits_it(engine):
    manager, tier, holds, retention, _ = engine
    a = tokens(10_000, 16 * BS)
    assert holds.hold("a", run(manager, tier, "a1", "a", a), None) == 16
    other = run(manager, tier, "o1", "o", tokens(50_000, 20 * BS))
    holds.hold("o", other, 5.0)                           # 36 of 40 held

    hit, blocks = admit(manager, retention, tier, "a2", "a", a + tokens(20_000, 40))
    assert hit == 16 * BS and blocks is not None         # its held prefix, and 3 blocks from the 4 free
    assert holds.held("o") and holds.counts()["released"]["pressure"] == 0


def test_an_engine_that_schedules_nothing_lets_its_holds_go_after_the_stall_bound(engine):
    manager, tier, holds, retention, clock = engine
    holds.hold("x", run(manager, tier, "x1", "x", tokens(10_000, 10 * BS)), None)
    holds.hold("y", run(manager, tier, "y1", "y", tokens(30_000, 10 * BS)), 9.0)

    retention.step(0)                                    # the first empty step starts the count
    clock.t += Retention.STALL_S / 2
    retention.step(0)
    assert holds.held_blocks == 20                       # within the bound: nothing released
    retention.step(64)                                   # the engine scheduled: the count starts again
    clock.t += Retention.STALL_S
    retention.step(0)
    assert holds.held_blocks == 20

    clock.t += Retention.STALL_S
    retention.step(0)                                    # stalled past the bound: one hold a step,
    assert not holds.held("x") and holds.held("y")       # the last lease first
    retention.step(0)
    assert holds.held_blocks == 0
    assert holds.counts()["released"][str(Release.STALL)] == 2
    assert tier.firewall.counts()["contained_errors"] == 0


def test_a_hold_follows_its_pause_when_a_retag_plans_it_again(engine):
    manager, tier, holds, retention, clock = engine
    holds.hold("x", run(manager, tier, "x1", "x", tokens(10_000, 4 * BS)), 30.0)
    holds.hold("y", run(manager, tier, "y1", "y", tokens(30_000, 4 * BS)), 30.0)
    clock.t = 2.0
    tier.lifecycle.leases = {"y": 5.0}                   # x's new plan lets it go, y's holds it 5 s from its start
    tier.lifecycle.replanned = ["x", "y", "z"]           # z: a retagged pause nothing holds
    retention.step(16)
    assert not holds.held("x") and holds.held("y")
    assert holds.counts()["released"][str(Release.REPLANNED)] == 1
    clock.t = 4.9
    retention.step(16)
    assert holds.held("y")
    clock.t = 5.0                                        # the new lease, from when the hold was taken
    retention.step(16)
    assert not holds.held("y") and holds.counts()["released"]["lease"] == 1
    assert tier.firewall.counts()["contained_errors"] == 0
