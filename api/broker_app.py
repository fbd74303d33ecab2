"""The broker's HTTP API (``docs/http-api.md``): sends, pulls, topics, clients, offsets, locks, and the
message features of issue 4 (SQL92 pulls, delay/timer sends and recall, send-back and DLQ, transactions,
offset reset).

Build it with :func:`create_app` over a started :class:`~sparkmq.platform.broker.Broker`;
``sparkmq.api.broker_main`` serves it with uvicorn.  This app *is* the embedded
gateway: the standalone gateway serves the same send endpoints with the same request
bodies (``platform/common/http_contract.py``).

JSON everywhere, Arrow IPC (``application/vnd.apache.arrow.stream``) for batch sends
(request ``Content-Type``) and pulls (``Accept``); encodings come from
:mod:`sparkmq.platform.common.wire`.  Every error is ``{"code", "message"}`` with the
code's HTTP status (:mod:`sparkmq.api.errors`).

Threads: a send that waits for a disk sync (SYNC_FLUSH) or a large batch runs in the
threadpool, a plain send runs on the event loop (an mmap append takes microseconds);
pull reads run in the threadpool while a held pull costs no thread; admin calls that
fsync (topic changes) are plain ``def`` endpoints.
"""
from __future__ import annotations

import functools
import ipaddress
import logging
from collections.abc import Callable
from typing import Annotated, Any, Literal, TypeVar

import msgspec
from fastapi import APIRouter, Depends, FastAPI, Path, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response

from .. import __version__
from ..platform.broker.broker import Broker
from ..platform.broker.client_manager import (
    ConsumerData,
    Subscription,
)
from ..platform.broker.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from ..platform.broker.processors import OutgoingMessage
from ..platform.common import wire
from ..platform.common.errors import ErrorCode, SparkMQError
from ..platform.common.http_contract import (
    BatchMessageBody,
    BatchSendBody,
    CommitOffsetsBody,
    EndTransactionBody,
    HeartbeatBody,
    LockBody,
    RedriveBody,
    ResendBody,
    ResetOffsetsBody,
    SendBackBody,
    SendMessageBody,
    TopicBody,
    TransferLeadershipBody,
    UnregisterClientBody,
)
from ..platform.common.protocol import REPORT_RANGES, PullResult
from ..platform.ha.dledger import DLedgerMember, LeadershipTransferError
from ..platform.store.disk import measure_disk
from .acl import acl_router, broker_guard, http_access
from .console.docs import install_docs
from .errors import install_error_handlers
from .params import (
    AlertLimit,
    ClientId,
    DelayLevel,
    DelayMs,
    DlqMax,
    EpochMs,
    FilterType,
    GroupName,
    MsgId,
    NonEmpty,
    NonNegative,
    Offset,
    PullMax,
    QueryMax,
    QueueId,
    TopicName,
    WaitMs,
    decode_body,
    install_bodies,
    json_body,
)
from .trace_routes import trace_router

__all__ = [
    "create_app",
    "SendMessageBody",
    "BatchMessageBody",
    "BatchSendBody",
    "BATCH_SEND_OPENAPI",
    "HeartbeatBody",
    "UnregisterClientBody",
    "TopicBody",
    "CommitOffsetsBody",
    "LockBody",
    "TransferLeadershipBody",
    "outgoing_from_json",
    "outgoing_from_arrow",
]

log = logging.getLogger("sparkmq.broker")

#: A batch larger than this is decoded and stored in the threadpool, not on the event loop.
_INLINE_BATCH_BYTES = 256 * 1024

T = TypeVar("T")
S = TypeVar("S", bound=msgspec.Struct)


# -- request bodies ---------------------------------------------------------------------
# Defined once, with their limits, in platform/common/http_contract.py; decoded by msgspec (api/params.py), so a
# value beyond a limit answers the code the Broker gives it (TOPIC_ILLEGAL, ...), and documented from the same
# definitions.

def _json(kind: type[S]) -> Any:
    return Depends(json_body(kind))


#: The bodies as endpoint parameters.
SendBody = Annotated[SendMessageBody, _json(SendMessageBody)]
SendBackIn = Annotated[SendBackBody, _json(SendBackBody)]
RedriveIn = Annotated[RedriveBody, _json(RedriveBody)]
ResendIn = Annotated[ResendBody, _json(ResendBody)]
EndTransactionIn = Annotated[EndTransactionBody, _json(EndTransactionBody)]
ResetOffsetsIn = Annotated[ResetOffsetsBody, _json(ResetOffsetsBody)]
HeartbeatIn = Annotated[HeartbeatBody, _json(HeartbeatBody)]
UnregisterClientIn = Annotated[UnregisterClientBody, _json(UnregisterClientBody)]
TopicIn = Annotated[TopicBody, _json(TopicBody)]
CommitOffsetsIn = Annotated[CommitOffsetsBody, _json(CommitOffsetsBody)]
LockIn = Annotated[LockBody, _json(LockBody)]
TransferLeadershipIn = Annotated[TransferLeadershipBody, _json(TransferLeadershipBody)]


# -- conversions ------------------------------------------------------------------------

def outgoing_from_json(item: BatchMessageBody) -> OutgoingMessage:
    """The broker's message for a JSON message (body decoded; MESSAGE_ILLEGAL for bad base64)."""
    return OutgoingMessage(wire.decode_body(item.body, item.body_encoding), item.tags, tuple(item.keys or ()),
                           dict(item.properties or {}), item.msg_id)


def outgoing_from_arrow(raw: bytes) -> list[OutgoingMessage]:
    """The broker's messages for an Arrow IPC batch of ``SEND_SCHEMA`` (MESSAGE_ILLEGAL when malformed)."""
    rows = wire.send_rows_from_arrow(wire.from_ipc(raw))
    return [OutgoingMessage(r.body, r.tags, r.keys, r.properties) for r in rows]


def _peer(request: Request) -> str | None:
    """``ip:port`` of the HTTP peer (the born host of messages that name none), if it is an IP."""
    client = request.client
    if client is None:
        return None
    try:
        ip = ipaddress.ip_address(client.host)
    except ValueError:
        return None
    return f"[{ip}]:{client.port}" if ip.version == 6 else f"{ip}:{client.port}"


def _wants_arrow(request: Request) -> bool:
    return wire.ARROW_STREAM in request.headers.get("accept", "")


def _pull_json(result: PullResult, broker_name: str) -> dict[str, Any]:
    return {"status": str(result.status), "next_offset": result.next_offset, "min_offset": result.min_offset,
            "max_offset": result.max_offset,
            "messages": [wire.stored_to_json(m, broker_name) for m in result.messages]}


def _pull_arrow(result: PullResult, broker_name: str) -> Response:
    headers = {wire.PULL_HEADERS["status"]: str(result.status),
               wire.PULL_HEADERS["next_offset"]: str(result.next_offset),
               wire.PULL_HEADERS["min_offset"]: str(result.min_offset),
               wire.PULL_HEADERS["max_offset"]: str(result.max_offset)}
    body = wire.to_ipc(wire.stored_to_arrow(result.messages, broker_name))
    return Response(body, media_type=wire.ARROW_STREAM, headers=headers)


async def _maybe_threaded(inline: bool, fn: Callable[[], T]) -> T:
    return fn() if inline else await run_in_threadpool(fn)


# -- dependencies -----------------------------------------------------------------------

def _broker(request: Request) -> Broker:
    return request.app.state.broker


BrokerDep = Annotated[Broker, Depends(_broker)]


def _dledger(broker: BrokerDep) -> DLedgerMember:
    if broker.dledger is None:
        raise SparkMQError(ErrorCode.DLEDGER_NOT_ENABLED, f"broker {broker.name} at {broker.addr} is not a member "
                                                          f"of a DLedger group (dledger_enabled is off)")
    return broker.dledger


DLedgerDep = Annotated[DLedgerMember, Depends(_dledger)]
TopicPath = Annotated[TopicName, Path(description="topic name (percent-encode % and |)")]
GroupPath = Annotated[GroupName, Path(description="consumer group name (percent-encode % and |)")]
QueuePath = Annotated[QueueId, Path(description="a queue of the topic (0-based)")]

#: The request body of ``POST /topics/{topic}/batch`` (the broker's and the gateway's), for the OpenAPI schema.
BATCH_SEND_OPENAPI = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/BatchSendBody"}},
            wire.ARROW_STREAM: {"schema": {"type": "string", "format": "binary",
                                           "description": "Arrow IPC stream of SEND_SCHEMA "
                                                          "(body binary, tags, keys, properties map)"}},
        },
    },
}


# -- routers ----------------------------------------------------------------------------

send_router = APIRouter(tags=["send"])
pull_router = APIRouter(tags=["pull"])
topics_router = APIRouter(tags=["topics"])
clients_router = APIRouter(tags=["clients"])
offsets_router = APIRouter(tags=["offsets"])
locks_router = APIRouter(prefix="/locks", tags=["locks"])
broker_router = APIRouter(tags=["broker"])


@send_router.post("/topics/{topic}/messages")
async def send_message(topic: TopicPath, body: SendBody, request: Request, broker: BrokerDep) -> JSONResponse:
    """Store one message (the topic is auto-created when allowed); answers where it was stored."""
    message = outgoing_from_json(body)
    born_host = body.born_host if body.born_host is not None else _peer(request)

    def send() -> dict[str, Any]:
        return broker.send_processor.send(topic, message, queue_id=body.queue_id, sharding_key=body.sharding_key,
                           compressed=body.compressed, producer_group=body.producer_group,
                           born_timestamp=body.born_timestamp, born_host=born_host, delay_level=body.delay_level,
                           deliver_at_ms=body.deliver_at_ms, delay_ms=body.delay_ms).to_dict()

    return JSONResponse(await _maybe_threaded(not broker.send_processor.send_may_block, send))


@send_router.post("/topics/{topic}/half", tags=["transactions"])
async def send_half(topic: TopicPath, body: SendBody, request: Request, broker: BrokerDep) -> JSONResponse:
    """Store a transaction's half message (invisible until committed); ``producer_group`` is required."""
    message = outgoing_from_json(body)
    born_host = body.born_host if body.born_host is not None else _peer(request)
    if body.compressed or body.delay_level is not None or body.deliver_at_ms is not None or body.delay_ms is not None:
        raise SparkMQError(ErrorCode.INVALID_ARGUMENT, "a half message cannot be compressed or delayed")

    def send() -> dict[str, Any]:
        return broker.transaction_processor.send_half(topic, message, body.producer_group, queue_id=body.queue_id,  # type: ignore[arg-type]
                                sharding_key=body.sharding_key, born_timestamp=body.born_timestamp,
                                born_host=born_host)

    return JSONResponse(await _maybe_threaded(not broker.send_processor.send_may_block, send))


@send_router.post("/topics/{topic}/batch", openapi_extra=BATCH_SEND_OPENAPI)
async def send_batch(topic: TopicPath, request: Request, broker: BrokerDep,
                     queue_id: Annotated[QueueId | None, Query(description="a write queue; else hash/round-robin")
                                         ] = None,
                     sharding_key: NonEmpty | None = None, producer_group: GroupName | None = None,
                     compressed: bool = False, delay_level: DelayLevel | None = None,
                     deliver_at_ms: EpochMs | None = None, delay_ms: DelayMs | None = None) -> JSONResponse:
    """Store many messages in one queue (consecutive offsets), JSON or Arrow; one bad message rejects all."""
    limit = broker.config.max_request_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise SparkMQError(ErrorCode.MESSAGE_TOO_LARGE, f"the request is {declared} bytes, the limit is {limit}")
    raw = await request.body()
    if len(raw) > limit:
        raise SparkMQError(ErrorCode.MESSAGE_TOO_LARGE, f"the request is {len(raw)} bytes, the limit is {limit}")
    arrow = request.headers.get("content-type", "").split(";")[0].strip() == wire.ARROW_STREAM
    born_host = _peer(request)

    def send() -> dict[str, Any]:
        if arrow:
            messages = outgoing_from_arrow(raw)
        else:
            messages = [outgoing_from_json(m) for m in decode_body(BatchSendBody, raw).messages]
        return broker.send_processor.send_batch(topic, messages, queue_id=queue_id, sharding_key=sharding_key,
                                 compressed=compressed, producer_group=producer_group,
                                 born_host=born_host, delay_level=delay_level, deliver_at_ms=deliver_at_ms,
                                 delay_ms=delay_ms).to_dict()

    inline = not broker.send_processor.send_may_block and len(raw) <= _INLINE_BATCH_BYTES
    return JSONResponse(await _maybe_threaded(inline, send))


@pull_router.get("/topics/{topic}/queues/{queue_id}/messages",
                 responses={200: {"content": {wire.ARROW_STREAM: {}},
                                  "description": "JSON, or Arrow (PULL_SCHEMA) with X-Pull-* headers"}})
async def pull_messages(topic: TopicPath, queue_id: QueuePath, request: Request, broker: BrokerDep,
                        offset: Offset = 0,
                        max_count: Annotated[PullMax, Query(alias="max")] = 32,
                        tags: Annotated[str | None, Query(description="'*' or 'A || B'")] = None,
                        wait_ms: Annotated[WaitMs, Query(description="long polling: held up to this, capped by "
                                                                    "the broker's long_polling_max_ms")] = 0,
                        group: GroupName | None = None, commit_offset: Offset | None = None,
                        client_id: ClientId | None = None,
                        filter_type: Annotated[FilterType, Query(description="TAG (tags) or SQL92 (expression)")
                                               ] = "TAG",
                        expression: Annotated[str | None, Query(description="SQL92 over properties")] = None,
                        form: Annotated[Literal["rows", "records"],
                                        Query(description="Arrow answers without a filter or group: rows "
                                                          "(PULL_SCHEMA) or records (stored records)")] = "rows",
                        ) -> Response:
    """Read messages of one queue from ``offset``; long-polls up to ``wait_ms`` when nothing new matches."""
    if form not in ("rows", "records"):
        raise SparkMQError(ErrorCode.INVALID_ARGUMENT, f"form must be rows or records, got {form!r}")
    bulk = (_wants_arrow(request) and wait_ms == 0 and (filter_type or "TAG").upper() == "TAG"
            and (tags or expression or "*").strip() == "*" and commit_offset is None and not group and not client_id)
    if bulk:
        # The Spark source's pull (no consumer group: nothing to commit or trace as a delivery):
        # no per-message objects; in records form the reader decodes the stored records itself.
        pulls = broker.pull_processor
        fast, batch = await run_in_threadpool(functools.partial(pulls.pull_arrow_once, records=form == "records"),
                                              topic, queue_id, offset, max_count)
        return Response(wire.to_ipc(batch), media_type=wire.ARROW_STREAM, headers={
            wire.PULL_HEADERS["status"]: str(fast.status), wire.PULL_HEADERS["next_offset"]: str(fast.next_offset),
            wire.PULL_HEADERS["min_offset"]: str(fast.min_offset),
            wire.PULL_HEADERS["max_offset"]: str(fast.max_offset),
            wire.PULL_HEADERS["form"]: "records" if batch.schema.names == ["record"] else "rows"})
    if form == "records":
        raise SparkMQError(ErrorCode.INVALID_ARGUMENT, "form=records is for unfiltered Arrow pulls without a group, "
                                                       "wait_ms or commit_offset")
    pulls = broker.pull_processor
    result = await pulls.pull(topic, queue_id, offset, max_count, tags, wait_ms=wait_ms, group=group or None,
                               commit_offset=commit_offset, filter_type=filter_type, expression=expression,
                               client_id=client_id)
    if _wants_arrow(request):
        return _pull_arrow(result, broker.name)
    return JSONResponse(_pull_json(result, broker.name))


@pull_router.get("/topics/{topic}/queues/{queue_id}/offsets")
async def queue_offsets(topic: TopicPath, queue_id: QueuePath, broker: BrokerDep,
                        timestamp: Annotated[EpochMs | None, Query(description="epoch ms")] = None) -> dict[str, int]:
    """The queue's min and max offsets, and the first offset stored at or after ``timestamp``."""
    return broker.pull_processor.queue_offsets(topic, queue_id, timestamp)


@topics_router.get("/topics")
async def list_topics(broker: BrokerDep) -> dict[str, list[dict[str, Any]]]:
    """Every topic of this broker (system topics included)."""
    return {"topics": [cfg.to_dict() for cfg in broker.admin_processor.list_topics()]}


@topics_router.get("/topics/{topic}")
async def get_topic(topic: TopicPath, broker: BrokerDep) -> dict[str, Any]:
    """One topic's config (TOPIC_NOT_EXIST)."""
    return broker.admin_processor.get_topic(topic).to_dict()


@topics_router.post("/topics")
def create_topic(body: TopicIn, broker: BrokerDep) -> dict[str, Any]:
    """Create or update a topic; system topics answer NO_PERMISSION.  Name servers hear of it at once."""
    admin = broker.admin_processor
    return admin.create_or_update_topic(body.topic, body.read_queue_nums, body.write_queue_nums, body.perm,
                                         body.order, body.topic_sys_flag).to_dict()


@topics_router.delete("/topics/{topic}")
def delete_topic(topic: TopicPath, broker: BrokerDep) -> dict[str, Any]:
    """Delete a topic's config and its consumer offsets; ``deleted`` is false when it did not exist."""
    return {"topic": topic, "deleted": broker.admin_processor.delete_topic(topic)}


@topics_router.get("/topics/{topic}/stats")
async def topic_stats(topic: TopicPath, broker: BrokerDep) -> dict[str, Any]:
    """Per queue: min and max offset, and the store time of the last message (0 = none)."""
    return broker.admin_processor.topic_stats(topic)


@clients_router.post("/clients/heartbeat")
def heartbeat(body: HeartbeatIn, broker: BrokerDep) -> dict[str, Any]:
    """Record a client's heartbeat; answers each consumer group's membership version."""
    consumers = [ConsumerData(c.group, c.consume_type, c.message_model, c.consume_from_where,
                              tuple(Subscription(s.topic, s.expression, s.type) for s in c.subscriptions),
                              tuple(c.held_queues))
                 for c in body.consumers]
    versions = broker.consumer_processor.heartbeat(body.client_id, body.producer_groups, consumers)
    return {"groups": {g: {"version": v} for g, v in versions.items()}}


@clients_router.post("/clients/unregister")
async def unregister_client(body: UnregisterClientIn, broker: BrokerDep) -> dict[str, Any]:
    """Remove a client from its groups (it is shutting down); answers the consumer groups' versions."""
    versions = broker.consumer_processor.unregister_client(body.client_id, body.producer_groups, body.consumer_groups)
    return {"groups": {g: {"version": v} for g, v in versions.items()}}


@clients_router.get("/consumers")
async def consumer_groups(broker: BrokerDep) -> dict[str, list[str]]:
    """Consumer groups with at least one live member."""
    return {"groups": broker.clients.consumer_groups()}


@clients_router.get("/consumers/{group}")
async def consumer_group(group: GroupPath, broker: BrokerDep) -> dict[str, Any]:
    """A group's version, members and settings (version 0 and no members when nobody joined)."""
    return broker.consumer_processor.group_info(group).to_dict()


@clients_router.get("/consumers/{group}/changes")
async def consumer_group_changes(group: GroupPath, broker: BrokerDep,
                                 version: Annotated[NonNegative, Query(description="the version the caller knows")
                                                    ] = 0,
                                 wait_ms: WaitMs = 20_000,
                                 ) -> dict[str, Any]:
    """Long poll: answers when the group's membership version differs from ``version``, or at ``wait_ms``."""
    current, members = await broker.consumer_processor.wait_group_change(group, version, wait_ms)
    return {"version": current, "members": members}


@offsets_router.post("/consumers/{group}/offsets")
async def commit_offsets(group: GroupPath, body: CommitOffsetsIn, broker: BrokerDep) -> dict[str, int]:
    """Commit offsets of a group, all or nothing."""
    entries = [(e.topic, e.queue_id, e.offset) for e in body.offsets]
    return {"committed": broker.consumer_processor.commit_offsets(group, entries)}


@offsets_router.get("/consumers/{group}/offsets")
async def query_offsets(group: GroupPath, broker: BrokerDep, topic: TopicName | None = None) -> dict[str, Any]:
    """The group's committed offsets: ``{topic: {queue_id: offset}}``."""
    offsets = broker.consumer_processor.query_offsets(group, topic)
    return {"group": group, "offsets": {t: {str(q): o for q, o in qs.items()} for t, qs in offsets.items()}}


@offsets_router.get("/consumers/{group}/offsets/{topic}/{queue_id}")
async def query_offset(group: GroupPath, topic: TopicPath, queue_id: QueuePath, broker: BrokerDep) -> dict[str, int]:
    """One committed offset (-1 when never committed)."""
    return {"offset": broker.consumer_processor.query_offset(group, topic, queue_id)}


@offsets_router.get("/consumers/{group}/lag")
def consumer_lag(group: GroupPath, broker: BrokerDep, topic: TopicName | None = None) -> dict[str, Any]:
    """Per read queue: the broker's max offset, the group's offset and the difference."""
    return broker.consumer_processor.lag(group, topic)


@locks_router.post("/lock")
async def lock_queues(body: LockIn, broker: BrokerDep) -> dict[str, list[dict[str, Any]]]:
    """Lock (or renew) queues for orderly consumption; answers those this client now holds."""
    queues = [(q.topic, q.queue_id) for q in body.queues]
    locked = broker.consumer_processor.lock_queues(body.group, body.client_id, queues)
    return {"locked": [{"topic": t, "queue_id": q} for t, q in locked]}


@locks_router.post("/unlock")
async def unlock_queues(body: LockIn, broker: BrokerDep) -> dict[str, list[dict[str, Any]]]:
    """Release queues this client holds; answers those released."""
    queues = [(q.topic, q.queue_id) for q in body.queues]
    unlocked = broker.consumer_processor.unlock_queues(body.group, body.client_id, queues)
    return {"unlocked": [{"topic": t, "queue_id": q} for t, q in unlocked]}


features_router = APIRouter(tags=["features"])


@features_router.delete("/timers/{msg_id}")
def recall_timer(msg_id: Annotated[MsgId, Path()], broker: BrokerDep) -> dict[str, Any]:
    """Recall a pending timer message; ``recalled`` is false when it fired, was recalled or is unknown."""
    return {"msg_id": msg_id, "recalled": broker.send_processor.recall_timer(msg_id)}


@features_router.post("/consumers/{group}/send-back")
def send_back(group: GroupPath, body: SendBackIn, broker: BrokerDep) -> dict[str, Any]:
    """A failed message: retry through ``%RETRY%<group>`` or, past the max reconsume times, dead-letter it."""
    return broker.send_processor.send_back(group, body.offset_msg_id, delay_level=body.delay_level, reason=body.reason,
                            max_reconsume_times=body.max_reconsume_times)


@features_router.get("/dlq/{group}")
def dlq_messages(group: GroupPath, broker: BrokerDep, offset: Offset = 0,
                 max_count: Annotated[DlqMax, Query(alias="max")] = 32,
                 ) -> JSONResponse:
    """The group's dead letters from ``offset`` (as in a pull) plus ``next_offset``."""
    return JSONResponse(_pull_json(broker.admin_processor.dlq_messages(group, offset, max_count), broker.name))


@features_router.post("/dlq/{group}/redrive")
def redrive(group: GroupPath, body: RedriveIn, broker: BrokerDep) -> dict[str, Any]:
    """Send DLQ messages back to their original topics (one by id, or all matching); the DLQ keeps its copies."""
    return broker.admin_processor.redrive(group, body.msg_ids, all_messages=body.all, topic=body.topic, tags=body.tags)


@features_router.post("/consumers/{group}/resend")
def resend(group: GroupPath, body: ResendIn, broker: BrokerDep) -> dict[str, Any]:
    """Store a copy of a message in ``%RETRY%<group>``: that group, and no other, consumes it again (reconsume
    count 0).  MESSAGE_ID_ILLEGAL, MESSAGE_NOT_FOUND, GROUP_NOT_EXIST, nothing stored."""
    return broker.admin_processor.resend(body.msg_id, group)


@features_router.get("/transactions/checks")
async def transaction_checks(broker: BrokerDep, producer_group: GroupName, client_id: ClientId | None = None,
                             wait_ms: WaitMs = 0) -> dict[str, Any]:
    """Long poll: check-backs due for the producer group (each to one poller), or [] at ``wait_ms``."""
    checks = await broker.transaction_processor.poll_checks(producer_group, client_id, wait_ms)
    for check in checks:
        check["body"] = wire.encode_body(check["body"])
    return {"checks": checks}


@features_router.post("/transactions/{transaction_id}")
def end_transaction(transaction_id: str, body: EndTransactionIn, broker: BrokerDep) -> dict[str, Any]:
    """Commit, roll back or leave open (UNKNOWN) a transaction; TRANSACTION_NOT_FOUND for unknown/settled ids."""
    transactions = broker.transaction_processor
    return transactions.end_transaction(transaction_id, body.producer_group, body.action, body.from_check)


@features_router.post("/consumers/{group}/offsets/reset")
def reset_offsets(group: GroupPath, body: ResetOffsetsIn, broker: BrokerDep) -> dict[str, Any]:
    """Move a group's offsets on a topic by timestamp or to exact offsets; its version moves so consumers re-read."""
    offsets = None
    if body.offsets is not None:
        try:
            offsets = {int(q): o for q, o in body.offsets.items()}
        except ValueError:
            raise SparkMQError(ErrorCode.QUEUE_ID_ILLEGAL, "offsets keys must be queue ids") from None
    return broker.consumer_processor.reset_offsets(group, body.topic, timestamp=body.timestamp, offsets=offsets)


@broker_router.get("/messages/{offset_msg_id}", tags=["pull"])
def message_by_id(offset_msg_id: str, broker: BrokerDep) -> JSONResponse:
    """One message by its offsetMsgId (MESSAGE_ID_ILLEGAL, MESSAGE_NOT_FOUND)."""
    stored = broker.query_processor.message_by_offset_msg_id(offset_msg_id)
    return JSONResponse(wire.stored_to_json(stored, broker.name))


@broker_router.get("/query/messages", tags=["pull"])
def query_messages(broker: BrokerDep, msg_id: str | None = None, topic: TopicName | None = None,
                   key: str | None = None,
                   begin: Annotated[EpochMs | None, Query(description="store time from, epoch ms")] = None,
                   end: Annotated[EpochMs | None, Query(description="store time until (exclusive), epoch ms")] = None,
                   max_hits: Annotated[QueryMax, Query(alias="max")] = 32) -> dict[str, Any]:
    """Messages found through the lake's index (``message_keys``): by msg_id, by topic + key, or by
    topic + store-time range; newest first, at most ``max`` (64).  Findable once dispatched (seconds)."""
    found = broker.query_processor.query_messages(topic=topic, key=key, msg_id=msg_id, begin_ms=begin, end_ms=end,
                                  max_hits=max_hits)
    return {"messages": [wire.stored_to_json(m, broker.name) for m in found]}


@broker_router.get("/alerts", tags=["lake"])
def alerts(broker: BrokerDep, state: Literal["open", "all"] = "open",
           limit: AlertLimit = 500) -> dict[str, Any]:
    """Alerts raised by the lake's report rules (the ``alerts`` table; empty without a lake): the open ones,
    oldest first, or with ``state=all`` open and resolved, newest first (at most ``limit``)."""
    from ..pipelines.alerts import open_alerts  # delta-rs only; no Spark

    lake_root = broker.config.data_dir / "lake"
    if state == "open":
        return {"alerts": open_alerts(lake_root)[:limit]}
    return {"alerts": _every_alert(str(lake_root), limit)}


@broker_router.get("/alerts/rules", tags=["lake"])
def alert_rules(broker: BrokerDep) -> dict[str, Any]:
    """The alert rules this broker's lake evaluates, as configured in ``[[alerts.rules]]`` (name, kind,
    threshold, for_minutes, severity, group / topic filters); none without a lake, ``error`` for a bad table."""
    return broker.admin_processor.alert_rules()


_RANGE_QUERY = Query(alias="range", description=f"one of {', '.join(REPORT_RANGES)}")


@broker_router.get("/reports/topics/{topic}", tags=["lake"])
def topic_report(topic: TopicPath, broker: BrokerDep, range_name: Annotated[str, _RANGE_QUERY] = "6h"
                 ) -> dict[str, Any]:
    """This broker's ``topic_stats`` rows of a topic over the range, bucketed: messages and TPS in and out."""
    return broker.admin_processor.report_series("topic", topic, range_name).to_dict()


@broker_router.get("/reports/groups/{group}", tags=["lake"])
def group_report(group: GroupPath, broker: BrokerDep, range_name: Annotated[str, _RANGE_QUERY] = "6h"
                 ) -> dict[str, Any]:
    """This broker's ``group_stats`` rows of a group over the range, bucketed: consumed messages, TPS and lag."""
    return broker.admin_processor.report_series("group", group, range_name).to_dict()


def _every_alert(lake_root: str, limit: int) -> list[dict[str, Any]]:
    """The newest ``limit`` rows of the ``alerts`` table, JSON-ready (only reads what the alert engine wrote)."""
    import datetime as dt

    from deltalake import DeltaTable

    from ..pipelines import tables

    path = tables.table_path(lake_root, tables.ALERTS)
    if not DeltaTable.is_deltatable(path):
        return []
    rows = DeltaTable(path).to_pyarrow_dataset().to_table()
    rows = rows.sort_by([("raised_at", "descending"), ("alert_id", "ascending")]).slice(0, limit)
    return [{k: v.isoformat() if isinstance(v, dt.datetime) else v for k, v in r.items()} for r in rows.to_pylist()]


def _disk_use(broker: Broker) -> dict[str, Any]:
    """The store's file system and its watermarks (as measured by the store every ``disk_check_interval_ms``):
    total, used and free bytes, the used ratio, the state and whether writes are accepted."""
    status = broker.disk_status()
    if "used_ratio" not in status:  # not measured yet (the store is not open): measure once, read-only
        try:
            usage = measure_disk(status["path"])
        except OSError as exc:  # the store's directory is gone or unreadable: say so, the rest of the answer stands
            return {**status, "error": f"{type(exc).__name__}: {exc}"}
        status.update(total_bytes=usage.total_bytes, used_bytes=usage.used_bytes, free_bytes=usage.free_bytes,
                      used_ratio=round(usage.used_ratio, 4))
    return status


@broker_router.get("/broker")
async def broker_info(broker: BrokerDep) -> dict[str, Any]:
    """Identity, role, sparkmq ``version``, name servers, commit-log offsets, topic and client counts, and the
    ``disk`` of the store: its file system's use (``total_bytes``, ``used_bytes``, ``free_bytes``, ``used_ratio``)
    and watermarks (``state`` OK, CLEAN, FORCE_CLEAN or FULL; ``writable``: False while sends are refused with
    DISK_FULL; the ratios; ``refused_writes``; ``held_by``: what kept early deletion from a segment)."""
    return {**broker.admin_processor.info(), "version": __version__, "disk": _disk_use(broker)}


@broker_router.get("/broker/ha")
async def replication(broker: BrokerDep) -> dict[str, Any]:
    """Replication: on a master its HA port and every slave (offset acknowledged, bytes behind, in sync);
    on a slave its master and how far behind it is."""
    return broker.replication_status() or {"role": str(broker.config.role)}


@broker_router.get("/broker/ha/sync")
async def replication_sync(broker: BrokerDep) -> dict[str, Any]:
    """The topic table and every consumer offset: what a slave copies from its master every 10 s."""
    return broker.replication_snapshot()


@broker_router.get("/broker/dledger", tags=["dledger"])
async def dledger_status(member: DLedgerDep, broker: BrokerDep) -> dict[str, Any]:
    """This DLedger member: role, term, leader, commit offset, log end, members (and a leader's view of each
    peer), plus this broker's address and its master's (DLEDGER_NOT_ENABLED on a broker outside any group)."""
    master = broker.addr if member.leads else broker.master_addr()
    return {**member.status(), "broker_addr": broker.addr, "master_addr": master}


@broker_router.post("/broker/dledger/transfer", tags=["dledger"])
async def dledger_transfer(body: TransferLeadershipIn, member: DLedgerDep, broker: BrokerDep) -> dict[str, Any]:
    """Hand the leadership to member ``to`` and answer once it leads: INVALID_ARGUMENT for an unknown member,
    SERVICE_NOT_AVAILABLE naming the leader when this member does not lead, LEADERSHIP_TRANSFER_FAILED when
    the transfer did not complete in time (this member may still lead, or no one yet)."""
    if body.to not in member.member_ids:
        raise SparkMQError(ErrorCode.INVALID_ARGUMENT, f"{body.to!r} is not a member of DLedger group "
                                                       f"{member.group}; members: {member.member_ids}")
    if not member.leads:
        # Point the operator at the broker to ask instead (the node's own error names only Raft addresses).
        where = f" (broker {broker.master_addr()})" if broker.master_addr() else ""
        raise SparkMQError(ErrorCode.SERVICE_NOT_AVAILABLE,
                           f"{member.self_id} does not lead DLedger group {member.group}; "
                           f"the leader is {member.leader_id or 'not known'}{where}: ask it")
    previous_term = member.term
    try:
        await member.transfer_leadership(body.to)  # on this loop: the member's own
    except LeadershipTransferError as exc:
        raise SparkMQError(ErrorCode.LEADERSHIP_TRANSFER_FAILED, exc.message) from None
    return {"group": member.group, "from": member.self_id, "to": body.to, "leader": member.leader_id,
            "previous_term": previous_term, "term": member.term}


@broker_router.get("/health")
async def health(broker: BrokerDep) -> dict[str, Any]:
    """``ok``, or ``degraded`` with the failing components (store, offsets persist, name servers)."""
    return broker.health()


@broker_router.get("/metrics", response_class=Response)
def metrics(broker: BrokerDep) -> Response:
    """Prometheus text exposition of the broker's metrics."""
    return Response(broker.metrics_text(), media_type=METRICS_CONTENT_TYPE)


# -- the app ----------------------------------------------------------------------------

def create_app(broker: Broker) -> FastAPI:
    """The broker app over ``broker`` (started by the caller; the app starts and stops nothing).

    Example::

        >>> from sparkmq.platform.broker.config import BrokerConfig
        >>> app = create_app(Broker(BrokerConfig(data_dir="/tmp/x")))
        >>> "/topics/{topic}/messages" in app.openapi()["paths"]
        True
    """
    # With ACL on, every route is authenticated and authorized before it runs (api/acl.py, docs/security.md).
    app = FastAPI(title="sparkmq broker", version="0.1.0", docs_url=None, redoc_url=None,
                  description="Send, pull, topics, consumer groups, offsets, queue locks, metrics "
                              "(docs/http-api.md).", dependencies=[Depends(http_access)])
    app.state.broker = broker
    app.state.guard = broker_guard(broker)
    for router in (send_router, pull_router, topics_router, clients_router, features_router, offsets_router,
                   locks_router, broker_router):
        app.include_router(router)
    app.include_router(trace_router)
    app.include_router(acl_router)
    install_docs(app)
    install_bodies(app, BatchSendBody)
    install_error_handlers(app, log)
    return app
