"""The lake on delta-spark: the session's Delta settings, idempotent appends, history and time travel, and
``consumer_offsets`` shared by a broker's delta-rs and Spark (both directions).

The shared SparkSession writes and reads through Delta's own API; the broker side is real delta-rs, once
in a child process that has no JVM (a broker without Spark).
"""
from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from chispa import assert_df_equality
from deltalake import DeltaTable as RustDeltaTable
from pyspark.sql import SparkSession

from sparkmq.pipelines import tables
from sparkmq.pipelines.dispatch import append_once
from sparkmq.pipelines.maintenance import maintain
from sparkmq.pipelines.session import DELTA_CATALOG, DELTA_EXTENSION
from sparkmq.platform.broker.offsets import ConsumerOffsetManager, app_id_for
from sparkmq.platform.common import jars

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

UTC = dt.UTC
T0 = dt.datetime(2024, 5, 31, 23, 59, 58, 123456, tzinfo=UTC)


def cq_frame(spark: SparkSession, n: int, *, topic: str = "t", start: int = 0):
    """``n`` consume_queue rows of ``topic`` with queue offsets start..start+n-1 (microsecond timestamps)."""
    offs = range(start, start + n)
    return spark.createDataFrame(
        [(topic, "b1", o % 4, o, o * 100, 100, o * 7, T0 + dt.timedelta(seconds=o, microseconds=o)) for o in offs],
        tables.spark_schema(tables.CONSUME_QUEUE))


def test_every_session_has_delta_and_writes_microsecond_timestamps(spark: SparkSession) -> None:
    conf = spark.sparkContext.getConf()
    assert DELTA_EXTENSION in conf.get("spark.sql.extensions").split(",")
    assert conf.get("spark.sql.catalog.spark_catalog") == DELTA_CATALOG
    shipped = conf.get("spark.jars").split(",")
    assert {str(p) for p in jars.jars("delta")} <= set(shipped)
    assert any("delta-spark_4.2_2.13" in j for j in shipped)
    assert spark.conf.get("spark.sql.parquet.outputTimestampType") == "TIMESTAMP_MICROS"


def test_append_once_lands_once_per_app_and_version(spark: SparkSession, tmp_path: Path) -> None:
    """Delta's txnAppId/txnVersion: the same version twice lands once, a lower one is skipped, another app id
    is independent, and the version is recorded in the log (what check_checkpoint reads)."""
    tables.ensure_table(spark, tmp_path, tables.CONSUME_QUEUE)
    path = tables.table_path(tmp_path, tables.CONSUME_QUEUE)
    append_once(cq_frame(spark, 3), tmp_path, tables.CONSUME_QUEUE, "job-a", 5)
    append_once(cq_frame(spark, 3), tmp_path, tables.CONSUME_QUEUE, "job-a", 5)       # a replay
    append_once(cq_frame(spark, 3, start=3), tmp_path, tables.CONSUME_QUEUE, "job-a", 4)   # stale
    append_once(cq_frame(spark, 2, start=10), tmp_path, tables.CONSUME_QUEUE, "job-b", 0)  # another job
    append_once(cq_frame(spark, 2, start=20), tmp_path, tables.CONSUME_QUEUE, "job-a", 6)
    rust = RustDeltaTable(path)
    assert sorted(r["queue_offset"] for r in rust.to_pyarrow_table().to_pylist()) == [0, 1, 2, 10, 11, 20, 21]
    assert (rust.transaction_version("job-a"), rust.transaction_version("job-b")) == (6, 0)
    assert rust.version() == 3      # the replayed and the stale write committed nothing


def test_history_time_travel_and_delta_rs_reads_what_spark_wrote(spark: SparkSession, tmp_path: Path) -> None:
    tables.ensure_table(spark, tmp_path, tables.CONSUME_QUEUE)
    for version in range(3):
        append_once(cq_frame(spark, 2, start=10 * version), tmp_path, tables.CONSUME_QUEUE, "job", version)
    tables.register_tables(spark, tmp_path)
    history = spark.sql("DESCRIBE HISTORY sparkmq.consume_queue").orderBy("version").collect()
    assert [h.operation for h in history] == ["CREATE TABLE", "WRITE", "WRITE", "WRITE"]
    assert spark.sql("SELECT count(*) AS n FROM sparkmq.consume_queue VERSION AS OF 2").first().n == 4
    assert spark.read.option("versionAsOf", 1).table("sparkmq.consume_queue").count() == 2
    assert spark.table("sparkmq.consume_queue").count() == 6
    # delta-rs (the broker's reader) sees the same rows, timestamps to the microsecond (TIMESTAMP_MICROS).
    rust = RustDeltaTable(tables.table_path(tmp_path, tables.CONSUME_QUEUE)).to_pyarrow_table()
    assert rust.schema.field("store_ts").type == pa.timestamp("us", tz="UTC")
    want = spark.table("sparkmq.consume_queue").orderBy("queue_offset").toArrow()
    assert rust.sort_by("queue_offset").column("store_ts").to_pylist() == want.column("store_ts").to_pylist()
    assert rust.column("store_ts").to_pylist()[0].microsecond in {T0.microsecond + o for o in range(30)}


_BROKER_WITHOUT_SPARK = """
import json, sys
from sparkmq.platform.broker.offsets import ConsumerOffsetManager
manager = ConsumerOffsetManager(sys.argv[1], "broker-a", persist_interval_s=3600)
for queue_id in range(3):
    manager.commit("g1", "orders", queue_id, 100 + queue_id)
manager.commit("g2", "orders", 0, 7)
manager.persist()
manager.commit("g1", "orders", 0, 150)            # a second persist: a MERGE that updates one row
manager.persist()
assert "pyspark" not in sys.modules and "py4j" not in sys.modules, "the broker side must not need Spark"
print(json.dumps(sorted(sys.modules)[:0]))
"""


def test_consumer_offsets_written_by_a_broker_without_spark_is_read_by_spark(spark: SparkSession,
                                                                           tmp_path: Path) -> None:
    path = tables.table_path(tmp_path, tables.CONSUMER_OFFSETS)
    done = subprocess.run([sys.executable, "-c", _BROKER_WITHOUT_SPARK, path], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert tables.register_tables(spark, tmp_path) == [tables.CONSUMER_OFFSETS]
    rows = {(r.group, r.queue_id): r.offset for r in spark.table("sparkmq.consumer_offsets").collect()}
    assert rows == {("g1", 0): 150, ("g1", 1): 101, ("g1", 2): 102, ("g2", 0): 7}
    assert spark.sql("DESCRIBE DETAIL sparkmq.consumer_offsets").select(
        "minReaderVersion", "minWriterVersion").first() == (1, 2)
    assert [h.operation for h in spark.sql("DESCRIBE HISTORY sparkmq.consumer_offsets").orderBy("version")
            .collect()] == ["CREATE TABLE", "MERGE", "MERGE"]
    # The table the broker created is the spec's table: ensure_table accepts it as it is.
    tables.ensure_table(spark, tmp_path, tables.CONSUMER_OFFSETS)


def test_consumer_offsets_written_by_spark_is_read_and_merged_by_the_broker(spark: SparkSession,
                                                                          tmp_path: Path) -> None:
    """The direction the broker needs: Spark writes, compacts, vacuums and checkpoints the table; the broker's
    delta-rs loads it and keeps merging into it; the protocol stays reader 1 / writer 2 throughout."""
    tables.ensure_table(spark, tmp_path, tables.CONSUMER_OFFSETS)
    path = tables.table_path(tmp_path, tables.CONSUMER_OFFSETS)
    now = dt.datetime.now(UTC)
    for i, (group, queue_id, offset) in enumerate([("g1", 0, 10), ("g1", 1, 20), ("g2", 0, 30)]):
        frame = spark.createDataFrame([("broker-a", group, "orders", queue_id, offset, now)],
                                      tables.spark_schema(tables.CONSUMER_OFFSETS))
        append_once(frame, tmp_path, tables.CONSUMER_OFFSETS, "spark-test", i)
    maintain(spark, path, vacuum_retention_hours=0, allow_unsafe_retention=True)  # OPTIMIZE, VACUUM, checkpoint
    assert (Path(path) / "_delta_log" / "_last_checkpoint").exists()

    manager = ConsumerOffsetManager(path, "broker-a", persist_interval_s=3600)
    manager.load()
    assert manager.offsets_of("g1", "orders") == {0: 10, 1: 20}
    assert manager.offsets_of("g2", "orders") == {0: 30}
    manager.commit("g1", "orders", 0, 11)
    manager.commit("g3", "orders", 5, 1)
    assert manager.persist() == 2
    rust = RustDeltaTable(path)
    assert rust.transaction_version(app_id_for("broker-a")) == 1
    protocol = rust.protocol()
    assert (protocol.min_reader_version, protocol.min_writer_version) == (1, 2)
    assert not protocol.reader_features and not protocol.writer_features
    # And back: Spark sees the broker's merge.
    got = spark.read.format("delta").load(path).orderBy("group", "queue_id").select("group", "queue_id", "offset")
    want = spark.createDataFrame([("g1", 0, 11), ("g1", 1, 20), ("g2", 0, 30), ("g3", 5, 1)],
                                 "group string, queue_id int, offset bigint")
    assert_df_equality(got, want, ignore_nullable=True)


def test_dispatch_tables_written_by_spark_are_read_by_delta_rs_as_their_specs(spark: SparkSession,
                                                                            tmp_path: Path) -> None:
    """The broker reads messages (the lake tier) and message_keys (queries) with delta-rs: exactly the
    Arrow schema of the spec, partition values and binary bodies intact."""
    tables.ensure_table(spark, tmp_path, tables.MESSAGES)
    spec = tables.get_spec(tables.MESSAGES)
    store = [T0 + dt.timedelta(seconds=s) for s in range(4)]       # straddles midnight: two partitions
    rows = [("orders", "b1", 0, o, o * 300, 300, f"M{o}", f"OFF{o}", "TagA" if o % 2 else None, f"k{o}",
             bytes([o, 0, 255]) + b"payload", {"x": str(o)}, s, "10.0.0.1:5000", s, "10.0.0.2:10911", 0, 0,
             s.date()) for o, s in enumerate(store)]
    append_once(spark.createDataFrame(rows, tables.spark_schema(spec)), tmp_path, tables.MESSAGES, "t", 0)
    rust = RustDeltaTable(tables.table_path(tmp_path, tables.MESSAGES))
    data = rust.to_pyarrow_table()
    assert pa.schema(rust.schema().to_arrow()).equals(spec.schema)
    got = sorted(data.select(["queue_offset", "body", "store_date", "properties"]).to_pylist(),
                 key=lambda r: r["queue_offset"])
    assert [(r["body"], r["store_date"]) for r in got] == [(r[10], r[18]) for r in rows]
    assert sorted(json.dumps(p) for p in rust.metadata().partition_columns) == ['"store_date"']
    assert {a["partition.store_date"] for a in pa.table(rust.get_add_actions(flatten=True)).to_pylist()} == {
        dt.date(2024, 5, 31), dt.date(2024, 6, 1)}
