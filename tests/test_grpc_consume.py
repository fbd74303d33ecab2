"""POP consumption over the RocketMQ 5 gRPC endpoint, proven with the official ``rocketmq-python-client``:
the DLQ after max attempts, FIFO message groups, competing SimpleConsumers, the PushConsumer, a broker
kill -9 mid-consumption, stale receipt handles, and a gRPC-sent message found by key and traced.

The 2-broker / 2-name-server cluster is the one of ``test_grpc.py`` (its module fixture, imported);
POP invisible times go down to 1 s there (``pop_min_invisible_ms``), so every case takes seconds.
"""
from __future__ import annotations

import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import test_grpc as base
from rocketmq import (
    ClientConfiguration,
    ConsumeResult,
    Credentials,
    FilterExpression,
    Message,
    MessageListener,
    PushConsumer,
    SimpleConsumer,
)
from rocketmq.grpc_protocol import definition_pb2
from rocketmq.v5.exception.client_exception import ClientException
from spark_standalone import free_port

from procs import BROKER, LAKE_TABLE, NAMESRV, ProcessHarness, ServiceProcess, read_all, wait_until
from sparkmq.platform.broker.pop_state import REVIVE_TOPIC, LeaseRecord, SettleRecord, decode_record
from sparkmq.platform.client.admin import AdminClient
from sparkmq.platform.client.config import ClientConfig
from sparkmq.platform.common.protocol import POP_DEFAULT_MAX_ATTEMPTS
from sparkmq.platform.common.system_topics import TRACE_TOPIC
from sparkmq.platform.common.trace import decode_trace

pytestmark = pytest.mark.cluster

cluster = base.cluster  # the module fixture of test_grpc.py: this module gets its own instance
GrpcCluster = base.GrpcCluster
Code = definition_pb2.Code


# -- helpers ----------------------------------------------------------------------------------------
@dataclass
class Delivery:
    """One message as a consumer got it: when the receive call started and returned, and how it was settled."""

    consumer: str
    message_id: str
    attempt: int
    requested: float
    returned: float
    ack_started: float | None = None
    acked: bool = False


@dataclass
class Ledger:
    """What consumers did, shared by their threads."""

    deliveries: list[Delivery] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def acked_ids(self) -> Counter[str]:
        """Successful acks per message id."""
        with self.lock:
            return Counter(d.message_id for d in self.deliveries if d.acked)


def _simple_consumer(configuration: ClientConfiguration, group: str, topic: str,
                     await_s: int = 1) -> SimpleConsumer:
    """The official SimpleConsumer of ``topic`` in ``group``, started."""
    consumer = SimpleConsumer(configuration, group, {topic: FilterExpression()}, await_duration=await_s)
    consumer.startup()
    return consumer


def _ack(consumer: SimpleConsumer, message: Message) -> int:
    """Ack ``message``; the status code the server answered (OK, or the failure's code; -1: no answer)."""
    try:
        consumer.ack(message)
    except ClientException as exc:
        return int(exc.code) if exc.code is not None else -1
    except Exception:  # the broker is down (the kill test): a gRPC error, no status
        return -1
    return Code.OK


def _change_invisible(consumer: SimpleConsumer, message: Message, seconds: int) -> int:
    """Change ``message``'s invisible time; the status code the server answered."""
    try:
        consumer.change_invisible_duration(message, seconds)
    except ClientException as exc:
        return int(exc.code) if exc.code is not None else -1
    return Code.OK


def _consume_loop(consumer: SimpleConsumer, name: str, ledger: Ledger, invisible_s: int,
                  keep: Callable[[Message], bool], done: threading.Event) -> None:
    """Receive and ack until ``done``; a message for which ``keep`` is False is left unacked (it comes back)."""
    while not done.is_set():
        requested = time.monotonic()
        try:
            got = consumer.receive(16, invisible_s) or []
        except Exception as exc:  # the broker may be down (kill test): keep trying
            with ledger.lock:
                ledger.errors.append(f"{name} receive: {exc!r:.200}")
            time.sleep(0.2)
            continue
        returned = time.monotonic()
        for m in got:
            delivery = Delivery(name, m.message_id, m.delivery_attempt, requested, returned)
            with ledger.lock:
                ledger.deliveries.append(delivery)
            if not keep(m):
                continue
            delivery.ack_started = time.monotonic()
            code = _ack(consumer, m)
            with ledger.lock:
                delivery.acked = code == Code.OK
                if code != Code.OK:
                    ledger.errors.append(f"{name} ack {m.message_id}: {code}")


def _send(cluster: GrpcCluster | ClientConfiguration, topic: str, bodies: list[bytes],
          groups: list[str] | None = None) -> list[str]:
    """Send ``bodies`` with the official producer (FIFO when ``groups`` names a group per body); their ids."""
    configuration = cluster.configuration() if isinstance(cluster, GrpcCluster) else cluster
    producer = base.Producer(configuration, (topic,))
    producer.startup()
    try:
        ids = []
        for i, body in enumerate(bodies):
            msg = base._message(topic, body, keys=(f"key-{body.decode()}",))
            if groups:
                msg.message_group = groups[i]
            ids.append(producer.send(msg).message_id)
        return ids
    finally:
        producer.shutdown()


def _create_topic_on(ns: ServiceProcess, topic: str, tmp_path: Path) -> None:
    """``topic`` on the one broker registered with ``ns``, routed by it."""
    admin = AdminClient(ClientConfig(namesrv_addrs=ns.addr, request_timeout_s=3.0,
                                     offset_store_dir=str(tmp_path / "offsets")))
    try:
        admin.create_topic(topic, read_queue_nums=base.QUEUES, write_queue_nums=base.QUEUES)
    finally:
        admin.close()
    wait_until(lambda: base._route_brokers(ns, topic) == 1, 20, f"the route of {topic}")


def _pop_gauge(brokers: list[ServiceProcess], group: str, topic: str, gauge: str) -> float:
    """``sparkmq_pop_<gauge>{name="group/topic"}`` summed over ``brokers``' /metrics."""
    pattern = re.compile(rf'^sparkmq_pop_{gauge}\{{[^}}]*name="{re.escape(group)}/{re.escape(topic)}"[^}}]*\}} (\S+)$',
                         re.M)
    total = 0.0
    for broker in brokers:
        text = httpx.get(f"{broker.url}/metrics", timeout=5).text
        total += sum(float(v) for v in pattern.findall(text))
    return total


# -- 1. max attempts, then the DLQ -------------------------------------------------------------------
@pytest.mark.slow
def test_unacked_message_goes_to_the_dlq_after_max_attempts(cluster: GrpcCluster) -> None:
    topic, group = base._topic("grpc-dlq"), base._topic("dlq-group")
    cluster.create_topic(topic)
    [doomed] = _send(cluster, topic, [b"never-acked"])
    consumer = _simple_consumer(cluster.configuration(), group, topic)
    try:
        attempts: list[int] = []
        deadline = time.monotonic() + 3 * POP_DEFAULT_MAX_ATTEMPTS + 10
        while len(attempts) < POP_DEFAULT_MAX_ATTEMPTS and time.monotonic() < deadline:
            for m in consumer.receive(16, 1) or []:  # never acked: back after 1 s
                assert m.message_id == doomed
                attempts.append(m.delivery_attempt)
        assert attempts == list(range(1, POP_DEFAULT_MAX_ATTEMPTS + 1)), "one delivery per attempt, counted up"
        admin = AdminClient(cluster.client_config())
        try:
            dead = wait_until(lambda: admin.dlq_messages(group), 15, f"%DLQ%{group} to hold the message")
        finally:
            admin.close()
        assert len(dead) == 1 and dead[0].body == b"never-acked"
        assert doomed in (dead[0].msg_id, dead[0].properties.get("ORIGIN_MESSAGE_ID"))
        time.sleep(1.5)  # past the last attempt's invisible time
        assert base._receive_until(consumer, 1, invisible_s=1, timeout=4) == [], "dead-lettered: no longer delivered"
    finally:
        consumer.shutdown()


# -- 2. FIFO message groups ----------------------------------------------------------------------------
def _create_ordered_topic(cluster: GrpcCluster, topic: str) -> None:
    """An ordered topic (``order=True``: the POP core consumes it FIFO) on both brokers, routed."""
    admin = AdminClient(cluster.client_config())
    try:
        admin.create_topic(topic, read_queue_nums=base.QUEUES, write_queue_nums=base.QUEUES, order=True)
    finally:
        admin.close()
    for ns in cluster.namesrvs:
        wait_until(lambda ns=ns: base._route_brokers(ns, topic) == 2, 20, f"the route of {topic}")


def test_fifo_groups_are_delivered_in_order_one_in_flight_per_group(cluster: GrpcCluster) -> None:
    topic, group = base._topic("grpc-fifo-pop"), base._topic("fifo-group")
    _create_ordered_topic(cluster, topic)
    per_group = 4
    names = [f"g{g}" for g in range(4)]
    bodies = [f"{g}-{i}".encode() for g in names for i in range(per_group)]
    _send(cluster, topic, bodies, groups=[b.decode().split("-")[0] for b in bodies])
    withhold = {("g0", 1), ("g1", 0)}  # left unacked on their first delivery: their groups must stall
    acked = dict.fromkeys(names, 0)
    log: list[tuple[str, int, int]] = []
    consumer = _simple_consumer(cluster.configuration(), group, topic)
    try:
        deadline = time.monotonic() + 40
        while sum(acked.values()) < len(bodies) and time.monotonic() < deadline:
            got = consumer.receive(32, 2) or []
            parsed = []
            for m in got:  # checked before any of the batch is acked
                name, index = m.body.decode().split("-")
                assert m.message_group == name
                assert int(index) == acked[name], (
                    f"{name}-{index} (attempt {m.delivery_attempt}) delivered while {name}-{acked[name]} "
                    f"is not acked; deliveries so far {log}")
                parsed.append((m, name, int(index)))
            for m, name, index in parsed:
                log.append((name, index, m.delivery_attempt))
                if (name, index) in withhold and m.delivery_attempt == 1:
                    continue
                assert _ack(consumer, m) == Code.OK
                acked[name] += 1
    finally:
        consumer.shutdown()
    assert acked == dict.fromkeys(names, per_group), log
    for name, index in withhold:
        assert [a for g, i, a in log if (g, i) == (name, index)] == [1, 2], "withheld: back once, attempt 2"
    for name in names:
        assert [i for g, i, a in log if g == name and a == 1] == list(range(per_group)), "first deliveries in order"


# -- 3. competing SimpleConsumers ----------------------------------------------------------------------
def test_two_simple_consumers_of_a_group_never_hold_a_message_at_once(cluster: GrpcCluster) -> None:
    topic, group = base._topic("grpc-compete"), base._topic("compete-group")
    cluster.create_topic(topic)
    sent = set(_send(cluster, topic, [b"c-%d" % i for i in range(40)]))
    invisible_s = 3
    ledger, done = Ledger(), threading.Event()
    dropped = {m for m in sent if int(m[-2:], 16) % 4 == 0}  # first delivery left unacked: redelivered

    def keep(m: Message) -> bool:
        return not (m.message_id in dropped and m.delivery_attempt == 1)
    consumers = [_simple_consumer(cluster.configuration(), group, topic) for _ in range(2)]
    threads = [threading.Thread(target=_consume_loop, args=(c, f"c{i}", ledger, invisible_s, keep, done))
               for i, c in enumerate(consumers)]
    try:
        for t in threads:
            t.start()
        wait_until(lambda: set(ledger.acked_ids()) >= sent, 40, lambda: f"every message acked; {ledger.errors[-5:]}")
        time.sleep(invisible_s + 1)  # anything wrongly still held would come back now
    finally:
        done.set()
        for t in threads:
            t.join(15)
        for c in consumers:
            c.shutdown()
    assert dropped and {d.message_id for d in ledger.deliveries if d.attempt == 2} >= dropped
    assert {d.consumer for d in ledger.deliveries} == {"c0", "c1"}, "both consumers took part"
    acks = ledger.acked_ids()
    assert set(acks) == sent and set(acks.values()) == {1}, "together they got everything, each settled once"
    by_id: dict[str, list[Delivery]] = {}
    for d in ledger.deliveries:
        by_id.setdefault(d.message_id, []).append(d)
    overlaps = []
    for message_id, ds in by_id.items():
        ds.sort(key=lambda d: d.returned)
        for first, second in zip(ds, ds[1:], strict=False):
            # The first lease began no earlier than its receive call and lasted until the ack was sent (if acked)
            # or at least the invisible time: a second delivery returned before then was held twice.
            held_until = first.ack_started if first.acked else first.requested + invisible_s
            if second.returned < held_until:
                overlaps.append((message_id, first, second))
    assert overlaps == [], overlaps[:3]
    assert {d.message_id for d in ledger.deliveries if d.acked and d.attempt > 1} <= dropped


# -- 4. the PushConsumer ----------------------------------------------------------------------------------
class _Counting(MessageListener):
    """Counts the ids it consumes; always SUCCESS."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ids: Counter[str] = Counter()

    def consume(self, message: Message) -> ConsumeResult:
        with self.lock:
            self.ids[message.message_id] += 1
        return ConsumeResult.SUCCESS


def test_push_consumer_consumes_everything_exactly_once(cluster: GrpcCluster) -> None:
    topic, group = base._topic("grpc-push"), base._topic("push-group")
    cluster.create_topic(topic)
    sent = _send(cluster, topic, [b"p-%d" % i for i in range(60)])
    listener = _Counting()
    consumer = PushConsumer(cluster.configuration(), group, listener, {topic: FilterExpression()},
                            consumption_thread_count=4)
    consumer.startup()
    try:
        wait_until(lambda: len(listener.ids) >= len(sent), 40, lambda: f"all consumed; {len(listener.ids)} so far")
        wait_until(lambda: _pop_gauge(cluster.brokers, group, topic, "in_flight") == 0, 15,
                   "every delivery settled on the brokers")
        time.sleep(2)
    finally:
        consumer.shutdown()
    assert set(listener.ids) == set(sent)
    assert max(listener.ids.values()) == 1, {k: v for k, v in listener.ids.items() if v > 1}
    assert _pop_gauge(cluster.brokers, group, topic, "acked") == len(sent)
    assert _pop_gauge(cluster.brokers, group, topic, "redelivered") == 0


# -- 5. kill -9 mid-consumption ---------------------------------------------------------------------------
@pytest.mark.slow
def test_broker_killed_mid_consumption_loses_nothing_and_redelivers_nothing_acked(
        procs: ProcessHarness, tmp_path: Path) -> None:
    conf = tmp_path / "broker.toml"
    conf.write_text("[broker]\npop_min_invisible_ms = 1000\n")
    ns = procs.start("namesrv", NAMESRV, "--scan-interval-s", "0.5")
    grpc_port = free_port()
    args = ["--config", str(conf), "--data-dir", str(tmp_path / "broker-k"), "--broker-name", "broker-k",
            "--namesrv", ns.addr, "--grpc-port", str(grpc_port), "--register-interval-s", "0.5",
            "--long-polling-max-ms", "5000"]
    broker = procs.start("broker", BROKER, *args)
    topic, group = base._topic("grpc-kill"), base._topic("kill-group")
    _create_topic_on(ns, topic, tmp_path)
    configuration = ClientConfiguration(f"127.0.0.1:{grpc_port}", Credentials(), request_timeout=3)
    sent = set(_send(configuration, topic, [b"k-%d" % i for i in range(300)]))
    assert len(read_all(broker, topic, base.QUEUES)) == 300
    invisible_s = 3
    ledger, done = Ledger(), threading.Event()
    consumer = _simple_consumer(configuration, group, topic)
    thread = threading.Thread(target=_consume_loop, args=(consumer, "c", ledger, invisible_s, lambda m: True, done))
    thread.start()
    try:
        wait_until(lambda: sum(ledger.acked_ids().values()) >= 80, 30, "a third consumed")
        broker.kill9()
        with ledger.lock:
            acked_before = {d.message_id for d in ledger.deliveries if d.acked}
            in_flight = {d.message_id for d in ledger.deliveries if not d.acked} - acked_before
        broker = procs.start("broker", BROKER, *args)  # the same data dir and gRPC port

        def accounted() -> bool:
            # Every message acked, or settled by an ack the kill left unanswered: the broker never delivers that
            # one again, so waiting for its ack would time out (asserted below).
            missing = sent - set(ledger.acked_ids())
            with ledger.lock:
                unanswered = {d.message_id for d in ledger.deliveries if d.ack_started is not None and not d.acked}
            return not missing or (missing <= unanswered and missing <= _settled_on(broker, group, topic))
        wait_until(accounted, 180,
                   lambda: f"every message acked after the restart; {len(set(ledger.acked_ids()))} of "
                           f"{len(sent)}; {ledger.errors[-3:]}")
        time.sleep(invisible_s + 1)  # a lost ack would bring its message back now
    finally:
        done.set()
        thread.join(15)
        consumer.shutdown()
    counts = Counter(d.message_id for d in ledger.deliveries)
    redelivered_acked = sorted(i for i in acked_before if counts[i] > 1)
    redelivered_in_flight = sorted(i for i in in_flight if counts[i] > 1)
    acks = ledger.acked_ids()
    # An ack the kill cut off may have been written before the broker died: then the broker settled the
    # message and rightly never delivers it again, though the consumer saw no answer.  Such a message
    # counts only if the broker's revive log records it settled.
    unanswered = {d.message_id for d in ledger.deliveries if d.ack_started is not None and not d.acked}
    missing = sent - set(acks)
    settled = _settled_on(broker, group, topic)
    assert set(acks) <= settled, "every ack the consumer saw answered is in the revive log"
    settled_unanswered = missing & unanswered & settled
    print(f"kill -9: {len(acked_before)} acked before the kill, {len(in_flight)} in flight at the kill "
          f"({len(redelivered_in_flight)} of them redelivered), {len(redelivered_acked)} acked ones redelivered, "
          f"{len(settled_unanswered)} settled by an ack the kill left unanswered")
    assert missing == settled_unanswered, "nothing unacked is lost"
    assert len(settled_unanswered) <= 1, "one ack at most was on its way when the broker died"
    assert redelivered_acked == [], f"acked before the kill, delivered again: {redelivered_acked[:5]}"
    assert set(acks.values()) == {1}


def _settled_on(broker: ServiceProcess, group: str, topic: str) -> set[str]:
    """Ids of ``topic``'s messages the broker's POP revive log records as settled (acked) for ``group``."""
    leased: dict[tuple[int, int], str] = {}
    settled: set[tuple[int, int]] = set()
    for body in read_all(broker, REVIVE_TOPIC, 1).values():
        record = decode_record(body)
        if record.group != group or record.topic != topic:
            continue
        if isinstance(record, LeaseRecord):
            leased.update(((record.queue_id, lease.offset), lease.msg_id) for lease in record.leases)
        elif isinstance(record, SettleRecord):
            settled.update((record.queue_id, offset) for offset in record.offsets)
    return {leased[key] for key in settled if key in leased}


# -- 6. stale and tampered receipt handles ----------------------------------------------------------------
def _tampered(handle: str) -> str:
    """``handle`` with its last character changed."""
    return handle[:-1] + ("0" if handle[-1] != "0" else "1")


def test_stale_and_tampered_receipt_handles_are_refused_and_change_nothing(cluster: GrpcCluster) -> None:
    topic, group = base._topic("grpc-stale"), base._topic("stale-group")
    cluster.create_topic(topic)
    [sent] = _send(cluster, topic, [b"handle-me"])
    consumer = _simple_consumer(cluster.configuration(), group, topic)
    other = _simple_consumer(cluster.configuration(), base._topic("other-group"), topic)
    try:
        [m] = base._receive_until(consumer, 1, invisible_s=4)
        assert m.message_id == sent
        first = m.receipt_handle
        assert _change_invisible(consumer, m, 4) == Code.OK
        current = m.receipt_handle
        assert current and current != first
        refused: dict[str, tuple[int, int]] = {}
        for label, handle in (("stale", first), ("tampered", _tampered(current)), ("garbage", "not-a-handle")):
            m.receipt_handle = handle
            ack_code = _ack(consumer, m)
            m.receipt_handle = handle
            change_code = _change_invisible(consumer, m, 30)
            refused[label] = (ack_code, change_code)
        m.receipt_handle = current
        refused["other group"] = (_ack(other, m), Code.INVALID_RECEIPT_HANDLE)
        m.receipt_handle = current
        expected = (Code.INVALID_RECEIPT_HANDLE, Code.INVALID_RECEIPT_HANDLE)
        assert refused == dict.fromkeys(refused, expected)
        assert base._receive_until(consumer, 1, invisible_s=4, timeout=1.5) == [], "still invisible"
        assert _ack(consumer, m) == Code.OK, "the current handle still works"
        time.sleep(4)
        assert base._receive_until(consumer, 1, invisible_s=4, timeout=2) == [], "acked: never back"
    finally:
        other.shutdown()
        consumer.shutdown()


# -- 7. cross-protocol: query by key and trace ------------------------------------------------------------
LAKE_CONF = f"""
[broker]
pop_min_invisible_ms = 1000
{LAKE_TABLE}trigger_interval_s = 0.5
jobs = ["dispatch", "trace"]   # what the key lookup and the trace path read; the rest would only share the core
[lake.spark_conf]
"spark.master" = "local[1]"
"""


@pytest.fixture
def lake_broker(procs: ProcessHarness, tmp_path: Path) -> Iterator[tuple[ServiceProcess, ServiceProcess, str]]:
    """A name server and a broker with the lake (dispatch and trace jobs) serving gRPC: (namesrv, broker, endpoint)."""
    conf = tmp_path / "lake.toml"
    conf.write_text(LAKE_CONF)
    ns = procs.start("namesrv", NAMESRV, "--scan-interval-s", "0.5")
    grpc_port = free_port()
    broker = procs.start("broker", BROKER, "--config", str(conf), "--lake", "--data-dir", str(tmp_path / "lake-b"),
                         "--broker-name", "broker-a", "--namesrv", ns.addr, "--grpc-port", str(grpc_port),
                         "--register-interval-s", "0.5", ready_timeout=180)
    yield ns, broker, f"127.0.0.1:{grpc_port}"


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.timeout(300)
def test_grpc_sent_message_is_found_by_key_and_traced(lake_broker: tuple[ServiceProcess, ServiceProcess, str],
                                                      tmp_path: Path) -> None:
    ns, broker, endpoint = lake_broker
    http = httpx.Client(base_url=broker.url, timeout=10)
    topic, group = base._topic("grpc-query"), base._topic("query-group")
    _create_topic_on(ns, topic, tmp_path)
    configuration = ClientConfiguration(endpoint, Credentials(), request_timeout=5)
    [msg_id] = _send(configuration, topic, [b"find-me"])
    consumer = _simple_consumer(configuration, group, topic)
    try:
        [m] = base._receive_until(consumer, 1, invisible_s=10)
        assert m.message_id == msg_id and _ack(consumer, m) == Code.OK
    finally:
        consumer.shutdown()
    found = wait_until(lambda: http.get("/query/messages", params={"topic": topic, "key": "key-find-me"})
                       .json().get("messages"), 120,
                       lambda: f"the key in the lake's index; lake: {http.get('/health').json().get('lake')}; "
                               f"broker log: {broker.log()[-3000:]}")
    assert [(f["msg_id"], f["topic"]) for f in found] == [(msg_id, topic)]
    by_id = wait_until(lambda: http.get("/query/messages", params={"msg_id": msg_id}).json().get("messages"), 30,
                       "the id in the lake's index")
    assert [f["msg_id"] for f in by_id] == [msg_id]
    # The raw trace records on the broker (what the trace job turns into message_trace rows) ...
    records = _trace_records(broker, topic)
    kinds = {r.event_type for r in records}
    assert {"store", "consume"} <= kinds and kinds & {"deliver", "deliver_batch"}, kinds
    # ... and the path the trace table answers.
    path = wait_until(lambda: http.get(f"/trace/{msg_id}").json()["events"], 120, "the message's trace path")
    types = [e["event_type"] for e in path]
    assert types[0] in ("send", "store") and "deliver" in types and types[-1] == "consume", path
    consume = path[-1]
    assert consume["group"] == group and consume["status"] == "ACK", consume


def _trace_records(broker: ServiceProcess, topic: str) -> list:
    """Decoded trace records of ``topic`` in the broker's trace topic."""
    records = []
    with httpx.Client(base_url=broker.url, timeout=10) as http:
        wait_until(lambda: http.get("/health").json()["trace"]["buffered"] == 0, 10, "the broker to flush its events")
    for body in read_all(broker, TRACE_TOPIC, 1).values():
        records += [r for r in decode_trace(body) if r.topic == topic]
    return records
