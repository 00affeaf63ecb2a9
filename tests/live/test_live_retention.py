"""Retention in a live vLLM engine's own KV cache (vLLM's CPU build, in this process).

A pause the policy retains keeps its blocks held in the engine's block pool
(:mod:`kvtier.engine_adapter.vllm_holds`): the trajectory's next request finds
its whole prefix in vLLM's own prefix cache (vLLM's ``prefix_cache_hits``
counter, nothing loaded), while a pause the policy lets go comes back from
the tiers below (vLLM's ``external_prefix_cache_hits``).  Holds give way to
the engine's own requests.  The pauses are priced as a 70B model on one
PCIe Gen5 accelerator (``model``/``node`` presets, the hints' 16k-token
context), where a short tool wait is worth holding and a long one is not.
Greedy outputs are compared with an engine without kvtier.
"""
from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from kvtier.engine_adapter.vllm_inprocess import EngineSpec, LiveEngine

ENGINE_BLOCKS = 40
CPU_BYTES = 512 << 10
PRICED = {"model": "llama-3.1-70b", "node": "pcie5-x16"}
QUICK_S, SLOW_S = 0.02, 3.0


def spec(model: str, data_dir: Path | None, cpu_bytes: int = CPU_BYTES, **opts) -> EngineSpec:
    if data_dir is None:
        return EngineSpec(model=model, engine_blocks=ENGINE_BLOCKS, log_stats=True)
    return EngineSpec(model=model, engine_blocks=ENGINE_BLOCKS, offload="kvtier", cpu_bytes=cpu_bytes, log_stats=True,
                      kvtier={"data_dir": str(data_dir), "nvme_gb": 0.05, "host_gb": 0.002, **PRICED, **opts})


def hint(sid: str, tool: str) -> dict:
    return {"kvtier": {"tool": tool, "trajectory_id": sid, "context_tokens": 16384}}


class Sessions:
    """Seeded contexts that grow turn by turn (output + a tool result appended)."""

    def __init__(self, names, first: int = 200, seed: int = 0) -> None:
        self.rng = random.Random(seed)
        self.ctx = {n: self.tokens(first) for n in names}

    def tokens(self, n: int) -> list[int]:
        return [self.rng.randrange(3, 1000) for _ in range(n)]

    def grow(self, sid: str, out) -> None:
        self.ctx[sid] = self.ctx[sid] + list(out) + self.tokens(40)


def short_and_long(eng: LiveEngine, trace: list | None = None) -> list:
    """A quick-tool session and a slow-tool one whose waits other traffic fills;
    ``trace`` gets (session, counters before, result, counters after) of each turn."""
    s = Sessions(("q", "s"))
    outs = []

    def counters() -> dict:
        c = eng.engine_counters()
        st = eng.kvtier_stats()
        c["hold_resumes"] = st["holds"]["served_resumes"] if st is not None else 0
        return c

    def turn(sid: str, tool: str) -> None:
        before = counters()
        r = eng.generate(s.ctx[sid], max_tokens=4, kv_transfer_params=hint(sid, tool))
        eng.settle()
        if trace is not None:
            trace.append((sid, before, r, counters()))
        outs.append(r.tokens)
        s.grow(sid, r.tokens)

    for _ in range(4):
        turn("q", "quick")
        time.sleep(QUICK_S)
    for i in range(3):
        turn("s", "slow")
        for j in range(3):                  # other agents cycle every block nobody holds through the engine
            outs.append(eng.generate(s.tokens(420), max_tokens=2).tokens)
        time.sleep(SLOW_S)
    turn("s", "slow")
    turn("q", "quick")
    return outs


@pytest.fixture(scope="module")
def reference(tiny_model):
    with LiveEngine(spec(tiny_model, None)) as eng:
        return short_and_long(eng)


def test_a_short_pause_resumes_from_its_hold_and_a_long_one_from_the_tiers(tiny_model, reference, tmp_path):
    trace: list = []
    # vLLM's CPU tier below the engine stages every store on its way to kvtier: room for the whole
    # working set, so no store is refused there however slowly the machine runs kvtier's copies
    with LiveEngine(spec(tiny_model, tmp_path, cpu_bytes=4 * CPU_BYTES, hold_share=0.9)) as eng:
        outs = short_and_long(eng, trace)
        stats = eng.kvtier_stats()
    assert outs == reference                                        # greedy outputs equal, every request
    holds = stats["holds"]
    assert holds["served_resumes"] >= 3 and holds["released"]["error"] == 0
    assert stats["contained_errors"] == 0

    sid, before, r, after = trace[-1]                              # the quick session's last resume,
    assert sid == "q" and r.cached_tokens >= 192                   # after other traffic filled the engine
    assert after["hold_resumes"] == before["hold_resumes"] + 1     # its blocks were held through it
    assert after["vllm:prefix_cache_hits"] - before["vllm:prefix_cache_hits"] == r.cached_tokens   # on the device
    assert after["vllm:external_prefix_cache_hits"] == before["vllm:external_prefix_cache_hits"]  # nothing loaded
    assert after["kvtier_chunks_loaded"] == before["kvtier_chunks_loaded"]

    sid, before, r, after = trace[-2]                              # the slow session's last resume
    assert sid == "s" and r.cached_tokens > 0 and after["hold_resumes"] == before["hold_resumes"]
    assert after["vllm:external_prefix_cache_hits"] > before["vllm:external_prefix_cache_hits"]  # from the tiers
    assert after["vllm:prefix_cache_hits"] - before["vllm:prefix_cache_hits"] < r.cached_tokens
    assert stats["decisions"].get("retain", 0) >= 4 and stats["decisions"].get("offload_host", 0) >= 1


ROUNDS, SESSIONS = 3, 6


def crowd(eng: LiveEngine) -> list:
    """Six sessions, each round's turns sent together (four run at once), every
    pause retained (policy ``retain``): holds of every pause would take more than the engine has."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    s = Sessions([f"c{i}" for i in range(SESSIONS)], first=250, seed=1)
    outs = []
    for _ in range(ROUNDS):
        sids = list(s.ctx)
        sps = [SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True,
                              extra_args={"kv_transfer_params": hint(sid, "quick")}) for sid in sids]
        res = eng.llm.generate([TokensPrompt(prompt_token_ids=s.ctx[sid]) for sid in sids], sps, use_tqdm=False)
        for sid, o in zip(sids, res):
            outs.append(tuple(o.outputs[0].token_ids))
            s.grow(sid, o.outputs[0].token_ids)
        eng.settle()
        time.sleep(QUICK_S)
    return outs


@pytest.fixture(scope="module")
def crowd_reference(tiny_model):
    with LiveEngine(spec(tiny_model, None)) as eng:
        return crowd(eng), eng.engine_counters()["vllm:num_preemptions"]


def test_holds_that_would_fill_the_pool_give_way_without_preemptions(tiny_model, crowd_reference, tmp_path):
    want, preempted_without = crowd_reference
    with LiveEngine(spec(tiny_model, tmp_path, hold_share=0.9, policy="retain")) as eng:
        outs = crowd(eng)
        counters = eng.engine_counters()
        stats = eng.kvtier_stats()
    assert len(outs) == ROUNDS * SESSIONS and outs == want           # every request completed, outputs equal
    holds = stats["holds"]
    assert holds["holds"] + holds["refused"] == ROUNDS * SESSIONS  # every pause asked
    assert holds["holds"] >= SESSIONS and holds["released"]["pressure"] >= 1
    assert holds["peak_blocks"] <= holds["capacity"]
    assert counters["vllm:num_preemptions"] <= preempted_without      # holds never cost a preemption
    assert stats["contained_errors"] == 0 and holds["released"]["error"] == 0
