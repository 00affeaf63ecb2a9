"""The soak's readable output: one table per fault kind, the totals, and a PNG of resume TTFT over
time with every fault's window marked (matplotlib, Agg).  Pure functions of :func:`run_soak`'s
document."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping


def by_kind(doc: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Per fault kind: times injected, times it could not be injected, recoveries (s), never
    recovered (recovery_s: from recover to service back; outage_s: from inject), agent requests that failed and resumes served from its inject to service back."""
    out: dict[str, dict[str, Any]] = {}
    for e in doc["faults"]:
        row = out.setdefault(e["kind"], {"injected": 0, "errors": 0, "recovery_s": [], "outage_s": [],
                                         "never_recovered": 0})
        row["injected"] += 1
        row["errors"] += "error" in e
        if e["recovery_s"] is None:
            row["never_recovered"] += 1
        else:
            row["recovery_s"].append(e["recovery_s"])
            row["outage_s"].append(round(e["recover_at_s"] + e["recovery_s"] - e["at_s"], 1))
    for _, _, kind in doc["resume_ttft"]:
        if kind:
            out[kind]["resumes_served"] = out[kind].get("resumes_served", 0) + 1
    for f in doc["failures"]:
        if f["during"]:
            out[f["during"]].setdefault("failed_requests", 0)
            out[f["during"]]["failed_requests"] += 1
    return out


def table(doc: Mapping[str, Any]) -> str:
    lines = [f"{'fault':<16} {'n':>3} {'not done':>8} {'recover->back s mean/max':>25} {'inject to back s':>16} {'never back':>10} "
             f"{'failed reqs':>11} {'resumes served':>14}"]
    for kind, r in by_kind(doc).items():
        rec = r["recovery_s"]
        recs = f"{sum(rec) / len(rec):.2f} / {max(rec):.2f}" if rec else "-"
        out_s = f"{max(r['outage_s']):.1f}" if r["outage_s"] else "-"
        lines.append(f"{kind:<16} {r['injected']:>3} {r['errors']:>8} {recs:>25} {out_s:>16} {r['never_recovered']:>10} "
                     f"{r.get('failed_requests', 0):>11} {r.get('resumes_served', 0):>14}")
    s = doc["series"]
    first, last = (s[0], s[-1]) if s else ({}, {})
    lines += ["",
              f"{doc['turns']} turns ({doc['resumes']} resumes) in {doc['wall_s']:.0f} s: "
              f"{doc['wrong_outputs']} wrong outputs, {doc['failed_requests']} failed requests "
              f"(+{doc['failed_at_engine_stop']} at an engine stop; {doc['failed_turns']} turns retried), {len(doc['crashes'])} engine crashes "
              f"caused by kvtier, {len(doc['never_recovered'])} faults never recovered",
              "engine RSS MiB / fds / threads, first and last sample: "
              f"{first.get('rss_mib', 0):.0f}/{first.get('fds', 0)}/{first.get('threads', 0)} -> "
              f"{last.get('rss_mib', 0):.0f}/{last.get('fds', 0)}/{last.get('threads', 0)}"]
    keep = ("load_failures", "contained_errors", "hint_rejections", "lookups", "lookup_hits", "remote_")
    tot = {k: v for k, v in doc["kvtier_totals"].items() if any(x in k for x in keep)}
    if tot:
        lines.append("kvtier counters (summed over engine lives): "
                     + ", ".join(f"{k.replace('kvtier_', '')} {v:g}" for k, v in sorted(tot.items())))
    return "\n".join(lines)


def plot_resume_ttft(doc: Mapping[str, Any], path: Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(10, 4.8))
    pts = doc["resume_ttft"]
    ax.scatter([p[0] for p in pts], [p[1] * 1000 for p in pts], s=6, label="resume TTFT")
    colors = plt.get_cmap("tab10")
    kinds = sorted({e["kind"] for e in doc["faults"]})
    for e in doc["faults"]:
        c = colors(kinds.index(e["kind"]) % 10)
        end = e["recover_at_s"] + (e["recovery_s"] or 0.0)
        ax.axvspan(e["at_s"], end, color=c, alpha=0.25, lw=0)
    for k in kinds:
        ax.plot([], [], color=colors(kinds.index(k) % 10), lw=6, alpha=0.4, label=k)
    ax.set_yscale("log")
    ax.set_xlabel("seconds since the agents started")
    ax.set_ylabel("resume TTFT (ms, log)")
    ax.set_title(f"kvtier soak, seed {doc['options']['seed']}: resume TTFT with faults (inject to service back)")
    ax.legend(fontsize=7, loc="upper right", ncol=2)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
