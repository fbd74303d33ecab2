"""Names the platform reserves: system topics, group-derived topics, and message properties.

RocketMQ's spellings are kept so its users recognise them in traces and tables.
"""
from __future__ import annotations

__all__ = [
    "SCHEDULE_TOPIC", "TIMER_TOPIC", "TRACE_TOPIC", "TRANS_HALF_TOPIC", "TRANS_OP_HALF_TOPIC", "DLEDGER_NOOP_TOPIC",
    "POP_REVIVE_TOPIC",
    "RETRY_PREFIX", "DLQ_PREFIX", "SYSTEM_TOPICS", "retry_topic", "dlq_topic", "is_system_topic",
    "PROPERTY_DELAY_LEVEL", "PROPERTY_REAL_TOPIC", "PROPERTY_REAL_QUEUE_ID", "PROPERTY_TIMER_DELIVER_MS",
    "PROPERTY_TIMER_DELAY_SEC", "PROPERTY_TIMER_DELAY_MS", "PROPERTY_RETRY_TOPIC", "PROPERTY_ORIGIN_MSG_ID",
    "PROPERTY_RECONSUME_TIME",
    "PROPERTY_MAX_RECONSUME_TIMES", "PROPERTY_DLQ_ORIGIN_TOPIC", "PROPERTY_DLQ_REASON",
    "PROPERTY_TRANSACTION_PREPARED", "PROPERTY_PRODUCER_GROUP", "PROPERTY_TRAN_MSG_ID",
    "PROPERTY_CHECK_IMMUNITY_S", "PROPERTY_TRANSACTION_CHECK_TIMES", "PROPERTY_SHARDING_KEY",
    "PROPERTY_TIMER_ENQUEUE_MS", "DELAY_PROPERTIES",
]

#: Delay-level messages park here, one queue per level (queue id = level - 1).
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
#: Timer messages (any delivery time) park here until due (RocketMQ 5's timer topic).
TIMER_TOPIC = "rmq_sys_wheel_timer"
#: Trace events.
TRACE_TOPIC = "RMQ_SYS_TRACE_TOPIC"
#: Transaction half messages and the op records that settle them.
TRANS_HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
TRANS_OP_HALF_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
#: A new DLedger leader's no-op entry: one record here (no consumer subscribes), committing what earlier
#: leaders left with it.
DLEDGER_NOOP_TOPIC = "RMQ_SYS_DLEDGER_NOOP"
#: POP consumption's records (deliveries in flight, acks), replayed on start (RocketMQ's REVIVE topic).
POP_REVIVE_TOPIC = "rmq_sys_REVIVE_LOG"
RETRY_PREFIX = "%RETRY%"
DLQ_PREFIX = "%DLQ%"

SYSTEM_TOPICS = frozenset({SCHEDULE_TOPIC, TIMER_TOPIC, TRACE_TOPIC, TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC,
                           DLEDGER_NOOP_TOPIC, POP_REVIVE_TOPIC})

PROPERTY_DELAY_LEVEL = "DELAY"
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_REAL_QUEUE_ID = "REAL_QID"
PROPERTY_TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
PROPERTY_TIMER_DELAY_SEC = "TIMER_DELAY_SEC"
PROPERTY_TIMER_DELAY_MS = "TIMER_DELAY_MS"
PROPERTY_TIMER_ENQUEUE_MS = "TIMER_ENQUEUE_MS"
#: Properties a delayed or timer send uses to ask for parking (the broker strips them before parking).
DELAY_PROPERTIES = (PROPERTY_DELAY_LEVEL, PROPERTY_TIMER_DELIVER_MS, PROPERTY_TIMER_DELAY_SEC,
                    PROPERTY_TIMER_DELAY_MS)
PROPERTY_RETRY_TOPIC = "RETRY_TOPIC"
PROPERTY_ORIGIN_MSG_ID = "ORIGIN_MESSAGE_ID"
PROPERTY_RECONSUME_TIME = "RECONSUME_TIME"
PROPERTY_MAX_RECONSUME_TIMES = "MAX_RECONSUME_TIMES"
PROPERTY_DLQ_ORIGIN_TOPIC = "DLQ_ORIGIN_TOPIC"
PROPERTY_DLQ_REASON = "DLQ_REASON"
PROPERTY_TRANSACTION_PREPARED = "TRAN_MSG"
PROPERTY_PRODUCER_GROUP = "PGROUP"
PROPERTY_TRAN_MSG_ID = "__transactionId__"
PROPERTY_CHECK_IMMUNITY_S = "CHECK_IMMUNITY_TIME_IN_SECONDS"
#: How many times the broker checked back on a half message (set on the message a check-back shows).
PROPERTY_TRANSACTION_CHECK_TIMES = "TRANSACTION_CHECK_TIMES"
PROPERTY_SHARDING_KEY = "SHARDING_KEY"


def retry_topic(group: str) -> str:
    """``%RETRY%<group>``: where a group's failed messages come back."""
    return RETRY_PREFIX + group


def dlq_topic(group: str) -> str:
    """``%DLQ%<group>``: where a group's messages go after the max reconsume times."""
    return DLQ_PREFIX + group


def is_system_topic(topic: str) -> bool:
    """Whether ``topic`` is reserved: created and written by the broker only."""
    return topic in SYSTEM_TOPICS or topic.startswith((RETRY_PREFIX, DLQ_PREFIX))
