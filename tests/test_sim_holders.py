"""Resumed rounds that still hold their context in HBM (``NodeConfig.holders_first``).

vLLM's scheduler drains the requests that already hold KV blocks before the
plain waiting queue; a resumed round whose context never left HBM (retained, or
its copy-out still in flight) needs room only for its new tokens.  With
``holders_first`` the simulator admits such a round ahead of a queued resume
that needs room for its whole context; without it (the default) one FIFO queue
makes it wait behind that head.
"""
from __future__ import annotations

import pytest

from kvtier.bench.sim.runner import default_node, run_policies
from kvtier.bench.sim.simulator import NodeConfig, Simulator
from kvtier.bench.sim.synth import SynthConfig, synthesize
from kvtier.bench.sim.trace import make_session
from kvtier.tiering.model.costmodel import HardwareProfile, ModelGeometry
from kvtier.tiering.model.decision import Action, Decision, Policy

MS = 1e-3
TOY_GEOM = ModelGeometry("toy", layers=1, kv_heads=1, head_dim=8, dtype_bytes=2, params=1e6)  # 32 B/token


def toy_node(pool_blocks: int, *, holders_first: bool) -> NodeConfig:
    """1 ms per token of prefill, 16-token blocks, 1 ms per block over the link."""
    bb = 16 * TOY_GEOM.token_bytes
    hw = HardwareProfile(hbm_bytes=pool_blocks * bb, link_h2d_bps=bb / MS, link_d2h_bps=bb / MS,
                         prefill_flops=2e6 / MS, nvme_read_bps=bb / (10 * MS), nvme_write_bps=bb / (10 * MS),
                         host_bytes=10_000 * bb, nvme_bytes=10_000 * bb)
    return NodeConfig(TOY_GEOM, hw, hbm_bw_bps=1e18, block_tokens=16, chunk_tokens=2048,
                      admission_ceiling=1.0, holders_first=holders_first)


class AOutBRetains(Policy):
    """"a" goes to host DRAM at its pause, every other pause stays in HBM; victims are pinned."""

    name = "a-out-b-retains"

    def decide(self, ctx):
        return Decision(Action.OFFLOAD_HOST if ctx.trajectory_id == "a" else Action.RETAIN)

    def victim_action(self, ctx):
        return Action.RETAIN


# a: 40 blocks, goes to host, its tool returns first and its round needs 42 blocks;
# b: 11 blocks retained, returns second and needs 2 more; c: 50 blocks decoding for ~0.8 s
# after a's copy-out freed room, so a (42 > 100 - 11 - 50 free) waits for c to finish
SESSIONS = [
    make_session("a", 0.0, [(624, 16, "ls", 0.05), (16, 16, None, None)]),
    make_session("b", 0.0, [(160, 16, "ls", 0.15), (16, 16, None, None)]),
    make_session("c", 0.0, [(16, 784, None, None)]),
]


def _starts(holders_first: bool) -> dict:
    r = Simulator(SESSIONS, toy_node(100, holders_first=holders_first), AOutBRetains(),
                  record_rounds=True, check_every=1).run()
    assert r.metrics["sessions_done"] == 3
    return {(s, k): (t0, t1) for s, k, t0, t1 in r.round_log}


def test_fifo_makes_a_resident_resume_wait_behind_a_head_that_needs_room():
    st = _starts(False)
    c_end = st[("c", 0)][1]
    assert st[("b", 1)][0] >= st[("a", 1)][0] >= c_end    # b's 2 blocks were free all along


def test_holders_first_admits_the_resident_resume_at_once():
    st = _starts(True)
    fifo = _starts(False)
    assert st[("b", 1)][0] < st[("c", 0)][1]              # b ran while c still decoded
    assert st[("b", 1)][0] < fifo[("b", 1)][0]
    # b then finished and freed its 11 blocks, so the head ran earlier too
    assert st[("a", 1)][0] <= fifo[("a", 1)][0]


def test_holders_first_keeps_the_books_exact_under_overload():
    # overload with small host DRAM: victims copied out while their tool returns, resumes
    # queued holding HBM; check_integrity (every 97 events) also checks the blocks counted as
    # on their way to free against the victims' transfers in flight
    sessions = synthesize(SynthConfig(sessions=300, rate_per_s=5.0, seed=2))
    node = default_node(host_bytes=50e9, holders_first=True)
    res = run_policies(sessions, node, ("breakeven", "offload_host", "lru"), check_every=97)
    for name, r in res.items():
        assert r.metrics["sessions_done"] == len(sessions), name
        assert r.metrics["sessions_rejected"] == 0, name
    fifo = run_policies(sessions, default_node(host_bytes=50e9), ("breakeven", "lru"), check_every=97)
    assert fifo["lru"].stalls != res["lru"].stalls        # the option changes the schedule here
    for name, r in fifo.items():                          # the default FIFO path's books are exact too
        assert r.metrics["sessions_done"] == len(sessions), name


def test_the_cli_flag_reaches_the_node(capsys):
    import json
    from kvtier.cli.main import main
    assert main(["bench", "simulate", "--synth", "20", "--rate", "2", "--policies", "lru", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["node"]["holders_first"] is False
    assert main(["bench", "simulate", "--synth", "20", "--rate", "2", "--policies", "lru",
                 "--holders-first", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["node"]["holders_first"] is True and doc["policies"]["lru"]["sessions_done"] == 20


def test_the_default_fifo_order_keeps_exact_books():
    # the same toy run: FIFO order, and check_integrity (every event) holds the count of blocks
    # on their way to free to the victims' copy-outs in flight
    node = toy_node(100, holders_first=False)
    r = Simulator(SESSIONS, node, AOutBRetains(), record_rounds=True, check_every=1).run()
    st = {(s, k): t0 for s, k, t0, _ in r.round_log}
    fifo = _starts(False)
    assert st[("b", 1)] == pytest.approx(fifo[("b", 1)][0])
