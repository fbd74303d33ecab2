"""Sends over remoting: SEND_MESSAGE (10), SEND_MESSAGE_V2 (310), SEND_BATCH_MESSAGE (320), sparkmq's
SPARKMQ_SEND_PACKED (30001), and CONSUMER_SEND_MSG_BACK (36) -- RocketMQ's SendMessageProcessor's requests.

A single send's properties string carries everything RocketMQ puts there (TAGS, KEYS, UNIQ_KEY, DELAY, TRAN_MSG and
PGROUP for a half message, TIMER_* for a timer message, the user's own); the answer's code says how durable it is
(0, or 10/11/12: stored all the same).  Batches go to the native core as one packed batch, no Python per message.
"""
from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from ...platform.auth import Action, Resource
from ...platform.broker.processors import OutgoingMessage, PackedSendResult
from ...platform.common import protocol as p
from ...platform.common.errors import ErrorCode, SparkMQError
from ...platform.common.ids import offset_msg_id_prefix
from ...platform.common.message import PROPERTY_UNIQUE_ID, SendResult, SendStatus
from ...platform.common.protocol import SEND_STATUS_CODES, RequestCode
from ...platform.common.sysflag import COMPRESSED
from ...platform.common.system_topics import PROPERTY_PRODUCER_GROUP, PROPERTY_TRANSACTION_PREPARED
from ...platform.common.validation import check_int
from ...platform.remoting import Deferred, Frame, Reply, ServerConnection
from ...platform.store.message_store import unpack_batch
from ...storage_native import StoreError, decode_rocketmq_batch
from ._common import Handler, NeedsOf, peer_host, properties_of, reply, sub_group, threaded

if TYPE_CHECKING:
    from . import BrokerRemoting

__all__ = ["family"]

#: sysFlag bits 8-10: the body's compression (RocketMQ's CompressionType); 0 and 3 are zlib, the one sparkmq keeps.
_COMPRESSION_SHIFT = 8
_ZLIB_TYPES = (0, 3)


def _compressed(sys_flag: int) -> bool:
    """Whether a send's body is compressed; MESSAGE_ILLEGAL for a compression other than zlib (LZ4, ZSTD)."""
    if not sys_flag & COMPRESSED:
        return False
    kind = (sys_flag >> _COMPRESSION_SHIFT) & 0x7
    if kind not in _ZLIB_TYPES:
        raise SparkMQError(ErrorCode.MESSAGE_ILLEGAL, f"compression type {kind} is not supported (zlib only)")
    return True


def _send_reply(result: SendResult, status: SendStatus | None = None) -> Reply:
    # ``ext_fields(SendMessageResponseHeader(...))``, built directly: a single send's hot path.
    return reply({"msgId": result.offset_msg_id, "queueId": str(result.queue_id),
                  "queueOffset": str(result.queue_offset), "transactionId": result.msg_id,
                  "MSG_REGION": "DefaultRegion", "TRACE_ON": "true", "storeTimestamp": str(result.store_timestamp)},
                 code=SEND_STATUS_CODES[status or result.status])


def _packed_reply(result: PackedSendResult, status: SendStatus | None = None) -> Reply:
    status = status or result.status
    return reply(p.SendPackedResponseHeader(str(status), result.topic, result.broker_name, result.queue_id,
                                            result.first_queue_offset, result.count, result.store_timestamp,
                                            result.store_host), result.offsets, code=SEND_STATUS_CODES[status])


class _Sends:
    def __init__(self, remoting: BrokerRemoting) -> None:
        self.remoting = remoting
        self.broker = remoting.broker

    # -- single messages ------------------------------------------------------------------------
    def send_message(self, conn: ServerConnection, frame: Frame) -> Reply | Deferred | Awaitable[Reply]:
        """SEND_MESSAGE: one message, RocketMQ's full-name header."""
        return self._send(conn, frame, frame.header_as(p.SendMessageRequestHeader))

    def send_message_v2(self, conn: ServerConnection, frame: Frame) -> Reply | Deferred | Awaitable[Reply]:
        """SEND_MESSAGE_V2: one message, the one-letter header RocketMQ's clients send by default."""
        return self._send(conn, frame, frame.header_as(p.SendMessageRequestHeaderV2))

    def _send(self, conn: ServerConnection, frame: Frame,
              h: p.SendMessageRequestHeader) -> Reply | Deferred | Awaitable[Reply]:
        props = properties_of(h.properties)
        message = OutgoingMessage(bytes(frame.body), None, (), props, None, h.flag)
        if props.get(PROPERTY_TRANSACTION_PREPARED) == "true":
            return self._half(conn, h, message)
        queue_id = h.queueId if h.queueId is not None and h.queueId >= 0 else None  # RocketMQ: < 0 = any queue
        sending = self.broker.send_processor
        result, end_offset = sending.send_nowait(
            h.topic, message, queue_id=queue_id, compressed=_compressed(h.sysFlag), producer_group=h.producerGroup,
            born_timestamp=h.bornTimestamp or None, born_host=peer_host(conn), reconsume_times=h.reconsumeTimes or 0)
        if not sending.send_may_block:
            return _send_reply(result)
        return self.remoting.when_acknowledged(end_offset, lambda status: _send_reply(result, status))

    def _half(self, conn: ServerConnection, h: p.SendMessageRequestHeader,
              message: OutgoingMessage) -> Awaitable[Reply]:
        """A transaction's half message (TRAN_MSG=true): stored invisible until END_TRANSACTION."""
        group = message.properties.get(PROPERTY_PRODUCER_GROUP) or h.producerGroup
        queue_id = h.queueId if h.queueId is not None and h.queueId >= 0 else None
        transactions = self.broker.transaction_processor

        def send() -> Reply:
            answer = transactions.send_half(h.topic, message, group, queue_id=queue_id,
                                            born_timestamp=h.bornTimestamp or None, born_host=peer_host(conn))
            return reply(p.SendMessageResponseHeader(answer["offset_msg_id"], answer["queue_id"],
                                                     answer["queue_offset"], transactionId=answer["transaction_id"],
                                                     storeTimestamp=answer["store_timestamp"]),
                         code=SEND_STATUS_CODES[answer["status"]])
        return threaded(send, self.remoting.queued(pull=False))

    # -- batches --------------------------------------------------------------------------------
    def send_batch_message(self, conn: ServerConnection, frame: Frame) -> Reply | Deferred | Awaitable[Reply]:
        """RocketMQ's batch: decoded into sparkmq's packed batch by the native core, appended as one."""
        h = frame.header_as(p.SendMessageRequestHeaderV2)
        born = check_int("bornTimestamp", h.bornTimestamp, 0, 2**63 - 1) or _now_ms()
        try:
            packed, count = decode_rocketmq_batch(frame.body, born)
        except StoreError as exc:  # the native decoder's MESSAGE_ILLEGAL, naming the entry
            raise SparkMQError(ErrorCode.MESSAGE_ILLEGAL, exc.message) from None
        queue_id = h.queueId if h.queueId is not None and h.queueId >= 0 else None
        batch_id = properties_of(h.properties).get(PROPERTY_UNIQUE_ID)

        def answer(result: PackedSendResult, status: SendStatus | None = None) -> Reply:
            prefix = offset_msg_id_prefix(result.store_host)
            ids = ",".join(f"{prefix}{o:016X}" for o in memoryview(result.offsets).cast("q"))
            # RocketMQ's broker answers the batch's own UNIQ_KEY as transactionId and no batchUniqId: the Java
            # client takes a batchUniqId for an inner batch and then reports that one id instead of each message's
            return reply(p.SendMessageResponseHeader(ids, result.queue_id, result.first_queue_offset,
                                                     transactionId=batch_id, storeTimestamp=result.store_timestamp),
                         code=SEND_STATUS_CODES[status or result.status])
        return self._send_packed(conn, h.topic, packed, count, queue_id, None, _compressed(h.sysFlag),
                                 h.producerGroup, answer)

    def send_packed(self, conn: ServerConnection, frame: Frame) -> Reply | Deferred | Awaitable[Reply]:
        """sparkmq's packed batch: appended by the native core as it arrived."""
        h = frame.header_as(p.SendPackedRequestHeader)
        if h.delayLevel is not None or h.deliverAtMs is not None or h.delayMs is not None:
            return self._send_delayed(conn, frame, h)
        return self._send_packed(conn, h.topic, frame.body, h.count, h.queueId, h.shardingKey, h.compressed,
                                 h.producerGroup, _packed_reply)

    def _send_packed(self, conn: ServerConnection, topic: str, data: bytes | memoryview, count: int,
                     queue_id: int | None, sharding_key: str | None, compressed: bool, group: str | None,
                     answer: Callable[..., Reply]) -> Reply | Deferred | Awaitable[Reply]:
        sending = self.broker.send_processor
        may_block = sending.send_may_block  # SYNC_FLUSH, SYNC_MASTER, DLedger: answer once acknowledged
        result = sending.send_packed(topic, data, count, queue_id=queue_id, sharding_key=sharding_key,
                                     compressed=compressed, producer_group=group, born_host=peer_host(conn),
                                     wait=not may_block)
        if not may_block:
            return answer(result)
        return self.remoting.when_acknowledged(result.end_offset, lambda status: answer(result, status))

    def _send_delayed(self, conn: ServerConnection, frame: Frame, h: p.SendPackedRequestHeader) -> Awaitable[Reply]:
        # Each message parks on its own (schedule or timer topic): the Python path, not the packed one.
        messages = [OutgoingMessage(body, None, (), props) for body, props in unpack_batch(frame.body, h.count)]
        sending = self.broker.send_processor
        store_host = sending.store_host

        def send() -> Reply:
            result = sending.send_batch(h.topic, messages, queue_id=h.queueId, sharding_key=h.shardingKey,
                                        compressed=h.compressed, producer_group=h.producerGroup,
                                        born_host=peer_host(conn), delay_level=h.delayLevel,
                                        deliver_at_ms=h.deliverAtMs, delay_ms=h.delayMs)
            offsets = b"".join(r.commitlog_offset.to_bytes(8, "little", signed=True) for r in result.results)
            first = result.results[0]
            return reply(p.SendPackedResponseHeader(
                str(result.status), result.topic, result.broker_name, result.queue_id, first.queue_offset,
                len(result.results), first.store_timestamp, store_host,
                ",".join(str(r.queue_offset) for r in result.results)), offsets,
                code=SEND_STATUS_CODES[result.status])
        return threaded(send, self.remoting.queued(pull=False))

    # -- a consumer's failed message ------------------------------------------------------------
    def send_back(self, conn: ServerConnection, frame: Frame) -> Awaitable[Reply]:
        """CONSUMER_SEND_MSG_BACK: the message at commit-log ``offset`` to ``%RETRY%<group>`` (delay level 0: 3 +
        its reconsume times), or to ``%DLQ%<group>`` past the max reconsume times or with a negative level."""
        h = frame.header_as(p.ConsumerSendMsgBackRequestHeader)
        sending = self.broker.send_processor

        def send_back() -> Reply:
            extra: dict[str, Any] = {}
            if h.maxReconsumeTimes is not None:
                extra["max_reconsume_times"] = h.maxReconsumeTimes
            answer = sending.send_back(h.group, None, commitlog_offset=h.offset, delay_level=h.delayLevel,
                                       reason=h.reason or "", **extra)
            return reply(p.SendBackResponseHeader(answer["status"], answer["topic"], answer["delay_level"],
                                                  answer["reconsume_times"], answer["msg_id"],
                                                  answer["offset_msg_id"]))
        return threaded(send_back, self.remoting.queued(pull=False))


def _now_ms() -> int:
    return int(time.time() * 1000)


def _pub(kind: type[Any]) -> NeedsOf:
    return lambda frame: [(Action.PUB, Resource.topic(frame.header_as(kind).topic))]


def family(remoting: BrokerRemoting) -> tuple[dict[int, Handler], dict[int, NeedsOf | str]]:
    """The send handlers and what each needs with ACL on (Pub on the topic; Sub on the group for a send-back)."""
    sends = _Sends(remoting)
    handlers: dict[int, Handler] = {
        RequestCode.SEND_MESSAGE: sends.send_message,
        RequestCode.SEND_MESSAGE_V2: sends.send_message_v2,
        RequestCode.SEND_BATCH_MESSAGE: sends.send_batch_message,
        RequestCode.SPARKMQ_SEND_PACKED: sends.send_packed,
        RequestCode.CONSUMER_SEND_MSG_BACK: sends.send_back,
    }
    needs: dict[int, NeedsOf | str] = {
        RequestCode.SEND_MESSAGE: _pub(p.SendMessageRequestHeader),
        RequestCode.SEND_MESSAGE_V2: _pub(p.SendMessageRequestHeaderV2),
        RequestCode.SEND_BATCH_MESSAGE: _pub(p.SendMessageRequestHeaderV2),
        RequestCode.SPARKMQ_SEND_PACKED: _pub(p.SendPackedRequestHeader),
        RequestCode.CONSUMER_SEND_MSG_BACK: lambda f: sub_group(f.header_as(p.ConsumerSendMsgBackRequestHeader).group),
    }
    return handlers, needs

