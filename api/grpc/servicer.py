"""``apache.rocketmq.v2.MessagingService`` over the broker's processors: decode, call a processor, encode.

No request logic lives here (sends, transactions, POP, offsets are the processors'); each RPC maps its
protobuf request onto one processor call and the result (or the SparkMQError) onto the response, whose
``status`` carries the outcome (gRPC itself answers OK, as RocketMQ's proxy does).  Requests arrive as
bytes and are parsed here, so a malformed protobuf gets a BAD_REQUEST status rather than a transport error.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio.to_thread
import grpc
from google.protobuf.message import DecodeError
from google.protobuf.message import Message as Proto

from ...platform.auth import Action, Need, Resource
from ...platform.broker.broker import Broker
from ...platform.broker.transaction import COMMIT, ROLLBACK
from ...platform.common.errors import SparkMQError
from ...platform.common.ids import UniqueIdGenerator
from ...platform.common.message import SendStatus
from ...platform.common.protocol import (
    MAX_POP_BATCH,
    MAX_PULL_BATCH,
    POP_MAX_LONG_POLL_MS,
    ExpressionType,
    PopRequest,
    PullStatus,
)
from ...storage_native import encode_v2_send_response
from ..acl import broker_guard
from ._pb import SERVICE_NAME, Code, MessageType, definition, service
from .clients import ClientRegistry, GrpcClient
from .convert import (
    PackedSend,
    ProtocolError,
    SendPlan,
    duration_ms,
    pack_plain,
    pack_request,
    parse_recall_handle,
    recall_handle,
    status_of,
    status_ok,
    timestamp_of,
    to_outgoing,
    to_v2_message,
    wrap,
)
from .renewals import Renewals
from .routes import RouteResolver

__all__ = ["MessagingService"]

log = logging.getLogger("sparkmq.broker.grpc")

_P = TypeVar("_P", bound=Proto)
#: A unary handler's request: a message type, or ``bytes`` for a handler that parses the request itself.
RequestType = type[Proto] | type[bytes]
#: A unary handler's answer: a message, or bytes it serialized itself (SendMessage's packed path).
Answer = Proto | bytes

#: Stored-but-not-acknowledged send outcomes as v2 codes (the message is stored; the client decides).
_SEND_STATUS_CODES = {SendStatus.FLUSH_DISK_TIMEOUT: Code.MASTER_PERSISTENCE_TIMEOUT,
                      SendStatus.FLUSH_SLAVE_TIMEOUT: Code.SLAVE_PERSISTENCE_TIMEOUT,
                      SendStatus.SLAVE_NOT_AVAILABLE: Code.HA_NOT_AVAILABLE}
_RESOLUTIONS = {definition.TransactionResolution.COMMIT: COMMIT, definition.TransactionResolution.ROLLBACK: ROLLBACK}
#: A receive's long poll ends this long before the client's deadline, so that its answer still reaches the client.
POLL_DEADLINE_RESERVE_MS = 200
#: Messages of a receive whose answer was not written are visible again after this (RocketMQ's proxy: 1 s).
UNDELIVERED_RELEASE_MS = 1000


@dataclass(frozen=True, slots=True)
class Call:
    """Who is calling: the headers the official clients send on every call."""

    client_id: str
    namespace: str
    peer: str
    #: Every text header (the ``authorization`` signature and its ``x-mq-date-time`` among them).
    headers: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)
    #: Milliseconds left before the client's deadline when the call arrived (None: the client set none, or the
    #: call is unary: only a streamed answer, a receive's long poll, waits for it).
    remaining_ms: int | None = None

    @classmethod
    def of(cls, context: grpc.aio.ServicerContext, *, deadline: bool = False) -> Call:
        headers = {k: v for k, v in (context.invocation_metadata() or ()) if isinstance(v, str)}
        peer = context.peer() or ""
        remaining_s = context.time_remaining() if deadline else None
        # "ipv4:127.0.0.1:5000" / "ipv6:[::1]:5000" -> the address part.
        return cls(headers.get("x-mq-client-id", ""), headers.get("x-mq-namespace", ""), peer.partition(":")[2],
                   headers, None if remaining_s is None else int(remaining_s * 1000))


def _status_entry(code: int, message: str = "OK") -> definition.Status:
    return definition.Status(code=code, message=message)


class MessagingService:
    """The RPCs of ``MessagingService``; :meth:`handler` registers them with a ``grpc.aio`` server."""

    def __init__(self, broker: Broker, registry: ClientRegistry, routes: RouteResolver, renewals: Renewals) -> None:
        self.broker = broker
        self.clients = registry
        self.routes = routes
        self.renewals = renewals
        #: Ids of packed messages sent without one (the producer's own ids are kept).
        self._ids = UniqueIdGenerator()
        self._guard = broker_guard(broker)

    # -- registration ------------------------------------------------------------------------
    def handler(self) -> grpc.GenericRpcHandler:
        """Every RPC as a generic handler (requests as bytes: parsed, and refused cleanly, here)."""
        unary: dict[str, tuple[Callable[..., Awaitable[Answer]], RequestType, type[Proto]]] = {
            "QueryRoute": (self.query_route, service.QueryRouteRequest, service.QueryRouteResponse),
            "Heartbeat": (self.heartbeat, service.HeartbeatRequest, service.HeartbeatResponse),
            # Parsed here, not by _unary: plain batches are packed from the request's bytes (pack_request).
            "SendMessage": (self.send_message_bytes, bytes, service.SendMessageResponse),
            "QueryAssignment": (self.query_assignment, service.QueryAssignmentRequest,
                                service.QueryAssignmentResponse),
            "AckMessage": (self.ack_message, service.AckMessageRequest, service.AckMessageResponse),
            "ForwardMessageToDeadLetterQueue": (self.forward_to_dlq, service.ForwardMessageToDeadLetterQueueRequest,
                                                service.ForwardMessageToDeadLetterQueueResponse),
            "UpdateOffset": (self.update_offset, service.UpdateOffsetRequest, service.UpdateOffsetResponse),
            "GetOffset": (self.get_offset, service.GetOffsetRequest, service.GetOffsetResponse),
            "QueryOffset": (self.query_offset, service.QueryOffsetRequest, service.QueryOffsetResponse),
            "EndTransaction": (self.end_transaction, service.EndTransactionRequest, service.EndTransactionResponse),
            "NotifyClientTermination": (self.notify_client_termination, service.NotifyClientTerminationRequest,
                                        service.NotifyClientTerminationResponse),
            "ChangeInvisibleDuration": (self.change_invisible_duration, service.ChangeInvisibleDurationRequest,
                                        service.ChangeInvisibleDurationResponse),
            "RecallMessage": (self.recall_message, service.RecallMessageRequest, service.RecallMessageResponse),
            "SyncLiteSubscription": (self.unsupported, service.SyncLiteSubscriptionRequest,
                                     service.SyncLiteSubscriptionResponse),
        }
        methods: dict[str, grpc.RpcMethodHandler] = {
            name: grpc.unary_unary_rpc_method_handler(_unary(self._guarded(name, fn), req, resp),
                                                      response_serializer=_serialize)
            for name, (fn, req, resp) in unary.items()}
        methods["ReceiveMessage"] = grpc.unary_stream_rpc_method_handler(
            _streamed(self._guarded_stream("ReceiveMessage", self.receive_message), service.ReceiveMessageRequest,
                      service.ReceiveMessageResponse),
            response_serializer=_serialize)
        methods["PullMessage"] = grpc.unary_stream_rpc_method_handler(
            _streamed(self._guarded_stream("PullMessage", self.pull_message), service.PullMessageRequest,
                      service.PullMessageResponse),
            response_serializer=_serialize)
        methods["Telemetry"] = grpc.stream_stream_rpc_method_handler(self.telemetry, response_serializer=_serialize)
        return grpc.method_handlers_generic_handler(SERVICE_NAME, methods)

    # -- access control (ACL on: docs/security.md) -------------------------------------------------------
    def _check(self, rpc: str, req: Any, call: Call) -> None:
        """Verify the call's ``MQv2-HMAC-SHA1`` signature and that its user may do what the RPC does."""
        guard = self._guard
        try:
            principal = guard.authenticate_grpc(call.headers, call.peer, rpc)
        except SparkMQError as exc:
            raise ProtocolError(Code.UNAUTHORIZED, exc.message) from None
        needs_of = _GRPC_NEEDS.get(rpc)
        if needs_of is not None and not principal.super_user:
            # QueryRoute serves producers and consumers alike: Pub or Sub on the topic will do.
            guard.authorize(principal, needs_of(req, call), call.peer, f"grpc {rpc}", any_of=rpc == "QueryRoute")

    def _guarded(self, rpc: str, fn: Callable[[Any, Call], Awaitable[Answer]]
                 ) -> Callable[[Any, Call], Awaitable[Answer]]:
        if not self._guard.enabled:
            return fn

        async def guarded(req: Any, call: Call) -> Answer:
            self._check(rpc, req, call)
            return await fn(req, call)
        return guarded

    def _guarded_stream(self, rpc: str, fn: Callable[[Any, Call], AsyncIterator[Proto]]
                        ) -> Callable[[Any, Call], AsyncIterator[Proto]]:
        if not self._guard.enabled:
            return fn

        async def guarded(req: Any, call: Call) -> AsyncIterator[Proto]:
            self._check(rpc, req, call)
            async for response in fn(req, call):
                yield response
        return guarded

    def _client(self, call: Call) -> GrpcClient:
        if not call.client_id:
            raise ProtocolError(Code.CLIENT_ID_REQUIRED, "the x-mq-client-id header is missing")
        return self.clients.get(call.client_id, call.namespace)

    # -- routes, clients ---------------------------------------------------------------------
    async def query_route(self, req: service.QueryRouteRequest, call: Call) -> service.QueryRouteResponse:
        """The topic's master queues on every broker serving gRPC (TOPIC_NOT_FOUND when none)."""
        queues = await self.routes.message_queues(_topic(req.topic, call), call.namespace)
        return service.QueryRouteResponse(status=status_ok(), message_queues=queues)

    async def query_assignment(self, req: service.QueryAssignmentRequest,
                               call: Call) -> service.QueryAssignmentResponse:
        """One readable queue per broker for a push consumer (POP there serves all of that broker's queues)."""
        assignments = await self.routes.assignments(_topic(req.topic, call), call.namespace)
        return service.QueryAssignmentResponse(status=status_ok(), assignments=assignments)

    async def heartbeat(self, req: service.HeartbeatRequest, call: Call) -> service.HeartbeatResponse:
        """Keep the client a live member of its groups."""
        client = self._client(call)
        group = wrap(call.namespace, req.group.name) if req.HasField("group") and req.group.name else None
        self.clients.heartbeat(client, req.client_type, group)
        return service.HeartbeatResponse(status=status_ok())

    async def notify_client_termination(self, req: service.NotifyClientTerminationRequest,
                                        call: Call) -> service.NotifyClientTerminationResponse:
        """The client leaves its groups now (not after the expiry)."""
        if call.client_id:
            self.clients.terminate(call.client_id)
        return service.NotifyClientTerminationResponse(status=status_ok())

    async def telemetry(self, requests: AsyncIterator[bytes],
                        context: grpc.aio.ServicerContext) -> AsyncIterator[service.TelemetryCommand]:
        """Settings handshakes answered, check-backs pushed, until the client closes the stream."""
        call = Call.of(context)
        if not call.client_id:
            yield service.TelemetryCommand(status=_status_entry(Code.CLIENT_ID_REQUIRED, "x-mq-client-id missing"))
            return
        if self._guard.enabled:
            try:
                self._check("Telemetry", None, call)
            except ProtocolError as exc:
                yield service.TelemetryCommand(status=_status_entry(exc.code, exc.message))
                return
        client = self.clients.get(call.client_id, call.namespace)
        outbox = self.clients.attach(client)

        async def read() -> None:
            try:
                async for raw in requests:
                    try:
                        command = service.TelemetryCommand.FromString(raw)
                    except DecodeError as exc:
                        outbox.put_nowait(service.TelemetryCommand(
                            status=_status_entry(Code.BAD_REQUEST, f"malformed TelemetryCommand: {exc}")))
                        continue
                    if command.HasField("settings"):
                        outbox.put_nowait(self.clients.apply_settings(client, command.settings))
                    # thread_stack_trace / verify_message_result answers need nothing from us.
            except (asyncio.CancelledError, grpc.aio.AioRpcError):
                pass
            finally:
                self.clients.detach(client, outbox)

        reader = asyncio.create_task(read(), name=f"grpc-telemetry-{call.client_id}")
        try:
            while (command := await outbox.get()) is not None:
                yield command
        finally:
            reader.cancel()
            self.clients.detach(client, outbox)

    # -- sends -------------------------------------------------------------------------------
    async def send_message_bytes(self, raw: bytes, call: Call) -> service.SendMessageResponse | bytes:
        """SendMessage from its serialized request: a batch of plain NORMAL messages is packed and answered in
        C (the answer then is the serialized response); anything else is parsed and taken by :meth:`send_message`."""
        packed = pack_request(raw, call.namespace, self.broker.send_processor.max_message_size, self._ids)
        if packed is not None:
            return await self._send_packed(packed, call, serialized=True)
        return await self.send_message(_parse(raw, service.SendMessageRequest), call)

    async def send_message(self, req: service.SendMessageRequest, call: Call) -> service.SendMessageResponse:
        """Store every message (all are checked first: one bad message stores none); one entry per message."""
        if not req.messages:
            raise ProtocolError(Code.BAD_REQUEST, "SendMessage carries no messages")
        max_body = self.broker.send_processor.max_message_size
        # Batches take the packed path; one message keeps the per-message one (its trace is a per-message
        # ``store`` record, not a ``store_batch``; packing saves it little: p99 within noise).
        packed = pack_plain(req.messages, call.namespace, max_body, self._ids) if len(req.messages) > 1 else None
        if packed is not None:
            return await self._send_packed(packed, call)
        try:
            plans = [to_outgoing(m, call.namespace or m.topic.resource_namespace, max_body) for m in req.messages]
        except (ProtocolError, SparkMQError) as exc:
            status = status_of(exc)
            return service.SendMessageResponse(status=status, entries=[
                service.SendResultEntry(status=status, message_id=m.system_properties.message_id)
                for m in req.messages])
        first = plans[0]
        if len(plans) > 1 and all(p.message_type == MessageType.NORMAL and p.topic == first.topic for p in plans):
            entries = await self._send_batch(plans, call)
        else:
            entries = [await self._send_one(plan, call) for plan in plans]
        codes = {e.status.code for e in entries}
        status = entries[0].status if len(codes) == 1 else _status_entry(Code.MULTIPLE_RESULTS, "multiple results")
        return service.SendMessageResponse(status=status, entries=entries)

    async def _send_packed(self, packed: PackedSend, call: Call,
                           serialized: bool = False) -> service.SendMessageResponse | bytes:
        """Plain NORMAL messages in one packed append (remoting's SEND_BATCH path); one status for all.

        ``serialized``: a stored batch is answered with the response's bytes, written in C."""
        sending = self.broker.send_processor
        may_block = sending.send_may_block
        try:
            # wait=False under SYNC_FLUSH / SYNC_MASTER / DLedger: acknowledged on this loop, no thread.
            result = sending.send_packed(packed.topic, packed.data, len(packed.msg_ids), born_host=call.peer or None,
                                         wait=not may_block)
            sent = result.status
            if may_block:
                sent = await sending.acknowledge(result.end_offset, asyncio.get_running_loop())
        except SparkMQError as exc:
            status = status_of(exc)
            return service.SendMessageResponse(status=status, entries=[
                service.SendResultEntry(status=status, message_id=msg_id) for msg_id in packed.msg_ids])
        status = _send_status(sent)
        first = result.first_queue_offset
        if serialized and encode_v2_send_response is not None:
            return encode_v2_send_response(status.code, status.message, packed.msg_ids, first)
        response = service.SendMessageResponse(status=status)
        add = response.entries.add  # in place: half the cost of building entries then copying them in
        for i, msg_id in enumerate(packed.msg_ids):
            add(message_id=msg_id, offset=first + i).status.CopyFrom(status)
        return response

    async def _send_batch(self, plans: list[SendPlan], call: Call) -> list[service.SendResultEntry]:
        sending = self.broker.send_processor

        def send() -> Any:
            return sending.send_batch(plans[0].topic, [p.message for p in plans], born_host=call.peer or None,
                                      born_timestamp=plans[0].born_timestamp)
        try:
            result = await anyio.to_thread.run_sync(send) if sending.send_may_block else send()
        except SparkMQError as exc:
            return [service.SendResultEntry(status=status_of(exc), message_id=p.message.msg_id or "") for p in plans]
        status = _send_status(result.status)
        return [service.SendResultEntry(status=status, message_id=r.msg_id, offset=r.queue_offset)
                for r in result.results]

    async def _send_one(self, plan: SendPlan, call: Call) -> service.SendResultEntry:
        try:
            if plan.message_type == MessageType.TRANSACTION:
                return await self._send_half(plan, call)
            sending = self.broker.send_processor
            result, end_offset = sending.send_nowait(
                plan.topic, plan.message, sharding_key=plan.message_group, born_timestamp=plan.born_timestamp,
                born_host=call.peer or None, deliver_at_ms=plan.deliver_at_ms)
            status = result.status
            if sending.send_may_block:
                status = await sending.acknowledge(end_offset, asyncio.get_running_loop())
            recall = (recall_handle(self.broker.config.broker_name, result.msg_id)
                      if plan.deliver_at_ms is not None else "")
            return service.SendResultEntry(status=_send_status(status), message_id=result.msg_id,
                                           offset=result.queue_offset, recall_handle=recall)
        except (SparkMQError, ProtocolError) as exc:
            return service.SendResultEntry(status=status_of(exc), message_id=plan.message.msg_id or "")

    async def _send_half(self, plan: SendPlan, call: Call) -> service.SendResultEntry:
        transactions = self.broker.transaction_processor
        # A gRPC producer has no group: its transactional messages' producer group is their topic.
        answer = await anyio.to_thread.run_sync(lambda: transactions.send_half(
            plan.topic, plan.message, plan.topic, born_timestamp=plan.born_timestamp, born_host=call.peer or None))
        return service.SendResultEntry(status=_send_status(SendStatus(answer["status"])), message_id=answer["msg_id"],
                                       transaction_id=answer["transaction_id"], offset=answer["queue_offset"])

    async def end_transaction(self, req: service.EndTransactionRequest,
                              call: Call) -> service.EndTransactionResponse:
        """Commit or roll back a half message (TRANSACTION_NOT_FOUND -> INVALID_TRANSACTION_ID)."""
        action = _RESOLUTIONS.get(req.resolution)
        if action is None:
            raise ProtocolError(Code.BAD_REQUEST, "resolution must be COMMIT or ROLLBACK")
        topic = _topic(req.topic, call)
        from_check = req.source == definition.TransactionSource.SOURCE_SERVER_CHECK
        transactions = self.broker.transaction_processor
        await anyio.to_thread.run_sync(
            lambda: transactions.end_transaction(req.transaction_id, topic, action, from_check))
        return service.EndTransactionResponse(status=status_ok())

    # -- POP ---------------------------------------------------------------------------------
    async def receive_message(self, req: service.ReceiveMessageRequest,
                              call: Call) -> AsyncIterator[service.ReceiveMessageResponse]:
        """One status, one response per message, then the delivery timestamp (MESSAGE_NOT_FOUND after the poll)."""
        client = self._client(call)
        group, topic = _group(req.group, call), _topic(req.message_queue.topic, call)
        auto_renew = req.auto_renew and not req.HasField("invisible_duration")
        invisible_ms = self.renewals.invisible_ms if auto_renew else duration_ms(req.invisible_duration)
        poll_ms = (duration_ms(req.long_polling_timeout) if req.HasField("long_polling_timeout")
                   else self.clients.consumer.long_polling_timeout_ms)
        if call.remaining_ms is not None:  # answer before the client gives up, as RocketMQ's proxy bounds it
            poll_ms = min(poll_ms, call.remaining_ms - POLL_DEADLINE_RESERVE_MS)
        expression = req.filter_expression
        kind = ExpressionType.SQL92 if expression.type == definition.FilterType.SQL else ExpressionType.TAG
        fifo = client.settings is not None and client.settings.subscription.fifo
        request = PopRequest(group, topic, max_messages=min(req.batch_size or MAX_POP_BATCH, MAX_POP_BATCH),
                             invisible_ms=invisible_ms, long_poll_ms=max(0, min(poll_ms, POP_MAX_LONG_POLL_MS)),
                             filter_type=kind, expression=expression.expression or None, client_id=call.client_id,
                             fifo=fifo, max_attempts=client.max_attempts)
        popped = await self.broker.pop_processor.receive(request)
        if not popped:
            yield service.ReceiveMessageResponse(status=_status_entry(Code.MESSAGE_NOT_FOUND, "no new message"))
            return
        answered = False
        try:
            yield service.ReceiveMessageResponse(status=status_ok())
            for item in popped:
                if auto_renew:
                    self.renewals.track(group, topic, item.receipt_handle, item.invisible_until_ms)
                yield service.ReceiveMessageResponse(message=to_v2_message(
                    item.message, call.namespace, receipt_handle=item.receipt_handle,
                    delivery_attempt=item.delivery_attempt, invisible_ms=invisible_ms))
            yield service.ReceiveMessageResponse(delivery_timestamp=timestamp_of(int(time.time() * 1000)))
            answered = True
        finally:
            if not answered:  # cancelled or failed mid-answer: the client discards a receive it did not finish
                self._release_undelivered(group, topic, [item.receipt_handle for item in popped])

    def _release_undelivered(self, group: str, topic: str, handles: list[str]) -> None:
        """Make a receive's messages visible again soon rather than after their invisible time (no await: this
        runs while the receive is being cancelled)."""
        handles = [self.renewals.settle(group, topic, handle) for handle in handles]
        pop = self.broker.pop_processor

        def release() -> None:
            try:
                released = pop.release(group, topic, handles, UNDELIVERED_RELEASE_MS)
            except Exception as exc:  # best effort (this runs inside the cancellation): they come back in time anyway
                log.warning("a cancelled receive's %d messages of %s/%s stay invisible until their time: %r",
                            len(handles), group, topic, exc)
                return
            log.info("a receive of %s/%s was not answered: %d of its %d messages are visible again in %d ms",
                     group, topic, released, len(handles), UNDELIVERED_RELEASE_MS)
        if pop.may_block:  # SYNC_FLUSH waits for the disk: not on the event loop
            asyncio.get_running_loop().run_in_executor(None, release)
        else:
            release()

    async def ack_message(self, req: service.AckMessageRequest, call: Call) -> service.AckMessageResponse:
        """Settle received messages (one entry per receipt handle; MULTIPLE_RESULTS when they differ)."""
        group, topic = _group(req.group, call), _topic(req.topic, call)
        handles = [self.renewals.settle(group, topic, e.receipt_handle) for e in req.entries]
        pop = self.broker.pop_processor
        outcomes = (await anyio.to_thread.run_sync(lambda: pop.ack_batch(group, topic, handles)) if pop.may_block
                    else pop.ack_batch(group, topic, handles))
        entries = [service.AckMessageResultEntry(message_id=e.message_id, receipt_handle=e.receipt_handle,
                                                 status=status_ok() if err is None else status_of(err))
                   for e, err in zip(req.entries, outcomes, strict=True)]
        codes = {e.status.code for e in entries}
        status = (entries[0].status if len(codes) == 1 else _status_entry(Code.MULTIPLE_RESULTS, "multiple results")
                  ) if entries else status_ok()
        return service.AckMessageResponse(status=status, entries=entries)

    async def change_invisible_duration(self, req: service.ChangeInvisibleDurationRequest,
                                        call: Call) -> service.ChangeInvisibleDurationResponse:
        """A new invisible time for a received message; the answer's receipt handle replaces the old one."""
        group, topic = _group(req.group, call), _topic(req.topic, call)
        handle = self.renewals.settle(group, topic, req.receipt_handle)
        pop = self.broker.pop_processor
        invisible_ms = duration_ms(req.invisible_duration)
        new_handle = await anyio.to_thread.run_sync(lambda: pop.change_invisible(group, topic, handle, invisible_ms))
        return service.ChangeInvisibleDurationResponse(status=status_ok(), receipt_handle=new_handle)

    async def forward_to_dlq(self, req: service.ForwardMessageToDeadLetterQueueRequest,
                             call: Call) -> service.ForwardMessageToDeadLetterQueueResponse:
        """Move a received message to the group's %DLQ% now (the client gave up on it)."""
        group, topic = _group(req.group, call), _topic(req.topic, call)
        handle = self.renewals.settle(group, topic, req.receipt_handle)
        pop = self.broker.pop_processor
        await anyio.to_thread.run_sync(lambda: pop.forward_to_dlq(group, topic, handle))
        return service.ForwardMessageToDeadLetterQueueResponse(status=status_ok())

    async def pull_message(self, req: service.PullMessageRequest,
                           call: Call) -> AsyncIterator[service.PullMessageResponse]:
        """RocketMQ 5's PullMessage: read one queue from an offset the client keeps, long-polled.

        Answered as RocketMQ's proxy does: a status, then the messages, then the next offset.  Served by
        the same pull processor as remoting and HTTP pulls (filters, long polling and deliver trace included).
        """
        group, topic = _group(req.group, call), _topic(req.message_queue.topic, call)
        if req.offset < 0:
            raise ProtocolError(Code.ILLEGAL_OFFSET, f"offset must be >= 0, not {req.offset}")
        wait_ms = duration_ms(req.long_polling_timeout) if req.HasField("long_polling_timeout") else 0
        if wait_ms < 0:
            raise ProtocolError(Code.ILLEGAL_POLLING_TIME, f"long_polling_timeout must be >= 0, not {wait_ms} ms")
        expression = req.filter_expression
        kind = ExpressionType.SQL92 if expression.type == definition.FilterType.SQL else ExpressionType.TAG
        result = await self.broker.pull_processor.pull(
            topic, req.message_queue.id, req.offset, min(req.batch_size or 32, MAX_PULL_BATCH),
            wait_ms=min(wait_ms, POP_MAX_LONG_POLL_MS), group=group, filter_type=kind.value,
            expression=expression.expression or None, client_id=call.client_id or None)
        if result.status is PullStatus.OFFSET_TOO_SMALL or req.offset > result.max_offset:
            yield service.PullMessageResponse(status=_status_entry(
                Code.ILLEGAL_OFFSET, f"offset {req.offset} is outside [{result.min_offset}, {result.max_offset}]"))
        elif result.messages:
            yield service.PullMessageResponse(status=status_ok())
            for stored in result.messages:
                yield service.PullMessageResponse(message=to_v2_message(stored, call.namespace))
        else:
            yield service.PullMessageResponse(status=_status_entry(Code.MESSAGE_NOT_FOUND, "no new message"))
        yield service.PullMessageResponse(next_offset=result.next_offset)

    # -- offsets -----------------------------------------------------------------------------
    async def update_offset(self, req: service.UpdateOffsetRequest, call: Call) -> service.UpdateOffsetResponse:
        """Commit the group's offset of one queue."""
        group, topic = _group(req.group, call), _topic(req.message_queue.topic, call)
        consumers = self.broker.consumer_processor
        await anyio.to_thread.run_sync(
            lambda: consumers.commit_offsets(group, [(topic, req.message_queue.id, req.offset)]))
        return service.UpdateOffsetResponse(status=status_ok())

    async def get_offset(self, req: service.GetOffsetRequest, call: Call) -> service.GetOffsetResponse:
        """The group's committed offset of one queue (OFFSET_NOT_FOUND when it never committed one)."""
        group, topic = _group(req.group, call), _topic(req.message_queue.topic, call)
        offset = self.broker.consumer_processor.query_offset(group, topic, req.message_queue.id)
        if offset < 0:
            raise ProtocolError(Code.OFFSET_NOT_FOUND, f"group {group} has no offset on {topic}/{req.message_queue.id}")
        return service.GetOffsetResponse(status=status_ok(), offset=offset)

    async def query_offset(self, req: service.QueryOffsetRequest, call: Call) -> service.QueryOffsetResponse:
        """A queue's first or next offset, or the first stored at or after a time."""
        topic = _topic(req.message_queue.topic, call)
        policy = req.query_offset_policy
        timestamp = None
        if policy == definition.QueryOffsetPolicy.TIMESTAMP:
            timestamp = req.timestamp.seconds * 1000 + req.timestamp.nanos // 1_000_000
        answer = self.broker.pull_processor.queue_offsets(topic, req.message_queue.id, timestamp)
        offset = (answer["min_offset"] if policy == definition.QueryOffsetPolicy.BEGINNING
                  else answer["max_offset"] if policy == definition.QueryOffsetPolicy.END else answer["offset"])
        return service.QueryOffsetResponse(status=status_ok(), offset=offset)

    async def recall_message(self, req: service.RecallMessageRequest, call: Call) -> service.RecallMessageResponse:
        """Cancel a pending DELAY message by the recall handle its send answered (MESSAGE_NOT_FOUND once it
        was delivered, recalled before, or is unknown to this broker)."""
        _topic(req.topic, call)
        broker_name, msg_id = parse_recall_handle(req.recall_handle)
        if broker_name != self.broker.config.broker_name:
            raise ProtocolError(Code.BAD_REQUEST, f"the recall handle belongs to broker {broker_name}, "
                                                  f"not {self.broker.config.broker_name}")
        sending = self.broker.send_processor
        if not await anyio.to_thread.run_sync(lambda: sending.recall_timer(msg_id)):
            raise ProtocolError(Code.MESSAGE_NOT_FOUND, f"no pending delay message {msg_id} (delivered, recalled "
                                                         "or unknown)")
        return service.RecallMessageResponse(status=status_ok(), message_id=msg_id)

    async def unsupported(self, req: Proto, call: Call) -> Proto:
        """RPCs this broker does not serve (SyncLiteSubscription: lite topics do not exist in sparkmq)."""
        raise ProtocolError(Code.NOT_IMPLEMENTED, f"{type(req).__name__[:-7]} is not served by sparkmq")


# -- helpers -----------------------------------------------------------------------------------------
def _topic(resource: definition.Resource, call: Call) -> str:
    if not resource.name:
        raise ProtocolError(Code.ILLEGAL_TOPIC, "no topic named")
    return wrap(call.namespace or resource.resource_namespace, resource.name)


def _group(resource: definition.Resource, call: Call) -> str:
    if not resource.name:
        raise ProtocolError(Code.ILLEGAL_CONSUMER_GROUP, "no consumer group named")
    return wrap(call.namespace or resource.resource_namespace, resource.name)


def _sub(topic: definition.Resource, group: definition.Resource, call: Call) -> list[Need]:
    return [(Action.SUB, Resource.topic(_topic(topic, call))), (Action.SUB, Resource.group(_group(group, call)))]


def _send_needs(req: service.SendMessageRequest | bytes, call: Call) -> list[Need]:
    if isinstance(req, bytes):  # SendMessage handlers may take the request's bytes: parse them to see the topics
        req = _parse(req, service.SendMessageRequest)
    topics = {_topic(m.topic, call) for m in req.messages}
    return [(Action.PUB, Resource.topic(t)) for t in sorted(topics)]


def _optional_group(req: Any, call: Call) -> list[Need]:
    has_group = req.HasField("group") and req.group.name
    return [(Action.SUB, Resource.group(_group(req.group, call)))] if has_group else []


#: RPC -> the (action, resource) pairs it needs; an RPC absent here needs a signed user only.
_GRPC_NEEDS: dict[str, Callable[[Any, Call], list[Need]]] = {
    "QueryRoute": lambda r, c: [(Action.PUB, Resource.topic(_topic(r.topic, c))),
                                (Action.SUB, Resource.topic(_topic(r.topic, c)))],
    "Heartbeat": _optional_group,
    "NotifyClientTermination": _optional_group,
    "SendMessage": _send_needs,
    "EndTransaction": lambda r, c: [(Action.PUB, Resource.topic(_topic(r.topic, c)))],
    "QueryAssignment": lambda r, c: _sub(r.topic, r.group, c),
    "ReceiveMessage": lambda r, c: _sub(r.message_queue.topic, r.group, c),
    "AckMessage": lambda r, c: _sub(r.topic, r.group, c),
    "ChangeInvisibleDuration": lambda r, c: _sub(r.topic, r.group, c),
    "ForwardMessageToDeadLetterQueue": lambda r, c: _sub(r.topic, r.group, c),
    "UpdateOffset": lambda r, c: _sub(r.message_queue.topic, r.group, c),
    "GetOffset": lambda r, c: _sub(r.message_queue.topic, r.group, c),
    "QueryOffset": lambda r, c: [(Action.SUB, Resource.topic(_topic(r.message_queue.topic, c)))],
    "PullMessage": lambda r, c: _sub(r.message_queue.topic, r.group, c),
    "RecallMessage": lambda r, c: [(Action.PUB, Resource.topic(_topic(r.topic, c)))],
}


def _send_status(status: SendStatus) -> definition.Status:
    code = _SEND_STATUS_CODES.get(status)
    return status_ok() if code is None else _status_entry(code, f"stored, but {status}")


def _serialize(message: Answer) -> bytes:
    # A handler may answer with bytes it serialized itself (SendMessage's packed path).
    return message if isinstance(message, bytes) else message.SerializeToString()


def _request(raw: bytes, kind: RequestType) -> Proto | bytes:
    if issubclass(kind, bytes):  # the handler parses the request itself
        return raw
    return _parse(raw, kind)


def _parse(raw: bytes, kind: type[_P]) -> _P:
    try:
        return kind.FromString(raw)
    except DecodeError as exc:
        raise ProtocolError(Code.BAD_REQUEST, f"malformed {kind.__name__}: {exc}") from None


def _failed(exc: BaseException, what: str) -> definition.Status:
    if not isinstance(exc, SparkMQError | ProtocolError):
        log.exception("gRPC %s failed", what)
    return status_of(exc)


def _unary(fn: Callable[[Any, Call], Awaitable[Answer]], request_type: RequestType,
           response_type: type[Proto]) -> Callable[[bytes, grpc.aio.ServicerContext], Awaitable[Answer]]:
    """A unary RPC: parse, call, and answer any error in the response's status."""
    async def handle(raw: bytes, context: grpc.aio.ServicerContext) -> Answer:
        try:
            return await fn(_request(raw, request_type), Call.of(context))
        except Exception as exc:  # every failure is an answer; the server keeps serving
            return response_type(status=_failed(exc, request_type.__name__))
    return handle


def _streamed(fn: Callable[[Any, Call], AsyncIterator[Proto]], request_type: type[Proto],
              response_type: type[Proto]) -> Callable[[bytes, grpc.aio.ServicerContext], AsyncIterator[Proto]]:
    """A server-streaming RPC: an error before the first response is answered as one status response."""
    async def handle(raw: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[Proto]:
        started = False
        try:
            async for response in fn(_parse(raw, request_type), Call.of(context, deadline=True)):
                started = True
                yield response
        except Exception as exc:
            if started:
                raise
            yield response_type(status=_failed(exc, request_type.__name__))
    return handle
