"""What a prefix hit on each medium saves, as a fraction of prefilling the same tokens.

A block the engine holds in HBM saves its whole prefill (weight 1).  A block it must first load
saves the prefill less the load, priced by kvtier's cost model (:mod:`kvtier.tiering.model.costmodel`)
per token of the model's KV (``m_token`` bytes)::

    t_prefill = 2 * P / prefill_flops                          (t_recompute of one token)
    host      : t = m_token / link_h2d
    NVMe      : t = m_token / nvme_read + m_token / link_h2d    (read, then over the link)
    remote    : t = m_token / remote + m_token / link_h2d       (the NIC, then over the link)
    weight    = max(0, 1 - t / t_prefill)

A load slower than the prefill saves nothing (weight 0: the router ignores the hit; it never
counts against the engine).  The linear prefill term is the conservative one: attention's
quadratic term makes long prefills dearer and every weight higher.

Media are vLLM's event strings, case-insensitive: ``GPU`` -> HBM; ``CPU`` -> host;
``STORAGE``, ``DISK``, ``NVME`` -> NVMe; ``REMOTE``, or any medium with locality ``REMOTE``
(a shared or peer tier) -> remote.  Any other medium gets ``unknown`` (default: the smallest
of the three offloaded weights).  ``overrides`` (medium -> weight) win over all of these.
Immutable (thread-safe).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping

from kvtier.tiering.model.costmodel import GB, HardwareProfile, ModelGeometry, t_recompute

DEFAULT_REMOTE_GBPS = 25.0      # one 200 Gb/s NIC, the simulator's remote-tier example
_HBM = frozenset({"GPU"})
_HOST = frozenset({"CPU"})
_NVME = frozenset({"STORAGE", "DISK", "NVME"})
_REMOTE = frozenset({"REMOTE"})


def _check(name: str, w: float) -> float:
    if not (isinstance(w, (int, float)) and math.isfinite(w) and 0.0 <= w <= 1.0):
        raise ValueError(f"the weight of {name} must be in [0, 1], got {w!r}")
    return float(w)


@dataclass(frozen=True)
class TierWeights:
    """Per-medium weights in [0, 1].  Raises ValueError for a weight outside [0, 1]."""

    host: float = 1.0
    nvme: float = 1.0
    remote: float = 1.0
    unknown: float | None = None
    overrides: Mapping[str, float] = field(default_factory=dict)
    basis: str = "flat"

    def __post_init__(self) -> None:
        for name in ("host", "nvme", "remote"):
            _check(name, getattr(self, name))
        if self.unknown is None:
            object.__setattr__(self, "unknown", min(self.host, self.nvme, self.remote))
        _check("unknown media", self.unknown)
        object.__setattr__(self, "overrides",
                           {str(k).upper(): _check(f"medium {k!r}", v) for k, v in self.overrides.items()})

    @classmethod
    def priced(cls, geom: ModelGeometry, hw: HardwareProfile, *, remote_gbps: float = DEFAULT_REMOTE_GBPS,
               overrides: Mapping[str, float] | None = None) -> "TierWeights":
        """The weights of ``geom`` served on ``hw``.  Raises ValueError for remote_gbps <= 0."""
        if not (math.isfinite(remote_gbps) and remote_gbps > 0):
            raise ValueError(f"remote_gbps must be a positive number, got {remote_gbps!r}")
        m = geom.token_bytes
        prefill = t_recompute(geom, 1, hw)
        link = m / hw.link_h2d_bps

        def saved(t: float) -> float:
            return max(0.0, 1.0 - t / prefill)
        return cls(host=saved(link), nvme=saved(m / hw.nvme_read_bps + link),
                   remote=saved(m / (remote_gbps * GB) + link), overrides=dict(overrides or {}),
                   basis=f"{geom.name} on {_node_label(hw)}, remote {remote_gbps:g} GB/s")

    def weight(self, medium: str | None, locality: str | None = None) -> float:
        """What a hit on ``medium`` (None: vLLM's GPU) saves.  Pure."""
        m = (medium or "GPU").upper()
        if m in self.overrides:
            return self.overrides[m]
        if (locality or "").upper() == "REMOTE" or m in _REMOTE:
            return self.remote
        if m in _HBM:
            return 1.0
        if m in _HOST:
            return self.host
        if m in _NVME:
            return self.nvme
        return self.unknown

    def table(self) -> dict[str, float]:
        """The weights by name, for printing."""
        return {"GPU": 1.0, "CPU": self.host, "STORAGE/DISK": self.nvme, "REMOTE": self.remote,
                "other": self.unknown, **self.overrides}


def _node_label(hw: HardwareProfile) -> str:
    from kvtier.tiering.model.presets import NODES
    return next((name for name, p in NODES.items() if p == hw), "a custom node")
