"""``kvtier demo``: an agent loop on a tiny transformers model, every tool pause through kvtier.

One trajectory, several turns.  Each turn generates greedy tokens, then the
agent calls a simulated tool (a real ``sleep`` of the tool's wait); at the
pause the policy picks retain / host / NVMe / recompute from the tool's
predicted wait, the hook moves the KV blocks through the movers into the
tiered store (or drops them), and the lifecycle controller the engine
plugins use carries the decision out (staging, leases) and prefetches them
back while the tool runs; the next turn continues.  The same turns run uninterrupted on the same model
as the reference; ``matches_reference`` compares the tokens generated after
each resume.

Nothing is downloaded: the model is built from a config with seeded random
weights (fp32, 4 layers).  The store lives in ``--data-dir`` (default: a
temporary directory, removed afterwards), LMDB embedded, no servers.
"""
from __future__ import annotations

import argparse
import math
import random
import shutil
import tempfile
import time
from dataclasses import dataclass

from kvtier.util.args import ensure_dir
from kvtier.util.cmd import CliError, add_json_flag, emit_json

@dataclass(frozen=True)
class ScriptedTool:
    """One tool call of the demo: this call's wait, and the history the predictor was warmed with
    (``history`` calls, log-normal around ``typical_s`` with log-sd ``spread``; seeded)."""

    tool: str
    wait_s: float
    typical_s: float
    spread: float
    observation_tokens: int
    history: int = 24


# The agent's tool calls.  Each history is tight or wide on purpose, and the demo node below is
# scaled, so that the policy's expected costs put each call clearly (>= ~1.3x, see docs/demo.md)
# in one regime:
#   grep          50 ms, tight   -> retain     (holding HBM for 50 ms is cheaper than any move)
#   docker_build  2 s, tight     -> NVMe       (long and predictable: park it on the cheapest tier,
#                                               prefetch just in time)
#   pytest        0.7 s, tight   -> host DRAM  (too short to pay NVMe I/O; most blocks already stored)
#   human_review  0.3-16 s, wide -> recompute  (no prefetch time can be right; prefill beats the stall)
SCRIPT: tuple[ScriptedTool, ...] = (
    ScriptedTool("grep", 0.05, 0.05, 0.15, 8),
    ScriptedTool("docker_build", 2.0, 2.0, 0.05, 8),
    ScriptedTool("pytest", 0.7, 0.7, 0.10, 8),
    ScriptedTool("human_review", 2.5, 2.0, 1.3, 8),
    ScriptedTool("pytest", 0.7, 0.7, 0.10, 8),
)
PROMPT_TOKENS = 192
MAX_POSITIONS = 1024   # the tiny model's max_position_embeddings: the whole agent context must fit
MODELS = ("llama", "qwen2")


def register(groups) -> None:
    p = groups.top.add_parser("demo", help="end-to-end agent loop on a tiny model (CPU is enough)",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", default=None, help="store directory (default: a temporary directory)")
    p.add_argument("--model", default="llama", choices=MODELS, help="architecture of the tiny model")
    p.add_argument("--seed", type=int, default=0, help="weights and prompt seed")
    p.add_argument("--tokens", type=int, default=8, help="tokens generated per turn")
    p.add_argument("--time-scale", type=float, default=1.0, help="multiply every real tool sleep by this (fast-forward; decisions stay the same)")
    p.add_argument("--engine", choices=("hf", "vllm"), default="hf",
                   help="hf: the transformers hook (default); vllm: a live vLLM engine (its CPU build runs "
                        "anywhere: `bash ci/live-env.sh` makes an environment with it)")
    add_json_flag(p)
    p.set_defaults(handler=run)


def build_model(arch: str = "llama", seed: int = 0, *, layers: int = 4, hidden: int = 128, vocab: int = 512):
    """A tiny causal LM from a config with seeded random weights (fp32, eval mode)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    if arch not in MODELS:
        raise CliError(f"unknown model {arch!r}; known: {', '.join(MODELS)}")
    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=MAX_POSITIONS)
    torch.manual_seed(seed)
    if arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    else:
        model = Qwen2ForCausalLM(Qwen2Config(**common, use_sliding_window=False))
    return model.eval()


@dataclass(frozen=True)
class DemoTurn:
    tool: str
    wait_s: float                  # the tool's (scripted) wait: what the policy learns
    wall_wait_s: float             # measured pause -> resume
    action: str                    # placement chosen at the pause
    final_action: str              # placement restored from (differs after a lease demotion)
    decided: str
    reason: str
    costs: dict                    # the policy's expected cost per action (seconds-equivalent)
    bytes_moved: int
    blocks_reused: int
    kv_bytes: int
    freed_bytes: int
    offload_s: float
    prefetch_at_s: float | None
    demote_at_s: float | None
    demotions: list
    prefetched: bool
    resume_stall_s: float
    recomputed_tokens: int
    matches_reference: bool
    max_logit_diff: float

    def as_json(self) -> dict:
        return {"tool": self.tool, "wait_s": round(self.wait_s, 4), "action": self.action,
                "bytes_moved": self.bytes_moved, "resume_stall_s": round(self.resume_stall_s, 6),
                "matches_reference": self.matches_reference,
                "final_action": self.final_action, "decided": self.decided, "reason": self.reason,
                "costs": {k: round(v, 6) for k, v in self.costs.items()},
                "wall_wait_s": round(self.wall_wait_s, 4), "kv_bytes": self.kv_bytes,
                "freed_bytes": self.freed_bytes, "blocks_reused": self.blocks_reused,
                "offload_s": round(self.offload_s, 6),
                "prefetch_at_s": None if self.prefetch_at_s is None else round(self.prefetch_at_s, 4),
                "demote_at_s": None if self.demote_at_s is None else round(self.demote_at_s, 4),
                "demotions": self.demotions,
                "prefetched": self.prefetched, "recomputed_tokens": self.recomputed_tokens,
                "max_logit_diff": self.max_logit_diff}


# The demo's node, scaled so a tiny model's ~400-550 KB of KV faces the trade-offs a large model's
# GBs face on a real node: a 4 MB/s host link (reload ~0.1 s), NVMe at 4 MB/s read / 8 MB/s write,
# prefill at 6 GFLOP/s (recompute ~0.05 s), holding prices per "typical context" of 512 tokens,
# HBM half full.  Chosen with margins: docs/demo.md lists each turn's costs.
DEMO_HARDWARE = dict(hbm_bytes=1e9, link_h2d_bps=4e6, link_d2h_bps=4e6, prefill_flops=6e9,
                     nvme_read_bps=4e6, nvme_write_bps=8e6)
DEMO_PRICES = dict(ref_tokens=512, nvme_ratio=0.005, dram_ratio=0.1, io_weight=0.2, stall_weight=2.0)
DEMO_HBM_PRESSURE = 0.5


def make_policy(model, predictor, *, host_bytes: float, nvme_bytes: float):
    """kvtier's BreakEvenPolicy over the scaled demo node."""
    from kvtier.tiering.model.costmodel import HardwareProfile, ModelGeometry
    from kvtier.tiering.policy.policies import BreakEvenPolicy

    cfg = model.config
    heads = cfg.num_attention_heads
    geom = ModelGeometry(name="demo-tiny", layers=cfg.num_hidden_layers,
                         kv_heads=cfg.num_key_value_heads or heads,
                         head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // heads,
                         dtype_bytes=4, params=float(sum(p.numel() for p in model.parameters())))
    hw = HardwareProfile(**DEMO_HARDWARE, host_bytes=host_bytes, nvme_bytes=nvme_bytes)
    return BreakEvenPolicy(geom, hw, predictor, **DEMO_PRICES)


def warm_predictor(script=SCRIPT, seed: int = 0):
    """A ToolWaitPredictor that has seen each scripted tool's history (seeded log-normal samples)."""
    from kvtier.tiering.forecasting.predictor import ToolWaitPredictor

    pred = ToolWaitPredictor()
    rng = random.Random(seed)
    seen: set[str] = set()
    for t in script:
        if t.tool in seen:
            continue
        seen.add(t.tool)
        for _ in range(t.history):
            pred.observe(t.tool, t.typical_s * math.exp(rng.gauss(0.0, t.spread)))
    return pred


def run_demo(*, arch: str = "llama", seed: int = 0, tokens: int = 8, time_scale: float = 1.0,
             data_dir: str | None = None, script=SCRIPT, policy=None, progress=None) -> dict:
    """Run the scripted agent loop and its uninterrupted reference; returns the JSON document.

    The policy learns the scripted waits and leases run in scripted time, so
    the decisions are the same on every run (for a fresh data dir);
    ``time_scale`` only shortens the real sleeps (fast-forward: the prefetch
    then has less time than planned, so it may stall).
    """
    import torch  # noqa: F401  (imported here: keeps the CLI start cheap)

    from kvtier.engine_adapter.hf import AgentSession
    from kvtier.store.config import StoreConfig
    from kvtier.store.tiered import TieredStore

    _check_args(tokens, time_scale, script)
    model = build_model(arch, seed)
    rng = random.Random(seed)
    vocab = model.config.vocab_size
    prompt = [rng.randrange(vocab) for _ in range(PROMPT_TOKENS)]
    observations = [[rng.randrange(vocab) for _ in range(t.observation_tokens)] for t in script]
    fmt = AgentSession.frame_format(model)
    tmp = None
    if data_dir is None:
        tmp = data_dir = tempfile.mkdtemp(prefix="kvtier-demo-")
    try:
        cfg = StoreConfig(root=data_dir, host_bytes=256 * fmt.frame_bytes, nvme_bytes=1024 * fmt.frame_bytes,
                          block_bytes=fmt.frame_bytes)
        with TieredStore.open(cfg) as store:
            policy = policy or make_policy(model, warm_predictor(script, seed), host_bytes=cfg.host_bytes,
                                           nvme_bytes=cfg.nvme_bytes)
            # reference: the same turns, never paused
            with AgentSession(model, store=store, policy=policy) as ref:
                ref.start("ref", prompt)
                ref_turns = [ref.generate("ref", tokens)]
                for obs in observations:
                    ref.append("ref", obs)
                    ref_turns.append(ref.generate("ref", tokens))
            turns = []
            with AgentSession(model, store=store, policy=policy, hbm_pressure=DEMO_HBM_PRESSURE) as s:
                s.start("agent", prompt)
                s.generate("agent", tokens)
                for i, (t, obs) in enumerate(zip(script, observations)):
                    if progress:
                        progress(f"turn {i + 1}/{len(script)}: {t.tool} ({t.wait_s:.2f}s)")
                    p = s.pause("agent", t.tool, scripted_wait_s=t.wait_s)
                    time.sleep(t.wait_s * time_scale)          # the tool runs
                    r = s.resume("agent", obs)
                    out = s.generate("agent", tokens)
                    want = ref_turns[i + 1]
                    turns.append(DemoTurn(
                        tool=t.tool, wait_s=r.wait_s, wall_wait_s=r.wall_wait_s, action=str(p.action),
                        final_action=str(r.action), decided=str(p.decided), reason=p.reason,
                        costs=_action_costs(p.costs), bytes_moved=p.bytes_moved + sum(d.bytes_moved for d in r.demotions),
                        blocks_reused=p.blocks_reused, kv_bytes=p.kv_bytes, freed_bytes=p.freed_bytes,
                        offload_s=p.offload_s, prefetch_at_s=p.prefetch_at_s, demote_at_s=p.demote_at_s,
                        demotions=[{"at_s": round(d.at_s, 4), "from": str(d.from_action), "to": str(d.to_action),
                                    "bytes_moved": d.bytes_moved} for d in r.demotions],
                        prefetched=r.prefetched, resume_stall_s=r.resume_stall_s + out.reload_wait_s,
                        recomputed_tokens=r.recomputed_tokens, matches_reference=out.tokens == want.tokens,
                        max_logit_diff=float((out.logits - want.logits).abs().max())))
                lifecycle = _lifecycle_stats(s.lifecycle.stats())
            stats = store.stats().as_dict()
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return {"turns": [t.as_json() for t in turns], "all_match": all(t.matches_reference for t in turns),
            "model": {"arch": arch, "layers": fmt.layers, "kv_heads": fmt.kv_heads, "head_dim": fmt.head_dim,
                      "block_tokens": fmt.block_tokens, "frame_bytes": fmt.frame_bytes},
            "policy": getattr(policy, "name", type(policy).__name__),
            "time_scale": time_scale,
            "lifecycle": lifecycle,
            "store": {k: stats[k] for k in ("host_blocks", "nvme_blocks", "io_engine", "direct_io", "puts",
                                            "hits_host", "hits_nvme", "misses")}}


LIFECYCLE_KEYS = ("pauses", "resumes", "leases", "demoted_blocks", "stagings", "staged_blocks")


def _lifecycle_stats(st: dict) -> dict:
    """What the lifecycle controller did over the run (counters it never incremented are 0)."""
    return {k: int(st.get(k, 0)) for k in LIFECYCLE_KEYS}


def _action_costs(extra) -> dict:
    """The per-action expected costs of a decision's ``extra`` (which may also carry what the policy
    expects to happen, e.g. ``exp_stall_s``: not costs, left out)."""
    from kvtier.tiering.model.decision import Action
    names = {a.value for a in Action}
    return {k: float(v) for k, v in extra.items() if k in names}


def _check_args(tokens: int, time_scale: float, script=SCRIPT) -> None:
    """Raise CliError for a token count or time scale the demo cannot run with."""
    most = (MAX_POSITIONS - PROMPT_TOKENS - sum(t.observation_tokens for t in script)) // (len(script) + 1)
    if not 1 <= tokens <= most:
        raise CliError(f"--tokens must be in 1..{most} (the whole agent context must fit the tiny model's "
                       f"{MAX_POSITIONS} positions), got {tokens}")
    if not (math.isfinite(time_scale) and time_scale >= 0):
        raise CliError(f"--time-scale must be a finite number >= 0, got {time_scale}")


def run(args: argparse.Namespace) -> int:
    if args.engine == "vllm":
        from kvtier.cli.demo_vllm import run as run_vllm
        _check_args(args.tokens, args.time_scale)
        if args.data_dir is not None:
            ensure_dir(args.data_dir, "--data-dir")
        return run_vllm(args)
    from kvtier.extras import require
    for module in ("rich", "transformers"):   # one line naming kvtier[demo] before any work
        require(module, extra="demo")
    from kvtier.util.console import make_console

    _check_args(args.tokens, args.time_scale)
    if args.data_dir is not None:
        ensure_dir(args.data_dir, "--data-dir")
    err = make_console(stderr=True)
    with err.status("kvtier demo: building a tiny model") as status:
        doc = run_demo(arch=args.model, seed=args.seed, tokens=args.tokens, time_scale=args.time_scale,
                       data_dir=args.data_dir, progress=lambda m: status.update(f"kvtier demo: {m}"))
    if args.json:
        emit_json(doc)
    else:
        _print_table(doc)
    return 0 if doc["all_match"] else 1


_COLOUR = {"retain": "cyan", "offload_host": "green", "offload_nvme": "magenta", "recompute": "yellow"}
_SHORT = {"retain": "retain", "offload_host": "host", "offload_nvme": "NVMe", "recompute": "recompute"}


def _print_table(doc: dict, console=None) -> None:
    """The readable report (kvtier.util.console's width rules: piped output is not cut; on a narrow
    terminal the least telling columns are left out instead of cutting cells)."""
    def act(a: str) -> str:
        return f"[{_COLOUR.get(a, 'white')}]{_SHORT.get(a, a)}[/]"

    m = doc["model"]
    columns = [("#", "right"), ("tool", "left"), ("wait", "right"), ("action", "left"), ("next best", "left"),
               ("KV", "right"), ("moved", "right"), ("offload", "right"), ("prefetch", "right"),
               ("stall", "right"), ("match", "center")]
    rows = [_row(i, r, act) for i, r in enumerate(doc["turns"], 1)]
    from kvtier.util.console import fit_table, make_console
    c = console or make_console()     # piped: wide enough that no cell is cut
    # an 80-column terminal: leave out the least telling columns rather than cut cells
    t, dropped = fit_table(c, columns, rows, drop=("#", "offload", "KV", "next best", "moved"),
                           title=f"kvtier demo: one agent, {len(doc['turns'])} tool pauses, policy {doc['policy']}",
                           title_justify="left")
    c.print(t)
    if dropped:
        c.print(f"(narrow terminal: columns {', '.join(dropped)} left out; --json has every field)",
                style="dim", highlight=False)
    s = doc["store"]
    notes = [
        f"model: tiny {m['arch']} ({m['layers']} layers, fp32, seeded weights), {m['frame_bytes'] // 1000} KB per "
        f"{m['block_tokens']}-token block; reference: the same turns, never paused.",
        "next best: the runner-up action and its expected cost relative to the chosen one (policy's cost model "
        "on a scaled demo node).",
        "moved: KV bytes written to the store at the pause (+Nr: blocks already stored, not moved again); "
        "prefetch: reload start after the pause (done: back before the tool returned); "
        "stall: time the resume waited for its KV (or recomputed it).",
        f"store: {s['host_blocks']} blocks in host DRAM, {s['nvme_blocks']} on NVMe (io engine {s['io_engine']}, "
        f"O_DIRECT {'on' if s['direct_io'] else 'off'}); hits host {s['hits_host']}, NVMe {s['hits_nvme']}, "
        f"misses {s['misses']}.",
    ]
    lc = doc.get("lifecycle")
    if lc:
        notes.append(f"lifecycle controller (the engines' own): {lc['pauses']} pauses, {lc['leases']} lease ends, "
                     f"{lc['demoted_blocks']} blocks demoted host -> NVMe, {lc['staged_blocks']} staged NVMe -> "
                     f"host ahead of the return.")
    if doc.get("time_scale", 1.0) != 1.0:
        notes.append(f"time scale {doc['time_scale']:g}: tool sleeps fast-forwarded, so prefetches have less "
                     "time than planned.")
    for n in notes:
        c.print(n, style="dim", highlight=False)
    c.print("tokens after every resume equal the uninterrupted run: "
            + ("[green]yes[/]" if doc["all_match"] else "[red]NO[/]"))


def _row(i: int, r: dict, act) -> list[str]:
    """One turn's cells, in the table's column order."""
    a = r["action"]
    off = a.startswith("offload")
    ms = r["resume_stall_s"] * 1e3
    stall = f"{ms:.1f} ms" if ms < 100 else f"{ms:.0f} ms"
    if r["recomputed_tokens"]:
        stall += f" ({r['recomputed_tokens']} tok)"
    costs = r.get("costs") or {}
    nxt = "-"
    if a in costs and len(costs) > 1:
        name, c = min(((k, v) for k, v in costs.items() if k != a), key=lambda kv: kv[1])
        nxt = f"{act(name)} {c / costs[a]:.1f}x" if costs[a] > 0 else act(name)
    a_txt = act(a) + "".join(f" -> {act(d['to'])}@{d['at_s']:.2f}s" for d in r.get("demotions") or ()
                             if d["to"] != d["from"])
    moved = _b(r["bytes_moved"]) + (f" +{r['blocks_reused']}r" if r["blocks_reused"] and off else "")
    if r["prefetch_at_s"] is not None:
        pf = f"@{r['prefetch_at_s']:.2f} s" + (" [green]done[/]" if r["prefetched"] else " [red]late[/]")
    else:
        pf = "on resume" if off else "-"
    return [str(i), r["tool"], f"{r['wait_s']:.2f} s", a_txt, nxt, _b(r["kv_bytes"]), moved,
            f"{r['offload_s'] * 1e3:.1f} ms" if off else "-", pf, stall,
            "[green]yes[/]" if r["matches_reference"] else "[red]NO[/]"]


def _b(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return str(n)  # pragma: no cover
