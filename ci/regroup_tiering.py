"""Group ``tiering/``'s flat modules into rooms by concept, and rewrite every reference to them.

Usage (from anywhere inside the checkout): ``python ci/regroup_tiering.py [--dry-run]``

The rooms (docs/architecture.md draws them; dependencies point up this list, never down):

* ``tiering/model/``        bytes, seconds and contracts: the cost model (``costmodel``), named
                            models and nodes (``presets``), ``capacity``, ``paging``, what a policy
                            sees and returns (``decision``) and the tier vocabulary (``tiers``);
* ``tiering/forecasting/``  the tool-wait predictor: ``features``, ``sketch``, ``forecast``,
                            ``predictor``, ``predictor_nodes``, ``predictor_baselines``;
* ``tiering/policy/``       pause decisions: ``pricing``, ``prefetch``, ``expected``,
                            ``breakeven``, ``breakeven_options``, ``baselines``,
                            ``prefetch_baselines`` and the registry ``policies``;
* ``tiering/service/``      (exists) the HTTP control plane, and now its Python ``client``;
* ``tiering/lifecycle/``, ``tiering/prefix/`` (exist, unchanged).

What it does, in order:

1. ``git mv tiering/M.py tiering/ROOM/M.py`` for each module above that is still flat (a
   module listed but absent, such as ``tiers`` before it is written, is skipped), and writes
   ``tiering/ROOM/__init__.py`` (a docstring, no imports) where there is none;
2. rewrites every tracked text file (code, tests, docs, ``pyproject.toml``, scripts) from the
   old module paths to the new: dotted names (``kvtier.tiering.M``, in imports, strings and
   ``:mod:`` references), file paths (``tiering/M.py``), ``from kvtier.tiering import M``
   (split when it also imports other names), and relative imports that reach a moved module
   (made absolute); adds the rooms to ``pyproject.toml``'s package list;
3. checks the result and exits 1 listing every reference it could not rewrite (an old path
   still present, an import it could not split, a Python file that no longer parses, a
   dynamic ``"kvtier.tiering." + name``), and 2 listing flat modules that are in no room.

Idempotent: a second run moves nothing, rewrites nothing and exits 0.  It never touches
this file, nor its test (``tests/test_ci_rooms.py``, whose small trees spell the old paths).  Needs git on PATH; standard library only.
"""
from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
from pathlib import Path

ROOMS: dict[str, tuple[str, ...]] = {
    "model": ("costmodel", "presets", "capacity", "paging", "decision", "tiers"),
    "forecasting": ("features", "sketch", "forecast", "predictor", "predictor_nodes", "predictor_baselines"),
    "policy": ("pricing", "prefetch", "expected", "breakeven", "breakeven_options", "baselines",
               "prefetch_baselines", "policies"),
    "service": ("client",),
}
ROOM_DOCS = {
    "model": "Bytes, seconds and contracts: the cost model, named models and nodes, capacity and paging\n"
             "arithmetic, what a policy sees and returns (``decision``), and the tier vocabulary.\n\n"
             "Imports nothing else of kvtier (the room every other one builds on).",
    "forecasting": "The tool-wait predictor: input checks and features, the quantile sketch, forecasts and\n"
                   "the Predictor contract, the back-off predictor and its baselines.\n\n"
                   "Imports only :mod:`kvtier.tiering.model`.",
    "policy": "Pause decisions: prices and optimisers, the expected-cost policy and its options, the\n"
              "baselines, and the registry (:func:`kvtier.tiering.policy.policies.make_policy`).\n\n"
              "Imports :mod:`kvtier.tiering.model` and :mod:`kvtier.tiering.forecasting`.",
}
TEXT_SUFFIXES = (".py", ".md", ".toml", ".sh", ".cfg", ".ini", ".txt", ".rst", ".yml", ".yaml", ".in")
SELF = "ci/regroup_tiering.py"
LEFT_ALONE = (SELF, "tests/test_ci_rooms.py")     # this script and its test's own small trees


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True).stdout


def new_of(root: Path) -> dict[str, str]:
    """Old module name under tiering -> its room, for every module that will be (or is) moved."""
    out = {}
    for room, mods in ROOMS.items():
        for m in mods:
            if (root / "tiering" / f"{m}.py").exists() or (root / "tiering" / room / f"{m}.py").exists():
                out[m] = room
    return out


# -- 1. moves ----------------------------------------------------------------
def move(root: Path, moved: dict[str, str], dry: bool) -> list[str]:
    problems, done = [], []
    for room in sorted(set(moved.values())):
        d = root / "tiering" / room
        init = d / "__init__.py"
        if not init.exists() and room in ROOM_DOCS:
            done.append(f"create tiering/{room}/__init__.py")
            if not dry:
                d.mkdir(exist_ok=True)
                init.write_text(f'"""{ROOM_DOCS[room]}\n"""\n', encoding="utf-8")
                git(root, "add", str(init.relative_to(root)))
    for m, room in sorted(moved.items()):
        old, new = root / "tiering" / f"{m}.py", root / "tiering" / room / f"{m}.py"
        if old.exists() and new.exists():
            problems.append(f"tiering/{m}.py and tiering/{room}/{m}.py both exist: merge them by hand")
        elif old.exists():
            done.append(f"git mv tiering/{m}.py tiering/{room}/{m}.py")
            if not dry:
                git(root, "mv", f"tiering/{m}.py", f"tiering/{room}/{m}.py")
    for line in done:
        print(line)
    return problems


# -- 2. rewrites -------------------------------------------------------------
def _dotted_re(moved: dict[str, str]) -> re.Pattern:
    names = "|".join(sorted(moved, key=len, reverse=True))
    return re.compile(rf"\bkvtier\.tiering\.({names})\b")


def _path_re(moved: dict[str, str]) -> re.Pattern:
    names = "|".join(sorted(moved, key=len, reverse=True))
    return re.compile(rf"(?<![\w/.-])tiering/({names})\.py\b")


def _module_of(root: Path, path: Path) -> tuple[str, bool]:
    parts = list(path.relative_to(root).with_suffix("").parts)
    is_pkg = parts[-1] == "__init__"
    if is_pkg:
        parts.pop()
    return ".".join(["kvtier", *parts]), is_pkg


def _resolve(mod: str, is_pkg: bool, node: ast.ImportFrom) -> str:
    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
    base = base[:len(base) - (node.level - 1)] if node.level > 1 else base
    return ".".join(base + ([node.module] if node.module else []))


def rewrite_imports(src: str, mod: str, is_pkg: bool, moved: dict[str, str], old_mod: str | None,
                    problems: list[str], rel: str) -> str:
    """``from kvtier.tiering import M`` (M moved) and relative imports that reach a moved module
    (or any relative import of a moved file, resolved from its old place) made absolute."""
    try:
        tree = ast.parse(src)
    except SyntaxError as exc:
        problems.append(f"{rel}: does not parse before the rewrite ({exc.msg}, line {exc.lineno})")
        return src
    lines = src.splitlines(keepends=True)
    edits: list[tuple[int, int, str]] = []
    here, here_pkg = (old_mod, False) if old_mod else (mod, is_pkg)
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        target = _resolve(here, here_pkg, node) if node.level else (node.module or "")
        relative = node.level > 0
        groups: list[tuple[str, list[ast.alias]]] = []
        if target == "kvtier.tiering":
            rest = [a for a in node.names if a.name not in moved]
            for a in node.names:
                if a.name in moved:
                    groups.append((f"kvtier.tiering.{moved[a.name]}", [a]))
            if not groups:
                continue
            if rest:
                groups.insert(0, ("kvtier.tiering", rest))
        elif relative and (old_mod is not None or _dotted_re(moved).fullmatch(target)
                           or any(f"{target}.{a.name}" in _all_old(moved) for a in node.names)):
            groups.append((_dotted_re(moved).sub(lambda m: f"kvtier.tiering.{moved[m.group(1)]}.{m.group(1)}",
                                                 target), list(node.names)))
        else:
            continue
        first, last = lines[node.lineno - 1], lines[node.end_lineno - 1]
        indent = first[:len(first) - len(first.lstrip())]
        after = last[node.end_col_offset:].strip()
        if first[:node.col_offset].strip() or (after and not after.startswith("#")):
            problems.append(f"{rel}:{node.lineno}: an import sharing its line with other code")
            continue
        # merge names going to the same module, keep their order
        merged: dict[str, list[ast.alias]] = {}
        for m, names in groups:
            merged.setdefault(m, []).extend(names)
        text = "".join(indent + ast.unparse(ast.ImportFrom(module=m, names=names, level=0)) + "\n"
                       for m, names in merged.items())
        tail = last[node.end_col_offset:].rstrip("\n")
        if tail.strip().startswith("#"):
            text = text.rstrip("\n") + tail + "\n"
        edits.append((node.lineno - 1, node.end_lineno, text))
    for start, end, text in sorted(edits, reverse=True):
        lines[start:end] = [text]
    return "".join(lines)


def _all_old(moved: dict[str, str]) -> set[str]:
    return {f"kvtier.tiering.{m}" for m in moved}


def rewrite_text(text: str, moved: dict[str, str]) -> str:
    text = _dotted_re(moved).sub(lambda m: f"kvtier.tiering.{moved[m.group(1)]}.{m.group(1)}", text)
    return _path_re(moved).sub(lambda m: f"tiering/{moved[m.group(1)]}/{m.group(1)}.py", text)


def rewrite_pyproject(text: str, moved: dict[str, str]) -> str:
    """Add the rooms to ``[tool.setuptools] packages``, on a line of their own after the one
    that lists ``"kvtier.tiering"``."""
    new = [f'"kvtier.tiering.{room}"' for room in ROOMS if room in set(moved.values())
           and f'"kvtier.tiering.{room}"' not in text]
    if not new:
        return text
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if '"kvtier.tiering",' in line:
            indent = line[:len(line) - len(line.lstrip())]
            lines.insert(i + 1, f"{indent}{', '.join(new)},\n")
            return "".join(lines)
    return text


def tracked_text_files(root: Path) -> list[Path]:
    out = []
    for rel in git(root, "ls-files", "--cached", "--others", "--exclude-standard").splitlines():
        if rel in LEFT_ALONE or not rel.endswith(TEXT_SUFFIXES):
            continue
        p = root / rel
        if p.is_file():
            out.append(p)
    return out


def rewrite(root: Path, moved: dict[str, str], dry: bool) -> list[str]:
    problems: list[str] = []
    new_to_old = {root / "tiering" / room / f"{m}.py": f"kvtier.tiering.{m}" for m, room in moved.items()}
    changed = 0
    for p in tracked_text_files(root):
        rel = p.relative_to(root).as_posix()
        try:
            src = p.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        out = src
        if p.suffix == ".py":
            mod, is_pkg = _module_of(root, p)
            # a moved file's relative imports were written for its old place
            old_mod = new_to_old.get(p) if _has_relative(out) else None
            out = rewrite_imports(out, mod, is_pkg, moved, old_mod, problems, rel)
        out = rewrite_text(out, moved)
        if rel == "pyproject.toml":
            out = rewrite_pyproject(out, moved)
        if out != src:
            changed += 1
            print(f"rewrite {rel}")
            if not dry:
                p.write_text(out, encoding="utf-8")
    print(f"{changed} files rewritten")
    return problems


def _has_relative(src: str) -> bool:
    return re.search(r"^\s*from \.", src, re.M) is not None


# -- 3. checks ---------------------------------------------------------------
def check(root: Path, moved: dict[str, str]) -> tuple[list[str], list[str]]:
    problems: list[str] = []
    dotted, path = _dotted_re(moved), _path_re(moved)
    dynamic = re.compile(r"""kvtier\.tiering\.["']\s*\+|f["'][^"'\n]*kvtier\.tiering\.\{""")
    for p in tracked_text_files(root):
        rel = p.relative_to(root).as_posix()
        try:
            text = p.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            for rx, what in ((dotted, "old module path"), (path, "old file path"), (dynamic, "dynamic module path")):
                m = rx.search(line)
                if m:
                    problems.append(f"{rel}:{n}: {what} {m.group(0)!r}")
        if p.suffix == ".py":
            try:
                tree = ast.parse(text)
            except SyntaxError as exc:
                problems.append(f"{rel}: does not parse ({exc.msg}, line {exc.lineno})")
                continue
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == "kvtier.tiering":
                    bad = [a.name for a in node.names if a.name in moved]
                    if bad:
                        problems.append(f"{rel}:{node.lineno}: from kvtier.tiering import {', '.join(bad)}")
    flat = sorted(p.stem for p in (root / "tiering").glob("*.py")
                  if p.stem != "__init__" and p.stem not in moved)
    return problems, [f"tiering/{m}.py is in no room: add it to ROOMS in {SELF}" for m in flat]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="print what would move and change, change nothing")
    args = ap.parse_args(argv)
    root = Path(git(Path(__file__).resolve().parent, "rev-parse", "--show-toplevel").strip())
    moved = new_of(root)
    problems = move(root, moved, args.dry_run)
    problems += rewrite(root, moved, args.dry_run)
    if args.dry_run:
        for p in problems:
            print(f"could not rewrite: {p}", file=sys.stderr)
        return 1 if problems else 0
    left, flat = check(root, moved)
    problems += left
    for p in problems:
        print(f"could not rewrite: {p}", file=sys.stderr)
    for f in flat:
        print(f"left flat: {f}", file=sys.stderr)
    if problems:
        return 1
    return 2 if flat else 0


if __name__ == "__main__":
    sys.exit(main())
