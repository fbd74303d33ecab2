"""``sparkmq sql`` over Delta tables written with delta-spark: short names and ``sparkmq.<table>``, history."""
from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from lake_rows import append_rows
from procs import jvm_child_env
from sparkmq.pipelines import tables

pytestmark = [pytest.mark.spark, pytest.mark.cluster]  # the command runs in a child process


def _sql(lake: Path, query: str) -> list[dict]:
    # Each call is a new JVM running one small query: on C1 only (TEST_JAVA_OPTIONS), this file used 107, 106 and
    # 106 s of CPU against 170, 157 and 154 s by default (A B A B A B on one day).
    result = subprocess.run(
        [sys.executable, "-m", "sparkmq.api.cli", "sql", "--lake-root", str(lake), "--json", query],
        capture_output=True, text=True, timeout=300, env=jvm_child_env(),
        stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr[-3000:]
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_sql_over_the_lake_tables(spark, tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    now = datetime.now(UTC)
    rows = [{"topic": t, "broker": "broker-a", "queue_id": q, "queue_offset": o, "commitlog_offset": 100 * o,
             "size": 90, "tag_hash": 0, "store_ts": now}
            for t, q, n in (("Orders", 0, 3), ("Orders", 1, 2), ("Pay", 0, 4)) for o in range(n)]
    append_rows(spark, lake, tables.CONSUME_QUEUE, rows[:5], 0)
    append_rows(spark, lake, tables.CONSUME_QUEUE, rows[5:], 1)
    assert _sql(lake, "SELECT topic, count(*) AS n FROM consume_queue GROUP BY topic ORDER BY topic") == [
        {"topic": "Orders", "n": 5}, {"topic": "Pay", "n": 4}]
    # The standard names, history and time travel, in another process (its own catalog).
    assert _sql(lake, "SELECT count(*) AS n FROM sparkmq.consume_queue VERSION AS OF 1") == [{"n": 5}]
    history = sorted(_sql(lake, "DESCRIBE HISTORY sparkmq.consume_queue"), key=lambda r: r["version"])
    assert [r["operation"] for r in history] == ["CREATE TABLE", "WRITE", "WRITE"]
