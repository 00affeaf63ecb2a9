"""The service state below HTTP: guards, the LMDB trajectory registry across
restarts (restored / lost / corrupt), refusals that change nothing, and
concurrent use.  Real LMDB under tmp_path, the real predictor and policy."""
from __future__ import annotations

import threading

import lmdb
import pytest

from kvtier.tiering.service.security import check_bind, check_data_dir, confined_path, is_loopback, token_matches
from kvtier.tiering.service.state import (Conflict, DecideRequest, Gone, NotFound, ServiceState, StateConfig, TooMany,
                                   TrajectoryRecord, Unprocessable)

MODEL = "llama-3.1-8b"


def open_state(path, **kw) -> ServiceState:
    return ServiceState(StateConfig(data_dir=path, **kw))


# ----------------------------------------------------------------------------- guards
def test_confined_path_refuses_every_escape(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    (root / "out").symlink_to(tmp_path)
    assert confined_path(root, "a", "b.lmdb") == (root / "a" / "b.lmdb").resolve()
    assert confined_path(root) == root.resolve()
    for parts in (("..",), ("a", "..", "..", "x"), (str(tmp_path / "x"),), ("out", "x")):
        with pytest.raises(ValueError, match="escapes the data root"):
            confined_path(root, *parts)
    # check_data_dir: relative to the root, created on demand, escapes refused.
    assert check_data_dir("svc", root) == (root / "svc").resolve() and (root / "svc").is_dir()
    with pytest.raises(ValueError, match="escapes"):
        check_data_dir("../svc", root)
    (root / "file").write_text("x")
    with pytest.raises(ValueError, match="not a directory"):
        check_data_dir("file", root)


def test_bind_and_token_guards():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("::") and not is_loopback("no-such-host.invalid")
    with pytest.raises(ValueError):
        check_bind("0.0.0.0", None)
    check_bind("0.0.0.0", "x" * 16)
    assert token_matches("Bearer " + "s" * 20, "s" * 20)
    assert token_matches("bearer " + "s" * 20, "s" * 20)
    for bad in (None, "", "s" * 20, "Basic " + "s" * 20, "Bearer " + "s" * 19, "Bearer " + "t" * 20):
        assert not token_matches(bad, "s" * 20)


def test_record_checksum():
    rec = TrajectoryRecord(trajectory_id="t", tool="bash", paused_at=1.5, boot=3, action="offload_host",
                           kv_bytes=10, moved_bytes=4, forecast_p50=2.0, features={"cmd": "ls"})
    raw = rec.encode()
    assert TrajectoryRecord.decode(raw) == rec
    flipped = raw[:-2] + bytes([raw[-2] ^ 1]) + raw[-1:]
    with pytest.raises(ValueError, match="checksum"):
        TrajectoryRecord.decode(flipped)
    with pytest.raises(ValueError):
        TrajectoryRecord.decode(b"\0\0")


# ----------------------------------------------------------------------------- restarts
def test_corrupt_record_is_reported_lost_never_served(tmp_path):
    # Boot 1: two paused trajectories.
    with open_state(tmp_path) as st:
        st.pause("good", "bash", DecideRequest(tool="bash", context_tokens=1000, model=MODEL))
        st.pause("bad", "bash")
    # Between boots, one record's bytes rot on disk.
    env = lmdb.open(str(tmp_path / "service.lmdb"), max_dbs=8)
    with env.begin(write=True) as txn:
        db = env.open_db(b"traj", txn=txn)
        raw = txn.get(b"bad", db=db)
        txn.put(b"bad", raw[:-1] + b"#", db=db)
    env.close()
    # Boot 2: the good one is restored with its decision; the corrupt one is lost, with the reason.
    with open_state(tmp_path) as st:
        assert st.boot == 2
        assert st.paused("good").action is not None and st.paused("bad") is None
        lost = st.lost()
        assert set(lost) == {"bad"} and "checksum" in lost["bad"]["reason"]
        assert st.stats()["lost_after_restart"] == 1 and st.stats()["restored_after_restart"] == 1
        res = st.resume("good", wait_s=3.0)
        assert res.restored and res.record.action is not None and res.wait_s == 3.0
        with pytest.raises(Gone, match="checksum"):
            st.resume("bad")
        with pytest.raises(NotFound):
            st.resume("bad")


def test_reused_id_after_loss_supersedes_the_report(tmp_path):
    with open_state(tmp_path) as st:
        st.pause("t", "bash")
    with open_state(tmp_path, lost_after_s=0.0) as st:
        assert set(st.lost()) == {"t"}
        # The harness starts a fresh trajectory under the same id: the stale report goes.
        st.pause("t", "bash")
        assert st.lost() == {}
        assert st.resume("t", wait_s=1.0).restored is False


# ----------------------------------------------------------------------------- refusals
def test_refusals_change_nothing_on_disk_or_in_memory(tmp_path):
    with open_state(tmp_path, max_tools=2, max_paused=2) as st:
        st.observe("a", 1.0)
        st.observe("b", 2.0)
        # Known tools keep learning.
        assert st.observe("a", 1.5) == 2
        # Bad numbers and names are refused before anything is learned.
        for tool, w in (("a", -1.0), ("a", float("nan")), ("a", float("inf"))):
            with pytest.raises(Unprocessable):
                st.observe(tool, w)
        with pytest.raises(Unprocessable):
            st.observe("a", 1.0, {"k": "v" * 100})
        # Pauses: a duplicate is a conflict; beyond max_paused is refused.
        st.pause("p1", "a")
        with pytest.raises(Conflict):
            st.pause("p1", "a")
        st.pause("p2", "a")
        with pytest.raises(TooMany):
            st.pause("p3", "a")
        # A decision for an unknown model or policy is refused, counters unchanged.
        before = st.stats()["decisions"]
        with pytest.raises(Unprocessable, match="unknown model preset"):
            st.decide(DecideRequest(tool="a", context_tokens=10, model="nope"))
        with pytest.raises(Unprocessable, match="unknown policy"):
            st.decide(DecideRequest(tool="a", context_tokens=10, model=MODEL, policy="nope"))
        assert st.stats()["decisions"] == before
        stats = st.stats()
    # After a restart, exactly the accepted state is there.
    with open_state(tmp_path, max_tools=2) as st:
        s = st.stats()
        assert s["tools"] == 2 and s["observations"] == stats["observations"] == 3
        assert s["paused"] == 2 and st.paused("p3") is None
        assert st.forecast("a").n == 2 and st.forecast("a").source == "tool"
        assert st.forecast("c").source != "tool"     # never learned: answered by a fallback level


def test_tools_past_max_tools_fold_the_least_recently_seen_into_the_prior(tmp_path):
    with open_state(tmp_path, max_tools=2) as st:
        st.observe("a", 1.0)
        st.observe("b", 2.0)
        st.observe("a", 1.5)            # a is now the most recently seen
        # a third tool is learned; b, the least recently seen, is folded into its class prior
        assert st.observe("c", 3.0) == 1
        s = st.stats()
        assert s["tools"] == 2 and s["tools_folded"] == 1
        assert st.forecast("b").source != "tool" and st.forecast("a").n == 2
        # b comes back as a new tool (folding a), learning from its prior again
        assert st.observe("b", 2.0) == 1
        assert st.stats()["tools_folded"] == 2 and st.forecast("a").source != "tool"
    # the fold is persisted: after a restart the same two tools are known
    with open_state(tmp_path, max_tools=2) as st:
        assert st.stats()["tools"] == 2
        assert st.forecast("a").source != "tool" and st.forecast("b").n == 1 and st.forecast("c").n == 1


# ----------------------------------------------------------------------------- concurrency
def test_concurrent_pause_resume_keeps_counts_consistent(tmp_path):
    n_threads, per = 6, 40
    errors: list[BaseException] = []
    with open_state(tmp_path) as st:
        def worker(k: int) -> None:
            try:
                for i in range(per):
                    tid = f"w{k}-{i}"
                    st.pause(tid, "tool", DecideRequest(tool="tool", context_tokens=512 * (i + 1), model=MODEL))
                    st.resume(tid, wait_s=0.1 * (i % 5 + 1))
            except BaseException as exc:  # surfaced below
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(n_threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        s = st.stats()
        # Every pause was decided and resumed exactly once, every wait learned once.
        assert s["paused"] == 0 and sum(s["decisions"].values()) == n_threads * per
        assert st.forecast("tool").n == n_threads * per
        assert all(t == {"trajectories": 0, "bytes": 0} for t in s["tiers"].values())


def test_closed_state_refuses(tmp_path):
    st = open_state(tmp_path)
    st.close()
    st.close()  # idempotent
    with pytest.raises(Exception, match="closed"):
        st.observe("a", 1.0)


# ----------------------------------------------------------------------------- leases
_DEPTH = {"retain": 0, "offload_host": 1, "offload_nvme": 2, "recompute": 3}


def test_lease_expiry_demotes_and_the_demotion_survives_a_restart(tmp_path):
    import math
    import random
    rng = random.Random(1)
    with open_state(tmp_path) as st:
        # An approval-like tool with a heavy tail (median 30 s).
        for _ in range(200):
            st.observe("approve", 30 * math.exp(rng.gauss(0, 1.5)))
        # Host DRAM 75% full (the caller says so): holding in DRAM has its price (it is nearly
        # free while the host tier is mostly empty, and a long wait would rightly stay there).
        from kvtier.tiering.model.presets import DEFAULT_NODE, get_node
        host_free = 0.25 * get_node(DEFAULT_NODE).host_bytes
        d = st.pause("t", "approve", DecideRequest(tool="approve", context_tokens=30_000, model="llama-3.1-70b",
                                                   host_free_bytes=host_free))
        first = d.decision.decision
        assert first.demote_at_s is not None, "a lower-tier placement carries a lease"
        # The tool outlives leases of growing length: placements only ever go deeper,
        # and the tier counts follow the placement.
        actions = [first.action.value]
        for elapsed in (first.demote_at_s, 10 * first.demote_at_s, 100 * first.demote_at_s):
            res = st.lease_expired("t", elapsed)
            assert _DEPTH[res.record.action] >= _DEPTH[actions[-1]]
            assert res.changed == (res.record.action != actions[-1])
            actions.append(res.record.action)
            tiers = st.stats()["tiers"]
            tier = {"retain": "hbm", "offload_host": "host", "offload_nvme": "nvme"}[res.record.action]
            assert tiers[tier]["trajectories"] == 1 and sum(t["trajectories"] for t in tiers.values()) == 1
        # A heavy tail that lasts 100 leases ends up off the host.
        assert actions[-1] != actions[0], actions
        final = actions[-1]
        # No decision, no lease: refused, nothing changes.
        st.pause("plain", "approve")
        with pytest.raises(Unprocessable, match="without a decision"):
            st.lease_expired("plain")
        with pytest.raises(NotFound):
            st.lease_expired("ghost")
    # The demoted placement is what a restart restores.
    with open_state(tmp_path) as st:
        assert st.paused("t").action == final
        assert st.resume("t", wait_s=5000.0).record.action == final


def test_one_service_per_data_dir(tmp_path):
    # A second state on the same data dir is refused while the first is open...
    with open_state(tmp_path):
        with pytest.raises(ValueError, match="in use by another kvtier service"):
            open_state(tmp_path)
    # ...and allowed once it closed.
    with open_state(tmp_path) as st:
        assert st.boot == 2


def test_failed_start_releases_flock_and_lmdb_env_so_a_retry_opens(tmp_path):
    # Regression: ServiceState.__init__ kept its flock and LMDB environment when _boot_up raised,
    # so a retry in the same process said "in use by another kvtier service".
    with open_state(tmp_path):
        pass
    # The data dir now claims a schema this build cannot read: the start fails with that reason...
    env = lmdb.open(str(tmp_path / "service.lmdb"), max_dbs=8)
    meta = env.open_db(b"meta")
    with env.begin(write=True) as txn:
        txn.put(b"schema", b"99", db=meta)
    env.close()
    for _ in range(2):   # ...every time, never "in use" on the second try
        with pytest.raises(ValueError, match="schema"):
            open_state(tmp_path)
    # A failing predictor (after LMDB is open) releases the same way.
    def broken_predictor(env):
        raise RuntimeError("predictor state unreadable")
    with pytest.raises(RuntimeError, match="unreadable"):
        ServiceState(StateConfig(data_dir=tmp_path), predictor_factory=broken_predictor)
    # Once the operator repairs the schema, the next start in this same process opens.
    env = lmdb.open(str(tmp_path / "service.lmdb"), max_dbs=8)
    with env.begin(write=True) as txn:
        txn.put(b"schema", b"1", db=env.open_db(b"meta", txn=txn))
    env.close()
    with open_state(tmp_path) as st:
        assert st.boot == 2      # the failed starts counted no boot


def test_blank_or_padded_token_is_refused_at_start(tmp_path):
    # Regression: a whitespace-only or space-padded token started a server nobody could
    # authenticate to (clients' header values are stripped before the compare).
    from kvtier.tiering.service.app import ServiceConfig
    from kvtier.tiering.service.security import check_token
    for bad, why in ((" " * 20, "whitespace only"), ("\t\n" * 10, "whitespace only"),
                     (" " + "s" * 20, "whitespace"), ("s" * 20 + " ", "whitespace"),
                     ("s" * 20 + "\n", "whitespace"), ("s" * 15, "at least 16")):
        with pytest.raises(ValueError, match=why):
            check_token(bad)
        with pytest.raises(ValueError, match=why):
            ServiceConfig.make(tmp_path, token=bad)
        with pytest.raises(ValueError, match=why):
            check_bind("127.0.0.1", bad)
    check_token(None)
    check_token("s" * 16)
    assert ServiceConfig.make(tmp_path, token="").token is None   # empty: no token, as before
