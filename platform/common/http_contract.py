"""The HTTP contract of the broker, the name server and the gateway, defined once: request bodies and the
constrained values of bodies, paths and queries.

Each body is a msgspec ``Struct`` (unknown fields refused) whose fields carry their limits as msgspec ``Meta``
constraints: pattern, length, range, a description, and in ``extra["error"]`` the :class:`ErrorCode` a value
beyond the limit is answered with (TOPIC_ILLEGAL, QUEUE_ID_ILLEGAL, OFFSET_ILLEGAL, ...: what the logic behind
the endpoint answers; INVALID_ARGUMENT when none is named).  ``msgspec.json.schema`` states them; the HTTP apps
derive the request models FastAPI validates and documents from these definitions (``api/params.py``), so the
OpenAPI document states exactly these limits.

Values a remoting header carries too (a topic, a group, a queue id) are typed in
:mod:`~sparkmq.platform.common.validation` and named by both the header (:mod:`.protocol`) and the body.  The
numbers are the limits the logic enforces (:mod:`.validation`, :mod:`.protocol`, :mod:`.perm`): this module only
publishes them.
"""
from __future__ import annotations

import re
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from .errors import ErrorCode
from .filtering import FILTER_TYPES
from .perm import PERM_MAX
from .protocol import (
    MAX_BULK_PULL_BATCH,
    MAX_LONG_POLL_MS,
    MAX_MSG_ID_LENGTH,
    MAX_PULL_BATCH,
    TRANSACTION_TYPES,
    ConsumeFromWhere,
    ConsumeType,
    ExpressionType,
    MessageModel,
)
from .validation import (
    ACCESS_KEY_PATTERN,
    ADDR_PATTERN,
    MAX_CLIENT_ID_LENGTH,
    MAX_QUERY_HITS,
    MAX_QUEUE_NUMS,
    MAX_RECONSUME_TIMES,
    MAX_ROUTE_QUEUE_NUMS,
    SECRET_KEY_PATTERN,
    Addr,
    GroupName,
    Int32,
    NodeName,
    QueueId,
    TopicName,
)

__all__ = [
    "MAX_JSON_INT",
    "MAX_INT31",
    "any_case",
    "TopicName",
    "GroupName",
    "QueueId",
    "ClientId",
    "ClusterName",
    "BrokerName",
    "HostPort",
    "OptionalHostPort",
    "QueueCount",
    "NamesrvQueueCount",
    "Offset",
    "EpochMs",
    "NonNegative",
    "SysFlag",
    "WaitMs",
    "PullMax",
    "DlqMax",
    "QueryMax",
    "AlertLimit",
    "DelayMs",
    "DelayLevel",
    "SendBackDelayLevel",
    "MaxReconsumeTimes",
    "NonEmpty",
    "MsgId",
    "Perm",
    "FilterType",
    "TransactionAction",
    "QueueIdKey",
    "Body",
    "BatchMessageBody",
    "SendMessageBody",
    "SendBackBody",
    "RedriveBody",
    "ResendBody",
    "EndTransactionBody",
    "ResetOffsetsBody",
    "BatchSendBody",
    "SubscriptionBody",
    "ConsumerBody",
    "HeartbeatBody",
    "UnregisterClientBody",
    "TopicBody",
    "OffsetEntry",
    "CommitOffsetsBody",
    "QueueBody",
    "LockBody",
    "TransferLeadershipBody",
    "TraceBody",
    "TopicConfigBody",
    "RegisterBrokerRequest",
    "UnregisterBrokerRequest",
    "BROKER_BODIES",
    "NAMESRV_BODIES",
    "GATEWAY_BODIES",
    "ACL_BODIES",
    "AccessKey",
    "SecretKey",
    "AclDecision",
    "UserBody",
    "PolicyEntryBody",
    "PolicyBody",
]

#: The largest integer every JSON reader holds exactly (an IEEE double's 2**53 - 1, JavaScript's
#: Number.MAX_SAFE_INTEGER): the bound declared for offsets, times and versions over HTTP (the logic's own is
#: 2**63 - 1; larger numbers would reach a client rounded, and a schema maximum above it is not exact either).
MAX_JSON_INT = 2**53 - 1
#: A Java int's largest value.
MAX_INT31 = 2**31 - 1


def any_case(*words: str) -> str:
    """A JSON-Schema-compatible pattern (no inline flags) matching exactly one of ``words`` in any letter case."""
    def letters(word: str) -> str:
        return "".join(f"[{c.upper()}{c.lower()}]" if c.isalpha() else re.escape(c) for c in word)
    return "^(?:" + "|".join(letters(w) for w in words) + ")$"


def _coded(code: ErrorCode) -> dict[str, Any]:
    return {"error": code}


# -- values -----------------------------------------------------------------------------------------------
# TopicName, GroupName and QueueId come from validation (remoting headers name them too).

#: A client id over HTTP: visible ASCII (the ids clients make: ``ip@pid#...``), no spaces.
ClientId = Annotated[str, Meta(min_length=1, max_length=MAX_CLIENT_ID_LENGTH, pattern="^[!-~]+$",
                               description=f"1..{MAX_CLIENT_ID_LENGTH} visible ASCII characters, no spaces")]
#: A cluster name (as the route table checks it).
ClusterName = NodeName
#: A broker name (as the route table checks it).
BrokerName = NodeName
#: ``host:port`` (as the route table checks it).
HostPort = Addr
#: An address a broker may not have: ``host:port``, or "" or null for none.
OptionalHostPort = Annotated[str, Meta(pattern=f"^(?:{ADDR_PATTERN[1:-1]})?$", max_length=300,
                                       description="'host:port' with a port in 1..65535, or '' for none")] | None
QueueCount = Annotated[int, Meta(ge=1, le=MAX_QUEUE_NUMS, description=f"a queue count, 1..{MAX_QUEUE_NUMS}")]
#: Queue counts as brokers announce them to a name server (0 allowed: a topic being retired).
NamesrvQueueCount = Annotated[int, Meta(ge=0, le=MAX_ROUTE_QUEUE_NUMS,
                                        description=f"a queue count, 0..{MAX_ROUTE_QUEUE_NUMS}")]
Offset = Annotated[int, Meta(ge=0, le=MAX_JSON_INT, description="a queue offset (>= 0)",
                             extra=_coded(ErrorCode.OFFSET_ILLEGAL))]
EpochMs = Annotated[int, Meta(ge=0, le=MAX_JSON_INT, description="epoch milliseconds")]
NonNegative = Annotated[int, Meta(ge=0, le=MAX_JSON_INT, description=f"an integer in 0..{MAX_JSON_INT}")]
#: A topic's system flag bits (a 32-bit signed field, non-negative).
SysFlag = Int32
WaitMs = Annotated[int, Meta(ge=0, le=MAX_LONG_POLL_MS,
                             description=f"long-poll hold in ms, 0..{MAX_LONG_POLL_MS} (MAX_LONG_POLL_MS)")]
PullMax = Annotated[int, Meta(ge=1, le=MAX_BULK_PULL_BATCH,
                              description=f"1..{MAX_PULL_BATCH}; up to {MAX_BULK_PULL_BATCH} for an unfiltered "
                                          f"Arrow pull without a group")]
DlqMax = Annotated[int, Meta(ge=1, le=MAX_PULL_BATCH, description=f"1..{MAX_PULL_BATCH}")]
QueryMax = Annotated[int, Meta(ge=1, le=MAX_QUERY_HITS, description=f"1..{MAX_QUERY_HITS}")]
#: How many alerts one answer lists.
AlertLimit = Annotated[int, Meta(ge=1, le=10_000, description="1..10000")]
#: A timer message's delay (the send processor's bound; the broker's timer_max_delay_s applies as well).
DelayMs = Annotated[int, Meta(ge=0, le=MAX_JSON_INT, description="deliver after this many ms (<= timer_max_delay_s)")]
#: A delay level: 0 = none, 1..the broker's level count (message_delay_level).
DelayLevel = Annotated[int, Meta(ge=0, le=MAX_INT31, description="0 = none, 1..levels of message_delay_level")]
#: A send-back's delay level (the send processor's bound).
SendBackDelayLevel = Annotated[int, Meta(ge=-1, le=MAX_INT31,
                                         description="0 = level 3 + reconsume count, > 0 = that level, -1 = DLQ now")]
MaxReconsumeTimes = Annotated[int, Meta(ge=0, le=MAX_RECONSUME_TIMES, description=f"0..{MAX_RECONSUME_TIMES}")]
NonEmpty = Annotated[str, Meta(min_length=1, description="not empty")]
MsgId = Annotated[str, Meta(min_length=1, max_length=MAX_MSG_ID_LENGTH,
                            description=f"1..{MAX_MSG_ID_LENGTH} characters")]
Perm = Annotated[int, Meta(ge=0, le=PERM_MAX, description=f"READ=4 | WRITE=2 | INHERIT=1 (0..{PERM_MAX})")]
# Enumerations, case-insensitive as the logic reads them.
FilterType = Annotated[str, Meta(pattern=any_case(*FILTER_TYPES), description=f"{' or '.join(FILTER_TYPES)} (any case)",
                                 extra=_coded(ErrorCode.FILTER_EXPRESSION_ILLEGAL))]
TransactionAction = Annotated[str, Meta(pattern=any_case(*TRANSACTION_TYPES),
                                        description=f"{', '.join(TRANSACTION_TYPES)} (any case)")]
#: An ACL user's access key.
AccessKey = Annotated[str, Meta(pattern=ACCESS_KEY_PATTERN, description="1..64 characters of [A-Za-z0-9_.@-]")]
#: An ACL user's secret key.
SecretKey = Annotated[str, Meta(pattern=SECRET_KEY_PATTERN,
                                description="6..128 printable characters, no spaces; never shown again")]
AclDecision = Annotated[str, Meta(pattern=any_case("Allow", "Deny"), description="Allow or Deny (any case)")]
#: A queue id as the key of a JSON object.
QueueIdKey = Annotated[str, Meta(pattern="^[0-9]{1,4}$", description="a queue id",
                                 extra=_coded(ErrorCode.QUEUE_ID_ILLEGAL))]


# -- bodies -------------------------------------------------------------------------------------------------
# Strict: a JSON "5" is not a queue id, and unknown fields are typos, not extensions.

class Body(msgspec.Struct, forbid_unknown_fields=True):
    """The base of every HTTP request body."""


class BatchMessageBody(Body):
    """One message of a JSON batch send."""

    # Not empty: stated here, checked by the send processor (MESSAGE_ILLEGAL naming the message of a batch).
    body: Annotated[str, Meta(description="the body as text in body_encoding (not empty)",
                              extra_json_schema={"minLength": 1})]
    body_encoding: Literal["utf8", "base64"] = "utf8"
    tags: str | None = None
    keys: list[str] | None = None
    properties: dict[str, str] | None = None
    msg_id: Annotated[MsgId | None, Meta(description="the producer's unique id (UNIQ_KEY); null = made here")] = None


class SendMessageBody(BatchMessageBody):
    """``POST /topics/{topic}/messages``: one message and how to route it (and, optionally, when)."""

    queue_id: Annotated[QueueId | None, Meta(description="a write queue; null = hash of sharding_key or "
                                                         "round-robin")] = None
    sharding_key: NonEmpty | None = None
    compressed: Annotated[bool, Meta(description="the body is zlib-compressed by the producer")] = False
    producer_group: GroupName | None = None
    born_timestamp: Annotated[EpochMs | None, Meta(description="epoch ms; null = now")] = None
    born_host: Annotated[str | None, Meta(description="ip:port; null = the HTTP peer")] = None
    delay_level: Annotated[DelayLevel | None, Meta(description="1..levels: park until the level's delay passed")
                           ] = None
    deliver_at_ms: Annotated[EpochMs | None, Meta(description="timer message: deliver at this epoch ms")] = None
    delay_ms: Annotated[DelayMs | None, Meta(description="timer message: deliver after this many ms")] = None


class SendBackBody(Body):
    """``POST /consumers/{group}/send-back``: a message the group failed to consume."""

    offset_msg_id: str
    delay_level: SendBackDelayLevel = 0
    reason: str = ""
    max_reconsume_times: MaxReconsumeTimes = 16


class RedriveBody(Body):
    """``POST /dlq/{group}/redrive``: DLQ messages to send back to their original topics."""

    msg_ids: list[str] = []
    all: bool = False
    topic: TopicName | None = None
    tags: str | None = None


class ResendBody(Body):
    """``POST /consumers/{group}/resend``: the message to consume again."""

    msg_id: Annotated[str, Meta(description="an offsetMsgId of this broker, or a msgId (UNIQ_KEY) in its lake's "
                                            "index")]


class EndTransactionBody(Body):
    """``POST /transactions/{transaction_id}``."""

    producer_group: GroupName
    action: TransactionAction
    from_check: bool = False


class ResetOffsetsBody(Body):
    """``POST /consumers/{group}/offsets/reset``: by ``timestamp`` or to exact ``offsets`` ({queue id: offset})."""

    topic: TopicName
    timestamp: EpochMs | None = None
    offsets: dict[QueueIdKey, Offset] | None = None


class BatchSendBody(Body):
    """``POST /topics/{topic}/batch`` as JSON."""

    messages: Annotated[list[BatchMessageBody], Meta(min_length=1, description="not empty",
                                                     extra=_coded(ErrorCode.MESSAGE_ILLEGAL))]


class SubscriptionBody(Body):
    """One subscription of a consumer."""

    topic: TopicName
    expression: str = "*"
    type: ExpressionType = ExpressionType.TAG


class ConsumerBody(Body):
    """One consumer group of a heartbeat."""

    group: GroupName
    consume_type: ConsumeType = ConsumeType.PUSH
    message_model: MessageModel = MessageModel.CLUSTERING
    consume_from_where: ConsumeFromWhere = ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET
    subscriptions: list[SubscriptionBody] = []
    held_queues: Annotated[list[str], Meta(description="the queues the member holds, each 'topic@broker/queue_id'")
                           ] = []


class HeartbeatBody(Body):
    """``POST /clients/heartbeat``."""

    client_id: ClientId
    producer_groups: list[GroupName] = []
    consumers: list[ConsumerBody] = []


class UnregisterClientBody(Body):
    """``POST /clients/unregister``."""

    client_id: ClientId
    producer_groups: list[GroupName] = []
    consumer_groups: list[GroupName] = []


class TopicBody(Body):
    """``POST /topics``: create or update a topic."""

    topic: TopicName
    read_queue_nums: QueueCount = 16
    write_queue_nums: QueueCount = 16
    perm: Annotated[Perm, Meta(description="READ=4 | WRITE=2 | INHERIT=1 (6 = read+write)")] = 6
    order: bool = False
    topic_sys_flag: SysFlag = 0


class OffsetEntry(Body):
    """One committed offset."""

    topic: TopicName
    queue_id: QueueId
    offset: Offset


class CommitOffsetsBody(Body):
    """``POST /consumers/{group}/offsets``."""

    offsets: list[OffsetEntry]


class QueueBody(Body):
    """One (topic, queue)."""

    topic: TopicName
    queue_id: QueueId


class LockBody(Body):
    """``POST /locks/lock`` and ``/locks/unlock``."""

    group: GroupName
    client_id: ClientId
    queues: list[QueueBody]


class TransferLeadershipBody(Body):
    """``POST /broker/dledger/transfer``."""

    to: Annotated[str, Meta(description="the member id (of dledger_peers) to hand the leadership to")]


class TraceBody(Body):
    """``POST /trace``: events as ``TraceEvent`` objects (checked by the broker, field by field)."""

    events: Annotated[list[dict[str, Any]], Meta(description="TraceEvent objects: msg_id, topic, event_type, "
                                                             "status, event_ts (epoch ms) and the optional fields")]


class TopicConfigBody(Body):
    """One topic's config as a broker announces it."""

    read_queue_nums: NamesrvQueueCount
    write_queue_nums: NamesrvQueueCount
    perm: Annotated[Perm, Meta(description="READ=4 | WRITE=2 | INHERIT=1 (6 = read+write)")]
    topic_sys_flag: SysFlag = 0


class RegisterBrokerRequest(Body):
    """A broker's periodic registration (its heartbeat to a name server)."""

    cluster: ClusterName
    broker_name: BrokerName
    broker_id: Annotated[NonNegative, Meta(description="0 = master, > 0 = slave")]
    broker_addr: Annotated[HostPort, Meta(description="host:port clients connect to")]
    data_version: Annotated[NonNegative, Meta(description="bumped by the broker whenever its topic configs change")]
    ha_addr: Annotated[OptionalHostPort, Meta(description="host:port slaves replicate from")] = None
    remoting_addr: Annotated[OptionalHostPort, Meta(description="host:port of the broker's binary remoting "
                                                                "endpoint")] = None
    grpc_addr: Annotated[OptionalHostPort, Meta(description="host:port of the broker's RocketMQ 5 gRPC endpoint")
                         ] = None
    topic_configs: dict[TopicName, TopicConfigBody] = {}
    epoch: Annotated[NonNegative, Meta(description="a DLedger member's term: an older epoch cannot displace a "
                                                   "master")] = 0


class UnregisterBrokerRequest(Body):
    """A broker leaving on shutdown."""

    cluster: ClusterName
    broker_name: BrokerName
    broker_id: NonNegative
    broker_addr: HostPort


class UserBody(Body):
    """``POST /acl/users``: create a user (``update`` = replace the secret and flag of an existing one)."""

    access_key: AccessKey
    secret_key: SecretKey
    super_user: bool = False
    update: bool = False


class PolicyEntryBody(Body):
    """One entry of an ACL policy."""

    resource: Annotated[str, Meta(min_length=1, max_length=300,
                                  description="'*', 'Cluster', 'Topic:<name>' or 'Group:<name>'; a final '*' = "
                                              "prefix")]
    actions: Annotated[list[str], Meta(min_length=1, description="Pub, Sub, Create, Update, Delete, Get, List, "
                                                                 "All, Admin")]
    decision: AclDecision = "Allow"
    source_ips: Annotated[list[str], Meta(description="CIDRs the entry applies from; [] = any")] = []


class PolicyBody(Body):
    """``POST /acl/policies``: add entries to a user's policy (an entry for a named resource replaces it)."""

    subject: Annotated[AccessKey, Meta(description="the user's access key")]
    entries: Annotated[list[PolicyEntryBody], Meta(min_length=1)]


#: The request bodies of each app (``POST /topics/{topic}/batch`` reads :class:`BatchSendBody` itself).
BROKER_BODIES: tuple[type[Body], ...] = (
    SendMessageBody, BatchSendBody, SendBackBody, RedriveBody, ResendBody, EndTransactionBody, ResetOffsetsBody,
    HeartbeatBody, UnregisterClientBody, TopicBody, CommitOffsetsBody, LockBody, TransferLeadershipBody, TraceBody)
NAMESRV_BODIES: tuple[type[Body], ...] = (RegisterBrokerRequest, UnregisterBrokerRequest)
GATEWAY_BODIES: tuple[type[Body], ...] = (SendMessageBody, BatchSendBody)
#: The ACL API's request bodies (on every app that serves ``/acl``: a broker always, the others with ACL on).
ACL_BODIES: tuple[type[Body], ...] = (UserBody, PolicyBody)
