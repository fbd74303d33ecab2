"""The soak harness's judgement (benchmarks/soak_analysis.py, bench_soak.Tracker) on samples made here.

A soak takes half an hour, so its verdicts must be right the first time: these tests feed the analysis
recorded-looking samples -- written to a CSV and read back, as a finished run's are -- and check that each
verdict can go both ways: RSS growth over the (scaled) windows, the overdue count back at 0 within 60 s of
every disturbance, the worst minute's e2e p99 over the median one, and what counts as lost.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from soak_analysis import (  # noqa: E402  (benchmarks/ is not a package)
    minute_p99s,
    percentile,
    read_samples,
    recoveries,
    rss_growth,
    rss_windows,
    worst_over_median,
    write_samples,
)

pytestmark = pytest.mark.slow

BROKERS = ["broker-a", "broker-b"]


def recorded(tmp_path: Path, rows: list[dict[str, float | int | None]]) -> list[dict[str, float | None]]:
    """``rows`` as the harness leaves them: written to a CSV and read back."""
    path = tmp_path / "soak.csv"
    write_samples(path, rows)
    return read_samples(path)


def broker_rows(duration_s: float, rss_kb: dict[str, object], pids: dict[str, object] | None = None,
                step_s: float = 10.0) -> list[dict[str, float | int | None]]:
    """A sample every ``step_s``: each broker's RSS (a number, or a function of t) and pid (same)."""
    rows = []
    t = step_s
    while t <= duration_s:
        row: dict[str, float | int | None] = {"t_s": t}
        for name in BROKERS:
            rss = rss_kb[name]
            pid = (pids or {}).get(name, 100 + BROKERS.index(name))
            row[f"{name}_rss_kb"] = rss(t) if callable(rss) else rss  # type: ignore[assignment]
            row[f"{name}_pid"] = pid(t) if callable(pid) else pid  # type: ignore[assignment]
        rows.append(row)
        t += step_s
    return rows


# -- RSS growth -------------------------------------------------------------------------------------------------
def test_rss_windows_are_the_issues_for_30_minutes_and_scale_down_for_shorter_runs() -> None:
    full = rss_windows(1800)
    assert full.early == (300, 900) and full.late == (1200, 1800)
    short = rss_windows(180)
    assert short.early == pytest.approx((30, 90)) and short.late == pytest.approx((120, 180))
    assert short.describe() == "min 0.5-1.5 vs 2.0-3.0"


def test_flat_rss_passes_and_a_leak_of_one_percent_a_minute_fails(tmp_path: Path) -> None:
    flat = recorded(tmp_path, broker_rows(1800, {"broker-a": 200_000, "broker-b": 210_000}))
    growth = rss_growth(flat, BROKERS, 1800)
    assert growth.pct == pytest.approx(0.0) and growth.passed(5.0)

    leaking = recorded(tmp_path, broker_rows(1800, {"broker-a": 200_000,
                                                    "broker-b": lambda t: 200_000 * (1 + 0.01 * t / 60)}))
    growth = rss_growth(leaking, BROKERS, 1800)
    # minutes 5-15 average 1.1x, the last 10 minutes 1.25x: about 13.6 % more.
    assert growth.pct == pytest.approx((1.25 / 1.10 - 1) * 100, rel=0.02)
    assert not growth.passed(5.0)
    assert {g.broker: round(g.pct or 0) for g in growth.brokers} == {"broker-a": 0, "broker-b": 14}


def test_a_leak_only_in_the_late_window_of_a_short_run_fails(tmp_path: Path) -> None:
    # A 3-minute run: 30-90 s against 120-180 s; RSS jumps by 10 % at 100 s.
    rows = recorded(tmp_path, broker_rows(180, {"broker-a": lambda t: 100_000 if t < 100 else 110_000,
                                                "broker-b": 100_000}))
    growth = rss_growth(rows, BROKERS, 180)
    assert growth.pct == pytest.approx(10.0) and not growth.passed(5.0)


def test_a_restarted_broker_is_not_judged_and_a_run_without_both_windows_never_passes(tmp_path: Path) -> None:
    # broker-b restarts at 1000 s with a fresh, small RSS: its "growth" would be a large negative number.
    rows = recorded(tmp_path, broker_rows(1800, {"broker-a": lambda t: 100_000 + 20 * t, "broker-b": (
        lambda t: 300_000 if t < 1000 else 50_000)}, pids={"broker-b": lambda t: 7 if t < 1000 else 8}))
    growth = rss_growth(rows, BROKERS, 1800)
    by_broker = {g.broker: g for g in growth.brokers}
    assert by_broker["broker-b"].pct is None and by_broker["broker-b"].reason == "restarted"
    assert growth.pct == pytest.approx(by_broker["broker-a"].pct) and growth.pct > 5  # type: ignore[operator]

    cut_short = recorded(tmp_path, broker_rows(400, {"broker-a": 100_000, "broker-b": 100_000}))
    growth = rss_growth(cut_short, BROKERS, 1800)  # said 30 minutes, sampled under 7: the late window is empty
    assert math.isnan(growth.pct) and not growth.passed(5.0)
    assert {g.reason for g in growth.brokers} == {"no samples in a window"}


# -- back at 0 after every disturbance --------------------------------------------------------------------------
def overdue_rows(values: dict[float, int | None], until: float = 300) -> list[dict[str, float | int | None]]:
    """A sample every 10 s with ``overdue`` 0 except at the times given."""
    return [{"t_s": t, "overdue": values.get(t, 0)} for t in range(10, int(until) + 1, 10)]


def test_overdue_back_at_0_within_60_s_after_each_disturbance_is_a_recovery(tmp_path: Path) -> None:
    rows = recorded(tmp_path, overdue_rows({100: 50, 110: 900, 120: 300, 130: 0, 200: 0}))
    found = recoveries(rows, "overdue", [("kill-broker-b", 95.0), ("churn-join", 195.0)])
    assert [(r.event, r.after_s, r.recovered) for r in found] == [("kill-broker-b", 35.0, True),
                                                                  ("churn-join", 5.0, True)]


def test_overdue_still_above_0_after_60_s_is_not_a_recovery(tmp_path: Path) -> None:
    # Back at 0 70 s after the kill: 10 s too late.
    rows = recorded(tmp_path, overdue_rows({t: 10 for t in range(100, 161, 10)}))
    found = recoveries(rows, "overdue", [("kill-broker-b", 95.0)])
    assert not found[0].recovered and found[0].complete


def test_a_0_before_the_event_or_a_missing_sample_is_no_recovery(tmp_path: Path) -> None:
    # At the event's own sample (t=100) overdue is 0, then the broker stops answering (None) and the
    # count stays up: neither the earlier 0 nor the empty cells count as being back at 0.
    values: dict[float, int | None] = {110: None, 120: None, 130: 40, 140: 40, 150: 40, 160: 40}
    rows = recorded(tmp_path, overdue_rows(values))
    assert rows[10]["overdue"] is None  # t=110: an empty cell reads back as None, not 0
    found = recoveries(rows, "overdue", [("kill-broker-b", 100.0)])
    assert not found[0].recovered


def test_a_window_the_samples_do_not_cover_is_marked_incomplete(tmp_path: Path) -> None:
    rows = recorded(tmp_path, overdue_rows({280: 5, 290: 5, 300: 5}))
    found = recoveries(rows, "overdue", [("churn-leave", 275.0)])
    assert not found[0].recovered and not found[0].complete


# -- e2e tail ---------------------------------------------------------------------------------------------------
def test_one_bad_minute_makes_worst_over_median_exceed_3() -> None:
    steady = [(m * 60 + s, 2.0 + (s % 10) / 10) for m in range(5) for s in range(60)]
    p99s = minute_p99s(steady, 300)
    assert len(p99s) == 5 and worst_over_median(p99s) < 3
    spiked = steady + [(130 + i / 10, 40.0) for i in range(10)]  # minute 2: 10 deliveries of 40 ms
    p99s = minute_p99s(spiked, 300)
    assert p99s[2] == 40.0 and worst_over_median(p99s) > 3


def test_a_minute_without_deliveries_is_the_worst_minute_there_is() -> None:
    gap = [(t, 2.0) for t in range(0, 300) if not 120 <= t < 180]
    p99s = minute_p99s(gap, 300)
    assert math.isnan(p99s[2]) and worst_over_median(p99s) == math.inf


def test_percentile_is_nearest_rank() -> None:
    assert percentile(range(1, 101), 0.99) == 99
    assert percentile([5.0], 0.99) == 5.0
    assert math.isnan(percentile([], 0.5))


# -- what counts as lost ----------------------------------------------------------------------------------------
def test_the_tracker_expects_only_acknowledged_messages_and_counts_each_once() -> None:
    from bench_soak import Tracker

    now = [0.0]
    tracker = Tracker("remoting", lambda: now[0])
    tracker.acked(0)
    tracker.consumed(1, 3.0)  # consumed before its producer saw the ack: never pending
    tracker.acked(1)
    tracker.acked(2)
    now[0] = 10.0
    assert set(tracker.pending) == {0, 2} and tracker.overdue(5.0) == 2
    tracker.consumed(0, 4.0)
    tracker.consumed(0, 9000.0)  # redelivered: a duplicate, not a second latency
    assert tracker.duplicates == 1 and list(tracker.latency_ms) == [3.0, 4.0]
    assert set(tracker.pending) == {2}, "2 was acknowledged and never consumed: lost if the run ends now"
    tracker.consumed(7, 1.0)  # stored though its send failed (never acked): not expected, not lost
    assert set(tracker.pending) == {2}


def test_a_group_that_joined_later_expects_only_what_was_acknowledged_after_it_joined() -> None:
    from bench_soak import Tracker

    now = [0.0]
    churn = Tracker("soak-churn", lambda: now[0])
    churn.accept_from = 50.0
    churn.acked(0)
    now[0] = 60.0
    churn.acked(1)
    assert set(churn.pending) == {1}
