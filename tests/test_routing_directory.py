"""The router's view of the engines' caches: vLLM's block hashes computed outside the engine,
vLLM's KV event stream read from a real ZMQ PUB on loopback, the block directory it feeds,
and the tier weights a hit is counted with."""
from __future__ import annotations

import time

import msgspec
import pytest
import zmq

from kvtier.tiering.model.presets import get_node, get_preset
from kvtier.tiering.routing import events as ours
from kvtier.tiering.routing.directory import BlockDirectory
from kvtier.tiering.routing.events import MalformedFrame, decode_frames
from kvtier.tiering.routing.hashing import BlockHasher, external
from kvtier.tiering.routing.subscriber import EventSubscriber
from kvtier.tiering.routing.weights import TierWeights

PUB_A = "tcp://127.0.0.1:28631"
PUB_B = "tcp://127.0.0.1:28632"
FLAT = TierWeights(host=0.9, nvme=0.5, remote=0.7)

try:    # vLLM's own event classes when vLLM imports here (the main env has it without its deps)
    from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch

    def stored(hashes, medium="GPU", block_size=16, locality=None):
        return BlockStored(block_hashes=list(hashes), parent_block_hash=None, token_ids=[], block_size=block_size,
                           lora_id=None, medium=medium, lora_name=None, locality=locality)

    def removed(hashes, medium="GPU", locality=None):
        return BlockRemoved(block_hashes=list(hashes), medium=medium, locality=locality)

    def cleared():
        return AllBlocksCleared()

    def batch(*evs):
        return KVEventBatch(ts=time.time(), events=list(evs))
except ImportError:     # the same wire format from our structs (tagged maps in an array-like batch)
    class _Batch(msgspec.Struct, array_like=True):
        ts: float
        events: list

    def stored(hashes, medium="GPU", block_size=16, locality=None):
        return ours.BlockStored(list(hashes), None, block_size, medium, locality)

    def removed(hashes, medium="GPU", locality=None):
        return ours.BlockRemoved(list(hashes), medium, locality)

    def cleared():
        return ours.AllBlocksCleared()

    def batch(*evs):
        return _Batch(time.time(), list(evs))


def frames(seq: int, b, topic: bytes = b"") -> list[bytes]:
    return [topic, seq.to_bytes(8, "big"), msgspec.msgpack.encode(b)]


def until(cond, what: str, timeout_s: float = 20.0) -> None:
    """Wait for a condition another thread makes true (a deadline, not a timing assertion)."""
    end = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.01)


# ------------------------------------------------------------------------------ hashing
@pytest.mark.parametrize("algo", ["sha256", "sha256_cbor"])
def test_block_hashes_are_vllms_own(algo):
    kcu = pytest.importorskip("vllm.v1.core.kv_cache_utils")
    from vllm.utils.hashing import get_hash_fn_by_name
    if algo.endswith("cbor"):
        pytest.importorskip("cbor2")
    fn = get_hash_fn_by_name(algo)
    kcu.init_none_hash(fn)
    tokens = [(i * 7919) % 32_000 for i in range(16 * 9 + 5)]     # 9 full blocks and a partial one
    parent, want = None, []
    for i in range(0, 16 * 9, 16):
        parent = kcu.hash_block_tokens(fn, parent, tokens[i:i + 16])
        want.append(external(parent))
    got = BlockHasher(algo).hashes(tokens, 16)
    assert got == want and len(got) == 9                # the partial block has no hash
    # the first block's hash depends on the seed (an engine started with PYTHONHASHSEED)
    assert BlockHasher(algo, seed="42").hashes(tokens, 16)[0] != want[0]


def test_hash_forms_key_alike_and_bad_algorithms_are_refused():
    b = bytes(range(32))
    assert external(b) == int.from_bytes(b[-8:], "big") == external(int.from_bytes(b, "big"))
    with pytest.raises(ValueError, match="unknown hash algorithm 'md5'; known: sha256"):
        BlockHasher("md5")
    with pytest.raises(ValueError, match="PYTHONHASHSEED"):
        BlockHasher("xxhash")
    assert len(BlockHasher("xxhash", seed="7").hashes(list(range(32)), 16)) == 2
    with pytest.raises(ValueError, match="block_size"):
        BlockHasher().hashes([1, 2], 0)


# ------------------------------------------------------------------------------ decoding
def test_decoding_reads_vllms_batches_and_skips_what_it_cannot():
    b = decode_frames(frames(5, batch(stored([1, 2], "CPU"), removed([b"\x00" * 24 + b"\x01" * 8], "STORAGE"),
                                      cleared())))
    assert b.seq == 5 and [type(e).__name__ for e in b.events] == ["BlockStored", "BlockRemoved",
                                                                  "AllBlocksCleared"]
    assert b.events[0].block_hashes == [1, 2] and b.events[0].medium == "CPU" and b.events[0].block_size == 16
    # an event type we do not know, and an event that does not decode: skipped, the rest applies
    raw = msgspec.msgpack.encode([1.0, [{"type": "BlockMoved", "x": 1}, {"type": "BlockStored", "block_hashes": "x"},
                                        {"type": "BlockStored", "block_hashes": [7], "medium": "TAPE"}]])
    b = decode_frames([b"", (6).to_bytes(8, "big"), raw])
    assert (b.unknown, b.bad) == (1, 1) and b.events[0].block_hashes == [7] and b.events[0].medium == "TAPE"
    for bad in ([b"", b"\x00" * 8], [b"", b"\x01", raw], [b"", b"\x00" * 8, b"\xc1garbage"],
                [b"", b"\x00" * 8, msgspec.msgpack.encode({"ts": 1})]):
        with pytest.raises(MalformedFrame):
            decode_frames(bad)


# ------------------------------------------------------------------------------ directory
def test_directory_counts_repeats_shares_remote_blocks_and_weighs_tiers():
    d = BlockDirectory(FLAT)
    # A holds blocks 1-4: 1-2 in HBM, 3 in host memory, 4 only on NVMe; B holds nothing of its own
    d.apply("A", [ours.BlockStored([1, 2], None, 16, "GPU"), ours.BlockStored([3], None, 16, "CPU"),
                  ours.BlockStored([4], None, 16, "STORAGE")])
    m = d.match("A", [1, 2, 3, 4, 5], 16)
    assert (m.blocks, m.tokens) == (4, 64) and m.saved_tokens == pytest.approx(16 * (1 + 1 + 0.9 + 0.5))
    assert d.match("B", [1, 2, 3], 16).blocks == 0
    # block 1 is announced twice on CPU (two chunks cover it): it stays until removed twice
    d.apply("A", [ours.BlockStored([9], None, 16, "CPU"), ours.BlockStored([9], None, 16, "CPU")])
    d.apply("A", [ours.BlockRemoved([9], "CPU")])
    assert d.match("A", [9], 16).blocks == 1
    d.apply("A", [ours.BlockRemoved([9], "CPU")])
    assert d.match("A", [9], 16).blocks == 0
    # a hole ends the chain: block 2 leaves HBM, so A's match stops after block 1
    d.apply("A", [ours.BlockRemoved([2], "GPU")])
    assert d.match("A", [1, 2, 3], 16).blocks == 1
    # blocks in a shared tier (locality REMOTE, or medium REMOTE) count for every engine
    d.apply("A", [ours.BlockStored([2], None, 16, "STORAGE", "REMOTE"), ours.BlockStored([5], None, 16, "REMOTE")])
    m = d.match("B", [1, 2], 16)
    assert m.blocks == 0                                   # B does not hold block 1
    m = d.match("B", [2], 16)
    assert m.blocks == 1 and m.saved_tokens == pytest.approx(16 * 0.7)
    assert d.match("A", [1, 2, 3, 4, 5], 16).blocks == 5
    # AllBlocksCleared: A's own blocks go, the shared ones stay
    d.apply("A", [ours.AllBlocksCleared()])
    assert d.match("A", [1], 16).blocks == 0 and d.match("A", [2], 16).blocks == 1
    assert d.match("B", [5], 16).blocks == 1
    d.check_integrity()


def test_directory_is_bounded_and_forgets_the_oldest():
    d = BlockDirectory(FLAT, max_hashes=3)
    d.apply("A", [ours.BlockStored([1, 2, 3], None, 16, "GPU"), ours.BlockStored([4], None, 16, "GPU")])
    assert len(d) == 3 and d.forgotten == 1
    assert d.match("A", [1], 16).blocks == 0 and d.match("A", [2, 3, 4], 16).blocks == 3
    assert d.held_by("A") == 3
    d.check_integrity()


def test_an_unknown_medium_is_accepted_and_weighed_as_the_cheapest_offload():
    d = BlockDirectory(FLAT)
    d.apply("A", [ours.BlockStored([1], None, 16, "TAPE")])
    assert d.match("A", [1], 16).saved_tokens == pytest.approx(16 * 0.5)


# ------------------------------------------------------------------------------ weights
def test_tier_weights_price_a_reload_against_a_prefill():
    geom, hw = get_preset("llama-3.1-8b"), get_node("pcie5-x16")
    w = TierWeights.priced(geom, hw, remote_gbps=25)
    m, prefill = 2 * 32 * 8 * 128 * 2, 2 * 8.03e9 / 400e12      # KV bytes a token; prefill seconds a token
    assert w.weight("GPU") == 1.0 and w.weight(None) == 1.0
    assert w.weight("cpu") == pytest.approx(1 - (m / 50e9) / prefill)                    # 0.935
    assert w.weight("STORAGE") == w.weight("DISK") == pytest.approx(1 - (m / 7e9 + m / 50e9) / prefill)  # 0.468
    assert w.weight("REMOTE") == w.weight("CPU", "REMOTE") == pytest.approx(1 - (m / 25e9 + m / 50e9) / prefill)
    assert w.weight("TAPE") == min(w.host, w.nvme, w.remote)
    # a reload slower than the prefill saves nothing: 8 GPUs prefill faster than one NVMe reads
    assert TierWeights.priced(geom, get_node("h100x8")).weight("STORAGE") == 0.0
    assert TierWeights.priced(geom, hw, overrides={"storage": 0.25}).weight("STORAGE") == 0.25
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        TierWeights(host=1.5)


# ------------------------------------------------------------------------------ the stream
@pytest.fixture
def pubs():
    ctx = zmq.Context()
    socks = {}
    for name, ep in (("A", PUB_A), ("B", PUB_B)):
        s = ctx.socket(zmq.PUB)
        s.setsockopt(zmq.LINGER, 0)
        s.bind(ep)
        socks[name] = s
    yield socks
    for s in socks.values():
        s.close(0)
    ctx.term()


def started(sub: EventSubscriber, pubs, name: str) -> int:
    """Publish probe batches until the subscriber has one (a SUB misses what came before it
    joined); returns the next sequence number to use."""
    seq = 0
    while sub.stats[name].batches == 0:
        pubs[name].send_multipart(frames(seq, batch()))
        seq += 1
        time.sleep(0.02)
        assert seq < 1000, "the subscriber never joined"
    return seq


def test_a_real_zmq_stream_feeds_the_directory_and_survives_bad_frames(pubs):
    d = BlockDirectory(FLAT)
    sub = EventSubscriber({"A": PUB_A, "B": PUB_B}, d.apply, on_restart=d.clear)
    sub.start()
    try:
        seq_a, seq_b = started(sub, pubs, "A"), started(sub, pubs, "B")
        hashes = BlockHasher().hashes(list(range(64)), 16)
        # engine A: the 4 blocks in HBM; engine B: the first 2 in its CPU tier (bytes hashes, as vLLM
        # sends them without VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES)
        pubs["A"].send_multipart(frames(seq_a, batch(stored(hashes))))
        pubs["B"].send_multipart(frames(seq_b, batch(stored([h.to_bytes(32, "big") for h in hashes[:2]], "CPU"))))
        until(lambda: d.match("A", hashes, 16).blocks == 4 and d.match("B", hashes, 16).blocks == 2,
              "both engines' events applied")
        assert d.match("B", hashes, 16).saved_tokens == pytest.approx(32 * 0.9)
        assert d.block_size("A") == 16
        # garbage on A's stream: counted and skipped; the thread goes on
        pubs["A"].send_multipart([b"only one frame"])
        pubs["A"].send_multipart([b"", b"\x00\x01", b"x"])
        pubs["A"].send_multipart([b"", (seq_a + 1).to_bytes(8, "big"), b"\xc1\xc1"])
        pubs["A"].send_multipart(frames(seq_a + 2, batch(removed(hashes[3:]))))
        until(lambda: d.match("A", hashes, 16).blocks == 3, "A's removal applied after the garbage")
        assert sub.stats["A"].malformed == 3 and sub.stats["A"].gaps == 1   # seq_a + 1 never arrived whole
        assert sub._thread is not None and sub._thread.is_alive()
        # A restarts (its sequence starts over): what it held locally is forgotten
        pubs["A"].send_multipart(frames(0, batch(stored(hashes[:1]))))
        until(lambda: sub.stats["A"].restarts == 1, "the restart seen")
        until(lambda: d.match("A", hashes, 16).blocks == 1, "A holds only its new block")
        d.check_integrity()
    finally:
        sub.stop()
    assert sub._thread is None


def test_a_bad_endpoint_is_refused_at_start():
    sub = EventSubscriber({"A": "tcp://no-such-host-name:x"}, lambda *a: None)
    with pytest.raises(ValueError, match="cannot connect to KV events of A"):
        sub.start()
    assert sub._thread is None
