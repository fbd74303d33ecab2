"""Issue 4's message features from the client side, against real processes (``tests/procs.py``).

One name server and one broker serve the whole module, started with test-sized timings: every
delay level 100 ms, transaction check-backs after 1 s and then every 1 s, queue locks expiring
after 3 s, silent clients dropped after 2 s.  Every test uses its own topics and groups.  Every wait waits
*for a condition*
with a deadline (``wait_until``); no sleep is an assertion.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from procs import ProcessHarness, child_env, fast_client_config, freeze, route_has, wait_until
from sparkmq.platform.client import (
    AdminClient,
    ClientConfig,
    ConsumeOrderlyStatus,
    ConsumeStatus,
    Message,
    MessageQueue,
    MessageSelector,
    Producer,
    PushConsumer,
    ReceivedMessage,
    TransactionProducer,
    TransactionState,
)
from sparkmq.platform.client.producer import select_by_sharding_key
from sparkmq.platform.client.remoting import BrokerClient
from sparkmq.platform.common.errors import ErrorCode, SparkMQError
from sparkmq.platform.common.system_topics import PROPERTY_DLQ_ORIGIN_TOPIC, PROPERTY_DLQ_REASON

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(60)]

TESTS = Path(__file__).parent



@dataclass
class Env:
    """The module's name server and broker, an admin client and a fast client config."""

    procs: ProcessHarness
    ns: Any
    broker: Any
    admin: AdminClient
    tmp: Path

    def client_config(self, **kw: Any) -> ClientConfig:
        return fast_client_config(self.ns.addr, self.tmp / "offsets", **kw)

    def create_topic(self, topic: str, queues: int = 4) -> None:
        self.admin.create_topic(topic, queues, queues)
        wait_until(lambda: route_has(self.admin, topic, queues), what=f"route of {topic}")

    def broker_client(self) -> BrokerClient:
        return BrokerClient(self.broker.addr, 5.0)


@pytest.fixture(scope="module")
def env(module_procs: ProcessHarness) -> Iterator[Env]:
    tmp = module_procs.work_dir
    ns, broker = module_procs.start_platform(
        tmp / "b", "--message-delay-level", " ".join(["100ms"] * 18), "--transaction-check-first-s", "1",
        "--transaction-check-interval-s", "1", "--queue-lock-expiry-s", "3", "--client-expiry-s", "2",
        "--client-scan-interval-s", "0.5")
    admin = AdminClient(ClientConfig(namesrv_addrs=ns.addr))
    yield Env(module_procs, ns, broker, admin, tmp)
    admin.close()


@pytest.fixture(autouse=True)
def no_leaked_threads() -> Iterator[None]:
    """Every client a test shut down has stopped its threads."""
    yield
    wait_until(lambda: not [t.name for t in threading.enumerate() if t.name.startswith("sparkmq-")],
             timeout=8, what="client threads to stop")


def _collector() -> tuple[list[ReceivedMessage], threading.Lock, Callable[[list[ReceivedMessage]], ConsumeStatus]]:
    got: list[ReceivedMessage] = []
    lock = threading.Lock()

    def listener(msgs: list[ReceivedMessage]) -> ConsumeStatus:
        with lock:
            got.extend(msgs)
        return ConsumeStatus.CONSUME_SUCCESS
    return got, lock, listener


# -- retry, dead letters, re-drive ------------------------------------------------------------------

def test_always_failing_message_is_retried_16_times_then_dead_lettered_and_redriven(env: Env) -> None:
    env.create_topic("ft-retry", queues=2)
    seen: list[tuple[str, str, int]] = []
    lock = threading.Lock()

    def failing(msgs: list[ReceivedMessage]) -> ConsumeStatus:
        with lock:
            seen.extend((m.topic, m.body.decode(), m.reconsume_times) for m in msgs)
        raise RuntimeError("poison message")

    consumer = PushConsumer("cg-ft-retry", env.client_config(), consume_from_where="FIRST_OFFSET")
    consumer.subscribe("ft-retry")
    consumer.register_listener(failing)
    consumer.start()
    assert "%RETRY%cg-ft-retry" in consumer.subscriptions
    try:
        with Producer("pg-ft", env.client_config()) as producer:
            sent = producer.send(Message("ft-retry", b"poison"))
        dead = wait_until(lambda: [m for m in env.admin.dlq_messages("cg-ft-retry")
                                 if m.properties.get("ORIGIN_MESSAGE_ID", m.msg_id) == sent.msg_id],
                        timeout=25, what="the message in the DLQ")
        time.sleep(0.5)  # would a 18th delivery happen?  (it must not)
        with lock:
            attempts = list(seen)
        # 1 + 16: the original delivery and 16 retries, each shown with its original topic and count.
        assert [(t, b) for t, b, _ in attempts] == [("ft-retry", "poison")] * 17
        assert [n for _, _, n in attempts] == list(range(17))
        assert consumer.stats["sent_back"] == 17 and consumer.stats["dlq"] == 1
        assert consumer.stats["redelivered"] == 0
    finally:
        consumer.shutdown()
    letter = dead[0]
    assert letter.properties[PROPERTY_DLQ_ORIGIN_TOPIC] == "ft-retry"
    assert "poison message" in letter.properties[PROPERTY_DLQ_REASON]
    assert letter.body == b"poison"

    # A healthy consumer of the group gets it back after the re-drive.
    got, glock, listener = _collector()
    healthy = PushConsumer("cg-ft-retry", env.client_config(), consume_from_where="FIRST_OFFSET")
    healthy.subscribe("ft-retry")
    healthy.register_listener(listener)
    healthy.start()
    try:
        result = env.admin.redrive("cg-ft-retry", msg_ids=[letter.msg_id])
        assert result["redriven"] == 1
        wait_until(lambda: [m for m in got if m.body == b"poison"], what="the re-driven message")
        with glock:
            back = [m for m in got if m.body == b"poison"]
        assert back[0].topic == "ft-retry"
    finally:
        healthy.shutdown()


def test_broadcasting_consumers_do_not_retry(env: Env) -> None:
    env.create_topic("ft-bcast", queues=1)
    calls: list[bytes] = []

    def failing(msgs: list[ReceivedMessage]) -> ConsumeStatus:
        calls.extend(m.body for m in msgs)
        return ConsumeStatus.RECONSUME_LATER

    consumer = PushConsumer("cg-ft-bcast", env.client_config(), message_model="BROADCASTING",
                            consume_from_where="FIRST_OFFSET")
    consumer.subscribe("ft-bcast")
    consumer.register_listener(failing)
    consumer.start()
    try:
        assert not any(t.startswith("%RETRY%") for t in consumer.subscriptions)
        with Producer("pg-ft", env.client_config()) as producer:
            producer.send(Message("ft-bcast", b"once"))
        wait_until(lambda: consumer.stats["dropped"] == 1, what="the refused broadcast message dropped")
        time.sleep(0.5)
        assert calls == [b"once"] and consumer.stats["sent_back"] == 0
    finally:
        consumer.shutdown()


# -- SQL92 -------------------------------------------------------------------------------------------

def test_sql92_subscription_delivers_exactly_the_matching_messages(env: Env) -> None:
    env.create_topic("ft-sql", queues=2)
    got, lock, listener = _collector()
    consumer = PushConsumer("cg-ft-sql", env.client_config(), consume_from_where="FIRST_OFFSET")
    consumer.subscribe("ft-sql", MessageSelector.by_sql("a > 5 AND region IN ('eu', 'us') OR name STARTSWITH 'x'"))
    consumer.register_listener(listener)
    consumer.start()
    try:
        assert consumer.subscription("ft-sql").to_dict()["type"] == "SQL92"
        expected = set()
        with Producer("pg-ft", env.client_config()) as producer:
            for i in range(40):
                props = {"a": str(i % 10), "region": ["eu", "us", "ap"][i % 3]}
                if i % 7 == 0:
                    props["name"] = "xy" if i % 2 else "zz"
                if (int(props["a"]) > 5 and props["region"] in ("eu", "us")) or props.get("name", "").startswith("x"):
                    expected.add(f"m{i}")
                producer.send(Message("ft-sql", f"m{i}".encode(), properties=props))
        wait_until(lambda: len(got) >= len(expected), what="the matching messages")
        time.sleep(0.5)  # anything extra would arrive by now
        with lock:
            bodies = [m.body.decode() for m in got]
        assert sorted(bodies) == sorted(expected)
    finally:
        consumer.shutdown()


def test_malformed_sql92_expression_is_refused_at_subscribe(env: Env) -> None:
    consumer = PushConsumer("cg-ft-sqlbad", env.client_config())
    with pytest.raises(SparkMQError) as info:
        consumer.subscribe("ft-sql", "a > AND b = 1", filter_type="SQL92")
    assert info.value.code is ErrorCode.FILTER_EXPRESSION_ILLEGAL
    assert "position" in info.value.message
    with pytest.raises(SparkMQError) as info:
        consumer.subscribe("ft-sql", "a = 1", filter_type="XPATH")
    assert info.value.code is ErrorCode.FILTER_EXPRESSION_ILLEGAL
    assert consumer.subscriptions == {}


# -- transactions ------------------------------------------------------------------------------------

def test_committed_transactions_are_delivered_rolled_back_never(env: Env) -> None:
    env.create_topic("ft-tx", queues=2)
    got, lock, listener = _collector()
    consumer = PushConsumer("cg-ft-tx", env.client_config(), consume_from_where="FIRST_OFFSET")
    consumer.subscribe("ft-tx")
    consumer.register_listener(listener)
    consumer.start()
    checked: list[str] = []

    def check(c: Any) -> TransactionState:
        checked.append(c.body.decode())
        return TransactionState.COMMIT

    def local(msg: Message, arg: Any) -> Any:
        if arg == "boom":
            raise RuntimeError("local transaction failed")
        return arg

    producer = TransactionProducer("pg-ft-tx", env.client_config(), check_listener=check, check_wait_ms=1000)
    producer.start()
    try:
        outcomes = {body: producer.send_message_in_transaction(Message("ft-tx", body.encode()), local, arg)
                    for body, arg in [("commit", TransactionState.COMMIT), ("rollback", "ROLLBACK"),
                                      ("unknown", TransactionState.UNKNOWN), ("boom", "boom")]}
        assert outcomes["boom"].local_state is TransactionState.UNKNOWN
        assert outcomes["rollback"].local_state is TransactionState.ROLLBACK
        # "unknown" and "boom" are settled by the check-backs (COMMIT).
        wait_until(lambda: {m.body for m in got} >= {b"commit", b"unknown", b"boom"}, timeout=15,
                 what="committed and checked-back messages")
        time.sleep(0.5)
        with lock:
            bodies = sorted(m.body.decode() for m in got)
        assert bodies == ["boom", "commit", "unknown"]
        assert set(checked) == {"unknown", "boom"}
        with pytest.raises(SparkMQError) as info:
            producer.end_transaction(outcomes["commit"].transaction_id, "COMMIT", broker_addr=env.broker.addr)
        assert info.value.code is ErrorCode.TRANSACTION_NOT_FOUND
        with pytest.raises(SparkMQError) as info:
            producer.end_transaction("no-such-transaction", "ROLLBACK", broker_addr=env.broker.addr)
        assert info.value.code is ErrorCode.TRANSACTION_NOT_FOUND
    finally:
        producer.shutdown()
        consumer.shutdown()


def test_check_backs_of_a_killed_producer_are_answered_by_a_new_one(env: Env) -> None:
    env.create_topic("ft-txkill", queues=2)
    bodies = ["commit-1", "rollback-1", "commit-2", "rollback-2"]
    child = env.procs.spawn("tx-producer", [sys.executable, str(TESTS / "tx_producer_child.py"), "--namesrv",
                                            env.ns.addr, "--group", "pg-ft-txkill", "--topic", "ft-txkill",
                                            "--bodies", *bodies], stdout=subprocess.PIPE).proc
    try:
        lines = []
        assert child.stdout is not None
        for line in child.stdout:
            event = json.loads(line)
            if event.get("e") == "sent":
                break
            lines.append(event)
        assert [e["body"] for e in lines] == bodies
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGKILL)
        child.wait(10)

    got, lock, listener = _collector()
    consumer = PushConsumer("cg-ft-txkill", env.client_config(), consume_from_where="FIRST_OFFSET")
    consumer.subscribe("ft-txkill")
    consumer.register_listener(listener)
    consumer.start()
    checked: list[str] = []

    def check(c: Any) -> TransactionState:
        checked.append(c.transaction_id)
        return TransactionState.COMMIT if c.body.startswith(b"commit") else TransactionState.ROLLBACK

    producer = TransactionProducer("pg-ft-txkill", env.client_config(), check_listener=check, check_wait_ms=1000)
    producer.start()
    try:
        wait_until(lambda: {m.body for m in got} >= {b"commit-1", b"commit-2"}, timeout=20,
                 what="the committed half messages of the killed producer")
        wait_until(lambda: set(checked) >= {e["tx"] for e in lines}, what="all four checked")
        time.sleep(0.5)
        with lock:
            assert sorted(m.body for m in got) == [b"commit-1", b"commit-2"]
    finally:
        producer.shutdown()
        consumer.shutdown()


# -- ordered consumption -----------------------------------------------------------------------------

ORDERS = 2000
STEPS = 3


def _send_step(producer: Producer, topic: str, queues: list[MessageQueue], step: int) -> None:
    """Step ``step`` of every order, each to the queue its order id maps to (one batch per queue)."""
    by_queue: dict[MessageQueue, list[Message]] = {}
    for n in range(ORDERS):
        key = f"order-{n}"
        by_queue.setdefault(select_by_sharding_key(queues, key), []).append(
            Message(topic, f"{key}:{step}".encode(), keys=(key,)))
    for mq, msgs in by_queue.items():
        for i in range(0, len(msgs), 256):
            producer.send_batch(msgs[i:i + 256], queue_selector=lambda qs, m, q=mq: q)


def _start_orderly_child(env: Env, name: str, out: Path) -> subprocess.Popen[str]:
    return env.procs.spawn("orderly", [sys.executable, str(TESTS / "orderly_child.py"), "--namesrv", env.ns.addr,
                                       "--group", "cg-ft-order", "--topic", "ft-order", "--name", name, "--out",
                                       str(out), "--sleep-ms", "2"], log_path=env.tmp / f"{name}.log").proc


def _events(out: Path) -> list[dict[str, Any]]:
    events = []
    for line in out.read_text().splitlines() if out.exists() else []:
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut by SIGKILL
            pass
    return events


def test_orderly_consumers_keep_every_orders_steps_in_order_through_joins_and_a_kill(env: Env) -> None:
    env.create_topic("ft-order", queues=8)
    out = env.tmp / "order-events.jsonl"
    lock = threading.Lock()

    def recorder(name: str) -> Callable[[list[ReceivedMessage]], ConsumeOrderlyStatus]:
        def listener(msgs: list[ReceivedMessage]) -> ConsumeOrderlyStatus:
            with lock, out.open("a") as f:
                for m in msgs:
                    time.sleep(0.0003)
                    key, _, step = m.body.decode().partition(":")
                    f.write(json.dumps({"c": name, "t": time.time_ns(), "k": key, "s": int(step)}) + "\n")
            return ConsumeOrderlyStatus.SUCCESS
        return listener

    def orderly(name: str) -> PushConsumer:
        c = PushConsumer("cg-ft-order", env.client_config(), consume_from_where="FIRST_OFFSET",
                         lock_interval_s=0.5, client_lock_expiry_s=2.0)
        c.subscribe("ft-order")
        c.register_listener_orderly(recorder(name))
        return c.start()

    children: list[subprocess.Popen[str]] = []
    local: list[PushConsumer] = []
    try:
        local.append(orderly("local-1"))
        children.append(_start_orderly_child(env, "child-1", out))
        children.append(_start_orderly_child(env, "child-2", out))
        wait_until(lambda: sum(1 for e in _events(out) if e.get("e") == "ready") == 2, timeout=20,
                 what="two child consumers")
        queues = sorted(env.admin.topic_route("ft-order").write_queues)
        with Producer("pg-ft-order", env.client_config()) as producer:
            _send_step(producer, "ft-order", queues, 1)
            wait_until(lambda: sum(1 for e in _events(out) if e.get("c") == "child-1" and "s" in e) > 100, timeout=20,
                     what="child-1 consuming")
            os.kill(children[0].pid, signal.SIGKILL)  # mid-run
            children[0].wait(10)
            _send_step(producer, "ft-order", queues, 2)
            local.append(orderly("local-2"))  # a consumer joins
            children.append(_start_orderly_child(env, "child-3", out))
            _send_step(producer, "ft-order", queues, 3)

        def complete() -> bool:
            return len({(e["k"], e["s"]) for e in _events(out) if "s" in e}) == ORDERS * STEPS
        try:
            wait_until(complete, timeout=40, what="every step of every order")
        except AssertionError:  # say who consumed what, and the children's logs, before failing
            per_consumer: dict[str, int] = {}
            for e in _events(out):
                if "s" in e:
                    per_consumer[e["c"]] = per_consumer.get(e["c"], 0) + 1
            print("per consumer", per_consumer, "assignments", [e for e in _events(out) if e.get("e") == "assign"])
            for name in ("child-1", "child-2", "child-3"):
                print(name, (env.tmp / f"{name}.log").read_text()[-3000:])
            raise
    finally:
        for c in local:
            c.shutdown()
        for child in children:
            if child.poll() is None:
                child.terminate()
        for child in children:
            try:
                child.wait(15)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait(5)

    events = sorted((e for e in _events(out) if "s" in e), key=lambda e: e["t"])
    highest: dict[str, int] = {}
    seen: set[tuple[str, int]] = set()
    duplicates = backwards = 0
    for e in events:
        key, step = e["k"], e["s"]
        if (key, step) in seen:
            duplicates += 1  # a redelivery (after the kill or a handover): allowed, counted
            continue
        if step < highest.get(key, 0):
            backwards += 1
        seen.add((key, step))
        highest[key] = max(highest.get(key, 0), step)
    print(f"ordered: {len(events)} deliveries, {duplicates} duplicates, {backwards} backwards")
    assert backwards == 0
    assert len(seen) == ORDERS * STEPS
    assert all(highest[f"order-{n}"] == STEPS for n in range(ORDERS))


def test_orderly_suspend_retries_the_same_messages_in_place(env: Env) -> None:
    env.create_topic("ft-suspend", queues=1)
    calls: list[tuple[float, list[str]]] = []

    counts: list[int] = []

    def listener(msgs: list[ReceivedMessage]) -> ConsumeOrderlyStatus:
        calls.append((time.monotonic(), [m.body.decode() for m in msgs]))
        if msgs[0].body == b"s-1":
            counts.append(msgs[0].reconsume_times)
        if msgs[0].body == b"s-1" and sum(1 for _, b in calls if b == ["s-1"]) < 3:
            return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
        return ConsumeOrderlyStatus.SUCCESS

    consumer = PushConsumer("cg-ft-suspend", env.client_config(), consume_from_where="FIRST_OFFSET",
                            suspend_current_queue_time_ms=300)
    consumer.subscribe("ft-suspend")
    consumer.register_listener_orderly(listener)
    with Producer("pg-ft", env.client_config()) as producer:
        for i in range(4):
            producer.send(Message("ft-suspend", f"s-{i}".encode()), sharding_key="k")
    consumer.start()
    try:
        wait_until(lambda: len(calls) == 6, what="s-0, s-1 three times, s-2, s-3")
        assert [b for _, b in calls] == [["s-0"], ["s-1"], ["s-1"], ["s-1"], ["s-2"], ["s-3"]]
        gaps = [calls[i + 1][0] - calls[i][0] for i in (1, 2)]
        assert min(gaps) >= 0.28
        assert consumer.stats["suspended"] == 2 and consumer.stats["consumed"] == 4
        assert counts == [0, 1, 2]   # each suspension counts as a reconsume
        wait_until(lambda: env.admin.group_offsets("cg-ft-suspend").get(MessageQueue("ft-suspend", "broker-a", 0)) == 4,
                 what="offset 4 committed")
    finally:
        consumer.shutdown()


def test_orderly_message_suspended_max_reconsume_times_goes_to_the_dlq(env: Env) -> None:
    """With max_reconsume_times set, an orderly consumer dead-letters a message it keeps suspending
    (RocketMQ's checkReconsumeTimes) and the queue moves on in order; by default it retries forever."""
    env.create_topic("ft-osusp", queues=1)
    seen: list[tuple[str, int]] = []

    def listener(msgs: list[ReceivedMessage]) -> ConsumeOrderlyStatus:
        seen.extend((m.body.decode(), m.reconsume_times) for m in msgs)
        return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT if msgs[0].body == b"poison" \
            else ConsumeOrderlyStatus.SUCCESS

    consumer = PushConsumer("cg-ft-osusp", env.client_config(), consume_from_where="FIRST_OFFSET",
                            suspend_current_queue_time_ms=100, max_reconsume_times=2)
    consumer.subscribe("ft-osusp")
    consumer.register_listener_orderly(listener)
    with Producer("pg-ft", env.client_config()) as producer:
        sent = [producer.send(Message("ft-osusp", body), sharding_key="k") for body in (b"a", b"poison", b"b")]
    consumer.start()
    try:
        wait_until(lambda: ("b", 0) in seen, what="the message after the poison one")
        assert seen == [("a", 0), ("poison", 0), ("poison", 1), ("poison", 2), ("b", 0)]
        dead = wait_until(lambda: env.admin.dlq_messages("cg-ft-osusp"), what="the poison message in the DLQ")
        assert [m.body for m in dead] == [b"poison"]
        assert dead[0].properties.get("ORIGIN_MESSAGE_ID", dead[0].msg_id) == sent[1].msg_id
        assert "suspended 3 times" in dead[0].properties[PROPERTY_DLQ_REASON]
        assert consumer.stats["dlq"] == 1 and consumer.stats["suspended"] == 3
        wait_until(lambda: env.admin.group_offsets("cg-ft-osusp").get(MessageQueue("ft-osusp", "broker-a", 0)) == 3,
                 what="offset 3 committed")
    finally:
        consumer.shutdown()


# -- offset reset ------------------------------------------------------------------------------------

def test_reset_by_offset_and_by_time_moves_a_running_group(env: Env) -> None:
    env.create_topic("ft-reset", queues=2)
    got, lock, listener = _collector()
    consumer = PushConsumer("cg-ft-reset", env.client_config(), consume_from_where="FIRST_OFFSET")
    consumer.subscribe("ft-reset")
    consumer.register_listener(listener)
    consumer.start()
    try:
        with Producer("pg-ft", env.client_config()) as producer:
            for i in range(10):
                producer.send(Message("ft-reset", f"first-{i}".encode()))
            wait_until(lambda: len(got) == 10, what="the first ten")
            time.sleep(0.02)
            boundary = int(time.time() * 1000)
            time.sleep(0.02)
            for i in range(6):
                producer.send(Message("ft-reset", f"second-{i}".encode()))
        wait_until(lambda: len(got) == 16, what="all sixteen")
        totals = {mq.queue_id: off for mq, off in env.admin.group_offsets("cg-ft-reset", "ft-reset").items()}
        wait_until(lambda: sum(env.admin.group_offsets("cg-ft-reset", "ft-reset").values()) == 16,
                 what="offsets committed")
        totals = {mq.queue_id: off for mq, off in env.admin.group_offsets("cg-ft-reset", "ft-reset").items()}

        # By offset: queue 0 back to 0 -> the running consumer consumes queue 0 again.
        with lock:
            got.clear()
        answer = env.admin.reset_offsets("cg-ft-reset", "ft-reset", offsets={"broker-a/0": 0})
        assert answer == {MessageQueue("ft-reset", "broker-a", 0): 0}
        wait_until(lambda: len(got) == totals[0], what="queue 0 again")
        time.sleep(0.3)
        with lock:
            assert len(got) == totals[0] and {m.queue_id for m in got} == {0}

        # By time: every queue to the first message stored after the boundary -> the second six again.
        with lock:
            got.clear()
        env.admin.reset_offsets("cg-ft-reset", "ft-reset", timestamp=boundary)
        wait_until(lambda: len(got) == 6, what="the second six again")
        time.sleep(0.3)
        with lock:
            assert sorted(m.body.decode() for m in got) == [f"second-{i}" for i in range(6)]
    finally:
        consumer.shutdown()
    with pytest.raises(SparkMQError) as info:
        env.admin.reset_offsets("cg-nobody-here", "ft-reset", timestamp=0)
    assert info.value.code is ErrorCode.GROUP_NOT_EXIST


def test_a_reset_is_not_undone_by_the_consumers_commit_of_its_old_progress(env: Env) -> None:
    """The race a reset must survive: the group's consumer (its own process, frozen with SIGSTOP so the order is
    sure) commits its old progress after the reset, before it heard of it.  The broker ignores that commit; when
    the consumer runs again it restarts at the reset offset and consumes from there."""
    env.create_topic("ft-fence", queues=1)
    queue = MessageQueue("ft-fence", "broker-a", 0)
    with Producer("pg-ft", env.client_config()) as producer:
        for i in range(10):
            producer.send(Message("ft-fence", f"m{i}".encode()), sharding_key="k")
    out = env.tmp / "fence-child.jsonl"
    child = env.procs.spawn("consumer", [sys.executable, str(TESTS / "consumer_child.py"), "--namesrv", env.ns.addr,
                                         "--group", "cg-ft-fence", "--topic", "ft-fence", "--out", str(out),
                                         "--from-where", "CONSUME_FROM_FIRST_OFFSET", "--interval-s", "0.3",
                                         "--offset-dir", str(env.tmp / "fo")],
                            stdout=subprocess.DEVNULL, log_path=env.tmp / "fence-child.log").proc

    def offsets_seen() -> list[int]:
        lines = out.read_text().splitlines() if out.exists() else []
        return [e["o"] for e in map(json.loads, lines) if e["e"] == "msg"]

    try:
        wait_until(lambda: sorted(offsets_seen()) == list(range(10)), 30, "all ten consumed")  # concurrently: any order
        wait_until(lambda: env.admin.group_offsets("cg-ft-fence").get(queue) == 10, 10, "offset 10 committed")
        freeze(child.pid)
        try:
            env.admin.reset_offsets("cg-ft-fence", "ft-fence", offsets={"broker-a/0": 4})
            client = env.broker_client()    # the consumer's commit of its old progress, in flight
            try:
                assert client.commit_offsets("cg-ft-fence", [{"topic": "ft-fence", "queue_id": 0, "offset": 10}]) == 0
            finally:
                client.close()
            assert env.admin.group_offsets("cg-ft-fence").get(queue) == 4
        finally:
            os.kill(child.pid, signal.SIGCONT)
        wait_until(lambda: sorted(offsets_seen()[10:]) == list(range(4, 10)), 20, "m4..m9 consumed again")
        wait_until(lambda: env.admin.group_offsets("cg-ft-fence").get(queue) == 10, 10, "offset 10 again")
    finally:
        child.terminate()
        assert child.wait(30) == 0


# -- delay and timer sends ---------------------------------------------------------------------------

def test_delay_level_and_timer_sends_and_recall(env: Env) -> None:
    env.create_topic("ft-delay", queues=1)
    got, lock, listener = _collector()
    consumer = PushConsumer("cg-ft-delay", env.client_config(), consume_from_where="FIRST_OFFSET")
    consumer.subscribe("ft-delay")
    consumer.register_listener(listener)
    consumer.start()
    try:
        with Producer("pg-ft", env.client_config()) as producer:
            delayed = producer.send(Message("ft-delay", b"delayed"), delay_level=2)
            assert delayed.queue_id == 1  # the parked copy's place: schedule queue of level 2
            timer = producer.send(Message("ft-delay", b"timer"), delay_ms=1500)
            recalled = producer.send(Message("ft-delay", b"recalled"), deliver_at_ms=int(time.time() * 1000) + 3000)
            with pytest.raises(SparkMQError) as info:
                producer.send(Message("ft-delay", b"x"), delay_level=1, delay_ms=5)
            assert info.value.code is ErrorCode.INVALID_ARGUMENT
        assert timer.msg_id and env.admin.recall_timer(recalled.msg_id)["recalled"] is True
        wait_until(lambda: {m.body for m in got} >= {b"delayed", b"timer"}, what="delayed and timer messages")
        time.sleep(3.5)
        with lock:
            assert sorted(m.body for m in got) == [b"delayed", b"timer"]
    finally:
        consumer.shutdown()


# -- CLI ---------------------------------------------------------------------------------------------

def _cli(env: Env, *args: str) -> Any:
    run = subprocess.run([sys.executable, "-m", "sparkmq.api.cli", *args], capture_output=True, text=True,
                         env=child_env(SPARKMQ_NAMESRV=env.ns.addr), timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    return json.loads(run.stdout)


def test_cli_dlq_list_redrive_and_offset_reset(env: Env) -> None:
    env.create_topic("ft-cli", queues=1)
    with Producer("pg-ft", env.client_config()) as producer:
        sent = [producer.send(Message("ft-cli", f"cli-{i}".encode())) for i in range(3)]
    broker = env.broker_client()
    try:
        # Straight to the DLQ (delay level -1), as a consumer that gives up would.
        for result in sent[:2]:
            answer = broker.send_back("cg-ft-cli", result.offset_msg_id, delay_level=-1, reason="cli test")
            assert answer["status"] == "DLQ"
        broker.commit_offsets("cg-ft-cli", [{"topic": "ft-cli", "queue_id": 0, "offset": 3}])
    finally:
        broker.close()
    letters = _cli(env, "admin", "--json", "dlq", "list", "cg-ft-cli")
    assert sorted(r["body"] for r in letters) == ["cli-0", "cli-1"]
    assert {r["origin_topic"] for r in letters} == {"ft-cli"} and {r["reason"] for r in letters} == {"cli test"}
    redriven = _cli(env, "admin", "--json", "dlq", "redrive", "cg-ft-cli", "--msg-id", letters[0]["msg_id"])
    assert redriven["redriven"] == 1
    assert env.admin.topic_stats("ft-cli")[0].max_offset == 4
    everything = _cli(env, "admin", "--json", "dlq", "redrive", "cg-ft-cli", "--all")
    assert everything["redriven"] == 2
    reset = _cli(env, "admin", "--json", "offset", "reset", "cg-ft-cli", "ft-cli", "--to-offset", "broker-a/0=1")
    assert reset == [{"topic": "ft-cli", "broker": "broker-a", "queue_id": 0, "offset": 1}]
    assert env.admin.group_offsets("cg-ft-cli", "ft-cli") == {MessageQueue("ft-cli", "broker-a", 0): 1}
    by_time = _cli(env, "admin", "--json", "offset", "reset", "cg-ft-cli", "ft-cli", "--timestamp", "0")
    assert by_time == [{"topic": "ft-cli", "broker": "broker-a", "queue_id": 0, "offset": 0}]
    produced = _cli(env, "produce", "ft-cli", "--json", "--body", "later", "--delay-level", "1")
    assert produced[0]["status"] == "SEND_OK"
    with Producer("pg-ft", env.client_config()) as producer:
        producer.send(Message("ft-cli", b"eu-one", properties={"region": "eu"}))
        producer.send(Message("ft-cli", b"us-one", properties={"region": "us"}))
    run = subprocess.run([sys.executable, "-m", "sparkmq.api.cli", "consume", "ft-cli", "--group", "cg-ft-cli-sql",
                          "--sql", "region = 'eu'", "--json", "--timeout", "2"], capture_output=True, text=True,
                         env=child_env(SPARKMQ_NAMESRV=env.ns.addr), timeout=60)
    assert run.returncode == 0, run.stderr
    assert [json.loads(line)["body"] for line in run.stdout.splitlines()] == ["eu-one"]
    bad = subprocess.run([sys.executable, "-m", "sparkmq.api.cli", "consume", "ft-cli", "--sql", "region =", "--json"],
                         capture_output=True, text=True, env=child_env(SPARKMQ_NAMESRV=env.ns.addr), timeout=60)
    assert bad.returncode == 1 and json.loads(bad.stdout)["code"] == "FILTER_EXPRESSION_ILLEGAL"
