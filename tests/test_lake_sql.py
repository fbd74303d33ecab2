"""pipelines.session and pipelines.sql: the process's SparkSession, and SQL over the lake's Delta tables
(``sparkmq.<table>``, and the short names through run_sql)."""
from __future__ import annotations

import datetime as dt
import os
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from chispa import assert_df_equality

from lake_rows import append_rows
from sparkmq.pipelines import tables
from sparkmq.pipelines.session import get_spark
from sparkmq.pipelines.sql import run_sql
from sparkmq.pipelines.tables import register_tables
from sparkmq.platform.broker.offsets import ConsumerOffsetManager

pytestmark = pytest.mark.spark

T0 = dt.datetime(2024, 6, 1, 12, 0, tzinfo=dt.UTC)
#: (topic, messages, bytes per message): the known load the GROUP BY must give back.
LOAD = [("orders", 7, 100), ("payments", 3, 250), ("%DLQ%billing", 2, 40)]


def cq_batch(topic: str, n: int, size: int, start: int = 0) -> pa.Table:
    offs = range(start, start + n)
    return pa.Table.from_pylist([
        {"topic": topic, "broker": f"b{o % 2}", "queue_id": o % 4, "queue_offset": o, "commitlog_offset": o * size,
         "size": size, "tag_hash": 0, "store_ts": T0 + dt.timedelta(seconds=o)} for o in offs
    ], schema=tables.get_spec("consume_queue").schema)


def test_one_session_per_process_with_the_lake_settings(spark) -> None:
    assert get_spark() is spark
    assert get_spark({"spark.sql.shuffle.partitions": "99"}) is spark     # conf of later calls is ignored
    assert spark.conf.get("spark.sql.session.timeZone") == "UTC"
    assert spark.conf.get("spark.sql.execution.arrow.pyspark.enabled") == "true"
    assert spark.conf.get("spark.sql.shuffle.partitions") == "4"
    assert spark.sparkContext.master == "local[2]"
    assert os.environ["PYSPARK_PYTHON"] and os.environ["PYSPARK_DRIVER_PYTHON"]
    # Python workers run this interpreter (so they can import pyarrow and sparkmq).
    assert spark.sparkContext.parallelize([0], 1).map(lambda _: sys.executable).collect() == [sys.executable]
    with pytest.raises(ValueError, match="log4j level"):
        get_spark(log_level="loud")


def test_register_tables_and_group_by_over_a_known_load(spark, tmp_path: Path) -> None:
    assert register_tables(spark, tmp_path) == []          # a fresh lake: nothing to show
    tables.ensure_table(spark, tmp_path, "alerts")
    for version, (topic, n, size) in enumerate(LOAD):
        append_rows(spark, tmp_path, "consume_queue", cq_batch(topic, n, size), version)
    # consumer_offsets as the broker writes it (delta-rs MERGE), read through the same catalog.
    offsets = ConsumerOffsetManager(tables.table_path(tmp_path, "consumer_offsets"), "b0")
    offsets.commit("billing", "orders", 0, 5)
    offsets.commit("billing", "orders", 1, 2)
    offsets.persist()

    assert register_tables(spark, tmp_path) == ["consume_queue", "consumer_offsets", "alerts"]
    got = spark.sql("SELECT topic, count(*) AS messages, sum(size) AS bytes FROM sparkmq.consume_queue "
                    "GROUP BY topic ORDER BY topic")
    expected = spark.createDataFrame([(t, n, n * s) for t, n, s in sorted(LOAD)],
                                     "topic string, messages bigint, bytes bigint")
    assert_df_equality(got, expected, ignore_nullable=True)

    # A join across views: per queue, how far group billing is behind on topic orders.
    lag = spark.sql("""
        SELECT q.queue_id, max(q.queue_offset) + 1 - coalesce(first(o.offset), 0) AS lag
        FROM sparkmq.consume_queue q LEFT JOIN sparkmq.consumer_offsets o
          ON o.topic = q.topic AND o.queue_id = q.queue_id AND o.`group` = 'billing'
        WHERE q.topic = 'orders' GROUP BY q.queue_id ORDER BY q.queue_id""")
    # orders offsets 0..6 over queues o % 4: queue 0 holds {0, 4}, 1 {1, 5}, 2 {2, 6}, 3 {3}.
    assert [tuple(r) for r in lag.collect()] == [(0, 0), (1, 4), (2, 7), (3, 4)]

    assert spark.sql("SELECT count(*) FROM sparkmq.alerts").first()[0] == 0


def test_run_sql_sees_new_commits(spark, tmp_path: Path) -> None:
    append_rows(spark, tmp_path, "consume_queue", cq_batch("orders", 2, 10), 0)
    query = "SELECT count(*) AS n FROM consume_queue"   # the short name: run_sql makes sparkmq current
    assert run_sql(spark, tmp_path, query).first().n == 2
    append_rows(spark, tmp_path, "consume_queue", cq_batch("orders", 3, 10, start=2), 1)
    assert spark.sql("SELECT count(*) AS n FROM sparkmq.consume_queue").first().n == 5   # a table: always latest
    assert run_sql(spark, tmp_path, query).first().n == 5
    assert spark.sql("SELECT count(*) AS n FROM sparkmq.consume_queue VERSION AS OF 1").first().n == 2
    assert spark.catalog.currentDatabase() == "default"


def test_names_of_another_lake_do_not_linger(spark, tmp_path: Path) -> None:
    lake_a, lake_b = tmp_path / "a", tmp_path / "b"
    tables.ensure_table(spark, lake_a, "alerts")
    assert register_tables(spark, lake_a, ["alerts"]) == ["alerts"]
    assert register_tables(spark, lake_b, ["alerts"]) == []
    assert not spark.catalog.tableExists("sparkmq.alerts")
