"""`kvtier plan ...` reproduces the reference texts' worked examples, through the real CLI.

Every number asserted here is printed in ../shared/seeds (000: Napkin Math
0.1, 0.6, 0.7, figure 10 and the "keeping paused state resident" pitfall; 004:
Worked Examples 1-2, answers A2, A3, A5), rounded the way the text rounds it.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kvtier.cli.main import main

GB = 1e9


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    """Run `kvtier <argv>` in-process; returns (exit status, stdout, stderr)."""
    try:
        rc = main(list(argv))
    except SystemExit as exc:  # argparse errors exit through SystemExit(2)
        rc = exc.code
    out, err = capsys.readouterr()
    return rc, out, err


def cli_json(capsys, *argv: str) -> dict:
    rc, out, err = cli(capsys, *argv, "--json")
    assert rc == 0, err
    return json.loads(out)  # exactly one JSON document on stdout


# --- 000, Napkin Math 0.1: 195 / 48 / 12 trajectories -------------------------------------------

NM01 = ("plan", "capacity", "--model", "gqa-70b", "--hbm-gb", "687.2", "--weights-gb", "141.2",
        "--runtime-gb", "20", "--context", "8192", "32768", "131072", "--headroom", "0")


def test_napkin_0_1_concurrency_ceiling(capsys):
    doc = cli_json(capsys, *NM01)
    # m_token = 2 x 80 x 8 x 128 x 2 bytes = 327,680 bytes
    assert doc["m_token_bytes"] == 327_680
    # pool = 687.2 - 141.2 - 20 = 526.0 GB
    assert doc["kv_pool_bytes"] == pytest.approx(526.0 * GB)
    # footprints 2.7, 10.7, 42.9 GB
    assert [round(r["bytes_per_trajectory"] / GB, 1) for r in doc["rows"]] == [2.7, 10.7, 42.9]
    # 195, 48 and 12 concurrent trajectories
    assert [(r["context_tokens"], r["concurrency"]) for r in doc["rows"]] == [(8192, 195), (32768, 48), (131072, 12)]


def test_napkin_0_1_from_the_node_and_model_presets(capsys):
    # The h100x8 preset is the texts' node (8 x 80 GiB = 687.2 GB, 20 GB runtime); the gqa-70b preset's
    # 70.6e9 params x 2 bytes derive the 141.2 GB of weights without --weights-gb.
    doc = cli_json(capsys, "plan", "capacity", "--model", "gqa-70b", "--context", "8192", "32768", "131072")
    assert doc["weights_bytes"] == pytest.approx(141.2 * GB)
    assert round(doc["hbm_bytes"] / GB, 1) == 687.2
    assert [r["concurrency"] for r in doc["rows"]] == [195, 48, 12]


def test_napkin_0_1_from_a_full_geometry_needs_no_params(capsys):
    # The same example with gqa-70b's geometry spelled out and --weights-gb: --params is not needed
    # (it used to refuse: "give --model PRESET or --params").
    geometry = ("plan", "capacity", "--layers", "80", "--kv-heads", "8", "--head-dim", "128")
    doc = cli_json(capsys, *geometry, *NM01[4:])
    assert doc["m_token_bytes"] == 327_680 and doc["model"] == "custom"
    assert [r["concurrency"] for r in doc["rows"]] == [195, 48, 12]
    # Without --weights-gb the weights come from --params, so then it is required (and said so).
    rc, out, err = cli(capsys, *geometry, "--context", "8192", "--json")
    assert rc == 2 and out == ""
    assert "--params (or --weights-gb)" in err and "--layers" not in err


def test_napkin_0_1_table_without_json(capsys):
    rc, out, _ = cli(capsys, *NM01)
    assert rc == 0
    assert "526.00 GB" in out and "327,680" in out
    for n in ("195", "48", "12"):
        assert n in out
    with pytest.raises(json.JSONDecodeError):
        json.loads(out)  # a table, not JSON


# --- 000, Napkin Math 0.7: 36 unshared, 122 with a 24,576-token shared prefix --------------------

NM07 = ("plan", "capacity", "--model", "gqa-70b", "--params", "70e9", "--hbm-gb", "640", "--runtime-gb", "36",
        "--context", "32768", "--output-tokens", "2048", "--headroom", "0.10")


def test_napkin_0_7_unshared_and_shared(capsys):
    # Step 1-2: weights 70e9 x 2 = 140 GB; 140 + 36 = 176 GB static; pool 464 GB
    cold = cli_json(capsys, *NM07)
    assert cold["weights_bytes"] == pytest.approx(140 * GB)
    assert cold["kv_pool_bytes"] == pytest.approx(464 * GB)
    # Step 4: floor(0.9 x 464e9 / ((32,768 + 2,048) x 327,680)) = 36
    assert cold["rows"][0]["concurrency"] == 36
    # Step 5: the shared prefix (8.05 GB) is held once; private state is 8,192 + 2,048 tokens -> 122
    warm = cli_json(capsys, *NM07, "--shared-tokens", "24576")
    assert round(warm["shared_bytes"] / GB, 2) == 8.05
    assert warm["rows"][0]["bytes_per_trajectory"] == (8192 + 2048) * 327_680
    assert warm["rows"][0]["concurrency"] == 122


def test_napkin_0_7_per_device_figures_with_tp8(capsys):
    doc = cli_json(capsys, *NM07, "--tp", "8")
    # 17.5 GB of weights and 40 KiB of KV per token on each of the 8 devices; 58 GB KV pool each
    assert doc["per_device"]["weights_bytes"] == pytest.approx(17.5 * GB)
    assert doc["per_device"]["m_token_bytes"] == 40_960
    assert doc["per_device"]["kv_pool_bytes"] == pytest.approx(58 * GB)


# --- 000, Napkin Math 0.6: pricing a 45 s tool wait -----------------------------------------------

NM06 = ("plan", "breakeven", "--model", "gqa-70b", "--context", "32768", "--link-gbps", "512",
        "--prefill-tflops", "3560", "--wait", "45")


def test_napkin_0_6_pricing_a_45s_wait(capsys):
    doc = cli_json(capsys, *NM06)
    assert round(doc["kv_bytes"] / GB, 1) == 10.7
    assert round(doc["t_reload_s"] * 1e3) == 21        # 21 ms reload
    assert round(doc["t_roundtrip_s"] * 1e3) == 42     # 42 ms round trip
    assert round(doc["t_recompute_s"], 1) == 1.3       # 2 x 70.6e9 x 32,768 = 4.63e15 FLOPs at 3,560 TFLOP/s
    assert round(doc["reload_speedup"]) == 62          # "about 62x faster"
    assert round(doc["hold_gb_s"][0]) == 483           # 10.7 GB x 45 s
    # the point-estimate break-even (no shadow price on DRAM, no stall) is the round trip
    assert doc["breakeven_wait_s"] == pytest.approx(doc["t_roundtrip_s"])
    assert doc["decisions"] == [{"wait_s": 45.0, "action": "offload_host"}]


def test_napkin_0_6_quarter_bandwidth_still_wins_15x(capsys):
    # a quarter of the rated 512 GB/s
    doc = cli_json(capsys, "plan", "breakeven", "--model", "gqa-70b", "--context", "32768",
                   "--link-gbps", "128", "--prefill-tflops", "3560")
    assert round(doc["reload_speedup"]) == 15


# --- 000, figure 10 and the "keeping paused state resident" pitfall --------------------------------

FIG10 = ("plan", "breakeven", "--model", "gqa-70b", "--params", "70e9", "--link-gbps", "50",
         "--prefill-tflops", "400")


def test_figure_10_16k_pause(capsys):
    doc = cli_json(capsys, *FIG10, "--context", "16384", "--wait", "0.1", "1", "45")
    assert doc["kv_bytes"] == 5 * 2**30                 # 5.0 GiB of KV state
    assert round(doc["t_roundtrip_s"] * 1e3) == 215     # 215 ms round trip ...
    assert doc["breakeven_wait_s"] == pytest.approx(0.2147, abs=1e-4)  # ... is the crossover T*
    # The text prints 5.735 s; 2 x 70e9 x 16,384 / 400e12 = 5.7344 s.
    assert doc["t_recompute_s"] == pytest.approx(5.735, abs=1e-3)
    # below T* retain; above it, offload to host (no NVMe bandwidth given)
    assert [d["action"] for d in doc["decisions"]] == ["retain", "offload_host", "offload_host"]


def test_pitfall_32k_pause_on_pcie(capsys):
    doc = cli_json(capsys, *FIG10, "--context", "32768", "--wait", "45")
    assert round(doc["t_recompute_s"], 1) == 11.5       # "approximately 11.5 s"
    assert round(doc["t_reload_s"] * 1e3) == 215        # 10 GiB / 50 GB/s each way
    assert round(doc["t_roundtrip_s"] * 1e3) == 429     # the "430-millisecond round trip"
    assert round(doc["reload_speedup"]) == 53           # "the same 53x advantage"


def test_breakeven_shadow_prices_and_stall(capsys):
    base = cli_json(capsys, *FIG10, "--context", "16384")
    # T* = round trip x mu_hbm / (mu_hbm - mu_dram) + stall = 0.2147 x 4/3 + 0.05
    priced = cli_json(capsys, *FIG10, "--context", "16384", "--mu-hbm", "4", "--mu-dram", "1", "--stall-s", "0.05")
    assert priced["breakeven_wait_s"] == pytest.approx(base["t_roundtrip_s"] * 4 / 3 + 0.05)
    assert base["hold_gb_s"] == [] and base["decisions"] == []


def test_breakeven_nvme_and_recompute_actions(capsys):
    # NVMe given: a 10-minute wait is long enough that the NVMe round trip is < 1% of it
    doc = cli_json(capsys, *FIG10, "--context", "16384", "--nvme-gbps", "14", "--wait", "45", "600")
    assert doc["t_nvme_roundtrip_s"] > doc["t_roundtrip_s"]
    assert [d["action"] for d in doc["decisions"]] == ["offload_host", "offload_nvme"]
    # A link so slow that moving the state out and back costs more than rebuilding it
    slow = cli_json(capsys, "plan", "breakeven", "--model", "gqa-70b", "--params", "70e9", "--link-gbps", "0.5",
                    "--prefill-tflops", "400", "--context", "16384", "--wait", "60")
    assert slow["t_recompute_s"] < slow["t_roundtrip_s"]
    assert slow["decisions"][0]["action"] == "recompute"


def test_breakeven_table_without_json(capsys):
    rc, out, _ = cli(capsys, *NM06)
    assert rc == 0
    assert "21.0 ms" in out and "62.0x" in out and "offload_host" in out and "483.2 GB*s" in out


def test_table_7_cold_column_on_the_h100_node(capsys):
    # 000 Table 7, 8x H100 rows, cold (nothing shared): 155 / 38 / 19 / 9 at 8k / 32k / 64k / 128k
    doc = cli_json(capsys, "plan", "capacity", "--model", "gqa-70b", "--params", "70e9", "--hbm-gb", "640",
                   "--runtime-gb", "36", "--headroom", "0.10", "--context", "8192", "32768", "65536", "131072")
    assert [r["concurrency"] for r in doc["rows"]] == [155, 38, 19, 9]


def test_regimes_map_and_plot(capsys, tmp_path):
    png = tmp_path / "regimes.png"
    doc = cli_json(capsys, "plan", "regimes", "--model", "gqa-70b", "--params", "70e9", "--node", "pcie5-x16",
                   "--nvme-gbps", "14", "--context", "16384", "131072", "--wait", "0.1", "1", "60", "3600",
                   "--plot", str(png))
    # figure 10's 16k row: retain up to the 215 ms round trip, host DRAM for minutes, NVMe for an hour
    row16k = doc["rows"][0]
    assert round(row16k["retain_until_s"] * 1e3) == 215
    assert row16k["actions"] == ["retain", "offload_host", "offload_host", "offload_nvme"]
    # 8x the context: 8x the break-even, so a 1 s wait is retained now
    row128k = doc["rows"][1]
    assert row128k["retain_until_s"] == pytest.approx(8 * row16k["retain_until_s"])
    assert row128k["actions"][:2] == ["retain", "retain"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_presets_listing(capsys):
    doc = cli_json(capsys, "plan", "presets")
    by_name = {m["name"]: m for m in doc["models"]}
    assert by_name["llama-3.1-8b"]["m_token_bytes"] == 131_072
    assert by_name["deepseek-v3"]["mla_latent_dim"] == 576
    assert {n["name"] for n in doc["nodes"]} >= {"h100x8", "pcie5-x16"}
    rc, out, _ = cli(capsys, "plan", "presets")
    assert rc == 0 and "qwen3-32b" in out and "MLA 576" in out


# --- 004 Worked Example 1, A2, A3 (paging) --------------------------------------------------------


def test_004_worked_example_1(capsys):
    doc = cli_json(capsys, "plan", "paging", "--lengths", "47", "612", "130", "1900",
                   "--block-size", "16", "--max-seq-len", "2048")
    assert [r["blocks"] for r in doc["requests"]] == [3, 39, 9, 119]
    assert (doc["total_actual_tokens"], doc["paged_slots"], doc["naive_slots"]) == (2689, 2720, 8192)
    assert round(doc["paged_fragmentation_pct"], 2) == 1.14
    assert round(doc["naive_fragmentation_pct"], 2) == 67.18
    assert round(doc["memory_reduction_factor"], 2) == 3.01


def test_004_answers_a2_and_a3_block_size_tradeoff(capsys):
    # A2: block size 16, max 512, requests 25/200/33
    a2 = cli_json(capsys, "plan", "paging", "--lengths", "25", "200", "33", "--block-size", "16", "--max-seq-len", "512")
    assert [r["waste"] for r in a2["requests"]] == [7, 8, 15]
    assert (a2["block_table_entries"], a2["paged_slots"], a2["total_actual_tokens"]) == (18, 288, 258)
    assert round(a2["paged_fragmentation_pct"], 2) == 10.42
    assert round(a2["naive_fragmentation_pct"], 2) == 83.20
    assert round(a2["memory_reduction_factor"], 2) == 5.33
    # A3: the same requests with 64-token blocks: 6 blocks, 384 slots, 32.81% fragmentation
    a3 = cli_json(capsys, "plan", "paging", "--lengths", "25", "200", "33", "--block-size", "64", "--max-seq-len", "512")
    assert [r["waste"] for r in a3["requests"]] == [39, 56, 31]
    assert (a3["block_table_entries"], a3["paged_slots"]) == (6, 384)
    assert round(a3["paged_fragmentation_pct"], 2) == 32.81
    # A3's ripple on a 380-token shared prompt: 23 full blocks (368 tokens, 96.8%) at 16, 5 (320, 84.2%) at 64
    s16 = cli_json(capsys, "plan", "sharing", "--prefix-tokens", "380", "--suffix-tokens", "90", "--requests", "2",
                   "--block-size", "16")
    s64 = cli_json(capsys, "plan", "sharing", "--prefix-tokens", "380", "--suffix-tokens", "90", "--requests", "2",
                   "--block-size", "64")
    assert (s16["shareable_prefix_blocks"], s16["shareable_prefix_tokens"], round(s16["shareable_prefix_pct"], 1)) \
        == (23, 368, 96.8)
    assert (s64["shareable_prefix_blocks"], s64["shareable_prefix_tokens"], round(s64["shareable_prefix_pct"], 1)) \
        == (5, 320, 84.2)


# --- 004 Worked Example 2 and A5 (prefix sharing) -------------------------------------------------


def test_004_worked_example_2(capsys):
    doc = cli_json(capsys, "plan", "sharing", "--prefix-tokens", "380", "--suffix-tokens", "90",
                   "--requests", "500", "--block-size", "16")
    assert (doc["prefix_blocks"], doc["suffix_blocks"], doc["blocks_per_request_unshared"]) == (24, 6, 30)
    assert doc["without_sharing_blocks"] == 15_000
    assert doc["with_sharing_blocks"] == 3_024
    assert round(doc["reduction_factor"], 2) == 4.96


def test_004_answer_a5(capsys):
    doc = cli_json(capsys, "plan", "sharing", "--prefix-tokens", "512", "--suffix-tokens", "60",
                   "--requests", "1000", "--block-size", "16")
    assert (doc["prefix_blocks"], doc["suffix_blocks"]) == (32, 4)
    assert (doc["without_sharing_blocks"], doc["with_sharing_blocks"]) == (36_000, 4_032)
    assert round(doc["reduction_factor"], 2) == 8.93
    # 512 is a multiple of 16: sharing full blocks only costs nothing extra
    assert doc["strict_with_sharing_blocks"] == doc["with_sharing_blocks"]


# --- bad input: exit 2, one line naming the problem, no traceback, nothing on stdout ---------------

BAD = [
    (("capacity", "--model", "llama-9b", "--context", "1"), ["unknown model preset", "llama-3.1-8b", "deepseek-v3"]),
    (("breakeven", "--model", "nope", "--context", "1"), ["unknown model preset", "gqa-70b"]),
    (("capacity", "--node", "tpu", "--model", "gqa-70b", "--context", "1"), ["unknown node preset", "h100x8"]),
    (("capacity", "--model", "gqa-70b", "--context", "0"), ["--context", "positive"]),
    (("capacity", "--model", "gqa-70b", "--context", "-8"), ["--context", "positive"]),
    (("capacity", "--model", "gqa-70b", "--context", "lots"), ["--context", "'lots'"]),
    (("capacity", "--model", "gqa-70b", "--context", "8", "--hbm-gb", "0"), ["--hbm-gb"]),
    (("capacity", "--model", "gqa-70b", "--context", "8", "--hbm-gb", "100"), ["weights", "100.0 GB"]),
    (("capacity", "--model", "gqa-70b", "--context", "8", "--headroom", "1.5"), ["--headroom"]),
    (("capacity", "--model", "gqa-70b", "--context", "8", "--shared-tokens", "9"), ["shared prefix", "longer"]),
    (("capacity", "--layers", "80", "--context", "8"), ["--model", "--kv-heads", "--params"]),
    (("capacity", "--layers", "80", "--kv-heads", "8", "--head-dim", "0", "--params", "7e9", "--context", "8"),
     ["--head-dim"]),
    (("breakeven", "--model", "gqa-70b", "--context", "8", "--link-gbps", "fast"), ["--link-gbps", "'fast'"]),
    (("breakeven", "--model", "gqa-70b", "--context", "8", "--prefill-tflops", "-1"), ["--prefill-tflops"]),
    (("breakeven", "--model", "gqa-70b", "--context", "8", "--mu-hbm", "1", "--mu-dram", "2"), ["mu_hbm > mu_dram"]),
    (("breakeven", "--model", "gqa-70b", "--context", "8", "--wait", "-3"), ["--wait"]),
    (("paging", "--lengths", "3000", "--block-size", "16", "--max-seq-len", "2048"), ["3000", "2048"]),
    (("paging", "--lengths", "30", "--block-size", "0", "--max-seq-len", "2048"), ["--block-size"]),
    (("sharing", "--prefix-tokens", "380", "--suffix-tokens", "90", "--requests", "0", "--block-size", "16"),
     ["--requests"]),
    # finite inputs whose results overflow used to print `Infinity` (not JSON) with exit 0
    (("breakeven", "--model", "gqa-70b", "--context", "32768", "--wait", "1e308"),
     ["hold_gb_s[0]", "out of range"]),
    (("breakeven", "--model", "gqa-70b", "--context", "8", "--link-gbps", "1e-320"), ["t_reload_s", "out of range"]),
    # --plot to a missing directory used to end in a FileNotFoundError traceback; a name without
    # .png was silently written to NAME.png while the command reported NAME
    (("regimes", "--model", "gqa-70b", "--plot", "no-such-dir/x.png"), ["--plot", "does not exist"]),
    (("regimes", "--model", "gqa-70b", "--plot", "regimes"), ["--plot", ".png"]),
]


@pytest.mark.parametrize("argv,needles", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_exits_2_with_one_line(capsys, argv, needles):
    rc, out, err = cli(capsys, "plan", *argv, "--json")
    assert rc == 2
    assert out == ""
    assert "Traceback" not in err
    # one line that names the subcommand (no doubled "kvtier: error: kvtier ...")
    assert err.count("\n") == 1 and err.startswith(f"kvtier plan {argv[0]}: error: ")
    assert err.count("kvtier") == 1
    for needle in needles:
        assert needle in err


def test_real_console_entry_point_json_and_error():
    # The installed module entry runs in a fresh interpreter: JSON on stdout, errors as one line.
    ok = subprocess.run([sys.executable, "-m", "kvtier", *NM01, "--json"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert [r["concurrency"] for r in json.loads(ok.stdout)["rows"]] == [195, 48, 12]
    bad = subprocess.run([sys.executable, "-m", "kvtier", "plan", "capacity", "--model", "x", "--context", "1"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and bad.stdout == ""
    assert bad.stderr.strip().count("\n") == 0 and "known:" in bad.stderr


def test_plan_module_import_is_cheap():
    # kvtier.cli.plan and the tiering modules must not pull torch (layering and CLI start-up)
    code = ("import sys, kvtier.cli.main; kvtier.cli.main.build_parser(); import kvtier.tiering.model.capacity, kvtier.tiering.model.paging; "
            "print('torch' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"


@pytest.mark.parametrize("argv", [
    NM01, NM06 + ("--nvme-gbps", "7"), ("plan", "presets"), ("plan", "regimes", "--model", "gqa-70b"),
    ("plan", "sharing", "--prefix-tokens", "380", "--suffix-tokens", "90", "--requests", "10", "--block-size", "16"),
    ("plan", "paging", "--lengths", "47", "612", "130", "1900", "--block-size", "16", "--max-seq-len", "2048"),
], ids=lambda a: a[1])
def test_tables_fit_an_80_column_terminal_and_pipes_are_not_cut(capsys, monkeypatch, argv):
    monkeypatch.setenv("COLUMNS", "80")          # what an 80-column terminal reports
    rc, narrow, _ = cli(capsys, *argv)
    assert rc == 0 and "…" not in narrow
    assert max(len(line) for line in narrow.splitlines()) <= 80
    monkeypatch.delenv("COLUMNS")                 # a pipe: printed at the tables' natural width
    rc, piped, _ = cli(capsys, *argv)
    assert rc == 0 and "…" not in piped
    words = lambda text: sorted(w for w in text.split() if w.strip("┃│┏┓┗┛┡┩└┘━─┳┻╇╈┼┬┴"))
    assert words(piped) == words(narrow)          # the same content, only wrapped differently
