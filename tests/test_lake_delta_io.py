"""pipelines.delta_io: exactly-once appends, the snapshot reader, maintenance."""
from __future__ import annotations

import datetime as dt
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest
from chispa import assert_df_equality
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError
from pyspark.sql.types import StructType

from sparkmq.pipelines import delta_io, tables
from sparkmq.pipelines.delta_io import append_exactly_once, maintain, read_delta, snapshot
from sparkmq.pipelines.errors import LakeError, TableNotFound, UnsupportedTableError

UTC = dt.UTC
T0 = dt.datetime(2024, 5, 31, 23, 59, 58, 123456, tzinfo=UTC)


def cq_rows(n: int, *, topic: str = "t", start: int = 0) -> pa.Table:
    """``n`` consume_queue rows of ``topic`` with queue offsets start..start+n-1."""
    offs = list(range(start, start + n))
    return pa.Table.from_pydict({
        "topic": [topic] * n, "broker": ["b1"] * n, "queue_id": [o % 4 for o in offs], "queue_offset": offs,
        "commitlog_offset": [o * 100 for o in offs], "size": [100] * n, "tag_hash": [o * 7 for o in offs],
        "store_ts": [T0 + dt.timedelta(seconds=o) for o in offs],
    }, schema=tables.get_spec("consume_queue").schema)


def message_rows(start: int, n: int) -> pa.Table:
    """``n`` full messages; they straddle midnight, so two store_date partitions."""
    offs = list(range(start, start + n))
    store = [T0 + dt.timedelta(seconds=o) for o in offs]
    return pa.Table.from_pydict({
        "topic": ["orders"] * n, "broker": ["b1"] * n, "queue_id": [o % 2 for o in offs], "queue_offset": offs,
        "commitlog_offset": [o * 300 for o in offs], "size": [300] * n, "msg_id": [f"M{o:04d}" for o in offs],
        "offset_msg_id": [f"7F00000100002A9F{o * 300:016X}" for o in offs],
        "tags": ["TagA" if o % 2 else None for o in offs], "keys": [f"k{o} order-{o}" for o in offs],
        "body": [bytes([o % 256, 0, 255]) + b"payload" for o in offs],   # not UTF-8: a real binary column
        "properties": [[("TAGS", "TagA"), ("x", str(o))] if o % 2 else None for o in offs],
        "born_ts": [s - dt.timedelta(milliseconds=3) for s in store], "born_host": ["10.0.0.1:5000"] * n,
        "store_ts": store, "store_host": ["10.0.0.2:10911"] * n, "reconsume_times": [0] * n,
        "sys_flag": [0] * n, "store_date": [s.date() for s in store],
    }, schema=tables.get_spec("messages").schema)


def rows_of(path: str) -> list[dict]:
    return sorted(DeltaTable(path).to_pyarrow_table().to_pylist(), key=lambda r: (r["topic"], r["queue_offset"]))


@pytest.fixture
def cq(tmp_path: Path) -> str:
    """An empty consume_queue table; its path."""
    tables.ensure_table(tmp_path, "consume_queue")
    return tables.table_path(tmp_path, "consume_queue")


# -- exactly-once appends -----------------------------------------------------------------

def test_same_version_twice_lands_once(cq: str) -> None:
    assert append_exactly_once(cq, cq_rows(3), "job-a", 0) is True     # Spark batch ids start at 0
    assert append_exactly_once(cq, cq_rows(3), "job-a", 0) is False
    assert len(rows_of(cq)) == 3
    assert DeltaTable(cq).transaction_version("job-a") == 0


def test_lower_version_is_skipped_and_app_ids_are_independent(cq: str) -> None:
    assert append_exactly_once(cq, cq_rows(2, start=0), "job-a", 5)
    assert not append_exactly_once(cq, cq_rows(2, start=10), "job-a", 3)   # stale: below the recorded 5
    assert append_exactly_once(cq, cq_rows(2, start=20), "job-b", 3)       # another app id has its own sequence
    assert append_exactly_once(cq, cq_rows(2, start=30).to_batches()[0], "job-a", 6)
    assert [r["queue_offset"] for r in rows_of(cq)] == [0, 1, 20, 21, 30, 31]
    table = DeltaTable(cq)
    assert (table.transaction_version("job-a"), table.transaction_version("job-b")) == (6, 3)


def test_empty_batch_records_its_version(cq: str) -> None:
    assert append_exactly_once(cq, cq_rows(0), "job-a", 0)
    assert DeltaTable(cq).transaction_version("job-a") == 0 and rows_of(cq) == []


def test_bad_arguments(cq: str, tmp_path: Path) -> None:
    for app_id, version in [("", 0), ("a", -1), ("a", True), ("a", 1.0)]:
        with pytest.raises(LakeError, match="INVALID_ARGUMENT"):
            append_exactly_once(cq, cq_rows(1), app_id, version)
    with pytest.raises(TableNotFound, match="ensure_table"):
        append_exactly_once(tmp_path / "missing", cq_rows(1), "a", 0)


def test_lost_race_to_the_same_app_id_rechecks_and_skips(cq: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another writer commits (job-a, 0) between our check and our commit: we must not write it again."""
    real_write = delta_io.write_deltalake
    calls: list[int] = []

    def racing_write(table, data, **kwargs):
        calls.append(1)
        if len(calls) == 1:   # the other writer wins, then our commit is refused
            write_deltalake(cq, cq_rows(3, start=100), mode="append",
                            commit_properties=CommitProperties(app_transactions=[Transaction("job-a", 0)]))
            return real_write(table, data, **kwargs)   # delta-rs: "Concurrent transaction failed"
        raise AssertionError("must not write again after the re-check")

    monkeypatch.setattr(delta_io, "write_deltalake", racing_write)
    assert append_exactly_once(cq, cq_rows(3), "job-a", 0) is False
    assert [r["queue_offset"] for r in rows_of(cq)] == [100, 101, 102]


def test_commit_failure_is_retried(cq: str, monkeypatch: pytest.MonkeyPatch) -> None:
    real_write = delta_io.write_deltalake
    calls: list[int] = []

    def flaky_write(table, data, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise CommitFailedError("simulated lost commit race")
        return real_write(table, data, **kwargs)

    monkeypatch.setattr(delta_io, "write_deltalake", flaky_write)
    assert append_exactly_once(cq, cq_rows(2), "job-a", 0) is True
    assert len(calls) == 2 and len(rows_of(cq)) == 2


_APPENDER = """
import sys, time
from sparkmq.pipelines.delta_io import append_exactly_once
from test_lake_delta_io import cq_rows
path, app_id, start, batches = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
while time.time() < start:
    pass
wrote = sum(append_exactly_once(path, cq_rows(5, topic=app_id, start=v * 5), app_id, v) for v in range(batches))
print(wrote)
"""


@pytest.mark.cluster
def test_concurrent_processes_append_exactly_once(cq: str) -> None:
    """Two processes with different app ids both land; a zombie twin of one adds no duplicate."""
    batches = 12
    start = time.time() + 2.0
    apps = ["job-a", "job-b", "job-a"]          # the third is a second writer with job-a's id
    env_path = str(Path(__file__).parent)
    children = [subprocess.Popen([sys.executable, "-c", _APPENDER, cq, app, str(start), str(batches)],
                                 cwd=env_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for app in apps]
    wrote = []
    for child in children:
        out, err = child.communicate(timeout=120)
        assert child.returncode == 0, err
        wrote.append(int(out))
    assert wrote[1] == batches and wrote[0] + wrote[2] == batches   # each job-a version written once
    rows = rows_of(cq)
    for app in ("job-a", "job-b"):
        assert [r["queue_offset"] for r in rows if r["topic"] == app] == list(range(5 * batches)), app
    table = DeltaTable(cq)
    assert table.transaction_version("job-a") == table.transaction_version("job-b") == batches - 1


# -- snapshots and the Spark reader ---------------------------------------------------------

def test_snapshot_lists_files_and_partitions(tmp_path: Path) -> None:
    tables.ensure_table(tmp_path, "messages")
    path = tables.table_path(tmp_path, "messages")
    append_exactly_once(path, message_rows(0, 4), "m", 0)
    snap = snapshot(path)
    assert snap.version == 1 and snap.partition_columns == ("store_date",)
    assert len(snap.files) == 2 == len(snap.partition_values)       # the batch straddles midnight
    assert sorted(v["store_date"] for v in snap.partition_values) == [dt.date(2024, 5, 31), dt.date(2024, 6, 1)]
    assert snapshot(path, 0).files == ()
    with pytest.raises(LakeError, match="versions 0..1, not 7"):
        snapshot(path, 7)
    with pytest.raises(TableNotFound):
        snapshot(tmp_path / "nothing")


@pytest.mark.spark
def test_read_delta_equals_what_was_written_with_time_travel(spark, tmp_path: Path) -> None:
    tables.ensure_table(tmp_path, "messages")
    path = tables.table_path(tmp_path, "messages")
    first, second = message_rows(0, 4), message_rows(4, 3)
    append_exactly_once(path, first, "dispatch", 0)
    append_exactly_once(path, second, "dispatch", 1)

    got = read_delta(spark, path).orderBy("queue_offset")
    expected = spark.createDataFrame(pa.concat_tables([first, second])).orderBy("queue_offset")
    # Spark's file sources report every column nullable; the values and types must match exactly.
    assert_df_equality(got, expected, ignore_nullable=True)
    assert got.columns == tables.get_spec("messages").schema.names     # partition column in spec order

    old = read_delta(spark, path, version=1).orderBy("queue_offset")
    assert_df_equality(old, spark.createDataFrame(first).orderBy("queue_offset"), ignore_nullable=True)

    # An explicit schema selects and orders columns.
    full = tables.spark_schema("messages")
    narrow = read_delta(spark, path, schema=StructType([full["store_date"], full["msg_id"]]))
    assert narrow.columns == ["store_date", "msg_id"]
    assert narrow.filter("store_date = DATE'2024-06-01'").count() == 5


@pytest.mark.spark
def test_empty_table_reads_as_zero_rows_with_the_schema(spark, tmp_path: Path) -> None:
    path = tables.table_path(tmp_path, "dead_letters")
    tables.ensure_table(tmp_path, "dead_letters")
    got = read_delta(spark, path)
    expected = spark.createDataFrame([], tables.spark_schema("dead_letters"))
    assert_df_equality(got, expected, ignore_nullable=True)
    assert got.count() == 0


@pytest.mark.spark
def test_partition_values_spark_would_mangle_are_read_from_the_log(spark, tmp_path: Path) -> None:
    """Spark decodes %C3%BC in a directory name as two characters; such tables take the slow, exact path."""
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("topic", pa.string()),
                        pa.field("at", pa.timestamp("us", tz="UTC"))])
    path = str(tmp_path / "odd")
    DeltaTable.create(path, schema, partition_by=["topic", "at"])
    data = pa.Table.from_pydict({"id": [1, 2, 3, 4], "topic": ["zürich", "%DLQ%g 1", None, "007"],
                                 "at": [T0, T0, None, T0 + dt.timedelta(hours=1)]}, schema=schema)
    write_deltalake(path, data, mode="append")
    assert_df_equality(read_delta(spark, path).orderBy("id"), spark.createDataFrame(data).orderBy("id"),
                       ignore_nullable=True)


@pytest.mark.spark
@pytest.mark.parametrize("configuration, reason", [
    ({"delta.columnMapping.mode": "name", "delta.minReaderVersion": "2", "delta.minWriterVersion": "5"},
     "column mapping"),
    ({"delta.enableDeletionVectors": "true"}, "deletion vectors"),
])
def test_tables_a_plain_parquet_read_gets_wrong_are_refused(spark, tmp_path: Path, configuration: dict,
                                                            reason: str) -> None:
    schema = pa.schema([pa.field("a", pa.int64())])
    path = str(tmp_path / "t")
    DeltaTable.create(path, schema, configuration=configuration)
    write_deltalake(path, pa.table({"a": [1, 2]}, schema=schema), mode="append")
    with pytest.raises(UnsupportedTableError, match=f"cannot read the Delta table at .* it uses {reason}"):
        read_delta(spark, path)
    assert reason in snapshot(path).unsupported_reason()


# -- maintenance ----------------------------------------------------------------------------

def test_maintain_refuses_an_unsafe_vacuum(cq: str) -> None:
    for hours in (0, 23):
        with pytest.raises(LakeError, match="below the safe minimum"):
            maintain(cq, vacuum_retention_hours=hours)
    with pytest.raises(LakeError, match="INVALID_ARGUMENT"):
        maintain(cq, vacuum_retention_hours=-1, allow_unsafe_retention=True)
    done = maintain(cq)   # the defaults on an empty table: nothing to compact or delete
    assert done["vacuumed"] == 0 and done["compact"]["numFilesRemoved"] == 0


@pytest.mark.spark
def test_maintain_compacts_many_small_commits(spark, cq: str) -> None:
    for v in range(50):
        assert append_exactly_once(cq, cq_rows(1, start=v), "dispatch", v)
    before = snapshot(cq)
    assert len(before.files) == 50

    done = maintain(cq, vacuum_retention_hours=0, allow_unsafe_retention=True)
    assert done["files_before"] == 50 and done["files_after"] == 1
    assert done["compact"]["numFilesRemoved"] == 50 and done["vacuumed"] == 50
    # create + 50 appends, then OPTIMIZE and delta-rs's two vacuum commits; the checkpoint covers them all.
    assert done["version_before"] == 50 and done["checkpoint_version"] == done["version_after"] == 53
    assert [h["operation"] for h in DeltaTable(cq).history(3)] == ["VACUUM END", "VACUUM START", "OPTIMIZE"]
    log_dir = Path(cq) / "_delta_log"
    assert (log_dir / "_last_checkpoint").exists()
    assert (log_dir / f"{done['checkpoint_version']:020d}.checkpoint.parquet").exists()
    assert sorted(p.name for p in Path(cq).glob("*.parquet")) == [Path(f).name for f in snapshot(cq).files]

    assert_df_equality(read_delta(spark, cq).orderBy("queue_offset"),
                       spark.createDataFrame(cq_rows(50)).orderBy("queue_offset"), ignore_nullable=True)
    # Exactly-once state survives compaction and the checkpoint.
    assert DeltaTable(cq).transaction_version("dispatch") == 49
    assert not append_exactly_once(cq, cq_rows(1, start=49), "dispatch", 49)
