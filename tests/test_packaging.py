"""The package as a user installs it: one import root (``kvtier``), nothing of ours under
``store``/``bench``/``tiering``, a core that imports without the extras' packages, and a
missing extra reported as one line naming the ``pip install`` to run.

Every check runs in a subprocess whose working directory is outside the repository, with
``PYTHONSAFEPATH=1``, so nothing is found through the checkout by accident.  The wheel
tests build a real wheel from a copy of the working tree (``pip wheel --no-deps
--no-build-isolation``) and install it with ``pip install --no-deps --target``."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# The repository's source folders and the names they install under.
ROOTS = {"kvtier": "kvtier", "store": "kvtier.store", "tiering": "kvtier.tiering", "dma": "kvtier.dma",
         "engine_adapter": "kvtier.engine_adapter", "bench": "kvtier.bench"}
HEAVY = ("transformers", "matplotlib", "fastapi", "rich", "uvicorn", "httpx")
CORE = ("kvtier.store", "kvtier.dma", "kvtier.engine_adapter.plugin_common", "kvtier.tiering.policy.policies",
        "kvtier.tiering.forecasting.predictor", "kvtier.tiering.model.costmodel", "kvtier.tiering.model.decision")

# Installed into a child before anything else: refuses the named top-level packages as if they
# were not installed (ModuleNotFoundError with .name set, as the import system raises it).
BLOCKER = textwrap.dedent("""
    import importlib.abc, sys
    class _Blocked(importlib.abc.MetaPathFinder):
        def __init__(self, names): self.names = set(names)
        def find_spec(self, fullname, path=None, target=None):
            if fullname.split(".")[0] in self.names:
                raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
            return None
    sys.meta_path.insert(0, _Blocked(BLOCKED))
""")


def child(code: str, cwd: Path, *args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """``python -c code args`` in ``cwd`` with PYTHONSAFEPATH=1 (no script dir or cwd on sys.path)."""
    e = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "KVTIER_TOKEN")}
    e.update({"PYTHONSAFEPATH": "1", **(env or {})})
    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, env=e, capture_output=True, text=True,
                          timeout=timeout)


def kvtier_blocked(cwd: Path, blocked: tuple[str, ...], *argv: str) -> subprocess.CompletedProcess:
    """``python -m kvtier argv`` with ``blocked`` packages made uninstalled."""
    code = f"BLOCKED = {list(blocked)!r}\n" + BLOCKER + textwrap.dedent("""
        import runpy
        sys.argv = ["kvtier", *sys.argv[1:]]
        runpy.run_module("kvtier", run_name="__main__")
    """)
    return child(code, cwd, *argv)


# ----------------------------------------------------------------------------- one import root
def test_only_kvtier_is_importable_and_old_roots_are_not_ours(tmp_path):
    code = textwrap.dedent("""
        import importlib, json, sys
        out = {}
        import kvtier.store, kvtier.tiering, kvtier.engine_adapter, kvtier.bench, kvtier.dma, kvtier.cli.main
        out["store_file"] = kvtier.store.__file__
        out["missing"] = []
        for name in ("store", "bench", "tiering", "dma", "engine_adapter"):
            try:
                importlib.import_module(name)
            except ModuleNotFoundError as exc:
                out["missing"].append(exc.name)
        print(json.dumps(out))
    """)
    r = child(code, tmp_path)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["missing"] == ["store", "bench", "tiering", "dma", "engine_adapter"]
    assert Path(out["store_file"]).name == "__init__.py"


def test_a_users_own_store_package_does_not_shadow_ours(tmp_path):
    # A project with its own store/ and bench/ packages, run from its root (cwd on sys.path).
    for name in ("store", "bench"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"OWNER = 'user-{name}'\n")
    code = textwrap.dedent("""
        import store, bench
        from kvtier.store import TieredStore, StoreConfig
        import kvtier.bench, kvtier.store
        assert store.OWNER == "user-store" and bench.OWNER == "user-bench", (store, bench)
        assert not hasattr(kvtier.store, "OWNER") and not hasattr(kvtier.bench, "OWNER")
        assert kvtier.store.TieredStore is TieredStore
        print("ok")
    """)
    r = child(code, tmp_path, env={"PYTHONSAFEPATH": ""})   # "" = off: the project's cwd is on sys.path
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


# ----------------------------------------------------------------------------- a slim core
def test_core_imports_without_the_extras_packages(tmp_path):
    # What a store/policy/plugin-common user gets without extras: none of the heavy packages load.
    code = ("import sys, json\n" + "".join(f"import {m}\n" for m in CORE)
            + f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & set({list(HEAVY)!r}))))")
    r = child(code, tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == []


def test_core_works_with_every_extra_missing(tmp_path):
    # The same with the extras' packages made uninstalled: the modules import, and the CLI's
    # help and a pure-arithmetic command still run (plan --json needs no rich).
    code = (f"BLOCKED = {list(HEAVY)!r}\n" + BLOCKER + "".join(f"import {m}\n" for m in CORE) + "print('ok')")
    r = child(code, tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
    r = kvtier_blocked(tmp_path, HEAVY, "--help")
    assert r.returncode == 0 and "plan" in r.stdout, r.stderr
    r = kvtier_blocked(tmp_path, HEAVY, "plan", "capacity", "--model", "llama-3.1-8b", "--context", "8192", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["rows"][0]["context_tokens"] == 8192


ENGINE_CHECK = textwrap.dedent("""
    import importlib.abc, json, sys
    HEAVY = set(sys.argv[2].split(","))
    culprits = []
    class _Who(importlib.abc.MetaPathFinder):
        # Records which module asked for a heavy package; never changes what is imported.
        def find_spec(self, fullname, path=None, target=None):
            if fullname.split(".")[0] in HEAVY and fullname not in sys.modules:
                f = sys._getframe(1)
                while f is not None and (f.f_globals.get("__name__", "").startswith(("importlib", "_frozen"))
                                         or f.f_code.co_filename.startswith("<frozen")):
                    f = f.f_back
                who = f.f_globals.get("__name__", "?") if f is not None else "?"
                if who.split(".")[0] == "kvtier":
                    culprits.append((who, fullname))
            return None
    sys.meta_path.insert(0, _Who())
    import importlib
    for name in sys.argv[1].split(","):
        importlib.import_module(name)
    print(json.dumps(culprits))
""")


@pytest.mark.slow
def test_engine_plugins_pull_no_extra_package_themselves(tmp_path):
    # vLLM and SGLang import transformers (and vLLM fastapi) on their own; no kvtier module may.
    # (One child for both engines: they share torch and transformers, so it costs ~1.3 imports.)
    import importlib.util
    engines = [e for e in ("vllm", "sglang") if importlib.util.find_spec(e) is not None]
    if not engines:
        pytest.skip("no engine package installed")
    plugins = ",".join(f"kvtier.engine_adapter.{e}" for e in engines)
    r = child(ENGINE_CHECK, tmp_path, plugins, ",".join(HEAVY), timeout=170)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == []


# ----------------------------------------------------------------------------- missing extras
@pytest.mark.parametrize("argv, blocked, extra", [
    (["demo", "--json"], ("transformers",), "demo"),
    (["demo"], ("rich",), "demo"),
    (["serve", "--port", "0"], ("fastapi",), "service"),
    (["serve", "--port", "0"], ("uvicorn",), "service"),
    (["bench", "service", "--requests", "1"], ("httpx",), "client"),
])
def test_a_missing_extra_is_one_line_naming_the_pip_install(tmp_path, argv, blocked, extra):
    r = kvtier_blocked(tmp_path, blocked, *argv, *(["--data-dir", str(tmp_path / "d")] if argv[0] == "serve" else []))
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and r.stdout == ""
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    command = "kvtier " + " ".join(a for a in argv[:2] if not a.startswith("-"))
    assert lines[0].startswith(f"{command}: error: needs the '{blocked[0]}' package: "), lines
    assert lines[0].endswith(f"pip install 'kvtier[{extra}]'"), lines


# ----------------------------------------------------------------------------- the wheel
@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel built from a copy of the working tree (tracked and untracked, not ignored files):
    no build/ left over from an earlier build can leak stale modules into it."""
    src = tmp_path_factory.mktemp("src")
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, capture_output=True,
                           check=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        if (REPO / rel).is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, src / rel)
    out = tmp_path_factory.mktemp("wheel")
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                        "-w", str(out), str(src)], capture_output=True, text=True, timeout=170)
    assert r.returncode == 0, r.stderr[-3000:]
    (whl,) = out.glob("kvtier-*.whl")
    return whl


@pytest.mark.slow
def test_wheel_installs_one_root_with_every_subpackage(wheel):
    z = zipfile.ZipFile(wheel)
    names = z.namelist()
    (top,) = [n for n in names if n.endswith(".dist-info/top_level.txt")]
    assert z.read(top).decode().split() == ["kvtier"]
    assert {n.split("/")[0] for n in names} == {"kvtier", top.split("/")[0]}
    # Every package of the source layout is in the wheel (a subpackage missing from
    # pyproject's `packages` would import in the editable install and be absent here).
    want = set()
    for folder, dotted in ROOTS.items():
        for init in (REPO / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(REPO / folder)
            if "__pycache__" not in rel.parts:
                want.add("/".join([*dotted.split("."), *rel.parts, "__init__.py"]))
    assert want <= set(names), sorted(want - set(names))
    ep = z.read(top.replace("top_level.txt", "entry_points.txt")).decode()
    assert "kvtier = kvtier.cli.main:main" in ep
    # The license in its SPDX form, with the file that states it; the core requires no extra's package.
    meta = z.read(top.replace("top_level.txt", "METADATA")).decode().splitlines()
    assert "License-Expression: Apache-2.0" in meta
    assert "Apache License" in z.read(top.replace("top_level.txt", "licenses/LICENSE")).decode()[:200]
    core = [ln for ln in meta if ln.startswith("Requires-Dist:") and "extra ==" not in ln]
    assert core and not any(pkg in ln for ln in core for pkg in HEAVY), core
    # The trace samples the trace commands read by default ship with their licence notices, and stay small.
    data = {n: z.getinfo(n).file_size for n in names if n.startswith("kvtier/data/traces/")}
    assert {"kvtier/data/traces/NOTICE.md", "kvtier/data/traces/mooncake/conversation_trace.sample.jsonl",
            "kvtier/data/traces/mooncake/LICENSE-APACHE",
            "kvtier/data/traces/tracelab/example_sanitized_round_trace.jsonl",
            "kvtier/data/traces/tracelab/LICENSE-DATASET.md"} <= set(data), sorted(data)
    assert sum(data.values()) < 200_000, data


@pytest.mark.slow
def test_wheel_runs_from_another_directory(wheel, tmp_path):
    # Installed without its dependencies (they are this machine's), ahead of the editable install.
    site = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site),
                        str(wheel)], capture_output=True, text=True, timeout=170)
    assert r.returncode == 0, r.stderr[-3000:]
    code = textwrap.dedent("""
        import json, sys, kvtier, kvtier.store, kvtier.cli.main
        try:
            import store
        except ModuleNotFoundError:
            store = None
        print(json.dumps({"kvtier": kvtier.__file__, "store": kvtier.store.__file__, "old": store is not None}))
    """)
    env = {"PYTHONPATH": str(site)}
    r = child(code, tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert Path(out["kvtier"]).is_relative_to(site) and Path(out["store"]).is_relative_to(site), out
    assert out["old"] is False
    r = child("import runpy, sys; sys.argv[0] = 'kvtier'; runpy.run_module('kvtier', run_name='__main__')",
              tmp_path, "plan", "breakeven", "--model", "llama-3.1-8b", "--context", "32768", "--wait", "5",
              "--json", env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["decisions"][0]["wait_s"] == 5
    # A trace command with no input reads the packaged sample, from any directory.
    r = child("import runpy, sys; sys.argv[0] = 'kvtier'; runpy.run_module('kvtier', run_name='__main__')",
              tmp_path, "bench", "trace", "mooncake", "--out", str(tmp_path / "mc.jsonl"), "--json",
              env={**env, "KVTIER_TRACES": ""})
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["lines"] == 480 and "packaged mooncake sample" in r.stderr
