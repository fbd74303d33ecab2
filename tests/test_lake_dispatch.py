"""The dispatch job: every stored message exactly once in messages, consume_queue and message_keys.

Real name server + two brokers (module-scoped, from test_lake_source), the shared SparkSession; the
tables are written by delta-spark and read through the catalog (``sparkmq.<table>``).  Expected rows
come from plain JSON pulls of every dispatched topic at check time.
"""
from __future__ import annotations

import re
import time
import zlib
from pathlib import Path
from typing import Any

import pytest
import test_lake_source as lake_source
from chispa import assert_df_equality
from deltalake import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructField, StructType
from test_lake_source import BROKERS, Cluster, pull_all, send, wait_until

from sparkmq.pipelines import tables
from sparkmq.pipelines.dispatch import (
    DISPATCH_PATTERN,
    DISPATCH_TABLES,
    dispatch_app_id,
    dispatch_source_options,
    dispatch_stats,
    start_dispatch,
    write_batch,
)
from sparkmq.pipelines.errors import LakeError
from sparkmq.platform.client import TopicRouteInfo
from sparkmq.platform.common.codec import tag_hash
from sparkmq.platform.common.system_topics import SCHEDULE_TOPIC, TRACE_TOPIC

pytestmark = [pytest.mark.spark, pytest.mark.timeout(420)]  # several Spark runs each, on a slow day

# The same module-scoped fixtures: a name server + broker-a + broker-b, and the session with the format.
cluster = lake_source.cluster
sq = lake_source.sq


def stored(c: Cluster) -> list:
    """Every message of every dispatched topic, by plain pulls."""
    topics = [t for t in c.ns.topic_list() if re.fullmatch(DISPATCH_PATTERN, t)]
    return [m for t in topics for m in pull_all(c, t)]


def table(spark: SparkSession, lake: Path, name: str, columns: list[str]) -> DataFrame:
    """The table of ``lake`` through the catalog (re-pointed at this lake first)."""
    tables.register_tables(spark, lake, [name])
    return spark.table(f"sparkmq.{name}").select(*columns).orderBy(*columns)


def expected(spark: SparkSession, name: str, columns: list[str], rows: list[tuple]) -> DataFrame:
    spec = tables.spark_schema(name)
    schema = StructType([StructField(c, spec[c].dataType, spec[c].nullable) for c in columns])
    return spark.createDataFrame(sorted(rows), schema).orderBy(*columns)


def assert_lake_has_each_message_once(spark: SparkSession, lake: Path, messages: list) -> None:
    """consume_queue, messages and message_keys hold exactly ``messages``: no row missing, none twice."""
    assert messages
    cq_cols = ["topic", "broker", "queue_id", "queue_offset", "commitlog_offset", "size", "tag_hash"]
    assert_df_equality(
        table(spark, lake, tables.CONSUME_QUEUE, cq_cols),
        expected(spark, tables.CONSUME_QUEUE, cq_cols, [
            (m.topic, m.broker_name, m.queue_id, m.queue_offset, m.commitlog_offset, m.store_size, tag_hash(m.tags))
            for m in messages]), ignore_nullable=True)

    ms_cols = ["topic", "broker", "queue_id", "queue_offset", "msg_id", "offset_msg_id", "tags", "keys"]
    assert_df_equality(
        table(spark, lake, tables.MESSAGES, ms_cols),
        expected(spark, tables.MESSAGES, ms_cols, [
            (m.topic, m.broker_name, m.queue_id, m.queue_offset, m.msg_id, m.offset_msg_id, m.tags,
             " ".join(m.keys) or None) for m in messages]), ignore_nullable=True)
    # Bodies as stored: compressed ones stay compressed (the lake tier serves them byte for byte).
    by_id = {m.msg_id: m for m in messages}
    bodies = spark.table("sparkmq.messages").select("msg_id", "body", "sys_flag").collect()
    for row in bodies:
        body = zlib.decompress(row.body) if row.sys_flag & 1 else row.body
        assert body == by_id[row.msg_id].body
    assert any(r.sys_flag & 1 for r in bodies)

    mk_cols = ["key", "key_type", "topic", "broker", "queue_id", "queue_offset"]
    keys = [(m.msg_id, "msg_id", m.topic, m.broker_name, m.queue_id, m.queue_offset) for m in messages]
    keys += [(k, "key", m.topic, m.broker_name, m.queue_id, m.queue_offset) for m in messages for k in m.keys]
    assert_df_equality(table(spark, lake, tables.MESSAGE_KEYS, mk_cols),
                       expected(spark, tables.MESSAGE_KEYS, mk_cols, keys), ignore_nullable=True)


@pytest.mark.cluster
def test_dispatch_writes_every_message_once_and_replays_nothing(sq: SparkSession, cluster: Cluster,
                                                               tmp_path: Path) -> None:
    """availableNow runs in several limited batches, a second run adds only new messages, a re-run batch id
    writes nothing; lag is measured per batch."""
    cluster.create_topic("lake-d1")
    cluster.create_topic("lake-d2", queues=1)
    sent = send(cluster, "lake-d1", 24)
    send(cluster, "lake-d2", 6)
    # Two dead letters of group "ab1": %DLQ%ab1 (its "%ab" would decode as an escape in an unencoded path).
    for _, r in sent[:2]:
        cluster.client(r.broker_name).send_back("ab1", r.offset_msg_id, delay_level=-1, reason="lake test")
    wait_until(lambda: {q.broker_name for q in TopicRouteInfo.from_dict(
        "%DLQ%ab1", cluster.ns.request("GET", "/routes/%25DLQ%25ab1")).read_queues}
        >= {r.broker_name for _, r in sent[:2]}, what="the DLQ topic's route")
    lake, ck = tmp_path / "lake", str(tmp_path / "ck")

    query = start_dispatch(sq, cluster.namesrv.addr, lake, ck, {"availableNow": True}, max_messages_per_trigger=12)
    assert query.awaitTermination(120) and query.exception() is None
    stats = dispatch_stats(query)
    assert stats is not None and stats.job == "cluster" and stats.rows == 32 and stats.batches >= 3
    last = [b for b in stats.history if b.rows][-1]
    assert last.lag_ms_max is not None and 0 <= last.lag_ms_p50 <= last.lag_ms_p99 <= last.lag_ms_max
    assert_lake_has_each_message_once(sq, lake, stored(cluster))
    dead = sq.table("sparkmq.messages").where("topic = '%DLQ%ab1'").collect()
    assert sorted(r.msg_id for r in dead) == sorted(r.msg_id for _, r in sent[:2])
    assert all(r.properties["DLQ_ORIGIN_TOPIC"] == "lake-d1" for r in dead)
    # delta-spark wrote them at the pinned protocol, so the broker's delta-rs reads them (the lake tier).
    for name in DISPATCH_TABLES:
        protocol = DeltaTable(tables.table_path(lake, name)).protocol()
        assert (protocol.min_reader_version, protocol.min_writer_version) == (1, 2), name

    send(cluster, "lake-d1", 8, start=100)
    again = start_dispatch(sq, cluster.namesrv.addr, lake, ck, {"availableNow": True}, max_messages_per_trigger=12)
    assert again.awaitTermination(120) and again.exception() is None
    assert dispatch_stats(again).rows == 8
    assert_lake_has_each_message_once(sq, lake, stored(cluster))

    # Re-running a batch id that is already in the tables writes nothing (Delta's txnAppId/txnVersion).
    versions = {t: DeltaTable(tables.table_path(lake, t)).version() for t in DISPATCH_TABLES}
    done = DeltaTable(tables.table_path(lake, tables.MESSAGES)).transaction_version(
        dispatch_app_id("cluster", tables.MESSAGES))
    reader = sq.read.format("sparkmq")
    for key, value in dispatch_source_options(cluster.namesrv.addr, None).items():
        reader = reader.option(key, value)
    replay = write_batch(reader.load(), done, lake, "cluster")
    assert replay.rows == len(stored(cluster))
    assert {t: DeltaTable(tables.table_path(lake, t)).version() for t in DISPATCH_TABLES} == versions
    assert_lake_has_each_message_once(sq, lake, stored(cluster))

    # A checkpoint that is behind the tables (lost, replaced) is refused instead of skipping batches.
    with pytest.raises(LakeError, match="not this job's checkpoint"):
        start_dispatch(sq, cluster.namesrv.addr, lake, str(tmp_path / "other-ck"), {"availableNow": True})


@pytest.mark.cluster
def test_dispatch_stopped_midway_resumes_from_its_checkpoint(sq: SparkSession, cluster: Cluster,
                                                            tmp_path: Path) -> None:
    """A query stopped in the middle of a backlog and restarted (more messages in between) ends exactly once;
    the per-broker job (brokers option) works the same."""
    cluster.create_topic("lake-d3")
    send(cluster, "lake-d3", 40)
    lake, ck = tmp_path / "lake", str(tmp_path / "ck")
    query = start_dispatch(sq, cluster.namesrv.addr, lake, ck, {"processingTime": "100 milliseconds"},
                           max_messages_per_trigger=5)
    try:
        wait_until(lambda: dispatch_stats(query).rows >= 10, timeout=60, what="two dispatched batches")
    finally:
        query.stop()
    total = len(stored(cluster))
    assert 10 <= dispatch_stats(query).rows < total

    send(cluster, "lake-d3", 5, start=200)
    resumed = start_dispatch(sq, cluster.namesrv.addr, lake, ck, {"availableNow": True},
                             max_messages_per_trigger=None)
    assert resumed.awaitTermination(120) and resumed.exception() is None
    assert_lake_has_each_message_once(sq, lake, stored(cluster))

    # One broker's own job: only that broker's messages, app ids named after it.
    name = BROKERS[0]
    own = tmp_path / "own"
    q = start_dispatch(sq, {name: cluster.brokers[name].addr}, own, str(tmp_path / "own-ck"), {"availableNow": True})
    assert q.awaitTermination(120) and q.exception() is None
    assert dispatch_stats(q).job == name
    assert DeltaTable(tables.table_path(own, tables.MESSAGES)).transaction_version(
        dispatch_app_id(name, tables.MESSAGES)) is not None
    assert_lake_has_each_message_once(sq, own, [m for m in stored(cluster) if m.broker_name == name])


@pytest.mark.cluster
def test_dispatch_survives_a_broker_killed_mid_batch(sq: SparkSession, cluster: Cluster, tmp_path: Path) -> None:
    """SIGKILL a broker while the query dispatches, restart it; the query restarted from its checkpoint (what a
    supervisor does) leaves every message exactly once."""
    cluster.create_topic("lake-d4")
    send(cluster, "lake-d4", 40)
    lake, ck = tmp_path / "lake", str(tmp_path / "ck")
    query = start_dispatch(sq, cluster.namesrv.addr, lake, ck, {"processingTime": "100 milliseconds"},
                           max_messages_per_trigger=5)
    try:
        wait_until(lambda: dispatch_stats(query).rows >= 5, timeout=60, what="a dispatched batch")
        cluster.brokers["broker-b"].kill9()
        time.sleep(1.0)          # the query keeps triggering: pulls from broker-b fail or find it gone
        cluster.restart("broker-b")
    finally:
        query.stop()
    resumed = start_dispatch(sq, cluster.namesrv.addr, lake, ck, {"availableNow": True},
                             max_messages_per_trigger=None)
    assert resumed.awaitTermination(120) and resumed.exception() is None
    assert_lake_has_each_message_once(sq, lake, stored(cluster))


@pytest.mark.cluster
def test_a_stream_over_sparkmq_messages_sees_every_message_once(sq: SparkSession, cluster: Cluster,
                                                               tmp_path: Path) -> None:
    """A user's ``spark.readStream.table("sparkmq.messages")`` into a Delta sink while dispatch commits batch
    after batch: stopped halfway, the table compacted (OPTIMIZE) meanwhile, restarted from its checkpoint --
    every message of the topic reaches the sink exactly once."""
    from sparkmq.pipelines.maintenance import maintain

    cluster.create_topic("lake-s1")
    send(cluster, "lake-s1", 30)
    lake, out = tmp_path / "lake", str(tmp_path / "subscriber")
    dispatch = start_dispatch(sq, cluster.namesrv.addr, lake, str(tmp_path / "ck"),
                              {"processingTime": "200 milliseconds"}, max_messages_per_trigger=10)

    def subscribe() -> Any:
        tables.register_tables(sq, lake, [tables.MESSAGES])
        return (sq.readStream.table("sparkmq.messages").where("topic = 'lake-s1'")
                .select("broker", "queue_id", "queue_offset", "msg_id").writeStream.format("delta")
                .option("checkpointLocation", str(tmp_path / "subscriber-ck"))
                .trigger(processingTime="300 milliseconds").start(out))

    def received() -> list[tuple]:
        try:
            return [tuple(r) for r in sq.read.format("delta").load(out).collect()]
        except Exception:  # noqa: BLE001 -- the sink has not committed yet
            return []

    try:
        wait_until(lambda: dispatch_stats(dispatch).rows >= 10, 180, "a dispatched batch")
        subscriber = subscribe()
        wait_until(lambda: received(), 180, "the subscriber's first rows")
        subscriber.stop()
        maintain(sq, tables.table_path(lake, tables.MESSAGES), vacuum_retention_hours=None)   # OPTIMIZE only
        send(cluster, "lake-s1", 12, start=100)
        subscriber = subscribe()
        expected = sorted((m.broker_name, m.queue_id, m.queue_offset, m.msg_id) for m in pull_all(cluster, "lake-s1"))
        assert len(expected) == 42
        wait_until(lambda: len(received()) >= len(expected), 240, "every message at the subscriber")
        time.sleep(1.0)   # a duplicate would have its chance
        assert subscriber.exception() is None
        subscriber.stop()
    finally:
        dispatch.stop()
    assert sorted(received()) == expected


def test_dispatch_topic_selection() -> None:
    """User, retry and DLQ topics are dispatched; the broker's bookkeeping and the trace topic are not."""
    for topic in ("orders", "%RETRY%cg", "%DLQ%cg", "TBW102x"):
        assert re.fullmatch(DISPATCH_PATTERN, topic), topic
    for topic in (SCHEDULE_TOPIC, "rmq_sys_wheel_timer", "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC",
                  "TBW102", TRACE_TOPIC):
        assert not re.fullmatch(DISPATCH_PATTERN, topic), topic


def test_check_checkpoint_refuses_a_checkpoint_behind_any_of_its_tables(spark: SparkSession, tmp_path: Path) -> None:
    """The guard every job (dispatch, trace, dlq) runs before starting from a checkpoint."""
    from sparkmq.pipelines.dispatch import append_once, check_checkpoint

    lake = tmp_path / "lake"
    tables.ensure_tables(spark, lake, [tables.DEAD_LETTERS])
    empty = spark.createDataFrame([], tables.spark_schema(tables.DEAD_LETTERS))
    append_once(empty, lake, tables.DEAD_LETTERS, "dlq-a", 3)
    checkpoint = tmp_path / "ckpt"
    with pytest.raises(LakeError, match="only reaches batch -1"):  # a lost checkpoint over written tables
        check_checkpoint(str(checkpoint), lake, {tables.DEAD_LETTERS: "dlq-a"})
    (checkpoint / "offsets").mkdir(parents=True)
    for batch in range(2):
        (checkpoint / "offsets" / str(batch)).write_text("{}")
    with pytest.raises(LakeError, match="dead_letters already holds batch 3 of dlq-a"):  # behind
        check_checkpoint(str(checkpoint), lake, {tables.DEAD_LETTERS: "dlq-a"})
    check_checkpoint(str(checkpoint), lake, {tables.DEAD_LETTERS: "dlq-other"})  # another job's app id
    for batch in range(2, 5):
        (checkpoint / "offsets" / str(batch)).write_text("{}")
    check_checkpoint(str(checkpoint), lake, {tables.DEAD_LETTERS: "dlq-a"})
