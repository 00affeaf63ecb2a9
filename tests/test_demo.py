"""`kvtier demo`: the end-to-end agent loop reports every resumed turn equal to the uninterrupted run,
shows each of the four actions, and prints a table that survives a pipe."""
from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys

import pytest

from kvtier.cli.demo import SCRIPT, _print_table, run_demo

ACTIONS = {"retain", "offload_host", "offload_nvme", "recompute"}


@pytest.fixture(scope="module")
def doc(tmp_path_factory):
    # the whole loop with the tool sleeps fast-forwarded to 0: the policy learns the scripted waits,
    # so its decisions are those of a full-speed run; the store lives in a pytest temp dir
    return run_demo(time_scale=0.0, data_dir=str(tmp_path_factory.mktemp("demo") / "data"), tokens=4)


def test_demo_json_contract_and_all_turns_match(doc):
    assert doc["all_match"] is True
    assert len(doc["turns"]) == len(SCRIPT)
    for t in doc["turns"]:
        assert {"tool", "wait_s", "action", "bytes_moved", "resume_stall_s", "matches_reference"} <= set(t)
        assert t["action"] in ACTIONS
        assert t["matches_reference"] is True
        # an offload moved bytes at its pause unless every block was already stored
        if t["action"].startswith("offload"):
            assert t["bytes_moved"] > 0 or t["blocks_reused"] > 0
        else:
            assert t["bytes_moved"] == 0
    assert doc["store"]["misses"] == 0
    # every pause went through the lifecycle controller the engine plugins use, and was released by it
    assert doc["lifecycle"]["pauses"] == doc["lifecycle"]["resumes"] == len(SCRIPT)


def test_demo_shows_all_four_actions_each_the_cheapest_by_the_policys_costs(doc):
    # every run covers retain, host, NVMe and recompute ...
    assert {t["action"] for t in doc["turns"]} == ACTIONS
    for t in doc["turns"]:
        # ... and each was the policy's own minimum-expected-cost choice, with a clear margin
        costs = t["costs"]
        assert t["decided"] == t["action"] and min(costs, key=costs.get) == t["action"]
        runner_up = min(v for k, v in costs.items() if k != t["action"])
        assert runner_up > 1.2 * costs[t["action"]], (t["tool"], costs)
        # the policy learned the scripted wait, not the (fast-forwarded) wall time
        assert t["wait_s"] == next(s.wait_s for s in SCRIPT if s.tool == t["tool"])
    # the reasons line up with the tools: a quick grep stays, a long predictable build goes to NVMe,
    # a short pytest goes to host DRAM, an unpredictable human review is recomputed
    by_tool = {t["tool"]: t["action"] for t in doc["turns"]}
    assert by_tool == {"grep": "retain", "docker_build": "offload_nvme", "pytest": "offload_host",
                       "human_review": "recompute"}


def test_table_is_not_cut_when_stdout_is_not_a_terminal(doc):
    buf = io.StringIO()                       # not a TTY: rich would default to 80 columns
    with contextlib.redirect_stdout(buf):
        _print_table(doc)
    out = buf.getvalue()
    assert "…" not in out                     # no truncated cell
    for t in doc["turns"]:
        assert f" {t['tool']} " in out       # every tool name in full
    assert "recompute" in out and "NVMe" in out and "host" in out


def test_table_fits_an_80_column_terminal(doc):
    from kvtier.util.console import make_console
    buf = io.StringIO()
    _print_table(doc, make_console(width=80, file=buf, force_terminal=True, color_system=None))
    lines = buf.getvalue().splitlines()
    assert max(len(ln) for ln in lines) <= 80
    assert "…" not in buf.getvalue()
    table = [ln for ln in lines if ln.startswith("│")]
    assert len(table) == len(doc["turns"]) and all(ln.endswith("│") for ln in table)   # not cropped
    for row, t in zip(table, doc["turns"]):
        assert f" {t['tool']} " in row and "yes" in row
    assert "left out" in buf.getvalue()          # the narrower layout says what it dropped


def test_demo_cli_prints_one_json_document_and_rejects_bad_input():
    r = subprocess.run([sys.executable, "-m", "kvtier", "demo", "--json", "--time-scale", "0",
                        "--model", "qwen2", "--tokens", "3"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)                       # nothing but the document on stdout
    assert doc["all_match"] is True and doc["model"]["arch"] == "qwen2"
    assert {t["action"] for t in doc["turns"]} == ACTIONS
    bad = subprocess.run([sys.executable, "-m", "kvtier", "demo", "--tokens", "0"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "--tokens" in bad.stderr


@pytest.mark.parametrize("argv,needle", [
    # each of these used to end in a traceback (or, for a huge --tokens, run past the model's positions)
    (["--time-scale", "inf"], "--time-scale"),                 # OverflowError in time.sleep
    (["--tokens", "100000"], "--tokens"),                     # context past max_position_embeddings
    (["--data-dir", "{file}"], "not a directory"),           # FileExistsError from the store
    (["--data-dir", "{file}/sub"], "cannot create --data-dir"),  # NotADirectoryError
])
def test_demo_hostile_input_exits_2_with_one_line(tmp_path, argv, needle):
    from kvtier.cli.main import main
    f = tmp_path / "plain-file"
    f.write_text("x")
    argv = [a.format(file=f) for a in argv]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["demo", "--json", *argv])
    assert rc == 2 and out.getvalue() == ""
    assert needle in err.getvalue() and err.getvalue().count("\n") == 1


def test_demo_on_vllm_without_a_runnable_vllm_is_one_line_naming_the_install(capsys):
    from kvtier.engine_adapter.vllm_inprocess import VllmMissing, require_live_vllm
    try:
        require_live_vllm()
    except (VllmMissing, RuntimeError):
        pass
    else:
        pytest.skip("a runnable vLLM is installed here (tests/live runs the demo)")
    from kvtier.cli.main import main
    assert main(["demo", "--engine", "vllm"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "ci/live-env.sh" in err and "Traceback" not in err
