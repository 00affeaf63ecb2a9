"""The CLI shell a person meets: the subcommand tree, help on every flag, the environment in
``--help``, and errors as one line that names the subcommand and the flag at fault."""
from __future__ import annotations

import argparse
import subprocess
import sys
import warnings

import pytest

from kvtier.cli.main import COMMAND_MODULES, build_parser, iter_parsers, main
from kvtier.env import DEPRECATED, ENV_VARS

# The product's commands (more may be added; none of these may disappear).
TREE = {
    "kvtier": {"plan", "bench", "demo", "serve"},
    "kvtier plan": {"capacity", "breakeven", "paging", "sharing", "presets", "regimes"},
    "kvtier bench": {"tiers", "predictor", "simulate", "trace", "service"},
    "kvtier bench trace": {"stats"},
}


def run(*args, **kw):
    return subprocess.run([sys.executable, "-m", "kvtier", *args], capture_output=True, text=True, timeout=60, **kw)


def groups_and_leaves():
    groups, leaves = {}, {}
    for p in iter_parsers(build_parser()):
        subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
        if subs:
            groups[p.prog] = set(subs[0].choices)
        else:
            leaves[p.prog] = p
    return groups, leaves


def test_subcommand_tree():
    groups, leaves = groups_and_leaves()
    for prog, want in TREE.items():
        assert want <= groups[prog], (prog, want - groups[prog])
    # every leaf runs a handler and honours --json (one JSON document on stdout)
    assert len(leaves) >= 15
    for prog, p in leaves.items():
        assert callable(p.get_default("handler")), prog
        assert "--json" in p._option_string_actions, prog
    # every registered module is importable (build_parser skips only ones not written yet)
    import importlib
    for name in COMMAND_MODULES:
        importlib.import_module(name)


def test_every_flag_and_subcommand_has_help():
    from kvtier.util.args import RENAMED      # the earlier spellings of renamed flags: accepted, unlisted
    missing = []
    for p in iter_parsers(build_parser()):
        for a in p._actions:
            if a.help == argparse.SUPPRESS and set(a.option_strings) <= set(RENAMED):
                continue
            if isinstance(a, argparse._SubParsersAction):
                missing += [f"{p.prog} {c.dest}" for c in a._choices_actions if not (c.help or "").strip()]
            elif not (a.help or "").strip() or a.help == argparse.SUPPRESS:
                missing.append(f"{p.prog} {'/'.join(a.option_strings) or a.dest}")
    assert missing == []


def test_help_lists_commands_and_every_environment_variable():
    r = run("--help")
    assert r.returncode == 0 and r.stderr == ""
    for cmd in TREE["kvtier"]:
        assert f"\n    {cmd} " in r.stdout
    for name in (*ENV_VARS, *DEPRECATED):
        assert name in r.stdout
    assert max(len(line) for line in r.stdout.splitlines()) <= 80


def test_a_group_without_its_subcommand_prints_its_help_and_exits_2(capsys):
    assert main(["plan"]) == 2
    out = capsys.readouterr().out
    assert out.startswith("usage: kvtier plan") and "capacity" in out and "regimes" in out
    assert main([]) == 2
    assert "usage: kvtier" in capsys.readouterr().out


@pytest.mark.parametrize("argv, line", [
    (["frobnicate"], "kvtier: error: argument COMMAND: invalid choice: 'frobnicate'"),
    (["plan", "capacity", "--context", "x"],
     "kvtier plan capacity: error: argument --context: expected a positive integer, got 'x'"),
    (["plan", "paging", "--lengths", "3", "--block-size", "0", "--max-seq-len", "8"],
     "kvtier plan paging: error: argument --block-size: expected a positive integer, got '0'"),
    (["serve", "--port", "70000"], "kvtier serve: error: --port must be in 0..65535, got 70000"),
    (["serve", "--nope"], "kvtier serve: error: unrecognized arguments: --nope"),
    (["plan", "sharing", "--prefix-tokens", "1"], "kvtier plan sharing: error: the following arguments are required"),
])
def test_errors_are_one_line_naming_the_subcommand_and_flag(argv, line):
    r = run(*argv)
    assert r.returncode == 2 and r.stdout == ""
    assert "Traceback" not in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(line), r.stderr
    assert r.stderr.count("kvtier") == 1      # never "kvtier: error: kvtier ..."


def test_version():
    from kvtier import __version__
    r = run("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"kvtier {__version__}"


def test_one_variable_per_setting_and_the_old_name_warns(monkeypatch, tmp_path):
    from kvtier import env
    monkeypatch.delenv("KVTIER_TRACES", raising=False)
    monkeypatch.setenv("KVTIER_TRACES_DIR", str(tmp_path))
    with pytest.warns(env.DeprecatedVariable, match="KVTIER_TRACES_DIR is deprecated: set KVTIER_TRACES"):
        assert env.traces_dir() == tmp_path
    monkeypatch.setenv("KVTIER_TRACES", str(tmp_path / "new"))   # the current name wins, silently
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert env.traces_dir() == tmp_path / "new"
    with pytest.raises(KeyError, match="not a kvtier environment variable"):
        env.get("KVTIER_TYPO")


def test_the_old_trace_variable_warns_in_one_line_through_the_cli(tmp_path):
    env = {k: v for k, v in __import__("os").environ.items() if k != "KVTIER_TRACES"}
    r = run("bench", "trace", "mooncake", "--out", str(tmp_path / "x.jsonl"),
            env={**env, "KVTIER_TRACES_DIR": str(tmp_path / "old")})
    assert r.returncode == 2
    lines = r.stderr.splitlines()
    assert lines[0] == "kvtier: warning: KVTIER_TRACES_DIR is deprecated: set KVTIER_TRACES instead"
    assert lines[1].startswith(f"kvtier bench trace mooncake: error: input trace not found: "
                               f"{tmp_path / 'old'}/mooncake/conversation_trace.jsonl (from KVTIER_TRACES)")
    assert len(lines) == 2


def test_error_line_folds_to_one_line_without_a_doubled_prefix():
    from kvtier.cli.main import error_line
    assert error_line("kvtier serve", "kvtier: error: bad\nthing") == "kvtier serve: error: bad thing\n"
    assert error_line("kvtier bench engine", 'kvtier: the config needs "data_dir"') == \
        'kvtier bench engine: error: the config needs "data_dir"\n'
    assert error_line("kvtier", "") == "kvtier: error: failed\n"
