"""``bench tiers --peer lmcache``: LMCache driven in its own environment, bytes checked.

The environment is built from PyPI on first use (a few minutes, once; reused
after) under ``$KVTIER_PEER_ENV_DIR`` or ``~/.cache/kvtier/peers``.  The test
skips, with the reason, only when the build fails AND the package index cannot
be reached; a build that fails with the index reachable is a failure.
"""
from __future__ import annotations

import hashlib
import subprocess
import sys

import numpy as np
import pytest

from kvtier.bench.peers import lmcache as peer
from remote_servers import redis_server  # noqa: F401  (fixture)

# the first run builds the env (minutes, once): more than the suite's 300 s per test
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]
SIZES = [64 << 10, 1 << 20]
TOTAL = 4 << 20


def _index_reachable() -> tuple[bool, str]:
    res = subprocess.run([sys.executable, "-m", "pip", "index", "versions", f"lmcache=={peer.LMCACHE_VERSION}"],
                         capture_output=True, text=True, timeout=120)
    lines = [ln for ln in (res.stdout + res.stderr).splitlines() if ln.strip() and "ignored" not in ln]
    return res.returncode == 0 and peer.LMCACHE_VERSION in res.stdout, lines[-1] if lines else ""


@pytest.fixture(scope="module")
def peer_python():
    base = peer.default_env_dir()
    try:
        return peer.ensure_env(base, print)
    except peer.PeerUnavailable as exc:
        ok, why = _index_reachable()
        if not ok:
            pytest.skip(f"LMCache's environment cannot be built (package index unreachable: {why}): {exc}")
        raise


@pytest.fixture(scope="module")
def src():
    return np.random.default_rng(7).integers(0, 256, TOTAL, dtype=np.uint8)


def test_every_backend_returns_the_source_bytes(peer_python, src, tmp_path, redis_server):  # noqa: F811
    # a fake kvtier row per size, so the ratios are filled in
    kv = [{"block_bytes": s, "put_gbps": 1.0, "get_gbps": 2.0} for s in SIZES]
    res = peer.lmcache_peer(SIZES, TOTAL, 1, src, kv, kv, tmp_path, remote_url=redis_server.url, warmup=1)
    assert isinstance(res, dict), res
    assert res["lmcache_version"] == peer.LMCACHE_VERSION
    got = {(r["backend"], r["read"], r["block_bytes"]) for r in res["rows"]}
    want = {(b, rd, s) for s in SIZES for b, rd in (("cpu", "warm"), ("disk", "warm"), ("disk", "cold"),
                                                    ("disk_odirect", "cold"), ("redis", "warm"),
                                                    ("redis_resp", "warm"))}
    assert got == want
    for r in res["rows"]:
        n = TOTAL // r["block_bytes"] * r["block_bytes"]
        # the peer's bytes, as it read them back in its last round, are the source's
        assert r["read_sha256"] == hashlib.sha256(src[:n].tobytes()).hexdigest(), r
        assert r["put_gbps"] > 0 and r["get_gbps"] > 0
        assert ("put_synced_gbps" in r) == r["backend"].startswith("disk")
        if r["backend"].startswith("redis"):   # no kvtier remote rows given: no ratio
            assert "kvtier_get_vs_peer" not in r
            continue
        assert r["kvtier_get_vs_peer"] == pytest.approx(2.0 / r["get_gbps"])
        if r["backend"].startswith("disk"):
            assert r["kvtier_put_vs_peer_synced"] == pytest.approx(1.0 / r["put_synced_gbps"])
    # redis keys were deleted after each round
    assert redis_server.client().dbsize() == 0


def test_driver_refuses_missing_or_wrong_blocks():
    # the driver's check, run here (kvtier's env has torch): a block that did not
    # come back, or came back different, is an error, never a fast row
    import torch
    drv = pytest.importorskip("kvtier.bench.peers.lmcache_driver")
    blocks = [torch.arange(8, dtype=torch.uint8), torch.ones(8, dtype=torch.uint8)]
    drv._check("disk", 2, 2, [b.clone() for b in blocks], blocks)
    with pytest.raises(RuntimeError, match="did not come back"):
        drv._check("disk", 1, 2, [b.clone() for b in blocks], blocks)
    bad = [blocks[0].clone(), torch.zeros(8, dtype=torch.uint8)]
    with pytest.raises(RuntimeError, match="wrong bytes"):
        drv._check("disk", 2, 2, bad, blocks)


def test_unbuildable_env_is_a_reason_not_a_crash(tmp_path, src):
    # an env dir that cannot be created: the peer section is one line, the bench goes on
    blocker = tmp_path / "file"
    blocker.write_text("x")
    res = peer.lmcache_peer(SIZES, TOTAL, 1, src, [], [], tmp_path, env_dir=blocker / "sub")
    assert isinstance(res, str) and res.startswith("unavailable: "), res
