"""`kvtier bench tiers` end to end on a tiny working set (shape and honesty, not speed)."""
import json
import subprocess
import sys


def kvtier(*args):
    return subprocess.run([sys.executable, "-m", "kvtier", *args], capture_output=True, text=True)


def test_bench_tiers_json_shape_and_same_run_baselines(tmp_path):
    (tmp_path / "file").write_text("x")      # --peer-env-dir under a file: LMCache's env cannot be built
    r = kvtier("bench", "tiers", "--data-dir", str(tmp_path / "d"), "--sizes", "64K", "1M",
               "--total-mib", "4", "--repeat", "1", "--lookup-keys", "100", "--peer", "sglang", "--json",
               "--peer", "lmcache", "--peer-env-dir", str(tmp_path / "file" / "envs"))
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)                      # stdout is exactly one JSON document
    host, nvme = doc["host"], doc["nvme"]
    for k in ("put_gbps", "get_gbps", "memcpy_gbps"):
        assert host[k] > 0
    for k in ("put_gbps", "get_gbps", "raw_write_gbps", "raw_read_gbps"):
        assert nvme[k] > 0
    assert nvme["io_engine"] in ("io_uring", "threads")
    assert [row["block_bytes"] for row in nvme["rows"]] == [64 << 10, 1 << 20]
    # ratios are computed from the numbers printed next to them
    row = nvme["rows"][0]
    assert abs(row["put_vs_raw"] - row["put_gbps"] / row["raw_write_gbps"]) < 1e-9
    assert doc["lookup"]["keys"] == 100 and doc["lookup"]["median_ms"] > 0
    single = nvme["single"]     # single puts also beside a raw write with one fdatasync per block
    assert abs(single["put_vs_raw_each_sync"] - single["put_gbps"] / single["raw_write_each_sync_gbps"]) < 1e-9
    sg = doc["peers"]["sglang"]
    try:
        from kvtier.engine_adapter.sglang import import_sglang_storage
        import_sglang_storage()
    except ImportError as exc:                      # engine packages not installed: says why
        assert sg.startswith("unavailable:"), (sg, exc)
    else:                                           # installed: HiCacheFile measured on the same sizes
        assert isinstance(sg, dict), sg
        assert [r["block_bytes"] for r in sg["rows"]] == [64 << 10, 1 << 20]
        assert all(r["put_gbps"] > 0 and r["get_gbps"] > 0 for r in sg["rows"])
    # a peer that cannot run is one line in its place, the rest of the document intact
    # (the peer's own rows: tests/test_peer_lmcache.py)
    assert doc["peers"]["lmcache"].startswith("unavailable: "), doc["peers"]["lmcache"]
    # nothing left behind but what --keep would keep
    assert not list((tmp_path / "d").glob("raw-*.bin"))


def test_bench_tiers_bad_input_is_one_line_exit_2(tmp_path):
    r = kvtier("bench", "tiers", "--data-dir", str(tmp_path), "--sizes", "1000", "--json")
    assert r.returncode == 2 and "Traceback" not in r.stderr and r.stdout == ""
    r = kvtier("bench", "tiers", "--data-dir", str(tmp_path), "--sizes", "8M", "--total-mib", "1")
    assert r.returncode == 2 and "smaller than the largest block" in r.stderr
    assert r.stderr.strip().count("\n") == 0


def test_plot_destination_is_checked_before_any_work(tmp_path):
    # regression (QA pass): `--plot DIR` used to run the whole benchmark and then write DIR.png
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "kvtier", "bench", "tiers", "--data-dir", str(tmp_path / "d"),
                        "--plot", str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr and ".png" in r.stderr
    assert not (tmp_path / "d").exists()  # refused before creating the data dir


def test_bench_tiers_tables_fit_an_80_column_terminal(tmp_path):
    # also a working set smaller than --io-mib (2 MiB < 4 MiB): the raw baseline's I/O shrinks to
    # the batch instead of the command dying of EINVAL in posix_fallocate(0 bytes)
    import os
    env = {**os.environ, "COLUMNS": "80"}          # what an 80-column terminal reports
    r = subprocess.run([sys.executable, "-m", "kvtier", "bench", "tiers", "--data-dir", str(tmp_path / "d"),
                        "--sizes", "64K", "--total-mib", "2", "--repeat", "1", "--lookup-keys", "10"],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert "…" not in r.stdout and max(len(line) for line in r.stdout.splitlines()) <= 80
    # the host and NVMe tables are there, each with its block column and its "all" row
    assert r.stdout.count("64 KiB") >= 2 and r.stdout.count("all") >= 2
