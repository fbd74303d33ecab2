"""The client against real processes: a name server and a broker (``tests/procs.py``).

Every wait here waits *for a condition* with a deadline (``wait_until``); no sleep is an assertion.
Intervals are shortened through :class:`ClientConfig` so each test takes a few seconds.
"""
from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from procs import fast_client_config, route_has, wait_until
from sparkmq.platform.client import (
    AdminClient,
    ClientConfig,
    ConsumeStatus,
    Message,
    MessageQueue,
    Producer,
    PullConsumer,
    PushConsumer,
    ReceivedMessage,
    SendStatus,
)
from sparkmq.platform.client.remoting import BrokerClient
from sparkmq.platform.common.errors import ErrorCode, SparkMQError
from sparkmq.platform.common.sysflag import COMPRESSED

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(60)]

TOPIC = "orders"



@dataclass
class Env:
    """A running name server + broker, a fast client config and an admin client."""

    ns: Any
    broker: Any
    config: ClientConfig
    admin: AdminClient
    tmp: Path

    def client_config(self, **kw: Any) -> ClientConfig:
        return fast_client_config(self.config.namesrv_addrs, self.tmp / "offsets", **kw)

    def create_topic(self, topic: str, queues: int = 4) -> None:
        self.admin.create_topic(topic, queues, queues)
        wait_until(lambda: route_has(self.admin, topic, queues), what=f"route of {topic}")

    def max_offsets(self, topic: str) -> dict[MessageQueue, int]:
        return {MessageQueue(topic, s.broker_name, s.queue_id): s.max_offset for s in self.admin.topic_stats(topic)}


@pytest.fixture(autouse=True)
def no_leaked_threads() -> Iterator[None]:
    """Every client a test shut down has stopped its threads (scheduler, event loop, pools)."""
    yield
    wait_until(lambda: not [t.name for t in threading.enumerate() if t.name.startswith("sparkmq-")],
             timeout=5, what="client threads to stop")


@pytest.fixture
def env(procs: Any, tmp_path: Path) -> Iterator[Env]:
    ns, broker = procs.start_platform(tmp_path / "b")
    config = ClientConfig(namesrv_addrs=ns.addr)
    admin = AdminClient(config)
    e = Env(ns, broker, config, admin, tmp_path)
    e.create_topic(TOPIC)
    yield e
    admin.close()


def _pull_all(addr: str, topic: str, queues: int) -> list[ReceivedMessage]:
    client = BrokerClient(addr, 5.0)
    out: list[ReceivedMessage] = []
    for qid in range(queues):
        offset = 0
        while True:
            result = client.pull(topic, qid, offset, 32)
            out.extend(result.messages)
            if result.next_offset == offset or not result.messages:
                break
            offset = result.next_offset
    client.close()
    return out


def _collector() -> tuple[list[ReceivedMessage], threading.Lock, Callable[[list[ReceivedMessage]], ConsumeStatus]]:
    got: list[ReceivedMessage] = []
    lock = threading.Lock()

    def listener(msgs: list[ReceivedMessage]) -> ConsumeStatus:
        with lock:
            got.extend(msgs)
        return ConsumeStatus.CONSUME_SUCCESS
    return got, lock, listener


# -- producer ----------------------------------------------------------------------------------

def test_sync_async_oneway_and_batch_sends_arrive(env: Env) -> None:
    with Producer("pg", env.client_config()) as producer:
        sync = [producer.send(Message(TOPIC, f"sync-{i}".encode(), tags="A", keys=(f"k{i}",),
                                      properties={"n": str(i)})) for i in range(8)]
        futures = [producer.send_async(Message(TOPIC, f"async-{i}".encode())) for i in range(8)]
        asyncs = [f.result(10) for f in futures]
        for i in range(4):
            producer.send_oneway(Message(TOPIC, f"oneway-{i}".encode()))
        batch = producer.send_batch([Message(TOPIC, f"batch-{i}".encode(), tags="B") for i in range(5)])
        arrow = producer.send_batch([Message(TOPIC, f"arrow-{i}".encode()) for i in range(5)], arrow=True)
        big_body = b"0123456789abcdef" * 1024                   # 16 KiB: compressed on the way
        big = producer.send(Message(TOPIC, big_body))
        ordered = [producer.send(Message(TOPIC, f"ord-{i}".encode()), sharding_key="cust-7") for i in range(4)]
    # shutdown() waited for the one-way sends.
    assert all(r.status is SendStatus.SEND_OK for r in sync + asyncs + batch + arrow + [big] + ordered)
    assert len({r.queue_id for r in sync}) == 4                 # round-robin over the 4 write queues
    assert len({r.message_queue for r in batch}) == 1 and len({r.message_queue for r in arrow}) == 1
    assert [r.queue_offset for r in batch] == list(range(batch[0].queue_offset, batch[0].queue_offset + 5))
    assert len({r.message_queue for r in ordered}) == 1
    assert [r.queue_offset for r in ordered] == sorted(r.queue_offset for r in ordered)
    stored = _pull_all(env.broker.addr, TOPIC, 4)
    bodies = sorted(m.body for m in stored)
    expected = sorted([f"sync-{i}".encode() for i in range(8)] + [f"async-{i}".encode() for i in range(8)]
                      + [f"oneway-{i}".encode() for i in range(4)] + [f"batch-{i}".encode() for i in range(5)]
                      + [f"arrow-{i}".encode() for i in range(5)] + [big_body]
                      + [f"ord-{i}".encode() for i in range(4)])
    assert bodies == expected
    by_body = {m.body: m for m in stored}
    assert by_body[big_body].sys_flag & COMPRESSED and by_body[big_body].store_size < len(big_body)
    first = by_body[b"sync-3"]
    assert (first.tags, first.keys, first.user_properties) == ("A", ("k3",), {"n": "3"})
    assert first.msg_id == sync[3].msg_id and first.offset_msg_id == sync[3].offset_msg_id
    viewed = env.admin.view_message(big.offset_msg_id)
    assert viewed.body == big_body and viewed.queue_offset == big.queue_offset


def test_producer_auto_creates_a_topic_through_the_default_route(env: Env) -> None:
    with Producer("pg", env.client_config()) as producer:
        result = producer.send(Message("brand-new", b"first"))
        assert result.status is SendStatus.SEND_OK and result.queue_id in range(4)
        wait_until(lambda: "brand-new" in env.admin.topic_list(), what="the new topic registered")
        results = [producer.send(Message("brand-new", b"more")) for _ in range(4)]
        assert all(r.status is SendStatus.SEND_OK for r in results)


# -- push consumer -------------------------------------------------------------------------------

def test_push_consumer_receives_every_message_and_commits(env: Env) -> None:
    got, lock, listener = _collector()
    consumer = PushConsumer("cg-all", env.client_config(), consume_from_where="CONSUME_FROM_FIRST_OFFSET")
    consumer.subscribe(TOPIC, "*")
    consumer.register_listener(listener)
    consumer.start()
    try:
        assert len(consumer.assignment()) == 4                  # held before start() returned
        assert env.admin.group_members("cg-all") == [consumer.client_id]
        with Producer("pg", env.client_config()) as producer:
            sent = {producer.send(Message(TOPIC, f"m{i}".encode(), tags="A" if i % 2 else "B")).msg_id
                    for i in range(60)}
        wait_until(lambda: len(got) >= 60, what="60 messages consumed")
        with lock:
            assert {m.msg_id for m in got} == sent and len(got) == 60
        maxima = env.max_offsets(TOPIC)
        wait_until(lambda: env.admin.group_offsets("cg-all", TOPIC) == maxima, what="offsets committed to the max")
        assert env.admin.group_lag("cg-all", TOPIC).total_lag == 0
    finally:
        consumer.shutdown()
    wait_until(lambda: env.admin.group_members("cg-all") == [], what="the consumer unregistered")


def test_consumers_and_a_producer_share_one_loop_and_a_stopped_consumer_leaves_the_others_running(
        env: Env) -> None:
    got_a, _lock_a, listener_a = _collector()
    got_b, lock_b, listener_b = _collector()
    a = PushConsumer("cg-share-a", env.client_config(), consume_from_where="CONSUME_FROM_FIRST_OFFSET")
    b = PushConsumer("cg-share-b", env.client_config(), consume_from_where="CONSUME_FROM_FIRST_OFFSET")
    for consumer, listener in ((a, listener_a), (b, listener_b)):
        consumer.subscribe(TOPIC, "*")
        consumer.register_listener(listener)
        consumer.start()
    try:
        with Producer("pg-share", env.client_config()) as producer:
            loops = {a._loop, b._loop}
            assert len(loops) == 1 and None not in loops  # one process-wide remoting loop
            assert [t.name for t in threading.enumerate() if t.name == "sparkmq-remoting"] == ["sparkmq-remoting"]
            for i in range(20):
                producer.send(Message(TOPIC, f"first-{i}".encode()))
            wait_until(lambda: len(got_a) >= 20 and len(got_b) >= 20, what="both groups got the first 20")
            a.shutdown()
            # a late callback or timer of the stopped consumer does not run on the shared loop
            ran: list[str] = []
            a._call_on_loop(ran.append, "callback")
            a._later(0.01, ran.append, "timer")
            for i in range(20):
                producer.send(Message(TOPIC, f"second-{i}".encode()))
            wait_until(lambda: len(got_b) >= 40, what="the other group got the next 20 too")
            with lock_b:
                assert {m.body for m in got_b} == {f"{w}-{i}".encode() for w in ("first", "second")
                                                   for i in range(20)}
            assert ran == [] and len(got_a) == 20
    finally:
        a.shutdown()
        b.shutdown()


def test_push_consumer_tag_filter_and_last_offset_start(env: Env) -> None:
    with Producer("pg", env.client_config()) as producer:
        for i in range(10):
            producer.send(Message(TOPIC, f"before-{i}".encode(), tags="A"))
        got, lock, listener = _collector()
        consumer = PushConsumer("cg-tags", env.client_config())      # CONSUME_FROM_LAST_OFFSET
        consumer.subscribe(TOPIC, "A || C")
        consumer.register_listener(listener)
        consumer.start()
        try:
            for i in range(30):
                producer.send(Message(TOPIC, f"after-{i}".encode(), tags="ABC"[i % 3]))
            wait_until(lambda: len(got) >= 20, what="20 matching messages")
            maxima = env.max_offsets(TOPIC)
            # Filtered messages still advance the committed offsets.
            wait_until(lambda: env.admin.group_offsets("cg-tags", TOPIC) == maxima, what="offsets at the max")
            with lock:
                assert sorted(m.body for m in got) == sorted(f"after-{i}".encode() for i in range(30) if i % 3 != 1)
                assert {m.tags for m in got} == {"A", "C"}
        finally:
            consumer.shutdown()


def test_committed_offset_is_the_smallest_unfinished(env: Env) -> None:
    env.create_topic("single", queues=1)
    release = threading.Event()
    blocked = threading.Event()
    done: list[int] = []
    lock = threading.Lock()

    def listener(msgs: list[ReceivedMessage]) -> ConsumeStatus:
        for m in msgs:
            if m.body == b"m3":
                blocked.set()
                release.wait(20)
            with lock:
                done.append(m.queue_offset)
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = PushConsumer("cg-slow", env.client_config(), consume_from_where="FIRST_OFFSET")
    consumer.subscribe("single")
    consumer.register_listener(listener)
    consumer.start()
    mq = MessageQueue("single", "broker-a", 0)
    try:
        with Producer("pg", env.client_config()) as producer:
            offsets = [producer.send(Message("single", f"m{i}".encode())).queue_offset for i in range(10)]
        assert offsets == list(range(10))
        assert blocked.wait(10)
        wait_until(lambda: len(done) == 9, what="every other message consumed")
        # Commits keep running (every 0.2 s) but cannot pass the message still in the listener.
        wait_until(lambda: env.admin.group_offsets("cg-slow").get(mq) == 3, what="offset 3 committed")
        pq = consumer.process_queue(mq)
        assert pq is not None and pq.in_flight_offsets() == [3] and pq.commit_offset() == 3
        assert env.admin.group_offsets("cg-slow")[mq] == 3
        release.set()
        wait_until(lambda: env.admin.group_offsets("cg-slow").get(mq) == 10, what="offset 10 committed")
    finally:
        release.set()
        consumer.shutdown()


def test_flow_control_stops_pulling_a_queue_that_is_not_consumed(env: Env) -> None:
    env.create_topic("busy", queues=1)
    release = threading.Event()

    def listener(msgs: list[ReceivedMessage]) -> ConsumeStatus:
        release.wait(20)
        return ConsumeStatus.CONSUME_SUCCESS

    with Producer("pg", env.client_config()) as producer:
        producer.send_batch([Message("busy", f"f{i}".encode()) for i in range(60)])
    consumer = PushConsumer("cg-busy", env.client_config(flow_control_max_messages=5, pull_batch_size=4,
                                                         consume_threads=2), consume_from_where="FIRST_OFFSET")
    consumer.subscribe("busy")
    consumer.register_listener(listener)
    consumer.start()
    mq = MessageQueue("busy", "broker-a", 0)
    try:
        pq = consumer.process_queue(mq)
        assert pq is not None
        wait_until(lambda: pq.flow_control_times >= 3, what="flow control to hold the queue")
        # Pulls stop once more than 5 are in flight; the last pull may have added up to a batch (4).
        assert 5 < pq.msg_count <= 9 and pq.next_offset <= 9
        release.set()
        wait_until(lambda: env.admin.group_offsets("cg-busy").get(mq) == 60, what="all 60 consumed and committed")
    finally:
        release.set()
        consumer.shutdown()


class _NoSendBack(PushConsumer):
    """A consumer whose broker refuses every send-back: refused messages must then be redelivered locally."""

    def send_message_back(self, msg: ReceivedMessage, reason: str = "RECONSUME_LATER") -> bool:
        return False


def test_refused_messages_are_redelivered_locally_when_send_back_fails(env: Env) -> None:
    env.create_topic("flaky", queues=1)
    attempts: dict[bytes, list[int]] = {}
    lock = threading.Lock()

    def listener(msgs: list[ReceivedMessage]) -> ConsumeStatus:
        m = msgs[0]
        with lock:
            attempts.setdefault(m.body, []).append(m.reconsume_times)
            n = len(attempts[m.body])
        if m.body == b"bad" and n == 1:
            raise RuntimeError("listener bug")
        if m.body == b"later" and n <= 2:
            return ConsumeStatus.RECONSUME_LATER
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = _NoSendBack("cg-flaky", env.client_config(), consume_from_where="FIRST_OFFSET")
    consumer.subscribe("flaky")
    consumer.register_listener(listener)
    consumer.start()
    mq = MessageQueue("flaky", "broker-a", 0)
    try:
        with Producer("pg", env.client_config()) as producer:
            for body in (b"ok-1", b"bad", b"later", b"ok-2"):
                producer.send(Message("flaky", body))
        wait_until(lambda: env.admin.group_offsets("cg-flaky").get(mq) == 4, what="all four finished")
        assert attempts[b"bad"] == [0, 1] and attempts[b"later"] == [0, 1, 2]
        assert attempts[b"ok-1"] == [0] and attempts[b"ok-2"] == [0]
        assert consumer.stats["redelivered"] == 3 and consumer.stats["consumed"] == 4
    finally:
        consumer.shutdown()


def test_two_push_consumers_split_the_queues(env: Env) -> None:
    got1, lock1, l1 = _collector()
    got2, lock2, l2 = _collector()
    # A periodic rebalance far beyond the test's waits: only the brokers' membership notices
    # (the /changes long poll) can explain the quick splits below.
    slow = env.client_config(rebalance_interval_s=120.0, heartbeat_interval_s=120.0)
    c1 = PushConsumer("cg-pair", slow, consume_from_where="FIRST_OFFSET")
    c2 = PushConsumer("cg-pair", slow, consume_from_where="FIRST_OFFSET")
    for c, listener in ((c1, l1), (c2, l2)):
        c.subscribe(TOPIC)
        c.register_listener(listener)
    c1.start()
    try:
        _split_then_leave(env, c1, c2, got1, got2)
    finally:
        c1.shutdown()


def _split_then_leave(env: Env, c1: PushConsumer, c2: PushConsumer, got1: list[ReceivedMessage],
                      got2: list[ReceivedMessage]) -> None:
    c2.start()
    try:
        def split() -> bool:
            a, b = set(c1.assignment()), set(c2.assignment())
            return len(a) == 2 and len(b) == 2 and not a & b
        wait_until(split, what="two queues each")
        with Producer("pg", env.client_config()) as producer:
            sent = {producer.send(Message(TOPIC, f"p{i}".encode())).msg_id for i in range(40)}
        wait_until(lambda: len(got1) + len(got2) >= 40, what="40 messages")
        ids1, ids2 = {m.msg_id for m in got1}, {m.msg_id for m in got2}
        assert ids1 | ids2 == sent and not ids1 & ids2 and ids1 and ids2
        assert {m.queue_id for m in got1} == {q.queue_id for q in c1.assignment()}
    finally:
        c2.shutdown()
    # c2 left (it unregistered): the notice makes c1 take all four queues.
    wait_until(lambda: len(c1.assignment()) == 4, what="c1 holds every queue")
    with Producer("pg", env.client_config()) as producer:
        producer.send(Message(TOPIC, b"after-leave"))
    wait_until(lambda: any(m.body == b"after-leave" for m in got1), what="c1 consumed the new message")


def test_broadcasting_consumers_each_get_everything(env: Env) -> None:
    consumers, collected = [], []
    for i in range(2):
        got, _, listener = _collector()
        c = PushConsumer("cg-bcast", env.client_config(offset_store_dir=env.tmp / f"bcast-{i}"),
                         message_model="BROADCASTING", consume_from_where="FIRST_OFFSET")
        c.subscribe(TOPIC)
        c.register_listener(listener)
        c.start()
        assert len(c.assignment()) == 4
        consumers.append(c)
        collected.append(got)
    try:
        with Producer("pg", env.client_config()) as producer:
            for i in range(20):
                producer.send(Message(TOPIC, f"b{i}".encode()))
        for got in collected:
            wait_until(lambda got=got: len(got) >= 20, what="every member got everything")
            assert sorted(m.body for m in got) == sorted(f"b{i}".encode() for i in range(20))
    finally:
        for c in consumers:
            c.shutdown()
    stored = json.loads((env.tmp / "bcast-0" / "cg-bcast" / "offsets.json").read_text())
    assert sum(stored["offsets"][TOPIC].values()) == 20
    assert env.admin.group_offsets("cg-bcast") == {}              # nothing on the broker


# -- pull consumer -------------------------------------------------------------------------------------

def _poll_until(consumer: PullConsumer, n: int, timeout: float = 10.0) -> list[ReceivedMessage]:
    out: list[ReceivedMessage] = []

    def enough() -> bool:
        if len(out) < n:
            out.extend(consumer.poll(0.5))
        return len(out) >= n
    wait_until(enough, timeout, lambda: f"{n} polled messages (got {len(out)})", interval=0)
    return out


def test_pull_consumer_poll_commit_and_seek(env: Env) -> None:
    with Producer("pg", env.client_config()) as producer:
        sent = [producer.send(Message(TOPIC, f"q{i}".encode())) for i in range(20)]
    consumer = PullConsumer("cg-pull", env.client_config(pull_batch_size=4), consume_from_where="FIRST_OFFSET",
                            auto_commit=False)
    queues = consumer.fetch_message_queues(TOPIC)
    consumer.assign(queues)
    consumer.start()
    try:
        assert consumer.assignment() == queues
        polled = _poll_until(consumer, 20)
        assert sorted(m.msg_id for m in polled) == sorted(r.msg_id for r in sent)
        assert env.admin.group_offsets("cg-pull") == {}            # nothing committed yet
        committed = consumer.commit()
        maxima = env.max_offsets(TOPIC)
        assert committed == maxima and env.admin.group_offsets("cg-pull") == maxima
        assert consumer.committed(queues[0]) == maxima[queues[0]]
        # Seek one queue back to its start: exactly its messages come again.
        consumer.seek(queues[0], 0)
        again = _poll_until(consumer, maxima[queues[0]])
        assert sorted(m.queue_offset for m in again) == list(range(maxima[queues[0]]))
        assert {m.queue_id for m in again} == {queues[0].queue_id}
        assert consumer.poll(0.3) == []
        with pytest.raises(SparkMQError) as err:
            consumer.seek(MessageQueue(TOPIC, "broker-z", 0), 0)
        assert err.value.code is ErrorCode.INVALID_ARGUMENT
        consumer.seek(queues[1], 1)
        consumer.commit()
        assert env.admin.group_offsets("cg-pull")[queues[1]] == 1   # a seek is committed as the new position
    finally:
        consumer.shutdown()


def test_pull_batches_above_the_flow_control_limit_drain_without_waiting_out_the_back_off(env: Env) -> None:
    """Every pull of 64 leaves a queue over ``flow_control_max_messages`` (8): each poll must wake its pull loop.

    With the back-off at an hour, the old fixed sleep per flow-controlled pull would never get past the first
    pull of each queue; the drain ending at all (well within ``_poll_until``'s 10 s) is the check.
    """
    with Producer("pg", env.client_config()) as producer:
        for _ in range(4):
            producer.send_batch([Message(TOPIC, f"f{i}".encode()) for i in range(100)])
    consumer = PullConsumer("cg-flow", env.client_config(pull_batch_size=64, flow_control_max_messages=8,
                                                         flow_control_backoff_s=3600.0),
                            consume_from_where="FIRST_OFFSET")
    consumer.subscribe(TOPIC)
    consumer.start()
    try:
        polled = _poll_until(consumer, 400)
        assert len(polled) == 400 and len({(m.queue_id, m.queue_offset) for m in polled}) == 400
    finally:
        consumer.shutdown()


def test_pull_consumer_subscribe_with_auto_commit(env: Env) -> None:
    consumer = PullConsumer("cg-lite", env.client_config(), consume_from_where="FIRST_OFFSET")
    consumer.subscribe(TOPIC)
    consumer.start()
    try:
        assert len(consumer.assignment()) == 4
        with Producer("pg", env.client_config()) as producer:
            for i in range(12):
                producer.send(Message(TOPIC, f"l{i}".encode()))
        polled = _poll_until(consumer, 12)
        assert sorted(m.body for m in polled) == sorted(f"l{i}".encode() for i in range(12))
        maxima = env.max_offsets(TOPIC)
        wait_until(lambda: env.admin.group_offsets("cg-lite") == maxima, what="auto-commit")
    finally:
        consumer.shutdown()


# -- name server failover -----------------------------------------------------------------------------

def test_clients_keep_working_with_one_name_server_down(procs: Any, tmp_path: Path) -> None:
    ns1, ns2 = procs.start_many([("namesrv", "sparkmq.api.namesrv_main", ["--scan-interval-s", "0.5"]),
                                 ("namesrv", "sparkmq.api.namesrv_main", ["--scan-interval-s", "0.5"])])
    procs.start("broker", "sparkmq.api.broker_main", "--data-dir", str(tmp_path / "b"),
                "--namesrv", f"{ns1.addr};{ns2.addr}", "--register-interval-s", "0.5")
    config = ClientConfig(namesrv_addrs=[ns1.addr, ns2.addr], request_timeout_s=2.0)
    with AdminClient(config) as admin:
        admin.create_topic("ha", 2, 2)
        wait_until(lambda: route_has(admin, "ha", 2), what="route via the first name server")
        ns1.kill9()
        with Producer("pg", config) as producer:
            assert producer.send(Message("ha", b"still here")).status is SendStatus.SEND_OK
        assert "ha" in admin.topic_list()                         # answered by the second name server
