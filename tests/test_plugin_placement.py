"""A store job's tier is decided once: the lifecycle's ``place`` answers a
Placement already on the store's tiers, carrying its overflow, and the write
follows it (``Placement.write``): a host write the frames cannot take whole
goes to NVMe there, and nowhere else is a tier decided again."""
from __future__ import annotations

import pytest

from kvtier.engine_adapter.hints import ToolHint
from kvtier.engine_adapter.plugin_common import Placement, PlacementAdvisor, StoreTiers, Stored
from kvtier.engine_adapter.wiring import NoLifecycle
from kvtier.store import StoreConfig, StoreFull, TieredStore
from kvtier.tiering.model.decision import Action, Decision, Policy
from kvtier.util.tiers import Tier
from kvtier_testutil import key, random_block

BLOCK = 4096


class Always(Policy):
    """A policy that answers one action for every pause."""

    def __init__(self, action: Action) -> None:
        self.action = action

    def decide(self, ctx):
        return Decision(self.action)


@pytest.mark.parametrize("tiers, decided, placed", [
    (StoreTiers(host=False, nvme=True), Tier.HOST, Tier.NVME),     # no host frames: NVMe
    (StoreTiers(host=True, nvme=False), Tier.NVME, Tier.HOST),     # no NVMe slots: host frames
    (StoreTiers(host=True, nvme=False), Tier.HOST, Tier.HOST),
    (StoreTiers(host=True, nvme=True), None, None),                # recompute stays recompute
])
def test_a_placement_names_only_a_tier_the_store_has(tiers, decided, placed):
    assert tiers.tier(decided) is placed


def test_the_overflow_of_a_host_placement_is_nvme_where_the_store_has_it():
    assert StoreTiers(host=True, nvme=True).resolve(Placement(Tier.HOST)).overflow is Tier.NVME
    assert StoreTiers(host=True, nvme=False).resolve(Placement(Tier.HOST)).overflow is None
    assert StoreTiers(host=True, nvme=True).resolve(Placement(Tier.NVME)).overflow is None


def test_the_lifecycles_place_answers_on_the_stores_tiers():
    # the advisor's policy says offload_host; a store without host frames gets NVMe, decided there
    advisor = PlacementAdvisor("host", policy=Always(Action.OFFLOAD_HOST))
    lc = NoLifecycle(advisor, tiers=StoreTiers(host=False, nvme=True))
    p = lc.place(None, ToolHint(tool="pytest"), [key(1)], tokens_per_block=16, block_bytes=BLOCK)
    assert (p.tier, p.action, p.source, p.overflow) == (Tier.NVME, Action.OFFLOAD_HOST, "policy", None)
    recompute = NoLifecycle(PlacementAdvisor("host", policy=Always(Action.RECOMPUTE)))
    assert recompute.place(None, ToolHint(tool="pytest"), [key(1)], tokens_per_block=16,
                           block_bytes=BLOCK).tier is None


@pytest.fixture
def store(tmp_path):
    with TieredStore.open(StoreConfig(root=tmp_path / "s", host_bytes=2 * BLOCK, nvme_bytes=16 * BLOCK,
                                      block_bytes=BLOCK)) as s:
        yield s


def test_a_host_write_larger_than_the_frames_goes_to_its_overflow(store):
    # 4 blocks, 2 host frames: the store refuses the host write whole (StoreFull), the placement's
    # overflow takes it; nothing is half-stored in host frames
    keys = [key(i) for i in range(4)]
    data = [random_block(i, BLOCK) for i in range(4)]
    p = StoreTiers(host=True, nvme=True).resolve(Placement(Tier.HOST))
    tried: list[Tier] = []

    def put(tier: Tier) -> int:
        tried.append(tier)
        return store.put_many(keys, data, tier=tier)
    assert p.write(put) == Stored(Tier.NVME, 4)
    assert tried == [Tier.HOST, Tier.NVME]
    assert all(store.where(k) == frozenset({Tier.NVME}) for k in keys)
    store.check_integrity()


def test_without_an_overflow_a_full_tier_raises_and_recompute_writes_nothing(store):
    keys = [key(i) for i in range(4)]
    data = [random_block(i, BLOCK) for i in range(4)]
    with pytest.raises(StoreFull):
        Placement(Tier.HOST).write(lambda tier: store.put_many(keys, data, tier=tier))
    with pytest.raises(ValueError):
        Placement(None).write(lambda tier: store.put_many(keys, data, tier=tier))
    assert not any(store.contains(k) for k in keys)
