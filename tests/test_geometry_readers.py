"""geometry.py is where every engine plugin reads the served model's geometry:
a Hugging Face config's KV shape (the transformers hook), SGLang's host pool,
vLLM's offloading spec with the model's local config."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

transformers = pytest.importorskip("transformers")

from kvtier.engine_adapter import geometry  # noqa: E402
from kvtier.engine_adapter.geometry import KvShape, facts_from_sglang_pool, facts_from_vllm_spec, kv_shape  # noqa: E402


def llama(**kw):
    base = dict(num_attention_heads=8, num_key_value_heads=2, hidden_size=512, num_hidden_layers=4,
                vocab_size=1000, intermediate_size=1024)
    return transformers.LlamaConfig(**{**base, **kw})


def test_the_kv_shape_of_a_grouped_query_decoder():
    assert kv_shape(llama()) == KvShape(layers=4, kv_heads=2, head_dim=64)      # 512 / 8 heads
    assert kv_shape(llama(head_dim=128)).head_dim == 128                       # an explicit head_dim wins
    assert kv_shape(llama(num_key_value_heads=None)).kv_heads == 8             # no GQA: every head


def test_a_multimodal_configs_text_part_is_read():
    text = llama(num_hidden_layers=6)
    outer = SimpleNamespace(text_config=text)                                   # no get_text_config of its own
    assert kv_shape(outer).layers == 6


def test_sglang_pool_and_vllm_spec_read_the_same_model(monkeypatch):
    monkeypatch.setattr(geometry, "hf_config_of", lambda name: llama() if name == "m" else None)
    pool = SimpleNamespace(layer_num=4, head_num=1, head_dim=64)               # one rank of tp=2
    f = facts_from_sglang_pool("m", pool, tp=2, dtype="bfloat16", page_bytes=2 * 4 * 1 * 64 * 2 * 16,
                               page_size=16)
    assert (f.layers, f.kv_heads, f.head_dim, f.dtype_bytes, f.token_bytes) == (4, 2, 64, 2.0, 2048)
    spec = SimpleNamespace(model=SimpleNamespace(name="m", dtype="bfloat16"),
                           groups=[SimpleNamespace(layer_names=("a", "b")), SimpleNamespace(layer_names=("c", "d"))])
    v = facts_from_vllm_spec(spec, token_bytes=2048, device="cpu")
    assert (v.layers, v.kv_heads, v.head_dim, v.params, v.device) == (4, 2, 64, f.params, "cpu")
    with pytest.raises(ValueError):
        facts_from_sglang_pool("unknown", pool, tp=2, dtype="bfloat16", page_bytes=4096, page_size=16)
    assert facts_from_vllm_spec(SimpleNamespace(model=SimpleNamespace(name="unknown", dtype="bfloat16")),
                                token_bytes=None, device="cpu") is None
