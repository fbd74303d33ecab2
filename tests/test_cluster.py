"""Core messaging across real processes: 2 name servers, 2 brokers, producers, consumer processes.

Every interval is shortened (heartbeats 0.5 s, broker expiry 4 s, client expiry 3 s) so the
failure cases finish in seconds; the code paths are the production ones.
"""
from __future__ import annotations

import collections
import json
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from procs import ProcessHarness, ServiceProcess, broker_restart_ports, wait_until
from sparkmq.platform.client.admin import AdminClient
from sparkmq.platform.client.config import ClientConfig
from sparkmq.platform.client.producer import Producer
from sparkmq.platform.client.pull_consumer import PullConsumer
from sparkmq.platform.client.push_consumer import ConsumeStatus, PushConsumer
from sparkmq.platform.common.errors import ErrorCode, SparkMQError
from sparkmq.platform.common.message import Message

pytestmark = pytest.mark.cluster

TOPIC = "Topic1"
BROKER_EXPIRY_S = 4.0
CLIENT_EXPIRY_S = 3.0
INTERVAL_S = 0.5
CHILD = str(Path(__file__).with_name("consumer_child.py"))


@dataclass
class Cluster:
    """Running name servers and brokers, plus how to start more."""

    procs: ProcessHarness
    tmp: Path
    namesrvs: list[ServiceProcess]
    brokers: dict[str, ServiceProcess]

    @property
    def namesrv_addrs(self) -> str:
        return ";".join(ns.addr for ns in self.namesrvs)

    def client_config(self, **overrides: Any) -> ClientConfig:
        settings = dict(namesrv_addrs=self.namesrv_addrs, route_refresh_interval_s=INTERVAL_S,
                        heartbeat_interval_s=INTERVAL_S, rebalance_interval_s=2 * INTERVAL_S,
                        offset_commit_interval_s=INTERVAL_S, long_poll_wait_ms=2000, change_wait_ms=2000,
                        fault_detect_interval_s=INTERVAL_S, request_timeout_s=2.0,
                        offset_store_dir=str(self.tmp / "local-offsets"))
        settings.update(overrides)
        return ClientConfig(**settings)

    def broker_args(self, name: str) -> list[str]:
        return ["--data-dir", str(self.tmp / name), "--broker-name", name, "--namesrv", self.namesrv_addrs,
                "--register-interval-s", str(INTERVAL_S), "--client-expiry-s", str(CLIENT_EXPIRY_S),
                "--client-scan-interval-s", str(INTERVAL_S),
                "--offset-persist-interval-s", str(INTERVAL_S), "--long-polling-max-ms", "5000"]

    def start_broker(self, name: str, *extra: str) -> ServiceProcess:
        broker = self.procs.start("broker", "sparkmq.api.broker_main", *self.broker_args(name), *extra)
        self.brokers[name] = broker
        return broker

    def live_brokers(self, ns: ServiceProcess) -> set[str]:
        info = httpx.get(f"{ns.url}/cluster", timeout=5).json()
        return set(info["live_brokers"])


@pytest.fixture
def cluster(procs: ProcessHarness, tmp_path: Path) -> Iterator[Cluster]:
    namesrvs = procs.start_many([("namesrv", "sparkmq.api.namesrv_main",
                                  ["--scan-interval-s", "0.5", "--broker-expiry-s", str(BROKER_EXPIRY_S)])] * 2)
    c = Cluster(procs, tmp_path, namesrvs, {})
    specs = [("broker", "sparkmq.api.broker_main", c.broker_args(name)) for name in ("broker-a", "broker-b")]
    for name, broker in zip(("broker-a", "broker-b"), procs.start_many(specs), strict=True):
        c.brokers[name] = broker
    addrs = {b.addr for b in c.brokers.values()}
    for ns in namesrvs:
        wait_until(lambda ns=ns: c.live_brokers(ns) >= addrs, 20, "both brokers registered")
    admin = AdminClient(c.client_config())
    try:
        admin.create_topic(TOPIC, read_queue_nums=3, write_queue_nums=3)
    finally:
        admin.close()
    for ns in namesrvs:  # the route reaches every name server with the next registration
        wait_until(lambda ns=ns: _route_queue_count(ns) == 6, 20, "the topic's route")
    yield c


def _route_queue_count(ns: ServiceProcess) -> int:
    answer = httpx.get(f"{ns.url}/routes/{TOPIC}", timeout=5)
    if answer.status_code != 200:
        return 0
    return sum(q["write_queue_nums"] for q in answer.json()["queue_datas"])


class ConsumerChild:
    """A ``consumer_child.py`` process and what it reported."""

    def __init__(self, cluster: Cluster, group: str, name: str, *args: str) -> None:
        self.out = cluster.tmp / f"{group}-{name}.jsonl"
        argv = [sys.executable, CHILD, "--namesrv", cluster.namesrv_addrs, "--group", group, "--topic", TOPIC,
                "--out", str(self.out), "--interval-s", str(INTERVAL_S), "--offset-dir", str(cluster.tmp / name), *args]
        self.proc = cluster.procs.spawn("consumer", argv, log_path=cluster.tmp / f"{group}-{name}.log").proc

    def events(self) -> list[dict[str, Any]]:
        if not self.out.exists():
            return []
        lines = self.out.read_text().splitlines()
        return [json.loads(line) for line in lines if line.endswith("}")]

    def ready(self) -> bool:
        return any(e["e"] == "ready" for e in self.events())

    def assignment(self) -> list[str]:
        assigns = [e["queues"] for e in self.events() if e["e"] == "assign"]
        return assigns[-1] if assigns else []

    def received(self) -> list[str]:
        return [e["id"] for e in self.events() if e["e"] == "msg"]


def _stable_split(children: list[ConsumerChild], total: int = 6) -> bool:
    """Every queue owned by exactly one live child, and every child's share within one of the others'."""
    shares = [c.assignment() for c in children]
    owned = [q for share in shares for q in share]
    return len(owned) == total and len(set(owned)) == total and max(map(len, shares)) - min(map(len, shares)) <= 1


def _send(producer: Producer, count: int, tag: str) -> dict[str, str]:
    """Send ``count`` messages; returns msg id -> "broker/queue"."""
    sent = {}
    for i in range(count):
        result = producer.send(Message(TOPIC, f"{tag}-{i}".encode(), tags=tag))
        sent[result.msg_id] = f"{result.broker_name}/{result.queue_id}"
    return sent


def test_spread_clustering_exactly_once_then_rebalance_and_broadcast(cluster: Cluster) -> None:
    producer = Producer("pg", cluster.client_config()).start()
    try:
        # The producer spreads evenly over all 6 write queues of the two brokers.
        warm = _send(producer, 600, "warm")
        per_queue = collections.Counter(warm.values())
        assert len(per_queue) == 6 and set(per_queue.values()) == {100}, per_queue

        group = [ConsumerChild(cluster, "g-cluster", f"c{i}") for i in range(2)]
        wait_until(lambda: _stable_split(group), 30, "2 consumers to split the 6 queues")
        phase1 = _send(producer, 300, "p1")
        wait_until(lambda: set(phase1) <= {m for c in group for m in c.received()}, 30, "phase 1 consumed")
        got = [m for c in group for m in c.received() if m in phase1]
        assert len(got) == len(phase1), "a message was delivered twice while membership was stable"

        group.append(ConsumerChild(cluster, "g-cluster", "c2"))
        wait_until(lambda: _stable_split(group) and all(len(c.assignment()) == 2 for c in group), 30,
                   "3 consumers to take 2 queues each")
        time.sleep(3 * INTERVAL_S)  # let the old owners' in-flight pulls drain before counting exactly-once
        phase2 = _send(producer, 300, "p2")
        wait_until(lambda: set(phase2) <= {m for c in group for m in c.received()}, 30, "phase 2 consumed")
        got = [m for c in group for m in c.received() if m in phase2]
        assert len(got) == len(phase2), "a message was delivered twice while membership was stable"
        assert all(any(m in phase2 for m in c.received()) for c in group), "a member got no messages"

        # Broadcasting: every member gets every message.
        fans = [ConsumerChild(cluster, "g-broadcast", f"b{i}", "--model", "BROADCASTING") for i in range(2)]
        wait_until(lambda: all(len(f.assignment()) == 6 for f in fans), 30, "broadcast members to own all queues")
        phase3 = _send(producer, 120, "p3")
        for fan in fans:
            wait_until(lambda fan=fan: set(phase3) <= set(fan.received()), 30, "broadcast delivery")
            assert sorted(m for m in fan.received() if m in phase3) == sorted(phase3)
    finally:
        producer.shutdown()


@pytest.mark.parametrize("strategy", ["averagely", "averagely-by-circle", "consistent-hash"])
def test_each_strategy_gives_every_queue_to_exactly_one_member(cluster: Cluster, strategy: str) -> None:
    config = cluster.client_config()
    members = []
    try:
        for _ in range(4):
            consumer = PushConsumer(f"g-{strategy}", config, allocate_strategy=strategy)
            consumer.subscribe(TOPIC)
            consumer.register_listener(lambda batch: ConsumeStatus.CONSUME_SUCCESS)
            members.append(consumer.start())

        def split() -> bool:
            owned = [q for m in members for q in m.assignment()]
            return len(owned) == 6 and len(set(owned)) == 6

        wait_until(split, 30, f"{strategy}: every queue owned once")
        # Each member computed its share alone; recomputing from the same sorted view gives the same split.
        from sparkmq.platform.client.allocation import strategy_by_name

        queues = sorted(q for m in members for q in m.assignment())
        ids = sorted(m.client_id for m in members)
        alloc = strategy_by_name(strategy)
        for m in members:
            assert sorted(alloc.allocate(m.group, m.client_id, queues, ids)) == sorted(m.assignment())
    finally:
        for m in members:
            m.shutdown()


def test_a_killed_consumer_loses_its_queues_to_the_others_and_nothing_is_lost(cluster: Cluster) -> None:
    producer = Producer("pg-kill", cluster.client_config()).start()
    group = [ConsumerChild(cluster, "g-kill", f"k{i}") for i in range(3)]
    try:
        wait_until(lambda: _stable_split(group), 30, "3 consumers to split the queues")
        sent: dict[str, str] = {}
        stop = threading.Event()

        def keep_sending() -> None:
            i = 0
            while not stop.is_set():
                result = producer.send(Message(TOPIC, b"k-%d" % i, tags="k"))
                sent[result.msg_id] = f"{result.broker_name}/{result.queue_id}"
                i += 1
                time.sleep(0.005)

        sender = threading.Thread(target=keep_sending)
        sender.start()
        time.sleep(2)
        victim, survivors = group[0], group[1:]
        victim_queues = set(victim.assignment())
        victim.proc.kill()
        victim.proc.wait()
        killed_at = time.monotonic()
        wait_until(lambda: victim_queues <= {q for c in survivors for q in c.assignment()}
                   and _stable_split(survivors), 30, "the victim's queues to move")
        moved = time.monotonic() - killed_at
        time.sleep(1)
        stop.set()
        sender.join()
        # The broker notices after the client expiry (+ one scan); the others then rebalance at once on
        # the change notice, at the latest one rebalance interval later.  Plus slack for a busy machine.
        assert moved <= CLIENT_EXPIRY_S + INTERVAL_S + 2 * INTERVAL_S + 2.0, f"took {moved:.1f} s"
        wait_until(lambda: set(sent) <= {m for c in group for m in c.received()}, 30, "every message consumed")
        counts = collections.Counter(m for c in group for m in c.received() if m in sent)
        duplicates = sum(n - 1 for n in counts.values())
        print(f"sent {len(sent)}, duplicates after the kill: {duplicates}, moved in {moved:.1f} s "
              f"({time.monotonic() - killed_at:.1f} s since the kill)")
        assert len(counts) == len(sent)
    finally:
        producer.shutdown()


def test_a_killed_broker_and_a_dead_name_server_do_not_stop_clients(cluster: Cluster) -> None:
    config = cluster.client_config(send_timeout_s=5.0)
    producer = Producer("pg-failover", config).start()
    received: set[str] = set()
    lock = threading.Lock()

    def listener(batch: list[Any]) -> ConsumeStatus:
        with lock:
            received.update(m.msg_id for m in batch)
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = PushConsumer("g-failover", config)
    consumer.subscribe(TOPIC)
    consumer.register_listener(listener)
    consumer.start()
    try:
        wait_until(lambda: len(consumer.assignment()) == 6, 30, "the consumer to own all queues")
        before = _send(producer, 60, "before")
        cluster.brokers["broker-b"].kill9()
        # Sends keep succeeding: failures on broker-b are retried on broker-a, then broker-b is avoided.
        after = _send(producer, 120, "after")
        assert {q.split("/")[0] for q in list(after.values())[-60:]} == {"broker-a"}
        for ns in cluster.namesrvs:
            wait_until(lambda ns=ns: cluster.brokers["broker-b"].addr not in cluster.live_brokers(ns),
                       BROKER_EXPIRY_S + 5, "the name servers to drop broker-b")
            route = httpx.get(f"{ns.url}/routes/{TOPIC}", timeout=5).json()
            assert [q["broker_name"] for q in route["queue_datas"]] == ["broker-a"]
        # One name server down: routes still come from the other.
        cluster.namesrvs[0].kill9()
        time.sleep(2 * INTERVAL_S)
        late = _send(producer, 30, "late")
        want = {m for m, q in {**before, **after, **late}.items() if q.startswith("broker-a")}
        wait_until(lambda: want <= received, 30, "broker-a's messages consumed")
        assert producer.route(TOPIC).write_queues and all(q.broker_name == "broker-a"
                                                          for q in producer.route(TOPIC).write_queues)
    finally:
        consumer.shutdown()
        producer.shutdown()


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
def test_offsets_survive_a_broker_restart(cluster: Cluster, how: str) -> None:
    config = cluster.client_config()
    producer = Producer("pg-restart", config).start()
    try:
        first = _send(producer, 120, "first")
        consumer = PullConsumer("g-restart", config, consume_from_where="CONSUME_FROM_FIRST_OFFSET")
        consumer.subscribe(TOPIC)
        consumer.start()
        seen: list[str] = []
        wait_until(lambda: seen.extend(m.msg_id for m in consumer.poll(0.5)) or set(first) <= set(seen), 30,
                   "the first messages")
        committed = consumer.commit()
        consumer.shutdown()
        broker = cluster.brokers["broker-a"]
        time.sleep(3 * INTERVAL_S)  # past the persist interval: the offsets are in the Delta table
        if how == "sigkill":
            broker.kill9()
        else:
            assert broker.stop() == 0
        restarted = cluster.start_broker("broker-a", *broker_restart_ports(broker.port))
        wait_until(lambda: all(restarted.addr in cluster.live_brokers(ns) for ns in cluster.namesrvs), 20,
                   "broker-a registered again")
        table = httpx.get(f"{restarted.url}/consumers/g-restart/offsets", params={"topic": TOPIC}, timeout=5).json()
        expected = {str(mq.queue_id): off for mq, off in committed.items() if mq.broker_name == "broker-a"}
        assert table["offsets"][TOPIC] == expected

        second = _send(producer, 60, "second")
        consumer = PullConsumer("g-restart", config)
        consumer.subscribe(TOPIC)
        consumer.start()
        again: list[str] = []
        wait_until(lambda: again.extend(m.msg_id for m in consumer.poll(0.5)) or set(second) <= set(again), 30,
                   "the messages sent after the restart")
        consumer.shutdown()
        assert not set(again) & set(first), "consumption restarted from the beginning"
    finally:
        producer.shutdown()


def test_perm_4_refuses_sends_and_perm_2_refuses_pulls(cluster: Cluster) -> None:
    admin = AdminClient(cluster.client_config())
    producer = Producer("pg-perm", cluster.client_config()).start()
    try:
        admin.create_topic("ReadOnly", read_queue_nums=2, write_queue_nums=2, perm=4)
        admin.create_topic("WriteOnly", read_queue_nums=2, write_queue_nums=2, perm=2)
        broker = cluster.brokers["broker-a"]
        answer = httpx.post(f"{broker.url}/topics/ReadOnly/messages", json={"body": "x"}, timeout=5)
        assert answer.status_code == 403 and answer.json()["code"] == "NO_PERMISSION"
        answer = httpx.get(f"{broker.url}/topics/WriteOnly/queues/0/messages", params={"offset": 0}, timeout=5)
        assert answer.status_code == 403 and answer.json()["code"] == "NO_PERMISSION"
        with pytest.raises(SparkMQError) as err:
            producer.send(Message("ReadOnly", b"x"))
        assert err.value.code in (ErrorCode.NO_PERMISSION, ErrorCode.TOPIC_NOT_EXIST)
        assert producer.send(Message("WriteOnly", b"ok")).topic == "WriteOnly"
        stats = admin.topic_stats("ReadOnly")
        assert all(s.max_offset == 0 for s in stats), "a refused send changed the queue"
    finally:
        producer.shutdown()
        admin.close()


def test_the_gateway_routes_plain_http_sends_over_both_brokers_and_around_a_dead_one(cluster: Cluster) -> None:
    gateway = cluster.procs.start("gateway", "sparkmq.api.gateway_main", "--namesrv", cluster.namesrv_addrs)
    with httpx.Client(base_url=gateway.url, timeout=10) as http:
        where = collections.Counter()
        for i in range(60):
            answer = http.post(f"/topics/{TOPIC}/messages", json={"body": f"via gateway {i}", "tags": "gw"})
            assert answer.status_code == 200, answer.text
            where[answer.json()["broker_name"]] += 1
        assert where == {"broker-a": 30, "broker-b": 30}
        batch = http.post(f"/topics/{TOPIC}/batch", json={"messages": [{"body": "b1"}, {"body": "b2"}]})
        assert batch.status_code == 200 and [r["queue_offset"] for r in batch.json()["results"]][1] > 0
        bad = http.post(f"/topics/{TOPIC}/messages", json={"body": "x", "queue_id": 1})
        assert bad.status_code == 400 and bad.json()["code"] == "INVALID_ARGUMENT"
        cluster.brokers["broker-b"].kill9()
        for i in range(20):  # the caller never sees the dead broker
            answer = http.post(f"/topics/{TOPIC}/messages", json={"body": f"after {i}"})
            assert answer.status_code == 200, answer.text
        assert answer.json()["broker_name"] == "broker-a"
