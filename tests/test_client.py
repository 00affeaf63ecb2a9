"""kvtier.tiering.service.client against a real uvicorn server: the sync and async clients
drive the same lifecycle and map refusals to typed errors."""
from __future__ import annotations

import asyncio

import pytest

from kvtier.tiering.service.client import (AsyncKvtierClient, KvtierAuthError, KvtierBadRequest, KvtierClient, KvtierConflict,
                            KvtierGone, KvtierNotFound)
from kvtier.tiering.model.decision import Action, Decision, Forecast
from kvtier.tiering.model.presets import get_node, get_preset
from kvtier.tiering.service.app import create_app
from kvtier.tiering.service.server import ServiceServer
from kvtier.tiering.service.app import ServiceConfig

TOKEN = "client-token-0123456789abc"
MODEL = "qwen2.5-7b"


@pytest.fixture
def server(tmp_path):
    with ServiceServer(create_app(ServiceConfig.make(tmp_path / "d", token=TOKEN)), token=TOKEN) as srv:
        yield srv


def test_sync_client_lifecycle(server):
    with KvtierClient(server.url, token=TOKEN) as kv:
        assert kv.healthz()["status"] == "ok"
        # Observations count up; the forecast is the shared plain-data type.
        assert [kv.observe("pytest", w, features={"cmd": "pytest"}) for w in (3.0, 4.0, 5.0)] == [1, 2, 3]
        fc = kv.forecast("pytest")
        assert isinstance(fc, Forecast) and fc.n == 3 and fc.quantile(0.5) == pytest.approx(fc.quantiles["p50"])
        # A decision by preset name equals one by the preset's own geometry.
        by_name = kv.decide("pytest", 16_000, MODEL)
        by_geom = kv.decide("pytest", 16_000, get_preset(MODEL))
        assert isinstance(by_name.decision, Decision) and isinstance(by_name.decision.action, Action)
        assert by_name.kv_bytes == by_geom.kv_bytes == get_preset(MODEL).kv_bytes(16_000)
        assert by_name.decision.action == by_geom.decision.action
        # A HardwareProfile travels as the wire's hardware object and decides like its preset name.
        by_hw = kv.decide("pytest", 16_000, MODEL, hardware=get_node("pcie5-x16"))
        by_node = kv.decide("pytest", 16_000, MODEL, hardware="pcie5-x16")
        assert by_hw.decision.action == by_node.decision.action
        assert by_hw.decision.expected_cost == pytest.approx(by_node.decision.expected_cost, rel=1e-9)
        # Pause with a decision, resume with the harness's own timing.
        p = kv.pause("run-1", "pytest", context_tokens=16_000, model=MODEL, features={"cmd": "pytest"})
        assert p.decision is not None and p.decision.decision.action == by_name.decision.action
        r = kv.resume("run-1", wait_s=4.2, stall_s=0.01)
        assert r.wait_s == 4.2 and r.action == p.decision.decision.action and not r.restored
        assert kv.stats()["observations"] == 4
        # A lease runs out with the tool still running: the answer says where the KV belongs now.
        p = kv.pause("run-2", "pytest", context_tokens=16_000, model=MODEL)
        if p.decision.decision.demote_at_s is not None:
            lease = kv.lease_expired("run-2", elapsed_s=10 * p.decision.decision.demote_at_s)
            assert lease.trajectory_id == "run-2" and isinstance(lease.action, Action)
            assert lease.changed == (lease.action != p.decision.decision.action)
        with pytest.raises(KvtierNotFound):
            kv.lease_expired("nobody")
        kv.resume("run-2")
        assert "kvtier_decisions_total" in kv.metrics_text()


def test_sync_client_errors_are_typed(server, tmp_path):
    with KvtierClient(server.url, token=TOKEN) as kv:
        with pytest.raises(KvtierNotFound, match="not paused"):
            kv.resume("nobody")
        kv.pause("dup", "bash")
        with pytest.raises(KvtierConflict) as e:
            kv.pause("dup", "bash")
        assert e.value.status == 409
        with pytest.raises(KvtierBadRequest, match="wait_s"):
            kv.observe("bash", -1.0)
        with pytest.raises(KvtierBadRequest, match="unknown model preset"):
            kv.decide("bash", 10, "no-such-model")
    # No token (and none in the environment): every POST is refused, reads work.
    with KvtierClient(server.url, token="") as anon:
        with pytest.raises(KvtierAuthError) as e:
            anon.observe("bash", 1.0)
        assert e.value.status == 401
        assert anon.forecast("bash").n == 0


def test_gone_after_restart(tmp_path):
    # A pause recorded, then the service restarts with lost_after_s=0.
    with ServiceServer(create_app(ServiceConfig.make(tmp_path / "d"))) as srv:
        with KvtierClient(srv.url) as kv:
            kv.pause("t", "bash")
    with ServiceServer(create_app(ServiceConfig.make(tmp_path / "d", lost_after_s=0.0))) as srv:
        with KvtierClient(srv.url) as kv:
            assert [x["trajectory_id"] for x in kv.lost()] == ["t"]
            with pytest.raises(KvtierGone, match="lost across a service restart"):
                kv.resume("t")


def test_async_client_concurrent_lifecycle(server):
    async def main() -> None:
        async with AsyncKvtierClient(server.url, token=TOKEN) as kv:
            # 16 trajectories pause and resume concurrently.
            ids = [f"a{i}" for i in range(16)]
            pauses = await asyncio.gather(*(kv.pause(t, "search", context_tokens=4096, model=MODEL) for t in ids))
            assert all(p.decision is not None for p in pauses)
            assert (await kv.stats())["paused"] == 16
            res = await asyncio.gather(*(kv.resume(t, wait_s=1.0 + i / 10) for i, t in enumerate(ids)))
            assert sorted(r.trajectory_id for r in res) == sorted(ids)
            assert (await kv.forecast("search")).n == 16
            assert (await kv.stats())["paused"] == 0
            with pytest.raises(KvtierNotFound):
                await kv.resume("a0")
            d = await kv.decide("search", 4096, MODEL, hbm_pressure=0.95)
            assert d.decision.action in set(Action)

    asyncio.run(main())
