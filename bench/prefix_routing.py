"""Routers on the cluster model, judged on ensembles: ``prefix-load`` (a mu, gamma sweep)
against ``affinity``, ``least-loaded``, ``sticky`` and ``random``.

``python -m kvtier.bench.prefix_routing --nodes 4 16 --seeds 5 [--json]``

Workload: sessions rebuilt from the Mooncake trace's prefix hash ids
(``bench.sim.convert.convert_mooncake``; the first ``--sessions`` of them, arrivals
times ``--time-scale``), offered N x ``--load-scale`` times as the cluster model
does.  Run r of the ensemble uses seed r for both the sampled tool waits and the
copies' arrival jitter, so every router sees the same R workloads; each router's
metrics are reported as mean +- SE over the R runs, and every other router's paired
difference to the reference (``--reference``, default the sweep's best mean JCT) run
by run: a lead or a loss only past 2 SE, a tie otherwise.  One policy (``--policy``)
decides the pauses everywhere.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from typing import Sequence

BASE_ROUTERS = ("affinity", "least-loaded", "sticky", "random")
METRICS = ("jct_mean_s", "jct_p99_s", "prefix_hit_rate")
RESOLVED_SE = 2.0


def _ms(xs: Sequence[float]) -> dict:
    m = statistics.fmean(xs)
    se = statistics.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else 0.0
    return {"mean": m, "se": se}


def label(router: str, mu: float | None = None, gamma: float | None = None) -> str:
    return router if mu is None else f"{router}(mu={mu:g},g={gamma:g})"


def run_one(sessions, nodes: int, router: str, seed: int, *, mu: float = 0.5, gamma: float = 1.0,
            load_scale: float = 1.0, policy: str = "breakeven", remote_gbps: float = 0.0) -> dict:
    from kvtier.bench.sim.cluster import ClusterConfig, run_cluster_policies
    from kvtier.bench.sim.cluster_remote import RemoteConfig
    from kvtier.bench.sim.runner import default_node
    node = default_node()
    cfg = ClusterConfig(nodes=nodes, router=router, seed=seed, load_scale=load_scale, prefix_mu=mu,
                        prefix_gamma=gamma, remote=RemoteConfig(remote_gbps) if remote_gbps > 0 else None)
    m = run_cluster_policies(sessions, node, cfg, [policy])[policy].metrics
    return {k: m[k] for k in METRICS} | {"resumes_moved_frac": m["cluster"]["resumes_moved_frac"],
                                        "sessions_done": m["sessions_done"]}


def compare(runs: dict[str, list[dict]], reference: str) -> dict:
    """Per router: mean +- SE of each metric, and the paired difference (router - reference)
    with its verdict (lower JCT is better, higher hit rate is better)."""
    out = {}
    ref = runs[reference]
    for name, rs in runs.items():
        row = {k: _ms([r[k] for r in rs]) for k in METRICS}
        row["resumes_moved_frac"] = _ms([r["resumes_moved_frac"] for r in rs])
        if name != reference:
            for k in METRICS:
                d = _ms([a[k] - b[k] for a, b in zip(rs, ref)])
                better_if_lower = k != "prefix_hit_rate"
                if d["se"] == 0 and d["mean"] == 0 or abs(d["mean"]) <= RESOLVED_SE * d["se"]:
                    v = "tie"
                else:
                    ref_better = (d["mean"] > 0) == better_if_lower
                    v = "reference leads" if ref_better else "reference loses"
                row[f"diff_{k}"] = d | {"verdict": v}
        out[name] = row
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m kvtier.bench.prefix_routing", description=__doc__.split("\n\n")[0])
    p.add_argument("--trace", default=None, help="Mooncake trace (default ../shared/traces/mooncake/"
                                                  "conversation_trace.jsonl)")
    p.add_argument("--nodes", type=int, nargs="+", default=[4, 16])
    p.add_argument("--seeds", type=int, default=5, help="runs per ensemble (seeds 0..R-1)")
    p.add_argument("--sessions", type=int, default=60, help="trace sessions (before replication)")
    p.add_argument("--time-scale", type=float, default=0.05, help="arrival times multiplied by this")
    p.add_argument("--load-scale", type=float, default=1.0)
    p.add_argument("--mu", type=float, nargs="+", default=[0.3, 0.5, 0.8])
    p.add_argument("--gamma", type=float, nargs="+", default=[1.0, 2.0])
    p.add_argument("--policy", default="breakeven")
    p.add_argument("--remote-gbps", type=float, default=0.0)
    p.add_argument("--reference", default=None, help="router label the others are paired against "
                                                      "(default: the prefix-load setting with the best mean JCT)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    from kvtier.bench.sim.convert import convert_mooncake, default_traces_dir
    path = a.trace or default_traces_dir() / "mooncake" / "conversation_trace.jsonl"
    configs = [(r, None, None) for r in BASE_ROUTERS] + [("prefix-load", m, g) for m in a.mu for g in a.gamma]
    doc = {"trace": str(path), "sessions": a.sessions, "time_scale": a.time_scale, "seeds": a.seeds,
           "policy": a.policy, "remote_gbps": a.remote_gbps, "load_scale": a.load_scale, "by_nodes": {}}
    total = len(a.nodes) * a.seeds * len(configs)
    done = 0
    for n in a.nodes:
        runs: dict[str, list[dict]] = {label(*c): [] for c in configs}
        for seed in range(a.seeds):
            conv = convert_mooncake(path, seed=seed, time_scale=a.time_scale, max_sessions=a.sessions)
            for r, mu, g in configs:
                kw = {} if mu is None else {"mu": mu, "gamma": g}
                runs[label(r, mu, g)].append(run_one(conv.sessions, n, r, seed, load_scale=a.load_scale,
                                                     policy=a.policy, remote_gbps=a.remote_gbps, **kw))
                done += 1
                print(f"\r{done}/{total} runs", end="", file=sys.stderr, flush=True)
        pl = [k for k in runs if k.startswith("prefix-load")]
        ref = a.reference or min(pl, key=lambda k: statistics.fmean(r["jct_mean_s"] for r in runs[k]))
        doc["by_nodes"][str(n)] = {"reference": ref, "routers": compare(runs, ref), "runs": runs}
    print(file=sys.stderr)
    if a.json:
        json.dump(doc, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        show(doc)
    return 0


def show(doc: dict) -> None:
    from kvtier.util.console import fit_table, make_console
    con = make_console()
    for n, d in doc["by_nodes"].items():
        rows = []
        for name, row in d["routers"].items():
            cells = [name]
            for k, scale, unit in (("jct_mean_s", 1, ""), ("jct_p99_s", 1, ""), ("prefix_hit_rate", 100, "")):
                cells.append(f"{row[k]['mean'] * scale:.2f} ± {row[k]['se'] * scale:.2f}")
                dk = row.get(f"diff_{k}")
                cells.append("(reference)" if dk is None else
                             f"{dk['mean'] * scale:+.2f} ± {dk['se'] * scale:.2f} {dk['verdict'].replace('reference ', 'ref ')}")
            rows.append(cells)
        cols = [("router", "left"), ("JCT mean s", "right"), ("vs ref", "right"), ("JCT p99 s", "right"),
                ("vs ref", "right"), ("hit %", "right"), ("vs ref", "right")]
        t, _ = fit_table(con, cols, rows, title=f"{n} nodes, {doc['seeds']} runs, reference {d['reference']}")
        con.print(t)


if __name__ == "__main__":
    raise SystemExit(main())
