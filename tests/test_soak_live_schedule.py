"""The live soak's fault plan (kvtier.bench.soak_live.schedule): seeded, every kind, in bounds."""
from __future__ import annotations

import pytest

from kvtier.bench.soak_live.schedule import describe, plan

KINDS = ["redis-kill", "redis-stop", "slab-flip", "engine-kill"]


def test_the_same_seed_replays_the_same_plan_and_another_seed_does_not():
    a = plan(seed=7, minutes=8, kinds=KINDS)
    assert a == plan(seed=7, minutes=8, kinds=KINDS)
    assert [p.kind for p in a] != [p.kind for p in plan(seed=8, minutes=8, kinds=KINDS)]


def test_every_kind_runs_in_every_round_and_at_least_once():
    # 8 minutes, 30 s of warm-up, a fault every 40 s at most -> 11 faults: two whole rounds, then three
    p = plan(seed=1, minutes=8, kinds=KINDS, warmup_s=30, spacing_s=40)
    assert len(p) == 11
    for r in range(2):
        assert sorted(x.kind for x in p[r * 4:(r + 1) * 4]) == sorted(KINDS)
    # a run too short for the spacing still runs each kind once, packed tighter
    short = plan(seed=1, minutes=1, kinds=KINDS, warmup_s=20, spacing_s=40)
    assert sorted(x.kind for x in short) == sorted(KINDS)
    assert all(20 <= x.at_s < 60 for x in short)
    assert [x.at_s for x in short] == sorted(x.at_s for x in short)


def test_the_printed_plan_names_the_seed_and_every_fault():
    p = plan(seed=5, minutes=2, kinds=KINDS, warmup_s=10)
    text = describe(p, 5)
    assert "--seed 5" in text
    assert len(text.splitlines()) == len(p) + 1


@pytest.mark.parametrize("kw", [dict(kinds=[]), dict(kinds=["a", "a"]), dict(kinds=["a"], minutes=0),
                                dict(kinds=["a"], spacing_s=-1)])
def test_bad_plans_raise_value_error(kw):
    args = dict(seed=0, minutes=1, kinds=["a"])
    args.update(kw)
    with pytest.raises(ValueError):
        plan(**args)
