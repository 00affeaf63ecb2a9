"""The engine tests skip only where an engine is absent, and CI can forbid even that."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from engines import FLAG, Requirement, need_engine

TESTS = Path(__file__).parent


def test_an_absent_engine_skips_and_fails_where_engines_are_required(monkeypatch):
    monkeypatch.setattr(Requirement, "required", False)
    with pytest.raises(pytest.skip.Exception, match="not installed"):
        need_engine("no_such_engine_kvtier_test")
    monkeypatch.setattr(Requirement, "required", True)
    with pytest.raises(pytest.fail.Exception, match=FLAG):
        need_engine("no_such_engine_kvtier_test")
    need_engine("pytest")                      # an installed package: nothing happens


def _imports_kvtier(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Import) and any(a.name.startswith("kvtier") for a in n.names)
               or isinstance(n, ast.ImportFrom) and (n.module or "").startswith("kvtier")
               for n in ast.walk(node))


def _skips(handler: ast.ExceptHandler) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "skip"
               for n in ast.walk(handler))


def test_no_test_turns_a_kvtier_import_error_into_a_skip():
    # a try whose body imports a kvtier module and whose handler skips would hide a broken
    # kvtier module behind "engine not installed"
    offenders = []
    for path in sorted(TESTS.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Try) and any(_imports_kvtier(s) for s in node.body) \
                    and any(_skips(h) for h in node.handlers):
                offenders.append(f"{path.relative_to(TESTS)}:{node.lineno}")
    assert offenders == []
