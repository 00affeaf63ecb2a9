"""Prefetch baselines that price no distribution: ``eager`` and ``point``.

* :class:`EagerPolicy` (registry ``eager``) -- vLLM's agentic-KV RFC #57103
  argument: offload at the pause and start the way back as soon as the pause
  starts, as room allows.  No forecast at all.  Host DRAM when the copy fits,
  else NVMe staged back to DRAM at once; the reload to the device
  (``prefetch_at_s``) is due at 0, i.e. as soon as the copy-out has landed.
  A holder that finds no room for the reload then reloads on demand at the
  resume; timers due at the same moment fire in pause order, so the oldest
  pause is brought back first.
* :class:`PointPrefetchPolicy` (registry ``point``) -- Tokencake's rule: offload
  during the call and upload at the predicted return, i.e. start the reload at
  the forecast's *mean* minus the reload time (the same online predictor as
  ``breakeven``, but only its mean).  A wait whose mean is shorter than the
  round trip is retained.

Both evict a device-resident pause to host DRAM when the holder needs the room
(as ``lru`` does), longest paused first.  decide() is pure; ``point`` learns
from observe() (one caller, not thread-safe).
"""
from __future__ import annotations

from typing import Mapping

from kvtier.tiering.model.costmodel import HardwareProfile, ModelGeometry, t_nvme_read, t_nvme_write, t_offload, t_reload
from kvtier.tiering.model.decision import Action, Decision, PauseContext, Policy
from kvtier.tiering.forecasting.forecast import Predictor
from kvtier.tiering.forecasting.predictor import ToolWaitPredictor
from kvtier.tiering.policy.pricing import check_context


def _swap_victim(ctx: PauseContext) -> Action:
    return Action.OFFLOAD_HOST if ctx.bytes_to_move <= ctx.host_free_bytes else Action.RECOMPUTE


class EagerPolicy(Policy):
    """Offload at the pause, bring it back at once (module doc).  Raises
    ValueError on an absurd PauseContext."""

    name = "eager"

    def __init__(self, geometry: ModelGeometry, hardware: HardwareProfile,
                 predictor: Predictor | None = None) -> None:
        self.geometry, self.hardware = geometry, hardware

    def decide(self, ctx: PauseContext) -> Decision:
        check_context(ctx)
        move = ctx.bytes_to_move
        if move <= ctx.host_free_bytes:
            return Decision(Action.OFFLOAD_HOST, prefetch_at_s=0.0, reason="eager: host, reload at once")
        if move <= ctx.nvme_free_bytes:
            return Decision(Action.OFFLOAD_NVME, prefetch_at_s=0.0, stage_at_s=0.0,
                            reason="eager: NVMe (host full), stage and reload at once")
        return Decision(Action.RECOMPUTE, reason="eager: host and NVMe tiers full")

    def victim_action(self, ctx: PauseContext) -> Action:
        return _swap_victim(ctx)


class PointPrefetchPolicy(Policy):
    """Tokencake's upload at the predicted return (module doc).  ``predictor``:
    the online per-tool predictor (a fresh :class:`ToolWaitPredictor` by
    default).  Raises ValueError on an absurd PauseContext."""

    name = "point"

    def __init__(self, geometry: ModelGeometry, hardware: HardwareProfile,
                 predictor: Predictor | None = None) -> None:
        self.geometry, self.hardware = geometry, hardware
        self.predictor = predictor if predictor is not None else ToolWaitPredictor()

    def observe(self, tool: str, wait_s: float, features: Mapping[str, str] | None = None) -> None:
        self.predictor.observe(tool, wait_s, features)

    def decide(self, ctx: PauseContext) -> Decision:
        check_context(ctx)
        hw, move, kv = self.hardware, ctx.bytes_to_move, ctx.kv_bytes
        mean = float(self.predictor.forecast(ctx.tool, ctx.features).mean_s)
        t_out, t_back = t_offload(move, hw), t_reload(kv, hw)
        why = f"point: predicted mean {mean:.3g}s"
        if mean <= t_out + t_back:
            return Decision(Action.RETAIN, reason=f"{why} within the round trip")
        if move <= ctx.host_free_bytes:
            return Decision(Action.OFFLOAD_HOST, prefetch_at_s=max(t_out, mean - t_back), reason=why)
        if move <= ctx.nvme_free_bytes:
            landed = t_out + t_nvme_write(move, hw)
            stage = max(landed, mean - t_back - t_nvme_read(kv, hw))
            return Decision(Action.OFFLOAD_NVME, stage_at_s=stage, prefetch_at_s=max(stage, mean - t_back),
                            reason=f"{why} (host full)")
        return Decision(Action.RECOMPUTE, reason=f"{why}; host and NVMe tiers full")

    def victim_action(self, ctx: PauseContext) -> Action:
        return _swap_victim(ctx)
