"""The live soak's fault classes on a real redis-server (127.0.0.1, its own port, stopped by
PID) and on real files: each injects what it says, and its recover undoes it."""
from __future__ import annotations

import random
import shutil

import pytest

from kvtier.bench.live.cluster import ClusterSpec
from kvtier.bench.soak_live.faults import FaultError, RedisEvict, RedisKill, RedisStop, SlabFlip, flip_bytes
from kvtier.bench.soak_live.redis_ctl import RedisCtlError, command
from kvtier.bench.soak_live.rig import Rig

needs_redis = pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed")


@pytest.fixture
def rig(tmp_path):
    r = Rig(ClusterSpec(model="unused", workdir=tmp_path, engines=1))
    r.start_redis()
    yield r
    r.close()


def test_flip_bytes_inverts_exactly_the_offsets_it_names(tmp_path):
    p = tmp_path / "slab-00000.kv"
    before = bytes(range(256)) * 16
    p.write_bytes(before)
    offsets = flip_bytes(p, random.Random(1), 10)
    after = p.read_bytes()
    changed = [i for i in range(len(before)) if before[i] != after[i]]
    assert changed == sorted(set(offsets))
    assert all(after[i] == before[i] ^ 0xFF for i in changed)


def test_flip_bytes_of_an_empty_or_missing_file_is_a_fault_error(tmp_path):
    (tmp_path / "empty").write_bytes(b"")
    with pytest.raises(FaultError):
        flip_bytes(tmp_path / "empty", random.Random(0), 1)
    with pytest.raises(FaultError):
        flip_bytes(tmp_path / "missing", random.Random(0), 1)


def test_slab_flip_without_a_slab_file_is_a_fault_error_and_with_one_damages_it(tmp_path):
    r = Rig(ClusterSpec(model="unused", workdir=tmp_path, engines=1))
    with pytest.raises(FaultError, match="no slab file"):
        SlabFlip().inject(r, random.Random(0))
    slab = r.data_dir / "model-w1" / "slabs" / "slab-00000.kv"
    slab.parent.mkdir(parents=True)
    slab.write_bytes(b"\0" * 65536)
    SlabFlip().inject(r, random.Random(0))
    assert slab.read_bytes().count(b"\xff") > 0


@needs_redis
def test_redis_stop_freezes_the_server_and_recover_thaws_it(rig):
    RedisStop().inject(rig, random.Random(0))
    with pytest.raises(RedisCtlError):
        command(rig.redis_port, "PING", timeout_s=0.5)
    RedisStop().recover(rig, random.Random(0))
    assert command(rig.redis_port, "PING") == b"PONG"


@needs_redis
def test_redis_kill_loses_the_data_and_recover_restarts_on_the_same_port(rig):
    command(rig.redis_port, "SET", "k", "v")
    old = rig.redis.pid
    RedisKill().inject(rig, random.Random(0))
    with pytest.raises(RedisCtlError):
        command(rig.redis_port, "PING", timeout_s=0.5)
    RedisKill().recover(rig, random.Random(0))
    assert rig.redis.pid != old
    assert command(rig.redis_port, "GET", "k") == b""          # restarted empty (no persistence)


@needs_redis
def test_redis_evict_caps_memory_and_evicts_then_recover_lifts_the_cap(rig):
    RedisEvict().inject(rig, random.Random(0))
    for i in range(64):                                          # 64 x 64 KiB against a 1 MiB cap
        command(rig.redis_port, "SET", f"k{i}", "x" * 65536)
    assert int(command(rig.redis_port, "DBSIZE")) < 64
    RedisEvict().recover(rig, random.Random(0))
    for i in range(64):
        command(rig.redis_port, "SET", f"k{i}", "x" * 65536)
    assert int(command(rig.redis_port, "DBSIZE")) == 64


def test_the_cli_names_every_fault_kind_the_soak_implements():
    from kvtier.bench.soak_live.cmd import KINDS
    from kvtier.bench.soak_live.faults import fault_kinds
    assert sorted(KINDS) == sorted(fault_kinds(512, 256))


def test_the_soak_plans_every_kind_this_host_runs_and_refuses_one_named_that_cannot():
    from kvtier.bench.soak_live.fsmount import why_not
    from kvtier.bench.soak_live.run import plannable
    from kvtier.bench.soak_live.faults import fault_kinds
    known = list(fault_kinds(512, 256))
    kinds, left = plannable(None, known, None)           # no mount: fs-full left out, with why
    assert kinds == [k for k in known if k != "fs-full"] and left == {"fs-full": "--data-mib 0"}
    kinds, left = plannable(None, known, 256)
    assert (kinds, left) == ((known, {}) if why_not() is None else (kinds, {"fs-full": why_not()}))
    assert plannable(["redis-kill"], known, None) == (["redis-kill"], {})
    with pytest.raises(ValueError, match="fs-full needs kvtier's data dir on a size-limited mount: --data-mib 0"):
        plannable(["redis-kill", "fs-full"], known, None)
    with pytest.raises(ValueError, match="unknown fault kind 'nope'"):
        plannable(["nope"], known, 256)
    with pytest.raises(ValueError, match="at least one"):
        plannable([], known, 256)
