"""Tool-wait hints as engines carry them, into kvtier's placement.

``ToolHint`` and ``PlacementAdvisor`` (engine_adapter/plugin_common.py) need
no engine; the ``kv_hints`` case uses vLLM's real ``KvHintsEnvelope`` when
vLLM is installed."""
from __future__ import annotations

import hashlib

import logging

import pytest

from kvtier.engine_adapter.hints import ToolHint
from kvtier.engine_adapter.plugin_common import KeyMemo, PlacementAdvisor, store_key
from kvtier.store import Namespace
from kvtier.tiering import make_policy
from kvtier.tiering.decision import Action
from kvtier.tiering.presets import get_node, get_preset


def test_hint_parsing_accepts_both_shapes_and_ignores_junk(caplog):
    # the wrapped form (kv_transfer_params) and the bare payload parse the same
    wrapped = {"kvtier": {"tool": "pytest", "trajectory_id": 7, "context_tokens": 1200, "expected_wait_s": 3}}
    assert ToolHint.parse(wrapped) == ToolHint.parse(wrapped["kvtier"]) == ToolHint(
        tool="pytest", trajectory_id="7", context_tokens=1200, expected_wait_s=3.0)
    # no hint at all: None, silently
    assert ToolHint.parse(None) is None
    assert ToolHint.parse({"do_remote_prefill": True}) is None
    # a malformed hint: None, and one warning that says why
    caplog.set_level(logging.WARNING, logger="kvtier.engine")
    for bad in ({"tool": ""}, {"tool": 3}, {"tool": "x", "context_tokens": -1},
                {"tool": "x", "expected_wait_s": float("nan")}, {"tool": "x", "context_tokens": 1.5}):
        assert ToolHint.parse({"kvtier": bad}) is None
    assert len([r for r in caplog.records if "malformed hint" in r.getMessage()]) == 5


def test_kv_hints_envelope_from_vllm():
    protocol = pytest.importorskip("vllm.v1.kv_hints", reason="vllm not installed (ci/requirements-engines.txt)")
    env = protocol.KvHintsEnvelope(protocol_version="1", message_id="m1", actions=[
        protocol.KvHintAction(action_id="a0", action_type="other.vendor", action_version="1", payload={"tool": "no"}),
        protocol.KvHintAction(action_id="a1", action_type="kvtier.tool_wait", action_version="1",
                              payload={"tool": "web_search", "trajectory_id": "t-3"})])
    assert ToolHint.from_kv_hints(env) == ToolHint(tool="web_search", trajectory_id="t-3")
    assert ToolHint.from_kv_hints(None) is None


def test_advisor_maps_policy_actions_to_tiers():
    geo, hw = get_preset("qwen2.5-0.5b"), get_node("h100x8")
    hint = ToolHint(tool="pytest")
    cases = {"recompute": (None, Action.RECOMPUTE), "offload_host": ("host", Action.OFFLOAD_HOST),
             "retain": ("host", Action.RETAIN)}
    for name, (tier, action) in cases.items():
        adv = PlacementAdvisor("nvme", policy=make_policy(name, geometry=geo, hardware=hw))
        p = adv.place(hint, kv_bytes=1 << 20, context_tokens=64)
        assert (p.tier, p.action, p.source) == (tier, action, "policy")
        # no hint: the default tier, whatever the policy
        assert adv.place(None, kv_bytes=1 << 20, context_tokens=64).tier == "nvme"
    # a store without a host tier: host placements go to NVMe
    adv = PlacementAdvisor("nvme", policy=make_policy("offload_host", geometry=geo, hardware=hw), host_available=False)
    assert adv.place(hint, kv_bytes=1, context_tokens=1).tier == "nvme"
    assert adv.counts() == {"offload_host": 1}
    with pytest.raises(ValueError, match="default_tier"):
        PlacementAdvisor("disk")



def test_trajectory_of_reads_hints_and_vllm_session_keys():
    from kvtier.engine_adapter.hints import trajectory_of
    # the hint's own trajectory wins; else vLLM's session keys, top level or inside the kvtier object
    assert trajectory_of({"session_id": "s"}, ToolHint(tool="x", trajectory_id="t")) == "t"
    for key in ("session_id", "conversation_id", "kv_session_id"):
        assert trajectory_of({key: "s-1"}, None) == "s-1"
        assert trajectory_of({"kvtier": {"tool": "x", key: 42}}, None) == "42"
    assert trajectory_of({"session_id": ""}, None) is None
    assert trajectory_of({"session_id": True}, None) is None
    assert trajectory_of(None, None) is None


def test_store_keys_are_namespaced_and_stable():
    a = Namespace(model_id="m", dtype="bfloat16", layout="sglang:page_first:page64", tp_rank=0)
    b = Namespace(model_id="m", dtype="bfloat16", layout="sglang:page_first:page64", tp_rank=1)
    k = "ab" * 32
    # same engine key, same namespace: same store key, every time (a reopened store finds it)
    assert store_key(a, k) == store_key(a, k) and len(store_key(a, k)) == 16
    # another rank (or model, dtype, layout): another key
    assert store_key(a, k) != store_key(b, k)
    # the on-disk contract (stores written by earlier versions are found): blake2b of the
    # namespace digest then the raw engine key, personalised "kvtier.engine", for any mix of calls
    for ns, raw in [(a, k.encode()), (b, b"\x00" * 3000), (a, b"x"), (b, k.encode())]:
        want = hashlib.blake2b(ns.digest + raw, digest_size=16, person=b"kvtier.engine").digest()
        assert store_key(ns, raw) == want
    # str and bytes engine keys are both accepted; junk is a ValueError
    assert store_key(a, b"\x01\x02") != store_key(a, "0102")
    for bad in ("", b"", None, 3):
        with pytest.raises(ValueError):
            store_key(a, bad)


def test_key_memo_hashes_each_engine_key_once_and_stays_bounded():
    a = Namespace(model_id="m", dtype="bfloat16", layout="vllm:chunk1x16:w1", tp_rank=0)
    made = []

    def make(k):
        made.append(k)
        return store_key(a, k)
    memo = KeyMemo(make, cap=3)
    ks = [b"\x01" * 34, "ab" * 32, b"\x02" * 34]
    assert memo(ks) == [store_key(a, k) for k in ks]
    assert memo.one(ks[0]) == store_key(a, ks[0]) and memo(ks[1:]) == [store_key(a, k) for k in ks[1:]]
    assert len(made) == 3                                   # str and bytes keys: hashed once
    memo.one(bytearray(b"\x03" * 4))
    memo.one(bytearray(b"\x03" * 4))
    assert len(made) == 5                                   # unhashable kinds: every time
    memo.one(b"\x04")                                       # the 4th key: the memo starts over
    memo.one(ks[0])
    assert len(made) == 7 and len(memo._d) <= 3
    with pytest.raises(ValueError):
        memo.one("")
