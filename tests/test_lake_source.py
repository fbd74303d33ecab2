"""The ``sparkmq`` Spark source and sink against a real name server and two real brokers.

One cluster (name server + broker-a + broker-b processes) serves the whole module; every
test uses its own topics.  The shared SparkSession comes from conftest.
"""
from __future__ import annotations

import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from chispa import assert_df_equality
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from procs import ProcessHarness, ServiceProcess, broker_restart_ports, route_read_queues, wait_until
from sparkmq.pipelines.cluster_io import OptionError, PullPage, topic_path
from sparkmq.pipelines.source import (
    SOURCE_SCHEMA,
    DataLossError,
    QueueRange,
    ReadSettings,
    SourceOptions,
    admit,
    read_range,
    register,
)
from sparkmq.platform.client import (
    AdminClient,
    BrokerClient,
    ClientConfig,
    Message,
    MessageQueue,
    NameServerClient,
    Producer,
    SendResult,
    TopicRouteInfo,
)
from sparkmq.platform.common.wire import PULL_SCHEMA

pytestmark = [pytest.mark.spark, pytest.mark.timeout(180)]

BROKERS = ("broker-a", "broker-b")


# -- the cluster ---------------------------------------------------------------------------------------

class Cluster:
    """A name server and two brokers, with a producer and an admin client on them."""

    def __init__(self, harness: ProcessHarness, root: Path, namesrv: ServiceProcess,
                 brokers: dict[str, ServiceProcess]) -> None:
        self.harness = harness
        self.root = root
        self.namesrv = namesrv
        self.brokers = brokers
        self.config = ClientConfig(namesrv_addrs=namesrv.addr)
        self.producer = Producer("lake-test-pg", self.config).start()
        self.admin = AdminClient(self.config)
        self.ns = NameServerClient([namesrv.addr], 5.0)

    @property
    def brokers_option(self) -> str:
        """The source's ``brokers`` option for this cluster (no name server)."""
        return ",".join(f"{name}={p.addr}" for name, p in sorted(self.brokers.items()))

    def broker_args(self, name: str) -> list[str]:
        """Command-line arguments of broker ``name`` (its data dir survives restarts)."""
        return ["--data-dir", str(self.root / name), "--namesrv", self.namesrv.addr, "--broker-name", name,
                "--register-interval-s", "0.5"]

    def restart(self, name: str) -> ServiceProcess:
        """Start broker ``name`` again on its old port and data dir (after ``kill9``)."""
        old = self.brokers[name]
        self.brokers[name] = self.harness.start("broker", "sparkmq.api.broker_main", *self.broker_args(name),
                                                *broker_restart_ports(old.port))
        return self.brokers[name]

    def client(self, broker: str) -> BrokerClient:
        """A client of ``broker``."""
        return BrokerClient(self.brokers[broker].addr, 5.0)

    def create_topic(self, topic: str, queues: int = 2) -> None:
        """Create ``topic`` with ``queues`` queues on both brokers; wait until its route shows both."""
        self.admin.create_topic(topic, read_queue_nums=queues, write_queue_nums=queues)
        def both_brokers_listed() -> bool:
            queues_listed = route_read_queues(self.admin, topic)
            return len({q.broker_name for q in queues_listed}) == 2 and len(queues_listed) == 2 * queues

        wait_until(both_brokers_listed, what=f"route of {topic}")

    def close(self) -> None:
        self.producer.shutdown()
        self.admin.close()
        self.ns.close()



@pytest.fixture(scope="module")
def cluster(module_procs: ProcessHarness) -> Iterator[Cluster]:
    """A name server and broker-a, broker-b (real processes) for the module (tests using it are ``cluster``)."""
    ns = module_procs.start("namesrv", "sparkmq.api.namesrv_main", "--scan-interval-s", "0.5")
    c = Cluster(module_procs, module_procs.work_dir, ns, {})
    started = module_procs.start_many([("broker", "sparkmq.api.broker_main", c.broker_args(n)) for n in BROKERS])
    c.brokers.update(zip(BROKERS, started, strict=True))
    wait_until(lambda: len(c.admin.masters()) == 2, what="both brokers registered")
    yield c
    c.close()


@pytest.fixture(scope="module")
def sq(spark: SparkSession) -> SparkSession:
    """The shared session with the ``sparkmq`` format registered."""
    register(spark)
    return spark


# -- helpers -------------------------------------------------------------------------------------------

#: The columns the equality checks compare (the rest are store-side and checked separately).
COMPARED = ("topic", "broker", "queue_id", "queue_offset", "msg_id", "keys", "tags", "body", "properties")
ORDER = ("topic", "broker", "queue_id", "queue_offset")


def compared_schema() -> StructType:
    return StructType([SOURCE_SCHEMA[c] for c in COMPARED])


def send(cluster: Cluster, topic: str, n: int, *, start: int = 0) -> list[tuple[Message, SendResult]]:
    """Send ``n`` messages with keys, a tag on every other one, properties; one body above 4 KiB (compressed)."""
    out = []
    for i in range(start, start + n):
        body = (b"big-%d-" % i) * 1000 if i == start + 1 else b"body-%d" % i
        msg = Message(topic, body, tags="TagA" if i % 2 else None, keys=(f"k{i}", f"order-{i}"),
                      properties={"n": str(i), "parity": "odd" if i % 2 else "even"})
        out.append((msg, cluster.producer.send(msg)))
    return out


def expected_df(spark: SparkSession, sent: list[tuple[Message, SendResult]]) -> DataFrame:
    """What the source must return for ``sent`` (the COMPARED columns), ordered like :func:`actual`."""
    rows = sorted(((r.topic, r.broker_name, r.queue_id, r.queue_offset, r.msg_id, list(m.keys), m.tags, m.body,
                    dict(m.properties)) for m, r in sent), key=lambda row: row[:4])
    return spark.createDataFrame(rows, compared_schema())


def actual(df: DataFrame) -> DataFrame:
    """``df``'s COMPARED columns in the order of :func:`expected_df`."""
    return df.select(*COMPARED).orderBy(*ORDER)


def source(spark: SparkSession, cluster: Cluster, stream: bool = False, **options: str) -> DataFrame:
    reader = (spark.readStream if stream else spark.read).format("sparkmq").option("namesrv", cluster.namesrv.addr)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


# -- batch reads ---------------------------------------------------------------------------------------

@pytest.mark.cluster
def test_batch_read_equals_what_was_sent(sq: SparkSession, cluster: Cluster) -> None:
    """A topic on two brokers reads back exactly: bodies (a compressed one inflated), keys, tags, properties."""
    cluster.create_topic("lake-src-batch")
    sent = send(cluster, "lake-src-batch", 24)
    assert {r.broker_name for _, r in sent} == set(BROKERS)

    df = source(sq, cluster, subscribe="lake-src-batch")
    assert df.schema == SOURCE_SCHEMA
    assert_df_equality(actual(df), expected_df(sq, sent))

    # Store-side columns: present and consistent with what the send results said.
    rows = df.select("msg_id", "offset_msg_id", "store_timestamp", "born_timestamp", "store_host", "sys_flag",
                     "commitlog_offset", "store_size").collect()
    by_id = {r.msg_id: r for r in rows}
    for _, result in sent:
        row = by_id[result.msg_id]
        assert row.offset_msg_id == result.offset_msg_id
        assert row.born_timestamp <= row.store_timestamp
        assert row.store_size > 0 and row.commitlog_offset >= 0
    assert sum(r.sys_flag & 1 for r in rows) == 1   # the big body was stored compressed

    # The same through `brokers` (no name server) and with raw: bodies as stored, all properties.
    raw = (sq.read.format("sparkmq").option("brokers", cluster.brokers_option)
           .option("subscribe", "lake-src-batch").option("raw", "true").load())
    big = raw.where("sys_flag & 1 = 1").select("body", "properties").first()
    assert zlib.decompress(big.body).startswith(b"big-")
    assert {"UNIQ_KEY", "KEYS", "n"} <= set(big.properties)
    assert raw.count() == 24


@pytest.mark.cluster
def test_batch_read_honours_starting_and_ending_offsets(sq: SparkSession, cluster: Cluster) -> None:
    """JSON startingOffsets / endingOffsets cut each queue; queues left out run from earliest to latest."""
    cluster.create_topic("lake-src-range")
    sent = send(cluster, "lake-src-range", 24)
    starting = '{"lake-src-range": {"broker-a/0": 1, "broker-b/1": -2}}'
    ending = '{"lake-src-range": {"broker-a/0": 3, "broker-b/1": 2, "broker-b/0": -1}}'
    df = source(sq, cluster, subscribe="lake-src-range", startingOffsets=starting, endingOffsets=ending)

    def wanted(r: SendResult) -> bool:
        if (r.broker_name, r.queue_id) == ("broker-a", 0):
            return 1 <= r.queue_offset < 3
        if (r.broker_name, r.queue_id) == ("broker-b", 1):
            return r.queue_offset < 2
        return True

    expected = [(m, r) for m, r in sent if wanted(r)]
    assert 0 < len(expected) < len(sent)
    assert_df_equality(actual(df), expected_df(sq, expected))

    # startingTimestamp: only what was stored at or after it.
    later = send(cluster, "lake-src-range", 6, start=100)
    since = min(r.store_timestamp for _, r in later)
    df_ts = source(sq, cluster, subscribe="lake-src-range", startingTimestamp=str(since))
    assert_df_equality(actual(df_ts), expected_df(sq, later))

    # tags: the broker filters; only TagA messages come back.
    df_tags = source(sq, cluster, subscribe="lake-src-range", tags="TagA")
    assert_df_equality(actual(df_tags), expected_df(sq, [(m, r) for m, r in sent + later if m.tags == "TagA"]))

    # assign: only the named queues.
    df_assign = source(sq, cluster, assign='{"lake-src-range": ["broker-b/0"]}')
    assert_df_equality(actual(df_assign),
                       expected_df(sq, [(m, r) for m, r in sent + later
                                        if (r.broker_name, r.queue_id) == ("broker-b", 0)]))


# -- streaming -----------------------------------------------------------------------------------------

class Collector:
    """A foreachBatch sink that keeps every batch's message ids and sizes."""

    def __init__(self) -> None:
        self.batches: list[tuple[int, list[str]]] = []

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        self.batches.append((batch_id, [r.msg_id for r in df.select("msg_id").collect()]))

    @property
    def ids(self) -> list[str]:
        return [i for _, ids in self.batches for i in ids]


def run_available_now(sq: SparkSession, cluster: Cluster, checkpoint: Path, **options: str) -> Collector:
    collector = Collector()
    query = (source(sq, cluster, stream=True, **options).writeStream.foreachBatch(collector)
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    assert query.awaitTermination(120)
    assert query.exception() is None
    return collector


def group_lag(cluster: Cluster, group: str) -> int:
    return sum(cluster.client(b).group_lag(group)["total_lag"] for b in BROKERS)


@pytest.mark.cluster
def test_stream_exactly_once_per_checkpoint_with_limit_restart_and_group_lag(sq: SparkSession, cluster: Cluster,
                                                                            tmp_path: Path) -> None:
    """availableNow runs: batches <= maxMessagesPerTrigger, every message once, a restart reads only new ones,
    and the group's lag on the brokers reaches zero."""
    cluster.create_topic("lake-src-stream")
    first = send(cluster, "lake-src-stream", 30)
    opts = {"subscribe": "lake-src-stream", "startingOffsets": "earliest", "maxMessagesPerTrigger": "8",
            "group": "lake-spark-sub"}
    ck = tmp_path / "ck"

    run1 = run_available_now(sq, cluster, ck, **opts)
    assert sorted(run1.ids) == sorted(r.msg_id for _, r in first)
    non_empty = [ids for _, ids in run1.batches if ids]
    assert len(non_empty) >= 4 and all(len(ids) <= 8 for ids in non_empty)
    assert group_lag(cluster, "lake-spark-sub") == 0

    second = send(cluster, "lake-src-stream", 10, start=30)
    assert group_lag(cluster, "lake-spark-sub") == 10
    run2 = run_available_now(sq, cluster, ck, **opts)
    assert sorted(run2.ids) == sorted(r.msg_id for _, r in second)   # only the new ones, each once
    assert min(b for b, _ in run2.batches) > max(b for b, _ in run1.batches)
    assert group_lag(cluster, "lake-spark-sub") == 0

    # A second checkpoint is a second subscriber: it gets everything again, once.
    other = run_available_now(sq, cluster, tmp_path / "ck2", **{**opts, "group": "lake-spark-sub2"})
    assert sorted(other.ids) == sorted(r.msg_id for _, r in first + second)


@pytest.mark.cluster
def test_stream_processing_time_picks_up_new_queues_and_topics(sq: SparkSession, cluster: Cluster,
                                                               tmp_path: Path) -> None:
    """A running subscribePattern query sees messages sent later, a topic created later and queues added later."""
    cluster.create_topic("lake-pat-a", queues=1)
    before = send(cluster, "lake-pat-a", 4)
    query = (source(sq, cluster, stream=True, subscribePattern="lake-pat-.*", startingOffsets="latest")
             .writeStream.format("memory").queryName("lake_pat").option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(processingTime="200 milliseconds").start())
    try:
        wait_until(lambda: query.lastProgress is not None, what="the first trigger")
        later = send(cluster, "lake-pat-a", 4, start=10)
        cluster.create_topic("lake-pat-b", queues=1)
        new_topic = send(cluster, "lake-pat-b", 4, start=20)
        cluster.create_topic("lake-pat-a", queues=3)            # more queues on both brokers
        # The producer refreshes routes every 30 s; send to the new queues directly.
        grown = [cluster.client(b).send("lake-pat-a", {"body": f"grown-{b}-{q}", "queue_id": q})["msg_id"]
                 for b in BROKERS for q in (1, 2)]
        wanted = sorted([r.msg_id for _, r in later + new_topic] + grown)
        wait_until(lambda: sq.table("lake_pat").count() >= len(wanted), timeout=30, what="every new message")
        got = sorted(r.msg_id for r in sq.table("lake_pat").select("msg_id").collect())
        assert got == wanted                       # "latest": nothing from before the start, nothing twice
        assert not set(got) & {r.msg_id for _, r in before}
    finally:
        query.stop()


# -- the sink ------------------------------------------------------------------------------------------

def pull_all(cluster: Cluster, topic: str) -> list[Any]:
    """Every message of ``topic`` through plain JSON pulls on every queue of its route."""
    # Percent-encoded by hand: the client puts %DLQ% / %RETRY% names into paths as they are.
    route = TopicRouteInfo.from_dict(topic, cluster.ns.request("GET", f"/routes/{topic_path(topic)}"))
    out = []
    clients = {name: cluster.client(name) for name in {q.broker_name for q in route.read_queues}}
    try:
        for q in route.read_queues:
            offset = 0
            while True:
                result = clients[q.broker_name].pull(topic, q.queue_id, offset, 32)  # the client quotes it
                out.extend(result.messages)
                if result.status != "FOUND":
                    break
                offset = result.next_offset
    finally:
        for client in clients.values():
            client.close()
    return out


@pytest.mark.cluster
def test_sink_writes_rows_as_messages(sq: SparkSession, cluster: Cluster) -> None:
    """N rows -> N messages a plain pull reads back, with keys (array or string), tags and properties."""
    cluster.create_topic("lake-sink")
    n = 25
    rows = [("lake-sink", f"row-{i}".encode(), [f"k{i}", "sink"], "T" if i % 2 else None, {"i": str(i)})
            for i in range(n)]
    df = sq.createDataFrame(rows, "topic string, body binary, keys array<string>, tags string, "
                                  "properties map<string,string>").repartition(3)
    df.write.format("sparkmq").mode("append").option("namesrv", cluster.namesrv.addr).option("batchSize", "4").save()

    got = pull_all(cluster, "lake-sink")
    assert sorted((m.body, m.keys, m.tags, m.user_properties) for m in got) == \
        sorted((b, tuple(k), t, p) for _, b, k, t, p in rows)
    assert {m.broker_name for m in got} == set(BROKERS)

    # String bodies and space-separated keys, topic from the option, no name server (brokers).
    text = sq.createDataFrame([(f"text-{i}", f"a{i} b{i}") for i in range(6)], "body string, keys string")
    (text.write.format("sparkmq").mode("append").option("brokers", cluster.brokers_option)
     .option("topic", "lake-sink").save())
    texts = [m for m in pull_all(cluster, "lake-sink") if m.body.startswith(b"text-")]
    assert sorted((m.body, m.keys) for m in texts) == sorted((f"text-{i}".encode(), (f"a{i}", f"b{i}"))
                                                             for i in range(6))


@pytest.mark.cluster
def test_stream_sink_copies_a_topic(sq: SparkSession, cluster: Cluster, tmp_path: Path) -> None:
    """readStream sparkmq -> writeStream sparkmq: every message copied to another topic."""
    cluster.create_topic("lake-copy-src")
    sent = send(cluster, "lake-copy-src", 12)
    query = (source(sq, cluster, stream=True, subscribe="lake-copy-src", startingOffsets="earliest")
             .select("body", "keys", "tags", "properties")
             .writeStream.format("sparkmq").option("namesrv", cluster.namesrv.addr).option("topic", "lake-copy-dst")
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    assert query.awaitTermination(120)
    got = pull_all(cluster, "lake-copy-dst")
    assert sorted((m.body, m.keys, m.tags, m.user_properties) for m in got) == \
        sorted((m.body, tuple(m.keys), m.tags, m.properties) for m, _ in sent)


@pytest.mark.cluster
def test_sink_failure_raises_with_the_stable_code(sq: SparkSession, cluster: Cluster) -> None:
    """A row the producer refuses fails the write with the client's code; bad columns fail before any send."""
    df = sq.createDataFrame([("bad topic!", "x")], "topic string, body string")
    with pytest.raises(Exception, match="TOPIC_ILLEGAL"):
        df.write.format("sparkmq").mode("append").option("namesrv", cluster.namesrv.addr).save()
    empty_body = sq.createDataFrame([("lake-sink", "")], "topic string, body string")
    with pytest.raises(Exception, match="MESSAGE_ILLEGAL"):
        empty_body.write.format("sparkmq").mode("append").option("namesrv", cluster.namesrv.addr).save()
    odd = sq.createDataFrame([("lake-sink", "x", 1)], "topic string, body string, partition int")
    with pytest.raises(Exception, match="column 'partition' is not one the sink writes"):
        odd.write.format("sparkmq").mode("append").option("namesrv", cluster.namesrv.addr).save()


# -- options -------------------------------------------------------------------------------------------

NS = {"namesrv": "127.0.0.1:9"}


@pytest.mark.parametrize(("options", "streaming", "named"), [
    ({**NS, "subscribe": "t", "startingOffset": "earliest"}, False, "startingOffset"),
    ({**NS, "subscribe": "t", "startingOffsets": '{"t": {"broker-a/0": 1'}, False, "startingOffsets"),
    ({**NS, "subscribe": "t", "startingOffsets": '{"t": {"broker-a": 1}}'}, False, "startingOffsets"),
    ({**NS, "subscribe": "t", "endingOffsets": '{"t": {"broker-a/0": -2}}'}, False, "endingOffsets"),
    ({**NS, "subscribe": "t", "startingOffsets": '{"u": {"broker-a/0": 0}}'}, False, "startingOffsets"),
    ({**NS, "subscribe": "t", "assign": '{"t": ["broker-a/0"]}'}, False, "assign"),
    ({**NS}, False, "subscribe"),
    ({**NS, "subscribePattern": "(", }, False, "subscribePattern"),
    ({"subscribe": "t"}, False, "namesrv"),
    ({**NS, "brokers": "a=h:1", "subscribe": "t"}, False, "namesrv"),
    ({"brokers": "broker-a", "subscribe": "t"}, False, "brokers"),
    ({**NS, "subscribe": "t", "maxMessagesPerTrigger": "0"}, True, "maxMessagesPerTrigger"),
    ({**NS, "subscribe": "t", "maxMessagesPerTrigger": "10"}, False, "maxMessagesPerTrigger"),
    ({**NS, "subscribe": "t", "endingOffsets": "latest"}, True, "endingOffsets"),
    ({**NS, "subscribe": "t", "failOnDataLoss": "maybe"}, True, "failOnDataLoss"),
    ({**NS, "subscribe": "t", "tags": "A || "}, True, "tags"),
    ({**NS, "subscribe": "bad topic"}, True, "subscribe"),
    ({**NS, "subscribe": "t", "group": "bad group!"}, True, "group"),
])
def test_bad_options_name_the_option(options: dict[str, str], streaming: bool, named: str) -> None:
    """Every bad option is refused with INVALID_ARGUMENT and the option's name."""
    with pytest.raises(OptionError, match=f"option '{named}'") as info:
        SourceOptions.parse(options, streaming=streaming)
    assert str(info.value).startswith("INVALID_ARGUMENT: ")


def test_bad_options_surface_through_spark(sq: SparkSession) -> None:
    """Through Spark the error still names the option (batch and streaming)."""
    with pytest.raises(Exception, match="option 'subscribePattern'"):
        (sq.read.format("sparkmq").option("namesrv", "127.0.0.1:9").option("subscribe", "t")
         .option("subscribePattern", "t.*").load().collect())
    with pytest.raises(Exception, match="option 'startingOffsets'"):
        (sq.read.format("sparkmq").option("namesrv", "127.0.0.1:9").option("subscribe", "t")
         .option("startingOffsets", "{not json").load().collect())
    with pytest.raises(Exception, match="option 'colour'"):
        q = (sq.readStream.format("sparkmq").option("namesrv", "127.0.0.1:9").option("subscribe", "t")
             .option("colour", "blue").load().writeStream.format("memory").queryName("lake_bad").start())
        try:
            q.awaitTermination(30)
        finally:
            q.stop()


def test_admission_control_shares_the_limit_by_backlog() -> None:
    """admit(): never more than the limit, proportional to backlog, all when it fits, deterministic."""
    a, b, c = (MessageQueue("t", n, 0) for n in ("a", "b", "c"))
    start = {a: 0, b: 5, c: 7}
    latest = {a: 100, b: 15, c: 7}
    end = admit(start, latest, 11)
    assert sum(end[q] - start[q] for q in start) == 11
    assert end[a] - start[a] == 10 and end[b] - start[b] == 1 and end[c] == 7
    assert admit(start, latest, 1000) == latest
    assert admit(start, latest, 11) == end
    one = admit(start, latest, 1)
    assert sum(one[q] - start[q] for q in start) == 1


def test_patterns_leave_out_reserved_topics_unless_asked() -> None:
    """subscribePattern skips %RETRY%, %DLQ%, RMQ_SYS_* and TBW102 unless includeSystemTopics is true."""
    plain = SourceOptions.parse({**NS, "subscribePattern": ".*"}, streaming=True)
    every = SourceOptions.parse({**NS, "subscribePattern": ".*", "includeSystemTopics": "true"}, streaming=True)
    for topic in ("%RETRY%cg", "%DLQ%cg", "RMQ_SYS_TRACE_TOPIC", "SCHEDULE_TOPIC_XXXX", "TBW102"):
        assert not plain.wants_topic(topic) and every.wants_topic(topic)
    assert plain.wants_topic("orders")
    assert not SourceOptions.parse({**NS, "subscribePattern": "ord"}, streaming=True).wants_topic("orders")


def _page(status: str, next_offset: int, min_offset: int, max_offset: int, offsets: range = range(0)) -> PullPage:
    rows = [{"topic": "t", "broker_name": "b", "queue_id": 0, "queue_offset": o, "msg_id": f"m{o}",
             "offset_msg_id": "x", "commitlog_offset": o, "store_size": 10, "body": b"b", "tags": None, "keys": None,
             "properties": [], "born_timestamp": 1, "born_host": "h", "store_timestamp": 2, "store_host": "h",
             "reconsume_times": 0, "sys_flag": 0} for o in offsets]
    return PullPage(status, next_offset, min_offset, max_offset, pa.Table.from_pylist(rows, schema=PULL_SCHEMA))


def test_fail_on_data_loss(monkeypatch: pytest.MonkeyPatch) -> None:
    """A range retention deleted: a clear error by default, skipped to the min offset with failOnDataLoss=false."""
    import sparkmq.pipelines.source as source_module

    def fake_pull(addr: str, topic: str, queue_id: int, offset: int, max_messages: int, **_: Any) -> PullPage:
        if offset < 5:
            return _page("OFFSET_TOO_SMALL", 5, 5, 8)
        return _page("FOUND", 8, 5, 8, range(offset, 8))

    monkeypatch.setattr(source_module, "pull_arrow", fake_pull)
    part = QueueRange("t", "b", 0, "h:1", 2, 8)
    with pytest.raises(DataLossError, match=r"t b/0: offsets \[2, 5\) are gone.*failOnDataLoss=false"):
        list(read_range(part, ReadSettings()))
    batches = list(read_range(part, ReadSettings(fail_on_data_loss=False)))
    assert [o for b in batches for o in b.column("queue_offset").to_pylist()] == [5, 6, 7]

    monkeypatch.setattr(source_module, "pull_arrow", lambda *a, **k: _page("NO_NEW_MSG", 4, 0, 4))
    with pytest.raises(DataLossError, match="ends at offset 4, but the batch planned to read up to 8"):
        list(read_range(QueueRange("t", "b", 0, "h:1", 4, 8), ReadSettings()))
