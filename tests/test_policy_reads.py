"""A resume's read-or-recompute choice for a chunk kept only on a lower tier (``Policy.reads``).

The seed prices a resume from NVMe as its read (NVMe -> host, overlapping host ->
device) against prefilling the context again.  On the seed's 70B the 8 x H100
node prefills a context faster than its one 7 GB/s drive reads it, while one
accelerator behind PCIe Gen4 reads it in about a quarter of a prefill.
"""
from __future__ import annotations

import pytest

from kvtier.tiering.lifecycle.service_policy import ServicePolicy
from kvtier.tiering.model.costmodel import t_nvme_read, t_recompute, t_reload
from kvtier.tiering.model.presets import get_node, get_preset
from kvtier.tiering.model.tiers import Tier
from kvtier.tiering.policy.policies import make_policy

GEOM = get_preset("llama-3.1-70b")
CHUNK = 256


@pytest.mark.parametrize("name", ["breakeven", "breakeven_point", "oracle"])
def test_breakeven_reads_nvme_only_where_the_read_beats_the_prefill(name):
    for node in ("h100x8", "pcie4"):
        hw = get_node(node)
        pol = make_policy(name, geometry=GEOM, hardware=hw)
        nbytes = GEOM.kv_bytes(CHUNK)
        read = max(t_nvme_read(nbytes, hw), t_reload(nbytes, hw))
        assert pol.reads(Tier.NVME, CHUNK) is (read <= t_recompute(GEOM, CHUNK, hw))
    assert make_policy(name, geometry=GEOM, hardware=get_node("h100x8")).reads(Tier.NVME, CHUNK) is False
    assert make_policy(name, geometry=GEOM, hardware=get_node("pcie4")).reads(Tier.NVME, CHUNK) is True


def test_other_tiers_and_empty_chunks_are_read_and_a_negative_count_is_refused():
    pol = make_policy("breakeven", geometry=GEOM, hardware=get_node("h100x8"))
    assert pol.reads(Tier.REMOTE, CHUNK) and pol.reads(Tier.HOST, CHUNK) and pol.reads(Tier.NVME, 0)
    with pytest.raises(ValueError, match="token count"):
        pol.reads(Tier.NVME, -1)


@pytest.mark.parametrize("name", ["lru", "eager", "point", "ttl_reload", "recompute"])
def test_rules_without_a_read_price_read_whatever_is_kept(name):
    pol = make_policy(name, geometry=GEOM, hardware=get_node("h100x8"))
    assert pol.reads(Tier.NVME, CHUNK) is True


def test_the_service_policy_reads_as_its_local_policy():
    local = make_policy("breakeven", geometry=GEOM, hardware=get_node("h100x8"))
    svc = ServicePolicy("http://127.0.0.1:9", "llama-3.1-70b", local=local)
    try:
        assert svc.reads(Tier.NVME, CHUNK) is False and svc.reads(Tier.HOST, CHUNK) is True
    finally:
        svc.close()


def test_an_engine_reads_as_a_plain_tier_without_a_policy_a_chunk_size_or_when_the_policy_fails():
    from kvtier.engine_adapter.resume_reads import reads_nvme
    told = []
    pol = make_policy("breakeven", geometry=GEOM, hardware=get_node("h100x8"))
    assert reads_nvme(pol, CHUNK, lambda *a: told.append(a)) is False
    assert reads_nvme(None, CHUNK, lambda *a: told.append(a)) is True
    assert reads_nvme(pol, 0, lambda *a: told.append(a)) is True
    assert told == []

    class Broken:
        def reads(self, tier, tokens):
            raise RuntimeError("boom")
    assert reads_nvme(Broken(), CHUNK, lambda *a: told.append(a)) is True
    assert [w for w, _ in told] == ["reads"] and isinstance(told[0][1], RuntimeError)
