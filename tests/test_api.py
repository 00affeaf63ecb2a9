"""The top-level API: the README's snippet runs from ``kvtier`` imports alone; ``import kvtier`` is cheap;
one version everywhere; the user cache folder follows XDG."""
from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import textwrap

import kvtier

SNIPPET = textwrap.dedent("""
    import json
    import numpy as np
    from kvtier import (TieredStore, StoreConfig, StoreError, ToolWaitPredictor, make_policy, PauseContext,
                        chain_keys, Namespace, get_preset, get_node)

    token_ids = list(range(64))
    keys = chain_keys(token_ids, block_tokens=16, namespace=Namespace("llama-3.1-70b", "bf16"))
    buf = np.full(1 << 16, 7, dtype=np.uint8)
    out = np.zeros(1 << 16, dtype=np.uint8)
    with TieredStore.open(StoreConfig(root="kvtier-data", host_bytes=1 << 20,
                                      nvme_bytes=8 << 20, block_bytes=1 << 16)) as st:
        st.put(keys[0], buf)
        hit = st.get(keys[0], out)
        prefix = st.lookup(keys)
    pred = ToolWaitPredictor(path="kvtier-data/predictor")
    policy = make_policy("breakeven", geometry=get_preset("llama-3.1-70b"),
                         hardware=get_node("h100x8"), predictor=pred)
    d = policy.decide(PauseContext(tool="pytest", kv_bytes=10_700_000_000, context_tokens=32_768))
    print(json.dumps({"hit": hit, "same": bool((out == 7).all()), "prefix": prefix, "keys": len(keys),
                      "action": str(d.action), "error_is_exception": issubclass(StoreError, Exception)}))
""")


def _child(code: str, cwd) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVTIER_") and k != "PYTHONPATH"}
    env["PYTHONSAFEPATH"] = "1"
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)


def test_readme_snippet_runs_from_kvtier_imports_alone(tmp_path):
    import json
    r = _child(SNIPPET, tmp_path)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout.strip().splitlines()[-1])
    assert doc["hit"] is True and doc["same"] is True
    assert doc["keys"] == 4 and doc["prefix"] == 1       # one of the four blocks was stored
    assert doc["action"] and doc["error_is_exception"]


def test_import_kvtier_is_cheap_and_lists_its_api(tmp_path):
    r = _child("import sys, kvtier; print(sorted(m for m in ('torch', 'kvtier.store', 'kvtier.tiering') "
               "if m in sys.modules))", tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"
    for name in kvtier.__all__:
        assert getattr(kvtier, name) is not None, name
    assert kvtier.TieredStore.__module__.startswith("kvtier.store")


def test_one_version_everywhere(tmp_path):
    assert kvtier.__version__ == importlib.metadata.version("kvtier")
    from kvtier.tiering.service.app import ServiceConfig, create_app
    from kvtier.tiering.service.state import StateConfig
    app = create_app(ServiceConfig(state=StateConfig(data_dir=str(tmp_path))))
    assert app.openapi()["info"]["version"] == kvtier.__version__


def test_cache_folder_follows_xdg(monkeypatch, tmp_path):
    from kvtier.util.paths import cache_dir
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_dir("peers") == tmp_path / "kvtier" / "peers"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir("peers") == tmp_path / "home" / ".cache" / "kvtier" / "peers"
