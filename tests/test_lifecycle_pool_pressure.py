"""A pause is priced against the engine's KV pool: ``hbm_pressure`` is the KV of
every paused trajectory (its own included) over the pool, at most 1
(ControllerCore ``pool_price_bytes``), so breakeven keeps a pause in the
engine's reach only while the cache could hold them all."""
from __future__ import annotations

import pytest

from kvtier.tiering.lifecycle import ForecastSchedule, LifecycleController, ManualClock
from kvtier.tiering.model.decision import Action, Decision

import test_lifecycle
from test_lifecycle import BLOCK, Scripted, write

store = test_lifecycle.store     # the 8-frame real store of test_lifecycle.py


class Seen(Scripted):
    """Host plans; records the pressure each decision was asked at."""

    def __init__(self) -> None:
        super().__init__({"tool": Decision(Action.OFFLOAD_HOST)})
        self.pressure: list[float] = []

    def decide(self, ctx):
        self.pressure.append(ctx.hbm_pressure)
        return super().decide(ctx)


def pause(ctl, store, tid: str, n: int, seed: int) -> None:
    ctl.hint(tid, "tool")
    ctl.pause(tid, write(store, seed, n, "host"))


def test_pressure_is_the_paused_kv_over_the_pool(store):
    pol = Seen()
    ctl = LifecycleController(store, ForecastSchedule(pol), clock=ManualClock(), block_bytes=BLOCK,
                              pool_price_bytes=8 * BLOCK)
    pause(ctl, store, "a", 4, 1)
    pause(ctl, store, "b", 4, 2)
    pause(ctl, store, "c", 2, 3)                 # 10 blocks paused in an 8-block pool
    assert pol.pressure == [pytest.approx(0.5), pytest.approx(1.0), pytest.approx(1.0)]
    ctl.resume("a")
    ctl.resume("b")
    pause(ctl, store, "d", 1, 4)                 # c and d paused: 3 of 8
    assert pol.pressure[-1] == pytest.approx(3 / 8)


def test_without_a_pool_a_pause_sees_no_pressure(store):
    pol = Seen()
    ctl = LifecycleController(store, ForecastSchedule(pol), clock=ManualClock(), block_bytes=BLOCK)
    pause(ctl, store, "a", 4, 1)
    pause(ctl, store, "b", 4, 2)
    assert pol.pressure == [0.0, 0.0]


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf")])
def test_a_pool_that_is_no_size_is_refused(store, bad):
    with pytest.raises(ValueError, match="pool_price_bytes"):
        LifecycleController(store, ForecastSchedule(Seen()), clock=ManualClock(), block_bytes=BLOCK,
                            pool_price_bytes=bad)
