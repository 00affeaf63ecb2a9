"""One class per fault kind, each with ``inject(rig, rng)`` and ``recover(rig, rng)``.

``inject`` breaks something while the engine serves; ``recover`` undoes what an operator would
(restart, SIGCONT, the old ``maxmemory``); a fault whose damage stays (flipped bytes) recovers
with nothing: kvtier must serve on around it.  ``stops_engine``: the fault takes the engine down
itself (its in-flight requests are expected to fail; the soak counts them apart).

Every method raises FaultError when it cannot do its part (no file to damage, redis-server not
answering); the soak records that and goes on.  Called from the faults thread only.
"""
from __future__ import annotations

import os
import random
import signal
from pathlib import Path

from kvtier.bench.soak_live.redis_ctl import RedisCtlError, command
from kvtier.bench.soak_live.rig import Rig


class FaultError(RuntimeError):
    """The fault could not be injected or recovered (the message says what was missing)."""


class Fault:
    name = "fault"
    stops_engine = False

    def inject(self, rig: Rig, rng: random.Random) -> str:
        """Break it; returns one line saying what was done."""
        raise NotImplementedError

    def recover(self, rig: Rig, rng: random.Random) -> str:
        return "nothing to undo"


class RedisKill(Fault):
    name = "redis-kill"

    def inject(self, rig: Rig, rng: random.Random) -> str:
        rig.signal_redis(signal.SIGKILL)
        return f"redis-server pid {rig.redis.pid} SIGKILLed"

    def recover(self, rig: Rig, rng: random.Random) -> str:
        rig.start_redis()
        return f"redis-server restarted empty, pid {rig.redis.pid}"


class RedisStop(Fault):
    name = "redis-stop"

    def inject(self, rig: Rig, rng: random.Random) -> str:
        rig.signal_redis(signal.SIGSTOP)
        return "redis-server SIGSTOPped"

    def recover(self, rig: Rig, rng: random.Random) -> str:
        rig.signal_redis(signal.SIGCONT)
        return "redis-server SIGCONTed"


class RedisEvict(Fault):
    """``maxmemory`` at the server's bare footprint plus ``headroom`` bytes, evicting at random:
    most of what kvtier wrote goes, and its writes keep evicting; then unlimited again."""
    name = "redis-evict"
    headroom = 512 * 1024

    def inject(self, rig: Rig, rng: random.Random) -> str:
        try:
            info = command(rig.redis_port, "INFO", "memory").decode()
            used = next(int(line.split(":")[1]) for line in info.splitlines() if line.startswith("used_memory:"))
            dataset = next((int(line.split(":")[1]) for line in info.splitlines()
                            if line.startswith("used_memory_dataset:")), 0)
            cap = max(used - dataset, 0) + self.headroom
            command(rig.redis_port, "CONFIG", "SET", "maxmemory-policy", "allkeys-random")
            command(rig.redis_port, "CONFIG", "SET", "maxmemory", str(cap))
        except (RedisCtlError, StopIteration, ValueError) as exc:
            raise FaultError(f"redis maxmemory: {exc!r}") from None
        return f"redis maxmemory {cap} bytes (was using {used}), allkeys-random"

    def recover(self, rig: Rig, rng: random.Random) -> str:
        try:
            command(rig.redis_port, "CONFIG", "SET", "maxmemory", "0")
        except RedisCtlError as exc:
            raise FaultError(str(exc)) from None
        return "redis maxmemory 0"


def flip_bytes(path: Path, rng: random.Random, count: int) -> list[int]:
    """Invert ``count`` random bytes of ``path`` in place; returns their offsets.  Raises FaultError."""
    try:
        size = path.stat().st_size
        if size == 0:
            raise FaultError(f"{path.name} is empty")
        offsets = sorted(rng.randrange(size) for _ in range(count))
        with open(path, "r+b") as f:
            for off in offsets:
                f.seek(off)
                b = f.read(1)
                f.seek(off)
                f.write(bytes([b[0] ^ 0xFF]))
        return offsets
    except OSError as exc:
        raise FaultError(f"{path}: {exc}") from None


class SlabFlip(Fault):
    """Bytes of kvtier's NVMe slab files inverted while the engine serves (the damage stays)."""
    name = "slab-flip"
    bytes_per_file = 2048

    def inject(self, rig: Rig, rng: random.Random) -> str:
        slabs = sorted(rig.data_dir.rglob("slab-*.kv"))
        if not slabs:
            raise FaultError(f"no slab file under {rig.data_dir}")
        picked = rng.sample(slabs, min(2, len(slabs)))
        for p in picked:
            flip_bytes(p, rng, self.bytes_per_file)
        return f"{self.bytes_per_file} bytes flipped in each of {', '.join(p.name for p in picked)}"


def index_file(rig: Rig) -> Path:
    found = sorted(rig.data_dir.rglob("data.mdb"))
    if not found:
        raise FaultError(f"no LMDB index (data.mdb) under {rig.data_dir}")
    return found[0]


class IndexFlip(Fault):
    """Bytes of the LMDB index inverted while the engine serves."""
    name = "index-flip"

    def inject(self, rig: Rig, rng: random.Random) -> str:
        p = index_file(rig)
        flip_bytes(p, rng, 16)
        return f"16 bytes flipped in {p.name}"


class EngineKill(Fault):
    """The engine's process group SIGKILLed mid-run, restarted on the same data dir and port."""
    name = "engine-kill"
    stops_engine = True

    def inject(self, rig: Rig, rng: random.Random) -> str:
        pid = rig.engine.pid
        rig.kill_engine()
        return f"engine pid {pid} SIGKILLed"

    def recover(self, rig: Rig, rng: random.Random) -> str:
        took = rig.start_engine()
        return f"engine restarted on the same data dir in {took:.0f} s"


class IndexTruncate(EngineKill):
    """The engine SIGKILLed, its LMDB index cut to a random length, then restarted: kvtier must
    rebuild it (or refuse to start with one clear error, which the soak counts as a crash)."""
    name = "index-truncate"

    def inject(self, rig: Rig, rng: random.Random) -> str:
        said = super().inject(rig, rng)
        p = index_file(rig)
        size = p.stat().st_size
        keep = rng.randrange(size) if size else 0
        os.truncate(p, keep)
        return f"{said}; {p.name} cut from {size} to {keep} bytes"


class HostileClients(Fault):
    """Requests beside the agents: malformed and huge hints, a flood of distinct trajectories and
    tool names, a prompt at the context limit and one past it.  Each may be refused (HTTP 4xx);
    none may take the engine down."""
    name = "hostile-clients"
    flood = 40

    def __init__(self, context_tokens: int = 512, vocab: int = 256) -> None:
        self.context_tokens, self.vocab = context_tokens, vocab
        self.answers: dict[str, int] = {}

    def _bodies(self, rng: random.Random):
        small = [rng.randrange(3, self.vocab) for _ in range(40)]
        yield "hint-not-object", small, {"kvtier": "x" * 1000}
        yield "hint-huge", small, {"kvtier": {"tool": "t" * 200_000, "trajectory_id": "j" * 200_000}}
        yield "hint-wrong-types", small, {"kvtier": {"tool": 5, "trajectory_id": [1, 2],
                                                     "context_tokens": -1, "expected_wait_s": "nan"}}
        yield "hint-nan", small, {"kvtier": {"tool": "x", "expected_wait_s": float("inf")}}
        for i in range(self.flood):
            yield "flood", small, {"kvtier": {"tool": f"tool-{rng.getrandbits(48):x}",
                                              "trajectory_id": f"traj-{rng.getrandbits(48):x}"}}
        at_limit = [rng.randrange(3, self.vocab) for _ in range(self.context_tokens - 1)]
        yield "at-limit", at_limit, {"kvtier": {"tool": "edit", "trajectory_id": "limit"}}
        yield "past-limit", at_limit + small, None

    def inject(self, rig: Rig, rng: random.Random) -> str:
        from kvtier.bench.live.http_engine import HttpEngine, ServerError
        eng = HttpEngine(rig.url, timeout_s=60.0)
        ok = refused = 0
        for kind, prompt, params in self._bodies(rng):
            try:
                eng.generate(prompt, max_tokens=1, kv_transfer_params=params)
                ok += 1
            except ServerError:
                refused += 1
        self.answers = {"ok": ok, "refused": refused}
        return f"{ok + refused} hostile requests: {ok} answered, {refused} refused"


def fault_kinds(context_tokens: int, vocab: int) -> dict[str, Fault]:
    """Every implemented fault kind by name (those in faults_files.py and faults_remote.py too)."""
    from kvtier.bench.soak_live.faults_files import FilesDamage, FsFull
    from kvtier.bench.soak_live.faults_remote import RemoteTrickle
    kinds = [RedisKill(), RedisStop(), RedisEvict(), RemoteTrickle(), SlabFlip(), IndexFlip(), FilesDamage(),
             FsFull(), EngineKill(), IndexTruncate(), HostileClients(context_tokens, vocab)]
    return {f.name: f for f in kinds}
