"""Whether the engine's RSS, open fds and threads stay bounded over a soak.

The sampler's rows (``t_s``, ``pid``, ``rss_mib``, ``fds``, ``threads``) are split into engine
lives (consecutive rows of one engine pid; a restart begins a new life).  A life's first
``settle_s`` seconds (start-up, caches filling) are not judged.  After them:

* **fds and threads** must stop growing: the most a life's second settled half reaches, minus
  the most its first half reached, above ``fds`` / ``threads`` is a leak (a count that climbs
  while caches fill, threads start lazily or a fault's helpers run, and then holds, passes);
* **RSS** must stay below ``rss_ratio`` times its settled start at every sample.

    judge(doc["series"])["unbounded"]   # -> [] when bounded, else one line per breach

Pure functions of the rows.
"""
from __future__ import annotations

from dataclasses import dataclass
from statistics import median
from typing import Any, Mapping, Sequence


@dataclass(frozen=True)
class Limits:
    settle_s: float = 20.0
    fds: int = 32
    threads: int = 16
    rss_ratio: float = 1.5
    min_samples: int = 4          # settled samples a life needs to be judged


def lives(series: Sequence[Mapping[str, Any]]) -> list[list[Mapping[str, Any]]]:
    """Consecutive rows of one engine pid (rows without one, the engine down, end a life)."""
    out: list[list[Mapping[str, Any]]] = []
    last = None
    for row in series:
        pid = row.get("pid")
        if pid is None:
            last = None
            continue
        if pid != last:
            out.append([])
            last = pid
        out[-1].append(row)
    return out


def _slope_per_min(rows: Sequence[Mapping[str, Any]]) -> float:
    """Least-squares slope of RSS (MiB per minute) over ``rows``; 0 for fewer than two."""
    if len(rows) < 2:
        return 0.0
    ts = [r["t_s"] for r in rows]
    ys = [r["rss_mib"] for r in rows]
    mt, my = sum(ts) / len(ts), sum(ys) / len(ys)
    var = sum((t - mt) ** 2 for t in ts)
    return 0.0 if var == 0 else 60.0 * sum((t - mt) * (y - my) for t, y in zip(ts, ys)) / var


def judge(series: Sequence[Mapping[str, Any]], limits: Limits = Limits()) -> dict[str, Any]:
    """Per life: its span, settled start and end (RSS MiB, fds, threads), peak RSS, and the RSS
    slope over its last half (MiB/min); ``unbounded``: one line per breach of ``limits``."""
    report: list[dict[str, Any]] = []
    unbounded: list[str] = []
    for life in lives(series):
        t0 = life[0]["t_s"]
        settled = [r for r in life if r["t_s"] - t0 >= limits.settle_s]
        row: dict[str, Any] = {"pid": life[0]["pid"], "from_s": t0, "to_s": life[-1]["t_s"],
                               "samples": len(life), "judged": len(settled) >= limits.min_samples}
        if row["judged"]:
            head, tail = settled[:3], settled[-3:]
            first, second = settled[:len(settled) // 2], settled[len(settled) // 2:]
            start = {k: median(r[k] for r in head) for k in ("rss_mib", "fds", "threads")}
            end = {k: median(r[k] for r in tail) for k in ("rss_mib", "fds", "threads")}
            peak = max(r["rss_mib"] for r in settled)
            halves = {k: (max(r[k] for r in first), max(r[k] for r in second)) for k in ("fds", "threads")}
            row.update(start=start, end=end, peak_rss_mib=peak, halves_max=halves,
                       rss_slope_last_half=round(_slope_per_min(second), 2))
            where = f"engine pid {row['pid']} (t+{t0:.0f}..{row['to_s']:.0f} s)"
            for k, lim in (("fds", limits.fds), ("threads", limits.threads)):
                a, b = halves[k]
                if b - a > lim:
                    unbounded.append(f"{where}: {k} reached {a:g} in the first settled half, {b:g} in the "
                                     f"second (more than +{lim})")
            if peak > limits.rss_ratio * start["rss_mib"]:
                unbounded.append(f"{where}: RSS {start['rss_mib']:.0f} -> {peak:.0f} MiB "
                                 f"(more than {limits.rss_ratio:g}x)")
        report.append(row)
    return {"limits": {"settle_s": limits.settle_s, "fds": limits.fds, "threads": limits.threads,
                       "rss_ratio": limits.rss_ratio},
            "lives": report, "unbounded": unbounded}
