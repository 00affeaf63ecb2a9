"""Every bad input we know of ends in one line on stderr and exit 2 (or a quiet exit 0 where that is
right), never a traceback.  Each case runs the real CLI in a child process, from a directory outside
the repository, with no KVTIER_* variables but the case's own.

The table in docs/cli.md is printed from these cases by ``python tests/test_cli_bad_inputs.py``.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import pytest


@dataclass(frozen=True)
class Case:
    argv: tuple[str, ...]
    needle: str                  # in the one stderr line ("" where nothing is printed)
    rc: int = 2
    env: dict = field(default_factory=dict)
    blocked: tuple[str, ...] = ()   # packages the child sees as not installed
    closed_stdout: bool = False     # the reader of stdout has gone (`... | head -0`)
    files: dict = field(default_factory=dict)   # name -> content, written into the cwd first
    lines: int = 1                  # stderr lines (a note line where a sample was read)


TRACE = "t.jsonl"   # written by the fixture: a small agent trace in the cwd
CASES: dict[str, Case] = {
    # the inputs issue 36 lists
    "json into a closed pipe": Case(("plan", "presets", "--json"), "", rc=0, closed_stdout=True, lines=0),
    "table into a closed pipe": Case(("plan", "presets"), "", rc=0, closed_stdout=True, lines=0),
    "help into a closed pipe": Case(("bench", "simulate", "--help"), "", rc=0, closed_stdout=True, lines=0),
    "bench engine --engine vllm without vLLM": Case(
        ("bench", "engine", "--engine", "vllm", "--trace", TRACE, "--sessions", "1"),
        "needs the 'vllm' package: pip install vllm", blocked=("vllm",)),
    "bench engine --engine sglang without SGLang": Case(
        ("bench", "engine", "--engine", "sglang", "--trace", TRACE, "--sessions", "1"),
        "needs the 'sglang' package: pip install sglang", blocked=("sglang",)),
    "bench service without the service extra": Case(
        ("bench", "service", "--requests", "1"), "needs the 'fastapi' package: pip install 'kvtier[service]'",
        blocked=("fastapi",)),
    "serve without fastapi": Case(("serve", "--port", "0", "--data-dir", "d"),
                                  "needs the 'fastapi' package: pip install 'kvtier[service]'", blocked=("fastapi",)),
    "bench live without vLLM": Case(("bench", "live",), "a live vLLM engine needs a runnable vLLM",
                                    blocked=("vllm",)),
    "bench live --url with nothing listening": Case(("bench", "live", "--url", "http://127.0.0.1:9"),
                                                    "connection refused (is `vllm serve` running there?)"),
    "soak --live with an unknown fault kind": Case(("bench", "soak", "--live", "--faults", "redis-kill,nope"),
                                                   "argument --faults: unknown fault kind 'nope'"),
    "soak --live with fs-full and no mount": Case(("bench", "soak", "--live", "--faults", "fs-full", "--data-mib", "0"),
                                                  "argument --faults: fs-full needs kvtier's data dir on a "
                                                  "size-limited mount: --data-mib 0"),
    "negative block size": Case(("bench", "tiers", "--data-dir", "d", "--sizes", "-64K"),
                                "argument --sizes: block sizes must be positive multiples of 4096, got '-64K'"),
    "zero block size": Case(("bench", "tiers", "--data-dir", "d", "--sizes", "0"),
                            "block sizes must be positive multiples of 4096, got '0'"),
    "bad io engine in the environment": Case(("bench", "tiers", "--data-dir", "d"),
                                             "io_engine from KVTIER_IO_ENGINE must be one of",
                                             env={"KVTIER_IO_ENGINE": "bogus"}),
    "trace command outside the repository": Case(("bench", "trace", "mooncake", "--out", "mc.jsonl"),
                                                 "note: read the packaged mooncake sample", rc=0),
    "predictor outside the repository": Case(("bench", "predictor", "--skip-decide", "--json"),
                                             "note: read the TraceLab example shipped with kvtier", rc=0),
    # more bad numbers
    "zero context": Case(("plan", "capacity", "--model", "llama-3.1-8b", "--context", "0"),
                         "argument --context: expected a positive integer, got '0'"),
    "negative exponent": Case(("plan", "capacity", "--model", "llama-3.1-8b", "--context", "-1e3"),
                              "argument --context: expected a positive integer, got '-1e3'"),
    "NaN bandwidth": Case(("plan", "breakeven", "--model", "llama-3.1-8b", "--context", "1000",
                           "--link-gb-per-s", "nan"), "argument --link-gb-per-s: expected a positive number, got 'nan'"),
    "negative bandwidth, old spelling": Case(("bench", "simulate", "--synth", "2", "--link-gbps", "-3"),
                                             "expected a positive number, got '-3'"),
    "overflowing wait": Case(("plan", "breakeven", "--model", "llama-3.1-8b", "--context", "1000", "--wait", "1e400"),
                             "argument --wait: expected a number >= 0, got '1e400'"),
    "port out of range": Case(("serve", "--port", "70000", "--data-dir", "d"), "--port must be in 0..65535"),
    "zero clients": Case(("bench", "service", "--clients", "0"), "argument --clients: expected a positive integer"),
    # bad presets, policies, --set
    "unknown model preset": Case(("plan", "capacity", "--model", "llama-9", "--context", "1000"),
                                 "argument --model: unknown model preset 'llama-9'"),
    "unknown node preset": Case(("bench", "simulate", "--synth", "2", "--node", "laptop"),
                                "argument --node: unknown node preset 'laptop'"),
    "unknown policy": Case(("bench", "simulate", "--synth", "2", "--policies", "nope"), "unknown policy 'nope'"),
    "malformed --set": Case(("bench", "simulate", "--synth", "2", "--set", "bogus"),
                            "--set wants POLICY.OPTION=VALUE, got 'bogus'"),
    "unknown --set option": Case(("bench", "simulate", "--synth", "2", "--set", "breakeven.nope=1"),
                                 "unknown option(s) ['nope'] for policy 'breakeven'"),
    # missing and unusable files and directories
    "missing trace": Case(("bench", "simulate", "--trace", "missing.jsonl"), "cannot read trace 'missing.jsonl'"),
    "missing --input": Case(("bench", "trace", "mooncake", "--input", "missing.jsonl", "--out", "x.jsonl"),
                            "input trace not found: missing.jsonl (from --input)"),
    "missing --traces": Case(("bench", "predictor", "--traces", "missing"),
                             "trace directory missing (from --traces) does not exist"),
    "a directory as a trace": Case(("bench", "trace", "stats", "adir"), "cannot read trace 'adir': Is a directory",
                                   files={"adir/x": ""}),
    "empty trace": Case(("bench", "trace", "stats", "empty.jsonl"), "the trace holds no complete session",
                        files={"empty.jsonl": ""}),
    "missing request log": Case(("prefix", "missing.jsonl"), "request log 'missing.jsonl': no such file"),
    "a file as --data-dir": Case(("bench", "tiers", "--data-dir", "afile"), "--data-dir 'afile' is a file",
                                 files={"afile": "x"}),
    "unwritable output": Case(("bench", "trace", "synth", "--out", "nodir/x.jsonl", "--sessions", "2"),
                              "cannot write 'nodir/x.jsonl': No such file or directory"),
    "not a store": Case(("store", "check", "afile"), "afile is not a kvtier store", files={"afile": "x"}),
    "a stats file that is JSON but no snapshot": Case(("store", "stats", "."), "not a kvtier stats snapshot",
                                                      files={"kvtier-stats.json": "[1, 2]"}),
    "plot that is not a PNG": Case(("plan", "regimes", "--model", "llama-3.1-8b", "--plot", "out.txt"),
                                   "--plot 'out.txt': give a file name ending in .png"),
    # bad URLs and addresses
    "remote URL of an unknown scheme": Case(("bench", "tiers", "--data-dir", "d", "--remote", "http://x"),
                                            "argument --remote: unknown remote URL scheme 'http'"),
    "public address without a token": Case(("serve", "--host", "0.0.0.0", "--data-dir", "d"),
                                           "refusing to bind non-loopback address '0.0.0.0' without a token"),
    "short token": Case(("serve", "--token", "abc", "--data-dir", "d"), "--token:"),
    # the configuration layer
    "unknown key in the config file": Case(("--config", "c.toml", "plan", "presets"),
                                           "config file 'c.toml': unknown key(s) ['locality']",
                                           files={"c.toml": "locality = 1\n"}),
    "bad value in the config file": Case(("--config", "c.toml", "plan", "presets"),
                                         "queue_depth from config file c.toml must be an integer >= 1",
                                         files={"c.toml": "queue_depth = 0\n"}),
    "unparseable config file": Case(("plan", "presets"), "config file 'c.toml':", env={"KVTIER_CONFIG": "c.toml"},
                                    files={"c.toml": "queue_depth = [\n"}),
    "missing config file": Case(("plan", "presets"), "config file 'none.toml': No such file or directory",
                                env={"KVTIER_CONFIG": "none.toml"}),
    "config file of an unknown kind": Case(("--config", "c.ini", "plan", "presets"),
                                           "name it .toml, .yaml, .yml or .json", files={"c.ini": "x=1\n"}),
    "bad queue depth in the environment": Case(("plan", "presets"),
                                               "queue_depth from KVTIER_QUEUE_DEPTH must be an integer >= 1",
                                               env={"KVTIER_QUEUE_DEPTH": "0"}),
    "bad flag in the environment": Case(("plan", "presets"), "prepare_slots from KVTIER_PREPARE_SLOTS",
                                        env={"KVTIER_PREPARE_SLOTS": "maybe"}),
    "misspelt variable": Case(("plan", "presets", "--json"),
                              "kvtier: warning: KVTIER_IO_ENIGNE is not a kvtier variable", rc=0,
                              env={"KVTIER_IO_ENIGNE": "threads"}),
    "unknown flag": Case(("plan", "capacity", "--model", "llama-3.1-8b", "--context", "5", "--contxt", "5"),
                         "unrecognized arguments: --contxt 5"),
}

BLOCKER = textwrap.dedent("""
    import importlib.abc, runpy, sys
    class _Blocked(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname, path=None, target=None):
            if fullname.split(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
            return None
    sys.meta_path.insert(0, _Blocked())
    sys.argv = ["kvtier", *sys.argv[1:]]
    runpy.run_module("kvtier", run_name="__main__")
""")


def run_case(case: Case, cwd: Path) -> subprocess.CompletedProcess:
    for name, text in case.files.items():
        (cwd / name).parent.mkdir(parents=True, exist_ok=True)
        (cwd / name).write_text(text)
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVTIER_") and k != "PYTHONPATH"}
    env.update({"PYTHONSAFEPATH": "1", "COLUMNS": "100", **case.env})
    code = f"BLOCKED = {list(case.blocked)!r}\n" + BLOCKER
    cmd = [sys.executable, "-c", code, *case.argv]
    if not case.closed_stdout:
        return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=240)
    r, w = os.pipe()
    os.close(r)                     # the reader has gone before the first write
    try:
        p = subprocess.run(cmd, cwd=cwd, env=env, stdout=w, stderr=subprocess.PIPE, text=True, timeout=240)
    finally:
        os.close(w)
    return subprocess.CompletedProcess(p.args, p.returncode, "", p.stderr)


@pytest.fixture(scope="module")
def cwd(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("cwd")
    from kvtier.cli.main import main
    assert main(["bench", "trace", "synth", "--out", str(d / TRACE), "--sessions", "3", "--json"]) == 0
    return d


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_is_one_line_and_no_traceback(name, cwd, tmp_path, capsys):
    case = CASES[name]
    work = tmp_path / "w"
    work.mkdir()
    (work / TRACE).write_bytes((cwd / TRACE).read_bytes())
    r = run_case(case, work)
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode == case.rc, (r.returncode, r.stderr[-2000:])
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == case.lines, lines
    if case.needle:
        assert case.needle in lines[0], lines
        if case.rc == 2:
            assert lines[0].startswith("kvtier") and ": error: " in lines[0], lines


def markdown(cwd: Path) -> str:
    """The docs/cli.md table: each case, the command, what the CLI prints now, and the exit status."""
    import shlex
    import tempfile
    rows = ["| input | command | prints (stderr) | exit |", "| --- | --- | --- | --- |"]
    for name, case in CASES.items():
        with tempfile.TemporaryDirectory() as t:
            work = Path(t)
            (work / TRACE).write_bytes((cwd / TRACE).read_bytes())
            r = run_case(case, work)
        env = " ".join(f"{k}={v}" for k, v in case.env.items())
        cmd = " ".join(filter(None, [env, "kvtier", shlex.join(case.argv)]))
        if case.closed_stdout:
            cmd += " \\| head -0"
        if case.blocked:
            name += f" (`{', '.join(case.blocked)}` not installed)"
        out = " ".join(r.stderr.split()) or "(nothing)"
        if len(out) > 300:
            out = out[:300] + " ..."
        out = out.replace("|", "\\|")
        rows.append(f"| {name} | `{cmd}` | {out} | {r.returncode} |")
    return "\n".join(rows)


if __name__ == "__main__":   # print the docs/cli.md table
    import tempfile
    with tempfile.TemporaryDirectory() as t:
        from kvtier.cli.main import main
        main(["bench", "trace", "synth", "--out", str(Path(t) / TRACE), "--sessions", "3", "--json"])
        print(markdown(Path(t)))
