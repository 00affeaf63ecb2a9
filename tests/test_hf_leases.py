"""Lease-based demotion in the transformers hook: a paused trajectory steps down while its tool runs.

Stories on real tiny models, a real TieredStore and real movers:
- a wall-clock lease (timer thread): HBM -> host while the tool is still out;
- scripted time: host -> NVMe at the lease, carried out even though no wall time passed;
- kvtier's own BreakEvenPolicy: the leases it sets for a grep that hangs are carried out in order;
- a tool back before its lease is never demoted.
Every story ends with the resumed tokens equal to the run that never paused.
"""
from __future__ import annotations

import gc
import math
import random
import time
import weakref

import pytest
import torch

from kvtier.engine_adapter.hf import AgentSession
from kvtier.store.config import StoreConfig
from kvtier.store.tiered import TieredStore
from kvtier.tiering.decision import Action, Decision, PauseContext, Policy
from kvtier_testutil import session_store, tiny

BLOCK = 8
PROMPT = [(7 * i + 3) % 100 for i in range(21)]        # 2 full blocks + a partial one
OBS = [11, 12, 13, 14]
GEN = 5


class LeasePolicy(Policy):
    """Decide ``first`` with a lease at ``lease_s``; at expiry step to ``then`` (no prefetch: reload on
    resume).  Records what the hook asked at the expiry."""

    name = "lease-script"

    def __init__(self, first: Action, then: Action, lease_s: float) -> None:
        self.first, self.then, self.lease_s = first, then, lease_s
        self.expiries: list[tuple[PauseContext, float, Action]] = []
        self.observed: list[tuple[str, float]] = []

    def decide(self, ctx):
        return Decision(self.first, prefetch_at_s=None, demote_at_s=self.lease_s, reason="scripted")

    def on_lease_expiry(self, ctx, elapsed_s, current):
        self.expiries.append((ctx, elapsed_s, current.action))
        return Decision(self.then, prefetch_at_s=None, reason="lease expired")

    def observe(self, tool, wait_s, features=None):
        self.observed.append((tool, wait_s))


@pytest.fixture(scope="module")
def model():
    return tiny("llama")


@pytest.fixture(scope="module")
def reference(model, tmp_path_factory):
    fmt = AgentSession.frame_format(model, BLOCK)
    cfg = StoreConfig(root=tmp_path_factory.mktemp("ref"), host_bytes=fmt.frame_bytes,
                      nvme_bytes=fmt.frame_bytes, block_bytes=fmt.frame_bytes)
    with TieredStore.open(cfg) as st, AgentSession(model, store=st, policy=LeasePolicy(Action.RETAIN, Action.RETAIN, 1e9),
                                                   block_tokens=BLOCK) as s:
        s.start("r", PROMPT)
        turns = [s.generate("r", GEN)]
        s.append("r", OBS)
        turns.append(s.generate("r", GEN))
    return turns


@pytest.fixture
def store(tmp_path, model):
    with session_store(tmp_path / "store", model, BLOCK) as s:
        yield s


def _until(cond, timeout=30.0):
    """Poll ``cond`` until true (an event, not a timing assertion); False after ``timeout``."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.005)
    return False


def test_wall_clock_lease_moves_a_retained_cache_to_host_while_the_tool_runs(model, store, reference):
    policy = LeasePolicy(Action.RETAIN, Action.OFFLOAD_HOST, lease_s=0.05)
    with AgentSession(model, store=store, policy=policy, block_tokens=BLOCK) as s:
        s.start("t", PROMPT)
        s.generate("t", GEN)
        held = s.device_kv_bytes("t")
        refs = [weakref.ref(t) for l in s._traj["t"].cache.layers for t in (l.keys, l.values)]
        # the agent calls a slow tool; the policy keeps the KV in HBM under a 50 ms lease
        p = s.pause("t", "pytest")
        assert p.action == Action.RETAIN and p.demote_at_s == 0.05 and p.freed_bytes == 0
        # the tool is still out when the lease runs out: the timer thread asks the policy and offloads
        assert _until(lambda: s.placement("t") == Action.OFFLOAD_HOST)
        gc.collect()
        assert s.device_kv_bytes("t") == 0 and all(r() is None for r in refs)
        ctx, elapsed, frm = policy.expiries[0]
        assert (elapsed, frm, ctx.kv_bytes, ctx.tool) == (0.05, Action.RETAIN, held, "pytest")
        # the blocks sit in the host tier
        assert all("host" in {str(t) for t in store.where(k)} for k in s._traj["t"].keys)
        # the tool returns: no prefetch was planned, so the resume reloads (a stall) and continues exactly
        r = s.resume("t", OBS)
        assert r.action == Action.OFFLOAD_HOST and not r.prefetched and r.bytes_loaded == 4 * s.fmt.frame_bytes
        assert [(d.at_s, d.from_action, d.to_action, d.bytes_moved) for d in r.demotions] == \
            [(0.05, Action.RETAIN, Action.OFFLOAD_HOST, 4 * s.fmt.frame_bytes)]
        # the policy learned the real (measured) wait, which outlasted the lease
        assert policy.observed == [("pytest", r.wait_s)] and r.wait_s >= 0.05
        out = s.generate("t", GEN)
        assert out.tokens == reference[1].tokens and torch.equal(out.logits, reference[1].logits)


def test_scripted_lease_demotes_host_to_nvme_without_waiting_for_the_wall_clock(model, store, reference):
    policy = LeasePolicy(Action.OFFLOAD_HOST, Action.OFFLOAD_NVME, lease_s=1.0)
    with AgentSession(model, store=store, policy=policy, block_tokens=BLOCK) as s:
        s.start("t", PROMPT)
        s.generate("t", GEN)
        # a scripted tool that takes 5 s: offloaded to host with a 1 s lease
        p = s.pause("t", "docker_build", scripted_wait_s=5.0)
        assert p.action == Action.OFFLOAD_HOST and p.demote_at_s == 1.0 and p.prefetch_at_s is None
        keys = s._traj["t"].keys
        assert all({str(t) for t in store.where(k)} == {"host"} for k in keys)
        # resumed at once (time fast-forwarded): the lease expired in scripted time, so the resume
        # carries out the host -> NVMe step first, then reloads from NVMe
        r = s.resume("t", OBS)
        ctx, elapsed, frm = policy.expiries[0]
        assert (elapsed, frm) == (1.0, Action.OFFLOAD_HOST)
        assert ctx.new_bytes == ctx.kv_bytes            # every block was host-only: all must move
        assert [(d.from_action, d.to_action, d.bytes_moved) for d in r.demotions] == \
            [(Action.OFFLOAD_HOST, Action.OFFLOAD_NVME, 4 * s.fmt.frame_bytes)]
        assert r.action == Action.OFFLOAD_NVME and r.fallback == ""
        assert all(store.where(k) and {str(t) for t in store.where(k)} == {"nvme"} for k in keys)
        # the policy learned the scripted 5 s, not the few milliseconds that passed
        assert policy.observed == [("docker_build", 5.0)] and r.wall_wait_s < 5.0
        out = s.generate("t", GEN)
        assert out.tokens == reference[1].tokens and torch.equal(out.logits, reference[1].logits)


def test_tool_back_before_its_lease_is_never_demoted(model, store, reference):
    # scripted: the 0.5 s tool returns before the 1 s lease, so the lease is not even armed
    policy = LeasePolicy(Action.RETAIN, Action.RECOMPUTE, lease_s=1.0)
    with AgentSession(model, store=store, policy=policy, block_tokens=BLOCK) as s:
        s.start("t", PROMPT)
        s.generate("t", GEN)
        p = s.pause("t", "grep", scripted_wait_s=0.5)
        assert p.demote_at_s is None and s._traj["t"].lease_timer is None
        r = s.resume("t", OBS)
        assert r.demotions == () and r.action == Action.RETAIN and policy.expiries == []
        assert s.generate("t", GEN).tokens == reference[1].tokens
    # wall clock: a long lease is cancelled by the resume; its timer never fires afterwards
    policy = LeasePolicy(Action.RETAIN, Action.RECOMPUTE, lease_s=0.3)
    with AgentSession(model, store=store, policy=policy, block_tokens=BLOCK) as s:
        s.start("t", PROMPT)
        s.generate("t", GEN)
        s.pause("t", "grep")
        timer = s._traj["t"].lease_timer
        assert timer is not None and timer.is_alive()
        r = s.resume("t", OBS)
        timer.join(5)
        assert r.demotions == () and policy.expiries == [] and s.device_kv_bytes("t") > 0


def test_breakeven_policy_leases_are_followed_for_a_grep_that_hangs(model, store, reference):
    """kvtier's own policy, whatever its current prices: the hook carries out exactly the leases it
    sets.  (With the policy of this commit: retain, lease renewed, then out of HBM at ~0.37 s.)"""
    from kvtier.tiering.costmodel import HardwareProfile, ModelGeometry
    from kvtier.tiering.policies import BreakEvenPolicy
    from kvtier.tiering.predictor import ToolWaitPredictor

    # a small scaled node; grep usually takes ~50 ms, with a long tail
    pred = ToolWaitPredictor()
    rng = random.Random(0)
    for _ in range(24):
        pred.observe("grep", 0.05 * math.exp(rng.gauss(0.0, 0.8)))
    cfg = model.config
    geom = ModelGeometry(name="tiny", layers=cfg.num_hidden_layers, kv_heads=cfg.num_key_value_heads,
                         head_dim=cfg.hidden_size // cfg.num_attention_heads, dtype_bytes=4,
                         params=float(sum(p.numel() for p in model.parameters())))
    hw = HardwareProfile(hbm_bytes=1e9, link_h2d_bps=1e6, link_d2h_bps=1e6, prefill_flops=1e8,
                         nvme_read_bps=1e6, nvme_write_bps=2e6, host_bytes=store.config.host_bytes,
                         nvme_bytes=store.config.nvme_bytes)
    policy = BreakEvenPolicy(geom, hw, pred, ref_tokens=64, stall_weight=2.0)
    with AgentSession(model, store=store, policy=policy, block_tokens=BLOCK, hbm_pressure=0.5) as s:
        s.start("t", PROMPT)
        s.generate("t", GEN)
        # this grep hangs for 30 s (scripted): resumed at once, the leases that ran out are settled
        p = s.pause("t", "grep", scripted_wait_s=30.0)
        r = s.resume("t", OBS)
        steps = r.demotions
        if p.demote_at_s is None:
            # no lease: the placement chosen at the pause holds for the whole wait
            assert steps == () and r.action == p.action
        else:
            # the first step is at the policy's lease; later ones at the leases it renewed, in order,
            # all before the tool returned; each step starts where the previous one ended
            assert steps and steps[0].at_s == p.demote_at_s and steps[0].from_action == p.action
            assert [d.at_s for d in steps] == sorted(d.at_s for d in steps) and steps[-1].at_s < 30.0
            for a, b in zip(steps, steps[1:]):
                assert b.from_action == a.to_action
            assert r.action == steps[-1].to_action
            # a step never climbs back up: once out of HBM it stays out
            left = [i for i, d in enumerate(steps) if d.to_action != Action.RETAIN]
            assert all(d.to_action != Action.RETAIN for d in steps[left[0]:]) if left else True
        assert s.device_kv_bytes("t") > 0
        out = s.generate("t", GEN)
        assert out.tokens == reference[1].tokens
        torch.testing.assert_close(out.logits, reference[1].logits, rtol=1e-4, atol=1e-5)
