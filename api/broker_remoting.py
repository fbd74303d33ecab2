"""The broker's remoting adapter (``docs/remoting.md``): decode a frame's typed header, call a processor, encode.

No request logic lives here: every request code maps to one processor call.  The hot paths do no
per-message Python work: a batch send's body goes to the native core as it arrived
(:meth:`SendProcessor.send_packed`), and a pull's answer is the stored records the core copied
out (:meth:`PullProcessor.pull_packed`).

Pushes: a client's HEARTBEAT binds its client id to the connection it came on; rebalance notices
(NOTIFY_CONSUMER_IDS_CHANGED), offset-reset notices and transaction check-backs
(CHECK_TRANSACTION_STATE) go to the bound connections of the group's members.
"""
from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio.to_thread
import msgspec

from ..platform.auth import Action, Need, Resource
from ..platform.auth.signing import REMOTING_MARKER, split_remoting
from ..platform.broker.broker import Broker
from ..platform.broker.client_manager import ConsumerData, Subscription
from ..platform.broker.processors import OutgoingMessage
from ..platform.broker.transaction import CheckRequest
from ..platform.common import protocol as p
from ..platform.common.errors import ErrorCode, SparkMQError
from ..platform.common.message import SendStatus
from ..platform.common.protocol import RequestCode
from ..platform.remoting import Deferred, Frame, RemotingServer, Reply, ServerConnection, unsupported_reply
from ..platform.store.message_store import unpack_batch
from .acl import broker_guard

__all__ = ["BrokerRemoting"]

log = logging.getLogger("sparkmq.broker.remoting")

H = TypeVar("H", bound=p.Header)
#: The connection attribute holding the client id its heartbeats named.
_CLIENT_ID = "client_id"

_encode = msgspec.msgpack.Encoder().encode
_decoders: dict[type, msgspec.msgpack.Decoder[Any]] = {}


def decode_header(frame: Frame, kind: type[H]) -> H:
    """The frame's header as ``kind``; INVALID_ARGUMENT naming what is wrong when it is not one."""
    decoder = _decoders.get(kind)
    if decoder is None:
        decoder = _decoders[kind] = msgspec.msgpack.Decoder(kind)
    try:
        return decoder.decode(frame.header)
    except (msgspec.ValidationError, msgspec.DecodeError, UnicodeDecodeError) as exc:  # msgspec: bad UTF-8 -> the last
        raise SparkMQError(ErrorCode.INVALID_ARGUMENT, f"bad {kind.__name__} header: {exc}") from None


def _reply(header: p.Header, body: bytes | memoryview = b"") -> Reply:
    return Reply(0, _encode(header), body)


def _text(value: object) -> str | None:
    """An optional enum as its wire string."""
    return None if value is None else str(value)


def _peer_host(conn: ServerConnection) -> str | None:
    return conn.peer or None


Handler = Callable[[ServerConnection, Frame], "Reply | Awaitable[Reply] | Deferred | None"]


class BrokerRemoting:
    """Serves one broker's processors over remoting on its own port.

    Example::

        remoting = BrokerRemoting(broker)
        await remoting.start("127.0.0.1", 10912)   # on the serving event loop
        ...
        await remoting.stop()
    """

    def __init__(self, broker: Broker, *, max_frame_bytes: int = p.DEFAULT_MAX_FRAME_BYTES,
                 idle_timeout_s: float = p.DEFAULT_IDLE_TIMEOUT_S) -> None:
        self.broker = broker
        self.server = RemotingServer(self.handle, max_frame_bytes=max_frame_bytes, idle_timeout_s=idle_timeout_s)
        self._lock = threading.Lock()
        #: client id -> the connection its last heartbeat came on (where its notices go).
        self._bound: dict[str, ServerConnection] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._guard = broker_guard(broker)
        self._handlers: dict[int, Handler] = {
            RequestCode.SEND_MESSAGE: self._send,
            RequestCode.SEND_BATCH: self._send_batch,
            RequestCode.SEND_HALF: self._send_half,
            RequestCode.END_TRANSACTION: self._end_transaction,
            RequestCode.PULL_MESSAGE: self._pull,
            RequestCode.QUEUE_OFFSETS: self._queue_offsets,
            RequestCode.HEARTBEAT: self._heartbeat,
            RequestCode.UNREGISTER_CLIENT: self._unregister,
            RequestCode.COMMIT_OFFSETS: self._commit_offsets,
            RequestCode.QUERY_OFFSET: self._query_offset,
            RequestCode.GROUP_INFO: self._group_info,
            RequestCode.LOCK_QUEUES: self._lock_queues,
            RequestCode.UNLOCK_QUEUES: self._unlock_queues,
            RequestCode.SEND_BACK: self._send_back,
            RequestCode.POST_TRACE: self._post_trace,
        }
        broker.clients.add_change_listener(self._on_group_change)
        broker.consumer_processor.add_reset_listener(self._on_offset_reset)
        broker.checks.add_offer_listener(self._on_check_offered)

    # -- lifecycle ------------------------------------------------------------------------
    @property
    def port(self) -> int:
        """The bound port (after :meth:`start`)."""
        return self.server.port

    async def start(self, host: str, port: int) -> BrokerRemoting:
        """Listen on ``host:port`` (0 = a free port) on the running loop."""
        self._loop = asyncio.get_running_loop()
        await self.server.start(host, port)
        log.info("broker %s serves remoting on %s:%d", self.broker.name, host, self.server.port)
        return self

    async def stop(self, grace_s: float = 5.0) -> None:
        """Answer what is in flight, then close every connection."""
        await self.server.stop(grace_s)

    # -- dispatch -------------------------------------------------------------------------
    def handle(self, conn: ServerConnection, frame: Frame) -> Reply | Awaitable[Reply] | Deferred | None:
        """Route one request to its handler (REQUEST_CODE_NOT_SUPPORTED for an unknown code); with ACL on,
        only once its signature and the ACL allow it (AUTHENTICATION_FAILED / NO_PERMISSION otherwise)."""
        handler = self._handlers.get(frame.code)
        if handler is None:
            return unsupported_reply(frame)
        if self._guard.enabled:
            self._authorize(conn, frame)
        elif len(frame.header) and frame.header[0] == REMOTING_MARKER:  # signed, but ACL is off: just strip it
            try:
                frame.header = split_remoting(frame.code, frame.header, frame.body)[1]
            except SparkMQError as exc:
                raise SparkMQError(ErrorCode.INVALID_ARGUMENT, f"bad header: {exc.message}") from None
        return handler(conn, frame)

    def _authorize(self, conn: ServerConnection, frame: Frame) -> None:
        """Verify the frame's credential block, strip it from the header, and check what the request needs."""
        guard = self._guard
        principal, frame.header = guard.authenticate_remoting(frame.code, frame.header, frame.body, conn.peer)
        if principal.super_user:
            return
        needs_of = _REMOTING_NEEDS.get(frame.code)
        if needs_of is not None:  # None: any signed user (POST_TRACE)
            guard.authorize(principal, needs_of(frame), conn.peer, f"remoting {RequestCode(frame.code).name}")

    # -- sends ----------------------------------------------------------------------------
    def _send(self, conn: ServerConnection, frame: Frame) -> Reply | Deferred | Awaitable[Reply]:
        req = decode_header(frame, p.SendRequest)
        message = OutgoingMessage(bytes(frame.body), req.tags, tuple(req.keys), dict(req.properties), req.msg_id)
        sending = self.broker.send_processor

        result, end_offset = sending.send_nowait(
            req.topic, message, queue_id=req.queue_id, sharding_key=req.sharding_key, compressed=req.compressed,
            producer_group=req.producer_group, born_timestamp=req.born_timestamp, born_host=_peer_host(conn),
            delay_level=req.delay_level, deliver_at_ms=req.deliver_at_ms, delay_ms=req.delay_ms)
        reply = _reply(p.SendResponse(str(result.status), result.msg_id, result.offset_msg_id, result.topic,
                                      result.broker_name, result.queue_id, result.queue_offset,
                                      result.store_timestamp))
        if not sending.send_may_block:
            return reply

        def answer(status: SendStatus) -> Reply:
            if status is SendStatus.SEND_OK:
                return reply
            return _reply(p.SendResponse(str(status), result.msg_id, result.offset_msg_id,
                                         result.topic, result.broker_name, result.queue_id, result.queue_offset,
                                         result.store_timestamp))
        return self._when_acknowledged(end_offset, answer)

    def _send_batch(self, conn: ServerConnection, frame: Frame) -> Reply | Deferred | Awaitable[Reply]:
        req = decode_header(frame, p.SendBatchRequest)
        sending = self.broker.send_processor
        if req.delay_level is not None or req.deliver_at_ms is not None or req.delay_ms is not None:
            return self._send_delayed_batch(conn, frame, req)
        if not sending.send_may_block:
            result = sending.send_packed(req.topic, frame.body, req.count, queue_id=req.queue_id,
                                         sharding_key=req.sharding_key, compressed=req.compressed,
                                         producer_group=req.producer_group, born_host=_peer_host(conn))
            return _batch_reply(result)

        result = sending.send_packed(req.topic, frame.body, req.count, queue_id=req.queue_id,
                                     sharding_key=req.sharding_key, compressed=req.compressed,
                                     producer_group=req.producer_group, born_host=_peer_host(conn), wait=False)

        return self._when_acknowledged(
            result.end_offset, lambda status: _batch_reply(result, None if status is SendStatus.SEND_OK else status))

    def _when_acknowledged(self, end_offset: int,
                           answer: Callable[[SendStatus], Reply]) -> Reply | Deferred | Awaitable[Reply]:
        """``answer(status)`` of a send stored with ``wait=False``, once it may be acknowledged (SYNC_FLUSH,
        SYNC_MASTER, DLedger; loop futures, no thread).  When one future is all it waits for (the disk sync,
        or the DLedger commit), that future answers from its done callback (no task, one loop pass less
        than awaiting it)."""
        sending = self.broker.send_processor
        loop = self._loop
        assert loop is not None
        waiting = sending.acknowledgement(end_offset, loop)
        if waiting is None:
            async def acknowledged() -> Reply:
                return answer(await sending.acknowledge(end_offset, loop))
            return acknowledged()
        future, status_of = waiting

        def finish(done: asyncio.Future[Any]) -> Reply:
            return answer(status_of(done))
        return finish(future) if future.done() else Deferred(future, finish)

    def _send_delayed_batch(self, conn: ServerConnection, frame: Frame, req: p.SendBatchRequest) -> Awaitable[Reply]:
        # Each message parks on its own (schedule or timer topic): the Python path, not the packed one.
        messages = [OutgoingMessage(body, None, (), props) for body, props in unpack_batch(frame.body, req.count)]
        sending = self.broker.send_processor

        def send() -> Reply:
            result = sending.send_batch(req.topic, messages, queue_id=req.queue_id, sharding_key=req.sharding_key,
                                        compressed=req.compressed, producer_group=req.producer_group,
                                        born_host=_peer_host(conn), delay_level=req.delay_level,
                                        deliver_at_ms=req.deliver_at_ms, delay_ms=req.delay_ms)
            offsets = b"".join(r.commitlog_offset.to_bytes(8, "little", signed=True) for r in result.results)
            first = result.results[0]
            return _reply(p.SendBatchResponse(
                str(result.status), result.topic, result.broker_name, result.queue_id, first.queue_offset,
                len(result.results), first.store_timestamp, self.broker.store.store_host,
                [r.queue_offset for r in result.results]), offsets)
        return _threaded(send)

    def _send_half(self, conn: ServerConnection, frame: Frame) -> Awaitable[Reply]:
        req = decode_header(frame, p.SendRequest)
        message = OutgoingMessage(bytes(frame.body), req.tags, tuple(req.keys), dict(req.properties), req.msg_id)
        if req.producer_group is None:
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, "a half message needs its producer_group")
        if req.compressed or req.delay_level is not None or req.deliver_at_ms is not None or req.delay_ms is not None:
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, "a half message cannot be compressed or delayed")
        transactions = self.broker.transaction_processor

        def send() -> Reply:
            answer = transactions.send_half(req.topic, message, req.producer_group,  # type: ignore[arg-type]
                                            queue_id=req.queue_id, sharding_key=req.sharding_key,
                                            born_timestamp=req.born_timestamp, born_host=_peer_host(conn))
            return _reply(p.SendResponse(answer["status"], answer["msg_id"], answer["offset_msg_id"], answer["topic"],
                                         answer["broker_name"], answer["queue_id"], answer["queue_offset"],
                                         answer["store_timestamp"], answer["transaction_id"]))
        return _threaded(send)

    def _end_transaction(self, conn: ServerConnection, frame: Frame) -> Awaitable[Reply]:
        req = decode_header(frame, p.EndTransactionRequest)
        transactions = self.broker.transaction_processor

        def end() -> Reply:
            answer = transactions.end_transaction(req.transaction_id, req.producer_group, req.action, req.from_check)
            sent = answer.get("send_result")
            send_result = None if sent is None else p.SendResponse(
                sent["status"], sent["msg_id"], sent["offset_msg_id"], sent["topic"], sent["broker_name"],
                sent["queue_id"], sent["queue_offset"], sent.get("store_timestamp", 0))
            return _reply(p.EndTransactionResponse(answer["transaction_id"], answer["action"], send_result))
        return _threaded(end)

    # -- pulls ----------------------------------------------------------------------------
    async def _pull(self, conn: ServerConnection, frame: Frame) -> Reply:
        req = decode_header(frame, p.PullRequest)
        result = await self.broker.pull_processor.pull_packed(
            req.topic, req.queue_id, req.offset, req.max_count, req.tags, wait_ms=req.wait_ms, group=req.group,
            commit_offset=req.commit_offset, filter_type=req.filter_type, expression=req.expression,
            client_id=req.client_id)
        return _reply(p.PullResponse(str(result.status), result.next_offset, result.min_offset, result.max_offset,
                                     result.count), result.data)

    def _queue_offsets(self, conn: ServerConnection, frame: Frame) -> Reply:
        req = decode_header(frame, p.QueueOffsetsRequest)
        answer = self.broker.pull_processor.queue_offsets(req.topic, req.queue_id, req.timestamp)
        return _reply(p.QueueOffsetsResponse(answer["min_offset"], answer["max_offset"], answer.get("offset")))

    # -- clients, groups, offsets ---------------------------------------------------------
    def _heartbeat(self, conn: ServerConnection, frame: Frame) -> Reply:
        req = decode_header(frame, p.HeartbeatRequest)
        consumers = [ConsumerData(c.group, c.consume_type, c.message_model, c.consume_from_where,
                                  tuple(Subscription(s.topic, s.expression, s.type) for s in c.subscriptions),
                                  tuple(c.held_queues))
                     for c in req.consumers]
        versions = self.broker.consumer_processor.heartbeat(req.client_id, req.producer_groups, consumers)
        self._bind(req.client_id, conn)
        for group in req.producer_groups:
            self._push_pending_checks(group)
        return _reply(p.HeartbeatResponse(versions))

    def _unregister(self, conn: ServerConnection, frame: Frame) -> Reply:
        req = decode_header(frame, p.UnregisterRequest)
        versions = self.broker.consumer_processor.unregister_client(req.client_id, req.producer_groups,
                                                                    req.consumer_groups)
        return _reply(p.HeartbeatResponse(versions))

    def _commit_offsets(self, conn: ServerConnection, frame: Frame) -> Reply:
        req = decode_header(frame, p.CommitOffsetsRequest)
        committed = self.broker.consumer_processor.commit_offsets(
            req.group, [(e.topic, e.queue_id, e.offset) for e in req.offsets])
        return _reply(p.CommitOffsetsResponse(committed))

    def _query_offset(self, conn: ServerConnection, frame: Frame) -> Reply:
        req = decode_header(frame, p.QueryOffsetRequest)
        return _reply(p.QueryOffsetResponse(self.broker.consumer_processor.query_offset(req.group, req.topic,
                                                                                        req.queue_id)))

    def _group_info(self, conn: ServerConnection, frame: Frame) -> Reply:
        req = decode_header(frame, p.GroupInfoRequest)
        info = self.broker.consumer_processor.group_info(req.group)
        # The whole view, as GET /consumers/{group} answers it: admin clients read groups over remoting too.
        return _reply(p.GroupInfoResponse(
            info.group, info.version, list(info.members), _text(info.message_model), _text(info.consume_type),
            _text(info.consume_from_where),
            [p.SubscriptionData(s.topic, s.expression, str(s.type)) for s in info.subscriptions], info.clients))

    def _lock_queues(self, conn: ServerConnection, frame: Frame) -> Reply:
        req = decode_header(frame, p.LockRequest)
        held = self.broker.consumer_processor.lock_queues(req.group, req.client_id,
                                                          [(q.topic, q.queue_id) for q in req.queues])
        return _reply(p.LockResponse([p.QueueRefData(t, q) for t, q in held]))

    def _unlock_queues(self, conn: ServerConnection, frame: Frame) -> Reply:
        req = decode_header(frame, p.LockRequest)
        released = self.broker.consumer_processor.unlock_queues(req.group, req.client_id,
                                                                [(q.topic, q.queue_id) for q in req.queues])
        return _reply(p.LockResponse([p.QueueRefData(t, q) for t, q in released]))

    def _send_back(self, conn: ServerConnection, frame: Frame) -> Awaitable[Reply]:
        req = decode_header(frame, p.SendBackRequest)
        sending = self.broker.send_processor

        def send_back() -> Reply:
            answer = sending.send_back(req.group, req.offset_msg_id, delay_level=req.delay_level, reason=req.reason,
                                       max_reconsume_times=req.max_reconsume_times)
            return _reply(p.SendBackResponse(answer["status"], answer["topic"], answer["delay_level"],
                                             answer["reconsume_times"], answer["msg_id"], answer["offset_msg_id"]))
        return _threaded(send_back)

    def _post_trace(self, conn: ServerConnection, frame: Frame) -> Reply:
        req = decode_header(frame, p.PostTraceRequest)
        answer = self.broker.query_processor.record_trace(req.events)
        return _reply(p.PostTraceResponse(answer["accepted"], answer["dropped"], answer["enabled"]))

    # -- pushes ---------------------------------------------------------------------------
    def _bind(self, client_id: str, conn: ServerConnection) -> None:
        with self._lock:
            previous = self._bound.get(client_id)
            if previous is conn:
                return
            self._bound[client_id] = conn
        conn.attributes[_CLIENT_ID] = client_id
        conn.on_close(lambda c, cid=client_id: self._unbind(cid, c))

    def _unbind(self, client_id: str, conn: ServerConnection) -> None:
        with self._lock:
            if self._bound.get(client_id) is conn:
                del self._bound[client_id]

    def connection_of(self, client_id: str) -> ServerConnection | None:
        """The live connection ``client_id`` heartbeats on, if any."""
        with self._lock:
            conn = self._bound.get(client_id)
        return None if conn is None or conn.closed else conn

    def _on_group_change(self, group: str, version: int) -> None:
        # Any thread (a heartbeat, the expiry scan, an admin reset): push() is thread-safe.
        notice = _encode(p.GroupChangedNotice(group, version))
        for member in self.broker.clients.members(group):
            conn = self.connection_of(member)
            if conn is not None:
                conn.push(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, notice)

    def _on_offset_reset(self, group: str, topic: str, offsets: dict[int, int]) -> None:
        notice = _encode(p.OffsetResetNotice(group, topic, self.broker.name, offsets))
        for member in self.broker.clients.members(group):
            conn = self.connection_of(member)
            if conn is not None:
                conn.push(RequestCode.NOTIFY_OFFSET_RESET, notice)

    def _on_check_offered(self, producer_group: str) -> None:
        self._push_pending_checks(producer_group)

    def _push_pending_checks(self, producer_group: str) -> None:
        """Hand the group's pending check-backs to one live producer connection (else they wait for a poller)."""
        conns = [c for cid in self.broker.clients.producer_groups().get(producer_group, ())
                 if (c := self.connection_of(cid)) is not None]
        if not conns:
            return
        for check in self.broker.checks.take(producer_group):
            conns[hash(check.transaction_id) % len(conns)].push(RequestCode.CHECK_TRANSACTION_STATE,
                                                                _encode(_check_notice(check)))


# -- what each request code needs with ACL on (docs/security.md) ------------------------------------------
def _sub_topic(topic: str) -> Need:
    return (Action.SUB, Resource.topic(topic))


def _sub_group(group: str) -> Need:
    return (Action.SUB, Resource.group(group))


def _pub_needs(frame: Frame, kind: type[p.SendRequest] | type[p.SendBatchRequest]) -> list[Need]:
    return [(Action.PUB, Resource.topic(decode_header(frame, kind).topic))]


def _pull_needs(frame: Frame) -> list[Need]:
    req = decode_header(frame, p.PullRequest)
    return [_sub_topic(req.topic)] + ([_sub_group(req.group)] if req.group else [])


def _heartbeat_needs(frame: Frame) -> list[Need]:
    req = decode_header(frame, p.HeartbeatRequest)
    return [n for c in req.consumers for n in [_sub_group(c.group)] + [_sub_topic(s.topic) for s in c.subscriptions]]


def _commit_needs(frame: Frame) -> list[Need]:
    req = decode_header(frame, p.CommitOffsetsRequest)
    return [_sub_group(req.group)] + [_sub_topic(e.topic) for e in req.offsets]


def _lock_needs(frame: Frame) -> list[Need]:
    req = decode_header(frame, p.LockRequest)
    return [_sub_group(req.group)] + [_sub_topic(q.topic) for q in req.queues]


def _query_offset_needs(frame: Frame) -> list[Need]:
    req = decode_header(frame, p.QueryOffsetRequest)
    return [_sub_group(req.group), _sub_topic(req.topic)]


#: Request code -> the (action, resource) pairs it needs; a code absent here (POST_TRACE) needs a signed user.
_REMOTING_NEEDS: dict[int, Callable[[Frame], list[Need]]] = {
    RequestCode.SEND_MESSAGE: lambda f: _pub_needs(f, p.SendRequest),
    RequestCode.SEND_HALF: lambda f: _pub_needs(f, p.SendRequest),
    RequestCode.SEND_BATCH: lambda f: _pub_needs(f, p.SendBatchRequest),
    RequestCode.END_TRANSACTION: lambda f: [(Action.PUB, Resource.group(
        decode_header(f, p.EndTransactionRequest).producer_group))],
    RequestCode.PULL_MESSAGE: _pull_needs,
    RequestCode.QUEUE_OFFSETS: lambda f: [_sub_topic(decode_header(f, p.QueueOffsetsRequest).topic)],
    RequestCode.HEARTBEAT: _heartbeat_needs,
    RequestCode.UNREGISTER_CLIENT: lambda f: [_sub_group(g) for g in
                                              decode_header(f, p.UnregisterRequest).consumer_groups],
    RequestCode.COMMIT_OFFSETS: _commit_needs,
    RequestCode.QUERY_OFFSET: _query_offset_needs,
    RequestCode.GROUP_INFO: lambda f: [_sub_group(decode_header(f, p.GroupInfoRequest).group)],
    RequestCode.LOCK_QUEUES: _lock_needs,
    RequestCode.UNLOCK_QUEUES: _lock_needs,
    RequestCode.SEND_BACK: lambda f: [_sub_group(decode_header(f, p.SendBackRequest).group)],
}


def _check_notice(check: CheckRequest) -> p.TransactionCheckNotice:
    return p.TransactionCheckNotice(check.producer_group, check.transaction_id, check.topic, check.transaction_id,
                                    check.half_offset_msg_id, check.check_times, check.body, dict(check.properties))


def _batch_reply(result: Any, status: Any = None) -> Reply:
    return _reply(p.SendBatchResponse(str(status or result.status), result.topic, result.broker_name,
                                      result.queue_id, result.first_queue_offset, result.count,
                                      result.store_timestamp, result.store_host), result.offsets)


async def _threaded(fn: Callable[[], Reply]) -> Reply:
    """Run a call that may block (a disk sync, an fsync'ing admin change) off the event loop."""
    return await anyio.to_thread.run_sync(fn)
