"""ci/rooms_report.py and ci/regroup_tiering.py on small trees of their own."""
from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

CI = Path(__file__).resolve().parent.parent / "ci"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, CI / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text), encoding="utf-8")


def test_the_rooms_report_measures_what_it_says(tmp_path):
    rr = _load("rooms_report")
    _write(tmp_path, {
        "tiering/__init__.py": "",
        # a <-> b at module level is a cycle; b -> c only inside a function is not
        "tiering/a.py": "from typing import Any\nfrom kvtier.tiering import b\n\ndef f(x: Any) -> int:\n    return 1\n",
        "tiering/b.py": "from kvtier.tiering.a import f\n\ndef g():\n    from kvtier.tiering import c\n",
        "tiering/c.py": "from kvtier.tiering.b import g\n",
        "tiering/d.py": """\
            class Base:
                def __init__(self):
                    self._own = 1

            class Mixin:
                def peek(self):
                    return self._theirs + self._own2

            class Whole(Base):
                _cls = 3
                def read(self):
                    if hasattr(self, "x"):
                        pass
                    return self._own + self._cls + self._helper() + self._nowhere

                def _helper(self):
                    return {Action.RETAIN: "device"}
            """,
        "tests/test_x.py": "from kvtier.tiering import a\nimport kvtier.tiering.a\n",   # tests are left out
    })
    doc = rr.report(tmp_path)
    s = doc["summary"]
    assert s["import_cycles"] == 1 and doc["import_cycles"][0]["modules"] == ["kvtier.tiering.a", "kvtier.tiering.b"]
    assert rr.report(tmp_path, lazy=True)["import_cycles"][0]["modules"] == \
        ["kvtier.tiering.a", "kvtier.tiering.b", "kvtier.tiering.c"]
    reads = {(r["class"], r["field"]) for r in doc["cross_class_private_reads"]}
    assert reads == {("Mixin", "_theirs"), ("Mixin", "_own2"), ("Whole", "_nowhere")}
    assert s["any_annotations_core"] == 1 and s["hasattr_getattr_probes"] == 1 and s["action_tier_tables"] == 1
    assert doc["largest_classes"][0]["class"] == "Whole" and doc["largest_classes"][0]["bases"] == ["Base"]
    assert s["files_over_400"] == 0 and doc["files"] == 5


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_the_regroup_moves_rewrites_refuses_and_is_idempotent(tmp_path):
    def git(*a):
        return subprocess.run(["git", *a], cwd=tmp_path, check=True, capture_output=True, text=True).stdout

    _write(tmp_path, {
        "pyproject.toml": 'packages = [\n    "kvtier.tiering", "kvtier.tiering.service",\n]\n',
        "tiering/__init__.py": '_LAZY = {"make_policy": "kvtier.tiering.policies"}\n',
        "tiering/costmodel.py": "GB = 1e9\n",
        "tiering/policies.py": "from kvtier.tiering.costmodel import GB\nfrom kvtier.tiering import costmodel as cm\n",
        "tiering/service/__init__.py": "",
        "tiering/service/app.py": "from ..costmodel import GB\nfrom .. import policies, lifecycle\n",
        "tiering/lifecycle/__init__.py": "",
        "tests/test_y.py": ("import kvtier.tiering.policies as P\n"
                            "from kvtier.tiering import (make_policy,\n    costmodel)  # both\n"
                            "def test():\n    monkeypatch = 'kvtier.tiering.policies.make_policy'\n"),
        "docs/x.md": "See `tiering/costmodel.py` and :mod:`kvtier.tiering.policies`; not vendor/tiering/costmodel.py.\n",
    })
    (tmp_path / "ci").mkdir()
    shutil.copy(CI / "regroup_tiering.py", tmp_path / "ci" / "regroup_tiering.py")
    git("init", "-q")
    git("add", "-A")
    git("-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "tree")
    run = [sys.executable, "ci/regroup_tiering.py"]
    res = subprocess.run(run, cwd=tmp_path, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "tiering/model/costmodel.py").exists() and not (tmp_path / "tiering/costmodel.py").exists()
    assert (tmp_path / "tiering/policy/policies.py").exists() and (tmp_path / "tiering/model/__init__.py").exists()
    assert "tiering/model/costmodel.py" in git("status", "--short")             # a git mv, staged
    read = lambda rel: (tmp_path / rel).read_text()                             # noqa: E731
    assert read("tiering/policy/policies.py") == ("from kvtier.tiering.model.costmodel import GB\n"
                                                  "from kvtier.tiering.model import costmodel as cm\n")
    assert read("tiering/service/app.py") == ("from kvtier.tiering.model.costmodel import GB\n"
                                              "from kvtier.tiering import lifecycle\n"
                                              "from kvtier.tiering.policy import policies\n")
    assert read("tests/test_y.py").startswith("import kvtier.tiering.policy.policies as P\n"
                                              "from kvtier.tiering import make_policy\n"
                                              "from kvtier.tiering.model import costmodel  # both\n")
    assert "'kvtier.tiering.policy.policies.make_policy'" in read("tests/test_y.py")
    assert read("tiering/__init__.py") == '_LAZY = {"make_policy": "kvtier.tiering.policy.policies"}\n'
    assert read("docs/x.md") == ("See `tiering/model/costmodel.py` and :mod:`kvtier.tiering.policy.policies`; "
                                 "not vendor/tiering/costmodel.py.\n")
    assert '"kvtier.tiering.model", "kvtier.tiering.policy",' in read("pyproject.toml")
    # a second run changes nothing
    again = subprocess.run(run, cwd=tmp_path, capture_output=True, text=True)
    assert again.returncode == 0 and "0 files rewritten" in again.stdout and "git mv" not in again.stdout
    # what it cannot rewrite it lists, and exits 1; a flat module in no room exits 2
    (tmp_path / "bench.py").write_text('name = "kvtier.tiering." + "policies"\n')
    git("add", "bench.py")
    bad = subprocess.run(run, cwd=tmp_path, capture_output=True, text=True)
    assert bad.returncode == 1 and "bench.py:1: dynamic module path" in bad.stderr
    (tmp_path / "bench.py").unlink()
    git("rm", "-q", "--cached", "bench.py")
    (tmp_path / "tiering/newthing.py").write_text("")
    flat = subprocess.run(run, cwd=tmp_path, capture_output=True, text=True)
    assert flat.returncode == 2 and "tiering/newthing.py is in no room" in flat.stderr
