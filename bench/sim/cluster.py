"""The cluster model: N one-node simulators, a router, and a shared remote tier.

::

    arrivals --> router --> node 0 ... node N-1   (each: the one-node hardware and engine)
                   ^            |  NIC (gbps each way, latency per transfer)
    tool returns --+            v
                          remote tier (Redis / Mooncake Store): published KV prefixes

* **Load.** By default the cluster receives N times the trace
  (:func:`~kvtier.bench.sim.cluster_load.replicate`: copies with distinct ids
  and a small arrival jitter), so each node sees about the one-node load;
  ``load_scale`` multiplies that.
* **Routing.** A :class:`~kvtier.bench.sim.router.Router` places each new
  session and each resumed round (affinity, least-loaded, sticky, random).  A resumed
  round placed on another node finds no local state there: it loads what the
  remote tier holds of it, or recomputes (see
  :mod:`~kvtier.bench.sim.cluster_node`).
* **Policies.** One policy instance serves every node (a fleet shares its
  tool-wait forecasts, as with one ``kvtier serve``); it learns each resume's
  wait once.  The oracle knows every wait, not where the resume will land.
* **Common routing** (``route_replay``): a run may follow where another run
  routed each round (``route_log`` records it, keyed by session id and round),
  so two policies can be compared on the same routing: the least-loaded
  router's choices hang on the nodes' timing, and a change of a few
  milliseconds anywhere sends later rounds elsewhere, which moves mean JCT by
  more than the policies differ (docs/cluster.md).  A recorded node that does
  not hold the round's shared prefix, or a round the record lacks, is routed
  by the router (counted as ``routing_fallbacks``).
* **Time.** One event loop steps, at each turn, the node whose next event is
  earliest (ties: arrivals first, then in push order), so the nodes share one
  clock.  With one node and no remote tier this is exactly the one-node
  simulator: same events in the same order, same metrics.

Metrics keep the one-node shape: the DESIGN.md metrics over every session of
the cluster (JCTs, stalls, recomputed tokens, idle HBM summed over nodes;
throughput over the cluster's makespan), plus a ``cluster`` block (routing,
moves, remote traffic, per-node counts).
"""
from __future__ import annotations

import heapq
import math
import time as _time
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from kvtier.tiering.model.decision import Policy

from kvtier.bench.sim.cluster_load import replicate
from kvtier.bench.sim.cluster_node import ClusterNode
from kvtier.bench.sim.cluster_remote import RemoteConfig, RemoteTier
from kvtier.bench.sim.metrics import SimCounters, summary
from kvtier.bench.sim.node import NodeConfig, SessionState, SimResult
from kvtier.bench.sim.router import ROUTER_NAMES, Router, make_router
from kvtier.bench.sim.trace import Session

MAX_NODES = 1024


@dataclass(frozen=True)
class ClusterConfig:
    """N nodes of one NodeConfig, a router and an optional remote tier (every field is a CLI flag)."""

    nodes: int = 1
    router: str = "least-loaded"
    remote: RemoteConfig | None = None
    load_scale: float = 1.0            # the cluster receives nodes x load_scale x the trace
    jitter_s: float | None = None      # arrival jitter of the copies (None: one mean arrival gap)
    seed: int = 0                      # copies' jitter and sampling, random router
    prefix_mu: float = 0.5             # prefix-load router: weight of the prefix match
    prefix_gamma: float = 1.0          # prefix-load router: load exponent

    def __post_init__(self) -> None:
        if not (isinstance(self.nodes, int) and 1 <= self.nodes <= MAX_NODES):
            raise ValueError(f"nodes must be an integer in [1, {MAX_NODES}], got {self.nodes!r}")
        if self.router not in ROUTER_NAMES:
            raise ValueError(f"unknown router {self.router!r}; known routers: {', '.join(ROUTER_NAMES)}")
        if not (math.isfinite(self.load_scale) and self.load_scale > 0):
            raise ValueError(f"load_scale must be a positive number, got {self.load_scale!r}")

    @property
    def copies(self) -> float:
        return self.nodes * self.load_scale

    def offered(self, sessions: Sequence[Session]) -> list[Session]:
        """The sessions the cluster receives (N x load_scale copies of ``sessions``)."""
        return replicate(sessions, self.copies, jitter_s=self.jitter_s, seed=self.seed)


class _View:
    """What the router sees (the ClusterView protocol) over the cluster's nodes.  While a
    resume is routed, ``resuming`` is its state on its home node (set by :class:`Cluster`)."""

    def __init__(self, nodes: list[ClusterNode], remote: RemoteTier | None = None) -> None:
        self._nodes = nodes
        self._remote = remote
        self.n = len(nodes)
        self.resuming: tuple[SessionState, int] | None = None

    @property
    def resume_round(self) -> int:
        return self.resuming[0].k + 1 if self.resuming is not None else 1

    @staticmethod
    def _ctx(session: Session, k: int) -> int:
        return sum(r.new_tokens + r.output_tokens for r in session.rounds[:k])

    def prompt_tokens(self, session: Session, k: int) -> int:
        return session.shared_prefix_tokens + self._ctx(session, k) + session.rounds[k].new_tokens

    def held_tokens(self, i: int, session: Session, k: int) -> int:
        sp = session.shared_prefix_id
        shared = session.shared_prefix_tokens if sp is not None and sp in self._nodes[i].sim.ledger.shared_loaded else 0
        if k == 0:
            return shared
        ctx = self._ctx(session, k)
        x = self.resuming
        if x is not None and x[0].s.id == session.id and i == x[1] and x[0].place is not None:
            return shared + ctx
        if self._remote is not None:
            sim = self._nodes[i].sim
            return shared + min(ctx, self._remote.available(session.id, sim.clock.now) * sim.ledger.bt)
        return shared

    def active(self, i: int) -> int:
        return self._nodes[i].stats.active

    def hbm_used(self, i: int) -> int:
        return self._nodes[i].sim.ledger.used

    def holds_prefix(self, i: int, prefix_id: str | None) -> bool:
        return prefix_id is None or prefix_id in self._nodes[i].sim.ledger.shared_loaded


class Cluster:
    """Replays ``sessions`` (already the offered load: see :meth:`ClusterConfig.offered`) on
    ``cfg.nodes`` copies of ``node`` under one ``policy``.  Use :meth:`run` once; not thread-safe."""

    def __init__(self, sessions: Sequence[Session], node: NodeConfig, policy: Policy, cfg: ClusterConfig, *,
                 name: str | None = None, reveal_true_wait: bool = False, router: Router | None = None,
                 progress: Callable[[int, int], None] | None = None, record_rounds: bool = False,
                 check_every: int = 0, occupancy_points: int = 4000,
                 route_log: dict[tuple[str, int], int] | None = None,
                 route_replay: Mapping[tuple[str, int], int] | None = None) -> None:
        self.cfg = cfg
        self.route_log = route_log                 # filled: (session id, round) -> node
        self.route_replay = route_replay           # followed where it can be (module docstring)
        self.routing_fallbacks = 0
        self.sessions = list(sessions)
        self.name = name or policy.name
        self.router = router if router is not None else make_router(cfg.router, seed=cfg.seed, mu=cfg.prefix_mu,
                                                                    gamma=cfg.prefix_gamma)
        self.remote = RemoteTier(cfg.remote, node.block_bytes, cfg.nodes) if cfg.remote is not None else None
        self.progress = progress
        span = max((s.arrival_s for s in self.sessions), default=0.0)   # what one node sizes from its sessions
        self.nodes = [ClusterNode(i, self, node, policy, name=self.name, reveal_true_wait=reveal_true_wait,
                                  record_rounds=record_rounds, check_every=check_every,
                                  occupancy_points=occupancy_points, span_s=span)
                      for i in range(cfg.nodes)]
        self.view = _View(self.nodes, self.remote)
        self._heap: list[tuple[float, int, int]] = []
        self._seq = 0
        self._touched: list[ClusterNode] = []

    # ------------------------------------------------------------ routing (called by nodes)
    def _placed(self, s: Session, k: int, home: int | None, choose: Callable[[], int]) -> int:
        """The node of session ``s``'s round ``k`` (``home``: its previous round's node; None for
        round 0): the replayed record's where it can be followed, else ``choose()``."""
        key = (s.id, k)
        i = None
        if self.route_replay is not None:
            i = self.route_replay.get(key)
            if i is not None and not (0 <= i < self.view.n and (k == 0 or i == home or self.view.holds_prefix(
                    i, s.shared_prefix_id))):
                i = None                           # a resume goes only where its shared prefix is
            if i is None:
                self.routing_fallbacks += 1
        if i is None:
            i = choose()
        if self.route_log is not None:
            self.route_log[key] = i
        return i

    def place_new(self, s: Session) -> ClusterNode:
        """Where the newly arrived session ``s`` runs its first round."""
        return self.nodes[self._placed(s, 0, None, lambda: self.router.place_new(s, self.view))]

    def route_resume(self, home: int, x: SessionState) -> ClusterNode:
        """Where x's next round runs (a node that is not node ``home`` will :meth:`ClusterNode.adopt` it)."""
        self.view.resuming = (x, home)
        try:
            dest = self.nodes[self._placed(x.s, x.k + 1, home, lambda: self.router.place_resume(
                x.s, home, self.view, own_hbm=x.hbm))]
        finally:
            self.view.resuming = None
        if dest.index != home:
            self._touched.append(dest)
        return dest

    # ------------------------------------------------------------ the event loop
    def _mark(self, nd: ClusterNode) -> None:
        t = nd.next_event_time()
        if t is not None:
            self._seq += 1
            heapq.heappush(self._heap, (t, self._seq, nd.index))

    def run(self) -> SimResult:
        """Replay every session.  Raises SimulationStalled if a node deadlocks."""
        wall0 = _time.perf_counter()
        for nd in self.nodes:
            nd.start()                             # no sessions of its own: arms nothing
        arrivals, n_arr, a = self.sessions, len(self.sessions), 0
        heap, nodes, mark = self._heap, self.nodes, self._mark
        steps = 0
        while True:
            ta = arrivals[a].arrival_s if a < n_arr else math.inf
            while heap:
                t, _, i = heap[0]
                if nodes[i].next_event_time() == t:
                    break
                heapq.heappop(heap)                # stale: that node's next event changed since
            tn = heap[0][0] if heap else math.inf
            if ta == math.inf and tn == math.inf:
                break
            if ta <= tn:                           # arrivals first at a tie, as on one node
                s = arrivals[a]
                a += 1
                nd = self.place_new(s)
                nd.arrive(s, ta)
            else:
                nd = nodes[heapq.heappop(heap)[2]]
                nd.step()
            mark(nd)
            if self._touched:                      # a move queued events on other nodes
                for o in self._touched:
                    mark(o)
                self._touched.clear()
            steps += 1
            if self.progress is not None and steps % 2000 == 0:
                self.progress(sum(o.sim.done for o in nodes), n_arr)
        return self._finish(_time.perf_counter() - wall0)

    def _finish(self, wall: float) -> SimResult:
        results = [nd.finish() for nd in self.nodes]       # raises SimulationStalled
        sims = [nd.sim for nd in self.nodes]
        merged = merge_counters([sim.m for sim in sims])
        moved = [sum(sim.parts.transfers.xs.moved_bytes[i] for sim in sims) for i in range(4)]
        led0 = sims[0].ledger
        first = min((s.arrival_s for s in self.sessions), default=0.0)
        metrics = summary(merged, first_arrival=first, last_done=max(sim.last_done for sim in sims),
                          hbm_total=led0.hbm_total, block_bytes=led0.bb, write_through=led0.wt,
                          moved_bytes=moved, events=sum(sim.clock.handled for sim in sims), wall=wall)
        metrics["cluster"] = self._cluster_block(merged)
        return SimResult(self.name, metrics, results[0].occupancy, tuple(merged.stalls), tuple(merged.jcts),
                         tuple(merged.round_log))

    def _cluster_block(self, merged: SimCounters) -> dict:
        nodes = self.nodes
        resumes = len(merged.stalls)
        stats = [nd.stats for nd in nodes]
        moved = sum(st.moved_out for st in stats)
        per = [nd.cluster_stats() for nd in nodes]
        done = [p["sessions_done"] for p in per]
        mean_done = sum(done) / len(done) if done else 0.0
        return {
            "nodes": len(nodes), "router": self.router.name, "sessions_offered": len(self.sessions),
            "load_scale": self.cfg.load_scale,
            "resumes_moved": moved, "resumes_moved_frac": moved / resumes if resumes else 0.0,
            "remote_fills": sum(st.remote_fills for st in stats),
            "remote_fill_tokens": sum(st.remote_fill_tokens for st in stats),
            "remote_fills_streamed": sum(st.remote_fills_streamed for st in stats),
            "remote_declined_slower_than_recompute": sum(st.remote_declined for st in stats),
            "prefetches_held_for_admission": sum(st.prefetch_held for st in stats),
            "routing": "replayed" if self.route_replay is not None else "own",
            "routing_fallbacks": self.routing_fallbacks,
            "remote": self.remote.stats() if self.remote is not None else None,
            "node_sessions_done_max_over_mean": (max(done) / mean_done) if mean_done else 0.0,
            "per_node": per,
        }


def merge_counters(parts: Sequence[SimCounters]) -> SimCounters:
    """The cluster's counters: samples concatenated (node order), counts and sums added, count
    tables added key by key, objects with a ``merge`` method merged; ``peak_used`` is the
    largest node's, ``above_ceiling_s`` the nodes' mean (so the summary's fractions stay per
    node).  One part gives its own values exactly."""
    out = SimCounters()
    for c in parts:
        for f, v in vars(c).items():
            cur = getattr(out, f)
            if isinstance(v, list):
                cur.extend(v)
            elif isinstance(v, dict):
                for k, n in v.items():
                    cur[k] = cur.get(k, 0) + n
            elif isinstance(v, bool) or not isinstance(v, (int, float)):
                if hasattr(cur, "merge"):
                    cur.merge(v)
                else:
                    raise TypeError(f"cannot merge SimCounters.{f} ({type(v).__name__})")
            elif f == "peak_used":
                setattr(out, f, max(cur, v))
            elif f == "above_ceiling_s":
                setattr(out, f, cur + v / len(parts))
            else:
                setattr(out, f, cur + v)
    return out


def run_cluster_policies(sessions: Sequence[Session], node: NodeConfig, cfg: ClusterConfig,
                         names: Sequence[str], *, options: Mapping[str, Mapping] | None = None,
                         on_policy: Callable[[str, int, int], None] | None = None,
                         progress: Callable[[str, int, int], None] | None = None,
                         offered: Sequence[Session] | None = None, common_routing: bool = False,
                         record_rounds: bool = False, check_every: int = 0) -> dict[str, SimResult]:
    """Replay the cluster's offered load of ``sessions`` once per policy (each gets a fresh
    policy and router).  ``offered``: the load already built (skips :meth:`ClusterConfig.offered`).
    ``common_routing``: every policy after the first follows the first one's routing (a
    paired comparison; :class:`Cluster`'s ``route_replay``).
    Raises ValueError for an unknown policy name, SimulationStalled for a deadlocked node."""
    from kvtier.bench.sim.variants import make_sim_policy
    load = list(offered) if offered is not None else cfg.offered(sessions)
    policies = {n: make_sim_policy(n, geometry=node.geometry, hardware=node.hardware,
                               **dict((options or {}).get(n, {}))) for n in names}
    out: dict[str, SimResult] = {}
    routes: dict[tuple[str, int], int] | None = None
    for i, (n, pol) in enumerate(policies.items()):
        if on_policy is not None:
            on_policy(n, i, len(policies))
        cb = (lambda d, t, _n=n: progress(_n, d, t)) if progress is not None else None
        log = {} if common_routing and routes is None else None
        out[n] = Cluster(load, node, pol, cfg, name=n, reveal_true_wait=(n == "oracle"), progress=cb,
                         record_rounds=record_rounds, check_every=check_every,
                         route_log=log, route_replay=routes).run()
        if log is not None:
            routes = log
    return out
