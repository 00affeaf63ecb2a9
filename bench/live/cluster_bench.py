"""The routers compared on a live cluster: agent sessions through each router's URL, concurrently.

    with Cluster(spec, policies=opts.routers) as cluster:
        doc = run_cluster_benchmark(cluster, opts, sessions)

For each repeat, every router runs the same sessions (same token ids, same arrivals and waits),
so a router's numbers pair with the reference's (``prefix-load``) of the same repeat.  The
routers' order turns round from one repeat to the next.  Each (repeat, router) run carries its
own ``cache_salt`` (vLLM hashes it into the first block; the router hashes it the same way), so
no run finds an earlier run's blocks in an engine's cache or the shared tier, while greedy
outputs stay the same: ``outputs_equal`` compares each run's with the reference's of the same
repeat (None on the reference's own row).

Sessions run at once, one thread each: a session waits for its arrival, sends a turn, and after
the answer sleeps its tool wait, so several requests are in flight and the engines' queues
matter.  Every request is a streamed ``/v1/completions`` of token ids through the router,
carrying kvtier's hint (``tool``, ``trajectory_id``); the engine that answered is the response's
``x-kvtier-engine``.  Per run: resume TTFT p50/p99 and mean JCT (:mod:`.runs`); the hit rate
(cached tokens / prompt tokens over every turn, and over resumes); the requests each engine
took; the resumes sent to another engine than the session's previous turn; and kvtier's loads
by tier summed over the engines' ``/metrics`` (read after a tiny request to each engine once
the run ends, so its counters are folded in), and from them the engine-cache hit rate (cached
tokens kvtier did not load; one block per chunk, as the cluster configures it).
"""
from __future__ import annotations

import math
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from kvtier.bench.live.cluster import Cluster
from kvtier.bench.live.driver import RunRecord, TurnRecord
from kvtier.bench.live.ensemble import config_row, mean_se, paired
from kvtier.bench.live.http_engine import HttpEngine, ServerError
from kvtier.bench.live.runs import RunSummary, summarize
from kvtier.bench.live.server_metrics import counters_delta, kvtier_counters
from kvtier.bench.live.workload import LiveSession, describe, token_ids

ENGINE_HEADER = "x-kvtier-engine"
HIT_RATES = ("hit_rate", "resume_hit_rate", "engine_cache_hit_rate")


@dataclass(frozen=True)
class ClusterBenchOptions:
    """``routers``: the policies compared (each must have a router in the cluster); ``reference``:
    the one the others pair with (default: prefix-load if given, else the first).  Raises ValueError."""

    routers: tuple[str, ...]
    repeat: int = 1
    seed: int = 0
    vocab: int = 1024
    timeout_s: float = 300.0
    time_scale: float = 1.0
    reference: str | None = None
    settle_s: float = 5.0

    def __post_init__(self) -> None:
        if not self.routers or len(set(self.routers)) != len(self.routers):
            raise ValueError("the router list is empty or names one twice")
        if self.reference is not None and self.reference not in self.routers:
            raise ValueError(f"the reference {self.reference!r} is not among the routers")
        if self.repeat < 1:
            raise ValueError(f"repeat must be >= 1, got {self.repeat}")

    @property
    def ref(self) -> str:
        if self.reference is not None:
            return self.reference
        return "prefix-load" if "prefix-load" in self.routers else self.routers[0]


class RoutedEngine(HttpEngine):
    """An :class:`HttpEngine` through a router that also keeps which engine answered the last
    request (``last_engine``: the response's ``x-kvtier-engine``, None where absent).  One
    thread per instance."""

    last_engine: str | None = None

    def _open(self, path, body=None):
        r = super()._open(path, body)
        self.last_engine = r.headers.get(ENGINE_HEADER)
        return r


@dataclass(frozen=True)
class ClusterRun:
    """One router's run: the driver's record, and per turn the engine that answered it."""

    record: RunRecord
    engines: Mapping[tuple[str, int], str | None]
    errors: tuple[str, ...]


def drive_concurrently(url: str, sessions: Sequence[LiveSession], *, seed: int, vocab: int, salt: str,
                       tag: str, timeout_s: float, model: str) -> ClusterRun:
    """Every session on its own thread through the router at ``url`` (module doc).  A turn that
    fails ends its session (its error kept); the others go on."""
    t0 = time.monotonic()
    turns: list[TurnRecord] = []
    engines: dict[tuple[str, int], str | None] = {}
    jct: dict[str, float] = {}
    errors: list[str] = []
    lock = threading.Lock()

    def one(s: LiveSession) -> None:
        eng = RoutedEngine(url, timeout_s=timeout_s, cache_salt=salt, model=model)
        ready = s.arrival_s
        ctx: list[int] = []
        for k, turn in enumerate(s.turns):
            delay = ready - (time.monotonic() - t0)
            if delay > 0:
                time.sleep(delay)
            if k == 0:
                pre = token_ids(seed, s.prefix_id, -1, s.prefix_tokens, vocab) if s.prefix_id else []
                ctx = pre + token_ids(seed, s.sid, 0, turn.new_tokens, vocab)
            hint = {"kvtier": {"tool": turn.tool or "final", "trajectory_id": f"{tag}:{s.sid}"}}
            start = time.monotonic() - t0
            try:
                r = eng.generate(ctx, max_tokens=turn.output_tokens, kv_transfer_params=hint)
            except ServerError as exc:
                with lock:
                    errors.append(f"{s.sid} turn {k}: {exc}")
                return
            end = time.monotonic() - t0
            rec = TurnRecord(s.sid, k, ready, start, end, r.ttft_s, r.prompt_tokens, r.cached_tokens,
                             tuple(r.tokens), turn.tool)
            with lock:
                turns.append(rec)
                engines[(s.sid, k)] = eng.last_engine
            if k + 1 < len(s.turns):
                ctx = ctx + list(r.tokens) + token_ids(seed, s.sid, k + 1, s.turns[k + 1].new_tokens, vocab)
                ready = end + (turn.wait_s or 0.0)
            else:
                with lock:
                    jct[s.sid] = end - s.arrival_s

    threads = [threading.Thread(target=one, args=(s,), name=f"session-{s.sid}", daemon=True) for s in sessions]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    turns.sort(key=lambda t: t.start_s)
    return ClusterRun(RunRecord(tuple(turns), jct, time.monotonic() - t0), engines, tuple(errors))


def _engine_counters(cluster: Cluster, timeout_s: float) -> dict[str, dict | None]:
    out = {}
    for url in cluster.engine_urls:
        text = HttpEngine(url, timeout_s=timeout_s).metrics_text()
        out[url] = kvtier_counters(text) if text is not None else None
    return out


def _settled(cluster: Cluster, salt: str, opts: ClusterBenchOptions, model: str) -> dict[str, dict | None]:
    """Every engine's kvtier counters once they stop moving (a tiny request to each engine folds
    them into its /metrics; reads a second apart until two agree or ``settle_s`` has passed)."""
    deadline = time.monotonic() + opts.settle_s
    last = None
    while True:
        for url in cluster.engine_urls:
            HttpEngine(url, timeout_s=opts.timeout_s, cache_salt=salt + "-step", model=model).generate(
                [3], max_tokens=1)
        now = _engine_counters(cluster, opts.timeout_s)
        if now == last or time.monotonic() >= deadline:
            return now
        last = now
        time.sleep(1.0)


def _summed(delta: Mapping[str, Mapping | None]) -> dict | None:
    """The engines' counter deltas summed into one (None when no engine has kvtier's counters)."""
    parts = [d for d in delta.values() if d is not None]
    if not parts:
        return None
    out: dict = {}
    for d in parts:
        _add(out, d)
    return out


def _add(into: dict, d: Mapping) -> None:
    for k, v in d.items():
        if isinstance(v, Mapping):
            _add(into.setdefault(k, {}), v)
        else:
            into[k] = into.get(k, 0) + v


def _hit_rates(run: ClusterRun, loaded_tokens: float) -> dict[str, float]:
    """Cached / prompt tokens over every turn and over resumes; ``engine_cache_hit_rate``: the
    cached tokens kvtier did not load (found in the engine's own cache) / prompt tokens."""
    t = run.record.turns
    r = [x for x in t if x.turn > 0]
    prompt, cached = max(1, sum(x.prompt_tokens for x in t)), sum(x.cached_tokens for x in t)
    return {"hit_rate": cached / prompt,
            "resume_hit_rate": sum(x.cached_tokens for x in r) / max(1, sum(x.prompt_tokens for x in r)),
            "engine_cache_hit_rate": max(0.0, cached - loaded_tokens) / prompt}


def _moves(run: ClusterRun) -> int:
    """Resumes answered by another engine than the session's previous turn."""
    e = run.engines
    return sum(1 for (sid, k), name in e.items() if k > 0 and (sid, k - 1) in e and e[(sid, k - 1)] != name)


def run_cluster_benchmark(cluster: Cluster, opts: ClusterBenchOptions, sessions: Sequence[LiveSession], *,
                          progress: Callable[[str], None] = lambda m: None) -> dict:
    """The JSON document of ``kvtier bench live --engines N`` (module doc) plus ``"_runs"`` (raw
    runs by router, for the plots).  Raises ValueError when a router has no router in the
    cluster or the workload does not fit the engines, ServerError when an engine cannot be read."""
    missing = [r for r in opts.routers if r not in cluster.router_urls]
    if missing:
        raise ValueError(f"the cluster has no router for {', '.join(missing)}")
    longest = max(s.final_context() for s in sessions)
    if longest > cluster.spec.context_tokens:
        raise ValueError(f"the longest context ({longest} tokens) exceeds the engines' "
                         f"{cluster.spec.context_tokens}: lower --max-context or give the engines more blocks")
    info = HttpEngine(cluster.engine_urls[0], timeout_s=opts.timeout_s).describe()
    nonce = secrets.token_hex(4)
    runs: dict[str, list[RunSummary]] = {r: [] for r in opts.routers}
    extra: dict[str, list[dict]] = {r: [] for r in opts.routers}
    names = {f"127.0.0.1:{u.rsplit(':', 1)[1]}" for u in cluster.engine_urls}
    t_start = time.monotonic()
    for rep in range(opts.repeat):
        order = opts.routers[rep % len(opts.routers):] + opts.routers[:rep % len(opts.routers)]
        for name in order:
            tag = f"kvtier-cluster-{nonce}-r{rep}-{name}"
            progress(f"repeat {rep + 1}/{opts.repeat}: {name}")
            before = _engine_counters(cluster, opts.timeout_s)
            run = drive_concurrently(cluster.router_urls[name], sessions, seed=opts.seed, vocab=opts.vocab,
                                     salt=tag, tag=tag, timeout_s=opts.timeout_s, model=info.model)
            after = _settled(cluster, tag, opts, info.model)
            stats = _summed({u: counters_delta(a, before.get(u)) if a is not None else None
                             for u, a in after.items()})
            s = summarize(name, rep, run.record, block_tokens=cluster.spec.block_tokens, kvtier_stats=stats)
            runs[name].append(s)
            by_engine: dict[str, int] = {}
            for e in run.engines.values():
                by_engine[str(e)] = by_engine.get(str(e), 0) + 1
            loaded = sum((stats or {}).get("loaded_by_tier", {}).values()) * cluster.spec.block_tokens
            extra[name].append({**_hit_rates(run, loaded), "moves": _moves(run), "requests_by_engine": by_engine,
                                "unrouted": sum(1 for e in run.engines.values() if e not in names),
                                "errors": list(run.errors), "wall_s": run.record.wall_s})
    ref = opts.ref
    ref_out = {r.repeat: r.outputs for r in runs[ref]}
    configs, pairs = {}, {}
    for name in opts.routers:
        row = config_row(runs[name], ref_out if name != ref else None)   # the reference: nothing to compare
        for k in (*HIT_RATES, "moves"):
            row[k], row[k + "_se"] = mean_se([float(x[k]) for x in extra[name]])
        row["requests_by_engine"] = _merge([x["requests_by_engine"] for x in extra[name]])
        row["unrouted"] = sum(x["unrouted"] for x in extra[name])
        row["failed_turns"] = [e for x in extra[name] for e in x["errors"]]
        row["turns"] = sum(len(r.outputs) for r in runs[name])
        configs[name] = row
        if name != ref:
            p = paired(runs[name], runs[ref])
            for k in (*HIT_RATES, "moves"):
                d = [float(a[k]) - float(b[k]) for a, b in zip(extra[name], extra[ref])]
                m, se = mean_se(d)
                resolved = 0 if (math.isnan(se) or abs(m) <= 2 * se) else (1 if m > 0 else -1)
                p[k] = {"mean": m, "se": se, "resolved": resolved}
            pairs[name] = p
    spec = cluster.spec
    return {
        "machine": {"label": "vLLM's CPU build, every engine on this machine's CPUs", "cpus": _cpus()},
        "cluster": {"engines": spec.engines, "model": spec.model, "vllm": info.version,
                    "engine_blocks": spec.engine_blocks,
                    "block_tokens": spec.block_tokens, "context_tokens": spec.context_tokens,
                    "kvtier": dict(spec.kvtier), "shared_tier": "redis-server (one, write-through)",
                    "engine_urls": list(cluster.engine_urls), "omp_threads_per_engine": 1},
        "workload": {**describe(sessions, time_scale=opts.time_scale), "vocab": opts.vocab,
                     "concurrent": True},
        "repeat": opts.repeat, "reference": ref, "routers": list(opts.routers),
        "wall_s": time.monotonic() - t_start,
        "configs": configs, "paired": pairs, "sweep": [],
        "_runs": runs,
    }


def _merge(counts: Sequence[Mapping[str, int]]) -> dict[str, float]:
    keys = sorted({k for c in counts for k in c})
    return {k: sum(c.get(k, 0) for c in counts) / max(1, len(counts)) for k in keys}


def _cpus() -> int | None:
    import os
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()


def print_cluster_tables(doc: dict) -> None:
    """The table (mean +- SE over the repeats per router) and the paired differences against
    the reference, as ``kvtier bench live --engines N`` prints them."""
    from kvtier.util.console import fit_table, make_console
    con = make_console()
    c, w = doc["cluster"], doc["workload"]
    con.print(f"[bold]cluster[/bold] {c['engines']} vLLM engines ({doc['machine']['label']}, "
              f"{doc['machine']['cpus']} CPUs, {c['omp_threads_per_engine']} thread each), "
              f"{c['engine_blocks']} blocks of {c['block_tokens']} tokens each, kvtier {c['kvtier']} "
              f"on one shared {c['shared_tier']}")
    con.print(f"[bold]workload[/bold] {w['sessions']} concurrent sessions, {w['resumes']} resumes, paused working "
              f"set {w['paused_working_set_tokens']} tokens (engine caches {c['engines']} x "
              f"{c['engine_blocks'] * c['block_tokens']} tokens); wall {doc['wall_s']:.0f} s")

    def ms(m: dict, k: str) -> str:
        return _pm(m[k] * 1000, m[k + "_se"] * 1000, "{:.0f}")

    columns = [(h, "left" if h == "router" else "right") for h in (
        "router", "hit rate", "resume hit", "engine-cache hit", "TTFT p50 ms", "TTFT p99 ms", "JCT s", "moved resumes",
        "served by tier", "outputs equal")]
    rows = []
    for n, m in doc["configs"].items():
        served = m["served_chunks_by_tier"]
        rows.append([n, _pm(m["hit_rate"], m["hit_rate_se"], "{:.3f}"),
                     _pm(m["resume_hit_rate"], m["resume_hit_rate_se"], "{:.3f}"),
                     _pm(m["engine_cache_hit_rate"], m["engine_cache_hit_rate_se"], "{:.3f}"),
                     ms(m, "resume_ttft_p50_s"),
                     ms(m, "resume_ttft_p99_s"), _pm(m["jct_mean_s"], m["jct_mean_s_se"], "{:.2f}"),
                     _pm(m["moves"], m["moves_se"], "{:.1f}"),
                     "/".join(f"{t} {v:.0f}" for t, v in served.items()) or "-",
                     {True: "yes", False: "NO", None: "-"}[m["outputs_equal"]]])
    t, _ = fit_table(con, columns, rows, drop=("served by tier",),
                     title=f"mean ± SE over {doc['repeat']} repeats (routers interleaved)")
    con.print(t)
    if not doc["paired"]:
        return
    shown = [("Δ hit rate", "hit_rate", 1, "{:+.3f} ± {:.3f}"),
             ("Δ engine-cache hit", "engine_cache_hit_rate", 1, "{:+.3f} ± {:.3f}"),
             ("Δ p50 ms", "resume_ttft_p50_s", 1000, "{:+.0f} ± {:.0f}"),
             ("Δ p99 ms", "resume_ttft_p99_s", 1000, "{:+.0f} ± {:.0f}"),
             ("Δ JCT s", "jct_mean_s", 1, "{:+.2f} ± {:.2f}")]
    mark = {-1: " (lower)", 1: " (higher)", 0: ""}
    rows = [[n, *(fmt.format(d[k]["mean"] * sc, (0 if math.isnan(d[k]["se"]) else d[k]["se"]) * sc)
                  + mark[d[k]["resolved"]] for _, k, sc, fmt in shown)] for n, d in doc["paired"].items()]
    t, _ = fit_table(con, [(h, "left" if h == "router" else "right") for h in ("router", *(s[0] for s in shown))],
                     rows, drop=(), title=f"paired differences: router - {doc['reference']} (mean ± SE; "
                                          "(lower)/(higher): more than 2 SE from 0)")
    con.print(t)
    for p in doc.get("plots", []):
        con.print(f"plot: {p}")


def _pm(m: float, se: float, fmt: str) -> str:
    if m is None or math.isnan(m):
        return "-"
    return fmt.format(m) + ("" if se is None or math.isnan(se) else " ± " + fmt.format(se))

