"""RocketMQ's remoting protocol at a real broker, spoken with raw frames as RocketMQ's Java client writes them
(``tests/rocketmq_wire.py``): sends (V1 and V2 headers, JSON and ROCKETMQ serialization, properties, delay, batch,
auto-create), pulls (RocketMQ's answer codes, long polling, commit on pull, tag filters from the request or from the
group's heartbeat, the stored-message encoding), groups and offsets, pushes (rebalance notices, offset resets),
orderly locks, send-back to retry and DLQ, transactions with a check-back, message views, relayed running info,
and the answers to what the broker does not serve or cannot read (``docs/remoting.md``)."""
from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest
from rocketmq_wire import JavaLikeClient, batch_body, decode_records, heartbeat, props, v2

from procs import ProcessHarness
from sparkmq.platform.common.ids import decode_offset_msg_id
from sparkmq.platform.common.protocol import RequestCode as C

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

SUB_FLAG, SUSPEND_FLAG, COMMIT_FLAG = 0x4, 0x2, 0x1


@pytest.fixture(scope="module")
def broker(module_procs: ProcessHarness, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One broker (no name server): remoting on its one port; quick transaction check-backs; short delay levels."""
    service = module_procs.start(
        "broker", "sparkmq.api.broker_main", "--data-dir", str(tmp_path_factory.mktemp("rmq") / "data"),
        "--no-trace", "--namesrv", "127.0.0.1:1", "--ha-port", "-1", "--transaction-check-first-s", "1",
        "--transaction-check-interval-s", "1", "--message-delay-level", "1s 2s 3s 4s 5s")
    info = httpx.get(f"{service.url}/broker", timeout=5).json()
    assert info["remoting_addr"] == info["addr"], info  # one port: HTTP and remoting
    return {"url": service.url, "addr": info["addr"], "service": service}


def _pull(c: JavaLikeClient, topic: str, queue: int, offset: int, *, group: str = "cg-pull", sub: str | None = "*",
          suspend_ms: int = 0, commit: int | None = None, expression_type: str = "TAG", code: int = C.PULL_MESSAGE,
          max_nums: int = 32) -> Any:
    flags = (SUB_FLAG if sub is not None else 0) | (SUSPEND_FLAG if suspend_ms else 0) | (COMMIT_FLAG if commit else 0)
    ext = {"consumerGroup": group, "topic": topic, "queueId": str(queue), "queueOffset": str(offset),
           "maxMsgNums": str(max_nums), "sysFlag": str(flags), "commitOffset": str(commit or 0),
           "suspendTimeoutMillis": str(suspend_ms), "subVersion": "0", "expressionType": expression_type}
    if sub is not None:
        ext["subscription"] = sub
    return c.request(code, ext, timeout=suspend_ms / 1000 + 10)


def _send(c: JavaLikeClient, topic: str, body: bytes, queue: int = 0, **properties: str) -> Any:
    answer = c.request(C.SEND_MESSAGE_V2, v2("pg", topic, queue_id=queue, properties=props(properties)), body)
    assert answer.code == 0, (answer.code, answer.remark)
    return answer


def test_a_v2_send_and_a_pull_carry_the_message_as_rocketmq_encodes_it(broker: dict[str, Any]) -> None:
    url, addr = broker["url"], broker["addr"]
    with JavaLikeClient(addr) as c:
        sent = _send(c, "RmqEqual", b"hello rocketmq", TAGS="TagA", KEYS="k1 k2", UNIQ_KEY="0A0000010000AABBCCDD0000",
                     WAIT="true", color="blue")
        ext = sent.ext
        assert ext["MSG_REGION"] == "DefaultRegion" and ext["TRACE_ON"] == "true"
        assert ext["transactionId"] == "0A0000010000AABBCCDD0000" and (ext["queueId"], ext["queueOffset"]) == ("0", "0")
        where = decode_offset_msg_id(ext["msgId"])  # the offsetMsgId: the store host is the broker's one port
        assert where.store_host == addr
        pulled = _pull(c, "RmqEqual", 0, 0)
    assert pulled.code == 0 and pulled.remark == "FOUND"
    assert {k: pulled.ext[k] for k in ("suggestWhichBrokerId", "nextBeginOffset", "minOffset", "maxOffset")} == {
        "suggestWhichBrokerId": "0", "nextBeginOffset": "1", "minOffset": "0", "maxOffset": "1"}
    [m] = decode_records(bytes(pulled.body))
    assert m["body"] == b"hello rocketmq" and m["topic"] == "RmqEqual" and m["msgId"] == ext["msgId"]
    assert m["properties"]["TAGS"] == "TagA" and m["properties"]["KEYS"] == "k1 k2"
    assert m["properties"]["UNIQ_KEY"] == "0A0000010000AABBCCDD0000" and m["properties"]["color"] == "blue"
    assert m["commitLogOffset"] == where.commitlog_offset and m["storeHost"] == addr
    over_http = httpx.get(f"{url}/topics/RmqEqual/queues/0/messages", params={"offset": 0}, timeout=5).json()
    [h] = over_http["messages"]
    assert (h["msg_id"], h["offset_msg_id"], h["tags"], h["keys"], h["born_timestamp"], h["store_timestamp"]) == (
        "0A0000010000AABBCCDD0000", m["msgId"], "TagA", ["k1", "k2"], m["bornTimestamp"], m["storeTimestamp"])
    assert h["born_host"] == m["bornHost"] and h["properties"]["color"] == "blue"


@pytest.mark.parametrize("serialize", ["JSON", "ROCKETMQ"])
def test_v1_send_headers_in_either_serialization_are_answered_in_json(broker: dict[str, Any], serialize: str) -> None:
    with JavaLikeClient(broker["addr"], serialize=serialize) as c:
        ext = {"producerGroup": "pg", "topic": f"RmqV1{serialize}", "defaultTopic": "TBW102",
               "defaultTopicQueueNums": "4", "queueId": "1", "sysFlag": "0", "bornTimestamp": "1700000000000",
               "flag": "7", "properties": props({"UNIQ_KEY": f"ID-{serialize}", "TAGS": "x"}), "reconsumeTimes": "0"}
        answer = c.request(C.SEND_MESSAGE, ext, b"v1")
        assert answer.code == 0 and answer.serialize == 0, answer  # RocketMQ's servers answer JSON by default
        [m] = decode_records(bytes(_pull(c, f"RmqV1{serialize}", 1, 0).body))
    assert (m["flag"], m["bornTimestamp"], m["properties"]["UNIQ_KEY"]) == (7, 1700000000000, f"ID-{serialize}")


def test_a_send_to_an_unknown_topic_creates_it_with_the_default_queues(broker: dict[str, Any]) -> None:
    with JavaLikeClient(broker["addr"]) as c:
        _send(c, "RmqAutoCreated", b"x", queue=3)
    topic = httpx.get(f"{broker['url']}/topics/RmqAutoCreated", timeout=5).json()
    assert (topic["read_queue_nums"], topic["write_queue_nums"]) == (4, 4)


def test_a_delay_level_parks_the_message_until_due(broker: dict[str, Any]) -> None:
    with JavaLikeClient(broker["addr"]) as c:
        started = time.monotonic()
        _send(c, "RmqDelayed", b"later", DELAY="1", UNIQ_KEY="DELAYED-1")
        assert _pull(c, "RmqDelayed", 0, 0).code in (19, 21)  # not there yet
        found = _pull(c, "RmqDelayed", 0, 0, suspend_ms=5000)
        assert found.code == 0 and time.monotonic() - started >= 0.9
        [m] = decode_records(bytes(found.body))
    assert m["properties"]["UNIQ_KEY"] == "DELAYED-1" and m["body"] == b"later"


def test_a_batch_in_rocketmq_encoding_is_stored_as_one_append(broker: dict[str, Any]) -> None:
    body = batch_body([(f"m{i}".encode(), props({"UNIQ_KEY": f"BATCH-{i}", "TAGS": "b"}), 0) for i in range(3)])
    with JavaLikeClient(broker["addr"]) as c:
        answer = c.request(C.SEND_BATCH_MESSAGE, v2("pg", "RmqBatch", properties=props({"UNIQ_KEY": "B-ALL"}),
                                                    batch=True), body)
        assert answer.code == 0, answer.remark
        ids = answer.ext["msgId"].split(",")
        assert len(ids) == 3 and answer.ext["queueOffset"] == "0" and answer.ext["transactionId"] == "B-ALL"
        # RocketMQ's broker answers no batchUniqId: the Java client would read it as an inner batch's id
        assert "batchUniqId" not in answer.ext
        records = decode_records(bytes(_pull(c, "RmqBatch", 0, 0).body))
        bad = c.request(C.SEND_BATCH_MESSAGE, v2("pg", "RmqBatch", batch=True), body[:-3])
    assert [m["msgId"] for m in records] == ids
    assert [(m["body"], m["properties"]["UNIQ_KEY"]) for m in records] == [(f"m{i}".encode(), f"BATCH-{i}")
                                                                           for i in range(3)]
    assert bad.code == 13 and bad.ext["errorCode"] == "MESSAGE_ILLEGAL"


def test_pull_answer_codes_are_rocketmqs(broker: dict[str, Any]) -> None:
    with JavaLikeClient(broker["addr"]) as c:
        assert _pull(c, "RmqCodes", 0, 0).code == 17  # no such topic
        _send(c, "RmqCodes", b"a", TAGS="A")
        _send(c, "RmqCodes", b"b", TAGS="A")
        assert _pull(c, "RmqCodes", 1, 0).code == 19  # a queue never written, at offset 0: nothing new
        moved = _pull(c, "RmqCodes", 1, 5)  # ... elsewhere: start over where it tells
        assert moved.code == 21 and moved.ext["nextBeginOffset"] == "0"
        assert _pull(c, "RmqCodes", 0, 2).code == 19  # offset = max
        overflow = _pull(c, "RmqCodes", 0, 9)
        assert overflow.code == 21 and overflow.ext["nextBeginOffset"] == "2"
        unmatched = _pull(c, "RmqCodes", 0, 0, sub="B")  # examined, none matched: move past them
        assert unmatched.code in (19, 20) and unmatched.ext["nextBeginOffset"] == "2", unmatched
        for answer in (moved, overflow, unmatched):
            assert {"suggestWhichBrokerId", "nextBeginOffset", "minOffset", "maxOffset"} <= set(answer.ext)


def test_a_suspended_pull_is_woken_by_an_arrival(broker: dict[str, Any]) -> None:
    with JavaLikeClient(broker["addr"]) as puller, JavaLikeClient(broker["addr"]) as sender:
        _send(sender, "RmqLongPoll", b"first")
        opaque = puller.send(C.PULL_MESSAGE, {
            "consumerGroup": "cg-lp", "topic": "RmqLongPoll", "queueId": "0", "queueOffset": "1",
            "maxMsgNums": "32", "sysFlag": str(SUB_FLAG | SUSPEND_FLAG), "commitOffset": "0",
            "suspendTimeoutMillis": "15000", "subscription": "*"})
        time.sleep(0.3)
        sent_at = time.monotonic()
        _send(sender, "RmqLongPoll", b"second")
        answer = puller.response(opaque, timeout=10)
        woken_after = time.monotonic() - sent_at
    assert answer.code == 0 and woken_after < 1.0
    assert [m["body"] for m in decode_records(bytes(answer.body))] == [b"second"]


def test_a_pull_without_a_subscription_uses_the_groups_heartbeat(broker: dict[str, Any]) -> None:
    with JavaLikeClient(broker["addr"]) as c:
        _send(c, "RmqGroupSub", b"a", TAGS="A")
        _send(c, "RmqGroupSub", b"b", TAGS="B")
        missing = _pull(c, "RmqGroupSub", 0, 0, group="cg-groupsub", sub=None)
        assert missing.code == 24 and missing.ext["errorCode"] == "SUBSCRIPTION_NOT_EXIST"
        hb = c.request(C.HEART_BEAT, None, heartbeat("java-1", consumers=[{
            "groupName": "cg-groupsub", "subscriptionDataSet": [{"topic": "RmqGroupSub", "subString": "B",
                                                                 "tagsSet": ["B"]}]}]))
        assert hb.code == 0 and hb.ext["isSupportHeartBeatV2"] == "false"
        answer = _pull(c, "RmqGroupSub", 0, 0, group="cg-groupsub", sub=None)
    assert answer.code == 0 and [m["body"] for m in decode_records(bytes(answer.body))] == [b"b"]


def test_offsets_commit_on_pull_query_update_and_bounds(broker: dict[str, Any]) -> None:
    with JavaLikeClient(broker["addr"]) as c:
        before = int(time.time() * 1000) - 1
        for i in range(3):
            _send(c, "RmqOffsets", f"m{i}".encode())
        query = {"consumerGroup": "cg-off", "topic": "RmqOffsets", "queueId": "0"}
        # Never committed, the queue still holds its first message: RocketMQ answers 0 unless told not to.
        assert c.request(C.QUERY_CONSUMER_OFFSET, query).ext["offset"] == "0"
        assert c.request(C.QUERY_CONSUMER_OFFSET, {**query, "setZeroIfNotFound": "false"}).code == 22
        assert _pull(c, "RmqOffsets", 0, 1, group="cg-off", commit=1).code == 0  # COMMIT_OFFSET carried
        assert c.request(C.QUERY_CONSUMER_OFFSET, query).ext["offset"] == "1"
        assert c.request(C.UPDATE_CONSUMER_OFFSET, {**query, "commitOffset": "3"}).code == 0
        assert c.request(C.QUERY_CONSUMER_OFFSET, query).ext["offset"] == "3"
        q = {"topic": "RmqOffsets", "queueId": "0"}
        assert c.request(C.GET_MAX_OFFSET, q).ext["offset"] == "3"
        assert c.request(C.GET_MIN_OFFSET, q).ext["offset"] == "0"
        assert c.request(C.SEARCH_OFFSET_BY_TIMESTAMP, {**q, "timestamp": str(before)}).ext["offset"] == "0"
        late = c.request(C.SEARCH_OFFSET_BY_TIMESTAMP, {**q, "timestamp": str(int(time.time() * 1000) + 60_000)})
        assert late.ext["offset"] == "3"
        earliest = int(c.request(C.GET_EARLIEST_MSG_STORETIME, q).ext["timestamp"])
        assert before <= earliest <= int(time.time() * 1000)


def test_members_joining_and_leaving_are_pushed_to_the_group(broker: dict[str, Any]) -> None:
    group = {"groupName": "cg-members", "subscriptionDataSet": [{"topic": "RmqMembers", "subString": "*"}]}
    with JavaLikeClient(broker["addr"]) as first, JavaLikeClient(broker["addr"]) as second:
        assert first.request(C.HEART_BEAT, None, heartbeat("member-1", consumers=[group])).code == 0
        joined = time.monotonic()
        assert second.request(C.HEART_BEAT, None, heartbeat("member-2", consumers=[group])).code == 0
        notice = first.wait_push(C.NOTIFY_CONSUMER_IDS_CHANGED)
        assert time.monotonic() - joined < 1.0
        assert notice.is_oneway and notice.ext == {"consumerGroup": "cg-members"}
        listed = first.request(C.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "cg-members"})
        assert json.loads(bytes(listed.body)) == {"consumerIdList": ["member-1", "member-2"]}
        assert second.request(C.UNREGISTER_CLIENT, {"clientID": "member-2", "consumerGroup": "cg-members"}).code == 0
        first.wait_push(C.NOTIFY_CONSUMER_IDS_CHANGED)
        listed = first.request(C.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "cg-members"})
        assert json.loads(bytes(listed.body)) == {"consumerIdList": ["member-1"]}
        none = first.request(C.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "cg-nobody"})
        assert none.code == 1 and none.ext["errorCode"] == "GROUP_NOT_EXIST"  # RocketMQ's broker: code 1


def test_an_admin_offset_reset_is_pushed_to_the_members(broker: dict[str, Any]) -> None:
    with JavaLikeClient(broker["addr"]) as c:
        _send(c, "RmqReset", b"a")
        _send(c, "RmqReset", b"b")
        c.request(C.HEART_BEAT, None, heartbeat("member-r", consumers=[{
            "groupName": "cg-reset", "subscriptionDataSet": [{"topic": "RmqReset", "subString": "*"}]}]))
        httpx.post(f"{broker['url']}/consumers/cg-reset/offsets/reset",
                   json={"topic": "RmqReset", "offsets": {"0": 1}}, timeout=5).raise_for_status()
        push = c.wait_push(C.RESET_CONSUMER_CLIENT_OFFSET)
    assert push.is_oneway and (push.ext["topic"], push.ext["group"]) == ("RmqReset", "cg-reset")
    assert bytes(push.body).startswith(b'{"offsetTable":{{"brokerName":"broker-a","queueId":0,"topic":"RmqReset"}:1')


def test_orderly_locks_are_held_by_one_client_at_a_time(broker: dict[str, Any]) -> None:
    def body(client: str) -> bytes:
        return json.dumps({"consumerGroup": "cg-lock", "clientId": client, "onlyThisBroker": False,
                           "mqSet": [{"topic": "RmqLocks", "brokerName": "broker-a", "queueId": 0}]}).encode()

    with JavaLikeClient(broker["addr"]) as c:
        _send(c, "RmqLocks", b"x")
        got = json.loads(bytes(c.request(C.LOCK_BATCH_MQ, None, body("a")).body))
        assert got == {"lockOKMQSet": [{"topic": "RmqLocks", "brokerName": "broker-a", "queueId": 0}]}
        assert json.loads(bytes(c.request(C.LOCK_BATCH_MQ, None, body("b")).body)) == {"lockOKMQSet": []}
        assert c.request(C.UNLOCK_BATCH_MQ, None, body("a")).code == 0
        assert len(json.loads(bytes(c.request(C.LOCK_BATCH_MQ, None, body("b")).body))["lockOKMQSet"]) == 1


def test_send_back_retries_with_growing_reconsume_times_then_dead_letters(broker: dict[str, Any]) -> None:
    with JavaLikeClient(broker["addr"]) as c:
        sent = _send(c, "RmqRetry", b"fails", UNIQ_KEY="RETRY-ME")
        offset = decode_offset_msg_id(sent.ext["msgId"]).commitlog_offset
        back = c.request(C.CONSUMER_SEND_MSG_BACK, {"offset": str(offset), "group": "cg-retry", "delayLevel": "0",
                                                    "originMsgId": "RETRY-ME", "originTopic": "RmqRetry",
                                                    "maxReconsumeTimes": "2"})
        assert back.code == 0 and back.ext["topic"] == "%RETRY%cg-retry" and back.ext["reconsumeTimes"] == "1"
        assert back.ext["delayLevel"] == "3"  # 3 + reconsume times 0
        retried = _pull(c, "%RETRY%cg-retry", 0, 0, group="cg-retry", suspend_ms=8000)
        [m] = decode_records(bytes(retried.body))
        assert m["reconsumeTimes"] == 1 and m["properties"]["UNIQ_KEY"] == "RETRY-ME"
        again = c.request(C.CONSUMER_SEND_MSG_BACK, {"offset": str(m["commitLogOffset"]), "group": "cg-retry",
                                                     "delayLevel": "0", "maxReconsumeTimes": "1"})
        assert again.code == 0 and again.ext["status"] == "DLQ" and again.ext["topic"] == "%DLQ%cg-retry"
        [dead] = decode_records(bytes(_pull(c, "%DLQ%cg-retry", 0, 0, group="cg-retry").body))
    assert dead["body"] == b"fails" and dead["properties"]["UNIQ_KEY"] == "RETRY-ME"


def test_transactions_commit_rollback_and_a_check_back_to_a_live_producer(broker: dict[str, Any]) -> None:
    def half(c: JavaLikeClient, uniq: str, body: bytes) -> Any:
        properties = props({"UNIQ_KEY": uniq, "TRAN_MSG": "true", "PGROUP": "tx-pg", "WAIT": "true"})
        answer = c.request(C.SEND_MESSAGE_V2, v2("tx-pg", "RmqTx", properties=properties, sys_flag=0x4), body)
        assert answer.code == 0 and answer.ext["transactionId"] == uniq, answer
        return answer

    def end(c: JavaLikeClient, sent: Any, kind: int, uniq: str, *, from_check: bool = False) -> None:
        c.send(C.END_TRANSACTION, {
            "producerGroup": "tx-pg", "tranStateTableOffset": sent.ext["queueOffset"],
            "commitLogOffset": str(decode_offset_msg_id(sent.ext["msgId"]).commitlog_offset),
            "commitOrRollback": str(kind), "fromTransactionCheck": str(from_check).lower(), "msgId": uniq,
            "transactionId": uniq, "topic": "RmqTx"}, oneway=True)

    with JavaLikeClient(broker["addr"]) as c:
        committed = half(c, "TX-COMMIT", b"committed")
        rolled = half(c, "TX-ROLLBACK", b"rolled back")
        assert _pull(c, "RmqTx", 0, 0).code in (19, 21)  # invisible while open
        end(c, committed, 8, "TX-COMMIT")
        end(c, rolled, 12, "TX-ROLLBACK")
        found = _pull(c, "RmqTx", 0, 0, suspend_ms=5000)
        assert [m["body"] for m in decode_records(bytes(found.body))] == [b"committed"]
        # An open transaction is checked back with a live producer of its group (the heartbeat binds it).
        c.request(C.HEART_BEAT, None, heartbeat("tx-producer", producers=["tx-pg"]))
        unknown = half(c, "TX-CHECKED", b"checked")
        end(c, unknown, 0, "TX-CHECKED")
        check = c.wait_push(C.CHECK_TRANSACTION_STATE, timeout=15)
        assert check.is_oneway and check.ext["transactionId"] == "TX-CHECKED"
        [record] = decode_records(bytes(check.body))
        assert record["topic"] == "RmqTx" and record["body"] == b"checked"
        assert record["properties"]["PGROUP"] == "tx-pg" and record["properties"]["UNIQ_KEY"] == "TX-CHECKED"
        c.send(C.END_TRANSACTION, {
            "producerGroup": "tx-pg", "tranStateTableOffset": check.ext["tranStateTableOffset"],
            "commitLogOffset": check.ext["commitLogOffset"], "commitOrRollback": "8", "fromTransactionCheck": "true",
            "msgId": record["properties"]["UNIQ_KEY"], "transactionId": check.ext["transactionId"]}, oneway=True)
        later = _pull(c, "RmqTx", 0, 1, suspend_ms=5000)
    assert [m["body"] for m in decode_records(bytes(later.body))] == [b"checked"]


def test_view_message_by_id_and_query_message(broker: dict[str, Any]) -> None:
    with JavaLikeClient(broker["addr"]) as c:
        sent = _send(c, "RmqView", b"look at me", UNIQ_KEY="VIEW-1", KEYS="order-9")
        offset = decode_offset_msg_id(sent.ext["msgId"]).commitlog_offset
        view = c.request(C.VIEW_MESSAGE_BY_ID, {"topic": "RmqView", "offset": str(offset)})
        assert view.code == 0
        [m] = decode_records(bytes(view.body))
        assert (m["body"], m["msgId"]) == (b"look at me", sent.ext["msgId"])
        assert c.request(C.VIEW_MESSAGE_BY_ID, {"offset": str(offset + 1)}).code != 0
        # The key index is the lake's: a broker without one reads the (small) topic instead (the lake tests
        # query through the index); by a KEYS word, and by unique id
        window = {"maxNum": "32", "beginTimestamp": "0", "endTimestamp": str(2**62)}
        by_key = c.request(C.QUERY_MESSAGE, {"topic": "RmqView", "key": "order-9", **window})
        by_id = c.request(C.QUERY_MESSAGE, {"topic": "RmqView", "key": "VIEW-1", "_UNIQUE_KEY_QUERY": "true",
                                            **window})
        missing = c.request(C.QUERY_MESSAGE, {"topic": "RmqView", "key": "order-10", **window})
    assert by_key.code == 0 and by_id.code == 0 and missing.code == 22, (by_key, by_id, missing)
    assert [m["msgId"] for m in decode_records(bytes(by_key.body))] == [sent.ext["msgId"]]
    assert [m["properties"]["UNIQ_KEY"] for m in decode_records(bytes(by_id.body))] == ["VIEW-1"]


def test_running_info_is_relayed_to_the_client(broker: dict[str, Any]) -> None:
    with JavaLikeClient(broker["addr"]) as consumer, JavaLikeClient(broker["addr"]) as admin:
        consumer.request(C.HEART_BEAT, None, heartbeat("running-1", consumers=[{
            "groupName": "cg-running", "subscriptionDataSet": [{"topic": "RmqRunning", "subString": "*"}]}]))
        ext = {"consumerGroup": "cg-running", "clientId": "running-1", "jstackEnable": "false"}
        opaque = admin.send(C.GET_CONSUMER_RUNNING_INFO, ext)
        asked = consumer.wait_push(C.GET_CONSUMER_RUNNING_INFO)
        assert not asked.is_oneway and asked.ext["clientId"] == "running-1"
        consumer.answer(asked, 0, None, b'{"properties":{"PROP_CONSUME_TYPE":"CONSUME_PASSIVELY"}}')
        relayed = admin.response(opaque)
        assert relayed.code == 0 and json.loads(bytes(relayed.body))["properties"]["PROP_CONSUME_TYPE"] == \
            "CONSUME_PASSIVELY"
        gone = admin.request(C.GET_CONSUMER_RUNNING_INFO, {**ext, "clientId": "nobody"})
    assert gone.code == 206 and gone.ext["errorCode"] == "CONSUMER_NOT_ONLINE"


def test_what_is_not_served_or_cannot_be_read_gets_a_clear_code(broker: dict[str, Any]) -> None:
    url = broker["url"]
    before = httpx.get(f"{url}/broker", timeout=5).json()["commitlog"]["max_offset"]
    with JavaLikeClient(broker["addr"]) as c:
        unknown = c.request(4242)
        assert unknown.code == 3 and unknown.ext["errorCode"] == "REQUEST_CODE_NOT_SUPPORTED"
        c.send(4242, oneway=True)  # a ONEWAY request is never answered, not even an unknown one
        missing = c.request(C.SEND_MESSAGE_V2, {"a": "pg"}, b"x")
        assert missing.code == 29 and "b" in missing.remark  # the field named
        mistyped = c.request(C.SEND_MESSAGE_V2, {**v2("pg", "RmqBad"), "e": "one"}, b"x")
        assert mistyped.code == 29 and mistyped.ext["errorCode"] == "INVALID_ARGUMENT"
        bad_json = c.request(C.HEART_BEAT, None, b"{not json")
        assert bad_json.code == 29 and "HeartbeatData" in bad_json.remark
        bad_topic = c.request(C.SEND_MESSAGE_V2, v2("pg", "bad topic!"), b"x")
        assert bad_topic.code == 29 and bad_topic.ext["errorCode"] == "TOPIC_ILLEGAL"
        empty = c.request(C.SEND_MESSAGE_V2, v2("pg", "RmqBad"), b"")
        assert empty.code == 13
        lz4 = c.request(C.SEND_MESSAGE_V2, v2("pg", "RmqBad", sys_flag=0x1 | 0x100), b"x")
        assert lz4.code == 13 and "compression" in lz4.remark
        assert c.request(C.SPARKMQ_PING).code == 0  # the connection still serves
    assert httpx.get(f"{url}/broker", timeout=5).json()["commitlog"]["max_offset"] == before
