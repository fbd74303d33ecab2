"""mqadmin's requests to a broker (``api/remoting/admin.py``), over real sockets, checked by their effects.

A broker runs in this process behind a RemotingServer whose dispatcher is the admin handlers plus a stand-in for
the messaging dispatcher's HEART_BEAT (it binds a client id to its connection, as the real one does; pushing
offset resets is the real dispatcher's, not tested here); requests are
written as the Java client writes them (``rmq_wire``) and answers parsed as the Java tools read them, the
MessageQueue-keyed maps by :func:`mq_map` (fastjson's own shape, not JSON).
"""
from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rmq_wire import RawClient

from sparkmq.api.remoting.admin import admin_handlers
from sparkmq.platform.broker.broker import Broker
from sparkmq.platform.broker.client_manager import ConsumerData, Subscription
from sparkmq.platform.broker.config import BrokerConfig
from sparkmq.platform.broker.processors.send import OutgoingMessage
from sparkmq.platform.common.protocol import RequestCode
from sparkmq.platform.remoting import LoopThread, RemotingServer, Reply, ServerConnection, unsupported_reply

#: RocketMQ's SubscriptionGroupConfig defaults, as its broker writes them
DEFAULT_GROUP = {"consumeEnable": True, "consumeFromMinEnable": True, "consumeBroadcastEnable": True,
                 "consumeMessageOrderly": False, "retryQueueNums": 1, "retryMaxTimes": 16, "brokerId": 0,
                 "whichBrokerWhenConsumeSlowly": 1, "notifyConsumerIdsChangedEnable": True, "groupSysFlag": 0,
                 "consumeTimeoutMinute": 15, "attributes": {}}
STORE = {"segment_size": 1 << 20, "max_message_size": 64 * 1024, "max_properties_size": 8000}


class AdminServer:
    """A broker and a RemotingServer serving its admin handlers (and a minimal HEART_BEAT)."""

    def __init__(self, data_dir: Path) -> None:
        self.broker = Broker(BrokerConfig(data_dir=data_dir, port=10911, store=STORE)).start(register=False)
        self.connections: dict[str, ServerConnection] = {}
        self.handlers = admin_handlers(self)
        self.loop_thread = LoopThread(name="test-remoting-admin").start()
        self.server = self.loop_thread.run(RemotingServer(self._handle).start("127.0.0.1", 0))
        self.addr = f"127.0.0.1:{self.server.port}"

    def connection_of(self, client_id: str) -> ServerConnection | None:
        return self.connections.get(client_id)

    def _handle(self, conn: ServerConnection, frame) -> Reply:
        if frame.code == RequestCode.HEART_BEAT:  # the messaging dispatcher's part, as little as the tests need
            data = json.loads(bytes(frame.body))
            conn.attributes.update(language=frame.language, version=frame.version)
            self.connections[data["clientID"]] = conn
            consumers = [ConsumerData(c["groupName"], subscriptions=tuple(
                Subscription(s["topic"], s.get("subString", "*")) for s in c.get("subscriptionDataSet", ())))
                for c in data.get("consumerDataSet", ())]
            self.broker.consumer_processor.heartbeat(data["clientID"], (), consumers)
            return Reply()
        handler = self.handlers.get(frame.code)
        return handler(conn, frame) if handler else unsupported_reply(frame)

    def stop(self) -> None:
        self.loop_thread.run(self.server.stop(1.0))
        self.loop_thread.stop()
        self.broker.shutdown()


@contextlib.contextmanager
def admin_server(tmp_path: Path) -> Iterator[AdminServer]:
    server = AdminServer(tmp_path)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[AdminServer, RawClient]]:
    with admin_server(tmp_path) as server, RawClient(server.addr) as client:
        yield server, client


_MQ_ENTRY = re.compile(r'\{"brokerName":("(?:[^"\\]|\\.)*"),"queueId":(\d+),"topic":("(?:[^"\\]|\\.)*")\}:')


def mq_map(body: bytes, field: str = "offsetTable") -> tuple[dict[tuple[str, str, int], Any], dict[str, Any]]:
    """fastjson's MessageQueue-keyed map read back: ({(topic, broker, queue): value}, the other fields)."""
    text = bytes(body).decode()
    start = f'{{"{field}":{{'
    assert text.startswith(start), text[:80]
    table: dict[tuple[str, str, int], Any] = {}
    pos = len(start)
    decoder = json.JSONDecoder()
    while text[pos] != "}":
        match = _MQ_ENTRY.match(text, pos)
        assert match, text[pos:pos + 80]
        value, end = decoder.raw_decode(text, match.end())
        table[(json.loads(match.group(3)), json.loads(match.group(1)), int(match.group(2)))] = value
        pos = end + (text[end] == ",")
    rest = json.loads("{" + text[pos + 2:]) if text[pos + 1:pos + 2] == "," else {}
    return table, rest


def heartbeat(client: RawClient, client_id: str, group: str, topic: str, expression: str = "*") -> None:
    body = json.dumps({"clientID": client_id, "producerDataSet": [], "consumerDataSet": [
        {"groupName": group, "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
         "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET", "subscriptionDataSet": [
             {"topic": topic, "subString": expression, "classFilterMode": False, "tagsSet": [], "codeSet": [],
              "subVersion": 0, "expressionType": "TAG"}], "unitMode": False}]}).encode()
    assert client.request(RequestCode.HEART_BEAT, {}, body).code == 0


def send(broker: Broker, topic: str, count: int, queue_id: int = 0, tags: str | None = None) -> None:
    for i in range(count):
        broker.send_processor.send(topic, OutgoingMessage(b"m%d" % i, tags), queue_id=queue_id)


# -- topics -----------------------------------------------------------------------------------------------------
def test_update_delete_and_list_topics(served) -> None:
    server, client = served
    ext = {"topic": "orders", "defaultTopic": "TBW102", "readQueueNums": "8", "writeQueueNums": "8", "perm": "6",
           "topicFilterType": "SINGLE_TAG", "topicSysFlag": "0", "order": "false"}
    assert client.request(RequestCode.UPDATE_AND_CREATE_TOPIC, ext).code == 0
    cfg = server.broker.topics.get("orders")
    assert (cfg.read_queue_nums, cfg.write_queue_nums, cfg.perm) == (8, 8, 6)
    assert client.request(RequestCode.UPDATE_AND_CREATE_TOPIC, dict(ext, readQueueNums="4", perm="4")).code == 0
    assert (server.broker.topics.get("orders").read_queue_nums, server.broker.topics.get("orders").perm) == (4, 4)
    listed = json.loads(bytes(client.request(RequestCode.GET_ALL_TOPIC_CONFIG).body))
    assert listed["topicConfigTable"]["orders"] == {"topicName": "orders", "readQueueNums": 4, "writeQueueNums": 8,
                                                    "perm": 4, "topicFilterType": "SINGLE_TAG", "topicSysFlag": 0,
                                                    "order": False, "attributes": {}}
    assert listed["dataVersion"]["counter"] == server.broker.topics.data_version
    one = json.loads(bytes(client.request(RequestCode.GET_TOPIC_CONFIG, {"topic": "orders"}).body))
    assert one["topicName"] == "orders" and one["writeQueueNums"] == 8
    assert client.request(RequestCode.GET_TOPIC_CONFIG, {"topic": "nope"}).code == 17
    # a system topic cannot be changed; a bad name is refused; both change nothing
    refused = client.request(RequestCode.UPDATE_AND_CREATE_TOPIC, dict(ext, topic="TBW102"))
    assert refused.code == 16 and refused.ext["errorCode"] == "NO_PERMISSION"
    assert client.request(RequestCode.UPDATE_AND_CREATE_TOPIC, dict(ext, topic="bad topic")).code == 29
    assert server.broker.topics.get("bad topic") is None
    assert client.request(RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": "orders"}).code == 0
    assert server.broker.topics.get("orders") is None
    assert "orders" not in json.loads(bytes(client.request(RequestCode.GET_ALL_TOPIC_CONFIG).body))["topicConfigTable"]


def test_topic_status(served) -> None:
    server, client = served
    server.broker.admin_processor.create_or_update_topic("orders", 2, 2)
    before = int(time.time() * 1000)
    send(server.broker, "orders", 3, queue_id=1)
    reply = client.request(RequestCode.GET_TOPIC_STATS_INFO, {"topic": "orders"})
    table, rest = mq_map(reply.body)
    name = server.broker.name
    assert table[("orders", name, 0)] == {"minOffset": 0, "maxOffset": 0, "lastUpdateTimestamp": 0}
    q1 = table[("orders", name, 1)]
    assert (q1["minOffset"], q1["maxOffset"]) == (0, 3) and before <= q1["lastUpdateTimestamp"] <= time.time() * 1000
    assert rest == {"topicPutTps": 0.0}
    assert client.request(RequestCode.GET_TOPIC_STATS_INFO, {"topic": "nope"}).code == 17


# -- the broker -------------------------------------------------------------------------------------------------
def test_runtime_info_as_cluster_list_reads_it(served) -> None:
    server, client = served
    server.broker.admin_processor.create_or_update_topic("orders", 1, 1)
    send(server.broker, "orders", 25)
    server.broker.pull_processor.pull_once("orders", 0, 0, 10, group="g")
    time.sleep(1.1)  # one closed second for the rates
    table = json.loads(bytes(client.request(RequestCode.GET_BROKER_RUNTIME_INFO).body))["table"]
    assert table["msgPutTotalTodayNow"] == "25" and table["msgGetTotalTodayNow"] == "10"
    assert table["msgPutTotalTodayMorning"] == "0" and table["msgPutTotalYesterdayMorning"] == "0"
    put_tps = [float(x) for x in table["putTps"].split(" ")]
    assert len(put_tps) == 3 and put_tps[0] > 0
    assert float(table["getTransferredTps"].split(" ")[0]) > 0
    assert table["brokerVersionDesc"] == "V5_3_3" and table["brokerActive"] == "true"
    assert 0 < int(table["earliestMessageTimeStamp"]) <= time.time() * 1000
    assert 0 <= float(table["commitLogDiskRatio"]) <= 1
    assert int(table["commitLogMaxOffset"]) > 0
    for name in ("sendThreadPoolQueueSize", "pullThreadPoolQueueSize", "sendThreadPoolQueueHeadWaitTimeMills",
                 "pullThreadPoolQueueHeadWaitTimeMills", "pageCacheLockTimeMills", "timerReadBehind",
                 "timerOffsetBehind", "timerCongestNum", "timerEnqueueTps", "timerDequeueTps", "bootTimestamp"):
        float(table[name])  # clusterList parses these


# -- consumer groups ---------------------------------------------------------------------------------------------
def test_consumer_progress_and_connections(served) -> None:
    server, client = served
    broker = server.broker
    broker.admin_processor.create_or_update_topic("orders", 2, 2)
    send(broker, "orders", 5, queue_id=0)
    send(broker, "orders", 2, queue_id=1)
    absent = client.request(RequestCode.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": "cg"})
    assert absent.code == 206 and absent.remark == "the consumer group[cg] not online"
    heartbeat(client, "10.0.0.5@1234#1", "cg", "orders", "TagA || TagB")
    broker.consumer_processor.commit_offsets("cg", [("orders", 0, 3)])
    stats, rest = mq_map(client.request(RequestCode.GET_CONSUME_STATS, {"consumerGroup": "cg"}).body)
    name = broker.name
    q0 = stats[("orders", name, 0)]
    assert (q0["brokerOffset"], q0["consumerOffset"], q0["pullOffset"]) == (5, 3, 3)
    assert q0["lastTimestamp"] == broker.store.store_timestamp_of("orders", 0, 2) > 0
    assert stats[("orders", name, 1)] == {"brokerOffset": 2, "consumerOffset": 0, "pullOffset": 0, "lastTimestamp": 0}
    assert rest == {"consumeTps": 0.0}
    one_topic, _ = mq_map(client.request(RequestCode.GET_CONSUME_STATS, {"consumerGroup": "cg",
                                                                         "topic": "orders"}).body)
    assert set(one_topic) == {("orders", name, 0), ("orders", name, 1)}
    nothing, _ = mq_map(client.request(RequestCode.GET_CONSUME_STATS, {"consumerGroup": "cg", "topic": "nope"}).body)
    assert nothing == {}
    conns = json.loads(bytes(client.request(RequestCode.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": "cg"}).body))
    (conn,) = conns["connectionSet"]
    assert conn["clientId"] == "10.0.0.5@1234#1" and conn["language"] == "JAVA" and conn["version"] == 479
    assert conn["clientAddr"].startswith("127.0.0.1:")
    sub = conns["subscriptionTable"]["orders"]
    assert sub["tagsSet"] == ["TagA", "TagB"] and sub["subString"] == "TagA || TagB"
    assert sub["expressionType"] == "TAG" and sub["subVersion"] == 0 and sub["classFilterMode"] is False
    assert sub["codeSet"] == [_java_hash("TagA"), _java_hash("TagB")]
    assert (conns["consumeType"], conns["messageModel"], conns["consumeFromWhere"]) == (
        "CONSUME_PASSIVELY", "CLUSTERING", "CONSUME_FROM_LAST_OFFSET")
    by_who = json.loads(bytes(client.request(RequestCode.QUERY_TOPIC_CONSUME_BY_WHO, {"topic": "orders"}).body))
    assert by_who == {"groupList": ["cg"]}


def _java_hash(text: str) -> int:
    """String.hashCode, written out here (the handler's is not used as the expectation)."""
    h = 0
    for ch in text:
        h = (31 * h + ord(ch)) % (1 << 32)
    return h - (1 << 32) if h >= 1 << 31 else h


def test_reset_offset_by_time(served, tmp_path: Path) -> None:
    server, client = served
    broker = server.broker
    broker.admin_processor.create_or_update_topic("orders", 2, 2)
    send(broker, "orders", 4, queue_id=0)
    time.sleep(0.05)
    middle = int(time.time() * 1000)
    time.sleep(0.05)
    send(broker, "orders", 3, queue_id=0)
    send(broker, "orders", 2, queue_id=1)
    broker.consumer_processor.commit_offsets("cg", [("orders", 0, 7), ("orders", 1, 2)])
    ext = {"group": "cg", "topic": "orders", "timestamp": str(middle), "isForce": "true"}
    offline = client.request(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, ext)
    assert offline.code == 206 and offline.remark.startswith("Consumer not online, so can not reset offset")
    assert broker.consumer_processor.query_offset("cg", "orders", 0) == 7, "nothing changed"
    with RawClient(server.addr) as member:
        heartbeat(member, "member-1", "cg", "orders")
        reply = client.request(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, ext)
        assert reply.code == 0, reply.remark
        table, _ = mq_map(reply.body)
        assert table == {("orders", broker.name, 0): 4, ("orders", broker.name, 1): 0}
        assert broker.consumer_processor.query_offset("cg", "orders", 0) == 4
        # sparkmq's fence: a commit of another offset is ignored until the consumer pulled at the new one
        broker.consumer_processor.commit_offsets("cg", [("orders", 0, 6)])
        assert broker.consumer_processor.query_offset("cg", "orders", 0) == 4
        # not forced: a queue only moves back (to the end, -1, here: nowhere)
        gentle = client.request(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, dict(ext, timestamp="-1", isForce="false"))
        assert mq_map(gentle.body)[0] == {("orders", broker.name, 0): 4, ("orders", broker.name, 1): 0}
        to_end = client.request(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, dict(ext, timestamp="-1"))
        assert mq_map(to_end.body)[0] == {("orders", broker.name, 0): 7, ("orders", broker.name, 1): 2}
        assert broker.consumer_processor.query_offset("cg", "orders", 1) == 2
        one_queue = client.request(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, dict(ext, queueId="1", offset="1"))
        assert mq_map(one_queue.body)[0] == {("orders", broker.name, 1): 1}
    assert client.request(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, dict(ext, topic="nope")).code == 17


# -- subscription groups ------------------------------------------------------------------------------------------
def test_update_subscription_group_is_kept(tmp_path: Path) -> None:
    body = json.dumps({"groupName": "cg", "consumeEnable": False, "consumeFromMinEnable": False,
                       "consumeBroadcastEnable": False, "consumeMessageOrderly": True, "retryQueueNums": 2,
                       "retryMaxTimes": 3, "groupRetryPolicy": {"type": "CUSTOMIZED"}, "brokerId": 0,
                       "whichBrokerWhenConsumeSlowly": 1, "notifyConsumerIdsChangedEnable": True,
                       "groupSysFlag": 0, "consumeTimeoutMinute": 15, "subscriptionDataSet": None,
                       "attributes": {}}).encode()
    with admin_server(tmp_path) as server, RawClient(server.addr) as client:
        assert client.request(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, body).code == 0
        bad = client.request(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {},
                             body.replace(b'"cg"', b'"bad group"'))
        assert bad.code == 29
        assert client.request(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, b"{not json").code == 29
        heartbeat(client, "c1", "other", "orders")
        live = json.loads(bytes(client.request(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG).body))
        assert live["subscriptionGroupTable"]["other"] == dict(DEFAULT_GROUP, groupName="other"), \
            "a live group has the defaults"
    cfg = server.broker.subscription_groups.get("cg")
    assert (cfg.consume_enable, cfg.retry_max_times, cfg.retry_queue_nums, cfg.consume_message_orderly) == (
        False, 3, 2, True)
    with admin_server(tmp_path) as server, RawClient(server.addr) as client:  # kept across a restart
        listed = json.loads(bytes(client.request(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG).body))
        table = listed["subscriptionGroupTable"]
        assert table["cg"]["retryMaxTimes"] == 3 and table["cg"]["consumeEnable"] is False
        assert listed["dataVersion"]["counter"] >= 1
        one = json.loads(bytes(client.request(RequestCode.GET_SUBSCRIPTIONGROUP_CONFIG, {"group": "cg"}).body))
        assert one["retryQueueNums"] == 2
        defaults = json.loads(bytes(client.request(RequestCode.GET_SUBSCRIPTIONGROUP_CONFIG, {"group": "x"}).body))
        assert defaults == dict(DEFAULT_GROUP, groupName="x")
        delete = {"groupName": "cg", "cleanOffset": "false"}
        assert client.request(RequestCode.DELETE_SUBSCRIPTIONGROUP, delete).code == 0
        assert server.broker.subscription_groups.configured("cg") is None
