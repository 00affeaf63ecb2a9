"""The cluster model: N one-node simulators, a router and a shared remote tier.

The toy node (as in test_sim.py): 1 ms of prefill per token, 16-token blocks of
512 bytes, 1 ms per block over the host link.  The toy remote tier moves one
block per millisecond over each node's NIC, with no latency unless a test
sets one.
"""
from __future__ import annotations

import json
import math

import pytest

from kvtier.bench.sim.cluster import Cluster, ClusterConfig, run_cluster_policies
from kvtier.bench.sim.cluster_load import replicate
from kvtier.bench.sim.cluster_remote import RemoteConfig, RemoteTier
from kvtier.bench.sim.node import NodeConfig
from kvtier.bench.sim.router import LeastLoadedRouter, RandomRouter, Router, StickyRouter, make_router
from kvtier.bench.sim.runner import REQUIRED_METRICS, default_node, run_policies
from kvtier.bench.sim.synth import SynthConfig, synthesize
from kvtier.bench.sim.trace import make_session
from kvtier.cli.main import main
from kvtier.tiering.model.costmodel import HardwareProfile, ModelGeometry
from kvtier.tiering.model.decision import Action, Decision, Policy

MS = 1e-3
TOY_GEOM = ModelGeometry("toy", layers=1, kv_heads=1, head_dim=8, dtype_bytes=2, params=1e6)  # 32 B/token
BB = 16 * TOY_GEOM.token_bytes                                                                # 512 B/block
ONE_MS_PER_BLOCK_GBPS = BB / MS / 1e9


def toy_node(pool_blocks: int = 1000) -> NodeConfig:
    hw = HardwareProfile(hbm_bytes=pool_blocks * BB, link_h2d_bps=BB / MS, link_d2h_bps=BB / MS,
                         prefill_flops=2e6 / MS, nvme_read_bps=BB / (10 * MS), nvme_write_bps=BB / (10 * MS),
                         host_bytes=10_000 * BB, nvme_bytes=100_000 * BB)
    return NodeConfig(TOY_GEOM, hw, hbm_bw_bps=1e18, block_tokens=16, chunk_tokens=2048, admission_ceiling=1.0)


class Always(Policy):
    def __init__(self, action: Action, extra: dict | None = None) -> None:
        self.d = Decision(action, extra=extra or {})
        self.name = f"always-{action.value}"

    def decide(self, ctx):
        return self.d


class Away(Router):
    """Every resume goes to the next node (a router that is never affine)."""

    name = "away"

    def place_new(self, session, view):
        return 0

    def place_resume(self, session, home, view, own_hbm=0):
        return (home + 1) % view.n


# 160 prompt tokens + 16 out = 176 tokens (11 blocks) of context at the pause
def one(wait: float = 5.0):
    return [make_session("a", 0.0, [(160, 16, "pytest", wait), (32, 16, None, None)])]


def cluster(sessions, policy, *, nodes=2, router=None, remote=None, pool=1000):
    cfg = ClusterConfig(nodes=nodes, remote=remote)
    c = Cluster(sessions, toy_node(pool), policy, cfg, router=router, check_every=1)
    return c, c.run()


def remote(gbps=ONE_MS_PER_BLOCK_GBPS, latency_s=0.0, **kw):
    return RemoteConfig(gbps=gbps, latency_s=latency_s, **kw)


# ---------------------------------------------------------------------------- N = 1 is one node
@pytest.mark.parametrize("write_through", [False, True])
def test_one_node_cluster_equals_the_one_node_simulator_exactly(write_through):
    sessions = synthesize(SynthConfig(sessions=60, rate_per_s=1.0, seed=5, human_prob=0.05))
    node = default_node(hbm_bytes=100e9 + 141.2e9 + 20e9, host_bytes=60e9, nvme_bytes=300e9,
                        write_through=write_through)          # a tight node: victims, fallbacks, leases
    names = ["breakeven", "oracle", "lru", "offload_host", "retain", "ttl"]
    single = run_policies(sessions, node, names, record_rounds=True)
    multi = run_cluster_policies(sessions, node, ClusterConfig(nodes=1), names, record_rounds=True)
    for n in names:
        a, b = single[n], multi[n]
        assert b.jcts == a.jcts and b.stalls == a.stalls and b.round_log == a.round_log, n
        for k, v in a.metrics.items():
            if k != "sim_wall_s":
                assert b.metrics[k] == v, (n, k)
    assert single["retain"].metrics["hbm_peak_util"] > 0.95   # the node really was under pressure


# ---------------------------------------------------------------------------- routers
class View:
    """Plain load numbers for the routers' unit tests."""

    def __init__(self, active, used, prefixes=None):
        self.n, self._a, self._u = len(active), active, used
        self._p = prefixes or [set() for _ in active]

    def active(self, i):
        return self._a[i]

    def hbm_used(self, i):
        return self._u[i]

    def holds_prefix(self, i, p):
        return p is None or p in self._p[i]


def test_least_loaded_picks_the_fewest_active_rounds_and_stays_home_on_a_tie():
    s = one()[0]
    r = LeastLoadedRouter()
    assert r.place_new(s, View([3, 1, 2], [0, 9, 0])) == 1
    assert r.place_new(s, View([1, 1, 2], [5, 4, 0])) == 1           # tie on rounds: less HBM in use
    assert r.place_resume(s, 2, View([1, 2, 1], [7, 0, 7])) == 2     # home ties the best: stay
    assert r.place_resume(s, 1, View([1, 2, 1], [7, 0, 7])) == 0     # home is busier: move


def test_sticky_keeps_a_resume_home_unless_home_is_more_than_one_round_busier():
    s = one()[0]
    r = make_router("sticky")
    assert isinstance(r, StickyRouter) and r.place_new(s, View([3, 1, 2], [0, 9, 0])) == 1
    assert r.place_resume(s, 1, View([1, 2, 1], [7, 0, 7])) == 1     # one round busier: stays
    assert r.place_resume(s, 1, View([1, 3, 1], [7, 0, 0])) == 2     # two: the least-loaded node
    assert StickyRouter(slack=0).place_resume(s, 1, View([1, 2, 1], [7, 0, 7])) == 0
    with pytest.raises(ValueError):
        StickyRouter(slack=-1)


def test_a_resume_does_not_count_its_own_retained_blocks_against_home():
    s = one()[0]
    r = LeastLoadedRouter()
    v = View([1, 1, 1], [7, 9, 7])
    assert r.place_resume(s, 1, v) == 0                  # home holds more HBM: move
    assert r.place_resume(s, 1, v, own_hbm=2) == 1       # 2 of home's 9 blocks are its own: 7 ties, stay
    assert r.place_resume(s, 1, v, own_hbm=1) == 0       # 8 > 7: still busier, move
    assert r.place_resume(s, 1, View([1, 2, 1], [7, 9, 7]), own_hbm=9) == 0   # more active rounds: move


def test_a_resume_goes_only_where_its_shared_prefix_is_resident():
    s = make_session("p", 0.0, [(10, 1, "t", 1.0), (1, 1, None, None)], shared_prefix_id="sys",
                     shared_prefix_tokens=64)
    v = View([5, 0, 0], [0, 0, 0], prefixes=[{"sys"}, set(), {"sys"}])
    assert LeastLoadedRouter().place_resume(s, 0, v) == 2
    rr = RandomRouter(seed=3)
    assert {rr.place_resume(s, 0, v) for _ in range(200)} == {0, 2}
    with pytest.raises(ValueError):
        make_router("round-robin")


def test_affinity_keeps_every_session_on_its_first_node():
    sessions = synthesize(SynthConfig(sessions=40, rate_per_s=2.0, seed=2))
    node = default_node()
    c = Cluster(replicate(sessions, 4), node, make_policy("breakeven", node),
                ClusterConfig(nodes=4, router="affinity", remote=RemoteConfig(25.0)))
    r = c.run()
    assert r.metrics["cluster"]["resumes_moved"] == 0
    homes = {}
    for nd in c.nodes:
        for x in nd.sim.sessions:
            assert homes.setdefault(x.s.id, nd.index) == nd.index     # one node per session
    assert len(homes) == 160 and all(nd.sim.sessions for nd in c.nodes)   # and every node got work


def test_least_loaded_spreads_the_work_and_moves_resumes_random_scatters_them():
    sessions = synthesize(SynthConfig(sessions=60, rate_per_s=1.0, seed=4))
    node = default_node()
    out = {}
    for router in ("least-loaded", "random"):
        r = run_cluster_policies(sessions, node, ClusterConfig(nodes=4, router=router), ["lru"])["lru"]
        out[router] = r.metrics["cluster"]
        assert r.metrics["sessions_done"] == 240
    ll = out["least-loaded"]
    rounds = [p["resumes"] + p["sessions_done"] for p in ll["per_node"]]
    assert max(rounds) <= 1.25 * min(rounds)                         # balanced within 25%
    assert 0 < ll["resumes_moved_frac"] < 1
    assert out["random"]["resumes_moved_frac"] == pytest.approx(0.75, abs=0.1)   # 3 of 4 nodes are "away"


def make_policy(name, node):
    from kvtier.tiering.policy.policies import make_policy as mk
    return mk(name, geometry=node.geometry, hardware=node.hardware)


# ---------------------------------------------------------------------------- a resume elsewhere
def test_a_resume_on_another_node_loads_from_the_remote_tier():
    c, r = cluster(one(), Always(Action.OFFLOAD_HOST), router=Away(), remote=remote())
    # published at the pause (11 blocks, 11 ms); the tool returns after 5 s, on node 1: 11 ms fill
    assert r.metrics["cluster"]["resumes_moved"] == 1 and r.metrics["cluster"]["remote_fills"] == 1
    assert r.metrics["recomputed_tokens"] == 0
    assert r.stalls == (pytest.approx(11 * MS),)
    assert c.nodes[1].sim.m.jcts and not c.nodes[0].sim.m.jcts                # it finished on node 1
    assert r.metrics["cluster"]["remote"]["published_gb"] == pytest.approx(11 * BB / 1e9)
    assert c.remote.used == 0                                          # released when it finished


def test_a_resume_on_another_node_recomputes_without_a_remote_tier():
    c, r = cluster(one(), Always(Action.OFFLOAD_HOST), router=Away(), remote=None)
    assert r.metrics["cluster"]["resumes_moved"] == 1
    assert r.metrics["recomputed_tokens"] == 176
    assert r.stalls == (pytest.approx(176 * MS),)
    # the host copy left behind on node 0 was released with the move
    assert c.nodes[0].sim.ledger.host_used == 0 and c.nodes[0].sim.ledger.used == 0


def test_an_early_return_streams_the_publish_still_landing():
    _, r = cluster(one(wait=5 * MS), Always(Action.RETAIN), router=Away(), remote=remote())
    # 5 of the 11 blocks have landed when the tool returns; the fill reads all 11 at the NIC
    # rate (11 ms) and the other 6 land before it needs them: nothing recomputes
    assert r.metrics["recomputed_tokens"] == 0
    assert r.metrics["cluster"]["remote_fills_streamed"] == 1
    assert r.stalls == (pytest.approx(11 * MS),)


def test_an_early_return_loads_only_what_has_landed_when_told_not_to_stream():
    _, r = cluster(one(wait=5 * MS), Always(Action.RETAIN), router=Away(), remote=remote(stream_inflight=False))
    # 5 of the 11 blocks have landed when the tool returns: 80 tokens load (5 ms), 96 recompute
    assert r.metrics["recomputed_tokens"] == 96
    assert r.metrics["cluster"]["remote_fills_streamed"] == 0
    assert r.stalls == (pytest.approx(5 * MS + 96 * MS),)


def test_a_fill_waits_for_a_publish_queued_behind_another_when_that_beats_recomputing():
    # "big" (1600 + 16 tokens, 101 blocks) pauses in the same iteration as "a", just before it, and
    # its publish goes first on node 0's NIC: a's 11 blocks land 101-112 ms after the pause.  a
    # returns 5 ms after its pause and waits for them (108 ms) instead of recomputing (176 ms)
    big = make_session("big", 0.0, [(1600, 16, "pytest", 5.0), (32, 16, None, None)])
    _, r = cluster([big] + one(wait=5 * MS), Always(Action.RETAIN), router=Away(), remote=remote())
    c = r.metrics["cluster"]
    assert c["remote_fills_streamed"] == 1 and c["remote_declined_slower_than_recompute"] == 0
    assert r.metrics["recomputed_tokens"] == 0
    assert max(r.stalls) == pytest.approx(108 * MS, abs=0.5 * MS)


def test_a_fill_does_not_wait_behind_a_long_publish_queue():
    # "big" pauses first and publishes 502 blocks (502 ms on node 0's NIC); "a" pauses just after
    # it, so a's 11 blocks land only after big's: waiting for them is slower than recomputing
    big = make_session("big", 0.0, [(8000, 16, "pytest", 5.0), (32, 16, None, None)])
    _, r = cluster([big] + one(wait=5 * MS), Always(Action.RETAIN), router=Away(), remote=remote())
    c = r.metrics["cluster"]
    assert c["remote_declined_slower_than_recompute"] == 1 and c["remote_fills_streamed"] == 0
    assert r.metrics["recomputed_tokens"] == 176
    assert min(r.stalls) == pytest.approx(176 * MS)


def test_a_remote_slower_than_recompute_is_not_used():
    slow = remote(gbps=ONE_MS_PER_BLOCK_GBPS / 100)         # 100 ms per block: 1.1 s against 176 ms
    _, r = cluster(one(), Always(Action.RETAIN), router=Away(), remote=slow)
    assert r.metrics["cluster"]["remote_fills"] == 0
    assert r.metrics["cluster"]["remote_declined_slower_than_recompute"] == 1
    assert r.metrics["recomputed_tokens"] == 176


def test_recompute_and_a_publish_veto_leave_nothing_in_the_remote_tier():
    for pol in (Always(Action.RECOMPUTE), Always(Action.OFFLOAD_HOST, extra={"publish_remote": 0})):
        _, r = cluster(one(), pol, router=Away(), remote=remote())
        assert r.metrics["cluster"]["remote"]["publishes"] == 0
        assert r.metrics["recomputed_tokens"] == 176


def test_home_resumes_use_the_local_copy_not_the_remote():
    _, r = cluster(one(), Always(Action.OFFLOAD_HOST), router=make_router("affinity"), remote=remote())
    assert r.metrics["cluster"]["remote_fills"] == 0
    assert r.stalls == (pytest.approx(11 * MS),)            # the reload over the host link
    assert r.metrics["cluster"]["remote"]["published_gb"] > 0


# ---------------------------------------------------------------------------- everything finishes
@pytest.mark.parametrize("router", ["least-loaded", "sticky", "random", "affinity"])
def test_every_session_finishes_on_a_tight_cluster(router):
    sessions = synthesize(SynthConfig(sessions=30, rate_per_s=1.0, seed=7, human_prob=0.05))
    node = default_node(hbm_bytes=100e9 + 141.2e9 + 20e9, host_bytes=60e9, nvme_bytes=300e9)
    cfg = ClusterConfig(nodes=3, router=router, remote=RemoteConfig(10.0, capacity_bytes=200e9))
    res = run_cluster_policies(sessions, node, cfg, ["breakeven", "oracle", "lru", "retain", "recompute"],
                               check_every=50, record_rounds=True)
    for name, r in res.items():
        m = r.metrics
        assert m["sessions_done"] + m["sessions_rejected"] == 90, name
        assert m["resumes"] == sum(len(s.rounds) - 1 for s in cfg.offered(sessions)), name
        assert len({sid for sid, k, _, _ in r.round_log if k == 0}) == m["sessions_done"]
        if "attribution" in m:                   # a moved pause's record is closed where it went
            assert m["attribution"]["all"]["pauses"] == sum(len(s.rounds) - 1 for s in cfg.offered(sessions))


# ---------------------------------------------------------------------------- load and remote tier
def test_replicate_copies_with_distinct_ids_and_small_jitter():
    base = synthesize(SynthConfig(sessions=20, rate_per_s=1.0, seed=1))
    assert replicate(base, 1) == base
    out = replicate(base, 2.5, jitter_s=0.5, seed=3)
    assert len(out) == 50 and len({s.id for s in out}) == 50
    orig = {s.id: s for s in base}
    for s in out:
        src = orig[s.id.split("~")[0]]
        assert 0 <= s.arrival_s - src.arrival_s < 0.5
        assert [r.tool_wait_s for r in s.rounds] == [r.tool_wait_s for r in src.rounds]
    assert replicate(base, 2.5, jitter_s=0.5, seed=3) == out            # seeded
    with pytest.raises(ValueError):
        replicate(base, 0)


def test_remote_tier_lands_blocks_at_the_nic_rate_and_evicts_oldest_first():
    rt = RemoteTier(RemoteConfig(gbps=ONE_MS_PER_BLOCK_GBPS, latency_s=2 * MS, capacity_bytes=20 * BB), BB, 2)
    assert rt.publish(0, "a", 10, 0.0) == 10
    assert rt.available("a", 1 * MS) == 0                     # still in the latency
    assert rt.available("a", 6.5 * MS) == 4
    assert rt.available("a", 1.0) == 10
    assert rt.publish(0, "a", 10, 1.0) == 0                   # nothing new
    assert rt.publish(1, "b", 8, 1.0) == 8
    assert rt.publish(0, "a", 14, 1.0) == 4                   # only the added blocks; now the newest
    assert rt.publish(1, "c", 6, 2.0) == 6                    # full: b (oldest publish) goes
    assert "b" not in rt.entries and rt.evicted == 1 and rt.used == 20
    rt.fetch(1, "a", 14, 3.0)
    assert rt.publish(0, "d", 20, 3.0) == 0                   # c goes, but a is being read: no room
    assert rt.skipped == 1 and "a" in rt.entries and "c" not in rt.entries
    rt.end_read("a")
    assert rt.publish(0, "d", 20, 4.0) == 20 and list(rt.entries) == ["d"] and rt.used == 20
    rt.release("d")
    assert rt.used == 0 and rt.available("d", 9.0) == 0


def test_a_streamed_read_finishes_one_block_after_the_last_has_landed():
    rt = RemoteTier(RemoteConfig(gbps=ONE_MS_PER_BLOCK_GBPS, latency_s=2 * MS), BB, 2)
    rt.publish(0, "a", 10, 0.0)                                # blocks land at 3, 4, ... 12 ms
    assert rt.published("a") == 10 and rt.available("a", 5.5 * MS) == 3
    assert rt.landing_bound("a", 10) == pytest.approx(13 * MS)
    assert rt.landing_bound("a", 4) == pytest.approx(7 * MS)
    assert rt.fetch_done_at(1, 10, 5.5 * MS) == pytest.approx(17.5 * MS)             # landed or not
    assert rt.fetch_done_at(1, 10, 5.5 * MS, "a") == pytest.approx(17.5 * MS)        # the NIC is slower
    assert rt.fetch_done_at(1, 4, 5.5 * MS, "a") == pytest.approx(11.5 * MS)
    assert rt.fetch(1, "a", 10, 0.0, stream=True) == pytest.approx(13 * MS)          # waits for block 9
    assert rt.get_free[1] == pytest.approx(13 * MS) and rt.entries["a"].readers == 1
    assert rt.landing_bound("nobody", 3) == -math.inf


def test_cli_cluster_json_keeps_the_per_policy_shape(capsys):
    rc = main(["bench", "simulate", "--synth", "20", "--rate", "1", "--policies", "breakeven,lru",
               "--nodes", "2", "--remote-gbps", "25", "--json"])
    out, _ = capsys.readouterr()
    assert rc == 0
    doc = json.loads(out)
    assert doc["cluster"]["nodes"] == 2 and doc["cluster"]["sessions_offered"] == 40
    for m in doc["policies"].values():
        assert all(isinstance(m[k], (int, float)) and math.isfinite(m[k]) for k in REQUIRED_METRICS)
        assert m["sessions_done"] == 40 and m["cluster"]["remote"]["gbps_per_node"] == 25
    assert main(["bench", "simulate", "--synth", "5", "--router", "random"]) == 2
    assert "needs --nodes" in capsys.readouterr().err
    assert main(["bench", "simulate", "--synth", "5", "--remote-fill", "landed"]) == 2
    assert "--remote-fill needs --nodes" in capsys.readouterr().err


# ---------------------------------------------------------------------------- prefetches and moves
class OffloadPrefetch(Policy):
    """Offload to host at the pause and plan the reload one second later."""

    name = "offload-prefetch"

    def decide(self, ctx):
        return Decision(Action.OFFLOAD_HOST, prefetch_at_s=1.0)


class MoveOne(Router):
    """New sessions to node 0; session ``sid``'s resumes go to node 1, every other resume stays home."""

    name = "move-one"

    def __init__(self, sid):
        self.sid = sid

    def place_new(self, session, view):
        return 0

    def place_resume(self, session, home, view, own_hbm=0):
        return 1 if session.id == self.sid else home


def _prefetch_scene(moving_sid):
    # node 0 (200 blocks): "hog" (175 blocks) decodes for ~2 s; "late" (26 blocks) arrives at
    # 0.5 s and waits for admission until hog ends; "a" pauses early with a 5 s tool and a
    # prefetch planned 1 s into it; "m" returns after 0.1 s (to node 1 if it is the one moving)
    sessions = [make_session("a", 0.0, [(160, 16, "pytest", 5.0), (32, 16, None, None)]),
                make_session("m", 0.0, [(160, 16, "pytest", 0.1), (32, 16, None, None)]),
                make_session("hog", 0.0, [(800, 2000, None, None)]),
                make_session("late", 0.5, [(400, 16, None, None)])]
    sessions.sort(key=lambda s: s.arrival_s)
    c, r = cluster(sessions, OffloadPrefetch(), router=MoveOne(moving_sid), pool=200)
    return c, r


def test_a_prefetch_waits_while_admission_waits_once_resumes_have_moved():
    c, r = _prefetch_scene("m")
    n0 = c.nodes[0]
    assert n0.stats.moved_out == 1
    assert n0.stats.prefetch_held == 1 and r.metrics["prefetch_deferred"] >= 1
    assert r.metrics["cluster"]["prefetches_held_for_admission"] == 1
    # a reloads on demand when its tool returns: 11 blocks over the host link, 11 ms (m ran on node 1)
    assert n0.sim.m.stalls == [pytest.approx(11 * MS)]
    assert r.metrics["moved_gb"]["h2d"] == pytest.approx(11 * BB / 1e9)


def test_a_prefetch_starts_as_planned_on_a_node_whose_resumes_stay():
    c, r = _prefetch_scene("nobody")
    assert c.nodes[0].stats.moved_out == 0 and c.nodes[0].stats.prefetch_held == 0
    assert r.metrics["cluster"]["prefetches_held_for_admission"] == 0
    assert r.metrics["prefetch_deferred"] == 0
    # a's prefetch ran at 1 s (11 blocks up, besides m's 11-block reload at home), sat in HBM while
    # "late" waited, and was evicted (dropped) for it: a recomputes its 176 tokens
    assert r.metrics["moved_gb"]["h2d"] == pytest.approx(22 * BB / 1e9)
    assert sorted(c.nodes[0].sim.m.stalls) == [pytest.approx(11 * MS), pytest.approx(176 * MS)]


# ---------------------------------------------------------------------------- common routing
def test_common_routing_replays_the_first_policys_routing_for_the_others():
    sessions = synthesize(SynthConfig(sessions=30, rate_per_s=2.0, seed=3))
    node = toy_node(3000)
    cfg = ClusterConfig(nodes=3, router="least-loaded", remote=remote())
    log = {}
    first = Cluster(sessions, node, make_policy("lru", node), cfg, route_log=log).run()
    assert any(k > 0 for _, k in log) and len(set(log.values())) == 3   # resumes routed, every node used
    again = {}
    other = Cluster(sessions, node, make_policy("offload_host", node), cfg, route_log=again,
                    route_replay=log).run()
    assert again == log
    assert other.metrics["cluster"]["routing"] == "replayed" and other.metrics["cluster"]["routing_fallbacks"] == 0
    assert first.metrics["cluster"]["routing"] == "own"
    # run_cluster_policies does the same: every policy after the first follows the first's record
    res = run_cluster_policies(sessions, node, cfg, ["lru", "offload_host"], common_routing=True)
    assert res["offload_host"].metrics["cluster"]["routing"] == "replayed"
    assert res["lru"].metrics["cluster"]["routing"] == "own"
    assert res["offload_host"].metrics["cluster"]["resumes_moved"] == res["lru"].metrics["cluster"]["resumes_moved"]


def test_common_routing_falls_back_to_the_router_where_the_record_cannot_be_followed():
    sessions = one()
    bad = {("a", 0): 0, ("a", 1): 7}                     # node 7 does not exist
    c = Cluster(sessions, toy_node(), Always(Action.OFFLOAD_HOST), ClusterConfig(nodes=2), router=Away(),
                route_replay=bad)
    r = c.run()
    assert r.metrics["cluster"]["routing_fallbacks"] == 1
    assert r.metrics["cluster"]["resumes_moved"] == 1     # Away's choice: node 1
