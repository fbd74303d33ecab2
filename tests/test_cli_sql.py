"""``sparkmq sql`` over Delta tables written with delta-rs."""
from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest

from procs import child_env
from sparkmq.pipelines import tables
from sparkmq.pipelines.delta_io import append_exactly_once

pytestmark = [pytest.mark.spark, pytest.mark.cluster]  # the command runs in a child process


def test_sql_over_the_lake_tables(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    tables.ensure_tables(lake, [tables.CONSUME_QUEUE])
    spec = tables.get_spec(tables.CONSUME_QUEUE)
    now = datetime.now(UTC)
    rows = [{"topic": t, "broker": "broker-a", "queue_id": q, "queue_offset": o, "commitlog_offset": 100 * o,
             "size": 90, "tag_hash": 0, "store_ts": now}
            for t, q, n in (("Orders", 0, 3), ("Orders", 1, 2), ("Pay", 0, 4)) for o in range(n)]
    data = pa.Table.from_pylist([{f.name: r.get(f.name) for f in spec.schema} for r in rows], schema=spec.schema)
    assert append_exactly_once(tables.table_path(lake, tables.CONSUME_QUEUE), data, "test", 0)
    result = subprocess.run(
        [sys.executable, "-m", "sparkmq.api.cli", "sql", "--lake-root", str(lake), "--json",
         "SELECT topic, count(*) AS n FROM consume_queue GROUP BY topic ORDER BY topic"],
        capture_output=True, text=True, timeout=180, env=child_env(), stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr[-3000:]
    assert [json.loads(line) for line in result.stdout.splitlines()] == [{"topic": "Orders", "n": 5},
                                                                         {"topic": "Pay", "n": 4}]
