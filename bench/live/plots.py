"""PNG plots of a live benchmark (matplotlib, Agg): the resume-TTFT CDF per
configuration (every repeat's resumes pooled), and the host-tier sweep
(resume TTFT p50/p99 and mean JCT against host size, mean +- 2 SE)."""
from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

from kvtier.bench.live.runs import RunSummary


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot_ttft_cdf(runs: Mapping[str, Sequence[RunSummary]], path: Path, *, title: str = "") -> Path:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4.8))
    for name, rs in runs.items():
        xs = sorted(x for r in rs for x in r.resume_ttft_s)
        if xs:
            ax.step([x * 1000 for x in xs], [(i + 1) / len(xs) for i in range(len(xs))], where="post",
                    label=name, lw=2.0 if name == "breakeven" else 1.2)
    ax.set_xscale("log")
    ax.set_xlabel("resume TTFT (ms, log)")
    ax.set_ylabel("fraction of resumes")
    ax.set_title(title or "resume TTFT, every repeat pooled")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_host_sweep(sweep: Sequence[dict], path: Path, *, title: str = "") -> Path:
    plt = _plt()
    metrics = (("resume_ttft_p50_s", "resume TTFT p50 (ms)"), ("resume_ttft_p99_s", "resume TTFT p99 (ms)"),
               ("jct_mean_s", "mean JCT (s)"))
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.2))
    names = sorted({n for cell in sweep for n in cell["configs"]})
    mb = [cell["host_bytes"] / 2**20 for cell in sweep]
    for ax, (k, label) in zip(axes, metrics):
        scale = 1.0 if k == "jct_mean_s" else 1000.0
        for n in names:
            ys = [cell["configs"][n][k] * scale for cell in sweep]
            es = [2 * (cell["configs"][n][k + "_se"] or 0) * scale for cell in sweep]
            ax.errorbar(mb, ys, yerr=es, marker="o", capsize=3, label=n)
        ax.set_xscale("log")
        ax.minorticks_off()
        ax.set_xticks(mb, [f"{x:.3g}" for x in mb])
        ax.set_xlabel("kvtier host tier (MiB, log)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(title or "host-tier sweep (mean +- 2 SE over repeats)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
