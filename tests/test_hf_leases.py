"""The transformers hook on the lifecycle controller: a paused trajectory steps down while its tool runs.

Stories on real tiny models, a real TieredStore and real movers, every pause run
by the same ``LifecycleController`` the engine plugins use:
- ManualClock: a pause hinted long goes to host, is demoted host -> NVMe by the
  controller at its lease end and staged back NVMe -> host before its predicted
  return; the resume is a memory copy with no stall;
- ManualClock: a retained (HBM) cache leaves the device at its lease end;
- ManualClock: a recompute-class pause writes nothing below DRAM;
- the session's own timer thread: a wall-clock lease moves a retained cache to host;
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

from kvtier.engine_adapter.hf import AgentSession, SessionError
from kvtier.store.config import StoreConfig
from kvtier.store.tiered import TieredStore
from kvtier.tiering.model.decision import Action, Decision, PauseContext, Policy
from kvtier.engine_adapter.plugin_common import PlacementAdvisor
from kvtier.engine_adapter.wiring import Lifecycle
from kvtier.tiering.lifecycle import ForecastSchedule, LifecycleController, LifecycleTimer, ManualClock
from kvtier.tiering.lifecycle.foreground import Foreground
from kvtier.tiering.model.tiers import Tier
from kvtier_testutil import session_store, tiny

BLOCK = 8
PROMPT = [(7 * i + 3) % 100 for i in range(21)]        # 2 full blocks + a partial one
OBS = [11, 12, 13, 14]
GEN = 5


class LeasePolicy(Policy):
    """Decide ``first`` with a lease at ``lease_s``; at expiry step to ``then`` with reload times
    ``then_stage_s`` / ``then_prefetch_s`` (None: no staging; reload on resume).  Records what the
    hook asked at the expiry."""

    name = "lease-script"

    def __init__(self, first: Action, then: Action, lease_s: float, *, then_stage_s: float | None = None,
                 then_prefetch_s: float | None = None) -> None:
        self.first, self.then, self.lease_s = first, then, lease_s
        self.then_stage_s, self.then_prefetch_s = then_stage_s, then_prefetch_s
        self.expiries: list[tuple[PauseContext, float, Action]] = []
        self.observed: list[tuple[str, float]] = []

    def decide(self, ctx):
        return Decision(self.first, prefetch_at_s=None, demote_at_s=self.lease_s, reason="scripted")

    def on_lease_expiry(self, ctx, elapsed_s, current):
        self.expiries.append((ctx, elapsed_s, current.action))
        return Decision(self.then, prefetch_at_s=self.then_prefetch_s, stage_at_s=self.then_stage_s,
                        reason="lease expired")

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


def _ticked(ctl):
    """A Lifecycle over ``ctl`` whose timer thread is never started: the test ticks the controller."""
    return Lifecycle(ctl, LifecycleTimer(ctl), Foreground(), PlacementAdvisor(Tier.HOST))


def _manual(store, model, policy):
    """A controller on a ManualClock over ``store`` (the test ticks it) and a session on it."""
    clock = ManualClock()
    ctl = LifecycleController(store, ForecastSchedule(policy), clock=clock,
                              block_bytes=AgentSession.frame_format(model, BLOCK).frame_bytes)
    return clock, ctl, AgentSession(model, store=store, lifecycle=_ticked(ctl), block_tokens=BLOCK)


def _tiers(store, keys):
    return [frozenset(str(t) for t in store.where(k)) for k in keys]


def test_long_pause_is_demoted_at_its_lease_end_and_staged_back_before_its_return(model, store, reference):
    """The must-show story on a ManualClock: host under a 1 s lease, NVMe at the lease end, staged back
    NVMe -> host at 3 s, the device reload at 4 s from host frames, the tool back at 5 s: no stall."""
    policy = LeasePolicy(Action.OFFLOAD_HOST, Action.OFFLOAD_NVME, lease_s=1.0, then_stage_s=3.0,
                         then_prefetch_s=4.0)
    clock, ctl, s = _manual(store, model, policy)
    with s:
        s.start("t", PROMPT)
        s.generate("t", GEN)
        kv = s.device_kv_bytes("t")
        p = s.pause("t", "docker_build")
        keys = s.trajectories.get("t").keys
        assert p.action == Action.OFFLOAD_HOST and p.demote_at_s == 1.0 and s.device_kv_bytes() == 0
        assert ctl.where("t") == Tier.HOST and _tiers(store, keys) == [{"host"}] * 4
        clock.set(0.99)
        ctl.tick()
        assert ctl.where("t") == Tier.HOST and policy.expiries == []       # the lease has not ended
        # the lease ends with the tool still out: the controller re-asks the policy and demotes
        clock.set(1.0)
        ctl.tick()
        ctx, elapsed, frm = policy.expiries[0]
        assert (elapsed, frm, ctx.tool, ctx.kv_bytes, ctx.new_bytes) == (1.0, Action.OFFLOAD_HOST, "docker_build",
                                                                          kv, kv)   # the hook's context
        assert ctl.where("t") == Tier.NVME and s.placement("t") == Action.OFFLOAD_NVME
        assert _tiers(store, keys) == [{"nvme"}] * 4                       # out of the host frames
        clock.set(2.9)
        ctl.tick()
        assert _tiers(store, keys) == [{"nvme"}] * 4 and not s.trajectories.get("t").reload.started.is_set()
        # staged back NVMe -> host frames ahead of the predicted return
        clock.set(3.0)
        ctl.tick()
        assert ctl.where("t") == Tier.HOST and all("host" in t for t in _tiers(store, keys))
        before = store.stats()
        clock.set(4.0)                                                      # the device reload: a memory copy
        ctl.tick()
        assert s.wait_prefetched("t", timeout=30)
        after = store.stats()
        assert (after.hits_host - before.hits_host, after.hits_nvme - before.hits_nvme) == (4, 0)
        clock.set(5.0)
        r = s.resume("t", OBS)
        assert r.prefetched and r.resume_stall_s == 0.0 and r.action == Action.OFFLOAD_NVME
        assert [(d.at_s, d.from_action, d.to_action, d.bytes_moved) for d in r.demotions] == \
            [(1.0, Action.OFFLOAD_HOST, Action.OFFLOAD_NVME, 4 * s.fmt.frame_bytes)]
        assert policy.observed == [("docker_build", 5.0)]                  # the controller's observed wait
        st = ctl.stats()
        assert (st["demotions"], st["stagings"], st["staged_blocks"], st["resumes"]) == (1, 1, 4, 1)
        out = s.generate("t", GEN)
        assert out.tokens == reference[1].tokens and torch.equal(out.logits, reference[1].logits)


def test_retained_cache_leaves_the_device_at_its_lease_end_on_the_controller(model, store, reference):
    policy = LeasePolicy(Action.RETAIN, Action.OFFLOAD_NVME, lease_s=0.5, then_prefetch_s=2.0)
    clock, ctl, s = _manual(store, model, policy)
    with s:
        s.start("t", PROMPT)
        s.generate("t", GEN)
        held = s.device_kv_bytes("t")
        p = s.pause("t", "pytest")
        assert p.action == Action.RETAIN and p.freed_bytes == 0 and ctl.where("t") == Tier.DEVICE
        assert store.stats().puts == 0                                     # retain writes nothing
        clock.set(0.5)
        ctl.tick()
        ctx, elapsed, frm = policy.expiries[0]
        assert (elapsed, frm, ctx.kv_bytes) == (0.5, Action.RETAIN, held)
        assert s.device_kv_bytes("t") == 0 and ctl.where("t") == Tier.NVME
        assert _tiers(store, s.trajectories.get("t").keys) == [{"nvme"}] * 4
        clock.set(2.0)                 # no stage time: the controller stages at the prefetch time, then reloads
        ctl.tick()
        assert s.wait_prefetched("t", timeout=30)
        clock.set(3.0)
        r = s.resume("t", OBS)
        assert r.prefetched and r.resume_stall_s == 0.0 and r.bytes_loaded == 4 * s.fmt.frame_bytes
        assert [(d.from_action, d.to_action, d.bytes_moved) for d in r.demotions] == \
            [(Action.RETAIN, Action.OFFLOAD_NVME, 4 * s.fmt.frame_bytes)]
        out = s.generate("t", GEN)
        assert out.tokens == reference[1].tokens and torch.equal(out.logits, reference[1].logits)


def test_recompute_class_pause_writes_nothing_below_dram(model, store, reference):
    policy = LeasePolicy(Action.RECOMPUTE, Action.OFFLOAD_NVME, lease_s=0.5)
    clock, ctl, s = _manual(store, model, policy)
    with s:
        s.start("t", PROMPT)
        s.generate("t", GEN)
        p = s.pause("t", "human_review")
        clock.set(10.0)
        ctl.tick()
        st = store.stats()
        assert p.action == Action.RECOMPUTE and ctl.where("t") is None and s.device_kv_bytes() == 0
        assert (st.puts, st.host_frames_used, st.nvme_slots_used) == (0, 0, 0) and policy.expiries == []
        r = s.resume("t", OBS)
        assert r.recomputed_tokens == len(PROMPT) + GEN - 1 and policy.observed == [("human_review", 10.0)]
        assert s.generate("t", GEN).tokens == reference[1].tokens


def test_hook_runs_on_the_ttl_schedule_too(model, store, reference):
    """vLLM's fixed-timer lifecycle on the same controller: to host, demoted at 30 s, forgotten at
    300 s -- the forgotten blocks are a miss, and the resume recomputes with the same tokens."""
    from kvtier.tiering.lifecycle import TTLSchedule
    clock = ManualClock()
    ctl = LifecycleController(store, TTLSchedule(), clock=clock,
                              block_bytes=AgentSession.frame_format(model, BLOCK).frame_bytes)
    with AgentSession(model, store=store, lifecycle=_ticked(ctl), block_tokens=BLOCK) as s:
        s.start("t", PROMPT)
        s.generate("t", GEN)
        p = s.pause("t", "pytest")
        keys = s.trajectories.get("t").keys
        assert p.action == Action.OFFLOAD_HOST and p.prefetch_at_s is None and _tiers(store, keys) == [{"host"}] * 4
        clock.set(30.0)
        ctl.tick()
        assert ctl.where("t") == Tier.NVME and _tiers(store, keys) == [{"nvme"}] * 4
        clock.set(300.0)
        ctl.tick()
        assert ctl.where("t") is None and _tiers(store, keys) == [frozenset()] * 4
        r = s.resume("t", OBS)
        assert r.fallback and r.recomputed_tokens == len(PROMPT) + GEN - 1
        assert s.generate("t", GEN).tokens == reference[1].tokens
    assert ctl.device is None      # closed: the session's hooks are off the caller's controller


def test_session_refuses_a_controller_of_another_store(model, store, tmp_path):
    with session_store(tmp_path / "other", model, BLOCK) as other:
        ctl = LifecycleController(other, ForecastSchedule(LeasePolicy(Action.RETAIN, Action.RETAIN, 1.0)),
                                  block_bytes=AgentSession.frame_format(model, BLOCK).frame_bytes)
        with pytest.raises(SessionError, match="another store"):
            AgentSession(model, store=store, lifecycle=_ticked(ctl), block_tokens=BLOCK)
    with pytest.raises(SessionError, match="needs a policy"):
        AgentSession(model, store=store, block_tokens=BLOCK)


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
        refs = [weakref.ref(t) for l in s.trajectories.get("t").cache.layers for t in (l.keys, l.values)]
        # the agent calls a slow tool; the policy keeps the KV in HBM under a 50 ms lease
        p = s.pause("t", "pytest")
        assert p.action == Action.RETAIN and p.demote_at_s == 0.05 and p.freed_bytes == 0
        # the tool is still out when the lease runs out: the timer thread asks the policy and offloads
        assert _until(lambda: s.placement("t") == Action.OFFLOAD_HOST)
        gc.collect()
        assert s.device_kv_bytes("t") == 0 and all(r() is None for r in refs)
        ctx, elapsed, frm = policy.expiries[0]
        # on the timer thread the policy is asked at the clock's time, at or after the lease
        assert elapsed >= 0.05 and (frm, ctx.kv_bytes, ctx.tool) == (Action.RETAIN, held, "pytest")
        # the blocks sit in the host tier
        assert all("host" in {str(t) for t in store.where(k)} for k in s.trajectories.get("t").keys)
        # the tool returns: no prefetch was planned, so the resume reloads (a stall) and continues exactly
        r = s.resume("t", OBS)
        assert r.action == Action.OFFLOAD_HOST and not r.prefetched and r.bytes_loaded == 4 * s.fmt.frame_bytes
        assert [(d.at_s, d.from_action, d.to_action, d.bytes_moved) for d in r.demotions] == \
            [(elapsed, Action.RETAIN, Action.OFFLOAD_HOST, 4 * s.fmt.frame_bytes)]
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
        keys = s.trajectories.get("t").keys
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
    # scripted: the 0.5 s tool returns before the 1 s lease, so it is not reported and never settled
    policy = LeasePolicy(Action.RETAIN, Action.RECOMPUTE, lease_s=1.0)
    with AgentSession(model, store=store, policy=policy, block_tokens=BLOCK) as s:
        s.start("t", PROMPT)
        s.generate("t", GEN)
        p = s.pause("t", "grep", scripted_wait_s=0.5)
        assert p.demote_at_s is None and s.lifecycle.controller.next_due() is None   # nothing armed past the return
        r = s.resume("t", OBS)
        assert r.demotions == () and r.action == Action.RETAIN and policy.expiries == []
        assert s.lifecycle.stats().get("leases", 0) == 0
        assert s.generate("t", GEN).tokens == reference[1].tokens
    # the controller's clock passing the lease after the resume: the timer is stale and does nothing
    policy = LeasePolicy(Action.RETAIN, Action.RECOMPUTE, lease_s=0.3)
    clock, ctl, s = _manual(store, model, policy)
    with s:
        s.start("t", PROMPT)
        s.generate("t", GEN)
        assert s.pause("t", "grep").demote_at_s == 0.3 and ctl.next_due() is not None
        clock.set(0.2)
        r = s.resume("t", OBS)
        clock.set(1.0)
        ctl.tick()
        assert r.demotions == () and policy.expiries == [] and s.device_kv_bytes("t") > 0
        assert ctl.stats().get("leases", 0) == 0


def test_breakeven_policy_leases_are_followed_for_a_grep_that_hangs(model, store, reference):
    """kvtier's own policy, whatever its current prices: the hook carries out exactly the leases it
    sets.  (With the policy of this commit: retain, lease renewed, then out of HBM at ~0.37 s.)"""
    from kvtier.tiering.model.costmodel import HardwareProfile, ModelGeometry
    from kvtier.tiering.policy.policies import BreakEvenPolicy
    from kvtier.tiering.forecasting.predictor import ToolWaitPredictor

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
