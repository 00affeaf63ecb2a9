"""The parts the live vLLM path is built from, tested without an engine:
paged row copies (dma/paged_rows.py), the vLLM version range, the engine's
geometry and parameters, prefix trajectories, the boundary's rate-limited log."""
from __future__ import annotations

import logging
from dataclasses import replace

import pytest
import torch

from kvtier.dma.paged_rows import plan_rows, run_copies
from kvtier.engine_adapter.firewall import Firewall, RateLimitedLog, guarded
from kvtier.engine_adapter.geometry import EngineFacts, dtype_bytes, params_of, resolve
from kvtier.engine_adapter.prefix_trajectories import PrefixTrajectories
from kvtier.engine_adapter.vllm_version import UnsupportedVllm, check_vllm_version, manager_lock


# ---------------------------------------------------------------- paged rows
def test_paged_rows_round_trip_with_an_unaligned_first_chunk():
    bpc, page = 4, 8
    engine = [torch.arange(16 * page, dtype=torch.int8).view(16, page).clone()]
    host = [torch.zeros(6, bpc, page, dtype=torch.int8)]
    # blocks 7, 2, 9 of a request whose first one is logical block 5: skip 1 sub-block of chunk 3
    copies = plan_rows([7, 2, 9], [3], group_sizes=[3], block_indices=[5], blocks_per_chunk=bpc,
                       group_tensors=[[(0, page)]])
    assert run_copies(copies, engine, host, to_host=True) == 3 * page
    assert torch.equal(host[0][3, 1], engine[0][7]) and torch.equal(host[0][3, 3], engine[0][9])
    assert not host[0][3, 0].any()                                # the skipped sub-block is untouched
    back = [torch.zeros_like(engine[0])]
    run_copies(plan_rows([1, 4, 5], [3], group_sizes=[3], block_indices=[5], blocks_per_chunk=bpc,
                         group_tensors=[[(0, page)]]), back, host, to_host=False)
    assert torch.equal(back[0][1], engine[0][7]) and torch.equal(back[0][5], engine[0][9])


def _torch_copies(copies, engine, host, *, to_host):
    from kvtier.dma import paged_rows
    for c in copies:
        paged_rows._copy_torch(c, engine[c.tensor], host[c.tensor], to_host=to_host)
    return sum(len(c.engine_rows) * c.nbytes for c in copies)


@pytest.mark.parametrize("copy", [run_copies, _torch_copies], ids=["numpy", "torch"])
@pytest.mark.parametrize("nbytes", [12, 6, 3])
def test_paged_rows_copy_a_page_prefix_whatever_word_fits_it(nbytes, copy):
    # 12-byte pages (CPU tensors go through numpy; other devices through torch's index kernels, there
    # 12 bytes as int32 words, 6 as int16, 3 as bytes); the rest of each page stays
    page = 12
    engine = [torch.arange(5 * page, dtype=torch.int8).view(5, page).clone()]
    host = [torch.full((3, 2, page), -1, dtype=torch.int8)]
    copies = plan_rows([4, 1], [2], group_sizes=[2], block_indices=[0], blocks_per_chunk=2,
                       group_tensors=[[(0, nbytes)]])
    assert copy(copies, engine, host, to_host=True) == 2 * nbytes
    assert torch.equal(host[0][2, 0, :nbytes], engine[0][4, :nbytes])
    assert torch.equal(host[0][2, 1, :nbytes], engine[0][1, :nbytes])
    assert (host[0][2, :, nbytes:] == -1).all() and (host[0][:2] == -1).all()
    back = [torch.zeros_like(engine[0])]
    copy(plan_rows([0, 3], [2], group_sizes=[2], block_indices=[0], blocks_per_chunk=2,
                         group_tensors=[[(0, nbytes)]]), back, host, to_host=False)
    assert torch.equal(back[0][0, :nbytes], engine[0][4, :nbytes]) and not back[0][:, nbytes:].any()


def test_paged_rows_two_groups_and_partial_pages():
    copies = plan_rows([0, 1, 2], [0, 1], group_sizes=[2, 1], block_indices=[0, 2], blocks_per_chunk=2,
                       group_tensors=[[(0, 4)], [(1, 3)]])
    assert [(c.tensor, list(c.chunks), list(c.subs), c.nbytes) for c in copies] == \
        [(0, [0, 0], [0, 1], 4), (1, [1], [0], 3)]
    with pytest.raises(ValueError, match="needs"):
        plan_rows([0, 1, 2], [0], group_sizes=[3], block_indices=[0], blocks_per_chunk=2, group_tensors=[[(0, 4)]])
    with pytest.raises(ValueError, match="use"):
        plan_rows([0], [0, 1], group_sizes=[1], block_indices=[0], blocks_per_chunk=2, group_tensors=[[(0, 4)]])


# ---------------------------------------------------------------- vLLM version
def test_vllm_version_range_and_manager_lock():
    assert check_vllm_version("0.32.0") == "0.32" and check_vllm_version("0.33.0+cpu") == "0.33"
    for bad in ("0.31.2", "0.34.0", "1.0.0"):
        with pytest.raises(UnsupportedVllm, match="0.32 and 0.33"):
            check_vllm_version(bad)

    class Old:      # vLLM 0.32's manager: no lock of its own
        pass

    class New:
        lock = object()
    old = Old()
    assert manager_lock(old) is manager_lock(old)                 # one lock per manager, kept
    assert manager_lock(New()) is New.lock


# ---------------------------------------------------------------- geometry
def test_params_and_geometry_from_a_hugging_face_config():
    llama_8b = {"hidden_size": 4096, "num_hidden_layers": 32, "vocab_size": 128256, "num_attention_heads": 32,
                "num_key_value_heads": 8, "intermediate_size": 14336, "tie_word_embeddings": False}
    params, active = params_of(llama_8b)
    assert 7.9e9 < params < 8.1e9 and active is None                  # Llama-3.1-8B: 8.03 B
    moe = {**llama_8b, "num_local_experts": 8, "num_experts_per_tok": 2}
    total, act = params_of(moe)
    assert total > 4 * params and params * 0.9 < act < total / 2
    with pytest.raises(ValueError, match="hidden_size"):
        params_of({"vocab_size": 10})
    facts = EngineFacts(name="org/unknown-model", layers=32, kv_heads=8, head_dim=128, dtype_bytes=2,
                        params=params, token_bytes=131072, kv_pool_bytes=40 * 2 ** 30, device="cuda")
    p = resolve(model=None, node=None, facts=facts)
    assert p.source == "engine" and p.geometry.token_bytes == 131072 and p.geometry.params == params
    assert p.node.hbm_bytes == 40 * 2 ** 30
    assert resolve(model="llama-3.1-8b", node=None, facts=facts).source == "preset"
    with pytest.raises(ValueError, match="did not describe"):
        resolve(model=None, node=None, facts=None)
    assert EngineFacts.from_dict(facts.as_dict()) == facts
    with pytest.raises(ValueError, match="layers"):
        EngineFacts.from_dict({**facts.as_dict(), "layers": 0})
    assert dtype_bytes("torch.bfloat16") == 2 and dtype_bytes(torch.float32) == 4 and dtype_bytes("fp8") == 1


# ---------------------------------------------------------------- prefix trajectories
def test_measured_node_prices_with_this_node_and_leaves_no_probe(tmp_path):
    from kvtier.engine_adapter.geometry import PROBE_FILE, measure_node
    facts = EngineFacts(name="m", layers=4, kv_heads=2, head_dim=64, dtype_bytes=4, params=12.3e6, device="cpu")
    m = measure_node(facts, tmp_path / "store", host_bytes=3 << 20, chunk=128 << 10)
    hw, default = m.node(), facts.node()
    assert hw.nvme_read_bps == m.nvme_read_bps > 0 and hw.nvme_write_bps == m.nvme_write_bps > 0
    assert hw.link_h2d_bps == hw.link_d2h_bps == m.link_bps > 0 and hw.host_bytes == 3 << 20
    assert default.nvme_read_bps != hw.nvme_read_bps and default.host_bytes > hw.host_bytes
    assert not (tmp_path / "store" / PROBE_FILE).exists()
    assert EngineFacts.from_dict(m.as_dict()) == m
    with pytest.raises(ValueError, match="nvme_read_bps"):
        EngineFacts.from_dict({**m.as_dict(), "nvme_read_bps": -1.0})
    capped = measure_node(facts, tmp_path / "store", chunk=128 << 10, nvme_cap_bps=1e6)   # a throttled store
    assert capped.nvme_read_bps == capped.nvme_write_bps == 1e6 < m.nvme_read_bps
    gpu = measure_node(replace(facts, device="cuda"), tmp_path / "g")
    assert gpu.link_bps is None and gpu.node().link_h2d_bps == replace(facts, device="cuda").node().link_h2d_bps


def test_prefix_trajectories_join_by_the_latest_tail_and_stay_bounded():
    pt = PrefixTrajectories(cap=3, tail_blocks=2)
    system = [b"sys0", b"sys1"]                                    # a shared system prompt at the head
    a = pt.propose("r1", system + [b"a0", b"a1"])
    b = pt.propose("r2", system + [b"b0"])
    assert (pt.adopt("r1"), pt.adopt("r2")) == (a, b)
    assert a != b and a.startswith("prefix:") and pt.started == 2 and pt.joined == 0
    pt.finished("r1", system + [b"a0", b"a1", b"a2"])              # its tail: a1, a2
    pt.finished("r2", system + [b"b0", b"b1"])
    assert pt.propose("r3", system + [b"a0", b"a1", b"a2", b"a3"]) == a      # extends a
    assert pt.adopt("r3") == a and pt.joined == 1
    pt.propose("r9", system + [b"z"])
    pt.bind("r9", "named")                                        # a request that names its trajectory
    assert pt.adopt("r9") == "named" and pt.started == 2          # ... is not counted as found by prefix
    assert pt.propose("r4", system + [b"c0"]) not in (a, b)        # shares only the head: a new one
    assert pt.propose("r5", []) is None                           # shorter than a block
    for i in range(20):                                           # bounded whatever is sent
        pt.propose(f"x{i}", [bytes([i])])
        pt.finished(f"x{i}", [bytes([i]), bytes([i, i])])
    assert pt.stats()["prefix_tails"] <= 6


# ---------------------------------------------------------------- the boundary
def test_rate_limited_log_and_guarded(caplog):
    now = [0.0]
    caplog.set_level(logging.WARNING, logger="kvtier.test")
    rl = RateLimitedLog(logging.getLogger("kvtier.test"), every_s=60, clock=lambda: now[0])
    assert rl.warn("k", "first") and not rl.warn("k", "second")
    now[0] = 61.0
    assert rl.warn("k", "third")
    assert [r.getMessage() for r in caplog.records] == ["kvtier: first",
                                                        "kvtier: third (1 more since the last such line)"]

    class Plugin:
        firewall = Firewall(logging.getLogger("kvtier.test"))

        @guarded(factory=lambda keys: [False] * len(keys))
        def batch(self, keys):
            raise OSError("disk gone")

        @guarded(fallback=0)
        def count(self):
            raise KeyboardInterrupt      # not an Exception: passes through
    p = Plugin()
    assert p.batch([1, 2, 3]) == [False, False, False]
    assert p.firewall.counts() == {"contained:batch": 1, "contained_errors": 1, "errors": 0}
    with pytest.raises(KeyboardInterrupt):
        p.count()
