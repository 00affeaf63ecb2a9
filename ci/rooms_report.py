"""Measure how a kvtier checkout is split into rooms (standard library ``ast`` only).

Usage: ``python ci/rooms_report.py [ROOT] [--json]`` (ROOT: a checkout, default the one
this file is in).  Prints, for the product code (every ``.py`` under ROOT except ``tests/``,
``ci/`` and dot folders):

* the largest classes in lines, with their bases as written;
* files over 400 lines and functions (methods too) over 80 lines;
* cross-class private-field reads: a ``self._x`` read in a class whose own body and whose
  bases defined in the same file never assign ``self._x`` (nor define ``_x`` in a class body);
* ``Any`` annotations in the core (``tiering/``, ``store/``, ``dma/``, ``engine_adapter/``);
* ``hasattr``/``getattr`` probes (calls);
* mapping tables from ``Action`` to tiers: dict literals with a key spelled ``Action.X``;
* import cycles between kvtier modules, from module-level imports only (an import inside a
  function does not count; one under ``if TYPE_CHECKING:`` does): each strongly connected
  component of the import graph with more than one module, and one shortest cycle in it.

The repository root is the ``kvtier`` package (``pyproject.toml`` maps the top-level folders
under it), so ``tiering/policy/breakeven.py`` is module ``kvtier.tiering.policy.breakeven``.  Exit status 0;
the numbers are for a reader, not a gate.
"""
from __future__ import annotations

import argparse
import ast
import json
import sys
from collections import deque
from pathlib import Path

BIG_FILE = 400
BIG_FUNCTION = 80
CORE = ("tiering", "store", "dma", "engine_adapter")
SKIP = ("tests", "ci")


def product_files(root: Path) -> list[Path]:
    out = []
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root).parts
        if rel[0] in SKIP or any(part.startswith(".") or part in ("build", "dist", "__pycache__")
                                 for part in rel[:-1]):
            continue
        out.append(p)
    return out


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["kvtier", *parts])


# -- classes and functions ---------------------------------------------------
def _span(node: ast.AST) -> int:
    return node.end_lineno - node.lineno + 1


def _bases(cls: ast.ClassDef) -> list[str]:
    return [ast.unparse(b) for b in cls.bases]


def _self_attrs(cls: ast.ClassDef) -> tuple[set[str], list[tuple[str, int]]]:
    """(names the class assigns to ``self.`` or defines in its body, private ``self._x`` reads)."""
    assigned: set[str] = set()
    reads: list[tuple[str, int]] = []
    for st in cls.body:
        if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            assigned.add(st.name)
        elif isinstance(st, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = st.targets if isinstance(st, ast.Assign) else [st.target]
            for t in targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        assigned.add(n.id)
    for node in ast.walk(cls):
        if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"):
            continue
        if isinstance(node.ctx, (ast.Store, ast.Del)):
            assigned.add(node.attr)
        elif node.attr.startswith("_") and not node.attr.startswith("__"):
            reads.append((node.attr, node.lineno))
    # ``setattr(self, "_x", v)`` and ``object.__setattr__(self, "_x", v)`` assign too
    for node in ast.walk(cls):
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Name) \
                and node.args[0].id == "self":
            fn = ast.unparse(node.func)
            if fn in ("setattr", "object.__setattr__") and len(node.args) > 1 \
                    and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
                assigned.add(node.args[1].value)
    return assigned, reads


def cross_class_reads(tree: ast.Module, rel: str) -> list[dict]:
    classes = {c.name: c for c in ast.walk(tree) if isinstance(c, ast.ClassDef)}
    info = {n: _self_attrs(c) for n, c in classes.items()}

    def own_and_bases(name: str, seen: set[str]) -> set[str]:
        if name in seen or name not in classes:
            return set()
        seen.add(name)
        out = set(info[name][0])
        for b in classes[name].bases:
            bn = b.id if isinstance(b, ast.Name) else None
            if bn:
                out |= own_and_bases(bn, seen)
        return out

    found = []
    for name in classes:
        known = own_and_bases(name, set())
        missing = sorted({a for a, _ in info[name][1] if a not in known})
        for a in missing:
            line = min(ln for x, ln in info[name][1] if x == a)
            found.append({"file": rel, "class": name, "field": a, "line": line})
    return found


# -- annotations, probes, tables ---------------------------------------------
def _mentions_any(ann: ast.AST | None) -> bool:
    if ann is None:
        return False
    for n in ast.walk(ann):
        if isinstance(n, ast.Name) and n.id == "Any":
            return True
        if isinstance(n, ast.Attribute) and n.attr == "Any":
            return True
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and "Any" in n.value.replace("[", " ").split():
            return True
    return False


def any_annotations(tree: ast.Module) -> list[int]:
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]:
                if arg is not None and _mentions_any(arg.annotation):
                    lines.append(arg.lineno)
            if _mentions_any(node.returns):
                lines.append(node.lineno)
        elif isinstance(node, ast.AnnAssign) and _mentions_any(node.annotation):
            lines.append(node.lineno)
    return sorted(lines)


def probes(tree: ast.Module) -> list[tuple[str, int]]:
    return sorted((n.func.id, n.lineno) for n in ast.walk(tree)
                  if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("hasattr", "getattr"))


def action_tables(tree: ast.Module) -> list[int]:
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Dict) and any(isinstance(k, ast.Attribute) and isinstance(k.value, ast.Name)
                                           and k.value.id == "Action" for k in n.keys if k is not None):
            out.append(n.lineno)
        elif isinstance(n, ast.DictComp) and isinstance(n.key, ast.Attribute) \
                and isinstance(n.key.value, ast.Name) and n.key.value.id == "Action":
            out.append(n.lineno)
    return sorted(out)


# -- imports -----------------------------------------------------------------
def module_imports(tree: ast.Module, mod: str, is_pkg: bool, known: set[str], lazy: bool = False) -> set[str]:
    """kvtier modules ``mod`` imports outside any function body (``lazy``: inside them too)."""
    out: set[str] = set()
    stack: list[ast.AST] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) and not lazy:
            continue
        if isinstance(node, ast.Import):
            for a in node.names:
                name = a.name
                while name and name not in known:
                    name = name.rpartition(".")[0]
                if name:
                    out.add(name)
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = mod.split(".") if is_pkg else mod.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for a in node.names:
                sub = f"{target}.{a.name}"
                if sub in known:
                    out.add(sub)
                    continue
                name = target
                while name and name not in known:
                    name = name.rpartition(".")[0]
                if name:
                    out.add(name)
            continue
        stack.extend(ast.iter_child_nodes(node))
    out.discard(mod)
    return out


def cycles(graph: dict[str, set[str]]) -> list[dict]:
    """Strongly connected components of more than one module (Tarjan), each with one shortest cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on: set[str] = set()
    stack: list[str] = []
    comps: list[list[str]] = []
    counter = [0]
    sys.setrecursionlimit(max(10000, sys.getrecursionlimit()))

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    out = []
    for comp in sorted(comps):
        members = set(comp)
        best: list[str] | None = None
        for start in comp:
            prev = {start: None}
            q = deque([start])
            path = None
            while q and path is None:
                v = q.popleft()
                for w in sorted(graph[v] & members):
                    if w == start:
                        path = [v]
                        while prev[path[-1]] is not None:
                            path.append(prev[path[-1]])
                        path = path[::-1] + [start]
                        break
                    if w not in prev:
                        prev[w] = v
                        q.append(w)
            if path and (best is None or len(path) < len(best)):
                best = path
        out.append({"modules": comp, "shortest_cycle": best})
    return out


# -- the report --------------------------------------------------------------
def report(root: Path, lazy: bool = False) -> dict:
    files = product_files(root)
    trees: dict[Path, ast.Module] = {}
    for p in files:
        try:
            trees[p] = ast.parse(p.read_text(encoding="utf-8"), filename=str(p))
        except SyntaxError:
            continue
    mods = {p: module_name(root, p) for p in trees}
    known = set(mods.values())
    classes, big_files, big_funcs, reads, anys, probe_list, tables = [], [], [], [], [], [], []
    graph: dict[str, set[str]] = {}
    for p, tree in trees.items():
        rel = p.relative_to(root).as_posix()
        n_lines = len(p.read_text(encoding="utf-8").splitlines())
        if n_lines > BIG_FILE:
            big_files.append({"file": rel, "lines": n_lines})
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                classes.append({"file": rel, "class": node.name, "lines": _span(node), "bases": _bases(node)})
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _span(node) > BIG_FUNCTION:
                big_funcs.append({"file": rel, "function": node.name, "lines": _span(node), "line": node.lineno})
        reads += cross_class_reads(tree, rel)
        if rel.split("/")[0] in CORE:
            anys += [{"file": rel, "line": ln} for ln in any_annotations(tree)]
        probe_list += [{"file": rel, "call": c, "line": ln} for c, ln in probes(tree)]
        tables += [{"file": rel, "line": ln} for ln in action_tables(tree)]
        graph[mods[p]] = module_imports(tree, mods[p], p.name == "__init__.py", known, lazy)
    classes.sort(key=lambda c: -c["lines"])
    big_files.sort(key=lambda f: -f["lines"])
    big_funcs.sort(key=lambda f: -f["lines"])
    cyc = cycles(graph)
    return {
        "root": root.name,
        "files": len(trees),
        "largest_classes": classes[:5],
        "files_over_400": big_files,
        "functions_over_80": big_funcs,
        "cross_class_private_reads": reads,
        "any_annotations_core": anys,
        "hasattr_getattr_probes": probe_list,
        "action_tier_tables": tables,
        "import_cycles": cyc,
        "summary": {
            "largest_class": (f"{classes[0]['class']} ({classes[0]['file']}, {classes[0]['lines']} lines, "
                              f"bases {', '.join(classes[0]['bases']) or '-'})") if classes else "-",
            "files_over_400": len(big_files),
            "functions_over_80": len(big_funcs),
            "cross_class_private_reads": len(reads),
            "classes_with_cross_class_reads": len({(r["file"], r["class"]) for r in reads}),
            "any_annotations_core": len(anys),
            "hasattr_getattr_probes": len(probe_list),
            "action_tier_tables": len(tables),
            "import_cycles": len(cyc),
            "modules_in_cycles": sum(len(c["modules"]) for c in cyc),
        },
    }


def _print(doc: dict) -> None:
    s = doc["summary"]
    print(f"rooms report: {doc['files']} product files")
    print("\n== summary")
    for k, v in s.items():
        print(f"  {k}: {v}")
    print("\n== largest classes (lines, bases)")
    for c in doc["largest_classes"]:
        print(f"  {c['lines']:5d}  {c['class']}({', '.join(c['bases'])})  {c['file']}")
    print(f"\n== files over {BIG_FILE} lines")
    for f in doc["files_over_400"]:
        print(f"  {f['lines']:5d}  {f['file']}")
    print(f"\n== functions over {BIG_FUNCTION} lines")
    for f in doc["functions_over_80"]:
        print(f"  {f['lines']:5d}  {f['file']}:{f['line']} {f['function']}")
    print("\n== cross-class private-field reads (class: fields read, never assigned in it or its same-file bases)")
    by: dict[tuple[str, str], list[str]] = {}
    for r in doc["cross_class_private_reads"]:
        by.setdefault((r["file"], r["class"]), []).append(r["field"])
    for (f, c), names in sorted(by.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        print(f"  {len(names):3d}  {f} {c}: {', '.join(names)}")
    print("\n== Any annotations in the core (per file)")
    per: dict[str, int] = {}
    for a in doc["any_annotations_core"]:
        per[a["file"]] = per.get(a["file"], 0) + 1
    for f, n in sorted(per.items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"  {n:3d}  {f}")
    print("\n== hasattr/getattr probes (per file)")
    per = {}
    for a in doc["hasattr_getattr_probes"]:
        per[a["file"]] = per.get(a["file"], 0) + 1
    for f, n in sorted(per.items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"  {n:3d}  {f}")
    print("\n== Action-keyed mapping tables")
    for t in doc["action_tier_tables"]:
        print(f"  {t['file']}:{t['line']}")
    print("\n== import cycles (strongly connected components of the import graph)")
    for c in doc["import_cycles"]:
        print(f"  {len(c['modules'])} modules: {' -> '.join(c['shortest_cycle'] or [])}")
        if len(c["modules"]) > 2:
            print(f"       all: {', '.join(c['modules'])}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("root", nargs="?", default=str(Path(__file__).resolve().parent.parent))
    ap.add_argument("--json", action="store_true", help="print the whole report as JSON")
    ap.add_argument("--lazy-imports", action="store_true",
                    help="count imports inside functions too when looking for cycles (not the default measure)")
    args = ap.parse_args(argv)
    doc = report(Path(args.root).resolve(), args.lazy_imports)
    if args.json:
        print(json.dumps(doc, indent=1))
    else:
        _print(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
