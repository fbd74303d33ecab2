"""RocketMQ's official remoting clients (rocketmq-client 5.5.0) and mqadmin against a sparkmq cluster, unchanged.

The scenarios are those test_java_harness.py proves against Apache RocketMQ 5.5.0 (shared in java_scenarios.py),
here against 2 name servers and 2 brokers (real processes on free ports of 127.0.0.1, one cluster for the module),
plus what only a cluster shows: queues on two brokers, a broker killed under a running consumer, and messages
crossing between the Java clients and sparkmq's own Python client and HTTP.

Without Java or the client jars the module skips, except under CI=true, where it fails.
"""
from __future__ import annotations

import base64
import json
import re
import shutil
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import java_scenarios as sc
import pytest

from procs import ProcessHarness, ServiceProcess, broker_restart_ports, wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(300)]

INTERVAL_S = 0.5
CLUSTER = "JavaCluster"
BROKERS = ("broker-a", "broker-b")


@dataclass
class SparkCluster:
    """2 name servers and 2 brokers of one cluster; ``namesrv`` and ``work`` make it a java_scenarios target."""

    procs: ProcessHarness
    root: Path
    namesrvs: list[ServiceProcess]
    brokers: dict[str, ServiceProcess] = field(default_factory=dict)
    cluster: str = CLUSTER

    @property
    def namesrv(self) -> str:
        """The name servers as a RocketMQ client's ``namesrvAddr``."""
        return ";".join(ns.addr for ns in self.namesrvs)

    @property
    def work(self) -> Path:
        """Where the Java clients' logs go."""
        return self.root / "clients"

    def broker_args(self, name: str) -> list[str]:
        """A broker's flags: sub-second registration, 1 s delay levels, quick check-backs.  Clients expire as in
        production (120 s): a Java client heartbeats every 30 s."""
        return ["--data-dir", str(self.root / name), "--broker-name", name, "--cluster", self.cluster,
                "--namesrv", self.namesrv, "--register-interval-s", str(INTERVAL_S),
                "--offset-persist-interval-s", str(INTERVAL_S),
                "--no-trace", "--message-delay-level", " ".join(["1s"] * 18),
                "--transaction-check-first-s", "3", "--transaction-check-interval-s", "1"]

    def start_broker(self, name: str, *extra: str) -> ServiceProcess:
        """Start (or restart) broker ``name``."""
        broker = self.procs.start("broker", "sparkmq.api.broker_main", *self.broker_args(name), *extra)
        self.brokers[name] = broker
        return broker

    def live_brokers(self) -> set[str]:
        """The broker addresses every name server holds live."""
        live = None
        for ns in self.namesrvs:
            mine = set(httpx.get(f"{ns.url}/cluster", timeout=5).json()["live_brokers"])
            live = mine if live is None else live & mine
        return live or set()

    def admin(self) -> Any:
        """sparkmq's AdminClient on this cluster (close it)."""
        from procs import fast_client_config
        from sparkmq.platform.client.admin import AdminClient

        return AdminClient(fast_client_config(self.namesrv, self.root / "offsets"))

    def create_topic(self, topic: str, queues: int = 4) -> None:
        """``topic`` with ``queues`` queues on each broker, routed by every name server."""
        admin = self.admin()
        try:
            admin.create_topic(topic, read_queue_nums=queues, write_queue_nums=queues, cluster=self.cluster)
        finally:
            admin.close()
        for ns in self.namesrvs:
            wait_until(lambda ns=ns: _routed_queues(ns, topic) == queues * len(self.brokers), 20,
                       f"the route of {topic}")


def _routed_queues(ns: ServiceProcess, topic: str) -> int:
    answer = httpx.get(f"{ns.url}/routes/{topic}", timeout=5)
    return sum(q["read_queue_nums"] for q in answer.json()["queue_datas"]) if answer.status_code == 200 else 0


@pytest.fixture(scope="module")
def spark_cluster(module_procs: ProcessHarness) -> Iterator[SparkCluster]:
    """The module's cluster; the Java drivers compiled first (the JDK and client jars are required)."""
    sc.need("java and javac", bool(shutil.which("java") and shutil.which("javac")), "install a JDK 17+")
    from java_clients import DRIVERS

    from sparkmq.platform.common import jars

    try:
        DRIVERS.classes_dir()
    except jars.MissingJarsError as exc:
        sc.need("the rocketmq-client jars", False, str(exc))
    namesrvs = module_procs.start_many([("namesrv", "sparkmq.api.namesrv_main",
                                         ["--scan-interval-s", "0.5", "--broker-expiry-s", "4"])] * 2)
    c = SparkCluster(module_procs, module_procs.work_dir, namesrvs)
    specs = [("broker", "sparkmq.api.broker_main", c.broker_args(name)) for name in BROKERS]
    for name, broker in zip(BROKERS, module_procs.start_many(specs), strict=True):
        c.brokers[name] = broker
    want = {b.addr for b in c.brokers.values()}
    wait_until(lambda: c.live_brokers() >= want, 30, "both brokers registered with both name servers")
    yield c


# -- 1. DefaultMQProducer ---------------------------------------------------------------------------------------------
def test_every_send_is_read_back_the_same(spark_cluster: SparkCluster) -> None:
    """Sync, async, one-way, batch, ordered and delayed sends over two brokers: every id is read back with its
    tags, keys, properties, body, offsetMsgId, broker, queue and offset."""
    spark_cluster.create_topic("JavaSends")
    sent = sc.every_send_is_accounted_for(spark_cluster, "JavaSends")
    assert {e["brokerName"] for e in sent if "brokerName" in e} == set(BROKERS)  # both brokers took sends


# -- 2. TransactionMQProducer -----------------------------------------------------------------------------------------
def test_transactions_commit_rollback_and_check_back(spark_cluster: SparkCluster) -> None:
    """commit and rollback are final; UNKNOW is resolved by a check-back (UNKNOW once, then COMMIT)."""
    spark_cluster.create_topic("JavaTx")
    sc.transactions_commit_rollback_and_check_back(spark_cluster, "JavaTx", "JavaTxProducer")


# -- 4. DefaultLitePullConsumer ---------------------------------------------------------------------------------------
def test_lite_pull_assign_and_seek(spark_cluster: SparkCluster) -> None:
    """Assigned queues with a seek: the consumer reads from the offset it was sent to, on both brokers."""
    spark_cluster.create_topic("JavaLiteSeek", queues=1)
    sent = sc.run(spark_cluster, "produce", "--topic", "JavaLiteSeek", "--count", "12").events_of("sent")
    per_queue = {(e["brokerName"], e["queueId"]): 0 for e in sent}
    for e in sent:
        per_queue[(e["brokerName"], e["queueId"])] += 1
    assert len(per_queue) == 2, per_queue
    want = {e["msgId"] for e in sent if e["queueOffset"] >= 2}
    result = sc.run(spark_cluster, "litepull", "--topic", "JavaLiteSeek", "--group", "JavaLiteSeekGroup",
                    "--assign", "all", "--seek", "0:2", "--count", str(len(want)), "--idle-ms", "5000",
                    "--duration-s", "60")
    assert result.returncode == 0, result.errors
    got = result.events_of("received")
    assert sorted(e["msgId"] for e in got) == sorted(want)


def test_lite_pull_subscribe_and_commit(spark_cluster: SparkCluster) -> None:
    """A subscribed lite pull consumer commits after 5 of 10; the next member of its group reads the other 5."""
    spark_cluster.create_topic("JavaLite")
    sc.lite_pull_commit_is_where_the_next_one_starts(spark_cluster, "JavaLite", "JavaLiteGroup")


# -- 7. Cross-door equality -------------------------------------------------------------------------------------------
def _stored_over_http(cluster: SparkCluster, broker: str, topic: str, queue_id: int, offset: int) -> dict[str, Any]:
    answer = httpx.get(f"{cluster.brokers[broker].url}/topics/{topic}/queues/{queue_id}/messages",
                       params={"offset": offset, "max": 1}, timeout=10).json()
    [m] = answer["messages"]
    return m  # type: ignore[no-any-return]


def test_a_java_sent_message_reads_the_same_in_python_and_http(spark_cluster: SparkCluster) -> None:
    """A message the Java producer sent, read by sparkmq's Python pull consumer and over HTTP: the same body,
    tags, keys, user properties, ids, queue and timestamps as the Java consumer reports."""
    from procs import fast_client_config
    from sparkmq.platform.client.pull_consumer import PullConsumer
    from sparkmq.platform.common.message import MessageQueue

    topic = "JavaCrossIn"
    spark_cluster.create_topic(topic, queues=1)
    sent = sc.run(spark_cluster, "produce", "--topic", topic, "--count", "4", "--tags", "TagX",
                  "--keys-prefix", "cross-", "--prop", "color=green", "--body", "cross-{i}").events_of("sent")
    java = {e["msgId"]: e for e in sc.drain(spark_cluster, topic, 4)}
    consumer = PullConsumer("JavaCrossInPy", fast_client_config(spark_cluster.namesrv, spark_cluster.root / "py"),
                            consume_from_where="CONSUME_FROM_FIRST_OFFSET", auto_commit=False)
    consumer.assign([MessageQueue(topic, name, 0) for name in BROKERS])
    consumer.start()
    try:
        got: dict[str, Any] = {}
        deadline = time.monotonic() + 30
        while len(got) < 4 and time.monotonic() < deadline:
            for m in consumer.poll(1.0):
                got[m.msg_id] = m
    finally:
        consumer.shutdown()
    assert set(got) == set(java) == {e["msgId"] for e in sent}
    for msg_id, j in java.items():
        p = got[msg_id]
        h = _stored_over_http(spark_cluster, j["brokerName"], topic, j["queueId"], j["queueOffset"])
        assert base64.b64decode(j["body"]) == p.body == base64.b64decode(h["body"])
        assert j["tags"] == p.tags == h["tags"] == "TagX"
        assert [j["keys"]] == list(p.keys) == h["keys"]
        assert j["properties"]["color"] == p.properties["color"] == h["properties"]["color"] == "green"
        assert j["offsetMsgId"] == p.offset_msg_id == h["offset_msg_id"]
        assert (j["brokerName"], j["queueId"], j["queueOffset"]) == (p.broker_name, p.queue_id, p.queue_offset)
        assert j["bornTimestamp"] == p.born_timestamp == h["born_timestamp"]
        assert j["storeTimestamp"] == p.store_timestamp == h["store_timestamp"]
        assert j["commitLogOffset"] == p.commitlog_offset


def test_a_python_sent_message_reads_the_same_in_java(spark_cluster: SparkCluster) -> None:
    """A message sparkmq's Python producer sent, read by the Java lite pull consumer: the same body, tags, keys,
    user properties, ids, queue and timestamps as the send result and HTTP say."""
    from procs import fast_client_config
    from sparkmq.platform.client.producer import Producer
    from sparkmq.platform.common.message import Message

    topic = "JavaCrossOut"
    spark_cluster.create_topic(topic, queues=1)
    producer = Producer("JavaCrossOutPy", fast_client_config(spark_cluster.namesrv, spark_cluster.root / "py"))
    producer.start()
    try:
        results = [producer.send(Message(topic, f"py-{i}".encode(), tags="TagP", keys=(f"pk-{i}", f"pk2-{i}"),
                                         properties={"shade": "red"})) for i in range(4)]
    finally:
        producer.shutdown()
    java = {e["msgId"]: e for e in sc.drain(spark_cluster, topic, 4)}
    assert set(java) == {r.msg_id for r in results}
    for i, r in enumerate(results):
        j = java[r.msg_id]
        h = _stored_over_http(spark_cluster, j["brokerName"], topic, j["queueId"], j["queueOffset"])
        assert base64.b64decode(j["body"]) == f"py-{i}".encode() == base64.b64decode(h["body"])
        assert j["tags"] == h["tags"] == "TagP" and j["keys"] == f"pk-{i} pk2-{i}" and h["keys"] == [f"pk-{i}",
                                                                                                    f"pk2-{i}"]
        assert j["properties"]["shade"] == h["properties"]["shade"] == "red"
        assert j["offsetMsgId"] == r.offset_msg_id == h["offset_msg_id"] and h["msg_id"] == r.msg_id
        assert (j["queueId"], j["queueOffset"]) == (r.queue_id, r.queue_offset)
        assert j["brokerName"] == r.broker_name
        assert j["bornTimestamp"] == h["born_timestamp"] and j["storeTimestamp"] == h["store_timestamp"]


# -- 3. DefaultMQPushConsumer -----------------------------------------------------------------------------------------
def test_push_clustering_queues_move_when_a_member_joins_and_leaves(spark_cluster: SparkCluster) -> None:
    """Clustering over two brokers: one member holds all 8 queues, two hold 4 each (disjoint), and the first has
    all 8 again after the second left -- each within 15 s (NOTIFY_CONSUMER_IDS_CHANGED, not the 20 s timer)."""
    spark_cluster.create_topic("JavaRebalance")
    sc.two_members_share_the_queues(spark_cluster, "JavaRebalance", "JavaRebalanceGroup", 8, timeout=15)


def test_push_broadcasting_delivers_every_message_to_every_member(spark_cluster: SparkCluster) -> None:
    """Broadcasting: each of two members receives every message."""
    from java_clients import JavaClient

    topic = "JavaBroadcast"
    spark_cluster.create_topic(topic)
    args = ["--namesrv", spark_cluster.namesrv, "--group", "JavaBroadcastGroup", "--topic", topic,
            "--model", "broadcasting", "--from", "first"]
    members = [JavaClient.start(None, "push", *args, work_dir=spark_cluster.work) for _ in range(2)]
    try:
        for m in members:
            sc.wait_queues(m, topic, 8)
        sent = sc.run(spark_cluster, "produce", "--topic", topic, "--count", "10").events_of("sent")
        got = [m.wait_count("received", 10, 60) for m in members]
        time.sleep(1)  # nothing more arrives
        got = [m.snapshot("received") for m in members]
    finally:
        for m in members:
            m.stop()
    for mine in got:
        assert sorted(e["msgId"] for e in mine) == sorted(e["msgId"] for e in sent)


def test_push_orderly_one_queue_is_never_consumed_by_two_members(spark_cluster: SparkCluster) -> None:
    """Orderly: a single member locks its queues and gets each order key's messages in send order; with two
    members consuming while messages arrive, no queue is ever in two members' listeners at once."""
    from java_clients import JavaClient

    topic, group = "JavaOrderly", "JavaOrderlyGroup"
    spark_cluster.create_topic(topic, queues=2)
    sc.orderly_consumer_locks_its_queues_and_keeps_order(spark_cluster, topic, group)
    args = ["--namesrv", spark_cluster.namesrv, "--group", f"{group}2", "--topic", topic, "--orderly",
            "--rebalance-ms", "1000", "--consume-sleep-ms", "20"]
    one = JavaClient.start(None, "push", *args, work_dir=spark_cluster.work)
    two = None
    try:
        sc.wait_queues(one, topic, 4)
        # 8 s of sends: the second member joins while they flow, and takes its queues over once the first let
        # go of their locks
        producer = JavaClient.start(None, "produce", "--namesrv", spark_cluster.namesrv, "--topic", topic,
                                    "--count", "120", "--send", "ordered", "--order-keys", "4", "--rate", "15",
                                    work_dir=spark_cluster.work, stdin_stop=False)
        one.wait_count("received", 5, 30)
        two = JavaClient.start(None, "push", *args, work_dir=spark_cluster.work)
        sc.wait_queues(two, topic, 2, 30)
        sent = producer.wait_count("sent", 120, 60)
        wait_until(lambda: len({e["msgId"] for c in (one, two) for e in c.snapshot("received")}) >= 120, 60,
                 "every message consumed")
    finally:
        for c in (one, two):
            if c is not None:
                c.stop()
    spans: dict[tuple[str, int], list[tuple[int, int, int]]] = {}
    for member, client in enumerate((one, two)):
        assert client is not None
        for e in client.snapshot("received"):
            spans.setdefault((e["brokerName"], e["queueId"]), []).append((e["startMs"], e["receivedMs"], member))
    assert len({m for s in spans.values() for _a, _b, m in s}) == 2, "the second member never consumed"
    for queue, seen in spans.items():  # listener runs [start, end] of different members never overlap
        overlaps = [(a, b) for a in seen for b in seen if a[2] < b[2] and a[0] < b[1] and b[0] < a[1]]
        assert not overlaps, ("two members in one queue at once", queue, overlaps[:3])
    for key in range(4):  # each key's messages were first delivered in send order
        want = [e["msgId"] for e in sent if e["orderKey"] == key]
        first: dict[str, int] = {}
        for client in (one, two):
            assert client is not None
            for e in client.snapshot("received"):
                first.setdefault(e["msgId"], e["startMs"])
                first[e["msgId"]] = min(first[e["msgId"]], e["startMs"])
        times = [first[m] for m in want]
        assert times == sorted(times), key


def test_push_reconsume_later_retries_then_dead_letters(spark_cluster: SparkCluster) -> None:
    """RECONSUME_LATER every time: reconsume times 0, 1, 2, then the message is in %DLQ%<group>."""
    spark_cluster.create_topic("JavaRetry")
    sc.reconsume_later_then_dlq(spark_cluster, "JavaRetry", "JavaRetryGroup")


def test_push_tag_and_sql_filters(spark_cluster: SparkCluster) -> None:
    """A tag subscription and MessageSelector.bySql receive exactly their messages."""
    spark_cluster.create_topic("JavaFilters")
    sc.tag_and_sql_subscriptions(spark_cluster, "JavaFilters", "JavaTagGroup", "JavaSqlGroup")


# -- 5. mqadmin -------------------------------------------------------------------------------------------------------
def _admin(cluster: SparkCluster, command: str, *args: str) -> str:
    """``mqadmin command`` against the cluster's name servers; its stdout (mqadmin exits 0 even when a command
    failed: the stack trace on stderr is part of the assertion message)."""
    from java_clients import mqadmin

    out = mqadmin(cluster.namesrv, command, *args, work_dir=cluster.work)
    assert "Exception" not in out.stderr, out.stderr[-3000:]
    return out.stdout


def _admin_all(cluster: SparkCluster, *commands: tuple[str, ...]) -> list[str]:
    """Several mqadmin commands at once (each a JVM that mostly starts up): their stdouts, in order."""
    with ThreadPoolExecutor(len(commands)) as pool:
        return list(pool.map(lambda cmd: _admin(cluster, *cmd), commands))


def _rows(text: str, first: str) -> list[list[str]]:
    """The whitespace-split lines of a table whose rows start with ``first``."""
    return [line.split() for line in text.splitlines() if line.startswith(first)]


def test_mqadmin_commands_take_effect(spark_cluster: SparkCluster) -> None:
    """Each mqadmin command does what it says on a 2-broker cluster: topics made, listed, routed, counted and
    deleted; brokers listed with their figures; a group's progress, connection, offset reset and config; messages
    found by offsetMsgId, by unique id and by key."""
    from java_clients import JavaClient

    c, topic, group = spark_cluster, "JavaAdmin", "JavaAdminGroup"
    made = _admin(c, "updateTopic", "-c", c.cluster, "-t", topic, "-r", "3", "-w", "3")
    assert made.count("success") == 2, made
    wait_until(lambda: all(_routed_queues(ns, topic) == 6 for ns in c.namesrvs), 20, "the new topic's route")
    route, listed = _admin_all(c, ("topicRoute", "-t", topic), ("topicList",))
    assert re.findall(r'"(read|write)QueueNums":(\d+)', route) == [("read", "3"), ("write", "3")] * 2, route
    assert topic in listed.split()

    sent = sc.run(c, "produce", "--topic", topic, "--count", "6", "--keys-prefix", "admin-key-").events_of("sent")
    status, clusters, *broker_status = _admin_all(c, ("topicStatus", "-t", topic), ("clusterList",),
                                                  *(("brokerStatus", "-b", b.addr) for b in c.brokers.values()))
    status_rows = _rows(status, "broker-")
    assert len(status_rows) == 6 and sum(int(r[3]) for r in status_rows) == 6, status  # #Max Offset per queue
    cluster_rows = _rows(clusters, c.cluster)
    assert {(r[1], r[3]) for r in cluster_rows} == {(name, b.addr) for name, b in c.brokers.items()}, clusters
    for name, text in zip(c.brokers, broker_status, strict=True):
        figures = {k.strip(): v.strip() for k, v in (line.split(":", 1) for line in text.splitlines() if ":" in line)}
        assert int(figures["commitLogMaxOffset"]) > 0 and figures["brokerActive"] == "true", (name, figures)

    consumer = JavaClient.start(None, "push", "--namesrv", c.namesrv, "--group", group, "--topic", topic,
                                "--rebalance-ms", "1000", "--persist-offset-ms", "500", work_dir=c.work)
    try:
        consumer.wait_count("received", 6, 60)
        client_id = consumer.wait_for(lambda evs: [e["clientId"] for e in evs if e["event"] == "started"])[0]
        progress = wait_until(lambda: (rows := _rows(_admin(c, "consumerProgress", "-g", group), topic))
                            and sum(int(r[4]) for r in rows) == 6 and rows, 30, "the group's offsets committed")
        assert all(r[3] == r[4] and r[5] == "0" for r in progress), progress  # broker = consumer offset, no diff
        connection, by_offset_id, by_unique_id, by_key = _admin_all(
            c, ("consumerConnection", "-g", group), ("queryMsgById", "-t", topic, "-i", sent[0]["offsetMsgId"]),
            ("queryMsgById", "-t", topic, "-i", sent[1]["msgId"]), ("queryMsgByKey", "-t", topic, "-k", "admin-key-2"))
        assert client_id in connection and "JAVA" in connection and "CLUSTERING" in connection, connection
        assert "Keys:                [admin-key-0]" in by_offset_id and sent[0]["msgId"] in by_offset_id
        assert "[admin-key-1]" in by_unique_id and sent[1]["offsetMsgId"] in by_unique_id, by_unique_id
        assert sent[2]["msgId"] in by_key and sent[3]["msgId"] not in by_key, by_key

        # back to the start while the consumer is online: it is told, and consumes all 6 again
        before = len(consumer.snapshot("received"))
        reset = _admin(c, "resetOffsetByTime", "-g", group, "-t", topic, "-s", "0")
        assert len(_rows(reset, "broker-")) == 6, reset
        wait_until(lambda: {e["msgId"] for e in consumer.snapshot("received")[before:]} >= {e["msgId"] for e in sent},
                 60, "every message consumed again")
    finally:
        consumer.stop()

    made = _admin(c, "updateSubGroup", "-c", c.cluster, "-g", "JavaAdminSubGroup", "-r", "3")
    assert made.count("success") == 2, made
    for name in BROKERS:
        stored = json.loads((c.root / name / "config" / "subscription_groups.json").read_text())["groups"]
        assert [(g["group_name"], g["retry_max_times"]) for g in stored] == [("JavaAdminSubGroup", 3)], stored

    _admin(c, "deleteTopic", "-c", c.cluster, "-t", topic)
    assert topic not in _admin(c, "topicList").split()
    wait_until(lambda: all(_routed_queues(ns, topic) == 0 for ns in c.namesrvs), 20, "the route gone")


# -- 6. a broker killed under a running consumer ---------------------------------------------------------------------
def test_a_broker_killed_under_the_push_consumer_loses_and_skips_nothing(spark_cluster: SparkCluster) -> None:
    """SIGKILL broker-a (by pid) while a Java producer sends and a Java push consumer consumes, then start it again
    on its port and data: every message the producer got SEND_OK for is consumed (none lost, none skipped), and the
    redeliveries are counted and bounded.  (Last in the module: it restarts a broker.)"""
    from java_clients import JavaClient

    c, topic = spark_cluster, "JavaCrash"
    c.create_topic(topic)
    consumer = JavaClient.start(None, "push", "--namesrv", c.namesrv, "--group", "JavaCrashGroup", "--topic", topic,
                                "--persist-offset-ms", "500", "--consume-sleep-ms", "5", "--no-body",
                                work_dir=c.work)
    producer = None
    try:
        sc.wait_queues(consumer, topic, 8)
        producer = JavaClient.start(None, "produce", "--namesrv", c.namesrv, "--topic", topic, "--count", "300",
                                    "--rate", "50", "--no-body", "--poll-namesrv-ms", "1000",
                                    work_dir=c.work, stdin_stop=False)
        producer.wait_count("sent", 60, 30)
        consumer.wait_count("received", 30, 30)
        victim = c.brokers["broker-a"]
        victim.kill9()
        time.sleep(2)  # sends and pulls meet a dead broker
        c.start_broker("broker-a", *broker_restart_ports(victim.port))
        wait_until(lambda: victim.addr in c.live_brokers(), 30, "broker-a registered again")
        producer.wait_for(lambda evs: any(e["event"] == "exit" for e in evs), 120, "the producer's end")
        acked = {e["msgId"] for e in producer.snapshot("sent")}
        assert len(acked) >= 250, (len(acked), producer.snapshot("error")[:3])  # most sends went through
        wait_until(lambda: acked <= {e["msgId"] for e in consumer.snapshot("received")}, 90,
                 "every acknowledged message consumed")
    finally:
        for client in (producer, consumer):
            if client is not None:
                client.stop()
    received = [e["msgId"] for e in consumer.snapshot("received")]
    duplicates = len(received) - len(set(received))
    print(f"{len(acked)} acknowledged, {len(received)} deliveries, {duplicates} redelivered")
    assert acked <= set(received)
    # redeliveries are broker-a's messages consumed after its last persisted offsets (0.5 s of consumption)
    assert duplicates <= 60, duplicates
