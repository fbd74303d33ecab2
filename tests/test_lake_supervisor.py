"""The lake supervisor: jobs run, a failed query restarts with backoff, status is reported, stop is clean."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from procs import wait_until
from sparkmq.pipelines.supervisor import JobSpec, Supervisor

pytestmark = pytest.mark.spark


def test_a_failing_job_restarts_with_backoff_and_recovers(spark, tmp_path: Path) -> None:
    poison = tmp_path / "poison"
    poison.touch()
    seen: list[int] = []

    def sink(df: Any, batch_id: int) -> None:
        if poison.exists():
            raise RuntimeError("the sink is down")
        seen.append(batch_id)

    def start_flaky():
        return (spark.readStream.format("rate").option("rowsPerSecond", 5).load()
                .writeStream.foreachBatch(sink).trigger(processingTime="200 milliseconds")
                .option("checkpointLocation", str(tmp_path / "ckpt-flaky")).queryName("flaky").start())

    def start_steady():
        return (spark.readStream.format("rate").option("rowsPerSecond", 5).load()
                .writeStream.format("noop").trigger(processingTime="200 milliseconds")
                .option("checkpointLocation", str(tmp_path / "ckpt-steady")).start())

    supervisor = Supervisor([JobSpec("flaky", start_flaky, describe=lambda q: {"query_name": q.name}),
                             JobSpec("steady", start_steady)],
                            poll_interval_s=0.2, backoff_initial_s=0.5, backoff_max_s=2.0).start()
    try:
        wait_until(lambda: supervisor.status()["flaky"]["restarts"] >= 2, 60, "two restarts", interval=0.1)
        status = supervisor.status()
        assert "the sink is down" in status["flaky"]["last_error"]
        assert status["flaky"]["state"] in ("failed-waiting", "restarting", "running")
        assert status["steady"]["state"] == "running" and status["steady"]["restarts"] == 0
        poison.unlink()
        wait_until(lambda: bool(seen) and supervisor.status()["flaky"]["state"] == "running", 60,
                   "a batch after the recovery", interval=0.1)
        wait_until(lambda: (supervisor.status()["flaky"]["last_batch_id"] or -1) >= 0, 60, "a last batch id",
                   interval=0.1)
        assert supervisor.status()["flaky"]["query_name"] == "flaky"
        restarts = supervisor.status()["flaky"]["restarts"]
        time.sleep(1.0)
        assert supervisor.status()["flaky"]["restarts"] == restarts, "a healthy job was restarted"
    finally:
        supervisor.stop()
    assert all(s["state"] == "stopped" for s in supervisor.status().values())
    assert not [q for q in spark.streams.active if q.name == "flaky"]


def test_duplicate_job_names_are_refused() -> None:
    with pytest.raises(ValueError, match="unique"):
        Supervisor([JobSpec("a", lambda: None), JobSpec("a", lambda: None)])  # type: ignore[arg-type,return-value]


class _RunningQuery:
    """What the supervisor reads of a healthy StreamingQuery."""

    id = "fake"
    isActive = True
    lastProgress = None

    def exception(self) -> None:
        return None

    def stop(self) -> None:
        self.isActive = False


def test_restarts_wait_their_exponential_backoff_on_the_supervisors_clock() -> None:
    """The backoff measured (an injected clock): a failed job restarts exactly when its backoff has passed,
    never before -- 0.5 s, 1 s, 2 s, then 2 s (the cap) -- and a job that starts again is left running."""
    now = [100.0]
    attempts: list[float] = []
    healthy = [False]

    def start() -> Any:
        attempts.append(now[0])
        if not healthy[0]:
            raise RuntimeError("the sink is down")
        return _RunningQuery()

    supervisor = Supervisor([JobSpec("flaky", start)], poll_interval_s=0.01, backoff_initial_s=0.5,
                            backoff_max_s=2.0, clock=lambda: now[0]).start()
    try:
        for backoff in (0.5, 1.0, 2.0, 2.0):
            last, count = attempts[-1], len(attempts)
            wait_until(lambda n=count: (supervisor.status()["flaky"]["state"], supervisor.status()["flaky"]["restarts"])
                       == ("failed-waiting", n), 10, f"failure {count} recorded", interval=0.01)
            assert "the sink is down" in supervisor.status()["flaky"]["last_error"]
            now[0] = last + backoff - 0.01
            time.sleep(0.2)  # twenty polls: none may restart it yet
            assert len(attempts) == count, f"restarted before its {backoff} s backoff"
            healthy[0] = backoff == 2.0 and count == 4  # the fifth start succeeds
            now[0] = last + backoff
            wait_until(lambda n=count: len(attempts) > n, 10, f"the restart after {backoff} s", interval=0.01)
            assert attempts[-1] == last + backoff
        wait_until(lambda: supervisor.status()["flaky"]["state"] == "running", 10, "the job running", interval=0.01)
        now[0] += 3600
        time.sleep(0.2)
        assert len(attempts) == 5 and supervisor.status()["flaky"]["restarts"] == 4, "a running job was restarted"
    finally:
        supervisor.stop()
    assert supervisor.status()["flaky"]["state"] == "stopped"
