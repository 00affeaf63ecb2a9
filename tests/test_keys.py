"""Content-addressed block keys: chained blake2b over (parent, tokens, namespace)."""
import hashlib
import subprocess
import sys

import numpy as np
import pytest

from kvtier.store.keys import KEY_BYTES, ROOT_KEY, Namespace, block_key, chain_keys

NS = Namespace(model_id="Qwen/Qwen2.5-0.5B", dtype="bfloat16", layout="paged", tp_rank=0)


def test_key_is_the_documented_blake2b_chain():
    # restate the format independently: blake2b-128(parent | ns digest | len | u32 tokens)
    toks = [1, 2, 3, 4]
    ns_digest = hashlib.blake2b("\x1f".join(["Qwen/Qwen2.5-0.5B", "bfloat16", "paged", "0"]).encode(),
                                digest_size=16, person=b"kvtier.ns.v1").digest()
    payload = np.array(toks, "<u4").tobytes()
    want = hashlib.blake2b(ROOT_KEY + ns_digest + len(payload).to_bytes(8, "little") + payload,
                           digest_size=16, person=b"kvtier.block.v1").digest()
    assert block_key(None, toks, NS) == want
    assert len(want) == KEY_BYTES


def test_equal_prefixes_give_equal_keys_and_branches_diverge():
    a = list(range(100))
    b = list(range(64)) + [999] * 36           # same first 64 tokens, then a branch
    ka, kb = chain_keys(a, 16, NS), chain_keys(b, 16, NS)
    assert len(ka) == 6 and len(kb) == 6      # full blocks only
    assert ka[:4] == kb[:4] and ka[4] != kb[4]
    # a second pause extends the chain without recomputing the first blocks' keys
    assert chain_keys(a[64:96], 16, NS, parent=ka[3]) == ka[4:6]


def test_same_block_tokens_under_another_parent_or_namespace_differ():
    blk = list(range(16))
    assert block_key(None, blk, NS) != block_key(block_key(None, [7] * 16, NS), blk, NS)
    for other in (Namespace("Qwen/Qwen2.5-0.5B", "float16"), Namespace("other", "bfloat16"),
                  Namespace("Qwen/Qwen2.5-0.5B", "bfloat16", tp_rank=1),
                  Namespace("Qwen/Qwen2.5-0.5B", "bfloat16", layout="layer-first")):
        assert block_key(None, blk, other) != block_key(None, blk, NS)


def test_keys_are_stable_across_processes():
    # never Python hash(): another interpreter (other hash seed) computes the same key
    code = ("from kvtier.store.keys import Namespace, chain_keys; "
            "print(chain_keys(list(range(32)), 16, Namespace('m', 'fp16'))[-1].hex())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={"PYTHONHASHSEED": "123", "PATH": ""}, cwd=".", check=True).stdout.strip()
    assert out == chain_keys(list(range(32)), 16, Namespace("m", "fp16"))[-1].hex()


def test_partial_trailing_block_only_on_request():
    assert len(chain_keys(list(range(20)), 16, NS)) == 1
    assert len(chain_keys(list(range(20)), 16, NS, partial=True)) == 2


@pytest.mark.parametrize("bad", [[-1], [2**32], [1.5], [[1, 2]]])
def test_bad_token_ids_raise(bad):
    with pytest.raises(ValueError):
        block_key(None, bad, NS)


def test_bad_parent_namespace_and_block_size_raise():
    with pytest.raises(ValueError):
        block_key(b"short", [1], NS)
    with pytest.raises(ValueError):
        chain_keys([1, 2], 0, NS)
    with pytest.raises(ValueError):
        Namespace("", "fp16")
