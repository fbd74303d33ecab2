"""The client's side of the remoting protocol (RocketMQ's, ``docs/remoting.md``): requests to one broker, and the
requests brokers push.

* Request builders and answer decoders shared by the threaded and the asyncio clients: the threaded ``send`` and a
  delayed send are SEND_MESSAGE_V2 with RocketMQ's properties string (:func:`send_ext`); a batch, ``send_async``'s
  batches and ``AsyncProducer.send`` sparkmq's SPARKMQ_SEND_PACKED (packed by ``encode_batch`` in C); a pull
  SPARKMQ_PULL_PACKED (its records decoded by ``decode_records`` in C), heartbeats HEART_BEAT with RocketMQ's
  HeartbeatData (:func:`heartbeat_data`), offsets QUERY_CONSUMER_OFFSET and sparkmq's batched
  SPARKMQ_UPDATE_CONSUMER_OFFSETS, locks LOCK_BATCH_MQ / UNLOCK_BATCH_MQ, a failed message CONSUMER_SEND_MSG_BACK.
* :class:`RemotingBrokerClient` -- one broker for the threaded clients, with the method names and results of the
  HTTP :class:`~.remoting.BrokerClient` for what producers and consumers call.  The transport is explicit: a call this
  class does not have is not made over HTTP behind the caller's back (admin calls are the AdminClient's, over HTTP).
* Pushes (:func:`on_push`, every pool's callback): NOTIFY_CONSUMER_IDS_CHANGED wakes the consumers' membership
  watches, RESET_CONSUMER_CLIENT_OFFSET restarts the named queues, CHECK_TRANSACTION_STATE (its body a RocketMQ stored
  record) queues for :meth:`RemotingBrokerClient.transaction_checks`, GET_CONSUMER_RUNNING_INFO is answered by the
  consumer it names.
"""
from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from ...storage_native import decode_records
from ..auth.signing import Credentials, Signer
from ..common import protocol as p
from ..common.codec import encode_properties
from ..common.errors import ErrorCode, SparkMQError
from ..common.ids import decode_offset_msg_id
from ..common.message import KEY_SEPARATOR, PROPERTY_KEYS, PROPERTY_TAGS, PROPERTY_UNIQUE_ID, SendResult, SendStatus
from ..common.protocol import (
    PULL_FLAG_COMMIT_OFFSET,
    PULL_FLAG_SUBSCRIPTION,
    PULL_FLAG_SUSPEND,
    PULL_OUTCOME_CODES,
    SEND_OUTCOME_CODES,
    SEND_STATUS_OF_CODE,
    PullResult,
    RequestCode,
    ResponseCode,
    pull_status_of,
)
from ..common.rocketmq_records import decode_rocketmq_records
from ..common.system_topics import (
    PROPERTY_DELAY_LEVEL,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_TIMER_DELAY_MS,
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_TRANSACTION_CHECK_TIMES,
    PROPERTY_TRANSACTION_PREPARED,
)
from ..common.tls import TlsSettings
from ..common.wire import ReceivedMessage, decode_body, encode_body, inflate
from ..remoting import AsyncRemotingClient, Ext, Frame, Reply, Response, SyncRemotingClient, error_reply

__all__ = [
    "RemotingBrokerClient", "AsyncRemotingBrokers", "AsyncBrokerRouter", "sync_transport", "ext_signer",
    "send_ext", "properties_text", "delay_properties", "packed_ext", "pull_ext", "heartbeat_data", "consumer_data_body",
    "decode_send", "decode_packed", "decode_pulled", "decode_members", "offset_msg_ids",
    "OffsetReset", "PushedCheck", "on_offset_reset", "forget_offset_reset", "on_running_info",
    "forget_running_info", "on_push",
]

log = logging.getLogger("sparkmq.client")

_encode_json = msgspec.json.Encoder().encode
_decode_members = msgspec.json.Decoder(p.ConsumerIdList).decode
_decode_versions = msgspec.json.Decoder(p.HeartbeatResponseBody).decode
_decode_group = msgspec.json.Decoder(p.GroupInfoBody).decode
_decode_locked = msgspec.json.Decoder(p.LockBatchResponseBody).decode

#: What a pull, a query of an offset and a send answer with besides errors.
_PULL_OK = PULL_OUTCOME_CODES
_SEND_OK = SEND_OUTCOME_CODES
_QUERY_OK = frozenset({ResponseCode.SUCCESS, ResponseCode.QUERY_NOT_FOUND})

#: ``sign(code, ext, body) -> ext``: a request's extFields, signed for a broker with ACL on.
ExtSigner = Callable[[int, Ext, bytes | memoryview], Ext]


def ext_signer(credentials: Credentials | None) -> ExtSigner:
    """``sign(code, ext, body)`` -> the extFields to send: as they are without ``credentials``, else with the
    signature fields added (docs/security.md; RocketMQ's AccessKey/Signature scheme)."""
    if credentials is None:
        return lambda code, ext, body: ext
    signer = Signer(credentials)

    def sign(code: int, ext: Ext, body: bytes | memoryview) -> Ext:
        fields = p.ext_fields(ext) if isinstance(ext, p.ExtHeader) else dict(ext or {})
        return signer.sign_ext(code, fields, body)
    return sign


# -- requests ---------------------------------------------------------------------------------------------
def properties_text(properties: Mapping[str, str], *, tags: str | None = None, keys: Sequence[str] = (),
                    msg_id: str | None = None, extra: Mapping[str, str] | None = None) -> str:
    """A message's RocketMQ properties string (``name\\x01value\\x02`` pairs): the user's properties, then TAGS, KEYS
    (space-separated), UNIQ_KEY and ``extra`` (DELAY, TRAN_MSG, ...).  MESSAGE_ILLEGAL for a separator in a name or
    value, an empty name, or a key holding a space (KEYS could not carry it).

    Example::

        >>> properties_text({"color": "blue"}, tags="A", keys=("k1", "k2"), msg_id="ID1")
        'color\\x01blue\\x02TAGS\\x01A\\x02KEYS\\x01k1 k2\\x02UNIQ_KEY\\x01ID1\\x02'
    """
    if not properties and tags is None and not keys and not extra and msg_id is not None \
            and msg_id.isalnum() and msg_id.isascii():
        return f"{PROPERTY_UNIQUE_ID}\x01{msg_id}\x02"  # a plain message with its generated id: the hot path
    merged = dict(properties)
    if tags is not None:
        merged[PROPERTY_TAGS] = tags
    if keys:
        for key in keys:
            if not isinstance(key, str) or not key or KEY_SEPARATOR in key:
                raise SparkMQError(ErrorCode.MESSAGE_ILLEGAL, f"a key must be a non-empty string without spaces, "
                                                              f"got {key!r}")
        merged[PROPERTY_KEYS] = KEY_SEPARATOR.join(keys)
    if msg_id is not None:
        merged[PROPERTY_UNIQUE_ID] = msg_id
    if extra:
        merged.update(extra)
    return encode_properties(merged).decode("utf-8")


def delay_properties(delay_level: int | None = None, deliver_at_ms: int | None = None,
                     delay_ms: int | None = None) -> dict[str, str]:
    """The properties that ask a broker to deliver a message later (RocketMQ's DELAY, TIMER_DELIVER_MS,
    TIMER_DELAY_MS); the broker refuses more than one."""
    out: dict[str, str] = {}
    if delay_level is not None:
        out[PROPERTY_DELAY_LEVEL] = str(delay_level)
    if deliver_at_ms is not None:
        out[PROPERTY_TIMER_DELIVER_MS] = str(deliver_at_ms)
    if delay_ms is not None:
        out[PROPERTY_TIMER_DELAY_MS] = str(delay_ms)
    return out


def send_ext(group: str, topic: str, queue_id: int, properties: str, *, born_timestamp: int, flag: int = 0,
             compressed: bool = False) -> dict[str, str]:
    """SEND_MESSAGE_V2's extFields (``ext_fields(SendMessageRequestHeaderV2(...))``, built directly: a single send's
    hot path).

    Example::

        >>> send_ext("pg", "T", 1, "", born_timestamp=5)["b"]
        'T'
    """
    return {"a": group, "b": topic, "c": "TBW102", "d": "4", "e": str(queue_id), "f": "1" if compressed else "0",
            "g": str(born_timestamp), "h": str(flag), "i": properties}


def packed_ext(topic: str, count: int, group: str | None, queue_id: int | None, compressed: bool, *,
               sharding_key: str | None = None) -> p.SendPackedRequestHeader:
    """SPARKMQ_SEND_PACKED's header: ``count`` messages packed by ``encode_batch`` for one queue."""
    return p.SendPackedRequestHeader(topic, count, group, queue_id, sharding_key, compressed)


def pull_ext(group: str | None, topic: str, queue_id: int, offset: int, max_messages: int, *,
             expression: str | None = None, filter_type: str = "TAG", wait_ms: int = 0,
             commit_offset: int | None = None, client_id: str | None = None) -> dict[str, str]:
    """A pull's extFields (PullMessageRequestHeader): the subscription always sent when there is one, long polling
    (SUSPEND) for ``wait_ms`` > 0, a piggy-backed commit with ``commit_offset``, and who pulls (trace)."""
    flags = 0
    ext = {"consumerGroup": group or "", "topic": topic, "queueId": str(queue_id), "queueOffset": str(offset),
           "maxMsgNums": str(max_messages)}
    if client_id:
        ext["clientId"] = client_id
    if expression is not None:
        flags |= PULL_FLAG_SUBSCRIPTION
        ext["subscription"] = expression
        ext["expressionType"] = (filter_type or "TAG").upper()
    if wait_ms:
        flags |= PULL_FLAG_SUSPEND
        ext["suspendTimeoutMillis"] = str(wait_ms)
    if commit_offset is not None:
        flags |= PULL_FLAG_COMMIT_OFFSET
        ext["commitOffset"] = str(commit_offset)
    ext["sysFlag"] = str(flags)
    return ext


def consumer_data_body(data: Mapping[str, Any]) -> p.ConsumerDataBody:
    """One consumer group of a heartbeat, from its ``POST /clients/heartbeat`` form (``group``, ``consume_type``,
    ``message_model``, ``consume_from_where``, ``subscriptions`` of ``topic``/``expression``/``type``,
    ``held_queues``) to RocketMQ's ConsumerData."""
    subs = [p.SubscriptionDataBody(str(s["topic"]), str(s.get("expression") or "*"),
                                   expressionType=str(s.get("type") or "TAG"))
            for s in data.get("subscriptions") or ()]
    consume_type = str(data.get("consume_type") or "PUSH")
    return p.ConsumerDataBody(str(data["group"]), p.CONSUME_TYPE_NAMES.get(consume_type, consume_type),
                              str(data.get("message_model") or "CLUSTERING"),
                              str(data.get("consume_from_where") or "CONSUME_FROM_LAST_OFFSET"), subs,
                              heldQueues=list(data.get("held_queues") or ()))


def heartbeat_data(body: Mapping[str, Any]) -> bytes:
    """HEART_BEAT's body (RocketMQ's HeartbeatData JSON) from the ``POST /clients/heartbeat`` form."""
    return _encode_json(p.HeartbeatData(str(body["client_id"]),
                                        [p.ProducerDataBody(g) for g in body.get("producer_groups") or ()],
                                        [consumer_data_body(c) for c in body.get("consumers") or ()]))


# -- answers ----------------------------------------------------------------------------------------------
def _int(ext: Mapping[str, Any], name: str, default: int | None = None) -> int:
    value = ext.get(name)
    try:
        return int(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        if default is not None and value is None:
            return default
        raise SparkMQError(ErrorCode.INTERNAL_ERROR, f"the broker's answer has no integer {name!r}: {value!r}") \
            from None


def decode_send(response: Response, msg_id: str, topic: str, broker_name: str) -> SendResult:
    """A single send's answer (code 0/10/11/12 = its status) as a :class:`SendResult`."""
    ext = response.ext or {}
    return SendResult(SendStatus(SEND_STATUS_OF_CODE[response.code]), msg_id, str(ext.get("msgId", "")), topic,
                      broker_name, _int(ext, "queueId"), _int(ext, "queueOffset"), _int(ext, "storeTimestamp", 0))


def decode_packed(response: Response) -> tuple[p.SendPackedResponseHeader, bytes]:
    """A SPARKMQ_SEND_PACKED answer: its header and each message's commit-log offset packed."""
    try:
        return response.header_as(p.SendPackedResponseHeader), bytes(response.body)
    except SparkMQError as exc:
        raise SparkMQError(ErrorCode.INTERNAL_ERROR, f"malformed SPARKMQ_SEND_PACKED answer: {exc.message}") from None


def _inflate_compressed(body: bytes) -> bytes:
    return inflate(body, 1)


def decode_pulled(response: Response, broker_name: str) -> PullResult:
    """A SPARKMQ_PULL_PACKED answer as a :class:`PullResult` of received messages (records decoded natively)."""
    ext = response.ext or {}
    status = pull_status_of(response.code, response.remark)
    messages = (decode_records(response.body, broker_name, ReceivedMessage, _inflate_compressed)
                if _int(ext, "msgCount", 0) else [])
    return PullResult(status, _int(ext, "nextBeginOffset"), _int(ext, "minOffset"), _int(ext, "maxOffset"), messages)


def decode_members(response: Response) -> list[str]:
    """GET_CONSUMER_LIST_BY_GROUP's member ids, sorted."""
    try:
        return sorted(_decode_members(response.body).consumerIdList)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise SparkMQError(ErrorCode.INTERNAL_ERROR, f"malformed consumer list: {exc}") from None


def offset_msg_ids(store_host: str, offsets: bytes) -> list[str]:
    """The offsetMsgId of each packed commit-log offset (int64 little-endian) on ``store_host``."""
    from ..common.ids import offset_msg_id_prefix  # noqa: PLC0415  # a rarely used helper's import

    prefix = offset_msg_id_prefix(store_host)
    return [f"{prefix}{o:016X}" for o in memoryview(offsets).cast("q")]


def _commitlog_offset(offset_msg_id: str) -> int:
    return decode_offset_msg_id(offset_msg_id).commitlog_offset


# -- pushes -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class OffsetReset:
    """RESET_CONSUMER_CLIENT_OFFSET: an admin moved ``group``'s offsets of ``topic`` on ``broker_name``."""

    group: str
    topic: str
    broker_name: str
    #: queue id -> the offset to restart at.
    offsets: dict[int, int]


@dataclass(frozen=True)
class PushedCheck:
    """CHECK_TRANSACTION_STATE: a broker asks how the transaction of a half message ended."""

    producer_group: str
    transaction_id: str
    topic: str
    msg_id: str
    offset_msg_id: str
    check_times: int
    body: bytes
    properties: dict[str, str] = field(default_factory=dict)
    commit_log_offset: int | None = None
    queue_offset: int | None = None


#: ``provider()`` -> a consumer's GET_CONSUMER_RUNNING_INFO body.
RunningInfo = Callable[[], bytes]


class _PushInbox:
    """What brokers pushed to this process, whichever connection it came on (a client's last heartbeat binds
    one): check-backs per producer group, rebalance notices for the consumers' watches, offset resets, and the
    consumers that answer running-info requests."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        #: (producer group, remoting addr it came from) -> its check-backs (answered on the same broker).
        self._checks: dict[tuple[str, str], collections.deque[PushedCheck]] = {}
        #: (remoting addr, group) -> the events of the watches waiting on it, with their loops.
        self._watches: dict[tuple[str, str], list[tuple[asyncio.AbstractEventLoop, asyncio.Event]]] = {}
        #: group -> the consumers of this process told about pushed offset resets.
        self._reset_handlers: dict[str, list[Callable[[OffsetReset], None]]] = {}
        #: client id -> its consumer's running-info provider.
        self._running: dict[str, RunningInfo] = {}

    def on_offset_reset(self, group: str, handler: Callable[[OffsetReset], None]) -> None:
        """Tell ``handler`` about pushed offset resets of ``group``."""
        with self._lock:
            self._reset_handlers.setdefault(group, []).append(handler)

    def forget_offset_reset(self, group: str, handler: Callable[[OffsetReset], None]) -> None:
        """Stop telling ``handler``."""
        with self._lock:
            handlers = self._reset_handlers.get(group, [])
            if handler in handlers:
                handlers.remove(handler)

    def offset_reset(self, notice: OffsetReset) -> None:
        """Hand a pushed offset reset to the group's handlers."""
        with self._lock:
            handlers = list(self._reset_handlers.get(notice.group, ()))
        for handler in handlers:
            handler(notice)

    def on_running_info(self, client_id: str, provider: RunningInfo) -> None:
        """Answer running-info requests for ``client_id`` with ``provider()``."""
        with self._lock:
            self._running[client_id] = provider

    def forget_running_info(self, client_id: str) -> None:
        """Stop answering for ``client_id``."""
        with self._lock:
            self._running.pop(client_id, None)

    def running_info(self, client_id: str) -> Reply:
        """The answer to a relayed GET_CONSUMER_RUNNING_INFO (CONSUMER_NOT_ONLINE for a client not here)."""
        with self._lock:
            provider = self._running.get(client_id)
        if provider is None:
            return error_reply(ErrorCode.CONSUMER_NOT_ONLINE, f"The Consumer <{client_id}> not online")
        return Reply(body=provider())

    def watch(self, key: tuple[str, str], event: asyncio.Event) -> None:
        """Set ``event`` (on the running loop) when the broker ``key[0]`` notices a change of group ``key[1]``."""
        with self._lock:
            self._watches.setdefault(key, []).append((asyncio.get_running_loop(), event))

    def unwatch(self, key: tuple[str, str], event: asyncio.Event) -> None:
        """Forget a watch."""
        with self._lock:
            waiting = self._watches.get(key, [])
            waiting[:] = [(loop, e) for loop, e in waiting if e is not event]
            if not waiting:
                self._watches.pop(key, None)

    def group_changed(self, addr: str, group: str) -> None:
        """A pushed NOTIFY_CONSUMER_IDS_CHANGED: wake the group's watches on that broker."""
        with self._lock:
            waiting = list(self._watches.get((addr, group), ()))
        for loop, event in waiting:
            if not loop.is_closed():
                loop.call_soon_threadsafe(event.set)

    def add_check(self, addr: str, check: PushedCheck) -> None:
        """Queue a pushed check-back (answered on the broker ``addr`` that sent it)."""
        with self._lock:
            self._checks.setdefault((check.producer_group, addr), collections.deque(maxlen=10_000)).append(check)
            self._lock.notify_all()

    def take_checks(self, group: str, addr: str, wait_s: float, max_count: int = 32) -> list[PushedCheck]:
        """Up to ``max_count`` check-backs ``addr`` pushed for ``group``, waiting up to ``wait_s`` for one."""
        deadline = time.monotonic() + wait_s
        with self._lock:
            while True:
                queue = self._checks.get((group, addr))
                if queue:
                    return [queue.popleft() for _ in range(min(max_count, len(queue)))]
                left = deadline - time.monotonic()
                if left <= 0:
                    return []
                self._lock.wait(left)


#: One inbox per process: pushes arrive on whichever connection a client's heartbeat bound.
_INBOX = _PushInbox()


def _pushed_check(frame: Frame) -> PushedCheck:
    h = frame.header_as(p.CheckTransactionStateRequestHeader)
    records = decode_rocketmq_records(frame.body)
    if len(records) != 1:
        raise SparkMQError(ErrorCode.INVALID_ARGUMENT, f"a check-back carries one message, got {len(records)}")
    half = records[0]
    props = dict(half.properties)
    transaction_id = h.transactionId or props.get(PROPERTY_UNIQUE_ID) or h.msgId or ""
    checks = props.get(PROPERTY_TRANSACTION_CHECK_TIMES, "0")
    return PushedCheck(props.get(PROPERTY_PRODUCER_GROUP, ""), transaction_id, h.topic or half.topic,
                       props.get(PROPERTY_UNIQUE_ID, h.msgId or ""), h.offsetMsgId or "",
                       int(checks) if checks.isdigit() else 0, bytes(half.body), props, h.commitLogOffset,
                       h.tranStateTableOffset)


def on_push(addr: str, frame: Frame) -> Reply | None:
    """Where every request a broker pushes lands, from any connection (the pools' callback, on a loop thread)."""
    code = frame.code
    try:
        if code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED:
            _INBOX.group_changed(addr, frame.header_as(p.ConsumerGroupRequestHeader).consumerGroup)
        elif code == RequestCode.CHECK_TRANSACTION_STATE:
            _INBOX.add_check(addr, _pushed_check(frame))
        elif code == RequestCode.RESET_CONSUMER_CLIENT_OFFSET:
            h = frame.header_as(p.ResetOffsetNoticeHeader)
            table = p.parse_mq_offsets(frame.body)
            brokers = {mq.brokerName for mq in table}
            for broker in brokers:
                _INBOX.offset_reset(OffsetReset(h.group, h.topic, broker, {
                    mq.queueId: offset for mq, offset in table.items() if mq.brokerName == broker}))
        elif code == RequestCode.GET_CONSUMER_RUNNING_INFO:
            return _INBOX.running_info(frame.header_as(p.ConsumerRunningInfoRequestHeader).clientId)
    except SparkMQError as exc:
        log.warning("a pushed request %d from %s was malformed: %s", code, addr, exc)
        return error_reply(exc.code, exc.message)
    return None


def on_offset_reset(group: str, handler: Callable[[OffsetReset], None]) -> None:
    """Call ``handler(notice)`` (on a connection's loop thread) when a broker pushes an offset reset of ``group``."""
    _INBOX.on_offset_reset(group, handler)


def forget_offset_reset(group: str, handler: Callable[[OffsetReset], None]) -> None:
    """Stop calling ``handler`` (a consumer shutting down)."""
    _INBOX.forget_offset_reset(group, handler)


def on_running_info(client_id: str, provider: RunningInfo) -> None:
    """Answer the brokers' GET_CONSUMER_RUNNING_INFO for ``client_id`` with ``provider()`` (on a loop thread)."""
    _INBOX.on_running_info(client_id, provider)


def forget_running_info(client_id: str) -> None:
    """Stop answering for ``client_id`` (the consumer stopped): the brokers hear CONSUMER_NOT_ONLINE."""
    _INBOX.forget_running_info(client_id)


# -- the threaded side --------------------------------------------------------------------------------------
class RemotingBrokerClient:
    """One broker over remoting (``remoting_addr``), known to callers by its address ``addr`` in routes.

    The calls producers and consumers make, with the HTTP :class:`~.remoting.BrokerClient`'s names and results;
    nothing else (admin calls go over HTTP through the AdminClient).
    """

    def __init__(self, addr: str, remoting_addr: str, timeout_s: float, transport: SyncRemotingClient, *,
                 credentials: Credentials | None = None) -> None:
        """``credentials`` sign every request (brokers with ACL on)."""
        self.addr = addr
        self.remoting_addr = remoting_addr
        self._timeout = timeout_s
        self._remoting = transport
        self._sign = ext_signer(credentials)

    def request(self, code: int, ext: Ext = None, body: bytes | memoryview = b"", timeout: float | None = None,
                ok: frozenset[int] = frozenset({0})) -> Response:
        """One request on the broker's connection (RemotingError on a transport failure; the error an answer
        stands for unless its code is in ``ok``)."""
        return self._remoting.request(self.remoting_addr, code, self._sign(code, ext, body), body,
                                      timeout if timeout is not None else self._timeout, ok)

    # -- sends ------------------------------------------------------------------------------------
    def send_message(self, ext: dict[str, str], body: bytes, *, msg_id: str, broker_name: str,
                     timeout: float | None = None) -> SendResult:
        """SEND_MESSAGE_V2 (:func:`send_ext`), written and answered on the calling thread (a synchronous send waits
        for its answer anyway: the shared connection's loop thread would only add two hand-offs)."""
        code = RequestCode.SEND_MESSAGE_V2
        answer = self._remoting.request_direct(self.remoting_addr, code, self._sign(code, ext, body), body,
                                               timeout if timeout is not None else self._timeout, _SEND_OK)
        return decode_send(answer, msg_id, ext["b"], broker_name)

    def send_packed(self, header: p.SendPackedRequestHeader, data: bytes,
                    timeout: float | None = None) -> tuple[p.SendPackedResponseHeader, bytes]:
        """SPARKMQ_SEND_PACKED: (the answer, each message's commit-log offset packed)."""
        return decode_packed(self.request(RequestCode.SPARKMQ_SEND_PACKED, header, data, timeout, _SEND_OK))

    def send_packed_future(self, header: p.SendPackedRequestHeader, data: bytes,
                           timeout: float | None = None) -> concurrent.futures.Future[Response]:
        """SPARKMQ_SEND_PACKED without blocking: a future of the raw answer (:func:`decode_packed`)."""
        code = RequestCode.SPARKMQ_SEND_PACKED
        return self._remoting.request_future(self.remoting_addr, code, self._sign(code, header, data), data,
                                             timeout if timeout is not None else self._timeout, _SEND_OK)

    def send_half(self, topic: str, message: Mapping[str, Any], timeout: float | None = None) -> dict[str, Any]:
        """A transaction's half message, given as the HTTP JSON object (``POST /topics/{topic}/half``): SEND_MESSAGE_V2
        with TRAN_MSG and PGROUP, as RocketMQ's producers send it; its answer carries ``transaction_id``."""
        group = str(message.get("producer_group") or "")
        msg_id = message.get("msg_id")
        props = properties_text(dict(message.get("properties") or {}), tags=message.get("tags"),
                                keys=tuple(message.get("keys") or ()), msg_id=msg_id,
                                extra={PROPERTY_TRANSACTION_PREPARED: "true", PROPERTY_PRODUCER_GROUP: group})
        queue_id = message.get("queue_id")
        ext = send_ext(group, topic, -1 if queue_id is None else int(queue_id), props,
                       born_timestamp=int(message.get("born_timestamp") or time.time() * 1000),
                       flag=int(message.get("flag") or 0), compressed=bool(message.get("compressed")))
        body = decode_body(message["body"], message.get("body_encoding", "base64"))
        answer = self.request(RequestCode.SEND_MESSAGE_V2, ext, body, timeout, _SEND_OK)
        a = answer.ext or {}
        return {"status": SEND_STATUS_OF_CODE[answer.code], "transaction_id": a.get("transactionId"),
                "msg_id": msg_id or a.get("transactionId"), "offset_msg_id": a.get("msgId"), "topic": topic,
                "queue_id": _int(a, "queueId"), "queue_offset": _int(a, "queueOffset"),
                "store_timestamp": _int(a, "storeTimestamp", 0)}

    def end_transaction(self, transaction_id: str, producer_group: str, action: str, *, from_check: bool = False,
                        offset_msg_id: str | None = None, queue_offset: int | None = None) -> dict[str, Any]:
        """END_TRANSACTION: COMMIT, ROLLBACK or UNKNOWN an open transaction (answered, unlike RocketMQ's ONEWAY, so
        a failure is seen); ``send_result`` names where a commit stored the message."""
        kind = p.TRANSACTION_TYPES.get(str(action).upper())
        if kind is None:
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT,
                               f"action must be COMMIT, ROLLBACK or UNKNOWN, got {action!r}")
        header = p.EndTransactionRequestHeader(
            producer_group, kind, queue_offset, _commitlog_offset(offset_msg_id) if offset_msg_id else None,
            from_check, transaction_id, transaction_id)
        r = self.request(RequestCode.END_TRANSACTION, header).header_as(p.EndTransactionResponseHeader)
        sent = None
        if r.offsetMsgId:
            sent = {"status": str(SendStatus.SEND_OK), "msg_id": r.msgId, "offset_msg_id": r.offsetMsgId,
                    "topic": r.topic, "broker_name": None, "queue_id": r.queueId, "queue_offset": r.queueOffset,
                    "store_timestamp": r.storeTimestamp or 0}
        return {"transaction_id": r.transactionId, "action": r.action, "send_result": sent}

    def transaction_checks(self, producer_group: str, client_id: str, wait_ms: int,
                           timeout: float | None = None) -> list[dict[str, Any]]:
        """Check-backs the brokers pushed for ``producer_group`` (waits up to ``wait_ms`` for one), in the form of
        ``GET /transactions/checks``."""
        return [{"transaction_id": c.transaction_id, "topic": c.topic, "msg_id": c.msg_id,
                 "offset_msg_id": c.offset_msg_id, "check_times": c.check_times, "body": encode_body(c.body),
                 "properties": dict(c.properties), "queue_offset": c.queue_offset}
                for c in _INBOX.take_checks(producer_group, self.remoting_addr, wait_ms / 1000)]

    # -- clients and groups -------------------------------------------------------------------------
    def heartbeat(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """HEART_BEAT from the ``POST /clients/heartbeat`` form (binds this client to the connection for pushes):
        ``{"groups": {group: {"version": n}}}``."""
        answer = self.request(RequestCode.HEART_BEAT, None, heartbeat_data(body))
        try:
            versions = _decode_versions(answer.body).groupVersions if len(answer.body) else {}
        except (msgspec.DecodeError, msgspec.ValidationError):
            versions = {}  # a broker that sends none (RocketMQ's): no versions known
        return {"groups": {g: {"version": v} for g, v in versions.items()}}

    def unregister(self, client_id: str, producer_groups: Sequence[str] = (),
                   consumer_groups: Sequence[str] = ()) -> dict[str, Any]:
        """UNREGISTER_CLIENT, once per group (RocketMQ's request names one producer and one consumer group)."""
        for group in producer_groups:
            self.request(RequestCode.UNREGISTER_CLIENT, p.UnregisterClientRequestHeader(client_id, producerGroup=group))
        for group in consumer_groups:
            self.request(RequestCode.UNREGISTER_CLIENT, p.UnregisterClientRequestHeader(client_id, consumerGroup=group))
        return {}

    def consumer_ids(self, group: str) -> list[str]:
        """GET_CONSUMER_LIST_BY_GROUP: the group's member ids, sorted ([] when it has none here)."""
        try:
            return decode_members(self.request(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": group}))
        except SparkMQError as exc:
            if exc.code is ErrorCode.GROUP_NOT_EXIST:
                return []
            raise

    def consumer_group(self, group: str) -> dict[str, Any]:
        """SPARKMQ_GROUP_INFO: the group's version, members, settings and subscriptions (``GET /consumers/{g}``)."""
        body = self.request(RequestCode.SPARKMQ_GROUP_INFO, {"consumerGroup": group}).body
        return msgspec.to_builtins(_decode_group(body))

    def queue_offsets(self, topic: str, queue_id: int, timestamp: int | None = None) -> dict[str, int]:
        """SPARKMQ_QUEUE_OFFSETS: a queue's ``min_offset``, ``max_offset`` and, for a timestamp, ``offset``."""
        r = self.request(RequestCode.SPARKMQ_QUEUE_OFFSETS, p.QueueRequestHeader(topic, queue_id, timestamp)) \
            .header_as(p.QueueOffsetsResponseHeader)
        out = {"min_offset": r.minOffset, "max_offset": r.maxOffset}
        if r.offset is not None:
            out["offset"] = r.offset
        return out

    def commit_offsets(self, group: str, offsets: Sequence[Mapping[str, Any]]) -> int:
        """SPARKMQ_UPDATE_CONSUMER_OFFSETS: how many of the ``{"topic", "queue_id", "offset"}`` entries were
        committed (all or nothing)."""
        body = _encode_json(p.UpdateConsumerOffsetsBody(group, [
            p.UpdateConsumerOffsetEntry(str(o["topic"]), int(o["queue_id"]), int(o["offset"])) for o in offsets]))
        return self.request(RequestCode.SPARKMQ_UPDATE_CONSUMER_OFFSETS, None, body) \
            .header_as(p.UpdateConsumerOffsetsResponseHeader).committed

    def query_offset(self, group: str, topic: str, queue_id: int) -> int:
        """QUERY_CONSUMER_OFFSET (never "zero if not found"): the committed offset; -1 when never committed."""
        answer = self.request(RequestCode.QUERY_CONSUMER_OFFSET,
                              p.QueryConsumerOffsetRequestHeader(group, topic, queue_id, False), ok=_QUERY_OK)
        return -1 if answer.code == ResponseCode.QUERY_NOT_FOUND else answer.header_as(p.OffsetResponseHeader).offset

    def lock_queues(self, group: str, client_id: str, queues: Sequence[tuple[str, int]],
                    broker_name: str = "") -> set[tuple[str, int]]:
        """LOCK_BATCH_MQ: the ``(topic, queue_id)`` pairs this client holds now (locked or renewed)."""
        body = _encode_json(p.LockBatchRequestBody(group, client_id,
                                                   [p.MessageQueueData(t, broker_name, q) for t, q in queues]))
        answer = self.request(RequestCode.LOCK_BATCH_MQ, None, body)
        try:
            locked = _decode_locked(answer.body).lockOKMQSet
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise SparkMQError(ErrorCode.INTERNAL_ERROR, f"malformed LOCK_BATCH_MQ answer: {exc}") from None
        return {(q.topic, q.queueId) for q in locked}

    def unlock_queues(self, group: str, client_id: str, queues: Sequence[tuple[str, int]],
                      broker_name: str = "") -> dict[str, Any]:
        """UNLOCK_BATCH_MQ: release queues this client holds."""
        body = _encode_json(p.LockBatchRequestBody(group, client_id,
                                                   [p.MessageQueueData(t, broker_name, q) for t, q in queues]))
        self.request(RequestCode.UNLOCK_BATCH_MQ, None, body)
        return {"unlocked": [{"topic": t, "queue_id": q} for t, q in queues]}

    def send_back(self, group: str, offset_msg_id: str, *, delay_level: int = 0, reason: str = "",
                  max_reconsume_times: int = 16, msg_id: str | None = None,
                  origin_topic: str | None = None) -> dict[str, Any]:
        """CONSUMER_SEND_MSG_BACK: a failed message to ``%RETRY%<group>`` (delay level 0: 3 + its reconsume times),
        or to the DLQ (``delay_level`` -1, or past ``max_reconsume_times``)."""
        header = p.ConsumerSendMsgBackRequestHeader(_commitlog_offset(offset_msg_id), group, delay_level, msg_id,
                                                    origin_topic, False, max_reconsume_times, reason or None)
        r = self.request(RequestCode.CONSUMER_SEND_MSG_BACK, header).header_as(p.SendBackResponseHeader)
        return {"status": r.status, "topic": r.topic, "delay_level": r.delayLevel, "reconsume_times": r.reconsumeTimes,
                "msg_id": r.msgId, "offset_msg_id": r.offsetMsgId}

    def post_trace(self, events: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """SPARKMQ_POST_TRACE: client trace events for the broker's trace topic."""
        body = _encode_json(p.PostTraceBody([dict(e) for e in events]))
        r = self.request(RequestCode.SPARKMQ_POST_TRACE, None, body).header_as(p.PostTraceResponseHeader)
        return {"accepted": r.accepted, "dropped": r.dropped, "enabled": r.enabled}

    def ping(self, timeout: float | None = None) -> None:
        """SPARKMQ_PING: whether the broker answers at all (RemotingError when it does not)."""
        self.request(RequestCode.SPARKMQ_PING, None, b"", timeout)

    def close(self) -> None:
        """Nothing to close: the connection belongs to the pool's transport."""


class AsyncRemotingBrokers:
    """The consumers' asyncio side: long-polling pulls and membership watches over remoting, per broker.

    Lives on the consumer's event loop.  Rebalance notices pushed by a broker wake the matching
    :meth:`group_changes` wait at once (no long poll per group).
    """

    def __init__(self, timeout_s: float, *, credentials: Credentials | None = None,
                 tls: TlsSettings | None = None) -> None:
        self._timeout = timeout_s
        self._client = AsyncRemotingClient(
            on_push=on_push, ssl_context=tls.client_context_if_connecting() if tls is not None else None)
        self._sign = ext_signer(credentials)

    async def request(self, remoting_addr: str, code: int, ext: Ext = None, body: bytes = b"",
                      timeout: float | None = None, ok: frozenset[int] = frozenset({0})) -> Response:
        """One request on the broker's connection."""
        return await self._client.request(remoting_addr, code, self._sign(code, ext, body), body,
                                          timeout if timeout is not None else self._timeout, ok)

    async def pull(self, remoting_addr: str, ext: dict[str, str], broker_name: str, timeout: float) -> PullResult:
        """SPARKMQ_PULL_PACKED with long polling (``timeout`` exceeds the request's hold)."""
        answer = await self.request(remoting_addr, RequestCode.SPARKMQ_PULL_PACKED, ext, b"", timeout, _PULL_OK)
        return decode_pulled(answer, broker_name)

    async def group_changes(self, remoting_addr: str, group: str, version: int, wait_ms: int,
                            timeout: float) -> dict[str, Any]:
        """``{"version", "members"}`` once the group's version differs from ``version``, or after ``wait_ms``."""
        key = (remoting_addr, group)
        event = asyncio.Event()
        _INBOX.watch(key, event)  # before asking: a notice in between is not missed
        try:
            answer = await self._group_info(remoting_addr, group, timeout)
            if answer["version"] != version:
                return answer
            try:
                await asyncio.wait_for(event.wait(), wait_ms / 1000)
            except TimeoutError:
                pass
            return await self._group_info(remoting_addr, group, timeout)
        finally:
            _INBOX.unwatch(key, event)

    async def _group_info(self, remoting_addr: str, group: str, timeout: float) -> dict[str, Any]:
        answer = await self.request(remoting_addr, RequestCode.SPARKMQ_GROUP_INFO, {"consumerGroup": group}, b"",
                                    timeout)
        info = _decode_group(answer.body)
        return {"version": info.version, "members": list(info.members)}

    async def aclose(self) -> None:
        """Close every connection."""
        await self._client.close()


def sync_transport(timeout_s: float, tls: TlsSettings | None = None) -> SyncRemotingClient:
    """A threaded remoting client whose pushes reach this module's inbox (TLS when ``tls`` connects)."""
    ctx = tls.client_context_if_connecting() if tls is not None else None
    return SyncRemotingClient(request_timeout_s=timeout_s, on_push=on_push, ssl_context=ctx)


class AsyncBrokerRouter:
    """The consumers' per-broker async calls (``pull``, ``group_changes``): over remoting where the route names a
    broker's endpoint and the config says remoting, over HTTP where the config says HTTP (or the broker serves no
    remoting); same signatures as ``AsyncBrokerClient``."""

    def __init__(self, timeout_s: float, *, remoting: bool = True, credentials: Credentials | None = None,
                 tls: TlsSettings | None = None) -> None:
        from .remoting import AsyncBrokerClient  # noqa: PLC0415  # the HTTP side, only built when needed

        self._http = AsyncBrokerClient(credentials=credentials, tls=tls)
        self._remoting = AsyncRemotingBrokers(timeout_s, credentials=credentials, tls=tls) if remoting else None

    def _endpoint(self, addr: str) -> str | None:
        from .endpoints import remoting_endpoint  # noqa: PLC0415

        return remoting_endpoint(addr) if self._remoting is not None else None

    async def pull(self, addr: str, topic: str, queue_id: int, offset: int, max_messages: int, *, tags: str,
                   wait_ms: int, timeout: float, group: str | None = None, client_id: str | None = None,
                   arrow: bool = False, filter_type: str = "TAG", expression: str | None = None,
                   broker_name: str = "") -> PullResult:
        """One long-polling pull of a queue (see ``AsyncBrokerClient.pull``)."""
        endpoint = self._endpoint(addr)
        if endpoint is None or self._remoting is None:
            return await self._http.pull(addr, topic, queue_id, offset, max_messages, tags=tags, wait_ms=wait_ms,
                                         timeout=timeout, group=group, client_id=client_id, arrow=arrow,
                                         filter_type=filter_type, expression=expression)
        sql = bool(filter_type) and filter_type.upper() != "TAG"
        ext = pull_ext(group, topic, queue_id, offset, max_messages, expression=expression if sql else (tags or "*"),
                       filter_type=filter_type if sql else "TAG", wait_ms=wait_ms, client_id=client_id)
        return await self._remoting.pull(endpoint, ext, broker_name, timeout)

    async def group_changes(self, addr: str, group: str, version: int, wait_ms: int,
                            timeout: float) -> dict[str, Any]:
        """Wait for the group's membership version to move (pushed notices over remoting)."""
        endpoint = self._endpoint(addr)
        if endpoint is None or self._remoting is None:
            return await self._http.group_changes(addr, group, version, wait_ms, timeout)
        return await self._remoting.group_changes(endpoint, group, version, wait_ms, timeout)

    async def aclose(self) -> None:
        """Close every connection."""
        await self._http.aclose()
        if self._remoting is not None:
            await self._remoting.aclose()

