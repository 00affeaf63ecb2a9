"""The remote tier's state where a user scrapes it: the service's /metrics over
real HTTP (a real uvicorn server) beside a store with a real redis-server
remote, and the plugins' gauge helper.  No credentials in any scraped line."""
from __future__ import annotations

import time

import httpx
import numpy as np
import pytest

from kvtier.engine_adapter.plugin_common import remote_gauge_values
from kvtier.store import StoreConfig, TieredStore
from kvtier.store.remote import REMOTE_GAUGES, remote_gauges
from kvtier.tiering.service.app import create_app
from kvtier.tiering.service.server import ServiceServer
from kvtier.tiering.service.app import ServiceConfig
from kvtier_testutil import key, metric, random_block
from engines import need_engine
from remote_servers import RedisServer, redis_binary

BB = 64 << 10
PASSWORD = "s3cret-remote-pw"


def test_gauges_of_stats_dicts():
    # no remote tier: no gauges; a fresh (connecting) tier: not up, breaker open
    assert remote_gauges(None) == {}
    g = remote_gauges({"state": "connecting", "hits": 3, "bytes_read": 10})
    assert g["remote_up"] == 0 and g["remote_breaker_open"] == 1
    assert g["remote_hits"] == 3 and g["remote_bytes_in"] == 10 and g["remote_misses"] == 0
    assert set(g) == set(REMOTE_GAUGES)
    assert remote_gauges({"state": "up"})["remote_up"] == 1
    assert remote_gauges({"state": "closed"})["remote_breaker_open"] == 0


@pytest.mark.slow
def test_service_metrics_show_the_remote_state(tmp_path):
    if redis_binary() is None:
        pytest.skip("redis-server not found (ci/test.sh installs it from Debian as root)")
    srv = RedisServer(tmp_path / "redis", extra=("--requirepass", PASSWORD)).start()
    url = f"redis://:{PASSWORD}@127.0.0.1:{srv.port}"
    cfg = StoreConfig(root=tmp_path / "node", host_bytes=16 * BB, nvme_bytes=16 * BB, block_bytes=BB,
                      io_engine="threads", pin_host="off", remote_url=url)
    app = create_app(ServiceConfig.make(tmp_path / "svc"))
    http_srv = None
    try:
        with TieredStore.open(cfg) as st:
            assert st.remote.wait_ready(15)
            app.state.metrics.watch_remote(lambda: remote_gauge_values(st), backend="redis",
                                           help_text=REMOTE_GAUGES)
            http_srv = ServiceServer(app)
            http_srv.start()
            c = httpx.Client(base_url=http_srv.url, timeout=10)
            # 1. publish 4 blocks, read them back from the remote (local copies dropped)
            ks = [key(i) for i in range(4)]
            assert st.put_many(ks, [random_block(i, BB) for i in range(4)], tier="remote") == 4
            outs = [np.zeros(BB, np.uint8) for _ in ks]
            assert st.get_many(ks, outs) == [True] * 4
            text = c.get("/metrics").text
            assert metric(text, "kvtier_remote_up", backend="redis") == 1
            assert metric(text, "kvtier_remote_breaker_open", backend="redis") == 0
            assert metric(text, "kvtier_remote_hits", backend="redis") == 4
            assert metric(text, "kvtier_remote_bytes_out", backend="redis") == 4 * BB
            assert metric(text, "kvtier_remote_bytes_in", backend="redis") == 4 * BB
            # 2. the server dies: the next remote read is a miss and the scrape says so
            srv.kill()
            st.drop(ks)
            assert st.get_many(ks, outs) == [False] * 4
            text = c.get("/metrics").text
            assert metric(text, "kvtier_remote_up", backend="redis") == 0
            assert metric(text, "kvtier_remote_breaker_open", backend="redis") == 1
            assert metric(text, "kvtier_remote_breaker_trips", backend="redis") >= 1
            assert metric(text, "kvtier_remote_consecutive_failures", backend="redis") >= 1
            assert metric(text, "kvtier_remote_misses", backend="redis") >= 4
            assert PASSWORD not in text and "127.0.0.1" not in text     # no URL, no credentials
            # 3. back: the tier comes up by itself, the gauges follow
            srv = RedisServer(srv.workdir, port=srv.port, extra=("--requirepass", PASSWORD)).start()
            assert st.remote.wait_ready(15)
            deadline = time.monotonic() + 10
            while metric(c.get("/metrics").text, "kvtier_remote_up", backend="redis") != 1:
                assert time.monotonic() < deadline
                time.sleep(0.1)
            c.close()
        # 4. the store is closed: the scrape still works, without remote gauges
        text = httpx.get(http_srv.url + "/metrics", timeout=10).text
        assert "kvtier_decisions" in text
        with pytest.raises(KeyError):
            metric(text, "kvtier_remote_up", backend="redis")
    finally:
        if http_srv is not None:
            http_srv.stop()
        srv.stop()


@pytest.mark.slow
def test_vllm_tier_reports_the_remote_state_as_gauges(tmp_path, monkeypatch):
    """The vLLM tier's ``get_stats`` (what vLLM folds into its /metrics) carries the remote
    gauges once a remote tier is configured, and none without one."""
    need_engine("vllm")
    if redis_binary() is None:
        pytest.skip("redis-server not found (ci/test.sh installs it from Debian as root)")
    from test_vllm_tier import Engine
    from kvtier.engine_adapter.vllm import METRIC_PREFIX, KvtierTier
    defs = KvtierTier.build_metric_definitions({})
    assert all(METRIC_PREFIX + name in defs for name in REMOTE_GAUGES)
    plain = Engine(tmp_path / "plain")
    try:
        s = plain.tier.get_stats()                      # (this call deadlocked before; now it returns)
        types = {} if s is None else s.metric_sections()[0]
        assert not any(METRIC_PREFIX + n in types for n in REMOTE_GAUGES)
    finally:
        plain.shutdown()
    srv = RedisServer(tmp_path / "redis", extra=("--requirepass", PASSWORD)).start()
    monkeypatch.setenv("KVTIER_REMOTE_URL", f"redis://:{PASSWORD}@127.0.0.1:{srv.port}")
    e = Engine(tmp_path / "node")
    try:
        assert e.tier.store.remote.wait_ready(15)
        stats = e.tier.get_stats()
        assert stats is not None and not stats.is_empty()
        types, values = stats.metric_sections()
        assert set(types) >= {METRIC_PREFIX + n for n in REMOTE_GAUGES}
        assert values[METRIC_PREFIX + "remote_up"] == {(): 1}                 # the tier is up
        assert values[METRIC_PREFIX + "remote_breaker_open"] == {(): 0}
        assert PASSWORD not in repr(stats.data)
    finally:
        e.shutdown()
        srv.stop()
