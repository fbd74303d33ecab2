"""Pulls and queue offsets over remoting: PULL_MESSAGE (11), LITE_PULL_MESSAGE (361), sparkmq's SPARKMQ_PULL_PACKED
(30002), GET_MAX_OFFSET (30), GET_MIN_OFFSET (31), SEARCH_OFFSET_BY_TIMESTAMP (29), GET_EARLIEST_MSG_STORETIME (32)
and SPARKMQ_QUEUE_OFFSETS (30006).

A pull is long-polled (SUSPEND flag: held up to ``suspendTimeoutMillis``, woken by arrivals), commits the offset it
carries (COMMIT_OFFSET flag) and filters by its subscription (SUBSCRIPTION flag; else the group's, from its
heartbeats, as RocketMQ's broker does).  Its answer's code is RocketMQ's (0 found, 19 nothing new, 20 none matched,
21 start elsewhere: ``nextBeginOffset``), its header always carries every bound.  PULL_MESSAGE's body is the stored
records re-encoded as RocketMQ's by the native core; SPARKMQ_PULL_PACKED's is the records as stored.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ...platform.common import protocol as p
from ...platform.common.protocol import (
    MAX_LONG_POLL_MS,
    MAX_PULL_BATCH,
    PULL_FLAG_COMMIT_OFFSET,
    PULL_FLAG_SUBSCRIPTION,
    PULL_FLAG_SUSPEND,
    PackedPull,
    RequestCode,
    pull_response_code,
)
from ...platform.remoting import Frame, Reply, ServerConnection
from ...storage_native import encode_rocketmq_records
from ._common import Handler, NeedsOf, client_id_of, reply, sub_group, sub_topic

if TYPE_CHECKING:
    from . import BrokerRemoting

__all__ = ["family"]

#: RocketMQ's master broker id: sparkmq's brokers always suggest pulling from the master next (RocketMQ's default
#: ``slaveReadEnable=false``); a client that pulls from a slave while its master is down comes back to the master.
_MASTER_ID = "0"


class _Pulls:
    def __init__(self, remoting: BrokerRemoting) -> None:
        self.broker = remoting.broker

    async def _pull(self, conn: ServerConnection, h: p.PullMessageRequestHeader, *, rocketmq: bool) -> PackedPull:
        flags = h.sysFlag
        if flags & PULL_FLAG_SUBSCRIPTION:
            filter_type, expression = (h.expressionType or "TAG"), h.subscription
        elif rocketmq:
            filter_type, expression = self.broker.pull_processor.group_subscription(h.consumerGroup, h.topic)
        else:  # sparkmq's own pull filters by its request only (the Spark source's bulk reads carry none)
            filter_type, expression = "TAG", None
        tag = filter_type.upper() == "TAG"
        # RocketMQ's broker caps a pull's size and hold silently; so does this one for RocketMQ's requests.
        max_count = min(h.maxMsgNums, MAX_PULL_BATCH) if rocketmq else h.maxMsgNums
        wait_ms = min(max(h.suspendTimeoutMillis, 0), MAX_LONG_POLL_MS) if flags & PULL_FLAG_SUSPEND else 0
        group = h.consumerGroup or None
        return await self.broker.pull_processor.pull_packed(
            h.topic, h.queueId, h.queueOffset, max_count, expression if tag else None, wait_ms=wait_ms,
            group=group, commit_offset=h.commitOffset if flags & PULL_FLAG_COMMIT_OFFSET and group else None,
            filter_type=filter_type, expression=None if tag else expression,
            client_id=h.clientId or client_id_of(conn))

    @staticmethod
    def _answer(h: p.PullMessageRequestHeader, result: PackedPull, body: bytes, count: int | None) -> Reply:
        # ``ext_fields(PullMessageResponseHeader(...))``, built directly: every pull's answer.
        ext = {"suggestWhichBrokerId": _MASTER_ID, "nextBeginOffset": str(result.next_offset),
               "minOffset": str(result.min_offset), "maxOffset": str(result.max_offset)}
        if count is not None:
            ext["msgCount"] = str(count)
        return reply(ext, body, code=pull_response_code(result.status, h.queueOffset), remark=str(result.status))

    async def pull_message(self, conn: ServerConnection, frame: Frame) -> Reply:
        """PULL_MESSAGE / LITE_PULL_MESSAGE: the records in RocketMQ's stored-message encoding."""
        h = frame.header_as(p.PullMessageRequestHeader)
        result = await self._pull(conn, h, rocketmq=True)
        return self._answer(h, result, encode_rocketmq_records(result.data) if result.count else b"", None)

    async def pull_packed(self, conn: ServerConnection, frame: Frame) -> Reply:
        """SPARKMQ_PULL_PACKED: the records as the store holds them (``msgCount`` of them)."""
        h = frame.header_as(p.PullMessageRequestHeader)
        result = await self._pull(conn, h, rocketmq=False)
        return self._answer(h, result, result.data, result.count)

    # -- queue offsets --------------------------------------------------------------------------
    def max_offset(self, conn: ServerConnection, frame: Frame) -> Reply:
        """GET_MAX_OFFSET: the offset the queue's next message gets."""
        h = frame.header_as(p.QueueRequestHeader)
        return reply(p.OffsetResponseHeader(self.broker.pull_processor.queue_offsets(h.topic, h.queueId)["max_offset"]))

    def min_offset(self, conn: ServerConnection, frame: Frame) -> Reply:
        """GET_MIN_OFFSET: the oldest offset the queue still holds."""
        h = frame.header_as(p.QueueRequestHeader)
        return reply(p.OffsetResponseHeader(self.broker.pull_processor.queue_offsets(h.topic, h.queueId)["min_offset"]))

    def search_offset(self, conn: ServerConnection, frame: Frame) -> Reply:
        """SEARCH_OFFSET_BY_TIMESTAMP: the offset stored at a time (LOWER or UPPER bound)."""
        h = frame.header_as(p.SearchOffsetRequestHeader)
        return reply(p.OffsetResponseHeader(self.broker.pull_processor.search_offset(h.topic, h.queueId, h.timestamp,
                                                                                     h.boundaryType)))

    def earliest_store_time(self, conn: ServerConnection, frame: Frame) -> Reply:
        """GET_EARLIEST_MSG_STORETIME: when the queue's oldest message was stored."""
        h = frame.header_as(p.QueueRequestHeader)
        return reply(p.EarliestMsgStoretimeResponseHeader(
            self.broker.pull_processor.earliest_store_time(h.topic, h.queueId)))

    def queue_offsets(self, conn: ServerConnection, frame: Frame) -> Reply:
        """SPARKMQ_QUEUE_OFFSETS: a queue's bounds in one answer (and the offset for a time)."""
        h = frame.header_as(p.QueueRequestHeader)
        answer = self.broker.pull_processor.queue_offsets(h.topic, h.queueId, h.timestamp)
        return reply(p.QueueOffsetsResponseHeader(answer["min_offset"], answer["max_offset"], answer.get("offset")))


def _pull_needs(frame: Frame) -> list[tuple]:
    h = frame.header_as(p.PullMessageRequestHeader)
    return sub_topic(h.topic) + (sub_group(h.consumerGroup) if h.consumerGroup else [])


def _queue_needs(frame: Frame) -> list[tuple]:
    return sub_topic(frame.header_as(p.QueueRequestHeader).topic)


def family(remoting: BrokerRemoting) -> tuple[dict[int, Handler], dict[int, NeedsOf | str]]:
    """The pull and queue-offset handlers and what each needs with ACL on (Sub on the topic, and on the group)."""
    pulls = _Pulls(remoting)
    handlers: dict[int, Handler] = {
        RequestCode.PULL_MESSAGE: pulls.pull_message,
        RequestCode.LITE_PULL_MESSAGE: pulls.pull_message,
        RequestCode.SPARKMQ_PULL_PACKED: pulls.pull_packed,
        RequestCode.GET_MAX_OFFSET: pulls.max_offset,
        RequestCode.GET_MIN_OFFSET: pulls.min_offset,
        RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: pulls.search_offset,
        RequestCode.GET_EARLIEST_MSG_STORETIME: pulls.earliest_store_time,
        RequestCode.SPARKMQ_QUEUE_OFFSETS: pulls.queue_offsets,
    }
    needs: dict[int, NeedsOf | str] = {
        RequestCode.PULL_MESSAGE: _pull_needs,
        RequestCode.LITE_PULL_MESSAGE: _pull_needs,
        RequestCode.SPARKMQ_PULL_PACKED: _pull_needs,
        RequestCode.GET_MAX_OFFSET: _queue_needs,
        RequestCode.GET_MIN_OFFSET: _queue_needs,
        RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: lambda f: sub_topic(f.header_as(p.SearchOffsetRequestHeader).topic),
        RequestCode.GET_EARLIEST_MSG_STORETIME: _queue_needs,
        RequestCode.SPARKMQ_QUEUE_OFFSETS: _queue_needs,
    }
    return handlers, needs
