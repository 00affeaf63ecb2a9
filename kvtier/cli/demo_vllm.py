"""``kvtier demo --engine vllm``: the agent demo on a live vLLM engine.

Four agent sessions share one vLLM engine (the CPU build runs it on any
machine) whose KV cache is too small to keep them while they wait on their
tools; kvtier's connector offloads each paused session's blocks and brings
them back.  The same sessions run first on an engine without kvtier; every
turn's greedy output is compared with it.  Prints, per turn, the tool, the
lifecycle's decision for the pause, the prompt tokens served without
recompute, and whether the output equals the reference; then the totals:
resumes, tokens kvtier served by tier, decisions, "outputs equal: yes/no".
Exit 0 when every output matches, 1 when one does not, 2 without a runnable vLLM.
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from kvtier.util.cmd import CliError, emit_json

SESSIONS, TURNS = 4, 3
ENGINE_BLOCKS, CPU_BYTES = 40, 512 << 10
HOST_GB, NVME_GB = 0.002, 0.05


def run(args: argparse.Namespace) -> int:
    import contextlib
    import os
    import sys

    from kvtier.engine_adapter.vllm_inprocess import VllmMissing, require_live_vllm
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    # vLLM logs to stdout; the report (and --json) owns it
    with contextlib.redirect_stdout(sys.stderr):
        try:
            version = require_live_vllm()
        except VllmMissing as exc:
            raise CliError(str(exc)) from None
        with tempfile.TemporaryDirectory(prefix="kvtier-demo-vllm-") as tmp:
            root = Path(args.data_dir) if args.data_dir else Path(tmp)
            doc = run_demo(root, time_scale=args.time_scale, tokens=args.tokens, seed=args.seed)
    doc["vllm"] = version
    if args.json:
        emit_json(doc)
    else:
        print_report(doc)
    return 0 if doc["all_match"] else 1


def run_demo(root: Path, *, time_scale: float = 1.0, tokens: int = 8, seed: int = 0) -> dict[str, Any]:
    """Both runs (reference, then kvtier); the demo's JSON document."""
    from kvtier.engine_adapter.agent_sessions import Script, run_script
    from kvtier.engine_adapter.tiny_model import TinyModel, build_tiny_model
    from kvtier.engine_adapter.vllm_inprocess import EngineSpec, LiveEngine

    shape = TinyModel(seed=seed)
    model = str(build_tiny_model(root / "model", shape))
    script = Script(sessions=SESSIONS, turns=TURNS, output_tokens=tokens, seed=seed)
    with LiveEngine(EngineSpec(model=model, engine_blocks=ENGINE_BLOCKS)) as eng:
        reference = [r.tokens for r in run_script(eng, script, hints="none")]
    spec = EngineSpec(model=model, engine_blocks=ENGINE_BLOCKS, offload="kvtier", cpu_bytes=CPU_BYTES,
                      kvtier={"data_dir": str(root / "kvtier"), "host_gb": HOST_GB, "nvme_gb": NVME_GB})
    turns: list[dict] = []
    with LiveEngine(spec) as eng:
        tier = eng.kvtier()
        lifecycle = tier.lifecycle if tier is not None else None

        def on_turn(r) -> None:
            eng.settle()
            d = lifecycle.decision(r.session) if lifecycle is not None else None
            turns.append({"session": r.session, "turn": r.turn, "tool": r.tool, "wait_s": r.wait_s,
                          "action": getattr(d, "action", None) and str(d.action),
                          "prompt_tokens": r.prompt_tokens, "cached_tokens": r.cached_tokens,
                          "ttft_s": round(r.ttft_s, 4)})
        results = run_script(eng, script, hints="tool", time_scale=time_scale, on_turn=on_turn)
        eng.settle()
        stats = eng.kvtier_stats() or {}
        chunk_tokens = tier._tokens_per_chunk if tier is not None else 0
    for t, r, ref in zip(turns, results, reference):
        t["matches_reference"] = r.tokens == ref
    lc = stats.get("lifecycle", {})
    return {"engine": "vllm", "model": {"path": model, "layers": shape.layers, "hidden": shape.hidden,
                                        "params": shape.params(), "kv_bytes_per_token": tier.facts.token_bytes
                                        if tier is not None and tier.facts else None},
            "engine_cache_tokens": ENGINE_BLOCKS * 32, "vllm_cpu_tier_bytes": CPU_BYTES,
            "kvtier_host_bytes": int(HOST_GB * 1e9), "policy": stats.get("policy"),
            "priced_by": stats.get("priced_by"), "turns": turns, "sessions": SESSIONS,
            "resumes": lc.get("resumes", 0),
            "served_tokens_by_tier": {k: v * chunk_tokens for k, v in stats.get("loaded_by_tier", {}).items()},
            "decisions": stats.get("decisions", {}), "hint_rejections": stats.get("hint_rejections", 0),
            "contained_errors": stats.get("contained_errors", 0),
            "all_match": all(t["matches_reference"] for t in turns)}


def print_report(doc: dict) -> None:
    from kvtier.util.console import make_console
    from rich.table import Table
    m = doc["model"]
    t = Table(title=f"kvtier demo on vLLM {doc.get('vllm', '')} ({m['layers']}-layer random model, "
                    f"{m['params'] / 1e6:.2f} M params; engine cache {doc['engine_cache_tokens']} tokens, "
                    f"policy {doc['policy']} priced by the {doc['priced_by']})")
    for col in ("session", "turn", "tool (wait)", "decision", "prompt", "served", "TTFT ms", "output"):
        t.add_column(col, justify="right" if col in ("turn", "prompt", "served", "TTFT ms") else "left")
    for r in doc["turns"]:
        t.add_row(r["session"], str(r["turn"]), f"{r['tool']} ({r['wait_s']:g} s)", r["action"] or "-",
                  str(r["prompt_tokens"]), str(r["cached_tokens"]), f"{r['ttft_s'] * 1e3:.1f}",
                  "equal" if r["matches_reference"] else "DIFFERS")
    c = make_console()
    c.print(t)
    served = ", ".join(f"{k} {v}" for k, v in sorted(doc["served_tokens_by_tier"].items())) or "none"
    decisions = ", ".join(f"{k} {v}" for k, v in sorted(doc["decisions"].items())) or "none"
    c.print(f"sessions {doc['sessions']}, resumes {doc['resumes']}; tokens kvtier served by tier: {served}")
    c.print(f"decisions: {decisions}; hint rejections {doc['hint_rejections']}, "
            f"contained errors {doc['contained_errors']}")
    c.print(f"outputs equal: {'yes' if doc['all_match'] else 'no'}")
