"""Table maintenance by delta-spark: many small commits, then OPTIMIZE + VACUUM + checkpoint.

Fewer files, the same rows, a checkpoint in the log, time travel to a version inside the vacuum
retention still reads, and a reader counting the table on another thread while maintenance and appends
run only ever sees the count of a committed version, never less than before.  A table with few commits
is left alone; the Maintainer thread runs passes and reports them.
"""
from __future__ import annotations

import datetime as dt
import threading
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from procs import wait_until
from sparkmq.pipelines import tables
from sparkmq.pipelines.dispatch import append_once
from sparkmq.pipelines.errors import LakeError
from sparkmq.pipelines.maintenance import Maintainer, commits_since_compaction, run_maintenance

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

T0 = dt.datetime(2026, 1, 5, 10, 0, tzinfo=dt.UTC)


def _append(spark: SparkSession, lake: Path, start: int, n: int, version: int) -> None:
    rows = [("T", "broker-a", i % 4, i, 100 * i, 100, 0, T0 + dt.timedelta(seconds=i)) for i in range(start, start + n)]
    append_once(spark.createDataFrame(rows, tables.spark_schema(tables.CONSUME_QUEUE)), lake, tables.CONSUME_QUEUE,
                "test", version)


def _commit_rows(spark: SparkSession, lake: Path, n: int) -> str:
    tables.ensure_table(spark, lake, tables.ALERTS)  # any table; only its file count and rows matter here
    tables.ensure_table(spark, lake, tables.CONSUME_QUEUE)
    for i in range(n):
        _append(spark, lake, i, 1, i)
    return tables.table_path(lake, tables.CONSUME_QUEUE)


def _rows(spark: SparkSession, path: str, version: int | None = None) -> list[tuple]:
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    return sorted(tuple(r) for r in reader.load(path).collect())


def test_maintenance_compacts_checkpoints_and_keeps_time_travel(spark: SparkSession, tmp_path: Path) -> None:
    path = _commit_rows(spark, tmp_path, 12)
    from delta.tables import DeltaTable

    table = DeltaTable.forPath(spark, path)
    assert table.detail().first().numFiles == 12
    version_before = table.history(1).first().version
    content_before = _rows(spark, path)
    mid_version = version_before - 6
    mid_content = _rows(spark, path, mid_version)
    assert commits_since_compaction(spark, path, 10) == 10

    result = run_maintenance(spark, tmp_path, [tables.CONSUME_QUEUE, tables.ALERTS, tables.MESSAGES],
                             min_commits_between=10)
    done = result[tables.CONSUME_QUEUE]
    assert done["files_before"] == 12 and done["files_after"] == 1
    assert done["compacted"] == {"removed": 12, "added": 1}
    assert "skipped" in result[tables.ALERTS]            # one commit: not due
    assert result[tables.MESSAGES] == {"skipped": "no table"}

    assert _rows(spark, path) == content_before
    log_dir = Path(path) / "_delta_log"
    assert any(p.name.endswith(".checkpoint.parquet") for p in log_dir.iterdir())
    assert done["checkpoint_version"] > version_before
    operations = [h.operation for h in DeltaTable.forPath(spark, path).history(4).collect()]
    assert "OPTIMIZE" in operations and "VACUUM END" in operations
    # Inside the retention (7 days) nothing the old versions need was deleted: time travel works.
    assert _rows(spark, path, mid_version) == mid_content
    assert commits_since_compaction(spark, path, 10) == 0       # its own OPTIMIZE and VACUUM do not count

    # Right after maintenance the table is not due again.
    again = run_maintenance(spark, tmp_path, [tables.CONSUME_QUEUE], min_commits_between=10)
    assert "skipped" in again[tables.CONSUME_QUEUE]


def test_a_reader_during_maintenance_and_appends_sees_only_committed_counts(spark: SparkSession,
                                                                            tmp_path: Path) -> None:
    """OPTIMIZE rewrites every file and VACUUM runs while a reader counts the table over and over and a writer
    appends: every count is the count of a committed version, and counts never go down."""
    path = _commit_rows(spark, tmp_path, 10)
    tables.register_tables(spark, tmp_path, [tables.CONSUME_QUEUE])
    valid = {10 + 5 * k for k in range(7)}          # 10 rows, then six appends of 5
    counts: list[int] = []
    errors: list[BaseException] = []
    done = threading.Event()

    def reader() -> None:
        try:
            while not done.is_set():
                counts.append(spark.table("sparkmq.consume_queue").count())
                done.wait(0.1)    # the writer and the maintenance share the driver's two cores with it
        except BaseException as exc:  # noqa: BLE001 -- reported below
            errors.append(exc)

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    try:
        for k in range(3):
            _append(spark, tmp_path, 100 + 5 * k, 5, 100 + k)
        result = run_maintenance(spark, tmp_path, [tables.CONSUME_QUEUE], min_commits_between=1)
        assert "error" not in result[tables.CONSUME_QUEUE], result
        for k in range(3, 6):
            _append(spark, tmp_path, 100 + 5 * k, 5, 100 + k)
        wait_until(lambda: len(counts) >= 5, 120, "the reader to count a few times")
    finally:
        done.set()
        thread.join(120)
    assert not errors, errors
    assert counts and set(counts) <= valid, counts
    assert counts == sorted(counts), counts
    assert spark.table("sparkmq.consume_queue").count() == 40 == len(_rows(spark, path))


def test_unsafe_retention_is_refused(spark: SparkSession, tmp_path: Path) -> None:
    _commit_rows(spark, tmp_path, 1)
    with pytest.raises(LakeError, match="safe minimum"):
        run_maintenance(spark, tmp_path, [tables.CONSUME_QUEUE], vacuum_retention_hours=0, min_commits_between=1)
    with pytest.raises(ValueError):
        run_maintenance(spark, tmp_path, min_commits_between=0)


def test_maintainer_runs_periodically(spark: SparkSession, tmp_path: Path) -> None:
    path = _commit_rows(spark, tmp_path, 3)
    maintainer = Maintainer(spark, tmp_path, interval_s=0.2, first_delay_s=0.0, tables=[tables.CONSUME_QUEUE],
                            min_commits_between=1).start()
    try:
        wait_until(lambda: maintainer.status()["runs"] >= 2, 180, "two maintenance runs")
        status = maintainer.status()
        assert status["runs"] >= 2 and status["state"] == "running" and status["last_error"] is None
        assert "skipped" in status["tables"][tables.CONSUME_QUEUE]    # nothing written since the first pass
    finally:
        maintainer.stop()
    assert maintainer.status()["state"] == "stopped"
    from delta.tables import DeltaTable

    assert DeltaTable.forPath(spark, path).detail().first().numFiles == 1
