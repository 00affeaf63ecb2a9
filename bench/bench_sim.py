"""Simulator speed benchmark: how long N synthetic agent sessions take per policy, on one core.

    python -m kvtier.bench.bench_sim --sessions 10000 [--policies breakeven,retain] [--json]

Prints wall seconds per policy (trace generation excluded), events handled
and events per second.  A benchmark, not a test: numbers vary with the machine.
"""
from __future__ import annotations

import argparse
import json
import sys
import time


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kvtier.bench.bench_sim", description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=10_000)
    ap.add_argument("--rate", type=float, default=1.0, help="session arrivals per second")
    ap.add_argument("--policies", default="breakeven,oracle,retain,offload_host")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    from kvtier.bench.sim.runner import default_node, run_policies
    from kvtier.bench.sim.synth import SynthConfig, synthesize
    t0 = time.perf_counter()
    sessions = synthesize(SynthConfig(sessions=a.sessions, rate_per_s=a.rate, seed=a.seed))
    gen_s = time.perf_counter() - t0
    rounds = sum(len(s.rounds) for s in sessions)
    node = default_node()
    rows = {}
    for name in [p.strip() for p in a.policies.split(",") if p.strip()]:
        t = time.perf_counter()
        r = run_policies(sessions, node, [name])[name]
        wall = time.perf_counter() - t
        rows[name] = {"wall_s": wall, "events": r.metrics["events"], "events_per_s": r.metrics["events"] / wall,
                      "jct_mean_s": r.metrics["jct_mean_s"], "sessions_done": r.metrics["sessions_done"]}
    doc = {"sessions": a.sessions, "rounds": rounds, "generate_s": gen_s, "policies": rows}
    if a.json:
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    print(f"{a.sessions} sessions, {rounds} rounds (generated in {gen_s:.2f} s)")
    for n, r in rows.items():
        print(f"  {n:14s} {r['wall_s']:7.2f} s  {r['events']:>9d} events  {r['events_per_s']:>9.0f} events/s  "
              f"mean JCT {r['jct_mean_s']:.1f} s  done {r['sessions_done']}/{a.sessions}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
