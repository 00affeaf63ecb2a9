"""A link-speed sweep: the same trace and policies on the same node at several host-link speeds.

``kvtier bench simulate ... --sweep-link 12.5,25,50,100,512`` runs every policy once per
speed (both directions of the host link set to it) and reports, per speed, each policy's
mean JCT and p99 resume stall and the run's envelope (:func:`kvtier.bench.sim.bound.envelope`:
the best value any policy reached, per metric), plus each policy's ratio to it.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable, Mapping, Sequence

from kvtier.bench.sim.bound import envelope
from kvtier.bench.sim.node import NodeConfig
from kvtier.bench.sim.trace import Session

GB = 1e9
STALL_FLOOR_S = 1e-3      # p99 stalls are compared as (stall + 1 ms) / (bound + 1 ms)
SWEEP_METRICS = ("jct_mean_s", "jct_p99_s", "resume_stall_p99_s", "throughput_tokens_per_s")


def parse_speeds(text: str) -> tuple[float, ...]:
    """``"12.5,25,50"`` -> (12.5, 25.0, 50.0).  Raises ValueError for an empty list, a repeat,
    or a speed that is not a positive finite number."""
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        v = float(part)
        if not (v > 0 and v < float("inf")):
            raise ValueError(f"link speed {part!r} is not a positive number of GB/s")
        out.append(v)
    if not out:
        raise ValueError("no link speed given")
    if len(set(out)) != len(out):
        raise ValueError("a link speed repeats")
    return tuple(out)


def with_link(node: NodeConfig, gbps: float) -> NodeConfig:
    """``node`` with both directions of its host link at ``gbps`` GB/s."""
    hw = replace(node.hardware, link_h2d_bps=gbps * GB, link_d2h_bps=gbps * GB)
    return replace(node, hardware=hw)


def run_sweep(sessions: Sequence[Session], node: NodeConfig, names: Sequence[str], speeds: Sequence[float], *,
              run: Callable[..., Mapping], options: Mapping | None = None,
              on_speed: Callable[[float, int, int], None] | None = None) -> dict:
    """Run ``run(sessions, node, names, options=...) -> {name: SimResult}`` once per speed.

    Returns the JSON-ready sweep document (speeds, per-policy series, bound series,
    ratios to the bound).  Raises what ``run`` raises (ValueError, SimulationStalled)."""
    pols: dict[str, dict[str, list]] = {n: {k: [] for k in SWEEP_METRICS} for n in names}
    bound: dict[str, list] = {k: [] for k in SWEEP_METRICS}
    for i, s in enumerate(speeds):
        if on_speed is not None:
            on_speed(s, i, len(speeds))
        res = run(sessions, with_link(node, s), names, options=options)
        metrics = {n: r.metrics for n, r in res.items()}
        env = envelope(metrics)
        for n in names:
            for k in SWEEP_METRICS:
                pols[n][k].append(metrics[n][k])
        for k in SWEEP_METRICS:
            bound[k].append(env[k])
    ratios = {n: {"jct_mean": [v / b for v, b in zip(pols[n]["jct_mean_s"], bound["jct_mean_s"])],
                  "stall_p99": [(v + STALL_FLOOR_S) / (b + STALL_FLOOR_S)
                                for v, b in zip(pols[n]["resume_stall_p99_s"], bound["resume_stall_p99_s"])]}
              for n in names}
    return {"link_gbps": list(speeds), "policies": pols, "bound": bound, "vs_bound": ratios,
            "bound_is": "per speed and metric, the best value any simulated policy reached (bench/sim/bound.py)"}
