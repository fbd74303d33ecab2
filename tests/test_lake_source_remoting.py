"""The ``sparkmq`` source pulls over remoting where a broker serves it, over HTTP where it does not.

One cluster serves the module: a name server, ``broker-r`` (remoting on, the default) and
``broker-h`` (``--remoting-port -1``: an HTTP-only broker, as an older one would be).  Every
test uses its own topic on both brokers.
"""
from __future__ import annotations

import socket
from collections.abc import Iterator

import httpx
import pyarrow as pa
import pytest
from chispa import assert_df_equality
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from procs import ProcessHarness, ServiceProcess, route_read_queues, wait_until
from sparkmq.pipelines import cluster_io
from sparkmq.pipelines.source import (
    SOURCE_SCHEMA,
    QueueRange,
    ReadSettings,
    SourceOptions,
    SparkMQBatchReader,
    read_range,
    register,
    to_source_batch,
)
from sparkmq.platform.client import AdminClient, ClientConfig, Message, NameServerClient, Producer, SendResult
from sparkmq.platform.common.errors import ErrorCode, SparkMQError
from sparkmq.platform.common.record_columns import decode_records, packed_records_array, records_array

pytestmark = [pytest.mark.spark, pytest.mark.timeout(180)]

REMOTING, HTTP_ONLY = "broker-r", "broker-h"
COMPARED = ("topic", "broker", "queue_id", "queue_offset", "msg_id", "keys", "tags", "body", "properties")


class Cluster:
    """A name server, a broker serving remoting and one serving HTTP only, with a producer."""

    def __init__(self, namesrv: ServiceProcess, brokers: dict[str, ServiceProcess]) -> None:
        self.namesrv = namesrv
        self.brokers = brokers
        self.config = ClientConfig(namesrv_addrs=namesrv.addr)
        self.producer = Producer("lake-remoting-pg", self.config).start()
        self.admin = AdminClient(self.config)

    def create_topic(self, topic: str, queues: int = 2) -> None:
        """``topic`` with ``queues`` queues on both brokers, once its route shows both."""
        self.admin.create_topic(topic, read_queue_nums=queues, write_queue_nums=queues)
        wait_until(lambda: len(route_read_queues(self.admin, topic)) == 2 * queues, what=f"route of {topic}")

    def remoting_endpoint(self, topic: str) -> str | None:
        """The remoting endpoint the name server's route of ``topic`` names for broker-r's master."""
        ns = NameServerClient([self.namesrv.addr], 5.0)
        try:
            route = ns.request("GET", f"/routes/{topic}")
        finally:
            ns.close()
        data = next(b for b in route["broker_datas"] if b["broker_name"] == REMOTING)
        return (data.get("remoting_addrs") or {}).get("0")

    def close(self) -> None:
        self.producer.shutdown()
        self.admin.close()


@pytest.fixture(scope="module")
def cluster(module_procs: ProcessHarness) -> Iterator[Cluster]:
    """The module's name server and its two brokers (real processes)."""
    ns = module_procs.start("namesrv", "sparkmq.api.namesrv_main", "--scan-interval-s", "0.5")

    def args(name: str, *extra: str) -> list[str]:
        return ["--data-dir", str(module_procs.work_dir / name), "--namesrv", ns.addr, "--broker-name", name,
                "--register-interval-s", "0.5", *extra]

    started = module_procs.start_many([("broker", "sparkmq.api.broker_main", args(REMOTING)),
                                       ("broker", "sparkmq.api.broker_main", args(HTTP_ONLY, "--remoting-port", "-1"))])
    c = Cluster(ns, dict(zip((REMOTING, HTTP_ONLY), started, strict=True)))
    wait_until(lambda: len(c.admin.masters()) == 2, what="both brokers registered")
    yield c
    c.close()


@pytest.fixture(scope="module")
def sq(spark: SparkSession) -> SparkSession:
    register(spark)
    return spark


def send(cluster: Cluster, topic: str, n: int) -> list[tuple[Message, SendResult]]:
    """``n`` messages with keys and properties, a tag on every other one, one body above 4 KiB (stored compressed)."""
    out = []
    for i in range(n):
        body = (b"big-%d-" % i) * 1000 if i == 1 else b"body-%d" % i
        msg = Message(topic, body, tags="TagA" if i % 2 else None, keys=(f"k{i}", f"order-{i}"),
                      properties={"n": str(i)})
        out.append((msg, cluster.producer.send(msg)))
    return out


def expected_df(spark: SparkSession, sent: list[tuple[Message, SendResult]]) -> DataFrame:
    rows = sorted(((r.topic, r.broker_name, r.queue_id, r.queue_offset, r.msg_id, list(m.keys), m.tags, m.body,
                    dict(m.properties)) for m, r in sent), key=lambda row: row[:4])
    return spark.createDataFrame(rows, StructType([SOURCE_SCHEMA[c] for c in COMPARED]))


def remoting_stats(broker: ServiceProcess) -> dict[str, int]:
    """The broker's remoting counters (``/health``): open connections, requests served."""
    return httpx.get(f"http://{broker.addr}/health", timeout=5).json()["remoting"]


@pytest.mark.cluster
def test_source_reads_a_remoting_broker_over_remoting_and_an_http_only_one_over_http(sq: SparkSession,
                                                                                     cluster: Cluster) -> None:
    """Partitions of broker-r carry its remoting endpoint and its pulls arrive on it; broker-h is read over HTTP."""
    topic = "lake-remoting-mixed"
    cluster.create_topic(topic)
    sent = send(cluster, topic, 40)
    assert {r.broker_name for _, r in sent} == {REMOTING, HTTP_ONLY}
    endpoint = cluster.remoting_endpoint(topic)
    assert endpoint == cluster.brokers[REMOTING].addr  # remoting on the broker's one port
    served_before = remoting_stats(cluster.brokers[REMOTING])["requests"]

    # The plan: the endpoint the route names for broker-r, none for the HTTP-only broker.
    reader = SparkMQBatchReader(SourceOptions.parse({"namesrv": cluster.namesrv.addr, "subscribe": topic},
                                                    streaming=False))
    parts = reader.partitions()
    assert {(p.broker, p.remoting_addr) for p in parts} == {(REMOTING, endpoint), (HTTP_ONLY, None)}

    df = sq.read.format("sparkmq").option("namesrv", cluster.namesrv.addr).option("subscribe", topic).load()
    assert df.schema == SOURCE_SCHEMA
    assert_df_equality(df.select(*COMPARED).orderBy("topic", "broker", "queue_id", "queue_offset"),
                       expected_df(sq, sent))
    rows = {r.msg_id: r for r in df.select("msg_id", "offset_msg_id", "sys_flag").collect()}
    assert {r.msg_id: r.offset_msg_id for _, r in sent} == {m: r.offset_msg_id for m, r in rows.items()}
    assert sum(r.sys_flag & 1 for r in rows.values()) == 1

    # The pulls came over remoting, and the Spark workers keep their remoting connection to broker-r open between
    # tasks.
    stats = remoting_stats(cluster.brokers[REMOTING])
    assert stats["requests"] > served_before and stats["connections"] >= 1

    # A tag filter over remoting: the broker matches tag hashes, the reader the tag strings.
    tagged = (sq.read.format("sparkmq").option("namesrv", cluster.namesrv.addr).option("subscribe", topic)
              .option("tags", "TagA").load())
    assert sorted(r.msg_id for r in tagged.select("msg_id").collect()) == \
        sorted(r.msg_id for m, r in sent if m.tags == "TagA")


@pytest.mark.cluster
def test_remoting_and_http_pulls_give_the_same_rows(cluster: Cluster) -> None:
    """One range pulled both ways yields identical source batches (unfiltered and tag-filtered)."""
    topic = "lake-remoting-parity"
    cluster.create_topic(topic, queues=1)
    send(cluster, topic, 30)
    endpoint = cluster.remoting_endpoint(topic)
    assert endpoint is not None
    addr = cluster.brokers[REMOTING].addr
    for tags in ("*", "TagA"):
        over_remoting = cluster_io.pull_remoting(endpoint, REMOTING, topic, 0, 0, 1024, tags=tags)
        over_http = cluster_io.pull_arrow(addr, topic, 0, 0, 1024, tags=tags, broker_name=REMOTING)
        assert over_remoting.status == over_http.status == "FOUND"
        assert over_remoting.next_offset == over_http.next_offset
        assert (over_remoting.min_offset, over_remoting.max_offset) == (over_http.min_offset, over_http.max_offset)
        assert over_remoting.table.num_rows > 0
        assert to_source_batch(over_remoting.table).equals(to_source_batch(over_http.table))

    # A range read page by page (each next pull sent ahead over remoting) gives what HTTP gives.
    queue_end = over_http.max_offset
    for start, end, page_size in ((0, queue_end, 4), (3, queue_end - 2, 5), (1, 2, 16384)):
        def read(remoting: str | None, start: int = start, end: int = end, size: int = page_size) -> pa.Table:
            part = QueueRange(topic, REMOTING, 0, addr, start, end, remoting)
            return pa.Table.from_batches(list(read_range(part, ReadSettings(pull_batch_size=size))))
        by_remoting = read(endpoint)
        assert by_remoting.column("queue_offset").to_pylist() == list(range(start, end))
        assert by_remoting.equals(read(None))

    # Past the end: no rows, the status and offsets as HTTP says them.
    end = over_http.max_offset
    page = cluster_io.pull_remoting(endpoint, REMOTING, topic, 0, end, 16384)
    assert (page.status, page.next_offset, page.table.num_rows) == ("NO_NEW_MSG", end, 0)
    with pytest.raises(SparkMQError) as raised:
        cluster_io.pull_remoting(endpoint, REMOTING, "lake-remoting-nowhere", 0, 0, 10)
    assert raised.value.code is ErrorCode.TOPIC_NOT_EXIST


@pytest.mark.cluster
def test_an_unreachable_remoting_endpoint_falls_back_to_http(cluster: Cluster,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A planned endpoint that refuses connections (its broker restarted without remoting): read over HTTP."""
    topic = "lake-remoting-fallback"
    cluster.create_topic(topic, queues=1)
    sent = [r for _, r in send(cluster, topic, 20) if r.broker_name == REMOTING]
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    monkeypatch.setattr(cluster_io, "_remoting_down", {})
    part = QueueRange(topic, REMOTING, 0, cluster.brokers[REMOTING].addr, 0, len(sent), dead)
    batches = list(read_range(part, ReadSettings()))
    assert sorted(o for b in batches for o in b.column("queue_offset").to_pylist()) == list(range(len(sent)))
    assert dead in cluster_io._remoting_down


@pytest.mark.parametrize("magic_in_bodies", [False, True])
def test_packed_records_split_like_separate_records(magic_in_bodies: bool) -> None:
    """A packed body splits into the same binary array as the records one by one; bad sizes are STORE_CORRUPT.

    Bodies that hold a record's magic number cannot fool the bulk split: it proves its cuts
    against the records' sizes and walks them one by one when it cannot.
    """
    from sparkmq.platform.common.codec import pack_host
    from sparkmq.storage_native.layout import RECORD_MAGIC, encode_record

    magic = RECORD_MAGIC.to_bytes(4, "little") if magic_in_bodies else b""
    records = [encode_record(topic="t", queue_id=0, flag=0, queue_offset=i, commitlog_offset=100 * i, sys_flag=0,
                             born_timestamp=i, born_host=pack_host("10.0.0.1:5"), store_timestamp=i,
                             store_host=pack_host("10.0.0.2:6"), reconsume_times=0, prepared_offset=0, tag_hash=0,
                             body=b"x" * i + magic * (i % 3), properties=b"KEYS\x01k\x02UNIQ_KEY\x01U%d\x02" % i)
               for i in range(1, 40)]
    packed = b"".join(records)
    split = packed_records_array(memoryview(packed), len(records))
    assert split.equals(records_array(records))
    assert decode_records(split, "b").equals(decode_records(records_array(records), "b"))
    assert len(packed_records_array(b"")) == 0
    for bad, count in ((packed[:-1], None), (packed + b"\0" * 4, None), (packed, len(records) + 1),
                       (packed[len(records[0]):] + records[0][:-1], None)):
        with pytest.raises(SparkMQError) as raised:
            packed_records_array(bad, count)
        assert raised.value.code is ErrorCode.STORE_CORRUPT
