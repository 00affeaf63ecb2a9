"""The CI soak: a real `vllm serve` with kvtier (host frames, NVMe, a Redis tier written through)
serving agent sessions while every implemented fault kind runs at least once; every output is
checked against a recompute (kvtier.bench.soak_live.agents).  About 3 minutes on 2 cores.

kvtier's data dir is its own 256 MiB ext4 (a loop mount: root only) so that ``fs-full`` can fill
it; without root that one kind is left out, with a note."""
from __future__ import annotations

import shutil

import pytest

from kvtier.bench.soak_live.faults import fault_kinds
from kvtier.bench.soak_live.fsmount import why_not
from kvtier.bench.soak_live.report import growth_lines
from kvtier.bench.soak_live.run import SoakOptions, run_soak


def test_every_fault_kind_once_with_every_output_checked(tiny_model, tmp_path):
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    opts = SoakOptions(model=tiny_model, workdir=tmp_path, minutes=1.5, seed=3, warmup_s=10.0,
                       hold_s=2.0, spacing_s=8.0, concurrent=4, recover_timeout_s=120.0, sample_s=2.0)
    doc = run_soak(opts, progress=print)
    print("\n".join(growth_lines(doc["growth"])))

    # every kind this host runs was planned (fs-full needs root, which CI has), ran once at least
    # and did its part (a file to damage, a redis to stop, ...)
    kinds = set(fault_kinds(512, 256)) - set(doc["left_out"])
    assert doc["left_out"] == ({} if why_not() is None else {"fs-full": why_not()})
    assert sorted({e["kind"] for e in doc["faults"]}) == sorted(doc["kinds"]) == sorted(kinds)
    assert [e for e in doc["faults"] if "error" in e] == []
    # no wrong output, no engine exit the schedule did not cause, every fault recovered
    assert doc["wrong_outputs"] == 0, doc["wrong"]
    assert doc["crashes"] == [], doc["crashes"][0]["log_tail"] if doc["crashes"] else ""
    assert doc["never_recovered"] == []
    # only an engine stop may fail a request; kvtier's faults behind it never do
    assert doc["failed_requests"] == 0, [f for f in doc["failures"] if not f["at_engine_stop"]][:3]
    # the soak exercised kvtier: resumes ran and blocks came back from its tiers
    assert doc["resumes"] >= 20
    loaded = sum(v for k, v in doc["kvtier_totals"].items() if k.startswith("kvtier_blocks_loaded_total"))
    assert loaded > 0
    # the hostile clients' malformed hints were rejected by kvtier, not by a crash
    assert doc["kvtier_totals"].get("kvtier_hint_rejections_total", 0) >= 1
    # bounded: in every engine life long enough to judge, fds and threads end where they settled
    # and RSS stays within 1.5x (kvtier.bench.soak_live.growth)
    assert any(life["judged"] for life in doc["growth"]["lives"]), doc["growth"]["lives"]
    assert doc["growth"]["unbounded"] == [], "\n".join(growth_lines(doc["growth"]))
