"""The wire contract of sparkmq, defined once: request codes, frame flags, limits.

Every protocol adapter (remoting, HTTP) and every client uses these names; nothing else
defines a request code, a status or a limit.  The frame layout is drawn in
``docs/remoting.md``; error codes and their remoting numbers are in :mod:`.errors`.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import msgspec

from .errors import ErrorCode, SparkMQError

__all__ = [
    "PROTOCOL_VERSION",
    "FRAME_MAGIC",
    "FRAME_PREFIX_SIZE",
    "FLAG_RESPONSE",
    "FLAG_ONEWAY",
    "KNOWN_FLAGS",
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
    "Header",
    "SendRequest",
    "SendResponse",
    "SendBatchRequest",
    "SendBatchResponse",
    "PullRequest",
    "PullResponse",
    "SubscriptionData",
    "ConsumerGroupData",
    "MAX_HELD_QUEUES",
    "held_queue_key",
    "parse_held_queue",
    "GroupMemberData",
    "HeartbeatRequest",
    "HeartbeatResponse",
    "UnregisterRequest",
    "GroupChangedNotice",
    "OffsetResetNotice",
    "QueueOffsetsRequest",
    "QueueOffsetsResponse",
    "QueueRefData",
    "LockRequest",
    "LockResponse",
    "CommitOffsetEntry",
    "CommitOffsetsRequest",
    "CommitOffsetsResponse",
    "QueryOffsetRequest",
    "QueryOffsetResponse",
    "GroupInfoRequest",
    "GroupInfoResponse",
    "SendBackRequest",
    "SendBackResponse",
    "EndTransactionRequest",
    "EndTransactionResponse",
    "TransactionCheckNotice",
    "PostTraceRequest",
    "PostTraceResponse",
]

#: The frame format version (byte 6 of every frame).
PROTOCOL_VERSION = 1
#: Bytes 4..5 of every frame.
FRAME_MAGIC = b"SM"
#: length (4) + magic (2) + version (1) + flags (1) + code (2) + opaque (4) + header_len (4).
FRAME_PREFIX_SIZE = 18

#: Frame flag bits.
FLAG_RESPONSE = 0x01
FLAG_ONEWAY = 0x02
KNOWN_FLAGS = FLAG_RESPONSE | FLAG_ONEWAY

#: The code of a response that succeeded; any other response code is an error's remoting number.
RESPONSE_SUCCESS = 0

#: The largest frame a side accepts (the 4-byte length field's value), unless configured otherwise.
DEFAULT_MAX_FRAME_BYTES = 64 << 20
#: A broker closes a connection that sent nothing for this long.
DEFAULT_IDLE_TIMEOUT_S = 60.0
#: A client with nothing in flight pings this often (well inside the idle timeout).
DEFAULT_HEARTBEAT_INTERVAL_S = 10.0

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


class RequestCode(enum.IntEnum):
    """Every remoting request code (``docs/remoting.md``, "Request codes")."""

    PING = 1
    HEARTBEAT = 2
    UNREGISTER_CLIENT = 3

    SEND_MESSAGE = 10
    SEND_BATCH = 11
    SEND_HALF = 12
    END_TRANSACTION = 13

    PULL_MESSAGE = 20
    QUEUE_OFFSETS = 21

    COMMIT_OFFSETS = 30
    QUERY_OFFSET = 31
    GROUP_OFFSETS = 32
    GROUP_LAG = 33
    RESET_OFFSETS = 34

    GROUP_INFO = 40
    LIST_GROUPS = 41
    LOCK_QUEUES = 45
    UNLOCK_QUEUES = 46

    CREATE_TOPIC = 50
    DELETE_TOPIC = 51
    GET_TOPIC = 52
    LIST_TOPICS = 53
    TOPIC_STATS = 54

    SEND_BACK = 60
    DLQ_MESSAGES = 61
    REDRIVE = 62
    RECALL_TIMER = 63

    VIEW_MESSAGE = 70
    QUERY_MESSAGES = 71
    POST_TRACE = 72
    GET_TRACE = 73

    BROKER_INFO = 80
    HEALTH = 81

    # broker -> client, ONEWAY
    NOTIFY_CONSUMER_IDS_CHANGED = 100
    NOTIFY_OFFSET_RESET = 101
    CHECK_TRANSACTION_STATE = 102


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
        return PullStatus(value)
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


class ExpressionType(enum.StrEnum):
    """The language of a subscription expression."""

    TAG = "TAG"
    SQL92 = "SQL92"



# -- remoting headers ---------------------------------------------------------------------------
# Each request and response header is one of these, msgpack-encoded (docs/remoting.md).  Unknown
# fields are refused (a typo is not an extension) and defaults are left out on the wire.

class Header(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """The base of every remoting header."""


class SendRequest(Header):
    """SEND_MESSAGE / SEND_HALF: one message, its body in the frame body."""

    topic: str
    queue_id: int | None = None
    sharding_key: str | None = None
    producer_group: str | None = None
    tags: str | None = None
    keys: list[str] = []
    properties: dict[str, str] = {}
    msg_id: str | None = None
    flag: int = 0
    compressed: bool = False
    born_timestamp: int | None = None
    delay_level: int | None = None
    deliver_at_ms: int | None = None
    delay_ms: int | None = None


class SendResponse(Header):
    """Where one message was stored (``transaction_id`` for a half message)."""

    status: str
    msg_id: str
    offset_msg_id: str
    topic: str
    broker_name: str
    queue_id: int
    queue_offset: int
    store_timestamp: int = 0
    transaction_id: str | None = None


class SendBatchRequest(Header):
    """SEND_BATCH: ``count`` messages for one queue, packed in the frame body (docs/remoting.md)."""

    topic: str
    count: int
    queue_id: int | None = None
    sharding_key: str | None = None
    producer_group: str | None = None
    compressed: bool = False
    delay_level: int | None = None
    deliver_at_ms: int | None = None
    delay_ms: int | None = None


class SendBatchResponse(Header):
    """Where a batch was stored: consecutive queue offsets from ``first_queue_offset``; the frame
    body holds each message's commit-log offset (int64 little-endian, ``count`` of them)."""

    status: str
    topic: str
    broker_name: str
    queue_id: int
    first_queue_offset: int
    count: int
    store_timestamp: int
    #: The store host ("ip:port") that, with a commit-log offset, makes an offsetMsgId.
    store_host: str
    #: Each message's queue offset when they are not consecutive (a delayed batch parks each message).
    queue_offsets: list[int] | None = None


class PullRequest(Header):
    """PULL_MESSAGE: read from a queue, holding up to ``wait_ms`` when nothing is new."""

    topic: str
    queue_id: int
    offset: int
    max_count: int = 32
    group: str | None = None
    client_id: str | None = None
    tags: str | None = None
    filter_type: str = "TAG"
    expression: str | None = None
    wait_ms: int = 0
    commit_offset: int | None = None


class PullResponse(Header):
    """A pull's answer; the frame body holds ``count`` stored records back to back."""

    status: str
    next_offset: int
    min_offset: int
    max_offset: int
    count: int = 0


class SubscriptionData(Header):
    """One topic a consumer subscribes to, with its filter."""

    topic: str
    expression: str = "*"
    type: str = "TAG"


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


class ConsumerGroupData(Header):
    """What one client says about one consumer group."""

    group: str
    consume_type: str = "PUSH"
    message_model: str = "CLUSTERING"
    consume_from_where: str = "CONSUME_FROM_LAST_OFFSET"
    subscriptions: list[SubscriptionData] = []
    #: The queues this member holds after its last rebalance (:func:`held_queue_key`), so operators see who
    #: reads what: queues are allocated on the clients, the broker only learns it from here.
    held_queues: list[str] = []


class HeartbeatRequest(Header):
    """HEARTBEAT: a client's groups; binds the client id to this connection for pushed notices."""

    client_id: str
    producer_groups: list[str] = []
    consumers: list[ConsumerGroupData] = []


class HeartbeatResponse(Header):
    """Each consumer group's membership version."""

    versions: dict[str, int] = {}


class UnregisterRequest(Header):
    """UNREGISTER_CLIENT: a client leaves groups (it is shutting down)."""

    client_id: str
    producer_groups: list[str] = []
    consumer_groups: list[str] = []


class GroupChangedNotice(Header):
    """NOTIFY_CONSUMER_IDS_CHANGED: a group's members changed; rebalance."""

    group: str
    version: int


class OffsetResetNotice(Header):
    """NOTIFY_OFFSET_RESET: an admin moved a group's offsets of a topic on ``broker_name`` ({queue id: offset})."""

    group: str
    topic: str
    broker_name: str
    offsets: dict[int, int]


class QueueOffsetsRequest(Header):
    """QUEUE_OFFSETS: a queue's bounds, and the first offset stored at or after ``timestamp``."""

    topic: str
    queue_id: int
    timestamp: int | None = None


class QueueOffsetsResponse(Header):
    """A queue's min and max offsets (``offset``: the answer for a timestamp)."""

    min_offset: int
    max_offset: int
    offset: int | None = None


class QueueRefData(Header):
    """One queue of a topic on this broker."""

    topic: str
    queue_id: int


class LockRequest(Header):
    """LOCK_QUEUES / UNLOCK_QUEUES: orderly consumption's broker-side queue locks."""

    group: str
    client_id: str
    queues: list[QueueRefData] = []


class LockResponse(Header):
    """The queues the client holds now (LOCK) or released (UNLOCK)."""

    queues: list[QueueRefData] = []


class CommitOffsetEntry(Header):
    """One committed offset."""

    topic: str
    queue_id: int
    offset: int


class CommitOffsetsRequest(Header):
    """COMMIT_OFFSETS: a group's progress, all or nothing."""

    group: str
    offsets: list[CommitOffsetEntry] = []


class CommitOffsetsResponse(Header):
    """How many entries were applied (a queue whose offset reset waits for the consumer is skipped)."""

    committed: int


class QueryOffsetRequest(Header):
    """QUERY_OFFSET: a group's committed offset of one queue."""

    group: str
    topic: str
    queue_id: int


class QueryOffsetResponse(Header):
    """The committed offset, -1 when none."""

    offset: int


class GroupInfoRequest(Header):
    """GROUP_INFO: a consumer group's members."""

    group: str


class GroupMemberData(Header):
    """One member of a consumer group as the broker knows it from its last heartbeat."""

    client_id: str
    #: PUSH / PULL (the client pulls and rebalances: it holds queues) or POP (the broker hands messages out:
    #: a POP or gRPC member holds no queue).
    consume_type: str | None = None
    message_model: str | None = None
    #: :func:`held_queue_key` of each queue of this broker the member holds, sorted.
    held_queues: list[str] = []


class GroupInfoResponse(Header):
    """A group's membership version, sorted member ids and model (the rest as ``GET /consumers/{group}``)."""

    group: str
    version: int
    members: list[str] = []
    message_model: str | None = None
    consume_type: str | None = None
    consume_from_where: str | None = None
    subscriptions: list[SubscriptionData] = []
    #: Each member with its protocol and the queues it holds here, by client id.
    clients: list[GroupMemberData] = []


class SendBackRequest(Header):
    """SEND_BACK: a message the group failed to consume goes to its retry topic, or the DLQ."""

    group: str
    offset_msg_id: str
    delay_level: int = 0
    reason: str = ""
    max_reconsume_times: int = 16


class SendBackResponse(Header):
    """Where the message went."""

    status: str
    topic: str
    delay_level: int
    reconsume_times: int
    msg_id: str
    offset_msg_id: str


class EndTransactionRequest(Header):
    """END_TRANSACTION: COMMIT, ROLLBACK or UNKNOWN a half message."""

    transaction_id: str
    producer_group: str
    action: str
    from_check: bool = False


class EndTransactionResponse(Header):
    """The settled transaction; ``send_result`` when a commit made the message visible."""

    transaction_id: str
    action: str
    send_result: SendResponse | None = None


class TransactionCheckNotice(Header):
    """CHECK_TRANSACTION_STATE: the broker asks a live producer of the group how a transaction ended."""

    producer_group: str
    transaction_id: str
    topic: str
    msg_id: str
    offset_msg_id: str
    check_times: int
    body: bytes = b""
    properties: dict[str, str] = {}


class PostTraceRequest(Header):
    """POST_TRACE: a client's trace events (``send``, ``consume``), each a map as in ``GET /trace``."""

    events: list[dict[str, str | int | float | bool | None]] = []


class PostTraceResponse(Header):
    """How many events were taken (0 when tracing is off on the broker)."""

    accepted: int
    dropped: int = 0
    enabled: bool = True


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
