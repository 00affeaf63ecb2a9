"""The CLI shell: help works, unknown commands exit 2 with one line."""
import subprocess
import sys


def run(*args):
    return subprocess.run([sys.executable, "-m", "kvtier", *args], capture_output=True, text=True)


def test_help_lists_commands():
    r = run("--help")
    assert r.returncode == 0
    assert "plan" in r.stdout and "bench" in r.stdout


def test_unknown_command_is_one_line_exit_2():
    r = run("frobnicate")
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    assert r.stderr.strip().count("\n") <= 1
