"""pipelines.delta_files: data files written where the rows are, committed once by the driver."""
from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from chispa import assert_df_equality
from deltalake import DeltaTable
from pyspark.sql import SparkSession
from test_lake_delta_io import T0, cq_rows, message_rows

from sparkmq.pipelines import tables
from sparkmq.pipelines.delta_files import commit_data_files, file_statistics, write_data_files
from sparkmq.pipelines.delta_io import append_exactly_once, read_delta
from sparkmq.pipelines.errors import LakeError
from sparkmq.platform.common.errors import ErrorCode


def _table(root: Path, name: str) -> tuple[str, tables.TableSpec]:
    tables.ensure_table(root, name)
    return tables.table_path(root, name), tables.get_spec(name)


def test_files_are_invisible_until_committed_then_committed_once(tmp_path: Path) -> None:
    path, spec = _table(tmp_path, tables.MESSAGES)
    rows = message_rows(0, 6)                       # straddles midnight: two store_date partitions
    files = write_data_files(path, spec, rows)
    assert sorted(f.partition_values["store_date"] for f in files) == ["2024-05-31", "2024-06-01"]
    assert all((Path(path) / f.path).is_file() and f.path.startswith("store_date=") for f in files)
    assert sum(f.num_records for f in files) == 6
    table = DeltaTable(path)
    before = table.version()
    assert table.to_pyarrow_table().num_rows == 0   # written, not committed: no reader sees them

    assert commit_data_files(path, files, "job-messages", 0, spec.partition_by) is True
    assert commit_data_files(path, files, "job-messages", 0, spec.partition_by) is False   # a replayed batch
    table = DeltaTable(path)
    assert table.version() == before + 1 and table.transaction_version("job-messages") == 0
    got = table.to_pyarrow_table().sort_by("queue_offset")
    assert got.select(rows.column_names).cast(spec.schema).equals(rows.cast(spec.schema))

    # An empty batch still records its version, so every table of a batch says it is done.
    assert commit_data_files(path, [], "job-messages", 1, spec.partition_by) is True
    assert DeltaTable(path).transaction_version("job-messages") == 1
    assert DeltaTable(path).to_pyarrow_table().num_rows == 6


@pytest.mark.spark
def test_committed_files_read_the_same_as_delta_rs_appends(spark: SparkSession, tmp_path: Path) -> None:
    """The same rows through write_deltalake and through task files: Spark's snapshot reader sees equal tables."""
    ours, spec = _table(tmp_path / "ours", tables.MESSAGES)
    theirs, _ = _table(tmp_path / "theirs", tables.MESSAGES)
    for version, start in enumerate((0, 6, 12)):
        rows = message_rows(start, 6)
        commit_data_files(ours, write_data_files(ours, spec, rows), "a", version, spec.partition_by)
        append_exactly_once(theirs, rows, "a", version)
    assert_df_equality(read_delta(spark, ours).orderBy("queue_offset"),
                       read_delta(spark, theirs).orderBy("queue_offset"))
    assert read_delta(spark, ours).count() == 18


def test_statistics_let_delta_rs_skip_files(tmp_path: Path) -> None:
    path, spec = _table(tmp_path, tables.CONSUME_QUEUE)
    for version, start in enumerate((0, 100, 200)):
        commit_data_files(path, write_data_files(path, spec, cq_rows(10, start=start)), "cq", version)
    actions = pa.table(DeltaTable(path).get_add_actions(flatten=True)).to_pylist()
    bounds = sorted((a["min.queue_offset"], a["max.queue_offset"], a["num_records"]) for a in actions)
    assert bounds == [(0, 9, 10), (100, 109, 10), (200, 209, 10)]
    # A predicate outside a file's bounds reads nothing from it; inside, exactly its row.
    dataset = DeltaTable(path).to_pyarrow_dataset()
    hit = dataset.to_table(filter=ds.field("queue_offset") == 105)
    assert hit.column("queue_offset").to_pylist() == [105]
    assert len(list(dataset.get_fragments(filter=ds.field("queue_offset") == 105))) == 1


def test_file_statistics_bounds() -> None:
    micro = T0.replace(microsecond=123456)
    data = pa.table({
        "ts": pa.array([micro, micro + dt.timedelta(seconds=1)], pa.timestamp("us", tz="UTC")),
        "name": ["b", "a"], "long": ["x" * 65, "y"], "n": pa.array([None, 3], pa.int32()),
        "body": [b"1", b"2"], "tags": pa.array([None, None], pa.string()), "keys": [["k"], []],
    })
    stats = file_statistics(data, data.column_names)
    assert stats["numRecords"] == 2
    # Timestamps to the millisecond: the minimum floored, the maximum ceiled, so bounds still hold.
    assert stats["minValues"]["ts"] == "2024-05-31T23:59:58.123Z"
    assert stats["maxValues"]["ts"] == "2024-05-31T23:59:59.124Z"
    assert (stats["minValues"]["name"], stats["maxValues"]["name"]) == ("a", "b")
    assert "long" not in stats["minValues"] and "tags" not in stats["minValues"] and "body" not in stats["minValues"]
    assert stats["nullCount"] == {"ts": 0, "name": 0, "long": 0, "n": 1, "body": 0, "tags": 2}
    assert (stats["minValues"]["n"], stats["maxValues"]["n"]) == (3, 3)
    json.dumps(stats)  # what goes into the Delta log


def test_rows_of_the_wrong_shape_write_no_file(tmp_path: Path) -> None:
    path, spec = _table(tmp_path, tables.CONSUME_QUEUE)
    bad = cq_rows(3).drop_columns(["size"])
    with pytest.raises(KeyError):
        write_data_files(path, spec, bad)
    wrong_type = cq_rows(3).set_column(3, "queue_offset", pa.array(["a", "b", "c"]))
    with pytest.raises(pa.ArrowInvalid):
        write_data_files(path, spec, wrong_type)
    assert not list(Path(path).glob("*.parquet"))
    assert write_data_files(path, spec, cq_rows(0)) == []


def test_bad_app_transactions_commit_nothing(tmp_path: Path) -> None:
    path, spec = _table(tmp_path, tables.CONSUME_QUEUE)
    files = write_data_files(path, spec, cq_rows(2))
    before = DeltaTable(path).version()
    for app_id, version in (("", 0), ("a", -1), ("a", 1.5), ("a", True)):
        with pytest.raises(LakeError) as info:
            commit_data_files(path, files, app_id, version)  # type: ignore[arg-type]
        assert info.value.code is ErrorCode.INVALID_ARGUMENT
    assert DeltaTable(path).version() == before
