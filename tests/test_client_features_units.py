"""Issue 4's client pieces without processes: selectors, schedule options, transaction states, retry display."""
from __future__ import annotations

import json

import httpx
import pytest

from sparkmq.platform.client import (
    AdminClient,
    ClientConfig,
    MessageQueue,
    MessageSelector,
    ProcessQueue,
    PushConsumer,
    ReceivedMessage,
    Subscription,
    TransactionState,
)
from sparkmq.platform.client.producer import _schedule_fields
from sparkmq.platform.client.remoting import BrokerClient
from sparkmq.platform.client.transaction_producer import _state
from sparkmq.platform.common.errors import ErrorCode, SparkMQError

CFG = ClientConfig(namesrv_addrs="127.0.0.1:1")


def test_sql92_subscription_compiles_at_parse_and_says_where_it_is_wrong() -> None:
    sub = Subscription.parse("t", " a BETWEEN 1 AND 3 ", "sql92")
    assert sub.filter_type == "SQL92" and sub.tags is None and sub.matches("anything")
    assert sub.to_dict() == {"topic": "t", "expression": "a BETWEEN 1 AND 3", "type": "SQL92"}
    with pytest.raises(SparkMQError) as info:
        Subscription.parse("t", "a BETWEEN 1", "SQL92")
    assert info.value.code is ErrorCode.FILTER_EXPRESSION_ILLEGAL and "column" in info.value.message
    assert Subscription.parse("t", "B || A").to_dict() == {"topic": "t", "expression": "A || B", "type": "TAG"}


def test_consumer_subscribe_takes_a_selector_and_refuses_bad_sql() -> None:
    consumer = PushConsumer("cg", CFG)
    consumer.subscribe("t", MessageSelector.by_sql("region = 'eu'"))
    consumer.subscribe("u", MessageSelector.by_tag("A || B"))
    assert consumer.subscription("t").filter_type == "SQL92"
    assert consumer.subscriptions == {"t": "region = 'eu'", "u": "A || B"}
    with pytest.raises(SparkMQError) as info:
        consumer.subscribe("v", "region = ", filter_type="SQL92")
    assert info.value.code is ErrorCode.FILTER_EXPRESSION_ILLEGAL and "v" not in consumer.subscriptions
    body = consumer.heartbeat_body()["consumers"][0]["subscriptions"]
    assert [s["type"] for s in body] == ["SQL92", "TAG"]


def test_sql92_pulls_send_the_type_and_expression() -> None:
    seen = {}

    def handler(request: httpx.Request) -> httpx.Response:
        seen.update(request.url.params)
        return httpx.Response(200, json={"status": "NO_NEW_MSG", "next_offset": 0, "messages": []})

    client = BrokerClient("127.0.0.1:1", 1.0, transport=httpx.MockTransport(handler))
    client.pull("t", 0, 0, filter_type="SQL92", expression="a > 1")
    assert seen["filter_type"] == "SQL92" and seen["expression"] == "a > 1" and seen["tags"] == "*"
    seen.clear()  # the second request's parameters alone
    client.pull("t", 0, 0, tags="A")
    assert seen["tags"] == "A" and "filter_type" not in seen and "expression" not in seen, seen
    client.close()


def test_schedule_fields_allow_one_option() -> None:
    assert _schedule_fields(None, None, None) == {}
    assert _schedule_fields(None, 1_700_000_000_000, None) == {"deliver_at_ms": 1_700_000_000_000}
    for bad in ((0, None, None), (1, 5, None), (None, None, -1), (True, None, None)):
        with pytest.raises(SparkMQError) as info:
            _schedule_fields(*bad)
        assert info.value.code is ErrorCode.INVALID_ARGUMENT


def test_transaction_states_accept_rocketmq_spellings_and_default_to_unknown() -> None:
    assert _state("COMMIT_MESSAGE") is TransactionState.COMMIT
    assert _state(TransactionState.ROLLBACK) is TransactionState.ROLLBACK
    assert _state("rollback") is TransactionState.ROLLBACK
    assert _state(None) is TransactionState.UNKNOWN and _state("maybe") is TransactionState.UNKNOWN


def test_retry_messages_show_their_original_topic_and_count() -> None:
    msg = ReceivedMessage("%RETRY%cg", "broker-a", 0, 3, "id", "oid", b"x",
                          properties={"RETRY_TOPIC": "orders", "RECONSUME_TIME": "2"})
    msg.restore_retry_origin()
    assert msg.topic == "orders" and msg.reconsume_times == 2
    plain = ReceivedMessage("orders", "broker-a", 0, 3, "id", "oid", b"x", reconsume_times=1)
    plain.restore_retry_origin()
    assert plain.topic == "orders" and plain.reconsume_times == 1


def test_process_queue_head_is_the_smallest_offsets_in_order() -> None:
    mq = MessageQueue("t", "broker-a", 0)
    pq = ProcessQueue(mq, 0)
    msgs = [ReceivedMessage("t", "broker-a", 0, o, f"id{o}", "", b"x") for o in range(5)]
    pq.on_pulled(msgs, 5)
    assert [m.queue_offset for m in pq.head(2)] == [0, 1]
    pq.remove(msgs[:2])
    assert [m.queue_offset for m in pq.head(10)] == [2, 3, 4]


def test_push_consumer_checks_its_retry_and_orderly_settings() -> None:
    with pytest.raises(SparkMQError):
        PushConsumer("cg", CFG, max_reconsume_times=-1)
    with pytest.raises(SparkMQError):
        PushConsumer("cg", CFG, lock_interval_s=0)
    consumer = PushConsumer("cg", CFG, max_reconsume_times=3)
    consumer.register_listener_orderly(lambda msgs: "SUCCESS")
    assert consumer.orderly and consumer.max_reconsume_times == 3 and consumer.orderly_max_reconsume_times == 3
    default = PushConsumer("cg", CFG)   # RocketMQ: 16 send-backs when concurrent, no limit when orderly
    assert default.max_reconsume_times == 16 and default.orderly_max_reconsume_times is None


def test_admin_reset_offsets_sends_each_broker_its_queues() -> None:
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/cluster":
            return httpx.Response(200, json={"clusters": {"c": ["broker-a", "broker-b"]}, "brokers": {
                "broker-a": {"broker_addrs": {"0": "a:1"}}, "broker-b": {"broker_addrs": {"0": "b:1"}}}})
        if request.url.path.startswith("/routes/"):
            return httpx.Response(200, json={"queue_datas": [
                {"broker_name": n, "read_queue_nums": 2, "write_queue_nums": 2, "perm": 6}
                for n in ("broker-a", "broker-b")],
                "broker_datas": [{"broker_name": n, "cluster": "c", "broker_addrs": {"0": f"{n[-1]}:1"}}
                                 for n in ("broker-a", "broker-b")]})
        body = json.loads(request.content)
        calls.append((request.url.host, body))
        return httpx.Response(200, json={"group": "cg", "topic": "t", "offsets": body.get("offsets") or {"0": 7}})

    admin = AdminClient(CFG, transport=httpx.MockTransport(handler))
    try:
        out = admin.reset_offsets("cg", "t", offsets={"broker-b/1": 4, MessageQueue("t", "broker-a", 0): 2})
        assert out == {MessageQueue("t", "broker-a", 0): 2, MessageQueue("t", "broker-b", 1): 4}
        assert sorted(calls, key=lambda c: c[0]) == [("a", {"topic": "t", "offsets": {"0": 2}}),
                                                     ("b", {"topic": "t", "offsets": {"1": 4}})]
        for bad in ({"timestamp": None, "offsets": None}, {"timestamp": 1, "offsets": {"broker-a/0": 1}},
                    {"offsets": {"nope": 1}}, {"offsets": {"broker-z/0": 1}}):
            with pytest.raises(SparkMQError) as info:
                admin.reset_offsets("cg", "t", **bad)
            assert info.value.code is ErrorCode.INVALID_ARGUMENT
    finally:
        admin.close()
