"""Table maintenance: 60 one-row commits, then compaction + vacuum + checkpoint.

Fewer files, the same rows (Arrow equality), a checkpoint in the log, and time travel to a
version inside the vacuum retention still reads.  A table with few commits is left alone;
the Maintainer thread runs passes and reports them.  delta-rs only (no Spark).
"""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from procs import wait_until
from sparkmq.pipelines import tables
from sparkmq.pipelines.maintenance import Maintainer, commits_since_compaction, run_maintenance

pytestmark = pytest.mark.timeout(120)


def _commit_rows(lake: Path, n: int) -> str:
    tables.ensure_table(lake, tables.ALERTS)  # any table; only its file count and rows matter here
    path = tables.table_path(lake, tables.CONSUME_QUEUE)
    tables.ensure_table(lake, tables.CONSUME_QUEUE)
    schema = tables.get_spec(tables.CONSUME_QUEUE).schema
    for i in range(n):
        write_deltalake(path, pa.Table.from_pylist([{
            "topic": "T", "broker": "broker-a", "queue_id": i % 4, "queue_offset": i, "commitlog_offset": 100 * i,
            "size": 100, "tag_hash": 0, "store_ts": 1_700_000_000_000_000 + i}], schema=schema), mode="append")
    return path


def _sorted(table: pa.Table) -> pa.Table:
    return table.sort_by([("queue_offset", "ascending")])


def test_maintenance_compacts_checkpoints_and_keeps_time_travel(tmp_path: Path) -> None:
    path = _commit_rows(tmp_path, 60)
    before = DeltaTable(path)
    files_before, version_before = len(before.file_uris()), before.version()
    content_before = _sorted(before.to_pyarrow_table())
    mid_version = version_before - 30
    mid_content = _sorted(DeltaTable(path, version=mid_version).to_pyarrow_table())
    assert files_before == 60 and commits_since_compaction(before, 50) == 50

    result = run_maintenance(tmp_path, [tables.CONSUME_QUEUE, tables.ALERTS, tables.MESSAGES],
                             min_commits_between=50)
    done = result[tables.CONSUME_QUEUE]
    assert done["files_before"] == 60 and done["files_after"] < files_before
    assert done["files_after"] == 1
    assert "skipped" in result[tables.ALERTS]            # one commit: not due
    assert result[tables.MESSAGES] == {"skipped": "no table"}

    after = DeltaTable(path)
    assert _sorted(after.to_pyarrow_table()).equals(content_before)
    log_dir = Path(path) / "_delta_log"
    assert any(p.name.endswith(".checkpoint.parquet") for p in log_dir.iterdir())
    assert done["checkpoint_version"] == after.version() > version_before
    # Inside the retention (7 days) nothing the old versions need was deleted: time travel works.
    assert done["vacuumed"] == 0
    assert _sorted(DeltaTable(path, version=mid_version).to_pyarrow_table()).equals(mid_content)
    assert commits_since_compaction(after, 50) == 0

    # Right after maintenance the table is not due again.
    again = run_maintenance(tmp_path, [tables.CONSUME_QUEUE], min_commits_between=50)
    assert "skipped" in again[tables.CONSUME_QUEUE]


def test_unsafe_retention_is_refused_per_table(tmp_path: Path) -> None:
    _commit_rows(tmp_path, 3)
    result = run_maintenance(tmp_path, [tables.CONSUME_QUEUE], vacuum_retention_hours=0, min_commits_between=1)
    assert "error" in result[tables.CONSUME_QUEUE] and "safe minimum" in result[tables.CONSUME_QUEUE]["error"]
    with pytest.raises(ValueError):
        run_maintenance(tmp_path, min_commits_between=0)


def test_maintainer_runs_periodically(tmp_path: Path) -> None:
    path = _commit_rows(tmp_path, 5)
    maintainer = Maintainer(tmp_path, interval_s=0.2, first_delay_s=0.0, tables=[tables.CONSUME_QUEUE],
                            min_commits_between=5).start()
    try:
        wait_until(lambda: maintainer.status()["runs"] >= 2, 30, "two maintenance runs")
        status = maintainer.status()
        assert status["runs"] >= 2 and status["state"] == "running" and status["last_error"] is None
    finally:
        maintainer.stop()
    assert maintainer.status()["state"] == "stopped"
    assert len(DeltaTable(path).file_uris()) == 1
