"""pipelines.tables: every lake table's spec, ensure_table (delta-spark; idempotent, race-safe, strict) and the
``sparkmq`` catalog database."""
from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyspark.sql.types import MapType, StringType, TimestampType

from sparkmq.pipelines import tables
from sparkmq.pipelines.errors import LakeError, SchemaMismatchError, UnknownTableError
from sparkmq.platform.broker import offsets
from sparkmq.platform.common import lake_tables

EXPECTED = ["consume_queue", "messages", "message_keys", "consumer_offsets", "message_trace", "dead_letters",
            "topic_stats", "group_stats", "alerts"]


def test_every_table_is_named_once() -> None:
    assert list(tables.TABLES) == EXPECTED
    for name, spec in tables.TABLES.items():
        assert spec.name == name and spec.location == name
        assert spec.description and "\n" not in spec.description
        assert tables.get_spec(name) is spec


def test_timestamps_are_utc_microseconds() -> None:
    for spec in tables.TABLES.values():
        for f in spec.schema:
            if pa.types.is_timestamp(f.type):
                assert f.type == pa.timestamp("us", tz="UTC"), (spec.name, f.name)


def test_columns_the_jobs_rely_on() -> None:
    cq = tables.TABLES["consume_queue"].schema
    assert cq.names == ["topic", "broker", "queue_id", "queue_offset", "commitlog_offset", "size", "tag_hash",
                        "store_ts"]
    msgs = tables.TABLES["messages"]
    assert msgs.partition_by == ("store_date",)
    assert msgs.schema.field("body").type == pa.binary()
    assert msgs.schema.field("properties").type == pa.map_(pa.string(), pa.string())
    assert tables.TABLES["message_trace"].partition_by == ("event_date",)
    assert {"key", "key_type"} <= set(tables.TABLES["message_keys"].schema.names)
    assert {"resolved_at", "raised_at", "threshold"} <= set(tables.TABLES["alerts"].schema.names)


def test_consumer_offsets_schema_is_defined_once() -> None:
    spec = tables.TABLES["consumer_offsets"]
    # The very same object the broker writes with: one definition, in platform.common.
    assert spec.schema is lake_tables.CONSUMER_OFFSETS_SCHEMA is offsets.CONSUMER_OFFSETS_SCHEMA
    assert spec.name == offsets.CONSUMER_OFFSETS_TABLE


def test_table_path_and_unknown_names(tmp_path: Path) -> None:
    assert tables.table_path(tmp_path, "messages") == str(tmp_path / "messages")
    assert tables.table_path("s3://bucket/lake/", "alerts") == "s3://bucket/lake/alerts"
    with pytest.raises(UnknownTableError, match="no lake table named 'nope'.*consume_queue"):
        tables.table_path(tmp_path, "nope")
    with pytest.raises(ValueError, match="relative"):
        tables.TableSpec("x", "../x", pa.schema([]), (), "d")
    with pytest.raises(ValueError, match=r"partition, statistics or plain columns \[.b.\]"):
        tables.TableSpec("x", "x", pa.schema([pa.field("a", pa.int32())]), ("b",), "d")


def test_spark_schema_types() -> None:
    schema = tables.spark_schema("messages")
    assert schema["store_ts"].dataType == TimestampType() and not schema["store_ts"].nullable
    assert schema["properties"].dataType == MapType(StringType(), StringType(), True)
    assert schema.fieldNames() == tables.TABLES["messages"].schema.names


@pytest.mark.spark
@pytest.mark.parametrize("name", EXPECTED)
def test_every_spec_creates_its_table(spark, tmp_path: Path, name: str) -> None:
    """delta-spark creates it at the pinned protocol with the spec's schema; delta-rs (the broker) reads it."""
    spec = tables.get_spec(name)
    assert tables.ensure_table(spark, tmp_path, name) == f"sparkmq.{name}"
    assert tables.ensure_table(spark, tmp_path, name) == f"sparkmq.{name}"    # idempotent: no second commit
    rust = DeltaTable(tables.table_path(tmp_path, name))
    assert rust.version() == 0
    assert pa.schema(rust.schema().to_arrow()).equals(spec.schema), f"{rust.schema().to_arrow()}\n!=\n{spec.schema}"
    assert tuple(rust.metadata().partition_columns) == spec.partition_by
    assert rust.metadata().description == spec.description
    protocol = rust.protocol()
    assert (protocol.min_reader_version, protocol.min_writer_version) == (1, 2)
    assert not protocol.reader_features and not protocol.writer_features
    assert rust.metadata().configuration["delta.enableDeletionVectors"] == "false"
    # The catalog: the same table by name, empty.
    assert spark.table(f"sparkmq.{name}").count() == 0
    assert spark.table(f"sparkmq.{name}").schema.fieldNames() == spec.schema.names


@pytest.mark.spark
def test_existing_table_must_match_its_spec(spark, tmp_path: Path) -> None:
    DeltaTable.create(tables.table_path(tmp_path, "alerts"), pa.schema([pa.field("rule", pa.string())]))
    with pytest.raises(SchemaMismatchError, match="does not have the schema of 'alerts'.*alert_id"):
        tables.ensure_table(spark, tmp_path, "alerts")
    spec = tables.get_spec("messages")
    DeltaTable.create(tables.table_path(tmp_path, "messages"), spec.schema)  # right schema, not partitioned
    with pytest.raises(SchemaMismatchError, match=r"partitioned by \[\], but 'messages' is partitioned by"):
        tables.ensure_table(spark, tmp_path, "messages")
    (tmp_path / "dead_letters").mkdir()
    (tmp_path / "dead_letters" / "junk.txt").write_text("not a table")
    with pytest.raises(LakeError, match="not a Delta table"):
        tables.ensure_table(spark, tmp_path, "dead_letters")


@pytest.mark.spark
def test_registration_follows_the_lake_root(spark, tmp_path: Path) -> None:
    """``sparkmq.<table>`` names the table of the lake registered last; a table another root lacks is dropped."""
    lake_a, lake_b = tmp_path / "a", tmp_path / "b"
    tables.ensure_tables(spark, lake_a, ["alerts", "topic_stats"])
    tables.ensure_table(spark, lake_b, "alerts")
    spark.createDataFrame([("x", "r", "s", "info", None, None, dt.datetime(2026, 1, 1, tzinfo=dt.UTC), None, None)],
                          tables.spark_schema("alerts")).write.format("delta").mode("append").save(
        tables.table_path(lake_b, "alerts"))
    assert tables.register_tables(spark, lake_a) == ["topic_stats", "alerts"]
    assert spark.table("sparkmq.alerts").count() == 0
    assert tables.register_tables(spark, lake_b) == ["alerts"]
    assert spark.table("sparkmq.alerts").count() == 1
    assert not spark.catalog.tableExists("sparkmq.topic_stats")      # lake b has none: no stale name
    location = spark.sql("DESCRIBE DETAIL sparkmq.alerts").first().location
    assert location.rstrip("/").endswith(str(lake_b / "alerts"))


_CREATOR = """
import sys
from sparkmq.pipelines.session import get_spark
from sparkmq.pipelines.tables import ensure_tables
spark = get_spark({"spark.master": "local[1]"}, log_level="ERROR")
print("READY", flush=True)
sys.stdin.readline()    # the test's go, once both drivers are up
print(sorted(ensure_tables(spark, sys.argv[1])), flush=True)
"""


@pytest.mark.spark
@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.timeout(600)   # a driver that never says READY would otherwise hold the run
def test_concurrent_creators_commit_exactly_one_create(tmp_path: Path) -> None:
    """Two Spark drivers creating the same lake at the same moment: one CREATE per table (Delta's log admits
    one version 0), both end with every table."""
    lake = tmp_path / "lake"
    children = []
    for i in range(2):
        with (tmp_path / f"creator-{i}.log").open("w") as log:   # the child keeps its own descriptor
            children.append(subprocess.Popen([sys.executable, "-c", _CREATOR, str(lake)], stdin=subprocess.PIPE,
                                             stdout=subprocess.PIPE, stderr=log, text=True))
    try:
        # Both JVMs are up before either creates anything, so the creates really race (a fixed start time
        # 40 s ahead waited for nothing once the JVMs were up, and on a loaded machine could come before one was).
        for i, child in enumerate(children):
            assert child.stdout.readline().strip() == "READY", (tmp_path / f"creator-{i}.log").read_text()[-3000:]
        for child in children:
            child.stdin.write("go\n")
            child.stdin.flush()
        for i, child in enumerate(children):
            out, _ = child.communicate(timeout=300)
            assert child.returncode == 0, (tmp_path / f"creator-{i}.log").read_text()[-3000:]
            assert json.loads(out.strip().splitlines()[-1].replace("'", '"')) == sorted(EXPECTED)
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait(10)
    for name in EXPECTED:
        log_dir = lake / name / "_delta_log"
        assert sorted(p.name for p in log_dir.glob("*.json")) == ["00000000000000000000.json"], name


@pytest.mark.spark
def test_broker_writes_into_the_table_ensure_table_made(spark, tmp_path: Path) -> None:
    tables.ensure_table(spark, tmp_path, "consumer_offsets")
    manager = offsets.ConsumerOffsetManager(tables.table_path(tmp_path, "consumer_offsets"), "broker-a")
    manager.commit("g1", "t1", 0, 42)
    assert manager.persist() == 1
    rows = DeltaTable(tables.table_path(tmp_path, "consumer_offsets")).to_pyarrow_table().to_pylist()
    assert [(r["group"], r["topic"], r["queue_id"], r["offset"]) for r in rows] == [("g1", "t1", 0, 42)]
