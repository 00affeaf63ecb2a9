"""PNG plots of simulation results (matplotlib, Agg backend).  Imported only when ``--plots`` is given."""
from __future__ import annotations

from pathlib import Path
from typing import Mapping

from kvtier.bench.sim.simulator import SimResult


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _save(plt, fig, path: Path) -> Path:
    """Lay out, write ``path`` as PNG and free the figure."""
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_all(results: Mapping[str, SimResult], out_dir: str | Path, *, ceiling: float,
             title: str = "") -> list[str]:
    """Write occupancy.png, stall_cdf.png and vs_oracle.png into ``out_dir`` (created).  Returns paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return [str(plot_occupancy(results, out / "occupancy.png", ceiling=ceiling, title=title)),
            str(plot_stall_cdf(results, out / "stall_cdf.png", title=title)),
            str(plot_vs_oracle(results, out / "vs_oracle.png", title=title))]


def plot_occupancy(results: Mapping[str, SimResult], path: Path, *, ceiling: float, title: str = "") -> Path:
    """HBM KV-pool utilisation over time, one line per policy, with the admission ceiling."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(10, 4.8))
    for name, r in results.items():
        if not r.occupancy:
            continue
        t, u = zip(*r.occupancy)
        ax.step(t, [100 * x for x in u], where="post", label=name, linewidth=1.1)
    ax.axhline(100 * ceiling, color="black", linestyle="--", linewidth=1, label=f"admission ceiling {ceiling:.0%}")
    ax.axhline(100, color="red", linestyle=":", linewidth=1, label="physical limit")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("HBM KV pool occupancy (%)")
    ax.set_ylim(0, 105)
    ax.set_title(f"HBM occupancy over time{(' - ' + title) if title else ''}")
    ax.legend(fontsize=8, ncol=3, loc="lower right")
    return _save(plt, fig, path)


def plot_stall_cdf(results: Mapping[str, SimResult], path: Path, title: str = "") -> Path:
    """Empirical CDF of resume stalls per policy (log x; stalls under 1 ms drawn at 1 ms)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4.8))
    for name, r in results.items():
        xs = sorted(max(1e-3, s) for s in r.stalls)
        if not xs:
            continue
        n = len(xs)
        ax.step(xs, [(i + 1) / n for i in range(n)], where="post", label=name, linewidth=1.1)
    ax.set_xscale("log")
    ax.set_xlabel("resume stall (s, 1 ms floor)")
    ax.set_ylabel("fraction of resumed rounds")
    ax.set_title(f"Resume stall CDF{(' - ' + title) if title else ''}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    return _save(plt, fig, path)


def plot_vs_oracle(results: Mapping[str, SimResult], path: Path, title: str = "") -> Path:
    """Each policy's mean JCT, p99 JCT and throughput relative to the oracle (1.0 = oracle)."""
    plt = _plt()
    ref = results.get("oracle") or next(iter(results.values()))
    rm = ref.metrics
    names = list(results)
    series = {
        "mean JCT / oracle": [results[n].metrics["jct_mean_s"] / max(rm["jct_mean_s"], 1e-12) for n in names],
        "p99 JCT / oracle": [results[n].metrics["jct_p99_s"] / max(rm["jct_p99_s"], 1e-12) for n in names],
        "oracle throughput / throughput": [rm["throughput_tokens_per_s"] / max(results[n].metrics["throughput_tokens_per_s"], 1e-12)
                                           for n in names],
    }
    fig, ax = plt.subplots(figsize=(10, 4.8))
    w = 0.8 / len(series)
    for i, (label, vals) in enumerate(series.items()):
        ax.bar([j + (i - (len(series) - 1) / 2) * w for j in range(len(names))], vals, width=w, label=label)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=20)
    ax.set_ylabel(f"relative to {ref.policy} (lower is better)")
    ax.set_title(f"Cost relative to the oracle{(' - ' + title) if title else ''}")
    ax.legend(fontsize=8)
    return _save(plt, fig, path)


def plot_sweep(sweep: Mapping, path: str | Path, title: str = "", jct_clip: float = 1.3) -> Path:
    """Mean JCT and p99 resume stall relative to the bound, per policy, across link speeds
    (``sweep`` as :func:`kvtier.bench.sim.sweep.run_sweep` returns it).  The JCT panel is
    clipped at ``jct_clip`` (policies above it are named in its title)."""
    plt = _plt()
    from matplotlib.ticker import NullFormatter, NullLocator
    speeds = sweep["link_gbps"]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.4))
    off = []
    for name, r in sweep["vs_bound"].items():
        if min(r["jct_mean"]) > jct_clip:
            off.append(name)
        else:
            a1.plot(speeds, [min(v, jct_clip) for v in r["jct_mean"]], marker="o", linewidth=1.2, label=name)
        a2.plot(speeds, r["stall_p99"], marker="o", linewidth=1.2, label=name)
    a2.set_yscale("log")
    for ax, what in ((a1, "mean JCT / bound"), (a2, "(p99 stall + 1 ms) / (bound + 1 ms)")):
        ax.set_xscale("log")
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xticks(speeds)
        ax.set_xticklabels([f"{s:g}" for s in speeds])
        ax.set_xlabel("host link, GB/s each way")
        ax.set_ylabel(what)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.grid(True, which="both", alpha=0.3)
    a1.axhline(1.05, color="grey", linestyle="--", linewidth=0.8, label="bound + 5%")
    a1.set_ylim(0.99, jct_clip)
    return _finish_pair(plt, fig, (a1, a2), "mean JCT / bound" + (f" (off the chart: {', '.join(off)})" if off else ""),
                        "p99 resume stall relative to the bound", title, path)


def _finish_pair(plt, fig, axes, jct_title: str, stall_title: str, title: str, path: str | Path) -> Path:
    """Titles and legends of a JCT / p99-stall panel pair, then :func:`_save`."""
    a1, a2 = axes
    a1.set_title(jct_title, fontsize=9)
    a2.set_title(stall_title, fontsize=9)
    a1.legend(fontsize=8)
    a2.legend(fontsize=8, ncol=2)
    if title:
        fig.suptitle(title, fontsize=10)
    return _save(plt, fig, Path(path))


def plot_seeds(doc: Mapping, path: str | Path, title: str = "") -> Path:
    """Per seed of a seed set (``doc`` as :func:`kvtier.bench.sim.seeds_cli.run` returns it): each
    policy's mean JCT over that seed's bound, minus 1, in %, and its p99 resume stall.  Both axes
    are symmetric-log (linear near 0), so a policy at the bound, or with no stall, sits on 0.
    A jitter ensemble's document (``"jitter"`` in it) is drawn the same way, per run."""
    from kvtier.bench.sim.seeds import seed_bounds
    plt = _plt()
    per_seed = doc["per_seed"]
    seeds = list(per_seed)
    names = list(per_seed[seeds[0]])
    bounds = seed_bounds(per_seed)
    unit = "run" if "jitter" in doc else "seed"
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.4))
    x = range(len(seeds))
    for name in names:
        gap = [100.0 * (per_seed[s][name]["jct_mean_s"] / bounds[s] - 1.0) for s in seeds]
        a1.plot(x, gap, marker="o", markersize=3, linewidth=1.0, label=name)
        a2.plot(x, [per_seed[s][name]["resume_stall_p99_s"] for s in seeds], marker="o", markersize=3,
                linewidth=1.0, label=name)
    a1.set_yscale("symlog", linthresh=1e-3)
    a2.set_yscale("symlog", linthresh=1e-3)
    for ax, what in ((a1, f"mean JCT over the {unit}'s bound, % above"), (a2, "p99 resume stall, s")):
        ax.set_xticks(list(x))
        ax.set_xticklabels(seeds, fontsize=7)
        ax.set_xlabel(unit + (" (0: the draw itself)" if unit == "run" else ""))
        ax.set_ylabel(what)
        ax.grid(True, which="both", alpha=0.3)
    return _finish_pair(plt, fig, (a1, a2), f"mean JCT above the {unit}'s bound (the best any policy reached)",
                        "p99 resume stall", title, path)
