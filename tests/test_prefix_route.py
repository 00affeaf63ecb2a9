"""Figure 7 of the reference text: chunk chain, prefix directory, affinity-load objective."""
import pytest

from kvtier.store.events import BlockRemoved, BlockStored, KVEventBatch
from kvtier.tiering.prefix.chunks import chunk_hashes
from kvtier.tiering.prefix.directory import PrefixDirectory
from kvtier.tiering.prefix.score import Weights, choose, score


def prompt(n: int, start: int = 0) -> list[int]:
    return [(start + i * 7919) % 50_000 for i in range(n)]


def test_figure_7_numbers():
    # stage 1: S = 40,000 tokens in 16-token chunks -> a chain of 2,500 hashes
    tokens = prompt(40_000)
    chain = chunk_hashes(tokens, 16)
    assert len(chain) == 2_500
    d = PrefixDirectory()
    # worker 1 retains the first 32,000 tokens; worker 2 an unrelated prompt's 38,000
    d.apply("w1", KVEventBatch(0.0, (BlockStored(tuple(chain[:2_000]), medium="GPU"),)))
    d.apply("w2", KVEventBatch(0.0, (BlockStored(tuple(chunk_hashes(prompt(38_000, 3), 16)), medium="GPU"),)))
    # stage 2: equal loads -> the prefix decides
    r = d.route(chain, {"w0": 2, "w1": 2, "w2": 2}, chunk_tokens=16, prompt_tokens=40_000,
                weights=Weights(mu=0.5, gamma=1.0))
    # stage 3: worker 1, 32,000 cached (80 %), 2,000 chunks skipped, 8,000 prefilled
    assert r.worker == "w1"
    assert r.matched_tokens == 32_000 and r.hit == pytest.approx(0.80)
    assert r.skipped_chunks == 2_000 and r.prefill_tokens == 8_000
    assert r.matches == {"w0": 0, "w1": 32_000, "w2": 0}


def test_load_outweighs_the_prefix_when_mu_is_small():
    chain = chunk_hashes(prompt(40_000), 16)
    d = PrefixDirectory()
    d.stored("w1", chain[:2_000], "GPU")
    loads = {"w0": 1, "w1": 8}
    assert d.route(chain, loads, chunk_tokens=16, weights=Weights(mu=0.9)).worker == "w1"
    # mu = 0.2: 0.2*0.8 - 0.8*1 = -0.64 (w1) < 0 - 0.8*(1/8) = -0.1 (w0)
    assert d.route(chain, loads, chunk_tokens=16, weights=Weights(mu=0.2)).worker == "w0"
    assert score(32_000, 40_000, 8, 8, Weights(0.2, 1.0)) == pytest.approx(-0.64)
    # gamma > 1 forgives moderate load: (4/8)^4 = 0.0625
    assert score(0, 40_000, 4, 8, Weights(0.5, 4.0)) == pytest.approx(-0.5 * 0.0625)


def test_the_chain_is_prefix_sensitive_and_namespaced():
    a, b = prompt(64), prompt(64)
    b[20] += 1                          # second chunk differs
    ha, hb = chunk_hashes(a, 16), chunk_hashes(b, 16)
    assert ha[0] == hb[0] and all(x != y for x, y in zip(ha[1:], hb[1:]))
    assert chunk_hashes(a, 16, seed=b"other-model")[0] != ha[0]
    assert len(chunk_hashes(a[:47], 16)) == 2          # a partial chunk is not hashed
    with pytest.raises(ValueError):
        chunk_hashes([-1] * 16, 16)
    with pytest.raises(ValueError):
        Weights(mu=1.5)
    with pytest.raises(ValueError):
        choose([], [], 10, Weights())


def test_shared_tier_counts_for_every_worker_and_removal_withdraws():
    chain = chunk_hashes(prompt(160), 16)
    d = PrefixDirectory()
    d.apply("w0", [BlockStored(tuple(chain[:4]), medium="REMOTE")])     # published to the shared tier
    d.apply("w1", [BlockStored(tuple(chain[:6]), medium="CPU")])
    assert d.match("w2", chain) == 4 and d.match("w1", chain) == 6
    d.apply("w1", [BlockRemoved((chain[5],), medium="CPU")])
    assert d.match("w1", chain) == 5
    d.apply("w1", [{"type": "AllBlocksCleared"}])
    assert d.match("w1", chain) == 4                  # the shared copy remains
    # dict events as a JSON relay sends them, hex hashes
    d.apply("w3", {"ts": 0, "events": [{"type": "BlockStored", "block_hashes": [h.hex() for h in chain],
                                        "medium": "DISK"}]})
    assert d.match("w3", chain) == 10 and d.mediums("w3", chain[0]) == {"DISK", "REMOTE"}


def test_the_directory_is_bounded():
    d = PrefixDirectory(max_hashes=8)
    chain = chunk_hashes(prompt(16 * 20), 16)
    d.stored("w0", chain, "GPU")
    assert len(d) == 8 and d.forgotten == 12
    assert d.match("w0", chain) == 0                  # the oldest (the head) were forgotten: a miss
