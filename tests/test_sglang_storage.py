"""kvtier as SGLang's HiCache L3 backend, driven through SGLang's own classes.

Runs against the real ``sglang`` package (0.5.23, installed with
``pip install --no-deps -r ci/requirements-engines.txt``): SGLang's
``StorageBackendFactory`` loads ``kvtier.engine_adapter.sglang.KvtierStorage`` the way
``--hicache-storage-backend dynamic`` does, keys are SGLang's own page hashes
(``get_hash_str``), and ``HiCacheFile`` is the peer.

SGLang's host pool class (``MHATokenToKVPoolHost``) cannot be imported on a
CPU-only machine (its module chain imports torchvision, whose PyPI wheels are
CUDA builds), so ``kvtier.bench.bench_sglang.PageFirstHostPool`` reproduces its ``page_first``
buffer and the page methods the storage layer calls, with the same shapes and
slicing (sglang/srt/mem_cache/pool_host/mha.py).
"""
from __future__ import annotations

import logging
import os

import pytest

torch = pytest.importorskip("torch")
from engines import gpu_install, need_engine, required  # noqa: E402

need_engine("sglang")
import kvtier.engine_adapter.sglang as ks  # noqa: E402

from sglang.srt.mem_cache.hicache_storage import HiCacheFile, HiCacheStorageConfig, HiCacheStorageExtraInfo  # noqa: E402
from sglang.srt.mem_cache.storage import StorageBackendFactory  # noqa: E402

from kvtier.bench.bench_sglang import PageFirstHostPool as _Pool  # noqa: E402  (SGLang's page_first layout)

PAGE = 4          # tokens per page
LAYERS, HEADS, DIM = 2, 2, 64
DTYPE = torch.float16
PAGE_BYTES = 2 * PAGE * LAYERS * HEADS * DIM * 2   # K and V, fp16 = 4096


def PageFirstHostPool(size_tokens: int, page_size: int = PAGE, dtype=DTYPE):
    return _Pool(size_tokens, page_size, LAYERS, HEADS, DIM, dtype)


def storage_config(extra: dict | None, model: str = "Qwen/Qwen2.5-0.5B", tp_rank: int = 0, tp_size: int = 1):
    return HiCacheStorageConfig(tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0,
                                attn_cp_size=1, is_mla_model=False, enable_storage_metrics=False,
                                is_page_first_layout=True, model_name=model, extra_config=extra)


def kvtier_extra(data_dir, **kw) -> dict:
    return {"backend_name": "kvtier", "module_path": "kvtier.engine_adapter.sglang", "class_name": "KvtierStorage",
            "interface_v1": 1, "data_dir": str(data_dir), "nvme_gb": 0.02, **kw}


def attach(extra: dict, pool: PageFirstHostPool, **cfg_kw):
    """What SGLang's cache controller does on attach: create, then register the pool."""
    backend = StorageBackendFactory.create_backend("dynamic", storage_config(extra, **cfg_kw), pool)
    backend.register_mem_pool_host(pool)
    return backend


@pytest.fixture(scope="module")
def page_hashes():
    """SGLang's own page keys for a 12-page token sequence (and a branch of it)."""
    from sglang.srt.mem_cache.utils import get_hash_str
    try:
        main = get_hash_str(list(range(1000, 1000 + 12 * PAGE)), None, page_size=PAGE)
    except Exception as exc:  # the hash is a C++ extension built on first use (g++, ninja, libssl)
        if required():
            raise
        pytest.skip(f"SGLang's native page hash could not be built here: {exc}")
    branch = get_hash_str(list(range(1000, 1000 + 6 * PAGE)) + [7] * (6 * PAGE), None, page_size=PAGE)
    return main, branch


def page_bytes(pool: PageFirstHostPool, token_index: int) -> bytes:
    return pool.get_data_page(token_index, flat=True).contiguous().view(torch.uint8).numpy().tobytes()


def test_pages_round_trip_bit_exact_after_reopen(tmp_path, page_hashes):
    keys = page_hashes[0][:8]
    # 1. SGLang loads the backend by module path and registers its host pool
    src = PageFirstHostPool(64)
    src.fill_random(1)
    b = attach(kvtier_extra(tmp_path), src)
    assert isinstance(b, ks.KvtierStorage)
    assert b.store.config.block_bytes == PAGE_BYTES
    # 2. back up 8 pages that sit at scattered host indices (pages 3, 0, 7, ...)
    order = [3, 0, 7, 1, 6, 2, 5, 4]
    idx = torch.cat([torch.arange(p * PAGE, (p + 1) * PAGE) for p in order])
    assert b.batch_set_v1(keys, idx) == [True] * 8
    want = [page_bytes(src, p * PAGE) for p in order]
    # 3. the server goes away (detach closes the backend)
    b.close()
    # 4. a new server attaches a fresh, empty pool to the same data_dir
    dst = PageFirstHostPool(64)
    b2 = attach(kvtier_extra(tmp_path), dst)
    assert b2.batch_exists(keys, HiCacheStorageExtraInfo(prefix_keys=None)) == 8
    # 5. prefetch into other host slots (reversed page order) and compare bytes
    dst_pages = list(range(15, 7, -1))
    didx = torch.cat([torch.arange(p * PAGE, (p + 1) * PAGE) for p in dst_pages])
    assert b2.batch_get_v1(keys, didx) == [True] * 8
    assert [page_bytes(dst, p * PAGE) for p in dst_pages] == want
    # 6. and the generic (non-v1) path reads the same bytes
    outs = [dst.get_dummy_flat_data_page() for _ in keys]
    got = b2.batch_get(keys, outs)
    assert all(g is o for g, o in zip(got, outs))
    assert [o.view(torch.uint8).numpy().tobytes() for o in outs] == want
    stats = b2.kvtier_stats()
    assert stats["pages_get_hit"] == 16 and stats["nvme_blocks"] == 8
    # the samples SGLang's metrics hook reports: one prefetch batch of 8 pages, no backup
    # since the reopen (two get paths ran: only the v1 prefetch is sampled), then drained
    samples = b2.take_samples()
    assert samples["prefetch_pgs"] == [8] and samples["backup_pgs"] == []
    assert len(samples["prefetch_bandwidth"]) == 1 and samples["prefetch_bandwidth"][0] > 0
    assert b2.take_samples() == {"prefetch_pgs": [], "backup_pgs": [], "prefetch_bandwidth": [],
                                 "backup_bandwidth": []}
    b2.store.check_integrity()
    b2.close()


def test_get_stats_hands_sglang_its_storage_metrics(tmp_path, page_hashes):
    """Where SGLang's metrics class imports (a GPU install), ``get_stats`` fills it
    with the drained samples; on CPU-only installs (no torchvision) this skips."""
    try:
        from sglang.srt.observability.metrics_collector import StorageMetrics
    except (ImportError, RuntimeError) as exc:  # its module chain imports torchvision's CUDA operators
        gpu_install("SGLang's StorageMetrics", exc)
    pool = PageFirstHostPool(32)
    pool.fill_random(9)
    b = attach(kvtier_extra(tmp_path), pool)
    b.batch_set_v1(page_hashes[0][:2], torch.arange(0, 2 * PAGE))
    m = b.get_stats()
    assert isinstance(m, StorageMetrics) and list(m.backup_pgs) == [2] and list(m.prefetch_pgs) == []
    assert b.take_samples()["backup_pgs"] == []
    b.close()


def test_batch_exists_reports_longest_stored_prefix(tmp_path, page_hashes):
    main, branch = page_hashes
    pool = PageFirstHostPool(64)
    pool.fill_random(2)
    b = attach(kvtier_extra(tmp_path), pool)
    # store pages 0..4 of the sequence, and page 6 (a gap at 5)
    idx = torch.arange(0, 5 * PAGE)
    assert all(b.batch_set_v1(main[:5], idx))
    assert all(b.batch_set_v1([main[6]], torch.arange(6 * PAGE, 7 * PAGE)))
    assert b.batch_exists(main[:12]) == 5          # stops at the gap, page 6 does not count
    assert b.batch_exists(main[6:8]) == 1
    # the branch shares the first 6 pages' tokens; 5 of them are stored
    assert branch[:5] == main[:5] and branch[6] != main[6]
    assert b.batch_exists(branch) == 5
    # prefetch of a partly stored run: the prefix loads, the rest reports False
    dst = PageFirstHostPool(64)
    b.register_mem_pool_host(dst)   # re-registration reopens the same store
    assert b.batch_get_v1(main[3:7], torch.arange(0, 4 * PAGE)) == [True, True, False, False]
    assert page_bytes(dst, 0) == page_bytes(pool, 3 * PAGE)
    b.close()


def test_same_pages_same_bytes_as_hicachefile(tmp_path, page_hashes):
    keys = page_hashes[0][:6]
    pool = PageFirstHostPool(32)
    pool.fill_random(3)
    # SGLang's own file backend and kvtier store the same pages through the generic path
    hf = HiCacheFile(storage_config({"file_storage_path": str(tmp_path / "hf")}), file_path=str(tmp_path / "hf"))
    kv = attach(kvtier_extra(tmp_path / "kv"), pool)
    values = [pool.get_data_page(i * PAGE) for i in range(6)]
    assert hf.batch_set(keys, values) is True
    assert kv.batch_set(keys, values) is True
    a = [pool.get_dummy_flat_data_page() for _ in keys]
    c = [pool.get_dummy_flat_data_page() for _ in keys]
    hf.batch_get(keys, a)
    kv.batch_get(keys, c)
    for x, y, v in zip(a, c, values):
        assert torch.equal(x.view(torch.uint8), y.view(torch.uint8))
        assert torch.equal(y.view(torch.uint8), v.view(torch.uint8))
    assert [hf.exists(k) for k in keys] == [kv.exists(k) for k in keys] == [True] * 6
    kv.close()


def test_bad_input_is_a_logged_miss_never_a_raise(tmp_path, page_hashes, caplog):
    keys = page_hashes[0][:4]
    pool = PageFirstHostPool(32)
    pool.fill_random(4)
    b = attach(kvtier_extra(tmp_path), pool)
    assert all(b.batch_set_v1(keys[:2], torch.arange(0, 2 * PAGE)))
    caplog.set_level(logging.WARNING, logger="kvtier.sglang")
    # unknown key: a miss
    assert b.batch_get_v1(["f" * 64], torch.arange(0, PAGE)) == [False]
    assert b.get("0" * 64, pool.get_dummy_flat_data_page()) is None
    assert b.exists("not-a-hash") is False
    # a key of the wrong type: a miss, logged
    assert b.batch_exists([None]) == 0
    # wrong page size (a target or a value of half a page)
    half = torch.zeros(PAGE_BYTES // 4, dtype=DTYPE)
    assert b.get(keys[0], half) is None
    assert b.set("new-key", half) is False
    assert not b.exists("new-key")
    # host indices that do not match the keys (3 tokens for one page)
    assert b.batch_set_v1([keys[3]], torch.arange(0, 3)) == [False]
    assert b.batch_get_v1(keys[:2], torch.arange(0, PAGE)) == [False, False]
    assert any("host indices" in r.getMessage() for r in caplog.records)
    # the stored pages are untouched by all of that
    assert b.batch_exists(keys) == 2
    b.store.check_integrity()
    # a closed store: every call answers a miss / False, nothing raises
    b.close()
    assert b.batch_exists(keys) == 0
    assert b.batch_get_v1(keys[:1], torch.arange(0, PAGE)) == [False]
    assert b.batch_set_v1(keys[2:3], torch.arange(0, PAGE)) == [False]
    assert b.batch_get(keys[:1], [pool.get_dummy_flat_data_page()]) == [None]
    assert b.set(keys[3], pool.get_data_page(0)) is False
    assert any("closed" in r.getMessage() for r in caplog.records)


def test_corrupt_page_on_disk_is_a_miss_not_wrong_data(tmp_path, page_hashes):
    keys = page_hashes[0][:3]
    pool = PageFirstHostPool(32)
    pool.fill_random(5)
    b = attach(kvtier_extra(tmp_path), pool)
    assert all(b.batch_set_v1(keys, torch.arange(0, 3 * PAGE)))
    b.close()
    # flip bytes of page 1 where the store keeps it on disk
    b = attach(kvtier_extra(tmp_path), pool)
    path, off = b.store.locate(ks.store_key(b._ns, keys[1]))
    with open(path, "r+b") as f:
        f.seek(off + 100)
        f.write(b"\xff" * 8)
        f.flush()
        os.fsync(f.fileno())
    b.close()
    dst = PageFirstHostPool(32)
    b = attach(kvtier_extra(tmp_path), dst)
    sentinel = torch.full((2, PAGE, LAYERS, HEADS, DIM), 7.0, dtype=DTYPE)
    dst.kv_buffer[:, 4 * PAGE:5 * PAGE] = sentinel
    # page 0 loads; page 1 fails its checksum, so the prefix ends there
    assert b.batch_get_v1(keys, torch.arange(3 * PAGE, 6 * PAGE)) == [True, False, False]
    assert page_bytes(dst, 3 * PAGE) == page_bytes(pool, 0)
    assert torch.equal(dst.kv_buffer[:, 4 * PAGE:5 * PAGE], sentinel)   # never overwritten with bad bytes
    assert b.batch_exists(keys) == 1                                    # the corrupt page is gone
    b.close()


def test_config_errors_are_clear_at_attach(tmp_path):
    pool = PageFirstHostPool(8)
    with pytest.raises(ValueError, match="data_dir"):
        attach({"backend_name": "kvtier", "module_path": "kvtier.engine_adapter.sglang", "class_name": "KvtierStorage"}, pool)
    with pytest.raises(ValueError, match=r"unknown option\(s\) \[.nvme_gbs.\]"):
        attach(kvtier_extra(tmp_path, nvme_gbs=1), pool)
    with pytest.raises(ValueError, match="page_bytes"):
        attach(kvtier_extra(tmp_path, page_bytes=PAGE_BYTES * 2), pool)
    with pytest.raises(ValueError, match="unknown policy"):
        attach(kvtier_extra(tmp_path, policy="nope", model="qwen2.5-0.5b"), pool)


def test_tool_hint_drives_placement(tmp_path, page_hashes):
    keys = page_hashes[0][:4]
    pool = PageFirstHostPool(32)
    pool.fill_random(6)

    def hint(tool):
        return HiCacheStorageExtraInfo(prefix_keys=None, extra_info={"kvtier": {"tool": tool, "trajectory_id": "t1"}})

    # a policy that always recomputes: hinted pages are not written; unhinted ones are
    b = attach(kvtier_extra(tmp_path / "a", policy="recompute", model="qwen2.5-0.5b"), pool)
    assert b.batch_set_v1(keys[:2], torch.arange(0, 2 * PAGE), hint("pytest")) == [False, False]
    assert b.batch_exists(keys) == 0
    assert all(b.batch_set_v1(keys[:2], torch.arange(0, 2 * PAGE)))
    assert b.batch_exists(keys) == 2
    assert b.kvtier_stats()["decisions"] == {"recompute": 1, "default:nvme": 1}
    b.close()
    # offload_host with a kvtier host tier: hinted pages land in host DRAM, unhinted on NVMe
    b = attach(kvtier_extra(tmp_path / "b", policy="offload_host", model="qwen2.5-0.5b", host_gb=0.001), pool)
    assert all(b.batch_set_v1(keys[:1], torch.arange(0, PAGE), hint("web_search")))
    assert all(b.batch_set_v1(keys[1:2], torch.arange(PAGE, 2 * PAGE)))
    where = [b.store.where(ks.store_key(b._ns, k)) for k in keys[:2]]
    assert [sorted(str(t) for t in w) for w in where] == [["host"], ["nvme"]]
    b.close()


def test_ranks_get_separate_stores_and_keys(tmp_path, page_hashes):
    keys = page_hashes[0][:2]
    p0, p1 = PageFirstHostPool(16), PageFirstHostPool(16)
    p0.fill_random(7)
    p1.fill_random(8)
    # two TP ranks of one server share data_dir but never each other's pages
    r0 = attach(kvtier_extra(tmp_path), p0, tp_rank=0, tp_size=2)
    r1 = attach(kvtier_extra(tmp_path), p1, tp_rank=1, tp_size=2)
    assert r0.root != r1.root and r0.root.parent == r1.root.parent
    assert all(r0.batch_set_v1(keys, torch.arange(0, 2 * PAGE)))
    assert r1.batch_exists(keys) == 0
    assert all(r1.batch_set_v1(keys, torch.arange(0, 2 * PAGE)))
    out = PageFirstHostPool(16)
    r1.register_mem_pool_host(out)
    assert all(r1.batch_get_v1(keys, torch.arange(0, 2 * PAGE)))
    assert page_bytes(out, 0) == page_bytes(p1, 0) != page_bytes(p0, 0)
    r0.close()
    r1.close()


def test_side_by_side_benchmark_reports_both_backends_bit_exact(tmp_path, capsys):
    import json

    from kvtier.bench.bench_sglang import main
    # a tiny run of the HiCacheFile-vs-kvtier benchmark: one JSON document, every read checked
    assert main(["--data-dir", str(tmp_path), "--pages", "4", "--page-tokens", "4", "--layers", "2",
                 "--repeat", "1", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["page_bytes"] == 2 * 4 * 2 * 4 * 128 * 2
    for name in ("hicachefile", "kvtier", "kvtier_generic"):
        assert doc[name]["bit_exact"] is True
        assert doc[name]["put_gbps"] > 0 and doc[name]["get_gbps" if name != "hicachefile" else "get_cold_gbps"] > 0
    assert set(doc["limits"]) == {"memcpy_gbps", "raw_write_gbps", "raw_read_gbps"}
    assert doc["raw_detail"]["raw_write_fresh_file"] is True and doc["raw_detail"]["raw_write_overwrite_gbps"] > 0
    # the raw write and read are paired per round with kvtier's put and get
    (rnd,) = doc["rounds"]
    assert rnd["raw"]["read_gbps"] > 0 and doc["raw_detail"]["raw_distinct_buffers"] is True
    assert doc["ratios_paired_median"]["kvtier_get_vs_raw_read"] == pytest.approx(
        rnd["kvtier"]["kv_get"] / rnd["raw"]["read_gbps"])
    assert not (tmp_path / "bench_sglang").exists()      # it cleans up after itself
    assert main(["--data-dir", str(tmp_path), "--pages", "0"]) == 2


def test_backup_and_prefetch_threads_at_once(tmp_path, page_hashes):
    import threading
    keys = page_hashes[0][:12]
    # one host pool, as in SGLang: slots 0..11 hold the pages being backed up,
    # slots 12..23 receive what the prefetch thread loads
    pool = PageFirstHostPool(24 * PAGE)
    pool.fill_random(9)
    pool.kv_buffer[:, 12 * PAGE:] = 0
    b = attach(kvtier_extra(tmp_path), pool)
    errors: list = []

    # SGLang's backup thread: stores the sequence 3 pages at a time, each batch twice
    def backup():
        try:
            for lo in range(0, 12, 3):
                for _ in range(2):
                    assert all(b.batch_set_v1(keys[lo:lo + 3], torch.arange(lo * PAGE, (lo + 3) * PAGE)))
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    # SGLang's prefetch thread: asks for the longest stored prefix and loads it, over and
    # over; every page it gets must be exactly the page stored (never torn, never another's)
    def prefetch():
        try:
            for _ in range(60):
                n = b.batch_exists(keys)
                got = b.batch_get_v1(keys[:n], torch.arange(12 * PAGE, (12 + n) * PAGE)) if n else []
                for i, ok in enumerate(got):
                    if ok:
                        assert page_bytes(pool, (12 + i) * PAGE) == page_bytes(pool, i * PAGE)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=backup), threading.Thread(target=prefetch)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert b.batch_exists(keys) == 12
    assert b.kvtier_stats()["pages_set"] == 12          # the second write of each batch stored nothing new
    b.store.check_integrity()
    b.close()


class _CopyingPool(_Pool):
    """A pool whose page accessor hands out copies (not views of the buffer):
    the page I/O must then go page by page through the flat-page methods."""

    def get_data_page(self, index, flat: bool = True):
        return super().get_data_page(index, flat).clone()


@pytest.mark.parametrize("pool_cls", [_Pool, _CopyingPool])
def test_runs_of_contiguous_pages_round_trip_bit_exact(tmp_path, page_hashes, pool_cls):
    """Pages at host indices mixing contiguous runs, jumps, a backwards step and
    the pool's last page come back bit-exact through the bulk (run) copies, and
    through the page-by-page path for a pool without views."""
    from sglang.srt.mem_cache.utils import get_hash_str
    keys = get_hash_str(list(range(5000, 5000 + 14 * PAGE)), None, page_size=PAGE)
    src = pool_cls(16 * PAGE, PAGE, LAYERS, HEADS, DIM, DTYPE)
    src.fill_random(9)
    b = attach(kvtier_extra(tmp_path, host_gb=0.0001), src)
    assert (b._io._linear is not None) == (pool_cls is _Pool)
    src_pages = [0, 1, 2, 3, 9, 10, 5, 6, 7, 15, 12, 13, 14, 11]     # runs 0-3, 9-10, 5-7, 12-14; 15 is the last page
    idx = torch.cat([torch.arange(p * PAGE, (p + 1) * PAGE) for p in src_pages])
    assert b.batch_set_v1(keys, idx) == [True] * 14
    want = [page_bytes(src, p * PAGE) for p in src_pages]
    dst = pool_cls(16 * PAGE, PAGE, LAYERS, HEADS, DIM, DTYPE)
    b2_dir = b.root
    b.close()
    b2 = attach(kvtier_extra(tmp_path, host_gb=0.0001), dst)
    assert b2.root == b2_dir
    dst_pages = [8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 4, 3, 2, 5]     # one long run to the end, then scattered
    didx = torch.cat([torch.arange(p * PAGE, (p + 1) * PAGE) for p in dst_pages])
    assert b2.batch_exists(keys) == 14
    assert b2.batch_get_v1(keys, didx) == [True] * 14
    assert [page_bytes(dst, p * PAGE) for p in dst_pages] == want
    # pool pages 6 and 7 were never targets: still zero
    assert not dst.kv_buffer[:, 6 * PAGE:8 * PAGE].any()
    b2.close()


@pytest.mark.parametrize("node,read", [("h100x8", 2), ("pcie4", 4)])
def test_a_page_kept_only_on_nvme_ends_the_prefix_where_its_read_costs_more_than_its_prefill(
        tmp_path, page_hashes, node, read):
    # the seed's 70B: on 8 x H100 one 7 GB/s drive reads a page slower than the node prefills it
    keys = page_hashes[0][:4]
    pool = PageFirstHostPool(32)
    pool.fill_random(10)
    b = attach(kvtier_extra(tmp_path, policy="breakeven", model="llama-3.1-70b", node=node, host_gb=0.001), pool)
    for k in keys[:2]:                                   # pages 0-1 in host frames
        assert b.store.put(ks.store_key(b._ns, k), bytes(PAGE_BYTES), namespace=b._ns, tier="host")
    assert all(b.batch_set_v1(keys[2:], torch.arange(2 * PAGE, 4 * PAGE)))    # 2-3: the default tier, NVMe
    assert [sorted(str(t) for t in b.store.where(ks.store_key(b._ns, k))) for k in keys] == \
        [["host"], ["host"], ["nvme"], ["nvme"]]
    assert b.batch_exists(keys) == read
    assert b.kvtier_stats()["read_skips"] == (1 if read < 4 else 0)
    b.close()
