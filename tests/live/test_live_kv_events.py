"""kvtier's tiers in a live vLLM engine's KV event stream (vLLM's CPU build, in this process).

A subscriber does what a router's indexer does (llm-d's, Dynamo's): a ZMQ SUB
socket on the engine's ``--kv-events-config`` endpoint (a local ``ipc://``
socket the engine binds: nothing listens on the network), decoding vLLM's own
schema (``KVEventBatch``, msgpack) with msgspec.  It learns each prompt
block's hash from the engine's own GPU ``BlockStored`` events, then sees
kvtier's NVMe (``STORAGE``, ``LOCAL``) and shared tier (``STORAGE``,
``REMOTE``, a real redis-server) beside them, and their ``BlockRemoved``.
Every time the subscriber believes a prompt's blocks are on one of kvtier's
tiers, the prompt is sent again and those blocks come back from that tier
(vLLM's external hits, kvtier's ``loaded_by_tier``).  The engine cache
(12 blocks of 32 tokens), vLLM's CPU tier (8 chunks) and kvtier's NVMe
(21 slots) are small, so filler prompts push a prompt out of each in turn.
"""
from __future__ import annotations

import random
import shutil
import time
from collections import defaultdict

import pytest

from kvtier.engine_adapter.vllm_inprocess import EngineSpec, LiveEngine

BLOCK = 32
PROMPT_BLOCKS = 4


class Subscriber:
    """vLLM's KV event stream as a router's indexer reads it: per block hash,
    the (medium, locality, ownership) places it is advertised on now."""

    def __init__(self, endpoint: str) -> None:
        import msgspec
        import zmq
        from vllm.distributed.kv_events import KVEventBatch
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"")
        self.sock.connect(endpoint)                      # retried until the engine has bound it
        self.decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
        self.places: dict[object, set] = defaultdict(set)
        self.tokens: dict[object, tuple] = {}            # a GPU block's hash -> its tokens
        self.log: list = []                              # every event, in order

    def drain(self, wait_s: float = 0.0) -> None:
        """Read what has arrived (waiting up to ``wait_s`` for the first message)."""
        import zmq
        timeout = int(wait_s * 1000)
        while self.sock.poll(timeout, zmq.POLLIN):
            _topic, _seq, payload = self.sock.recv_multipart()
            for ev in self.decoder.decode(payload).events:
                self.apply(ev)
            timeout = 0

    def apply(self, ev) -> None:
        from vllm.distributed.kv_events import BlockRemoved, BlockStored
        self.log.append(ev)
        if isinstance(ev, BlockStored):
            place = (ev.medium, ev.locality, ev.ownership)
            for i, h in enumerate(ev.block_hashes):
                self.places[h].add(place)
                if ev.medium == "GPU" and ev.block_size:
                    self.tokens[h] = tuple(ev.token_ids[i * ev.block_size:(i + 1) * ev.block_size])
        elif isinstance(ev, BlockRemoved):
            for h in ev.block_hashes:
                self.places[h].discard((ev.medium, ev.locality, ev.ownership))

    def until(self, pred, what: str, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not pred():
            if time.monotonic() > deadline:
                raise AssertionError(f"the event stream never showed {what}")
            self.drain(0.2)

    def hashes_of(self, prompt: list[int]) -> list:
        """The prompt's full blocks' hashes, from the engine's own GPU events."""
        by_tokens = {t: h for h, t in self.tokens.items()}
        return [by_tokens.get(tuple(prompt[i * BLOCK:(i + 1) * BLOCK])) for i in range(len(prompt) // BLOCK)]

    def engine(self, h) -> set:
        """Where the subscriber believes the engine itself holds ``h``: its GPU cache, vLLM's CPU tier."""
        return {m for m, _, own in self.places.get(h, ()) if not own}

    def kvtier(self, h) -> set:
        """Where the subscriber believes kvtier holds block ``h``: {(medium, locality)}."""
        return {(m, loc) for m, loc, own in self.places.get(h, ()) if own and own.startswith("KvtierTier:")}

    def close(self) -> None:
        self.sock.close(linger=0)
        self.ctx.term()


@pytest.fixture
def redis(tmp_path):
    from remote_servers import RedisServer, redis_binary
    if redis_binary() is None:
        pytest.skip("redis-server is not installed")
    srv = RedisServer(tmp_path / "redis").start()
    yield srv
    srv.stop()
    shutil.rmtree(tmp_path / "redis", ignore_errors=True)


def test_a_subscriber_sees_kvtiers_tiers_and_each_advertised_block_is_served(tiny_model, tmp_path, redis):
    from vllm.distributed.kv_events import BlockRemoved, BlockStored
    endpoint = f"ipc://{tmp_path}/kv-events"
    sub = Subscriber(endpoint)
    rng = random.Random(51)

    others: list[list[int]] = []

    def prompt() -> list[int]:
        return [rng.randrange(3, 1000) for _ in range(PROMPT_BLOCKS * BLOCK + 5)]

    spec = EngineSpec(model=tiny_model, engine_blocks=12, offload="kvtier", cpu_bytes=8 * BLOCK * 1024,
                      kv_events=endpoint,
                      kvtier={"data_dir": str(tmp_path / "kv"), "nvme_gb": 0.0008, "host_gb": 0, "policy": "off",
                              "remote_url": redis.url, "remote_write": "through"})
    try:
        with LiveEngine(spec) as eng:
            def run(p: list[int]):
                before = dict(eng.kvtier_stats()["loaded_by_tier"])
                r = eng.generate(p, max_tokens=2)
                eng.settle()
                after = eng.kvtier_stats()["loaded_by_tier"]
                return r, {t: after.get(t, 0) - before.get(t, 0) for t in after if after.get(t, 0) != before.get(t, 0)}

            def fill(until, what: str) -> None:
                """Other traffic, until the stream shows ``until()``: it pushes earlier prompts
                out of the engine's cache, vLLM's CPU tier and kvtier's NVMe in turn."""
                for _ in range(12):
                    sub.drain(0.2)
                    if until():
                        return
                    others.append(prompt())
                    run(others[-1])
                sub.until(until, what)

            a = prompt()
            run(a)
            sub.until(lambda: None not in sub.hashes_of(a), "the prompt's GPU blocks")
            ha = sub.hashes_of(a)
            assert len(ha) == PROMPT_BLOCKS and all(sub.engine(h) == {"GPU", "CPU"} for h in ha)
            nvme, remote = ("STORAGE", "LOCAL"), ("STORAGE", "REMOTE")
            # 1. BlockStored for each of a's blocks on kvtier's NVMe and on the shared tier
            sub.until(lambda: all(sub.kvtier(h) == {nvme, remote} for h in ha), "a on kvtier's NVMe and shared tier")
            # ... and once the stream shows a gone from the engine's cache and vLLM's CPU tier, a
            # request for a loads every one of its blocks from kvtier (NVMe first)
            fill(lambda: not any(sub.engine(h) for h in ha), "a gone from the engine's caches")
            assert all(sub.kvtier(h) == {nvme, remote} for h in ha)
            r, loaded = run(a)
            assert r.cached_tokens == PROMPT_BLOCKS * BLOCK and loaded == {"nvme": PROMPT_BLOCKS}
            # 2. more traffic than NVMe holds: BlockRemoved for a's NVMe copies, the shared tier's stay
            fill(lambda: not any(sub.engine(h) or nvme in sub.kvtier(h) for h in ha), "a's NVMe copies removed")
            assert all(sub.kvtier(h) == {remote} for h in ha)
            r, loaded = run(a)
            assert r.cached_tokens == PROMPT_BLOCKS * BLOCK and loaded == {"remote": PROMPT_BLOCKS}
            # 3. none advertised that cannot be served: every other prompt the stream places
            #    wholly on kvtier's tiers (none of it in the engine's caches) is served from them
            fill(lambda: not any(sub.engine(h) for h in ha), "a gone from the engine's caches again")
            assert all(sub.kvtier(h) == {remote} for h in ha)
            checked = 0
            for p in others:
                sub.drain(0.2)
                hp = sub.hashes_of(p)
                if None in hp or any(sub.engine(h) for h in hp):
                    continue
                assert all(sub.kvtier(h) for h in hp)             # a prompt's blocks are advertised together
                r, loaded = run(p)
                assert r.cached_tokens == PROMPT_BLOCKS * BLOCK and sum(loaded.values()) == PROMPT_BLOCKS
                checked += 1
            assert checked >= 3
            # 4. the shared tier loses its values behind kvtier's back (a flush, another client's
            #    delete): the first lookup that misses withdraws the advertisement, nothing is loaded
            seen = len(sub.log)
            redis.client().flushall()
            r, loaded = run(a)
            assert loaded.get("remote", 0) == 0 and r.cached_tokens == 0
            sub.until(lambda: any(isinstance(ev, BlockRemoved) and ev.locality == "REMOTE" and
                                  ha[0] in ev.block_hashes for ev in sub.log[seen:]), "a's shared-tier copy removed")
            # kvtier's events are one chunk each (vLLM's offload key), all on STORAGE here (no host frames),
            # and the tier dropped none
            ours = [ev for ev in sub.log if (ev.ownership or "").startswith("KvtierTier:")]
            assert all(ev.medium == "STORAGE" for ev in ours)
            assert all(len(ev.block_hashes) == 1 for ev in ours if isinstance(ev, BlockStored))
            c = eng.kvtier().events.counts()
            assert c.dropped == 0 and c.unmapped == 0 and c.stored > 0 and c.removed > 0
    finally:
        sub.close()
