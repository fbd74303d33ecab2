"""The dead-letters job: a message sent back past its max reconsume times becomes one ``dead_letters`` row.

A real broker process (no name server: the job reads it through ``brokers``), the shared
SparkSession.  Two messages reach ``%DLQ%dlq-group``: one past max reconsume times (the
broker's own reason), one sent straight to the DLQ (``delay_level=-1``) with the consumer's
reason.  The job (``availableNow``) writes one row each with delta-spark; a re-run batch adds nothing.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from chispa import assert_df_equality
from deltalake import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql.types import StructField, StructType

from procs import ProcessHarness
from sparkmq.pipelines import tables
from sparkmq.pipelines.dlq_job import dlq_app_id, dlq_batch, start_dlq_job
from sparkmq.platform.client.remoting import BrokerClient

pytestmark = [pytest.mark.spark, pytest.mark.cluster, pytest.mark.timeout(300)]

GROUP = "dlq-group"


def _send_and_dead_letter(client: BrokerClient, body: str, key: str, *, delay_level: int, reason: str,
                          max_reconsume_times: int) -> str:
    sent = client.send("Orders", {"body": body, "tags": "TagA", "keys": [key], "queue_id": 0})
    client.send_back(GROUP, sent["offset_msg_id"], delay_level=delay_level, reason=reason,
                     max_reconsume_times=max_reconsume_times)
    return sent["msg_id"]


def test_dead_letters_are_written_once(procs: ProcessHarness, tmp_path: Path, spark: SparkSession) -> None:
    broker = procs.start("broker", "sparkmq.api.broker_main", "--data-dir", str(tmp_path / "broker"),
                         "--broker-name", "broker-a")
    client = BrokerClient(broker.addr, 10.0)
    try:
        # Past max reconsume times (0 allowed: the first send-back dead-letters, reason from the broker) ...
        exceeded = _send_and_dead_letter(client, "first", "k1", delay_level=0, reason="",
                                         max_reconsume_times=0)
        # ... and straight to the DLQ with the consumer's reason.
        direct = _send_and_dead_letter(client, "second", "k2", delay_level=-1, reason="poison pill",
                                       max_reconsume_times=16)
        assert client.topic_stats(f"%DLQ%{GROUP}")["queues"][0]["max_offset"] == 2
    finally:
        client.close()

    lake, checkpoint = tmp_path / "lake", str(tmp_path / "ckpt-dlq")
    brokers = {"broker-a": broker.addr}
    query = start_dlq_job(spark, brokers, lake, checkpoint, {"availableNow": True})
    query.awaitTermination(180)
    assert query.exception() is None

    columns = ["group", "original_topic", "msg_id", "reconsume_times", "reason", "broker", "dlq_topic",
               "dlq_queue_id", "dlq_offset", "tags", "keys"]
    path = tables.table_path(lake, tables.DEAD_LETTERS)
    tables.register_tables(spark, lake, [tables.DEAD_LETTERS])
    actual = spark.table("sparkmq.dead_letters").select(*columns).orderBy("dlq_offset")
    spec = tables.spark_schema(tables.DEAD_LETTERS)
    schema = StructType([StructField(c, spec[c].dataType, spec[c].nullable) for c in columns])
    expected = spark.createDataFrame([
        (GROUP, "Orders", exceeded, 1, "exceeded max reconsume times", "broker-a", f"%DLQ%{GROUP}", 0, 0, "TagA",
         "k1"),
        (GROUP, "Orders", direct, 1, "poison pill", "broker-a", f"%DLQ%{GROUP}", 0, 1, "TagA", "k2"),
    ], schema)
    assert_df_equality(actual, expected, ignore_nullable=True)
    bodies = {r.msg_id: bytes(r.body) for r in spark.table("sparkmq.dead_letters").select("msg_id", "body").collect()}
    assert bodies == {exceeded: b"first", direct: b"second"}

    # A repeated batch adds nothing: the same batch id again, and the query again from its checkpoint.
    dt = DeltaTable(path)
    last_batch = dt.transaction_version(dlq_app_id("broker-a"))
    assert last_batch is not None
    version = dt.version()
    rows = dt.to_pyarrow_table()
    again = spark.read.format("sparkmq").option("brokers", f"broker-a={broker.addr}") \
        .option("subscribePattern", "%DLQ%.+").option("includeSystemTopics", "true").load()
    assert again.count() == 2
    dlq_batch(again, last_batch, lake, "broker-a")          # Delta skips a batch id it holds
    query = start_dlq_job(spark, brokers, lake, checkpoint, {"availableNow": True})
    query.awaitTermination(180)
    assert query.exception() is None
    assert DeltaTable(path).version() == version
    assert DeltaTable(path).to_pyarrow_table().num_rows == rows.num_rows == 2
