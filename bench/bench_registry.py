"""Registry growth: what finished sessions cost a long-running engine, with and without forgetting.

An engine's lifecycle controller keeps a trajectory per session id it has
seen (tiering/lifecycle/pruning.py).  This benchmark serves ``sessions``
sessions (each one hinted, ``blocks`` block keys, paused, resumed, then never
seen again) through a :class:`~kvtier.tiering.lifecycle.LifecycleController`
over a real :class:`~kvtier.store.TieredStore` (256 host frames of 4 KiB, a
data dir on a real filesystem), with the breakeven policy's forecast
schedule.  It then lets ``forget_after_s`` pass on a manual clock, ticks until
pruning is done, and times what an engine meets next:

* a host write of 32 blocks while a context larger than the host tier is
  being written (the store evicts, and asks the controller for its host
  victim order with the store's lock held);
* a lifecycle tick;
* an engine-side hint + blocks + pause of a new session.

Two runs in one process: ``keep`` (pruning off: nothing is ever forgotten)
and ``prune`` (the default :class:`Pruner`).  The
registry's Python memory is traced with ``tracemalloc`` after the sessions
(and, for ``prune``, after pruning).  The ratio ``keep`` / ``prune`` of the
write's worst case is printed.  The fixed shape makes numbers comparable
across runs on one machine; timings are wall clock and noisy.

Command line: ``python -m kvtier.bench.bench_registry [--sessions N] [--blocks B]
[--data-dir D] [--json]`` (two stores under D, default the current
directory, removed afterwards).
"""
from __future__ import annotations

import argparse
import hashlib
import math
import shutil
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

BLOCK = 4096
HOST_FRAMES = 256
MAX_SESSIONS = 1_000_000


def _key(i: int) -> bytes:
    return hashlib.blake2b(i.to_bytes(8, "little"), digest_size=32).digest()


def _times(f, n: int) -> dict:
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t0)
    ts.sort()
    return {"p50_ms": ts[len(ts) // 2] * 1e3, "max_ms": ts[-1] * 1e3}


def run_one(root: Path, sessions: int, blocks: int, prune: bool, progress=None) -> dict:
    """One controller over a fresh store under ``root``; see the module doc.  Plain dict."""
    from kvtier.store import StoreConfig, TieredStore
    from kvtier.tiering.lifecycle import ForecastSchedule, LifecycleController, ManualClock
    from kvtier.tiering.lifecycle.pruning import Pruner
    from kvtier.tiering.policy.policies import make_policy
    from kvtier.tiering.model.presets import get_node, get_preset

    pruner = Pruner() if prune else Pruner(forget_after_s=math.inf, max_trajectories=sys.maxsize)
    store = TieredStore.open(StoreConfig(root=root, host_bytes=HOST_FRAMES * BLOCK, nvme_bytes=8192 * BLOCK,
                                         block_bytes=BLOCK))
    try:
        pol = make_policy("breakeven", geometry=get_preset("llama-3.1-8b"), hardware=get_node("pcie5-x16"))
        clock = ManualClock()
        ctl = LifecycleController(store, ForecastSchedule(pol), clock=clock, block_bytes=BLOCK, pruner=pruner)
        tracemalloc.start()
        m0 = tracemalloc.get_traced_memory()[0]
        kid = 1 << 40
        for i in range(sessions):
            tid = f"s{i}"
            ctl.hint(tid, "bash")
            ctl.add_blocks(tid, [_key(kid + j) for j in range(blocks)])
            kid += blocks
            ctl.pause(tid)
            clock.advance(0.001)
            ctl.hint(tid, None)          # its next request: running, then never seen again
            if progress is not None and i % 500 == 0:
                progress(i)
        m1 = tracemalloc.get_traced_memory()[0]
        clock.advance(pruner.forget_after_s + 1.0 if prune else 1000.0)
        t0, ticks = time.perf_counter(), 0
        while prune and len(ctl._reg) > 0 and ticks < 100_000:
            ctl.tick()
            clock.advance(pruner.every_s)
            ticks += 1
        prune_s = time.perf_counter() - t0
        m2 = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        left = len(ctl._reg)
        big = [_key(j) for j in range(HOST_FRAMES + 144)]      # a context larger than the host tier
        ctl.hint("big", "bash")
        ctl.plan_for("big", context_tokens=len(big) * 16)
        ctl.add_blocks("big", big)
        blk = bytes(BLOCK)
        n = [0]

        def host_write() -> None:
            n[0] += 1
            ks = [_key((2 << 40) + n[0] * 32 + j) for j in range(32)]
            ctl.add_blocks("big", ks)
            store.put_many(ks, [blk] * 32, tier="host")

        def engine_calls() -> None:
            n[0] += 1
            tid = f"new{n[0]}"
            ctl.hint(tid, "bash")
            ctl.add_blocks(tid, [_key((3 << 40) + n[0] * 8 + j) for j in range(8)])
            ctl.pause(tid)

        def tick() -> None:
            clock.advance(0.01)
            ctl.tick()

        return {"registry_after_sessions": sessions, "registry_after_pruning": left,
                "traced_mib_after_sessions": (m1 - m0) / 2**20, "traced_mib_now": (m2 - m0) / 2**20,
                "pruning_ticks": ticks, "pruning_s": prune_s,
                "host_write_32": _times(host_write, 40), "tick": _times(tick, 40),
                "engine_hint_blocks_pause": _times(engine_calls, 40),
                "forgotten": ctl.stats().get("forgotten", 0)}
    finally:
        store.close()


def run(sessions: int = 20_000, blocks: int = 64, data_dir: Path | None = None, progress=None) -> dict:
    """Both runs (keep, prune); ValueError on bad input."""
    if not (1 <= sessions <= MAX_SESSIONS) or not (1 <= blocks <= 4096):
        raise ValueError(f"sessions must be in 1..{MAX_SESSIONS:,} and blocks in 1..4096")
    base = Path(tempfile.mkdtemp(prefix="kvtier-registry-", dir=data_dir or Path.cwd()))
    try:
        keep = run_one(base / "keep", sessions, blocks, prune=False, progress=progress)
        pruned = run_one(base / "prune", sessions, blocks, prune=True,
                         progress=None if progress is None else (lambda i: progress(sessions + i)))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    w_keep, w_prune = keep["host_write_32"]["max_ms"], pruned["host_write_32"]["max_ms"]
    return {"sessions": sessions, "blocks_per_session": blocks, "host_frames": HOST_FRAMES, "block_bytes": BLOCK,
            "keep": keep, "prune": pruned,
            "host_write_max_keep_over_prune": w_keep / w_prune if w_prune > 0 else None}


def _show(doc: dict) -> None:
    from rich.table import Table
    from kvtier.util.console import make_console

    t = Table(title=f"{doc['sessions']:,} finished sessions of {doc['blocks_per_session']} blocks, "
                    f"then a context larger than the host tier ({doc['host_frames']} frames) is written")
    t.add_column("what")
    t.add_column("keep (no forgetting)", justify="right")
    t.add_column("prune (default)", justify="right")
    k, p = doc["keep"], doc["prune"]
    t.add_row("trajectories known", f"{k['registry_after_pruning']:,}", f"{p['registry_after_pruning']:,}")
    t.add_row("registry memory (MiB, traced)", f"{k['traced_mib_now']:.1f}", f"{p['traced_mib_now']:.1f}")
    for name, key in (("host write of 32 blocks", "host_write_32"), ("lifecycle tick", "tick"),
                      ("engine: hint + blocks + pause", "engine_hint_blocks_pause")):
        t.add_row(f"{name} (ms, p50 / max)", f"{k[key]['p50_ms']:.2f} / {k[key]['max_ms']:.1f}",
                  f"{p[key]['p50_ms']:.2f} / {p[key]['max_ms']:.1f}")
    t.add_row("pruning (ticks, s)", "", f"{p['pruning_ticks']:,}, {p['pruning_s']:.2f}")
    con = make_console()
    con.print(t)
    r = doc["host_write_max_keep_over_prune"]
    con.print(f"worst host write: keep / prune = {r:.1f}x" if r else "worst host write: no ratio")


def main(argv: list[str] | None = None) -> int:
    """``python -m kvtier.bench.bench_registry``: parse the flags, run, print (exit 2 on bad input)."""
    from kvtier.bench.bench_decide import DecideProgress
    from kvtier.bench.script import run_script
    from kvtier.util.args import int_like, typed

    p = argparse.ArgumentParser(prog="python -m kvtier.bench.bench_registry",
                                description="what finished sessions cost the lifecycle controller, with and "
                                            "without forgetting them")
    p.add_argument("--sessions", type=typed(int_like, lambda v: 1 <= v <= MAX_SESSIONS, "an integer >= 1"),
                   default=20_000, help="finished sessions served first (default 20000)")
    p.add_argument("--blocks", type=typed(int_like, lambda v: 1 <= v <= 4096, "an integer in 1..4096"),
                   default=64, help="block keys per session (default 64)")
    p.add_argument("--data-dir", type=Path, default=None,
                   help="where the two stores go, removed after (a real filesystem; default: the current dir)")
    p.add_argument("--json", action="store_true", help="print one JSON document on stdout and nothing else")

    def go(args: argparse.Namespace) -> dict:
        with DecideProgress(2 * args.sessions, "registry benchmark") as bar:
            return run(args.sessions, args.blocks, args.data_dir, progress=bar)

    return run_script("bench_registry", p, go, _show, argv)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
