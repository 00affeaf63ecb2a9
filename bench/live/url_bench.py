"""The live benchmark against a running ``vllm serve``: one configuration
(whatever the server runs), ``repeat`` runs of the same sessions.

    opts = UrlBenchOptions(url="http://127.0.0.1:8000", repeat=3)
    doc = run_url_benchmark(opts, sessions)      # sessions: workload.fit_trace(...)

Every repeat sends the same token ids (seed ``opts.seed``), so greedy outputs
must be the same in every repeat: ``outputs_equal`` compares each repeat's
with the first's (None with one repeat).  Each repeat's requests carry their
own ``cache_salt`` (and trajectory ids), fresh for every invocation, so no
repeat finds an earlier one's blocks in the engine's cache or kvtier's store.
There is no recompute reference: the server is one configuration.

kvtier's counters per repeat are the growth of the server's ``/metrics``
(``vllm:kvtier_*``) over the repeat; the server folds them in with its engine
steps, so after a repeat one tiny request (a prompt shorter than a block)
steps the engine and the counters are read once they stop moving.  A move
kvtier makes after that shows in the next repeat's counters.
"""
from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from kvtier.bench.live.driver import drive
from kvtier.bench.live.ensemble import config_row
from kvtier.bench.live.http_engine import HttpEngine
from kvtier.bench.live.runs import RunSummary, summarize
from kvtier.bench.live.server_metrics import block_size, counters_delta, kvtier_counters
from kvtier.bench.live.workload import LiveSession, describe

DEFAULT_VOCAB = 1024   # the token ids drawn; below any real model's vocabulary (the server does not tell its own)


@dataclass(frozen=True)
class UrlBenchOptions:
    url: str
    name: str = "url"
    repeat: int = 1
    seed: int = 0
    vocab: int = DEFAULT_VOCAB
    block_tokens: int | None = None     # None: the server's (its /metrics)
    timeout_s: float = 300.0
    settle_s: float = 10.0              # the longest wait for kvtier's counters after a repeat
    time_scale: float = 1.0             # the workload's (reported only: the sessions carry it)


def _params(tag: str):
    return lambda s, k: {"kvtier": {"tool": s.turns[k].tool or "final", "trajectory_id": f"{tag}:{s.sid}"}}


def _read_counters(eng: HttpEngine) -> dict | None:
    text = eng.metrics_text()
    return kvtier_counters(text) if text is not None else None


def _settled_counters(eng: HttpEngine, step: HttpEngine, settle_s: float) -> dict | None:
    """kvtier's counters once they stop moving: a tiny request on ``step``
    (its engine steps fold the tier's counters into ``/metrics``), a read,
    a second apart, until two reads agree or ``settle_s`` has passed."""
    deadline = time.monotonic() + settle_s
    last = None
    while True:
        step.generate([3], max_tokens=1)
        now = _read_counters(eng)
        if now is None or now == last or time.monotonic() >= deadline:
            return now
        last = now
        time.sleep(1.0)


def run_url_benchmark(opts: UrlBenchOptions, sessions: Sequence[LiveSession], *,
                      progress: Callable[[str], None] = lambda m: None) -> dict:
    """The JSON document of ``kvtier bench live --url`` (module doc) plus
    ``"_runs"`` (raw runs, for the plots).  Raises ServerError when the server
    cannot be reached or answers wrong, ValueError when the workload does not
    fit it or its block size is unknown."""
    probe = HttpEngine(opts.url, timeout_s=opts.timeout_s)
    info = probe.describe()
    longest = max(s.final_context() for s in sessions)
    if info.max_model_len is not None and longest > info.max_model_len:
        raise ValueError(f"the longest context ({longest} tokens) exceeds the server's max_model_len "
                         f"({info.max_model_len}): lower --max-context")
    text = probe.metrics_text()
    bt = opts.block_tokens or (block_size(text) if text is not None else None)
    if bt is None:
        raise ValueError("the server does not tell its KV block size (no vllm:cache_config_info in /metrics): "
                         "pass --block-tokens")
    nonce = secrets.token_hex(4)
    runs: list[RunSummary] = []
    kvtier_seen = False
    for rep in range(opts.repeat):
        tag = f"kvtier-bench-{nonce}-r{rep}"
        eng = HttpEngine(opts.url, timeout_s=opts.timeout_s, cache_salt=tag, model=info.model)
        step = HttpEngine(opts.url, timeout_s=opts.timeout_s, cache_salt=tag + "-step", model=info.model)
        progress(f"repeat {rep + 1}/{opts.repeat}: {opts.name}")
        before = _read_counters(eng)
        run = drive(eng, sessions, seed=opts.seed, vocab=opts.vocab, params=_params(tag))
        after = _settled_counters(eng, step, opts.settle_s)
        stats = counters_delta(after, before) if after is not None else None
        kvtier_seen = kvtier_seen or stats is not None
        runs.append(summarize(opts.name, rep, run, block_tokens=bt, kvtier_stats=stats))
    ref = {r.repeat: runs[0].outputs for r in runs} if len(runs) > 1 else None
    row = config_row(runs, ref)
    pf = [r.prefill_ms_per_1k for r in runs if r.prefill_ms_per_1k is not None]
    return {
        "engine": {"url": info.url, "in_process": False, "vllm": info.version, "model": info.model,
                   "max_model_len": info.max_model_len, "block_tokens": bt,
                   "block_tokens_from": "--block-tokens" if opts.block_tokens else "server",
                   "kvtier_metrics": kvtier_seen,
                   "prefill_ms_per_1k_tokens": sum(pf) / len(pf) if pf else None,
                   "ttft": "client-measured: request sent to first streamed token"},
        "workload": {**describe(sessions, time_scale=opts.time_scale), "vocab": opts.vocab},
        "repeat": opts.repeat, "reference": None,
        "configs": {opts.name: row}, "paired": {}, "sweep": [],
        "_runs": {opts.name: runs},
    }

