"""Tool-wait hints as engines carry them, into kvtier's placement.

``ToolHint`` and ``PlacementAdvisor`` (engine_adapter/plugin_common.py) need
no engine; the ``kv_hints`` case uses vLLM's real ``KvHintsEnvelope`` when
vLLM is installed."""
from __future__ import annotations

import hashlib

import logging

import pytest
from engines import need_engine

from kvtier.engine_adapter.hints import HintError, ToolHint
from kvtier.engine_adapter.plugin_common import KeyMemo, PlacementAdvisor, store_key
from kvtier.store import Namespace
from kvtier.tiering import make_policy
from kvtier.tiering.model.decision import Action
from kvtier.tiering.model.presets import get_node, get_preset


def test_hint_parsing_accepts_both_shapes_and_ignores_junk():
    # the wrapped form (kv_transfer_params) and the bare payload parse the same
    wrapped = {"kvtier": {"tool": "pytest", "trajectory_id": 7, "context_tokens": 1200, "expected_wait_s": 3}}
    assert ToolHint.parse(wrapped) == ToolHint.parse(wrapped["kvtier"]) == ToolHint(
        tool="pytest", trajectory_id="7", context_tokens=1200, expected_wait_s=3.0)
    # no hint at all: None, silently
    assert ToolHint.parse(None) is None
    assert ToolHint.parse({"do_remote_prefill": True}) is None
    # a malformed hint: None from parse, HintError (naming the field) from validate
    for bad, field in (({"tool": ""}, "tool"), ({"tool": 3}, "tool"), ({"tool": "x", "context_tokens": -1}, "context"),
                       ({"tool": "x", "expected_wait_s": float("nan")}, "expected_wait_s"),
                       ({"tool": "x", "context_tokens": 1.5}, "context_tokens")):
        assert ToolHint.parse({"kvtier": bad}) is None
        with pytest.raises(HintError, match=field):
            ToolHint.validate({"kvtier": bad})


class _Hostile:
    """An object whose every attribute read raises (a client-made envelope gone wrong)."""
    def __getattr__(self, name):
        raise RuntimeError("boom")


HOSTILE_HINTS = {
    "tool name of 129 characters": {"kvtier": {"tool": "t" * 129}},
    "tool name of 100,000 characters": {"kvtier": {"tool": "t" * 100_000}},
    "whitespace tool name": {"kvtier": {"tool": "   "}},
    "control characters in the tool name": {"kvtier": {"tool": "py\x00test\n"}},
    "tool name of the wrong type": {"kvtier": {"tool": ["pytest"]}},
    "absurd context_tokens": {"kvtier": {"tool": "pytest", "context_tokens": 10 ** 30}},
    "infinite context_tokens": {"kvtier": {"tool": "pytest", "context_tokens": float("inf")}},
    "negative expected wait": {"kvtier": {"tool": "pytest", "expected_wait_s": -5}},
    "absurd expected wait": {"kvtier": {"tool": "pytest", "expected_wait_s": 1e300}},
    "boolean context_tokens": {"kvtier": {"tool": "pytest", "context_tokens": True}},
    "trajectory id of 10,000 characters": {"kvtier": {"tool": "pytest", "trajectory_id": "x" * 10_000}},
    "control characters in the trajectory id": {"kvtier": {"tool": "pytest", "trajectory_id": "a\x1fb"}},
    "trajectory id of the wrong type": {"kvtier": {"tool": "pytest", "trajectory_id": {"a": 1}}},
    "huge integer trajectory id": {"kvtier": {"tool": "pytest", "trajectory_id": 10 ** 400}},
    "kvtier object of the wrong type": {"kvtier": "pytest"},
    "session id of the wrong type": {"session_id": [1, 2]},
    "session id with control characters": {"session_id": "s\x07"},
}


@pytest.mark.parametrize("case", sorted(HOSTILE_HINTS))
def test_hostile_hints_are_dropped_counted_and_never_raise(case):
    from kvtier.engine_adapter.hints import HintReader
    reader = HintReader()
    st = reader.read(HOSTILE_HINTS[case])
    # the bad part is dropped: no hint with a bad field and no bad trajectory reach the lifecycle
    assert st.hint is None or st.hint.tool == "pytest" and st.trajectory is None
    assert reader.rejected == 1


def test_hint_reader_survives_hostile_objects_and_logs_once_a_minute(caplog):
    from kvtier.engine_adapter.hints import HintReader
    caplog.set_level(logging.WARNING, logger="kvtier.engine")
    reader = HintReader()
    assert reader.read({"kvtier": {"tool": "x" * 500}}, _Hostile()).hint is None
    assert reader.read(None, _Hostile()).hint is None            # an envelope whose attributes raise
    for i in range(50):
        reader.read({"kvtier": {"tool": "\x00" * (i + 1)}})
    assert reader.rejected == 52
    lines = [r for r in caplog.records if "malformed hint" in r.getMessage()]
    assert len(lines) == 1                                       # 52 rejections, one line this minute
    # a good hint still reads, with its trajectory
    st = reader.read({"kvtier": {"tool": "pytest", "trajectory_id": "t-1"}})
    assert st.hint == ToolHint(tool="pytest", trajectory_id="t-1") and st.trajectory == "t-1"


def test_kv_hints_envelope_from_vllm():
    need_engine("vllm")
    import vllm.v1.kv_hints as protocol
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



def test_the_trajectory_is_the_hints_else_vllms_session_keys():
    from kvtier.engine_adapter.hints import HintReader
    read = HintReader().read
    # the hint's own trajectory wins; else vLLM's session keys, top level or inside the kvtier object
    assert read({"session_id": "s", "kvtier": {"tool": "x", "trajectory_id": "t"}}).trajectory == "t"
    for key in ("session_id", "conversation_id", "kv_session_id"):
        assert read({key: "s-1"}).trajectory == "s-1"
        assert read({"kvtier": {"tool": "x", key: 42}}).trajectory == "42"
    assert read({"session_id": ""}).trajectory is None
    assert read({"session_id": True}).trajectory is None      # a bad key names no trajectory
    assert read(None).trajectory is None


def test_a_null_tool_says_no_tool_follows_the_request():
    from kvtier.engine_adapter.hints import HintReader
    r = HintReader()
    end = r.read({"kvtier": {"tool": None, "trajectory_id": "t-1"}})
    assert end.ends and end.trajectory == "t-1" and end.hint is None
    assert r.read({"session_id": "s", "kvtier": {"tool": None}}).trajectory == "s"
    assert not r.read({"kvtier": {"tool": "pytest", "trajectory_id": "t-1"}}).ends
    assert not r.read({"kvtier": {"trajectory_id": "t-1"}}).ends       # no tool named: unhinted, not an end
    assert r.read({"kvtier": {"tool": None, "trajectory_id": ["x"]}}).trajectory is None and r.rejected == 1


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


# ------------------------------------------------------------------ a router's retag
RETAG = {"kvtier": {"retag": True, "trajectory_id": "t-1", "tool": "pytest", "forecast": "edit"}}


def test_a_retag_is_read_as_a_correction_and_never_as_a_request_of_the_trajectory():
    from kvtier.engine_adapter.hints import HintReader, Retag
    r = HintReader()
    st = r.read(RETAG)
    assert st.retag == Retag("t-1", "pytest", "edit") and st.hint is None and st.trajectory is None and not st.ends
    assert r.read({"kvtier": {"retag": True, "trajectory_id": 7, "tool": "ls"}}).retag == Retag("7", "ls", None)
    # a malformed retag is dropped whole: no correction, no hint, no trajectory (not even a session key's)
    for bad in ({"retag": "yes", "trajectory_id": "t", "tool": "x"}, {"retag": True, "tool": "x"},
                {"retag": True, "trajectory_id": "t"}, {"retag": True, "trajectory_id": "t", "tool": "\x00"},
                {"retag": True, "trajectory_id": "t", "tool": "x", "forecast": 5},
                {"retag": True, "trajectory_id": "t" * 300, "tool": "x", "session_id": "s"}):
        st = r.read({"session_id": "s", "kvtier": bad})
        assert (st.retag, st.hint, st.trajectory) == (None, None, None), bad
    assert r.rejected == 6


def test_a_retag_request_replans_the_paused_trajectory_on_vllms_request_shape(tmp_path):
    need_engine("vllm")
    from test_vllm_tier import BLOCKS_PER_CHUNK, BLOCK_TOKENS, Engine, chunk_keys, payload_for
    keys = chunk_keys(list(range(2 * BLOCKS_PER_CHUNK * BLOCK_TOKENS)))
    e = Engine(tmp_path, policy="breakeven", model="qwen3-0.6b")
    try:
        ctl = e.tier.lifecycle.controller
        # 1. a turn hinted with the router's forecast (edit) stores its chunks and pauses
        turn = e.new_request("r1", {"kvtier": {"tool": "edit", "trajectory_id": "t-1"}})
        e.offload(turn, keys, payload_for(keys, 4))
        e.settle()
        e.finish(turn)
        assert ctl.counter_values()["pauses"] == 1
        # 2. the router parsed pytest: its retag request (one token, no blocks) corrects the pause
        retag = e.new_request("retag-1", RETAG)
        assert e.tier.trajectory_of("retag-1") is None          # no trajectory of its own ...
        e.finish(retag)
        c = ctl.counter_values()
        assert c["retag:replanned"] == 1 and c["pauses"] == 1  # ... and no pause
        assert ctl.stats()["trajectories"] == 1
        assert [d for _, tid, what, d in ctl.events if what == "retag"] == ["edit -> pytest (replanned)"]
        # 3. the next turn resumes it: the wait is learned under the true tool
        nxt = e.new_request("r2", {"kvtier": {"tool": "ls", "trajectory_id": "t-1"}})
        ctl.learn()
        assert set(ctl.schedule.policy.predictor.tools()) == {"pytest"}
        e.finish(nxt)
        # 4. a retag for a trajectory the engine does not know, and a stale one, change nothing
        e.finish(e.new_request("retag-2", {"kvtier": {**RETAG["kvtier"], "trajectory_id": "other"}}))
        e.finish(e.new_request("retag-3", RETAG))              # t-1 now waits on ls, not edit
        c = ctl.counter_values()
        assert (c["retag:unknown"], c["retag:stale"], c["pauses"]) == (1, 1, 2)
    finally:
        e.shutdown()
