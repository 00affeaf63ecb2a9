"""The cluster table: ``kvtier bench simulate`` over a grid of node counts and remote tiers.

    python -m kvtier.bench.sim.cluster_table --out DIR --source "--trace mc.jsonl" \\
        [--nodes 1,4,16] [--remote-gbps 0,25] [--router least-loaded] \\
        [--policies breakeven,oracle,lru,offload_host] [--extra "--remote-latency-ms 1"] [--json]

Each cell is one in-process ``kvtier bench simulate SOURCE --nodes N
--router R --remote-gbps G --policies P EXTRA --json`` whose document is kept
as ``DIR/<cell>.json`` (an existing one is reused, so an interrupted grid
resumes); the table prints mean JCT / p99 resume stall per policy, the
fraction of resumes that moved, and the exact command of each row.  A
benchmark, not a test: it takes minutes per 16-node row.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import shlex
import sys
from pathlib import Path


def cell_args(source: str, nodes: int, gbps: float, router: str, policies: str, extra: str) -> list[str]:
    return (["bench", "simulate", *shlex.split(source), "--nodes", str(nodes), "--router", router,
             "--remote-gbps", f"{gbps:g}", "--policies", policies, *shlex.split(extra), "--json"])


def run_cell(args: list[str], path: Path) -> dict:
    """The cell's simulate document (from ``path`` if it is there).  Raises RuntimeError when
    the command fails."""
    if path.is_file():
        return json.loads(path.read_text())
    from kvtier.cli.main import main
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(args)
    if rc != 0:
        raise RuntimeError(f"kvtier {' '.join(args)} exited {rc}")
    path.write_text(buf.getvalue())
    return json.loads(buf.getvalue())


def table(rows: list[dict], policies: list[str]) -> str:
    head = "| nodes | remote tier | moved | " + " | ".join(policies) + " |"
    out = [head, "|" + " --- |" * (3 + len(policies))]
    for r in rows:
        pol = r["doc"]["policies"]
        best = min(f"{pol[n]['jct_mean_s']:.2f}" for n in policies)
        moved = pol[policies[0]]["cluster"]["resumes_moved_frac"]
        cells = []
        for n in policies:
            m = pol[n]
            jct = f"{m['jct_mean_s']:.2f}"
            c = f"{jct} / {m['resume_stall_p99_s']:.3f}"
            cells.append(f"**{c}**" if float(jct) == float(best) else c)
        tier = f"{r['gbps']:g} GB/s" if r["gbps"] > 0 else "none"
        out.append(f"| {r['nodes']} | {tier} | {moved:.0%} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kvtier.bench.sim.cluster_table",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="directory for the per-cell JSON documents")
    ap.add_argument("--source", required=True, help='the trace flags, e.g. "--trace mc.jsonl" or '
                                                    '"--synth 2000 --rate 0.6"')
    ap.add_argument("--nodes", default="1,4,16", help="comma-separated node counts (default 1,4,16)")
    ap.add_argument("--remote-gbps", default="0,25", help="comma-separated remote tiers, GB/s (0: none)")
    ap.add_argument("--router", default="least-loaded", help="router (default least-loaded)")
    ap.add_argument("--policies", default="breakeven,oracle,lru,offload_host", help="comma-separated policies")
    ap.add_argument("--extra", default="", help="more simulate flags, quoted")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    policies = [p.strip() for p in a.policies.split(",") if p.strip()]
    rows = []
    for nodes in (int(x) for x in a.nodes.split(",")):
        for gbps in (float(x) for x in a.remote_gbps.split(",")):
            args = cell_args(a.source, nodes, gbps, a.router, ",".join(policies), a.extra)
            slug = re.sub(r"[^A-Za-z0-9.]+", "_", " ".join(args[2:-1])).strip("_")
            doc = run_cell(args, out / f"{slug}.json")
            rows.append({"nodes": nodes, "gbps": gbps, "command": "kvtier " + " ".join(map(shlex.quote, args)),
                         "doc": doc})
            print(f"done: {rows[-1]['command']}", file=sys.stderr)
    if a.json:
        json.dump([{k: v for k, v in r.items() if k != "doc"} | {
            "policies": {n: {k: r["doc"]["policies"][n][k] for k in ("jct_mean_s", "resume_stall_p99_s")}
                         for n in policies}} for r in rows], sys.stdout, indent=2)
        print()
        return 0
    print(f"router {a.router}; each cell: mean JCT s / p99 resume stall s; bold: the best mean JCT of the row "
              f"(ties included); moved: resumes that ran on another node ({policies[0]})\n")
    print(table(rows, policies))
    print()
    for r in rows:
        print(f"- {r['command']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
