"""Quiet failure logging (issue 30): the first failure in full, then one summary per interval, a recovery once.

Unit tests with an injected clock; the broker-level test (trace writing failing on a full disk, its log
lines counted) is in ``test_disk_watermarks.py``.
"""
from __future__ import annotations

import logging

import pytest

from sparkmq.platform.common.failure_log import FailureLog, set_summary_interval


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "test.failures"]


def test_a_subsystem_failing_without_pause_writes_one_line_per_interval(caplog, clock):
    log = logging.getLogger("test.failures")
    failures = FailureLog(log, "storing trace events", interval_s=60, clock=clock)
    with caplog.at_level(logging.INFO, "test.failures"):
        for i in range(900):  # eight failures a second for 112.5 s
            failures.failure("DISK_FULL: batch %d", i)
            clock.now += 0.125
    got = lines(caplog)
    assert got[0] == "storing trace events failed: DISK_FULL: batch 0 (further failures are summarized every 60 s)"
    assert len(got) == 2, got  # the first failure, then the summary of the first 60 s
    assert got[1] == "storing trace events: 480 more failures in the last 60 s, last: DISK_FULL: batch 480"
    assert failures.failures == 900 and failures.failing and failures.last_error == "DISK_FULL: batch 899"
    failures.flush()  # what is pending (the last 52 s) is written when the subsystem stops
    assert lines(caplog)[-1].startswith("storing trace events: 419 more failures in the last 52 s")


def test_a_recovery_is_said_once_and_a_new_run_of_failures_is_logged_in_full(caplog, clock):
    log = logging.getLogger("test.failures")
    failures = FailureLog(log, "replication from m:1", interval_s=60, clock=clock)
    with caplog.at_level(logging.INFO, "test.failures"):
        failures.failure("refused")
        clock.now += 5
        failures.success()
        failures.success()  # only the first success after failures says anything
        assert lines(caplog)[-1] == "replication from m:1 works again"
        clock.now += 120
        failures.failure("timeout")
    got = lines(caplog)
    assert len(got) == 3 and got[2].startswith("replication from m:1 failed: timeout")
    assert not [r for r in caplog.records if r.name == "test.failures" and r.levelno == logging.INFO][1:]


def test_failing_and_recovering_in_turns_stays_bounded(caplog, clock):
    """A subsystem flipping between failure and success every batch writes a few lines per interval."""
    log = logging.getLogger("test.failures")
    failures = FailureLog(log, "writing", interval_s=60, clock=clock)
    with caplog.at_level(logging.INFO, "test.failures"):
        for _ in range(600):  # 120 s of one failure and one success every 0.2 s
            failures.failure("flaky")
            clock.now += 0.1
            failures.success()
            clock.now += 0.1
    got = lines(caplog)
    assert len(got) <= 3 * 3, got  # at most three lines per interval (2 intervals, plus the start)
    counted = sum(int(line.split(" more failure")[0].rsplit(" ", 1)[1]) for line in got if "more failure" in line)
    assert counted + sum("failed:" in line for line in got) <= 600


def test_the_stack_trace_comes_with_the_first_failure_only(caplog, clock):
    log = logging.getLogger("test.failures")
    failures = FailureLog(log, "a pass", interval_s=10, clock=clock)
    with caplog.at_level(logging.INFO, "test.failures"):
        for _ in range(30):
            try:
                raise OSError("no space left on device")
            except OSError as exc:
                failures.failure("%s", exc, exc_info=True)
            clock.now += 1
    records = [r for r in caplog.records if r.name == "test.failures"]
    assert records[0].exc_info is not None and all(r.exc_info is None for r in records[1:])
    assert len(records) == 3  # first, then a summary after 10 s and after 20 s


def test_the_process_interval_applies_to_logs_built_after_it(clock):
    try:
        set_summary_interval(5)
        assert FailureLog(logging.getLogger("x"), "x").interval_s == 5
        assert FailureLog(logging.getLogger("x"), "x", interval_s=7).interval_s == 7
        with pytest.raises(ValueError, match="got 0"):
            set_summary_interval(0)
    finally:
        set_summary_interval(60)
