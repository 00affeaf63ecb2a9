"""Run a trace through several policies on one node and collect the DESIGN.md metrics."""
from __future__ import annotations

from dataclasses import replace
from typing import Callable, Mapping, Sequence

from kvtier.tiering.model.costmodel import HardwareProfile

from kvtier.bench.sim.simulator import NodeConfig, SimResult, Simulator
from kvtier.bench.sim.trace import Session

DEFAULT_POLICIES: tuple[str, ...] = ("breakeven", "oracle", "retain", "recompute", "offload_host",
                                     "lru", "ttl", "min_waste", "eager", "point")
DEFAULT_MODEL = "gqa-70b"
REQUIRED_METRICS = ("jct_mean_s", "jct_p99_s", "resume_stall_p50_s", "resume_stall_p99_s",
                    "throughput_tokens_per_s", "recomputed_tokens", "hbm_idle_gb_s")


def default_node(model: str = DEFAULT_MODEL, node: str | None = None, **overrides) -> NodeConfig:
    """The texts' 70B GQA model on their eight-accelerator node (weights at 2 bytes/param).

    ``overrides`` go to :class:`HardwareProfile` fields (``hbm_bytes``, ...)
    or :class:`NodeConfig` fields (``chunk_tokens``, ...).  Raises ValueError
    for an unknown preset or field.
    """
    from kvtier.tiering.model.presets import DEFAULT_NODE, get_node, get_preset
    geom = get_preset(model)
    hw = get_node(node or DEFAULT_NODE)
    if hw.weights_bytes == 0:
        hw = replace(hw, weights_bytes=geom.weights_bytes(2.0))
    hw_fields = set(HardwareProfile.__dataclass_fields__)
    node_fields = set(NodeConfig.__dataclass_fields__) - {"geometry", "hardware"}
    bad = set(overrides) - hw_fields - node_fields
    if bad:
        raise ValueError(f"unknown node option(s) {sorted(bad)}")
    hw = replace(hw, **{k: v for k, v in overrides.items() if k in hw_fields})
    return NodeConfig(geometry=geom, hardware=hw, **{k: v for k, v in overrides.items() if k in node_fields})


def run_policies(sessions: Sequence[Session], node: NodeConfig, names: Sequence[str] = DEFAULT_POLICIES, *,
                 options: Mapping[str, Mapping] | None = None,
                 on_policy: Callable[[str, int, int], None] | None = None,
                 progress: Callable[[str, int, int], None] | None = None,
                 record_rounds: bool = False, check_every: int = 0) -> dict[str, SimResult]:
    """Replay ``sessions`` once per policy (each gets a fresh policy and predictor).

    ``on_policy(name, i, n)`` is called before each run, ``progress(name,
    done, total)`` during it.  Raises ValueError for an unknown policy name.
    """
    from kvtier.bench.sim.variants import make_sim_policy
    g, hw = node.geometry, node.hardware
    policies = {n: make_sim_policy(n, geometry=g, hardware=hw, **dict((options or {}).get(n, {})))
                for n in names}                       # fail fast on a bad name
    out: dict[str, SimResult] = {}
    for i, (n, pol) in enumerate(policies.items()):
        if on_policy is not None:
            on_policy(n, i, len(policies))
        cb = (lambda d, t, _n=n: progress(_n, d, t)) if progress is not None else None
        sim = Simulator(sessions, node, pol, name=n, reveal_true_wait=(n == "oracle"), progress=cb,
                        record_rounds=record_rounds, check_every=check_every)
        out[n] = sim.run()
    return out

