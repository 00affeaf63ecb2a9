"""The transformers hook: pause -> offload/drop -> prefetch -> resume, against an uninterrupted run.

Real tiny models (seeded random weights, 2 layers, hidden 64, fp32, greedy),
a real TieredStore on disk, real movers.  The policies below are ordinary
``Policy`` implementations that return a fixed action (the hook must accept
any policy) and record what they were told.
"""
from __future__ import annotations

import gc
import weakref

import pytest
import torch

from kvtier.engine_adapter.hf import AgentSession, SessionError
from kvtier.store.config import StoreConfig
from kvtier.store.tiered import TieredStore
from kvtier.tiering.model.decision import Action, Decision, PauseContext, Policy
from kvtier_testutil import session_store, tiny

BLOCK = 8
PROMPT = [(7 * i + 3) % 100 for i in range(21)]        # 2 full blocks + a partial one
OBS = [11, 12, 13, 14]
GEN = 5


class FixedPolicy(Policy):
    """Always the same action; remembers every PauseContext and observed wait."""

    name = "fixed"

    def __init__(self, action: Action, prefetch_at_s: float | None = 0.0) -> None:
        self.action, self.prefetch_at_s = action, prefetch_at_s
        self.contexts: list[PauseContext] = []
        self.observed: list[tuple[str, float]] = []

    def decide(self, ctx: PauseContext) -> Decision:
        self.contexts.append(ctx)
        return Decision(self.action, prefetch_at_s=self.prefetch_at_s, reason="test")

    def observe(self, tool, wait_s, features=None) -> None:
        self.observed.append((tool, wait_s))


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def model(request):
    return tiny(request.param)


@pytest.fixture
def store(tmp_path, model):
    with session_store(tmp_path / "store", model, BLOCK) as s:
        yield s


@pytest.fixture(scope="module")
def reference(model, tmp_path_factory):
    """The uninterrupted run: turn 1, observation, turn 2, observation, turn 3."""
    fmt = AgentSession.frame_format(model, BLOCK)
    cfg = StoreConfig(root=tmp_path_factory.mktemp("ref"), host_bytes=fmt.frame_bytes,
                      nvme_bytes=fmt.frame_bytes, block_bytes=fmt.frame_bytes)
    with TieredStore.open(cfg) as st, AgentSession(model, store=st, policy=FixedPolicy(Action.RETAIN),
                                                   block_tokens=BLOCK) as s:
        s.start("r", PROMPT)
        turns = [s.generate("r", GEN)]
        for _ in range(2):
            s.append("r", OBS)
            turns.append(s.generate("r", GEN))
    return turns


def session(model, store, policy):
    return AgentSession(model, store=store, policy=policy, block_tokens=BLOCK, layer_groups=2)


@pytest.mark.parametrize("action,path", [(Action.OFFLOAD_HOST, "auto"), (Action.OFFLOAD_NVME, "auto"),
                                         (Action.OFFLOAD_HOST, "staged"), (Action.OFFLOAD_NVME, "two_phase")])
def test_offload_round_trip_is_bit_identical_to_uninterrupted_run(model, store, reference, action, path):
    policy = FixedPolicy(action)
    # "auto" offloads host-bound blocks two-phase and NVMe-bound ones staged; the others swap that
    with AgentSession(model, store=store, policy=policy, block_tokens=BLOCK, offload_path=path) as s:
        s.start("t", PROMPT)
        # turn 1, then the agent calls a tool: its KV leaves the device
        assert s.generate("t", GEN).tokens == reference[0].tokens
        p = s.pause("t", "pytest")
        assert p.action == action and p.bytes_moved == 4 * s.fmt.frame_bytes    # 25 tokens -> 4 blocks
        assert s.device_kv_bytes("t") == 0
        # blocks sit in the tier the policy asked for
        tier = "nvme" if action == Action.OFFLOAD_NVME else "host"
        assert all(tier in {str(t) for t in store.where(k)} for k in s.trajectories.get("t").reload.keys)
        # tool returns; the prefetch (started at 0 s) is done first -> no stall
        assert s.wait_prefetched("t", timeout=30)
        r = s.resume("t", OBS)
        assert r.prefetched and r.resume_stall_s == 0.0 and r.bytes_loaded == p.bytes_moved
        out = s.generate("t", GEN)
        # tokens AND logits identical to the run that never paused
        assert out.tokens == reference[1].tokens
        assert torch.equal(out.logits, reference[1].logits)
        # the policy saw the pause and learned the wait
        ctx = policy.contexts[0]
        assert (ctx.tool, ctx.context_tokens, ctx.trajectory_id) == ("pytest", len(PROMPT) + GEN - 1, "t")
        assert ctx.kv_bytes == p.kv_bytes and policy.observed[0][0] == "pytest"


def test_recompute_rebuilds_by_prefill_tokens_identical_logits_close(model, store, reference):
    with session(model, store, FixedPolicy(Action.RECOMPUTE)) as s:
        s.start("t", PROMPT)
        s.generate("t", GEN)
        p = s.pause("t", "human")
        assert p.action == Action.RECOMPUTE and p.bytes_moved == 0 and s.device_kv_bytes() == 0
        r = s.resume("t", OBS)
        assert r.recomputed_tokens == len(PROMPT) + GEN - 1
        out = s.generate("t", GEN)
        assert out.tokens == reference[1].tokens
        torch.testing.assert_close(out.logits, reference[1].logits, rtol=1e-4, atol=1e-5)


def test_paused_offloaded_trajectory_releases_its_device_tensors(model, store):
    with session(model, store, FixedPolicy(Action.OFFLOAD_HOST, prefetch_at_s=60.0)) as s:
        s.start("t", PROMPT)
        s.generate("t", GEN)
        held = s.device_kv_bytes("t")
        refs = [weakref.ref(t) for l in s.trajectories.get("t").cache.layers for t in (l.keys, l.values)]
        p = s.pause("t", "pytest")
        gc.collect()
        # every K/V tensor of the cache is gone, not just unreferenced by the session
        assert held > 0 and p.freed_bytes == held
        assert [r() is None for r in refs] == [True] * len(refs)
        assert s.device_kv_bytes() == 0
        # the prefetch is scheduled an hour later: resuming early starts it now and waits (a stall)
        r = s.resume("t", OBS)
        assert not r.prefetched and s.device_kv_bytes("t") > 0


def test_second_pause_moves_only_new_blocks(model, store, reference):
    with session(model, store, FixedPolicy(Action.OFFLOAD_HOST)) as s:
        s.start("t", PROMPT)
        s.generate("t", GEN)
        first = s.pause("t", "pytest")                 # 25 tokens: blocks 0,1,2 full + partial 3
        s.resume("t", OBS)
        assert s.generate("t", GEN).tokens == reference[1].tokens
        second = s.pause("t", "pytest")                # 34 tokens: blocks 0..3 full + partial 4
        # blocks 0,1,2 are stored already (same tokens, same keys); 3 (now full) and 4 are new
        assert (first.blocks_moved, second.blocks_reused, second.blocks_moved) == (4, 3, 2)
        s.wait_prefetched("t", timeout=30)
        s.resume("t", OBS)
        out = s.generate("t", GEN)
        assert out.tokens == reference[2].tokens and torch.equal(out.logits, reference[2].logits)


def test_lost_block_falls_back_to_recompute_and_still_matches(model, store, reference):
    with session(model, store, FixedPolicy(Action.OFFLOAD_NVME, prefetch_at_s=60.0)) as s:
        s.start("t", PROMPT)
        s.generate("t", GEN)
        s.pause("t", "build")
        keys = s.trajectories.get("t").reload.keys
        assert store.drop([keys[1]]) == 1              # the store lost a block (evicted / corrupt)
        r = s.resume("t", OBS)
        assert r.fallback and r.recomputed_tokens == len(PROMPT) + GEN - 1
        assert s.generate("t", GEN).tokens == reference[1].tokens


@pytest.mark.parametrize("action", [Action.OFFLOAD_NVME, Action.OFFLOAD_HOST])   # staged, two-phase
def test_full_store_falls_back_to_recompute_at_pause(model, reference, tmp_path, action):
    fmt = AgentSession.frame_format(model, BLOCK)
    # room for two blocks, the trajectory needs four
    cfg = StoreConfig(root=tmp_path / "small", host_bytes=fmt.frame_bytes, nvme_bytes=fmt.frame_bytes,
                      block_bytes=fmt.frame_bytes)
    with TieredStore.open(cfg) as small, session(model, small, FixedPolicy(action)) as s:
        s.start("t", PROMPT)
        s.generate("t", GEN)
        p = s.pause("t", "build")
        assert p.decided == action and p.action == Action.RECOMPUTE
        assert "fallback" in p.reason
        s.resume("t", OBS)
        assert s.generate("t", GEN).tokens == reference[1].tokens
        small.check_integrity()


def test_bad_use_raises_clear_errors_and_keeps_state(model, store, reference):
    with session(model, store, FixedPolicy(Action.OFFLOAD_HOST)) as s:
        with pytest.raises(SessionError, match="unknown trajectory 'ghost'"):
            s.resume("ghost", OBS)
        s.start("t", PROMPT)
        s.generate("t", GEN)
        with pytest.raises(SessionError, match="not paused"):
            s.resume("t", OBS)
        s.pause("t", "pytest")
        with pytest.raises(SessionError, match="paused for 'pytest'"):
            s.generate("t", 1)
        with pytest.raises(SessionError, match="paused"):
            s.pause("t", "again")
        s.resume("t", OBS)
        with pytest.raises(SessionError, match="already resumed"):
            s.resume("t", OBS)
        # after all that the trajectory is intact
        assert s.generate("t", GEN).tokens == reference[1].tokens


def test_cache_with_wrong_geometry_is_rejected_and_state_kept(model, store):
    from transformers import DynamicCache
    with session(model, store, FixedPolicy(Action.OFFLOAD_HOST)) as s:
        bad = DynamicCache()
        for l in range(2):
            bad.update(torch.zeros(1, 2, 20, 8), torch.zeros(1, 2, 20, 8), l)   # head_dim 8, model has 16
        with pytest.raises(SessionError, match=r"cache layer 0 is .*expects \[1, 2, seq, 16\]"):
            s.start("x", PROMPT, cache=bad)
        s.start("t", PROMPT)
        s.generate("t", GEN)
        good = s.trajectories.get("t").cache
        keys0 = good.layers[0].keys
        good.layers[0].keys = torch.zeros(1, 2, keys0.shape[2], 8)               # corrupted under the hook
        with pytest.raises(SessionError, match="cache layer 0"):
            s.pause("t", "pytest")
        assert not s.trajectories.get("t").paused and s.trajectories.get("t").cache is good            # nothing moved, nothing freed
        with pytest.raises(SessionError, match="store block_bytes"):
            AgentSession(model, store=store, policy=FixedPolicy(Action.RETAIN), block_tokens=BLOCK * 2)


def test_bad_construction_is_refused_with_what_is_known(model, store):
    with pytest.raises(SessionError, match="unknown offload_path 'fast'; known: auto, two_phase, staged"):
        AgentSession(model, store=store, policy=FixedPolicy(Action.RETAIN), block_tokens=BLOCK, offload_path="fast")
    # a policy and a lifecycle: the session would run one and ignore the other
    with session(model, store, FixedPolicy(Action.RETAIN)) as s:
        with pytest.raises(SessionError, match="not both"):
            AgentSession(model, store=store, policy=FixedPolicy(Action.RETAIN), lifecycle=s.lifecycle,
                         block_tokens=BLOCK)


def test_free_reports_a_broken_store_as_full(tmp_path, model):
    """Regression (issue 12): ``_free`` said a store whose stats fail had infinite room,
    so a policy would offload into a store that cannot take anything."""
    from kvtier.engine_adapter.hf_cache import free_bytes
    with session_store(tmp_path / "s", model, BLOCK) as s:
        ok = free_bytes(s)
        assert ok["host"] > 0 and ok["nvme"] > 0
    assert s.closed
    assert free_bytes(s) == {"host": 0.0, "nvme": 0.0}       # closed: stats() raises StoreClosed
