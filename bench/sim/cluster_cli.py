"""The cluster flags of ``kvtier bench simulate`` and the run they select.

``bench/cmd_simulate.py`` calls :func:`add_cluster_flags` on its parser and
:func:`run` instead of the one-node runner; without ``--nodes`` :func:`run`
is the one-node runner, unchanged.  Module top level stays cheap (argparse
only); the simulator is imported inside the functions.
"""
from __future__ import annotations

import argparse
from typing import Callable, Sequence

from kvtier.util.args import add_rate_flag, nonneg_float, pos_float, pos_int
from kvtier.bench.sim.router import ROUTER_NAMES

_CLUSTER_ONLY = ("router", "remote_gbps", "remote_latency_ms", "remote_gb", "remote_fill", "load_scale",
                 "jitter_s", "cluster_seed", "common_routing", "prefix_mu", "prefix_gamma")
_DEFAULTS = {"router": "least-loaded", "remote_gbps": 0.0, "remote_latency_ms": 1.0, "remote_gb": None,
             "remote_fill": "streamed", "load_scale": 1.0, "jitter_s": None, "cluster_seed": 0,
             "common_routing": False, "prefix_mu": 0.5, "prefix_gamma": 1.0}


def add_cluster_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("cluster (N copies of the node above, a router and a shared remote tier; "
                             "docs/cluster.md)")
    g.add_argument("--nodes", type=pos_int, default=None, metavar="N",
                   help="simulate N nodes; the cluster receives N x --load-scale copies of the trace "
                        "(default: one node, no cluster model)")
    g.add_argument("--router", choices=ROUTER_NAMES, default=_DEFAULTS["router"],
                   help="where rounds run: affinity (a session's rounds stay on its first node), "
                        "least-loaded (every round to the node with the fewest active rounds), sticky "
                        "(least-loaded, but a resume stays home unless home has more than one active "
                        "round more), random, prefix-load (figure 7 of 000: mu * Match/S - (1 - mu) * (L/Lmax)^gamma; "
                        "docs/prefix.md) (default least-loaded)")
    g.add_argument("--prefix-mu", type=float, default=_DEFAULTS["prefix_mu"], metavar="MU",
                   help="prefix-load: weight of the prefix match, in [0, 1] (default 0.5)")
    g.add_argument("--prefix-gamma", type=pos_float, default=_DEFAULTS["prefix_gamma"], metavar="G",
                   help="prefix-load: exponent of the load term (default 1)")
    add_rate_flag(g, "--remote-gbps", type=nonneg_float, default=_DEFAULTS["remote_gbps"], metavar="GB/S",
                  help="shared remote tier, each node's NIC, gigabytes per second each way "
                       "(0: no remote tier; default 0)")
    g.add_argument("--remote-latency-ms", type=nonneg_float, default=_DEFAULTS["remote_latency_ms"],
                   help="remote tier latency per transfer, ms (default 1)")
    g.add_argument("--remote-gb", type=pos_float, default=_DEFAULTS["remote_gb"],
                   help="remote tier capacity, GB, evicting whole trajectories oldest first "
                        "(default unlimited)")
    g.add_argument("--remote-fill", choices=("streamed", "landed"), default=_DEFAULTS["remote_fill"],
                   help="what a resume on another node reads: streamed (the published blocks, waiting for "
                        "those still landing when that is sooner than prefilling them) or landed (only "
                        "the blocks landed when it starts; the rest is recomputed) (default streamed)")
    g.add_argument("--load-scale", type=pos_float, default=_DEFAULTS["load_scale"], metavar="X",
                   help="the cluster receives N x X copies of the trace (default 1: each node about "
                        "the one-node load)")
    g.add_argument("--jitter-s", type=nonneg_float, default=_DEFAULTS["jitter_s"],
                   help="arrival jitter of the trace's copies, s (default: one mean arrival gap)")
    g.add_argument("--cluster-seed", type=int, default=_DEFAULTS["cluster_seed"],
                   help="seed of the copies' jitter and of the random router (default 0)")
    g.add_argument("--common-routing", action="store_true",
                   help="route every policy's rounds to the nodes the first policy's run routed them to (a "
                        "paired comparison: the policies then differ only in what they do at pauses, not in "
                        "which routing their timing happened to set off; docs/cluster.md)")


def cluster_config(a: argparse.Namespace):
    """The ClusterConfig the flags ask for, or None for the one-node simulator.

    Raises kvtier.util.cmd.CliError for cluster flags given without --nodes."""
    from kvtier.util.cmd import CliError
    if getattr(a, "nodes", None) is None:
        given = [f for f in _CLUSTER_ONLY if getattr(a, f, _DEFAULTS[f]) != _DEFAULTS[f]]
        if given:
            raise CliError(f"--{given[0].replace('_', '-')} needs --nodes N (the cluster model)")
        return None
    from kvtier.bench.sim.cluster import ClusterConfig
    from kvtier.bench.sim.cluster_remote import RemoteConfig
    remote = None
    if a.remote_gbps > 0:
        remote = RemoteConfig(gbps=a.remote_gbps, latency_s=a.remote_latency_ms / 1e3,
                              capacity_bytes=a.remote_gb * 1e9 if a.remote_gb else float("inf"),
                              stream_inflight=a.remote_fill == "streamed")
    try:
        return ClusterConfig(nodes=a.nodes, router=a.router, remote=remote, load_scale=a.load_scale,
                             jitter_s=a.jitter_s, seed=a.cluster_seed, prefix_mu=a.prefix_mu,
                             prefix_gamma=a.prefix_gamma)
    except ValueError as exc:
        raise CliError(str(exc)) from None


def run(a: argparse.Namespace, sessions: Sequence, node, names: Sequence[str], *, options,
        on_policy: Callable[[str, int, int], None], progress: Callable[[str, int, int], None]):
    """Run the policies on one node, or on the cluster the flags ask for.

    Returns (results by policy, cluster document or None).  ``progress`` gets counts
    scaled to ``len(sessions)`` (the bar the caller drew).  Raises CliError (bad cluster
    flags), ValueError (unknown policy), SimulationStalled."""
    cfg = cluster_config(a)
    if cfg is None:
        from kvtier.bench.sim.runner import run_policies
        return run_policies(sessions, node, names, options=options, on_policy=on_policy,
                            progress=progress), None
    from kvtier.bench.sim.cluster import run_cluster_policies
    offered = cfg.offered(sessions)
    scale = len(sessions) / max(1, len(offered))

    def prog(n: str, done: int, total: int) -> None:
        progress(n, int(done * scale), len(sessions))

    common = bool(getattr(a, "common_routing", False))
    results = run_cluster_policies(sessions, node, cfg, names, options=options, on_policy=on_policy,
                                   progress=prog, offered=offered, common_routing=common)
    rm = cfg.remote
    doc = {"nodes": cfg.nodes, "router": cfg.router, "load_scale": cfg.load_scale,
           "sessions_offered": len(offered), "jitter_s": cfg.jitter_s, "seed": cfg.seed,
           "routing_from": names[0] if common and names else None,
           "remote": None if rm is None else {"gbps": rm.gbps, "latency_s": rm.latency_s,
                                              "fill": "streamed" if rm.stream_inflight else "landed",
                                              "capacity_gb": None if rm.capacity_bytes == float("inf")
                                              else rm.capacity_bytes / 1e9}}
    return results, doc


def describe(doc: dict | None) -> str | None:
    """One line for the readable output (None without a cluster)."""
    if doc is None:
        return None
    rm = doc["remote"]
    tier = "no remote tier" if rm is None else (
        f"remote tier {rm['gbps']:g} GB/s per node, {rm['latency_s'] * 1e3:g} ms"
        + (f", {rm['capacity_gb']:g} GB" if rm["capacity_gb"] else "")
        + (", fills read landed blocks only" if rm.get("fill") == "landed" else ""))
    routed = f" (every policy routed as {doc['routing_from']})" if doc.get("routing_from") else ""
    return (f"cluster {doc['nodes']} nodes, router {doc['router']}{routed}, {doc['sessions_offered']} sessions offered "
            f"(x{doc['nodes'] * doc['load_scale']:g} the trace), {tier}")
