"""`kvtier serve` as a real subprocess: it prints where it listens, serves,
stops cleanly on SIGINT and SIGTERM, keeps its state, and refuses unsafe
configurations with one line and exit 2.  `kvtier bench service` runs a
bounded load test end to end."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parent.parent


def kvtier(*args, **kw):
    env = {k: v for k, v in os.environ.items() if k not in ("KVTIER_TOKEN", "KVTIER_DATA_ROOT")}
    env.update(kw.pop("env", {}))
    return subprocess.run([sys.executable, "-m", "kvtier", *args], capture_output=True, text=True,
                          cwd=REPO, env=env, timeout=120, **kw)


def serve(*args, env=None):
    e = {k: v for k, v in os.environ.items() if k not in ("KVTIER_TOKEN", "KVTIER_DATA_ROOT")}
    e.update(env or {})
    proc = subprocess.Popen([sys.executable, "-m", "kvtier", "serve", "--port", "0", "--json",
                             "--log-level", "warning", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=e)
    line = proc.stdout.readline()
    assert line, proc.stderr.read()
    return proc, json.loads(line)


def stop(proc, sig=signal.SIGINT):
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    return proc.returncode, out, err


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_serve_prints_json_serves_and_stops_cleanly(tmp_path, sig):
    # Start on a free port; the first stdout line is one JSON document.
    proc, info = serve("--data-dir", str(tmp_path / "d"))
    try:
        assert set(info) >= {"url", "docs", "metrics", "data_dir", "auth", "pid"}
        assert info["auth"] is False and info["url"].startswith("http://127.0.0.1:")
        # It serves: learn one duration.
        with httpx.Client(base_url=info["url"], timeout=10) as c:
            assert c.get("/healthz").json()["status"] == "ok"
            c.post("/v1/tools/bash/observations", json={"wait_s": 2.0}).raise_for_status()
    finally:
        rc, out, err = stop(proc, sig)
    # A clean stop: exit 0, nothing more on stdout, no traceback.
    assert rc == 0, err
    assert out.strip() == "" and "Traceback" not in err
    # A second run over the same data dir still knows the duration.
    proc, info = serve("--data-dir", str(tmp_path / "d"))
    try:
        if sig == signal.SIGINT:
            # ...and while it runs, a third on the same data dir is refused with one line.
            r = kvtier("serve", "--data-dir", str(tmp_path / "d"))
            assert r.returncode == 2 and "in use by another kvtier service" in r.stderr, r.stderr
        with httpx.Client(base_url=info["url"], timeout=10) as c:
            assert c.get("/v1/tools/bash/forecast").json()["n"] == 1
            assert c.get("/healthz").json()["boot"] == 2
    finally:
        stop(proc)


def test_serve_with_token_from_environment(tmp_path):
    token = "env-token-0123456789abcdef"
    proc, info = serve("--data-dir", str(tmp_path / "d"), env={"KVTIER_TOKEN": token})
    try:
        assert info["auth"] is True
        with httpx.Client(base_url=info["url"], timeout=10) as c:
            assert c.post("/v1/tools/x/observations", json={"wait_s": 1}).status_code == 401
            assert c.post("/v1/tools/x/observations", json={"wait_s": 1},
                          headers={"Authorization": f"Bearer {token}"}).status_code == 200
    finally:
        stop(proc)


@pytest.mark.parametrize("args, message", [
    (["--host", "0.0.0.0"], "without a token"),
    (["--host", "0.0.0.0", "--token", "short"], "at least 16"),
    (["--port", "70000"], "--port"),
    (["--model-typo"], "unrecognized arguments"),
])
def test_serve_refuses_unsafe_or_bad_config(tmp_path, args, message):
    r = kvtier("serve", "--data-dir", str(tmp_path / "d"), *args)
    assert r.returncode == 2
    assert message in r.stderr and "Traceback" not in r.stderr
    assert r.stderr.strip().count("\n") == 0 and r.stdout == ""


@pytest.mark.parametrize("cmd, args, message", [
    # an empty --token used to start an OPEN server whose start-up line said "auth": true
    (["serve"], ["--token", ""], "--token is empty"),
    # a data dir that cannot be created used to end in a FileNotFoundError/NotADirectoryError traceback
    (["serve"], ["--data-dir", "{file}/sub"], "cannot create data dir"),
    (["bench", "service"], ["--data-dir", "{file}"], "not a directory"),
    # NaN passed the `<= 0` check and ran a load test with no time cap
    (["bench", "service"], ["--max-seconds", "nan"], "--max-seconds"),
])
def test_hostile_config_exits_2_before_serving(tmp_path, cmd, args, message):
    f = tmp_path / "plain-file"
    f.write_text("x")
    r = kvtier(*cmd, *[a.format(file=f) for a in args])
    assert r.returncode == 2, r.stderr
    assert message in r.stderr and "Traceback" not in r.stderr
    assert r.stderr.strip().count("\n") == 0 and r.stdout == ""


@pytest.mark.parametrize("args, env, message", [
    (["--token", " " * 20], {}, "--token: the bearer token is empty or whitespace only"),
    (["--token", " " + "s" * 20], {}, "--token: the bearer token starts or ends with whitespace"),
    ([], {"KVTIER_TOKEN": " " * 20}, "KVTIER_TOKEN: the bearer token is empty or whitespace only"),
    ([], {"KVTIER_TOKEN": "s" * 20 + " "}, "KVTIER_TOKEN: the bearer token starts or ends with whitespace"),
])
def test_blank_or_padded_token_is_refused_at_start(tmp_path, args, env, message):
    # Regression: such a token started a server nobody could authenticate to.
    r = kvtier("serve", "--data-dir", str(tmp_path / "d"), *args, env=env)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr and "Traceback" not in r.stderr
    assert r.stderr.strip().count("\n") == 0 and r.stdout == ""
    assert not (tmp_path / "d" / "service.lmdb").exists()   # refused before any state opened


def test_data_dir_is_confined_to_the_data_root(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    (root / "link").symlink_to(tmp_path)          # a symlink pointing outside the root
    # Escaping through a symlink is refused with one line, exit 2, nothing created.
    # (The other escapes are unit-tested in test_service_state.py.)
    r = kvtier("serve", "--data-root", str(root), "--data-dir", "link/escaped")
    assert r.returncode == 2 and "escapes the data root" in r.stderr, r.stderr
    assert not (tmp_path / "escaped").exists()
    # Inside the root is fine (relative to it), and the state lands there.
    proc, info = serve("--data-dir", "svc", env={"KVTIER_DATA_ROOT": str(root)})
    stop(proc)
    assert Path(info["data_dir"]) == (root / "svc").resolve()
    assert (root / "svc" / "service.lmdb").is_dir()


def test_bench_service_small_run(tmp_path):
    # A tiny, bounded load run: every request answered 2xx, shape as documented.
    r = kvtier("bench", "service", "--json", "--clients", "4", "--requests", "40", "--paused", "50",
               "--max-seconds", "20", "--data-dir", str(tmp_path))
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert set(res["endpoints"]) == {"healthz", "forecast", "decision", "pause_resume"}
    for name, ep in res["endpoints"].items():
        assert ep["requests"] == 40 and ep["errors"] == 0, (name, ep)
        assert ep["p50_ms"] <= ep["p99_ms"] and ep["rps"] > 0
    assert res["in_process"]["paused"] == 50
