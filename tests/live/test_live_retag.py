"""A router's retag reaches a live vLLM engine and re-plans the pause (vLLM's CPU build, in this process).

A turn hinted with the router's forecast (``edit``) pauses; the retag request the router sends
when the response named another tool (one prompt token, ``max_tokens`` 1, its hint
``{"retag": true, ...}``) goes through vLLM's own request path into kvtier's connector, and the
lifecycle plans the pause again: the plan it ends with is the one a pause on the true tool
(``pytest``) gets.  The retag request is never a pause of its own.  The policy has learned
that ``edit`` comes back at once and ``pytest`` takes an hour (its real predictor, taught
through its ``observe``), priced as a 70B model's 16k-token context.
"""
from __future__ import annotations

from kvtier.engine_adapter.vllm_inprocess import EngineSpec, LiveEngine

PRICED = {"model": "llama-3.1-70b", "node": "pcie5-x16"}


def hint(tid: str, tool: str) -> dict:
    return {"kvtier": {"tool": tool, "trajectory_id": tid, "context_tokens": 16384}}


def test_a_retag_request_replans_the_pause_in_a_live_engine(tiny_model, tmp_path):
    spec = EngineSpec(model=tiny_model, engine_blocks=40, offload="kvtier", cpu_bytes=2 << 20,
                      kvtier={"data_dir": str(tmp_path / "kv"), "nvme_gb": 0.05, "host_gb": 0.002, **PRICED})
    with LiveEngine(spec) as eng:
        ctl = eng.kvtier().lifecycle.controller
        for _ in range(30):                           # what the policy has learned of each tool
            ctl.schedule.observe("edit", 0.02, None)
            ctl.schedule.observe("pytest", 3600.0, None)
        prompt = list(range(10, 10 + 6 * 32))
        # the true tool's plan, on a trajectory hinted with it
        eng.generate(prompt, max_tokens=4, kv_transfer_params=hint("truth", "pytest"))
        eng.settle()
        truth = ctl.plan_for("truth")
        # a turn hinted with the forecast pauses on the forecast's plan
        eng.generate([p + 1 for p in prompt], max_tokens=4, kv_transfer_params=hint("t", "edit"))
        eng.settle()
        forecast = ctl.plan_for("t")
        assert forecast.action != truth.action, (forecast, truth)
        assert forecast.action == "retain" and eng.kvtier_stats()["holds"]["held_pauses"] == 1   # held in the engine
        pauses = ctl.counter_values()["pauses"]
        # the router's retag: one prompt token, one output token, through vLLM's request path
        out = eng.generate([0], max_tokens=1, kv_transfer_params={
            "kvtier": {"retag": True, "trajectory_id": "t", "tool": "pytest", "forecast": "edit"}})
        assert len(out.tokens) == 1
        c = ctl.counter_values()
        assert c["retag:replanned"] == 1 and c["pauses"] == pauses       # re-planned, and no pause of its own
        replanned = ctl.plan_for("t")
        assert (replanned.action, replanned.tier, replanned.timers) == (truth.action, truth.tier, truth.timers)
        holds = eng.kvtier_stats()["holds"]                               # the engine's hold followed the new plan
        assert holds["held_pauses"] == 0 and holds["released"]["replanned"] == 1
        assert ctl.stats()["trajectories"] == 2
        # a retag naming a trajectory the engine does not know changes nothing
        eng.generate([0], max_tokens=1, kv_transfer_params={
            "kvtier": {"retag": True, "trajectory_id": "nobody", "tool": "pytest"}})
        assert ctl.counter_values()["retag:unknown"] == 1 and ctl.stats()["trajectories"] == 2
