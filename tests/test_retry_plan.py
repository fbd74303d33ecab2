"""The send-back rules for failed messages: retry levels, the DLQ hop, what rides along."""
from __future__ import annotations

import dataclasses

from sparkmq.platform.broker.retry import plan_send_back
from sparkmq.platform.common.message import StoredMessage


def _stored(topic: str = "Orders", reconsume: int = 0, **props: str) -> StoredMessage:
    properties = {"UNIQ_KEY": "ID1", "TAGS": "TagA", "KEYS": "k1 k2", "user": "u", **props}
    return StoredMessage(topic, 1, 5, 100, 90, b"body", properties, 7, 0, 1, "1.2.3.4:5", 2, "127.0.0.1:10911",
                         reconsume, 0, 0, 0)


def test_retry_levels_follow_the_reconsume_count() -> None:
    first = plan_send_back(_stored(), "g1", reason="boom")
    assert (first.message.topic, first.delay_level, first.reconsume_times, first.dead_letter) == \
        ("%RETRY%g1", 3, 1, False)
    assert first.message.tags == "TagA" and first.message.keys == ("k1", "k2") and first.message.flag == 7
    assert first.message.properties == {"UNIQ_KEY": "ID1", "user": "u", "RETRY_TOPIC": "Orders",
                                        "ORIGIN_MESSAGE_ID": "ID1"}
    # A retry message failing again keeps its first topic; levels grow and stop at the last one.
    again = _stored("%RETRY%g1", reconsume=5, RETRY_TOPIC="Orders", ORIGIN_MESSAGE_ID="ID1", REAL_TOPIC="x",
                    REAL_QID="0", DELAY="8")
    plan = plan_send_back(again, "g1")
    assert plan.delay_level == 8 and plan.message.properties["RETRY_TOPIC"] == "Orders"
    assert not {"REAL_TOPIC", "REAL_QID", "DELAY"} & set(plan.message.properties)
    assert plan_send_back(_stored(reconsume=15), "g1", max_reconsume_times=20).delay_level == 18
    assert plan_send_back(_stored(), "g1", delay_level=2).delay_level == 2


def test_dead_letter_after_max_reconsume_times_with_reason() -> None:
    last_retry = plan_send_back(_stored(reconsume=15), "g1")
    assert not last_retry.dead_letter and last_retry.reconsume_times == 16
    dead = plan_send_back(_stored("%RETRY%g1", reconsume=16, RETRY_TOPIC="Orders"), "g1", reason="ValueError: bad")
    assert dead.dead_letter and dead.delay_level is None and dead.queue_id == 0
    assert dead.message.topic == "%DLQ%g1" and dead.reconsume_times == 17
    assert dead.message.properties["DLQ_ORIGIN_TOPIC"] == "Orders"
    assert dead.message.properties["DLQ_REASON"] == "ValueError: bad"
    assert dead.message.properties["ORIGIN_MESSAGE_ID"] == "ID1"
    now = plan_send_back(_stored(), "g1", delay_level=-1, reason="x" * 5000)
    assert now.dead_letter and len(now.message.properties["DLQ_REASON"]) == 1024
    assert plan_send_back(_stored(reconsume=2), "g1", max_reconsume_times=2).dead_letter


def test_the_original_is_not_modified() -> None:
    original = _stored()
    snapshot = dataclasses.replace(original, properties=dict(original.properties))
    plan_send_back(original, "g1")
    assert original == snapshot
