"""The live soak's growth verdict (kvtier.bench.soak_live.growth) and its report: engine lives
split at a restart, short lives not judged, a leak of fds or threads and a runaway RSS flagged,
a curve that levels off passed; the table and the plot read the same document."""
from __future__ import annotations

from kvtier.bench.soak_live.growth import Limits, judge, lives
from kvtier.bench.soak_live.report import growth_lines, plot_resume_ttft, table


def _life(pid, t0, n, rss=lambda i: 2000.0, fds=lambda i: 200, threads=lambda i: 80, step=5.0):
    return [{"t_s": t0 + i * step, "pid": pid, "rss_mib": rss(i), "fds": fds(i), "threads": threads(i)}
            for i in range(n)]


def test_a_restart_begins_a_new_life_and_a_down_engine_ends_one():
    series = _life(11, 0, 5) + [{"t_s": 26.0, "pid": None, "rss_mib": 0, "fds": 0, "threads": 0}] \
        + _life(11, 30, 3) + _life(12, 45, 4)
    assert [len(x) for x in lives(series)] == [5, 3, 4]
    assert [x[0]["pid"] for x in lives(series)] == [11, 11, 12]


def test_a_curve_that_levels_off_is_bounded():
    # RSS rises 2.0 -> 2.44 GiB and levels off, as the 15-minute soak's longest life did; threads
    # climb by 12 over the first minute (lazy pools, a fault's helper threads) and hold
    rss = lambda i: 2000 + 440 * (1 - 0.8 ** i)
    g = judge(_life(7, 0, 60, rss=rss, fds=lambda i: 204 + (i % 3), threads=lambda i: 70 + min(i, 12)))
    assert g["unbounded"] == []
    (life,) = g["lives"]
    assert life["judged"] and life["start"]["fds"] >= 204
    assert abs(life["rss_slope_last_half"]) < 1.0          # flat after warm-up, MiB per minute


def test_an_fd_leak_and_a_thread_leak_are_flagged():
    g = judge(_life(7, 0, 40, fds=lambda i: 200 + 2 * i, threads=lambda i: 80 + i))
    assert len(g["unbounded"]) == 2
    assert "fds" in g["unbounded"][0] and "threads" in g["unbounded"][1]


def test_a_runaway_rss_is_flagged_and_its_slope_reported():
    g = judge(_life(7, 0, 40, rss=lambda i: 2000 + 60 * i))
    assert len(g["unbounded"]) == 1 and "RSS" in g["unbounded"][0]
    assert g["lives"][0]["rss_slope_last_half"] > 600      # 60 MiB a 5 s sample: 720 MiB/min


def test_a_life_shorter_than_the_settling_time_is_not_judged():
    g = judge(_life(7, 0, 5, fds=lambda i: 200 + 50 * i), Limits(settle_s=20.0, min_samples=4))
    assert g["lives"][0]["judged"] is False
    assert g["unbounded"] == []
    assert "too short" in growth_lines(g)[1]


def _doc(series):
    return {"options": {"seed": 3}, "faults": [{"kind": "engine-kill", "at_s": 26.0, "recover_at_s": 31.0,
                                                "recovery_s": 0.1, "injected": "x", "recovered": "y"}],
            "resume_ttft": [(2.0, 0.05, None), (27.0, 0.2, "engine-kill")], "series": series,
            "turns": 4, "resumes": 2, "wall_s": 60.0, "wrong_outputs": 0, "failed_requests": 0,
            "failed_at_engine_stop": 1, "failed_turns": 1, "crashes": [], "never_recovered": [],
            "kvtier_totals": {}, "failures": [], "growth": judge(series)}


def test_the_table_and_the_plot_show_the_lives(tmp_path):
    series = _life(11, 0, 8) + _life(12, 40, 12, fds=lambda i: 200 + 12 * i)
    doc = _doc(series)
    text = table(doc)
    assert "pid 11" in text and "pid 12" in text
    assert "growth: engine pid 12" in text and "fds reached" in text
    png = plot_resume_ttft(doc, tmp_path / "soak.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
