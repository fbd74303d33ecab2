"""Where a message goes when its consumption failed: back through ``%RETRY%<group>``, or to ``%DLQ%<group>``.

RocketMQ's rules (concurrent consumers):

* the n-th failure (reconsume count n-1 before it) is retried after delay level
  ``3 + (n-1)`` (10 s, 30 s, 1 m, …), through the schedule topic, into the group's retry
  topic, which every consumer of the group subscribes to automatically;
* a consumer may ask for a specific level (> 0), or for -1 / 0 meaning "straight to
  the DLQ" / "broker decides";
* once the count reaches the group's max reconsume times (16), the message goes to
  ``%DLQ%<group>`` (one queue) with its original topic, msgId, count and the failure
  reason in its properties.

The original topic rides along in ``RETRY_TOPIC`` so a consumer can show the message
as it was first sent; the unique id (``UNIQ_KEY``) stays, so traces follow one id.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..common.message import PROPERTY_KEYS, PROPERTY_TAGS, Message, StoredMessage
from ..common.system_topics import (
    PROPERTY_DELAY_LEVEL,
    PROPERTY_DLQ_ORIGIN_TOPIC,
    PROPERTY_DLQ_REASON,
    PROPERTY_ORIGIN_MSG_ID,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_RETRY_TOPIC,
    dlq_topic,
    retry_topic,
)

__all__ = ["DEFAULT_MAX_RECONSUME_TIMES", "RETRY_BASE_LEVEL", "SendBackPlan", "plan_send_back",
           "original_topic"]

#: A group's messages are retried this many times, then dead-lettered.
DEFAULT_MAX_RECONSUME_TIMES = 16
#: The first retry waits delay level 3 (10 s with the default levels).
RETRY_BASE_LEVEL = 3
#: Longest reason kept in a DLQ message's properties.
MAX_REASON_LENGTH = 1024

_PARKING = (PROPERTY_REAL_TOPIC, PROPERTY_REAL_QUEUE_ID, PROPERTY_DELAY_LEVEL)


@dataclass(frozen=True)
class SendBackPlan:
    """What to store for a failed message: the message, its queue, and an optional delay level."""

    message: Message
    queue_id: int
    reconsume_times: int
    delay_level: int | None
    dead_letter: bool


def original_topic(message: StoredMessage) -> str:
    """The topic the message was first sent to (retry messages remember it in ``RETRY_TOPIC``)."""
    return message.properties.get(PROPERTY_RETRY_TOPIC, message.topic)


def plan_send_back(message: StoredMessage, group: str, *, reason: str = "", delay_level: int = 0,
                   max_reconsume_times: int = DEFAULT_MAX_RECONSUME_TIMES, level_count: int = 18,
                   retry_queue_id: int = 0) -> SendBackPlan:
    """The plan for ``message`` that ``group`` failed to consume.

    ``delay_level``: 0 = the broker's schedule (3 + reconsume count), > 0 = that level,
    < 0 = dead-letter now.  Levels past the last one use the last one.

    Example::

        >>> from sparkmq.platform.common.message import StoredMessage
        >>> m = StoredMessage("Orders", 0, 5, 100, 90, b"x", {"UNIQ_KEY": "ID1"}, 0, 0, 0, "", 0, "", 0, 0, 0, 0)
        >>> plan = plan_send_back(m, "g1", reason="boom")
        >>> plan.message.topic, plan.delay_level, plan.reconsume_times
        ('%RETRY%g1', 3, 1)
    """
    times = message.reconsume_times + 1
    props = {k: v for k, v in message.properties.items() if k not in _PARKING}
    tags = props.pop(PROPERTY_TAGS, None)
    keys = tuple(k for k in props.pop(PROPERTY_KEYS, "").split(" ") if k)
    first_topic = original_topic(message)
    props.setdefault(PROPERTY_RETRY_TOPIC, first_topic)
    props.setdefault(PROPERTY_ORIGIN_MSG_ID, message.msg_id)
    if delay_level < 0 or times > max_reconsume_times:
        props[PROPERTY_DLQ_ORIGIN_TOPIC] = first_topic
        props[PROPERTY_DLQ_REASON] = (reason or "exceeded max reconsume times")[:MAX_REASON_LENGTH]
        dead = Message(dlq_topic(group), message.body, tags=tags, keys=keys, properties=props, flag=message.flag)
        return SendBackPlan(dead, 0, times, None, True)
    level = delay_level if delay_level > 0 else RETRY_BASE_LEVEL + message.reconsume_times
    retry = Message(retry_topic(group), message.body, tags=tags, keys=keys, properties=props, flag=message.flag)
    return SendBackPlan(retry, retry_queue_id, times, min(level, level_count), False)
