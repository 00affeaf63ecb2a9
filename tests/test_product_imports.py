"""The product imports no benchmark: no module outside ``bench/`` and ``tests/`` names
``kvtier.bench`` in an import (at module level or inside a function, absolute or
relative, or as a literal ``importlib.import_module``/``__import__`` argument).

Standard library ``ast`` only; the repository root is the ``kvtier`` package
(``pyproject.toml`` maps the top-level folders under it), so ``tiering/x.py`` is
``kvtier.tiering.x``, ``kvtier/cli/y.py`` is ``kvtier.cli.y``, and ``from ..bench import y`` there is resolved as written."""
from __future__ import annotations

import ast
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = "kvtier.bench"
ALLOWED = ("bench", "tests")             # top-level folders that may import the benchmarks
SKIPPED_DIRS = ("build", "dist", "__pycache__")


def _module(root: Path, path: Path) -> list[str]:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return parts if parts[:1] == ["kvtier"] else ["kvtier", *parts]     # kvtier/ is the package's own folder


def _is_bench(name: str) -> bool:
    return name == BENCH or name.startswith(BENCH + ".")


def _imported(root: Path, path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in ``path``, relative ones resolved."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    mod = _module(root, path)
    package = mod if path.name == "__init__.py" else mod[:-1]
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            stem = ".".join(base + ([node.module] if node.module else []))
            out.append((node.lineno, stem))
            if not _is_bench(stem):                                           # from kvtier import bench
                out += [(node.lineno, f"{stem}.{a.name}") for a in node.names]
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and ((isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                   or (isinstance(node.func, ast.Name) and node.func.id in ("import_module", "__import__")))):
            out.append((node.lineno, node.args[0].value))
    return out


def bench_imports(root: Path) -> list[str]:
    """``path:line: module`` for every import of ``kvtier.bench`` outside ALLOWED."""
    bad = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).parts
        if rel[0] in ALLOWED or any(p.startswith(".") or p in SKIPPED_DIRS or p.endswith(".egg-info")
                                    for p in rel[:-1]):
            continue
        bad += [f"{path.relative_to(root)}:{line}: {name}" for line, name in _imported(root, path)
                if _is_bench(name)]
    return bad


def test_no_module_outside_bench_and_tests_imports_the_benchmarks():
    assert bench_imports(ROOT) == []


def test_the_check_finds_every_form_of_a_benchmark_import(tmp_path):
    files = {
        "kvtier/cli/a.py": "def f():\n    from kvtier.bench.live.engine import LiveEngine\n",
        "kvtier/cli/b.py": "import kvtier.bench.sim as sim\n",
        "kvtier/cli/c.py": "from kvtier import bench\n",
        "kvtier/cli/f.py": "from ..bench.live import configs\n",
        "tiering/d.py": "from ..bench import cmd_live\n",
        "store/e.py": "import importlib\nimportlib.import_module('kvtier.bench.soak')\n",
        # not imports of the benchmarks: a sibling named like it, a string, an allowed folder
        "kvtier/cli/ok.py": "from kvtier.benchmarks import x\nNAME = 'kvtier.bench.cmd_live'\n",
        "engine_adapter/ok.py": "from . import bench_tools\nfrom .vllm import bench\n",
        "bench/live/x.py": "from kvtier.bench.live.runs import RunSummary\n",
        "tests/test_x.py": "from kvtier.bench.sim import trace\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(textwrap.dedent(text), encoding="utf-8")
    found = bench_imports(tmp_path)
    assert found == ["kvtier/cli/a.py:2: kvtier.bench.live.engine", "kvtier/cli/b.py:1: kvtier.bench.sim",
                     "kvtier/cli/c.py:1: kvtier.bench",
                     "kvtier/cli/f.py:1: kvtier.bench.live", "store/e.py:2: kvtier.bench.soak",
                     "tiering/d.py:1: kvtier.bench"]
