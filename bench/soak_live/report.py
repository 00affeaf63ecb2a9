"""The soak's readable output: one table per fault kind, the totals, each engine life's growth, and
a PNG of resume TTFT and the engine's RSS, fds and threads over time with every fault's window
marked (matplotlib, Agg).  Pure functions of :func:`run_soak`'s
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
    lines += growth_lines(doc.get("growth"))
    keep = ("load_failures", "contained_errors", "hint_rejections", "lookups", "lookup_hits", "remote_")
    tot = {k: v for k, v in doc["kvtier_totals"].items() if any(x in k for x in keep)}
    if tot:
        lines.append("kvtier counters (summed over engine lives): "
                     + ", ".join(f"{k.replace('kvtier_', '')} {v:g}" for k, v in sorted(tot.items())))
    return "\n".join(lines)


def growth_lines(growth: Mapping[str, Any] | None) -> list[str]:
    """One line per engine life judged by :func:`kvtier.bench.soak_live.growth.judge`, then the
    verdict."""
    if not growth:
        return []
    lim = growth["limits"]
    out = [f"engine lives, after their first {lim['settle_s']:g} s (RSS MiB / fds / threads, settled start -> end; "
           "peak RSS; RSS slope over the life's last half):"]
    for life in growth["lives"]:
        span = f"  pid {life['pid']} t+{life['from_s']:.0f}..{life['to_s']:.0f} s"
        if not life["judged"]:
            out.append(f"{span}: too short to judge ({life['samples']} samples)")
            continue
        a, b = life["start"], life["end"]
        out.append(f"{span}: {a['rss_mib']:.0f}/{a['fds']:g}/{a['threads']:g} -> {b['rss_mib']:.0f}/{b['fds']:g}/"
                   f"{b['threads']:g}; peak {life['peak_rss_mib']:.0f} MiB; {life['rss_slope_last_half']:+.1f} MiB/min")
    out.append("growth: " + ("; ".join(growth["unbounded"]) if growth["unbounded"] else
                             f"bounded (each life's second half within +{lim['fds']} fds and "
                             f"+{lim['threads']} threads of its first half's most, RSS within "
                             f"{lim['rss_ratio']:g}x of its settled start)"))
    return out


def plot_resume_ttft(doc: Mapping[str, Any], path: Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax, ax_rss, ax_n) = plt.subplots(3, 1, figsize=(10, 8.4), sharex=True,
                                           gridspec_kw={"height_ratios": [2.2, 1, 1]})
    pts = doc["resume_ttft"]
    ax.scatter([p[0] for p in pts], [p[1] * 1000 for p in pts], s=6, label="resume TTFT")
    tab20 = plt.get_cmap("tab20")

    def colors(i: int):
        return tab20((2 * i) % 20 + (2 * i) // 20)       # every hue's dark shade, then the light ones
    kinds = sorted({e["kind"] for e in doc["faults"]})
    for e in doc["faults"]:
        c = colors(kinds.index(e["kind"]))
        end = e["recover_at_s"] + (e["recovery_s"] or 0.0)
        for a in (ax, ax_rss, ax_n):
            a.axvspan(e["at_s"], end, color=c, alpha=0.25, lw=0)
    for k in kinds:
        ax.plot([], [], color=colors(kinds.index(k)), lw=6, alpha=0.4, label=k)
    ax.set_yscale("log")
    ax.set_ylabel("resume TTFT (ms, log)")
    ax.set_title(f"kvtier soak, seed {doc['options']['seed']}: resume TTFT with faults (inject to service back)")
    ax.legend(fontsize=7, loc="upper right", ncol=2)
    from kvtier.bench.soak_live.growth import lives
    for i, life in enumerate(lives(doc["series"])):
        t = [r["t_s"] for r in life]
        ax_rss.plot(t, [r["rss_mib"] for r in life], color="C0", label="engine RSS" if i == 0 else None)
        ax_n.plot(t, [r["fds"] for r in life], color="C1", label="open fds" if i == 0 else None)
        ax_n.plot(t, [r["threads"] for r in life], color="C2", label="threads" if i == 0 else None)
    ax_rss.set_ylabel("RSS (MiB)")
    ax_rss.set_ylim(bottom=0)
    ax_n.set_ylabel("count")
    ax_n.set_xlabel("seconds since the agents started (a gap: the engine was down)")
    for a in (ax_rss, ax_n):
        a.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
