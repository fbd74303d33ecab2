"""sparkmq's client answers what brokers push over RocketMQ's protocol: GET_CONSUMER_RUNNING_INFO relayed from an
admin (as ``mqadmin consumerStatus`` asks it), for the threaded and the asyncio consumer, and a running-info request
for a client that left is CONSUMER_NOT_ONLINE."""
from __future__ import annotations

import asyncio
import json
import re
import uuid
from pathlib import Path
from typing import Any

import pytest
from rocketmq_wire import JavaLikeClient

from procs import ProcessHarness, fast_client_config, wait_until
from sparkmq.platform.client import AdminClient, AsyncConsumer, ConsumeStatus, PushConsumer
from sparkmq.platform.common.protocol import RequestCode

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def platform(module_procs: ProcessHarness, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    namesrv, broker = module_procs.start_platform(tmp_path_factory.mktemp("pushes") / "data", "--no-trace")
    return {"namesrv": namesrv.addr, "broker": broker.addr, "tmp": tmp_path_factory.mktemp("offsets")}


def _running_info(broker: str, group: str, client_id: str) -> Any:
    with JavaLikeClient(broker) as admin:
        return admin.request(RequestCode.GET_CONSUMER_RUNNING_INFO,
                             {"consumerGroup": group, "clientId": client_id, "jstackEnable": "false"})


def _mq_table_queues(body: bytes, topic: str) -> list[int]:
    """The queue ids of ``topic`` in a ConsumerRunningInfo's ``mqTable`` (MessageQueue-keyed: not JSON, read as
    text)."""
    pattern = rb'"queueId":(\d+),"topic":"' + topic.encode() + rb'"\}:\{"commitOffset"'
    return sorted(int(q) for q in re.findall(pattern, body))


def test_a_push_consumer_answers_running_info_relayed_by_its_broker(platform: dict[str, Any], tmp_path: Path) -> None:
    group, topic = f"cg-running-{uuid.uuid4().hex[:6]}", "RunningInfo"
    config = fast_client_config(platform["namesrv"], tmp_path)
    consumer = PushConsumer(group, config, consume_from_where="FIRST_OFFSET")
    consumer.subscribe(topic)
    consumer.register_listener(lambda messages: ConsumeStatus.CONSUME_SUCCESS)
    with AdminClient(config) as admin:
        admin.create_topic(topic, read_queue_nums=2, write_queue_nums=2)
    consumer.start()
    try:
        wait_until(lambda: len(consumer.assignment()) == 2, 20, "the consumer's queues")
        answer = _running_info(platform["broker"], group, consumer.client_id)
        assert answer.code == 0, answer.remark
        body = bytes(answer.body)
        assert _mq_table_queues(body, topic) == [0, 1]
        tail = body[body.index(b'},"properties"') + 2:]  # past the MessageQueue-keyed map: plain JSON
        rest = json.loads(b"{" + tail)
        assert rest["properties"]["PROP_CONSUME_TYPE"] == "CONSUME_PASSIVELY"
        assert [s["topic"] for s in rest["subscriptionSet"]] == sorted([topic, f"%RETRY%{group}"])
    finally:
        consumer.shutdown()
    gone = _running_info(platform["broker"], group, consumer.client_id)
    assert gone.code == 206 and gone.ext["errorCode"] == "CONSUMER_NOT_ONLINE"


def test_an_asyncio_consumer_answers_running_info_too(platform: dict[str, Any], tmp_path: Path) -> None:
    group, topic = f"cg-running-aio-{uuid.uuid4().hex[:6]}", "RunningInfoAio"
    config = fast_client_config(platform["namesrv"], tmp_path)
    with AdminClient(config) as admin:
        admin.create_topic(topic, read_queue_nums=2, write_queue_nums=2)

    async def run() -> Any:
        consumer = AsyncConsumer(group, config, consume_from_where="FIRST_OFFSET")
        consumer.subscribe(topic)
        async with consumer:
            for _ in range(100):
                if len(consumer.assignment()) == 2:
                    break
                await asyncio.sleep(0.1)
            return await asyncio.to_thread(_running_info, platform["broker"], group, consumer.client_id)

    answer = asyncio.run(run())
    assert answer.code == 0, answer.remark
    assert _mq_table_queues(bytes(answer.body), topic) == [0, 1]
