"""The wire contract of sparkmq, defined once: request codes, frame flags, limits.

Every protocol adapter (remoting, HTTP) and every client uses these names; nothing else
defines a request code, a status or a limit.  The frame layout is drawn in
``docs/remoting.md``; error codes and their remoting numbers are in :mod:`.errors`.
"""
from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import msgspec

from .errors import ErrorCode, SparkMQError
from .validation import QueueId, TopicName

__all__ = [
    "FLAG_RESPONSE",
    "FLAG_ONEWAY",
    "RESPONSE_SUCCESS",
    "DEFAULT_MAX_FRAME_BYTES",
    "DEFAULT_IDLE_TIMEOUT_S",
    "DEFAULT_HEARTBEAT_INTERVAL_S",
    "RequestCode",
    "PullStatus",
    "PullResult",
    "pull_status",
    "PackedPull",
    "MessageModel",
    "ConsumeType",
    "ConsumeFromWhere",
    "ExpressionType",
    "MAX_PULL_BATCH",
    "MAX_LONG_POLL_MS",
    "MAX_BULK_PULL_BATCH",
    "MAX_MSG_ID_LENGTH",
    "MAX_HELD_QUEUES",
    "held_queue_key",
    "parse_held_queue",
    "GroupSubscriptionView",
    "GroupMemberData",
    "GroupInfoBody",
    "HeartbeatResponseHeader",
    "HeartbeatResponseBody",
    "SendBackResponseHeader",
    "EndTransactionResponseHeader",
    "PostTraceResponseHeader",
    "PostTraceBody",
    "ProcessQueueInfo",
    "consumer_running_info",
    "parse_mq_offsets",
    "pull_response_code",
    "pull_status_of",
    "PULL_OUTCOME_CODES",
    "SEND_STATUS_CODES",
    "SEND_STATUS_OF_CODE",
    "SEND_OUTCOME_CODES",
    "PROP_NAMESERVER_ADDR",
    "PROP_CONSUME_TYPE",
    "PROP_CONSUME_ORDERLY",
    "PROP_CLIENT_VERSION",
    "PROP_CONSUMER_START_TIMESTAMP",
    "PROP_THREADPOOL_CORE_SIZE",
    "TRANSACTION_ACTIONS",
    "TRANSACTION_TYPES",
    "CONSUME_TYPE_NAMES",
    "CONSUME_TYPES_BY_NAME",
]

# -- frames ---------------------------------------------------------------------------------------
# RocketMQ's remoting frame (docs/remoting.md): big-endian ``i32 length`` (4 + header + body, excluding
# itself), ``i32`` serialize type (top byte) | header length (low 24 bits), the header, the body.

#: Bytes before the header: length (4) + serialize type and header length (4).
FRAME_PREFIX_SIZE = 8
#: The largest header (the low 24 bits of the second field).
MAX_HEADER_BYTES = (1 << 24) - 1

#: Flag bits of a frame's header.
FLAG_RESPONSE = 0x01
FLAG_ONEWAY = 0x02

#: The code of a response that succeeded.
RESPONSE_SUCCESS = 0

#: The largest frame a side accepts (the length field's value), unless configured otherwise.  RocketMQ's Java
#: side refuses frames over 16 MiB; sparkmq's own bulk pulls (the Spark source) may be larger, so its
#: servers and clients accept up to this.
DEFAULT_MAX_FRAME_BYTES = 64 << 20
#: A server closes a connection that sent nothing for this long (RocketMQ: 120 s).
DEFAULT_IDLE_TIMEOUT_S = 120.0
#: sparkmq's client pings a connection with nothing in flight this often (well inside the idle timeout).
DEFAULT_HEARTBEAT_INTERVAL_S = 30.0

#: The version a sparkmq server puts in its answers: RocketMQ's ordinal of V5_3_3, the release whose
#: protocol it serves.  The Java client keeps a HEART_BEAT reply's version as the broker's and refuses
#: SQL92 subscriptions below V4_1_0_SNAPSHOT (233).
SERVER_VERSION = 479
#: The version sparkmq's own client sends (the same protocol level).
CLIENT_VERSION = 479


class SerializeType(enum.IntEnum):
    """How a frame's header is encoded (the top byte of the second length field)."""

    #: A UTF-8 JSON object: code, language, version, opaque, flag, remark, extFields.
    JSON = 0
    #: RocketMQ's binary header (docs/remoting.md, "ROCKETMQ headers").
    ROCKETMQ = 1


class LanguageCode(enum.IntEnum):
    """The sender's language (RocketMQ's LanguageCode; JSON headers carry the name, binary ones the number)."""

    JAVA = 0
    CPP = 1
    DOTNET = 2
    PYTHON = 3
    DELPHI = 4
    ERLANG = 5
    RUBY = 6
    OTHER = 7
    HTTP = 8
    GO = 9
    PHP = 10
    OMS = 11
    RUST = 12
    NODE_JS = 13


#: The most messages one consumer pull answers.
MAX_PULL_BATCH = 1024
#: The most messages one unfiltered bulk pull without a group answers (the Spark source's reads):
#: records are copied out in bulk, so bigger pulls only spread the request's cost.
MAX_BULK_PULL_BATCH = 16384
#: The longest unique message id (UNIQ_KEY) a producer may give.
MAX_MSG_ID_LENGTH = 128
#: The longest a long poll (a pull's ``wait_ms``, a group-change or check-back poll) may be held, in ms:
#: shorter than an HTTP client's usual timeout, so a held request never outlives the caller.  Longer is
#: INVALID_ARGUMENT (``docs/http-api.md``, "Limits").
MAX_LONG_POLL_MS = 30_000

#: The first request code of sparkmq's own requests (RocketMQ's codes stay below it; a ROCKETMQ binary
#: header carries the code as an i16, so ours stay below 32768 too).
SPARKMQ_CODE_BASE = 30000


class RequestCode(enum.IntEnum):
    """Every remoting request code served or sent, numbered as RocketMQ numbers them (docs/remoting.md).

    Codes from :data:`SPARKMQ_CODE_BASE` up are sparkmq's own, for what RocketMQ has no request for.
    """

    # -- client -> broker
    SEND_MESSAGE = 10
    PULL_MESSAGE = 11
    QUERY_MESSAGE = 12
    QUERY_CONSUMER_OFFSET = 14
    UPDATE_CONSUMER_OFFSET = 15
    UPDATE_AND_CREATE_TOPIC = 17
    GET_ALL_TOPIC_CONFIG = 21
    GET_BROKER_RUNTIME_INFO = 28
    SEARCH_OFFSET_BY_TIMESTAMP = 29
    GET_MAX_OFFSET = 30
    GET_MIN_OFFSET = 31
    GET_EARLIEST_MSG_STORETIME = 32
    VIEW_MESSAGE_BY_ID = 33
    HEART_BEAT = 34
    UNREGISTER_CLIENT = 35
    CONSUMER_SEND_MSG_BACK = 36
    END_TRANSACTION = 37
    GET_CONSUMER_LIST_BY_GROUP = 38
    LOCK_BATCH_MQ = 41
    UNLOCK_BATCH_MQ = 42
    #: A push consumer with a SQL92 subscription asks each broker whether it can filter so before it starts.
    CHECK_CLIENT_CONFIG = 46
    UPDATE_AND_CREATE_SUBSCRIPTIONGROUP = 200
    GET_ALL_SUBSCRIPTIONGROUP_CONFIG = 201
    GET_TOPIC_STATS_INFO = 202
    GET_CONSUMER_CONNECTION_LIST = 203
    GET_PRODUCER_CONNECTION_LIST = 204
    WIPE_WRITE_PERM_OF_BROKER = 205
    GET_ALL_CONSUMER_OFFSET = 43
    GET_ALL_DELAY_OFFSET = 45
    GET_CONSUME_STATS = 208
    DELETE_SUBSCRIPTIONGROUP = 207
    DELETE_TOPIC_IN_BROKER = 215
    INVOKE_BROKER_TO_RESET_OFFSET = 222
    INVOKE_BROKER_TO_GET_CONSUMER_STATUS = 223
    QUERY_TOPIC_CONSUME_BY_WHO = 300
    GET_CONSUMER_RUNNING_INFO = 307
    SEND_MESSAGE_V2 = 310
    SEND_BATCH_MESSAGE = 320
    QUERY_CONSUME_QUEUE = 321
    LITE_PULL_MESSAGE = 361
    # -- admin -> broker, for mqadmin (api/remoting/admin.py)
    #: One topic's config (``mqadmin consumerProgress`` asks every broker of the route).
    GET_TOPIC_CONFIG = 351
    GET_SUBSCRIPTIONGROUP_CONFIG = 352
    # -- broker -> client (CHECK, NOTIFY and RESET are ONEWAY)
    CHECK_TRANSACTION_STATE = 39
    NOTIFY_CONSUMER_IDS_CHANGED = 40
    RESET_CONSUMER_CLIENT_OFFSET = 220
    GET_CONSUMER_STATUS_FROM_CLIENT = 221
    # -- name server
    PUT_KV_CONFIG = 100
    GET_KV_CONFIG = 101
    DELETE_KV_CONFIG = 102
    REGISTER_BROKER = 103
    UNREGISTER_BROKER = 104
    GET_ROUTEINFO_BY_TOPIC = 105
    GET_BROKER_CLUSTER_INFO = 106
    GET_ALL_TOPIC_LIST_FROM_NAMESERVER = 206
    DELETE_TOPIC_IN_NAMESRV = 216
    GET_KVLIST_BY_NAMESPACE = 219
    GET_TOPICS_BY_CLUSTER = 224
    GET_SYSTEM_TOPIC_LIST_FROM_NS = 304
    UPDATE_NAMESRV_CONFIG = 318
    GET_NAMESRV_CONFIG = 319

    # -- sparkmq's own (docs/remoting.md, "sparkmq's own requests")
    #: A keep-alive with no header and no body (RocketMQ clients keep connections alive with heartbeats).
    SPARKMQ_PING = SPARKMQ_CODE_BASE
    #: A batch for one queue in sparkmq's packed encoding, appended by the native core without per-message work.
    SPARKMQ_SEND_PACKED = SPARKMQ_CODE_BASE + 1
    #: PULL_MESSAGE answered with the stored records as sparkmq's store holds them (decoded natively).
    SPARKMQ_PULL_PACKED = SPARKMQ_CODE_BASE + 2
    #: A client's trace events (JSON body).
    SPARKMQ_POST_TRACE = SPARKMQ_CODE_BASE + 3
    #: A consumer group's whole view: members, settings, subscriptions, held queues (JSON answer).
    SPARKMQ_GROUP_INFO = SPARKMQ_CODE_BASE + 4
    #: A group's offsets of many queues at once, all or nothing (JSON body).
    SPARKMQ_UPDATE_CONSUMER_OFFSETS = SPARKMQ_CODE_BASE + 5
    #: A queue's min and max offsets in one answer (and the offset for a timestamp).
    SPARKMQ_QUEUE_OFFSETS = SPARKMQ_CODE_BASE + 6


class ResponseCode(enum.IntEnum):
    """The code of a response (RocketMQ's ResponseCode); 0 is success, a few others are outcomes, not errors
    (a send's 10/11/12, a pull's 19/20/21)."""

    SUCCESS = 0
    SYSTEM_ERROR = 1
    SYSTEM_BUSY = 2
    REQUEST_CODE_NOT_SUPPORTED = 3
    TRANSACTION_FAILED = 4
    FLUSH_DISK_TIMEOUT = 10
    SLAVE_NOT_AVAILABLE = 11
    FLUSH_SLAVE_TIMEOUT = 12
    MESSAGE_ILLEGAL = 13
    SERVICE_NOT_AVAILABLE = 14
    VERSION_NOT_SUPPORTED = 15
    NO_PERMISSION = 16
    TOPIC_NOT_EXIST = 17
    TOPIC_EXIST_ALREADY = 18
    PULL_NOT_FOUND = 19
    PULL_RETRY_IMMEDIATELY = 20
    PULL_OFFSET_MOVED = 21
    QUERY_NOT_FOUND = 22
    SUBSCRIPTION_PARSE_FAILED = 23
    SUBSCRIPTION_NOT_EXIST = 24
    SUBSCRIPTION_NOT_LATEST = 25
    SUBSCRIPTION_GROUP_NOT_EXIST = 26
    FILTER_DATA_NOT_EXIST = 27
    FILTER_DATA_NOT_LATEST = 28
    INVALID_PARAMETER = 29
    TRANSACTION_SHOULD_COMMIT = 200
    TRANSACTION_SHOULD_ROLLBACK = 201
    TRANSACTION_STATE_UNKNOW = 202
    TRANSACTION_STATE_GROUP_WRONG = 203
    CONSUMER_NOT_ONLINE = 206
    CONSUME_MSG_TIMEOUT = 207
    NO_MESSAGE = 208
    POLLING_FULL = 209
    POLLING_TIMEOUT = 210
    BROKER_NOT_EXIST = 211
    FLOW_CONTROL = 215
    ILLEGAL_OPERATION = 604


#: The PULL_MESSAGE header's ``sysFlag`` bits (RocketMQ's PullSysFlag).
PULL_FLAG_COMMIT_OFFSET = 0x1
PULL_FLAG_SUSPEND = 0x2
PULL_FLAG_SUBSCRIPTION = 0x4
PULL_FLAG_CLASS_FILTER = 0x8
PULL_FLAG_LITE_PULL = 0x10

#: END_TRANSACTION's ``commitOrRollback`` (RocketMQ's MessageSysFlag transaction types).
TRANSACTION_NOT_TYPE = 0
TRANSACTION_COMMIT_TYPE = 0x8
TRANSACTION_ROLLBACK_TYPE = 0xC
#: Each ``commitOrRollback`` and the transaction action it stands for (COMMIT, ROLLBACK, UNKNOWN: checks go on).
TRANSACTION_ACTIONS: dict[int, str] = {TRANSACTION_COMMIT_TYPE: "COMMIT", TRANSACTION_ROLLBACK_TYPE: "ROLLBACK",
                                       TRANSACTION_NOT_TYPE: "UNKNOWN"}
TRANSACTION_TYPES: dict[str, int] = {action: kind for kind, action in TRANSACTION_ACTIONS.items()}


class PullStatus(enum.StrEnum):
    """A pull's outcome (RocketMQ's PullStatus / GetMessageStatus, named for readers of both)."""

    FOUND = "FOUND"
    #: The offset is the queue's end: nothing new yet (long polling waits here).
    NO_NEW_MSG = "NO_NEW_MSG"
    #: Messages were examined but none matched the filter; next_offset moves past them.
    NO_MATCHED_MSG = "NO_MATCHED_MSG"
    #: The queue has never been written.
    NO_MATCHED_QUEUE = "NO_MATCHED_QUEUE"
    #: Below the oldest retained message; next_offset is the queue's min offset.
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"
    #: Past the queue's end; next_offset is the queue's max offset.
    OFFSET_OVERFLOW = "OFFSET_OVERFLOW"
    #: An admin reset the pulling group's offset on this queue; next_offset is the new offset,
    #: where the consumer restarts (nothing was read).  A broker status: the store never answers it.
    OFFSET_RESET = "OFFSET_RESET"


@dataclass(slots=True)
class PullResult:
    """One pull's answer: status, where to pull next, the queue's bounds and the messages.

    The broker fills ``messages`` with stored messages, a client with received ones (bodies inflated).
    """

    status: PullStatus
    next_offset: int
    min_offset: int
    max_offset: int
    messages: list[Any] = field(default_factory=list)


@dataclass(slots=True)
class PackedPull:
    """A pull's answer with the messages as stored records back to back (docs/remoting.md "Packed records")."""

    status: PullStatus
    next_offset: int
    min_offset: int
    max_offset: int
    count: int = 0
    data: bytes = b""


def pull_status(value: object) -> PullStatus:
    """A pull status from the wire; INTERNAL_ERROR when this side does not know it (a newer server)."""
    try:
        return PullStatus(str(value))
    except ValueError:
        raise SparkMQError(ErrorCode.INTERNAL_ERROR, f"unknown pull status {value!r}") from None


class MessageModel(enum.StrEnum):
    """How a consumer group shares a topic."""

    #: Each message goes to one member of the group; offsets live on the brokers.
    CLUSTERING = "CLUSTERING"
    #: Every member gets every message; each member keeps its own offsets locally.
    BROADCASTING = "BROADCASTING"


class ConsumeType(enum.StrEnum):
    """How a consumer fetches: pushed to a listener (the client pulls underneath), pulled by the app, or POP."""

    PUSH = "PUSH"
    PULL = "PULL"
    POP = "POP"


class ConsumeFromWhere(enum.StrEnum):
    """Where a group with no committed offset for a queue starts."""

    CONSUME_FROM_LAST_OFFSET = "CONSUME_FROM_LAST_OFFSET"
    CONSUME_FROM_FIRST_OFFSET = "CONSUME_FROM_FIRST_OFFSET"
    CONSUME_FROM_TIMESTAMP = "CONSUME_FROM_TIMESTAMP"


#: HeartbeatData's consume type names (RocketMQ's ConsumeType) of sparkmq's consume types, and back.
CONSUME_TYPE_NAMES: dict[str, str] = {"PUSH": "CONSUME_PASSIVELY", "PULL": "CONSUME_ACTIVELY", "POP": "CONSUME_POP"}
CONSUME_TYPES_BY_NAME: dict[str, str] = {name: kind for kind, name in CONSUME_TYPE_NAMES.items()}


class ExpressionType(enum.StrEnum):
    """The language of a subscription expression."""

    TAG = "TAG"
    SQL92 = "SQL92"



# -- RocketMQ headers: a frame's extFields as types ------------------------------------------------
# A request's or response's header fields travel as the frame header's ``extFields``: a map of strings
# (numbers in decimal, booleans as ``true``/``false``).  Each header is one of these structs, named and
# spelled as RocketMQ's ``*RequestHeader`` / ``*ResponseHeader`` classes; :func:`ext_fields` writes one as
# strings and ``Frame.header_as`` (platform.remoting) reads one, converting the strings.  Unknown fields are
# ignored: RocketMQ's RPC base fields (``ns``, ``nsd``, ``bname``, ``oway``, ``lo``) and newer clients' fields.
# A field that HTTP bodies carry too (a topic, a queue id) names the same type (``validation.TopicName``,
# ``QueueId``): one limit, stated in the OpenAPI document and checked when a header is read (a value beyond it is
# answered with the type's code, as the logic answers it).

class ExtHeader(msgspec.Struct, omit_defaults=True):
    """The base of every extFields header."""


def _ext_text(value: object) -> str:
    if value is True:
        return "true"
    if value is False:
        return "false"
    return str(value)


_EXT_FIELDS: dict[type, tuple[str, ...]] = {}


def ext_fields(header: ExtHeader) -> dict[str, str]:
    """``header`` as an extFields map: every field that is not None, as a string."""
    names = _EXT_FIELDS.get(type(header))
    if names is None:
        names = _EXT_FIELDS[type(header)] = tuple(
            f.encode_name for f in msgspec.structs.fields(type(header)))
    out: dict[str, str] = {}
    for name, value in zip(names, msgspec.structs.astuple(header), strict=True):
        if value is not None:
            out[name] = _ext_text(value)
    return out


class SendMessageRequestHeader(ExtHeader):
    """SEND_MESSAGE (10) and, with one-letter names, SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE (310 / 320).

    ``properties`` is the message's properties string (``name\\x01value\\x02`` pairs: TAGS, KEYS, UNIQ_KEY,
    DELAY, TRAN_MSG, ...); the body is the frame's body (a RocketMQ batch encoding for 320).
    """

    producerGroup: str
    topic: TopicName
    defaultTopic: str = "TBW102"
    defaultTopicQueueNums: int = 4
    queueId: QueueId | None = None
    sysFlag: int = 0
    bornTimestamp: int = 0
    flag: int = 0
    properties: str | None = None
    reconsumeTimes: int | None = None
    unitMode: bool | None = None
    batch: bool | None = None
    maxReconsumeTimes: int | None = None


#: SEND_MESSAGE_V2's one-letter names of :class:`SendMessageRequestHeader`'s fields (RocketMQ's
#: SendMessageRequestHeaderV2; ``n`` is the broker name the client addressed).
SEND_V2_NAMES: dict[str, str] = {
    "producerGroup": "a", "topic": "b", "defaultTopic": "c", "defaultTopicQueueNums": "d", "queueId": "e",
    "sysFlag": "f", "bornTimestamp": "g", "flag": "h", "properties": "i", "reconsumeTimes": "j", "unitMode": "k",
    "maxReconsumeTimes": "l", "batch": "m"}


_Header = TypeVar("_Header", bound=msgspec.Struct)


def _v2_of(kind: type[_Header]) -> type[_Header]:
    """A subclass of ``kind`` with its fields renamed to SEND_MESSAGE_V2's letters (one definition, two
    spellings; the fields are declared again because msgspec renames only a struct's own)."""
    return cast("type[_Header]", msgspec.defstruct(
        kind.__name__ + "V2",
        [(f.name, f.type, f.default if f.default is not msgspec.NODEFAULT else msgspec.NODEFAULT)
         if f.required is False else (f.name, f.type) for f in msgspec.structs.fields(kind)],
        bases=(kind,), rename=SEND_V2_NAMES, omit_defaults=True, module=__name__))


#: SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE's header: :class:`SendMessageRequestHeader` with one-letter names.
SendMessageRequestHeaderV2 = _v2_of(SendMessageRequestHeader)


class SendMessageResponseHeader(ExtHeader):
    """A send's answer: ``msgId`` is the offsetMsgId (a batch's are comma-joined), ``queueOffset`` the
    (first) queue offset; ``transactionId`` for a half message."""

    msgId: str
    queueId: int
    queueOffset: int
    transactionId: str | None = None
    batchUniqId: str | None = None
    #: RocketMQ's answers carry these two properties as fields too.
    MSG_REGION: str | None = "DefaultRegion"
    TRACE_ON: str | None = "true"
    #: sparkmq's own (RocketMQ's clients ignore it): when the message was stored (epoch ms).
    storeTimestamp: int | None = None


class PullMessageRequestHeader(ExtHeader):
    """PULL_MESSAGE (11), LITE_PULL_MESSAGE (361) and SPARKMQ_PULL_PACKED: read a queue from ``queueOffset``.

    ``sysFlag``: PULL_FLAG_* bits (SUSPEND: hold up to ``suspendTimeoutMillis`` while nothing is new;
    COMMIT_OFFSET: commit ``commitOffset`` for the group first).  ``subscription`` is the expression
    (``*``, ``A || B``, or SQL92 when ``expressionType`` is ``SQL92``).
    """

    consumerGroup: str
    topic: TopicName
    queueId: QueueId
    queueOffset: int
    maxMsgNums: int = 32
    sysFlag: int = 0
    commitOffset: int = 0
    suspendTimeoutMillis: int = 0
    subscription: str | None = None
    subVersion: int = 0
    expressionType: str | None = None
    maxMsgBytes: int | None = None
    #: sparkmq's own: the pulling client (trace events name it); else the one the connection's heartbeat named.
    clientId: str | None = None


class PullMessageResponseHeader(ExtHeader):
    """A pull's answer (the records in the body).  Every bound is always sent: the Java client unboxes them."""

    suggestWhichBrokerId: int
    nextBeginOffset: int
    minOffset: int
    maxOffset: int
    #: sparkmq's own: how many records the body holds, and the store host of their offsetMsgIds.
    msgCount: int | None = None


class QueryConsumerOffsetRequestHeader(ExtHeader):
    """QUERY_CONSUMER_OFFSET (14): a group's committed offset of one queue (QUERY_NOT_FOUND when none)."""

    consumerGroup: str
    topic: TopicName
    queueId: QueueId
    setZeroIfNotFound: bool | None = None


class OffsetResponseHeader(ExtHeader):
    """An ``offset`` answer (QUERY_CONSUMER_OFFSET, GET_MAX/MIN_OFFSET, SEARCH_OFFSET_BY_TIMESTAMP)."""

    offset: int


class UpdateConsumerOffsetRequestHeader(ExtHeader):
    """UPDATE_CONSUMER_OFFSET (15): commit one queue's offset for a group."""

    consumerGroup: str
    topic: TopicName
    queueId: QueueId
    commitOffset: int


class QueueRequestHeader(ExtHeader):
    """GET_MAX_OFFSET / GET_MIN_OFFSET / GET_EARLIEST_MSG_STORETIME / SPARKMQ_QUEUE_OFFSETS: one queue."""

    topic: TopicName
    queueId: QueueId
    #: SPARKMQ_QUEUE_OFFSETS: also the first offset stored at or after this epoch-ms time.
    timestamp: int | None = None


class SearchOffsetRequestHeader(ExtHeader):
    """SEARCH_OFFSET_BY_TIMESTAMP (29): the offset of the first (``LOWER``) or last (``UPPER``) message stored
    at or after ``timestamp``."""

    topic: TopicName
    queueId: QueueId
    timestamp: int
    boundaryType: str = "LOWER"


class QueueOffsetsResponseHeader(ExtHeader):
    """SPARKMQ_QUEUE_OFFSETS' answer: a queue's bounds (and ``offset`` for the asked timestamp)."""

    minOffset: int
    maxOffset: int
    offset: int | None = None


class EarliestMsgStoretimeResponseHeader(ExtHeader):
    """GET_EARLIEST_MSG_STORETIME's answer (epoch ms)."""

    timestamp: int


class UnregisterClientRequestHeader(ExtHeader):
    """UNREGISTER_CLIENT (35): a client leaves a producer and/or a consumer group."""

    clientID: str
    producerGroup: str | None = None
    consumerGroup: str | None = None


class ConsumerSendMsgBackRequestHeader(ExtHeader):
    """CONSUMER_SEND_MSG_BACK (36): a message (by commit-log ``offset``) the group failed goes to its retry
    topic with ``delayLevel`` (0: 3 + reconsume times; -1: straight to the DLQ), or to the DLQ past
    ``maxReconsumeTimes``."""

    offset: int
    group: str
    delayLevel: int = 0
    originMsgId: str | None = None
    originTopic: str | None = None
    unitMode: bool = False
    maxReconsumeTimes: int | None = None
    #: sparkmq's own: why the consumer gave up (kept with a dead letter, shown by trace).
    reason: str | None = None


class EndTransactionRequestHeader(ExtHeader):
    """END_TRANSACTION (37, ONEWAY from Java): settle a half message (``commitOrRollback``:
    TRANSACTION_*_TYPE) named by its ``transactionId`` (the half's UNIQ_KEY; else ``msgId``, else the half at
    ``commitLogOffset``).  Java always sends both offsets; sparkmq's client leaves them out when it does not know
    them (a transaction ended by hand)."""

    producerGroup: str
    commitOrRollback: int
    tranStateTableOffset: int | None = None
    commitLogOffset: int | None = None
    fromTransactionCheck: bool = False
    msgId: str | None = None
    transactionId: str | None = None
    topic: str | None = None


class ConsumerGroupRequestHeader(ExtHeader):
    """GET_CONSUMER_LIST_BY_GROUP (38), NOTIFY_CONSUMER_IDS_CHANGED (40), GET_CONSUMER_CONNECTION_LIST (203),
    SPARKMQ_GROUP_INFO: one consumer group."""

    consumerGroup: str


class CheckTransactionStateRequestHeader(ExtHeader):
    """CHECK_TRANSACTION_STATE (39, broker -> producer, ONEWAY): the body is the half message as a RocketMQ
    stored record (its ``PGROUP`` property names the producer group)."""

    topic: str | None
    tranStateTableOffset: int
    commitLogOffset: int
    msgId: str | None = None
    transactionId: str | None = None
    offsetMsgId: str | None = None


class QueryMessageRequestHeader(ExtHeader):
    """QUERY_MESSAGE (12): messages of ``topic`` whose key (or, with ``_UNIQUE_KEY_QUERY``, unique id) is
    ``key``, stored in ``[beginTimestamp, endTimestamp]``; at most ``maxNum``."""

    topic: str
    key: str
    maxNum: int
    beginTimestamp: int
    endTimestamp: int
    _UNIQUE_KEY_QUERY: str | None = None


class QueryMessageResponseHeader(ExtHeader):
    """QUERY_MESSAGE's answer (the records in the body)."""

    indexLastUpdateTimestamp: int
    indexLastUpdatePhyoffset: int


class ViewMessageRequestHeader(ExtHeader):
    """VIEW_MESSAGE_BY_ID (33): the message at commit-log ``offset``."""

    offset: int
    topic: str | None = None


class CreateTopicRequestHeader(ExtHeader):
    """UPDATE_AND_CREATE_TOPIC (17)."""

    topic: str
    defaultTopic: str = "TBW102"
    readQueueNums: int = 16
    writeQueueNums: int = 16
    perm: int = 6
    topicFilterType: str = "SINGLE_TAG"
    topicSysFlag: int = 0
    order: bool = False
    attributes: str | None = None


class TopicRequestHeader(ExtHeader):
    """DELETE_TOPIC_IN_BROKER (215), GET_TOPIC_STATS_INFO (202), GET_ROUTEINFO_BY_TOPIC (105),
    DELETE_TOPIC_IN_NAMESRV (216), QUERY_TOPIC_CONSUME_BY_WHO (300): one topic."""

    topic: str
    #: GET_ROUTEINFO_BY_TOPIC: quote the route's numeric map keys (sparkmq always does).
    acceptStandardJsonOnly: bool | None = None
    #: DELETE_TOPIC_IN_NAMESRV: only from this cluster's brokers.
    clusterName: str | None = None


class GetConsumeStatsRequestHeader(ExtHeader):
    """GET_CONSUME_STATS (208): a group's progress on one topic (or every topic it consumes)."""

    consumerGroup: str
    topic: str | None = None


class ResetOffsetRequestHeader(ExtHeader):
    """INVOKE_BROKER_TO_RESET_OFFSET (222): move ``group``'s offsets of ``topic`` to ``timestamp`` (epoch ms;
    -1 = the end) -- or, with ``queueId`` >= 0 and ``offset``, one queue to ``offset``."""

    group: str
    topic: str
    timestamp: int = -1
    isForce: bool = True
    queueId: int = -1
    offset: int | None = None


class ResetOffsetNoticeHeader(ExtHeader):
    """RESET_CONSUMER_CLIENT_OFFSET (220, broker -> consumer, ONEWAY); the body is :class:`ResetOffsetBody`."""

    topic: str
    group: str
    timestamp: int = 0
    isForce: bool = True


class ConsumerRunningInfoRequestHeader(ExtHeader):
    """GET_CONSUMER_RUNNING_INFO (307): the broker relays it to the client ``clientId``."""

    consumerGroup: str
    clientId: str
    jstackEnable: bool = False


class KVConfigRequestHeader(ExtHeader):
    """PUT_KV_CONFIG / GET_KV_CONFIG / DELETE_KV_CONFIG (100-102) and GET_KVLIST_BY_NAMESPACE (219)."""

    namespace: str
    key: str | None = None
    value: str | None = None


class KVConfigResponseHeader(ExtHeader):
    """GET_KV_CONFIG's answer (QUERY_NOT_FOUND when there is no such key)."""

    value: str | None = None


class ClusterRequestHeader(ExtHeader):
    """GET_TOPICS_BY_CLUSTER (224)."""

    cluster: str


class SendPackedRequestHeader(ExtHeader):
    """SPARKMQ_SEND_PACKED: ``count`` messages for one queue in sparkmq's packed encoding (docs/remoting.md).

    ``queueId`` None lets the broker choose (round robin, or by ``shardingKey``); ``compressed``: the
    entries' bodies are zlib-deflated (each entry's properties say so)."""

    topic: TopicName
    count: int
    producerGroup: str | None = None
    queueId: QueueId | None = None
    shardingKey: str | None = None
    compressed: bool = False
    delayLevel: int | None = None
    deliverAtMs: int | None = None
    delayMs: int | None = None


class SendPackedResponseHeader(ExtHeader):
    """Where a packed batch was stored; the body is each message's commit-log offset (int64 little-endian)."""

    status: str
    topic: str
    brokerName: str
    queueId: int
    queueOffset: int
    count: int
    storeTimestamp: int
    #: The store host ("ip:port") that, with a commit-log offset, makes an offsetMsgId.
    storeHost: str
    #: Each message's queue offset, comma-separated, when they are not consecutive (a delayed batch).
    queueOffsets: str | None = None


class UpdateConsumerOffsetsResponseHeader(ExtHeader):
    """SPARKMQ_UPDATE_CONSUMER_OFFSETS' answer: entries applied (a queue whose reset waits is skipped)."""

    committed: int


class HeartbeatResponseHeader(ExtHeader):
    """HEART_BEAT's answer fields, as RocketMQ 5's broker sends them.  sparkmq does not take V2 heartbeats
    (fingerprints without subscriptions), so it says so and the Java client keeps sending whole ones."""

    isSupportHeartBeatV2: bool = False
    isSubChange: bool = True


class HeartbeatResponseBody(msgspec.Struct):
    """sparkmq's own HEART_BEAT answer body (RocketMQ's clients ignore it): each consumer group's membership
    version, where a consumer's change watch starts."""

    groupVersions: dict[str, int] = {}


class SendBackResponseHeader(ExtHeader):
    """sparkmq's own CONSUMER_SEND_MSG_BACK answer fields (RocketMQ's broker answers none): where the message
    went -- ``status`` RETRY or DLQ."""

    status: str
    topic: str
    delayLevel: int
    reconsumeTimes: int
    msgId: str
    offsetMsgId: str


class EndTransactionResponseHeader(ExtHeader):
    """sparkmq's own END_TRANSACTION answer fields (a ONEWAY one gets none): the settled transaction and, when a
    commit made the message visible, where it was stored."""

    transactionId: str
    action: str
    msgId: str | None = None
    offsetMsgId: str | None = None
    topic: str | None = None
    queueId: int | None = None
    queueOffset: int | None = None
    storeTimestamp: int | None = None


class PostTraceResponseHeader(ExtHeader):
    """SPARKMQ_POST_TRACE's answer: events taken (0 when tracing is off on the broker), or dropped (buffer full)."""

    accepted: int
    dropped: int = 0
    enabled: bool = True


class PostTraceBody(msgspec.Struct):
    """SPARKMQ_POST_TRACE's body: a client's trace events (``send``, ``consume``), each as in ``GET /trace``."""

    events: list[dict[str, str | int | float | bool | None]] = []


class ErrorResponseHeader(ExtHeader):
    """The extFields of an error response: sparkmq's stable error code (its message is the ``remark``)."""

    errorCode: str | None = None


# -- RocketMQ bodies (JSON) -------------------------------------------------------------------------
# Bodies RocketMQ encodes as JSON with fastjson's bean names; enums by name.

class MessageQueueData(msgspec.Struct, frozen=True):
    """RocketMQ's MessageQueue."""

    topic: str
    brokerName: str
    queueId: int


class BrokerData(msgspec.Struct):
    """One broker group of a route: ``brokerAddrs`` by broker id (0 = the master)."""

    cluster: str
    brokerName: str
    brokerAddrs: dict[int, str]
    enableActingMaster: bool = False
    zoneName: str | None = None


class QueueData(msgspec.Struct):
    """A topic's queues on one broker group."""

    brokerName: str
    readQueueNums: int
    writeQueueNums: int
    perm: int
    topicSysFlag: int = 0


class TopicRouteData(msgspec.Struct, omit_defaults=True):
    """GET_ROUTEINFO_BY_TOPIC's answer."""

    brokerDatas: list[BrokerData] = []
    queueDatas: list[QueueData] = []
    orderTopicConf: str | None = None
    filterServerTable: dict[str, list[str]] = {}


class ClusterInfo(msgspec.Struct):
    """GET_BROKER_CLUSTER_INFO's answer."""

    brokerAddrTable: dict[str, BrokerData] = {}
    clusterAddrTable: dict[str, list[str]] = {}


class TopicList(msgspec.Struct, omit_defaults=True):
    """A list of topic names."""

    topicList: list[str] = []
    brokerAddr: str | None = None


class KVTable(msgspec.Struct):
    """A string map (KV configs, broker runtime info)."""

    table: dict[str, str] = {}


class SubscriptionDataBody(msgspec.Struct):
    """One subscription of a consumer group (RocketMQ's SubscriptionData)."""

    topic: str
    subString: str = "*"
    tagsSet: list[str] = []
    codeSet: list[int] = []
    subVersion: int = 0
    expressionType: str = "TAG"
    classFilterMode: bool = False
    filterClassSource: str | None = None


class CheckClientRequestBody(msgspec.Struct):
    """CHECK_CLIENT_CONFIG's body (RocketMQ's CheckClientRequestBody): one subscription to vet."""

    clientId: str = ""
    group: str = ""
    subscriptionData: SubscriptionDataBody | None = None


class ConsumerDataBody(msgspec.Struct, omit_defaults=True):
    """One consumer group of a heartbeat (RocketMQ's ConsumerData).

    ``consumeType``: CONSUME_PASSIVELY (push), CONSUME_ACTIVELY (pull) or CONSUME_POP.  ``heldQueues`` is
    sparkmq's own (RocketMQ's broker ignores it): the queues the member holds after its last rebalance, as
    :func:`held_queue_key` strings, so operators see who reads what.
    """

    groupName: str
    consumeType: str = "CONSUME_PASSIVELY"
    messageModel: str = "CLUSTERING"
    consumeFromWhere: str = "CONSUME_FROM_LAST_OFFSET"
    subscriptionDataSet: list[SubscriptionDataBody] = []
    unitMode: bool = False
    heldQueues: list[str] = []


class ProducerDataBody(msgspec.Struct):
    """One producer group of a heartbeat."""

    groupName: str


class HeartbeatData(msgspec.Struct, omit_defaults=True):
    """HEART_BEAT's body: a client's groups.  It binds the client id to the connection for pushed requests."""

    clientID: str
    producerDataSet: list[ProducerDataBody] = []
    consumerDataSet: list[ConsumerDataBody] = []
    heartbeatFingerprint: int = 0
    withoutSub: bool = False


class ConsumerIdList(msgspec.Struct):
    """GET_CONSUMER_LIST_BY_GROUP's answer."""

    consumerIdList: list[str] = []


class LockBatchRequestBody(msgspec.Struct, omit_defaults=True):
    """LOCK_BATCH_MQ / UNLOCK_BATCH_MQ's body."""

    consumerGroup: str
    clientId: str
    mqSet: list[MessageQueueData] = []
    onlyThisBroker: bool = False


class LockBatchResponseBody(msgspec.Struct):
    """LOCK_BATCH_MQ's answer: the queues the client holds now."""

    lockOKMQSet: list[MessageQueueData] = []


class ConnectionData(msgspec.Struct):
    """One client connection of a group (RocketMQ's Connection)."""

    clientId: str
    clientAddr: str
    language: str
    version: int


class ConsumerConnection(msgspec.Struct, omit_defaults=True):
    """GET_CONSUMER_CONNECTION_LIST's answer."""

    connectionSet: list[ConnectionData] = []
    subscriptionTable: dict[str, SubscriptionDataBody] = {}
    consumeType: str | None = None
    messageModel: str | None = None
    consumeFromWhere: str | None = None


class TopicConfigData(msgspec.Struct):
    """One topic's configuration (RocketMQ's TopicConfig; every field written, as RocketMQ's broker does)."""

    topicName: str
    readQueueNums: int
    writeQueueNums: int
    perm: int
    topicFilterType: str = "SINGLE_TAG"
    topicSysFlag: int = 0
    order: bool = False
    attributes: dict[str, str] = {}


class DataVersion(msgspec.Struct):
    """RocketMQ's DataVersion: a counter and its time."""

    timestamp: int
    counter: int
    stateVersion: int = 0


class TopicConfigSerializeWrapper(msgspec.Struct):
    """GET_ALL_TOPIC_CONFIG's answer."""

    topicConfigTable: dict[str, TopicConfigData]
    dataVersion: DataVersion


class UpdateConsumerOffsetEntry(msgspec.Struct):
    """One entry of SPARKMQ_UPDATE_CONSUMER_OFFSETS' body."""

    topic: str
    queueId: int
    offset: int


class UpdateConsumerOffsetsBody(msgspec.Struct):
    """SPARKMQ_UPDATE_CONSUMER_OFFSETS' body: a group's offsets, all or nothing."""

    consumerGroup: str
    offsets: list[UpdateConsumerOffsetEntry] = []


#: The most queues one member may report holding in one heartbeat (an operator's view, not a hard limit of
#: consumption: a member past it is refused with INVALID_ARGUMENT rather than silently shown half its queues).
MAX_HELD_QUEUES = 65_536


def held_queue_key(topic: str, broker_name: str, queue_id: int) -> str:
    """How a heartbeat names one queue a member holds: ``"topic@broker/queue_id"``.

    Topic names cannot hold ``@`` (``[%|a-zA-Z0-9_-]``), so the first ``@`` ends the topic.

    Example::

        >>> held_queue_key("orders", "broker-a", 3)
        'orders@broker-a/3'
    """
    return f"{topic}@{broker_name}/{queue_id}"


def parse_held_queue(key: object) -> tuple[str, str, int]:
    """``(topic, broker_name, queue_id)`` of a :func:`held_queue_key`; INVALID_ARGUMENT when malformed.

    Example::

        >>> parse_held_queue("%RETRY%cg@broker-a/0")
        ('%RETRY%cg', 'broker-a', 0)
    """
    if isinstance(key, str) and len(key) <= 512:
        topic, at, rest = key.partition("@")
        broker, slash, queue = rest.rpartition("/")
        if topic and at and broker and slash and queue.isdigit() and len(queue) <= 5:
            return topic, broker, int(queue)
    raise SparkMQError(ErrorCode.INVALID_ARGUMENT, f"a held queue is 'topic@broker/queue_id', got {key!r}")


class GroupSubscriptionView(msgspec.Struct):
    """One topic a consumer group subscribes to, with its filter (a group view's ``subscriptions``)."""

    topic: str
    expression: str = "*"
    type: str = "TAG"


class GroupMemberData(msgspec.Struct):
    """One member of a consumer group as the broker knows it from its last heartbeat."""

    client_id: str
    #: PUSH / PULL (the client pulls and rebalances: it holds queues) or POP (the broker hands messages out:
    #: a POP or gRPC member holds no queue).
    consume_type: str | None = None
    message_model: str | None = None
    #: :func:`held_queue_key` of each queue of this broker the member holds, sorted.
    held_queues: list[str] = []


class GroupInfoBody(msgspec.Struct):
    """sparkmq's own SPARKMQ_GROUP_INFO answer body: a consumer group's membership version, sorted member ids,
    settings, subscriptions and each member's protocol and held queues -- what ``GET /consumers/{group}``
    answers."""

    group: str
    version: int
    members: list[str] = []
    message_model: str | None = None
    consume_type: str | None = None
    consume_from_where: str | None = None
    subscriptions: list[GroupSubscriptionView] = []
    clients: list[GroupMemberData] = []


def mq_keyed_json(entries: list[tuple[MessageQueueData, Any]], extra: dict[str, Any] | None = None,
                  field_name: str = "offsetTable") -> bytes:
    """RocketMQ's JSON of a map keyed by MessageQueue (TopicStatsTable, ConsumeStats, ResetOffsetBody).

    fastjson writes such a map with the key objects themselves as keys -- not JSON, but what the Java side
    reads: ``{"offsetTable":{{"brokerName":"b","queueId":0,"topic":"t"}:{...}}, ...extra}``.
    """
    enc = msgspec.json.encode
    items = b",".join(
        b'{"brokerName":' + enc(mq.brokerName) + b',"queueId":' + str(mq.queueId).encode()
        + b',"topic":' + enc(mq.topic) + b"}:" + enc(value) for mq, value in entries)
    tail = b"".join(b"," + enc(k) + b":" + enc(v) for k, v in (extra or {}).items())
    return b'{"' + field_name.encode() + b'":{' + items + b"}" + tail + b"}"


class ProcessQueueInfo(msgspec.Struct):
    """One held queue of a consumer's GET_CONSUMER_RUNNING_INFO answer (RocketMQ's ProcessQueueInfo)."""

    commitOffset: int
    cachedMsgMinOffset: int = 0
    cachedMsgMaxOffset: int = 0
    cachedMsgCount: int = 0
    cachedMsgSizeInMiB: int = 0
    transactionMsgMinOffset: int = 0
    transactionMsgMaxOffset: int = 0
    transactionMsgCount: int = 0
    locked: bool = False
    tryUnlockTimes: int = 0
    lastLockTimestamp: int = 0
    droped: bool = False
    lastPullTimestamp: int = 0
    lastConsumeTimestamp: int = 0


#: GET_CONSUMER_RUNNING_INFO's ``properties`` names (RocketMQ's ConsumerRunningInfo).
PROP_NAMESERVER_ADDR = "PROP_NAMESERVER_ADDR"
PROP_CONSUME_TYPE = "PROP_CONSUME_TYPE"
PROP_CONSUME_ORDERLY = "PROP_CONSUMEORDERLY"
PROP_CLIENT_VERSION = "PROP_CLIENT_VERSION"
PROP_CONSUMER_START_TIMESTAMP = "PROP_CONSUMER_START_TIMESTAMP"
PROP_THREADPOOL_CORE_SIZE = "PROP_THREADPOOL_CORE_SIZE"


def consumer_running_info(properties: dict[str, str], subscriptions: list[SubscriptionDataBody],
                          queues: list[tuple[MessageQueueData, ProcessQueueInfo]]) -> bytes:
    """A consumer's GET_CONSUMER_RUNNING_INFO body (RocketMQ's ConsumerRunningInfo): its properties, subscriptions and
    each held queue's state (a MessageQueue-keyed map, as :func:`mq_keyed_json` writes it)."""
    return mq_keyed_json(queues, {"properties": properties, "subscriptionSet": subscriptions, "statusTable": {},
                                  "userConsumerInfo": {}}, field_name="mqTable")


_JSON_STRING = rb'("(?:[^"\\]|\\.)*")'
_MQ_KEYED_ENTRY = re.compile(rb'\{"brokerName":' + _JSON_STRING + rb',"queueId":(\d+),"topic":' + _JSON_STRING
                             + rb'\}:(-?\d+)')


def parse_mq_offsets(data: bytes | memoryview) -> dict[MessageQueueData, int]:
    """The offsets of a :func:`mq_keyed_json` body whose values are integers (RESET_CONSUMER_CLIENT_OFFSET's
    ResetOffsetBody); INVALID_ARGUMENT when it holds none and is not an empty table.

    Example::

        >>> parse_mq_offsets(mq_keyed_json([(MessageQueueData("t", "b", 1), 7)]))
        {MessageQueueData(topic='t', brokerName='b', queueId=1): 7}
    """
    raw = bytes(data)
    out = {MessageQueueData(msgspec.json.decode(topic), msgspec.json.decode(broker), int(queue)): int(offset)
           for broker, queue, topic, offset in _MQ_KEYED_ENTRY.findall(raw)}
    if not out and b"{}" not in raw:
        raise SparkMQError(ErrorCode.INVALID_ARGUMENT, f"not a MessageQueue-keyed offset table: {raw[:80]!r}")
    return out


# -- outcomes carried by response codes ------------------------------------------------------------

#: A pull's response code for each outcome (RocketMQ's PullMessageProcessor): found 0, none matched 20, nothing
#: new 19, and every "start elsewhere" 21 (PULL_OFFSET_MOVED: the answer's nextBeginOffset is where).  The
#: remark names the :class:`PullStatus` (RocketMQ's broker puts its GetMessageStatus there too).
_PULL_CODES: dict[PullStatus, int] = {
    PullStatus.FOUND: ResponseCode.SUCCESS, PullStatus.NO_NEW_MSG: ResponseCode.PULL_NOT_FOUND,
    PullStatus.NO_MATCHED_MSG: ResponseCode.PULL_RETRY_IMMEDIATELY,
    PullStatus.NO_MATCHED_QUEUE: ResponseCode.PULL_OFFSET_MOVED,
    PullStatus.OFFSET_TOO_SMALL: ResponseCode.PULL_OFFSET_MOVED,
    PullStatus.OFFSET_OVERFLOW: ResponseCode.PULL_OFFSET_MOVED, PullStatus.OFFSET_RESET: ResponseCode.PULL_OFFSET_MOVED}
#: The response codes a pull answers with (every other one is an error).
PULL_OUTCOME_CODES: frozenset[int] = frozenset(_PULL_CODES.values())
_PULL_STATUS_OF_CODE: dict[int, PullStatus] = {
    ResponseCode.SUCCESS: PullStatus.FOUND, ResponseCode.PULL_NOT_FOUND: PullStatus.NO_NEW_MSG,
    ResponseCode.PULL_RETRY_IMMEDIATELY: PullStatus.NO_MATCHED_MSG}


def pull_response_code(status: PullStatus, offset: int) -> int:
    """The response code of a pull at ``offset`` that ended with ``status``; a queue never written answers 19
    at offset 0 and 21 elsewhere, as RocketMQ's broker does.

    Example::

        >>> pull_response_code(PullStatus.NO_MATCHED_QUEUE, 0), pull_response_code(PullStatus.NO_MATCHED_QUEUE, 5)
        (19, 21)
    """
    if status is PullStatus.NO_MATCHED_QUEUE and offset == 0:
        return ResponseCode.PULL_NOT_FOUND
    return _PULL_CODES[status]


def pull_status_of(code: int, remark: str | None) -> PullStatus:
    """A pull answer's :class:`PullStatus`: from its code, and for 21 from the remark (OFFSET_OVERFLOW when the
    remark names none: another broker's answer)."""
    status = _PULL_STATUS_OF_CODE.get(code)
    if status is not None:
        return status
    if code != ResponseCode.PULL_OFFSET_MOVED:
        raise SparkMQError(ErrorCode.INTERNAL_ERROR, f"response code {code} is not a pull's outcome")
    try:
        return PullStatus(remark or "")
    except ValueError:
        return PullStatus.OFFSET_OVERFLOW


#: A stored send's response code by its status name (RocketMQ's SendMessageProcessor): the message is stored in
#: all four cases.
SEND_STATUS_CODES: dict[str, int] = {"SEND_OK": ResponseCode.SUCCESS,
                                     "FLUSH_DISK_TIMEOUT": ResponseCode.FLUSH_DISK_TIMEOUT,
                                     "SLAVE_NOT_AVAILABLE": ResponseCode.SLAVE_NOT_AVAILABLE,
                                     "FLUSH_SLAVE_TIMEOUT": ResponseCode.FLUSH_SLAVE_TIMEOUT}
#: The response codes a send answers with, and the status each stands for.
SEND_STATUS_OF_CODE: dict[int, str] = {code: name for name, code in SEND_STATUS_CODES.items()}
SEND_OUTCOME_CODES: frozenset[int] = frozenset(SEND_STATUS_OF_CODE)


__all__ += [
    "FRAME_PREFIX_SIZE", "MAX_HEADER_BYTES", "SERVER_VERSION", "CLIENT_VERSION", "SerializeType", "LanguageCode",
    "SPARKMQ_CODE_BASE", "ResponseCode", "PULL_FLAG_COMMIT_OFFSET", "PULL_FLAG_SUSPEND", "PULL_FLAG_SUBSCRIPTION",
    "PULL_FLAG_CLASS_FILTER", "PULL_FLAG_LITE_PULL", "TRANSACTION_NOT_TYPE", "TRANSACTION_COMMIT_TYPE",
    "TRANSACTION_ROLLBACK_TYPE", "ExtHeader", "ext_fields", "SEND_V2_NAMES", "SendMessageRequestHeader",
    "SendMessageRequestHeaderV2", "SendMessageResponseHeader", "PullMessageRequestHeader",
    "PullMessageResponseHeader", "QueryConsumerOffsetRequestHeader", "OffsetResponseHeader",
    "UpdateConsumerOffsetRequestHeader", "QueueRequestHeader", "SearchOffsetRequestHeader",
    "QueueOffsetsResponseHeader", "EarliestMsgStoretimeResponseHeader", "UnregisterClientRequestHeader",
    "ConsumerSendMsgBackRequestHeader", "EndTransactionRequestHeader", "ConsumerGroupRequestHeader",
    "CheckTransactionStateRequestHeader", "QueryMessageRequestHeader", "QueryMessageResponseHeader",
    "ViewMessageRequestHeader", "CreateTopicRequestHeader", "TopicRequestHeader", "GetConsumeStatsRequestHeader",
    "ResetOffsetRequestHeader", "ResetOffsetNoticeHeader", "ConsumerRunningInfoRequestHeader",
    "KVConfigRequestHeader", "KVConfigResponseHeader", "ClusterRequestHeader", "SendPackedRequestHeader",
    "SendPackedResponseHeader", "UpdateConsumerOffsetsResponseHeader", "ErrorResponseHeader", "MessageQueueData",
    "BrokerData", "QueueData", "TopicRouteData", "ClusterInfo", "TopicList", "KVTable", "SubscriptionDataBody",
    "ConsumerDataBody", "ProducerDataBody", "HeartbeatData", "ConsumerIdList", "LockBatchRequestBody",
    "LockBatchResponseBody", "ConnectionData", "ConsumerConnection", "TopicConfigData", "DataVersion",
    "TopicConfigSerializeWrapper", "UpdateConsumerOffsetEntry", "UpdateConsumerOffsetsBody", "mq_keyed_json"]


# -- mqadmin's admin bodies (api/remoting/admin.py) ------------------------------------------------------------

class TopicOffsetData(msgspec.Struct):
    """A queue's bounds in GET_TOPIC_STATS_INFO's ``TopicStatsTable`` (the store time of its newest message)."""

    minOffset: int
    maxOffset: int
    lastUpdateTimestamp: int


class OffsetWrapperData(msgspec.Struct):
    """A group's progress on a queue in GET_CONSUME_STATS' ``ConsumeStats`` (``lastTimestamp``: the store time of
    the last message consumed, 0 when none)."""

    brokerOffset: int
    consumerOffset: int
    pullOffset: int
    lastTimestamp: int


class GroupList(msgspec.Struct):
    """QUERY_TOPIC_CONSUME_BY_WHO's answer: the groups consuming a topic."""

    groupList: list[str] = []


class SubscriptionGroupConfigBody(msgspec.Struct):
    """UPDATE_AND_CREATE_SUBSCRIPTIONGROUP's body and GET_ALL_SUBSCRIPTIONGROUP_CONFIG's entries (RocketMQ's
    ``SubscriptionGroupConfig``, its defaults, every field written; its retry policy and subscription set are not
    kept)."""

    groupName: str
    consumeEnable: bool = True
    consumeFromMinEnable: bool = True
    consumeBroadcastEnable: bool = True
    consumeMessageOrderly: bool = False
    retryQueueNums: int = 1
    retryMaxTimes: int = 16
    brokerId: int = 0
    whichBrokerWhenConsumeSlowly: int = 1
    notifyConsumerIdsChangedEnable: bool = True
    groupSysFlag: int = 0
    consumeTimeoutMinute: int = 15
    attributes: dict[str, str] = {}


class SubscriptionGroupWrapper(msgspec.Struct):
    """GET_ALL_SUBSCRIPTIONGROUP_CONFIG's answer."""

    subscriptionGroupTable: dict[str, SubscriptionGroupConfigBody]
    dataVersion: DataVersion
    forbiddenTable: dict[str, dict[str, int]] = {}


class SubscriptionGroupRequestHeader(ExtHeader):
    """GET_SUBSCRIPTIONGROUP_CONFIG (352): one group's config."""

    group: str


class DeleteSubscriptionGroupRequestHeader(ExtHeader):
    """DELETE_SUBSCRIPTIONGROUP (207): forget a group's config (and, with ``cleanOffset``, its offsets)."""

    groupName: str
    cleanOffset: bool = False


__all__ += ["TopicOffsetData", "OffsetWrapperData", "GroupList", "SubscriptionGroupConfigBody",
            "SubscriptionGroupWrapper", "SubscriptionGroupRequestHeader", "DeleteSubscriptionGroupRequestHeader"]


# ================================================================================================
# POP consumption (RocketMQ 5 server-side consumption): the broker core's typed request and results.
# The POP processor (platform/broker/processors/pop.py) takes these; the gRPC adapter maps
# ReceiveMessage / AckMessage / ChangeInvisibleDuration / ForwardMessageToDeadLetterQueue onto them.
# ================================================================================================

from .message import StoredMessage  # noqa: E402  (the POP section's own import; message.py never imports this)

#: Most messages one POP receive hands out (RocketMQ's PopMessageProcessor refuses more than 32).
MAX_POP_BATCH = 32
#: RocketMQ's invisible-time bounds: 10 s .. 12 h.  A broker may lower the minimum with its config
#: key ``pop_min_invisible_ms`` (tests need short invisible times); the maximum is fixed.
POP_MIN_INVISIBLE_MS = 10_000
POP_MAX_INVISIBLE_MS = 12 * 3600 * 1000
#: Longest a POP receive may be held waiting for a message (a gRPC client asks for up to 30 s).
POP_MAX_LONG_POLL_MS = 60_000
#: Delivery attempts before a POP message goes to ``%DLQ%<group>``: RocketMQ's max reconsume times (16) + 1.
POP_DEFAULT_MAX_ATTEMPTS = 17


@dataclass(frozen=True, slots=True)
class PopRequest:
    """One POP receive of ``group`` on ``topic``; validated by ``PopProcessor.receive``.

    Example::

        >>> PopRequest("g1", "Orders", max_messages=16, invisible_ms=30_000, long_poll_ms=20_000).fifo
        False
    """

    group: str
    topic: str
    #: 1..MAX_POP_BATCH.
    max_messages: int = MAX_POP_BATCH
    #: How long handed-out messages stay invisible to other receives of the group (see POP_MIN_INVISIBLE_MS).
    invisible_ms: int = 60_000
    #: Hold the receive up to this long (0..POP_MAX_LONG_POLL_MS) while nothing is deliverable.
    long_poll_ms: int = 0
    #: ``TAG`` (``expression`` is "a || b", "*" or None = every message) or ``SQL92``; as a pull filters.
    filter_type: ExpressionType = ExpressionType.TAG
    expression: str | None = None
    #: The receiving client (trace events name it).
    client_id: str | None = None
    #: FIFO: per queue, nothing more is delivered while an earlier message of it is unacked.
    #: A topic configured as ordered (its ``order`` flag) is always FIFO too.
    fifo: bool = False
    #: Receive from this read queue only; None = every read queue of the topic on this broker.
    queue_id: int | None = None
    #: Attempts before dead-lettering (1..1000); None = POP_DEFAULT_MAX_ATTEMPTS.  A gRPC adapter passes the
    #: backoff policy's max_attempts it told the client.  Kept with each delivery, so a timeout after a
    #: restart still knows it.
    max_attempts: int | None = None


@dataclass(frozen=True, slots=True)
class PoppedMessage:
    """One message a POP receive handed out."""

    #: The message as stored (the type pulls answer), at its own topic, queue and offset.
    message: StoredMessage
    #: Opaque; ack / change_invisible / forward_to_dlq name the delivery with it.  Any later delivery,
    #: renewal or settlement of the message makes it stale.
    receipt_handle: str
    #: 1 on the first delivery to the group, +1 on each redelivery after the invisible time passed.
    delivery_attempt: int
    #: Epoch ms when the message becomes deliverable again unless acked first.
    invisible_until_ms: int


@dataclass(frozen=True, slots=True)
class PopQueueLag:
    """One queue's POP backlog for a group."""

    queue_id: int
    #: The queue's max offset (one past the last message).
    broker_offset: int
    #: Everything below this is settled (acked, filtered out or dead-lettered): the group's committed offset.
    consumer_offset: int
    #: Handed out and not settled (invisible now, or waiting for redelivery).
    in_flight: int
    #: Stored and never handed out to the group yet.
    not_received: int

    @property
    def lag(self) -> int:
        """Unsettled messages: in flight + not yet received."""
        return self.in_flight + self.not_received


@dataclass(frozen=True, slots=True)
class PopLag:
    """A group's POP backlog on a topic: per queue and in total."""

    group: str
    topic: str
    queues: list[PopQueueLag]

    @property
    def in_flight(self) -> int:
        """Handed out and not settled, over every queue."""
        return sum(q.in_flight for q in self.queues)

    @property
    def not_received(self) -> int:
        """Never handed out yet, over every queue."""
        return sum(q.not_received for q in self.queues)

    @property
    def total(self) -> int:
        """The real lag: in flight + not yet received (RocketMQ's dashboard shows -1 for POP groups)."""
        return self.in_flight + self.not_received


__all__ += ["MAX_POP_BATCH", "POP_MIN_INVISIBLE_MS", "POP_MAX_INVISIBLE_MS", "POP_MAX_LONG_POLL_MS",
            "POP_DEFAULT_MAX_ATTEMPTS", "PopRequest", "PoppedMessage", "PopQueueLag", "PopLag"]


# ================================================================================================
# Report reads: the lake's per-minute ``topic_stats`` / ``group_stats`` (pipelines/reports.py) as chart
# series over hours and days.  The broker reads its own rows (``GET /reports/{kind}s/{name}``), the admin
# client sums the masters' series.
# ================================================================================================

#: The ranges a report read answers: name -> (seconds back from now, bucket seconds).  Buckets keep an answer
#: at a few hundred points (a week of minute rows would be 10,080 per series).
REPORT_RANGES: dict[str, tuple[int, int]] = {
    "1h": (3_600, 60), "6h": (21_600, 60), "24h": (86_400, 300), "7d": (604_800, 1_800)}
#: What a report read covers: one topic (``topic_stats``) or one consumer group (``group_stats``).
REPORT_KINDS = ("topic", "group")
#: The most report rows one read scans (a week of a group on thousands of queues); past it the answer is
#: ``truncated`` (its newest buckets may be missing rows) instead of the broker scanning without bound.
MAX_REPORT_ROWS = 2_000_000


def report_range(name: object) -> tuple[int, int]:
    """``(seconds, bucket seconds)`` of a report range name; INVALID_ARGUMENT for any other.

    Example::

        >>> report_range("24h")
        (86400, 300)
    """
    if isinstance(name, str) and name in REPORT_RANGES:
        return REPORT_RANGES[name]
    raise SparkMQError(ErrorCode.INVALID_ARGUMENT, f"range must be one of {list(REPORT_RANGES)}, got {name!r}")


@dataclass(frozen=True, slots=True)
class ReportPoint:
    """One bucket of a report series: sums over the bucket's minute windows (and over brokers when merged)."""

    #: The bucket's start, epoch seconds.
    t: int
    #: Messages stored (a topic's, or on the queues a group reads).
    messages_in: int
    #: Messages consumed (by every group of a topic, or by the group).
    messages_out: int
    #: ``messages_in`` / bucket seconds.
    tps_in: float
    #: ``messages_out`` / bucket seconds.
    tps_out: float
    #: A group's lag summed over its queues at the end of the bucket's last window (None for a topic).
    lag: int | None = None


@dataclass(frozen=True, slots=True)
class ReportSeries:
    """A topic's or a group's report rows over one range, bucketed; points oldest first.

    Example::

        >>> s = ReportSeries("topic", "orders", "1h", 60, [ReportPoint(60, 120, 60, 2.0, 1.0)])
        >>> ReportSeries.merged([s, s]).points[0].messages_in
        240
    """

    kind: str
    name: str
    range: str
    step_s: int
    points: list[ReportPoint] = field(default_factory=list)
    #: MAX_REPORT_ROWS were scanned before the range's end: some rows are missing.
    truncated: bool = False

    def to_dict(self) -> dict[str, Any]:
        """JSON form (``GET /reports/...``)."""
        return {"kind": self.kind, "name": self.name, "range": self.range, "step_s": self.step_s,
                "truncated": self.truncated,
                "points": [{"t": p.t, "messages_in": p.messages_in, "messages_out": p.messages_out,
                            "tps_in": p.tps_in, "tps_out": p.tps_out, "lag": p.lag} for p in self.points]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ReportSeries:
        """From :meth:`to_dict`'s form; INTERNAL_ERROR when malformed (a server this client does not know)."""
        try:
            points = [ReportPoint(int(p["t"]), int(p["messages_in"]), int(p["messages_out"]), float(p["tps_in"]),
                                  float(p["tps_out"]), None if p.get("lag") is None else int(p["lag"]))
                      for p in data.get("points") or ()]
            return cls(str(data["kind"]), str(data["name"]), str(data["range"]), int(data["step_s"]), points,
                       bool(data.get("truncated")))
        except (KeyError, TypeError, ValueError) as exc:
            raise SparkMQError(ErrorCode.INTERNAL_ERROR, f"malformed report series: {exc!r}") from None

    @classmethod
    def merged(cls, series: list[ReportSeries]) -> ReportSeries:
        """Several brokers' series of the same kind, name and range summed per bucket (an empty list: none)."""
        if not series:
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, "nothing to merge")
        first = series[0]
        sums: dict[int, list[Any]] = {}
        for s in series:
            for p in s.points:
                acc = sums.setdefault(p.t, [0, 0, 0.0, 0.0, None])
                acc[0] += p.messages_in
                acc[1] += p.messages_out
                acc[2] += p.tps_in
                acc[3] += p.tps_out
                if p.lag is not None:
                    acc[4] = (acc[4] or 0) + p.lag
        points = [ReportPoint(t, *acc) for t, acc in sorted(sums.items())]
        return cls(first.kind, first.name, first.range, first.step_s, points, any(s.truncated for s in series))


__all__ += ["REPORT_RANGES", "REPORT_KINDS", "MAX_REPORT_ROWS", "report_range", "ReportPoint", "ReportSeries"]
