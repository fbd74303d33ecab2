"""The producer: sync, async, one-way and batch sends, over remoting where a broker serves it (else HTTP).

* Routing: the write queues of every broker in the topic's route, round-robin, skipping
  brokers the latency fault tolerance marks (:mod:`.fault`).  A topic no name server
  knows yet is sent to every master (the broker auto-creates it), until its route appears.
* Retries: a failed send is retried ``retry_times`` (2) more times on another broker, all
  within ``send_timeout_s`` (3 s).  Only failures that another broker might not have are
  retried (unreachable, unavailable, topic missing or read-only there); a bad message is not.
  While no live master has a writable queue, or a broker name has no master (a DLedger leadership
  moving), the route is asked for again and awaited within that budget.  The decisions are
  :mod:`.send_retry`'s, shared with :class:`~.aio.AsyncProducer`.
* Ordered sends (a ``sharding_key`` or a ``queue_selector``) go to one queue and are never
  retried elsewhere -- that would reorder them -- nor on the same queue, where a retry after a
  timeout could store the message twice out of order.  This is RocketMQ's behaviour.
* Bodies larger than ``compress_threshold`` (4 KiB) are zlib-compressed (level 5) and sent
  with ``compressed: true``; the broker sets the COMPRESSED sys flag and consumers inflate.
  A batch carries one flag: it is compressed when its largest body is above the threshold.
* Over remoting a batch is packed by the native encoder (``encode_batch``: ids, properties and
  validation in C) and its results come back packed; :class:`BatchSendResults` builds each
  :class:`SendResult` only when asked for.
* The message's unique id (``msg_id``) is made here and kept across retries, so a message
  stored twice by a retry after a timeout carries the same id both times.

Example::

    producer = Producer("pg", ClientConfig(namesrv_addrs="127.0.0.1:9876"))
    producer.start()
    result = producer.send(Message("orders", b"hello", tags="TagA"))
    producer.shutdown()
"""
from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from ...storage_native import StoreError, encode_batch
from ..common import protocol
from ..common.errors import ErrorCode, SparkMQError
from ..common.ids import UniqueIdGenerator, offset_msg_id_prefix
from ..common.message import BODY_TYPES, Message, SendResult, SendStatus, send_status
from ..common.trace import TraceEvent
from ..common.validation import check_int, validate_group, validate_topic
from ..common.wire import SendRow, encode_body, send_rows_to_arrow, to_ipc
from .accumulator import Accumulator, BatchedFuture
from .allocation import MessageQueue
from .broker_remoting import (
    RemotingBrokerClient,
    decode_packed,
    delay_properties,
    packed_ext,
    properties_text,
    send_ext,
)
from .config import ClientConfig
from .fault import LatencyFaultTolerance, QueueSelector
from .remoting import BrokerClientPool, NameServerClient, RemotingError
from .routes import TopicRouteCache, TopicRouteInfo
from .scheduler import Scheduler
from .send_retry import BROKER_FAULT_CODES, BUSY_BACKOFF, RETRYABLE_CODES, Failover, OrderedQueue, RetryPolicy
from .trace import TraceDispatcher

__all__ = [
    "Producer",
    "SendResult",
    "SendStatus",
    "QueueSelectorFn",
    "SendCallback",
    "RETRYABLE_CODES",
    "BROKER_FAULT_CODES",
    "select_by_sharding_key",
    "BatchSendResults",
]

log = logging.getLogger("sparkmq.client")


#: ``queue_selector(write_queues, message) -> queue``: user-chosen queue for ordered sends.
QueueSelectorFn = Callable[[Sequence[MessageQueue], Message], MessageQueue]
#: ``callback(result, error)`` of :meth:`Producer.send_async`: exactly one of them is None.
SendCallback = Callable[[SendResult | None, BaseException | None], None]


def select_by_sharding_key(queues: Sequence[MessageQueue], sharding_key: str) -> MessageQueue:
    """The queue a sharding key maps to: CRC-32 of the key modulo the number of queues (same in every process).

    Example::

        >>> qs = [MessageQueue("t", "broker-a", i) for i in range(4)]
        >>> select_by_sharding_key(qs, "order-1") == select_by_sharding_key(list(reversed(qs)), "order-1")
        True
    """
    ordered = sorted(queues)
    return ordered[zlib.crc32(sharding_key.encode("utf-8")) % len(ordered)]


def _schedule_fields(delay_level: int | None, deliver_at_ms: int | None, delay_ms: int | None) -> dict[str, Any]:
    """The send-body fields of a delayed or timer message; INVALID_ARGUMENT for more than one or a bad value.

    Example::

        >>> _schedule_fields(3, None, None)
        {'delay_level': 3}
    """
    given = {k: v for k, v in (("delay_level", delay_level), ("deliver_at_ms", deliver_at_ms),
                               ("delay_ms", delay_ms)) if v is not None}
    if len(given) > 1:
        raise SparkMQError(ErrorCode.INVALID_ARGUMENT, f"give one of delay_level, deliver_at_ms, delay_ms, not "
                                                       f"{sorted(given)}")
    for name, value in given.items():
        check_int(name, value, 1 if name == "delay_level" else 0)
    return given


def check_batch(msgs: Sequence[Message], max_message_size: int, compress_threshold: int) -> tuple[str, bool]:
    """(the topic of a batch, whether its bodies are compressed) in one pass over it: MESSAGE_ILLEGAL unless it
    holds Messages of one valid topic, MESSAGE_TOO_LARGE for a body over ``max_message_size``.  A batch
    compresses all its bodies or none: all when its largest is above ``compress_threshold``.  (Bodies that are
    not bytes are refused by the encoder.)"""
    if not msgs:
        raise SparkMQError(ErrorCode.MESSAGE_ILLEGAL, "a batch needs at least one message")
    topic = getattr(msgs[0], "topic", None)
    largest = 0
    for m in msgs:
        if not isinstance(m, Message) or m.topic != topic:
            raise SparkMQError(ErrorCode.MESSAGE_ILLEGAL, "a batch holds Messages of one topic")
        body = m.body
        if isinstance(body, BODY_TYPES) and len(body) > largest:
            largest = len(body)
    if largest > max_message_size:
        raise SparkMQError(ErrorCode.MESSAGE_TOO_LARGE, f"a body is {largest} bytes, the limit is {max_message_size}")
    return validate_topic(topic), largest > compress_threshold


def check_body(body: object, max_message_size: int) -> None:
    """MESSAGE_ILLEGAL unless ``body`` is non-empty bytes, MESSAGE_TOO_LARGE above ``max_message_size``."""
    if not isinstance(body, BODY_TYPES) or len(body) == 0:
        raise SparkMQError(ErrorCode.MESSAGE_ILLEGAL, "the body must be non-empty bytes (encode text first)")
    if len(body) > max_message_size:
        raise SparkMQError(ErrorCode.MESSAGE_TOO_LARGE,
                           f"the body is {len(body)} bytes, the limit is {max_message_size}")


@dataclass(slots=True)
class _Prepared:
    """A validated message ready to go on the wire (body already compressed if it should be)."""

    topic: str
    msg_id: str
    body: bytes
    compressed: bool
    message: Message
    #: Extra send-body fields: ``delay_level`` / ``deliver_at_ms`` / ``delay_ms``.
    extra: dict[str, Any] = field(default_factory=dict)


class BatchSendResults(Sequence[SendResult]):
    """The results of a batch stored in one queue, built one by one when read (a batch answer comes packed)."""

    __slots__ = ("_answer", "_ids", "_offsets", "_prefix", "_status", "_queue_offsets")

    def __init__(self, answer: protocol.SendPackedResponseHeader, msg_ids: Sequence[str], offsets: bytes) -> None:
        self._answer = answer
        self._ids = msg_ids
        self._offsets = memoryview(offsets).cast("q")
        self._prefix: str | None = None
        self._status: SendStatus | None = None
        self._queue_offsets: list[int] | None = None

    def __len__(self) -> int:
        return len(self._ids)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        a = self._answer
        if self._status is None:  # once per batch, not per message
            self._prefix = offset_msg_id_prefix(a.storeHost)
            self._status = send_status(a.status)
            if a.queueOffsets:  # a delayed batch: each message parked on its own
                self._queue_offsets = [int(o) for o in a.queueOffsets.split(",")]
        i = range(len(self))[index]
        queue_offset = self._queue_offsets[i] if self._queue_offsets is not None else a.queueOffset + i
        offset = self._offsets[i]
        return SendResult(self._status, self._ids[i], f"{self._prefix}{offset:016X}", a.topic,
                          a.brokerName, a.queueId, queue_offset, a.storeTimestamp, offset)

    def __eq__(self, other: object) -> bool:
        return list(self) == list(other) if isinstance(other, Sequence) else NotImplemented

    # Concatenation makes a list, as it did when batches answered one (``results + more_results``).
    def __add__(self, other: Sequence[SendResult]) -> list[SendResult]:
        return [*self, *other] if isinstance(other, Sequence) else NotImplemented

    def __radd__(self, other: Sequence[SendResult]) -> list[SendResult]:
        return [*other, *self] if isinstance(other, Sequence) else NotImplemented

    def __repr__(self) -> str:
        return f"BatchSendResults({len(self)} messages on {self._answer.brokerName}/{self._answer.queueId})"


def _outcome(future: concurrent.futures.Future[SendResult]) -> tuple[SendResult | None, BaseException | None]:
    """``(result, None)`` or ``(None, error)`` of a done future; a batched one is read without its lock."""
    if type(future) is BatchedFuture:
        outcome = future.outcome()
        if outcome is not None:
            return outcome
    error = future.exception()
    return (None if error else future.result()), error


class Producer:
    """Sends messages of one producer group.  Thread-safe; start it before sending, shut it down after.

    Args:
        group: the producer group (reported in heartbeats, stored with each message).
        config: the client settings (name servers, timeouts, retries, compression).
        transport: an httpx transport for every request (tests pass ``httpx.MockTransport``).
    """

    def __init__(self, group: str, config: ClientConfig, *, transport: httpx.BaseTransport | None = None) -> None:
        self.group = validate_group(group)
        self.config = config
        self.client_id = config.new_client_id()
        self._namesrv = NameServerClient(config.namesrv_addrs, config.request_timeout_s, transport=transport,
                                         credentials=config.credentials, tls=config.tls_settings)
        self._routes = TopicRouteCache(self._namesrv, miss_retry_s=config.route_miss_retry_s)
        self._brokers = BrokerClientPool(config.request_timeout_s, transport=transport,
                                         remoting=config.transport == "remoting", credentials=config.credentials,
                                         tls=config.tls_settings)
        self.fault = LatencyFaultTolerance()
        self._selector = QueueSelector(self.fault if config.send_latency_fault_enable else None)
        self._ids = UniqueIdGenerator()
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._batcher: Accumulator | None = None
        self._valid_topics: set[str] = set()
        self._scheduler = Scheduler(f"producer-{group}")
        self._state_lock = threading.Lock()
        self._state = "created"
        self._met_addrs: set[str] = set()  # masters this producer has sent to (heartbeat them at once)
        self._retries = RetryPolicy(config, self._selector, self.fault)
        #: ``send`` trace events, posted in batches to the broker that stored each message.
        self._tracer = TraceDispatcher(self._brokers, f"producer-{group}") if config.trace_enabled else None

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> Producer:
        """Start the periodic work (route refresh, heartbeats, fault probes); returns self."""
        with self._state_lock:
            if self._state != "created":
                raise SparkMQError(ErrorCode.SERVICE_NOT_AVAILABLE, f"producer {self.group} is {self._state}")
            self._executor = concurrent.futures.ThreadPoolExecutor(self.config.async_send_threads,
                                                                   thread_name_prefix=f"sparkmq-send-{self.group}")
            if self.config.async_batching:
                self._batcher = Accumulator(self._send_batch_lazily, self._executor, starter=self._start_batch,
                                            max_messages=self.config.batch_max_messages,
                                            max_bytes=self.config.batch_max_bytes,
                                            linger_s=self.config.linger_ms / 1000,
                                            buffer_bytes=self.config.buffer_memory_bytes,
                                            max_block_s=self.config.max_block_ms / 1000,
                                            max_in_flight=min(self.config.max_in_flight_batches,
                                                              self.config.async_send_threads),
                                            name=f"sparkmq-batcher-{self.group}")
            cfg = self.config
            self._scheduler.every("routes", cfg.route_refresh_interval_s, self._routes.refresh_all,
                                  initial_delay_s=cfg.route_refresh_interval_s)
            self._scheduler.every("heartbeat", cfg.heartbeat_interval_s, self.send_heartbeats,
                                  initial_delay_s=cfg.heartbeat_interval_s)
            if cfg.send_latency_fault_enable:
                self._scheduler.every("fault-detect", cfg.fault_detect_interval_s, self._probe_isolated,
                                      initial_delay_s=cfg.fault_detect_interval_s)
            self._scheduler.start()
            if self._tracer is not None:
                self._tracer.start()
            self._state = "running"
        return self

    def shutdown(self) -> None:
        """Finish queued async / one-way sends, stop periodic work, unregister from brokers, close connections."""
        with self._state_lock:
            if self._state != "running":
                self._state = "stopped"
                return
            self._state = "stopping"
        if self._batcher is not None:
            self._batcher.close()  # what waits goes out before the executor stops
        if self._executor is not None:
            self._executor.shutdown(wait=True)
        if self._tracer is not None:
            self._tracer.shutdown()  # posts the last events while the connections are still open
        self._scheduler.stop()
        for addr in self._known_addrs():
            try:
                self._brokers.get(addr).unregister(self.client_id, producer_groups=[self.group])
            except SparkMQError as exc:
                log.debug("unregistering producer %s from %s failed: %s", self.group, addr, exc)
        self._brokers.close()
        self._namesrv.close()
        with self._state_lock:
            self._state = "stopped"

    def __enter__(self) -> Producer:
        return self.start() if self._state == "created" else self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def _check_running(self) -> None:
        if self._state != "running":
            raise SparkMQError(ErrorCode.SERVICE_NOT_AVAILABLE, f"producer {self.group} is {self._state}, not running")

    # -- preparing ---------------------------------------------------------------------------
    def _prepare(self, msg: Message, compress: bool | None = None) -> _Prepared:
        """Validate ``msg`` and compress its body (above the threshold, or as ``compress`` says)."""
        if not isinstance(msg, Message):
            raise SparkMQError(ErrorCode.MESSAGE_ILLEGAL, f"expected a Message, got {type(msg).__name__}")
        topic = validate_topic(msg.topic)
        check_body(msg.body, self.config.max_message_size)
        body = bytes(msg.body)
        compressed = len(body) > self.config.compress_threshold if compress is None else compress
        if compressed:
            body = zlib.compress(body, self.config.compress_level)
        return _Prepared(topic, self._ids.next_id(int(time.time() * 1000)), body, compressed, msg)

    def _payload(self, p: _Prepared, mq: MessageQueue, sharding_key: str | None) -> dict[str, Any]:
        m = p.message
        return {"body": encode_body(p.body), "body_encoding": "base64", "tags": m.tags, "keys": list(m.keys),
                "properties": dict(m.properties), "queue_id": mq.queue_id, "sharding_key": sharding_key,
                "compressed": p.compressed, "producer_group": self.group, "born_timestamp": int(time.time() * 1000),
                "born_host": None, "msg_id": p.msg_id, **p.extra}

    def _send_ext(self, p: _Prepared, mq: MessageQueue, born_ms: int) -> dict[str, str]:
        """SEND_MESSAGE_V2's extFields: tags, keys, the unique id and a delay travel in the properties string."""
        m = p.message
        props = properties_text(m.properties, tags=m.tags, keys=m.keys, msg_id=p.msg_id,
                                extra=delay_properties(**p.extra) if p.extra else None)
        return send_ext(self.group, p.topic, mq.queue_id, props, born_timestamp=born_ms, flag=m.flag,
                        compressed=p.compressed)

    # -- queue choice and the retry loop -----------------------------------------------------
    def _route(self, topic: str) -> TopicRouteInfo:
        route = self._routes.get(topic, allow_default=True)
        if not route.write_queues:
            raise SparkMQError(ErrorCode.NO_PERMISSION, f"topic {topic!r} has no writable queue on any live master")
        return route

    def _ordered_queue(self, route: TopicRouteInfo, msg: Message, sharding_key: str | None,
                       queue_selector: QueueSelectorFn | None) -> MessageQueue:
        queues = list(route.write_queues)
        if queue_selector is not None:
            mq = queue_selector(queues, msg)
            if mq not in queues:
                raise SparkMQError(ErrorCode.QUEUE_ID_ILLEGAL, f"the queue selector chose {mq!r}, not a write queue")
            return mq
        assert sharding_key is not None
        return select_by_sharding_key(queues, sharding_key)

    def _with_retries(self, topic: str, timeout: float | None, ordered_queue: OrderedQueue | None,
                      attempt_fn: Callable[[str, MessageQueue, float], Any]) -> Any:
        """Run ``attempt_fn(addr, queue, time_left)`` until it succeeds, retrying on other brokers (the decisions
        are :mod:`.send_retry`'s, shared with the asyncio producer)."""
        attempts = self._retries.begin(topic, timeout, ordered_queue)
        for _ in attempts:
            step = attempts.next_step(self._routes.get(topic, allow_default=True))
            if isinstance(step, Failover):
                self._fail_over(topic, step)
                continue
            if step.addr not in self._met_addrs:
                # A broker first met: tell it about this producer now, not at the next period.
                self._met_addrs.add(step.addr)
                self._scheduler.trigger("heartbeat")
            try:
                result = attempt_fn(step.addr, step.queue, step.time_left)
            except SparkMQError as exc:
                self._fail_over(topic, attempts.failed(step, exc))
                continue
            attempts.succeeded(step)
            return result
        raise attempts.give_up()

    def _fail_over(self, topic: str, failover: Failover | None) -> None:
        """Ask for ``topic``'s route again and pause, as ``failover`` says."""
        if failover is None:
            return
        if failover.refresh:
            self._refresh_route_quietly(topic)
        if pause_s := failover.pause_s():
            time.sleep(pause_s)

    def _refresh_route_quietly(self, topic: str) -> None:
        try:
            self._routes.refresh(topic)
        except SparkMQError:
            pass

    def _check_batchable(self, msg: Message) -> None:
        """What must be refused at the call, not in the future: the rest is checked when the batch is packed."""
        if not isinstance(msg, Message):
            raise SparkMQError(ErrorCode.MESSAGE_ILLEGAL, f"expected a Message, got {type(msg).__name__}")
        if msg.topic not in self._valid_topics:
            validate_topic(msg.topic)
            self._valid_topics.add(msg.topic)
        check_body(msg.body, self.config.max_message_size)

    # -- sends -------------------------------------------------------------------------------
    def send(self, msg: Message, timeout: float | None = None, *, sharding_key: str | None = None,
             queue_selector: QueueSelectorFn | None = None, delay_level: int | None = None,
             deliver_at_ms: int | None = None, delay_ms: int | None = None) -> SendResult:
        """Send one message and wait until a broker stored it.

        ``timeout`` (seconds, default ``send_timeout_s``) bounds all attempts together.  With a
        ``sharding_key`` (messages with equal keys go to one queue, in order) or a
        ``queue_selector`` the send is ordered: one queue, no retry.  Raises ``SparkMQError``
        (the last attempt's error when every attempt failed).

        Scheduled delivery (at most one of them): ``delay_level`` (1..18: 1s 5s 10s 30s 1m ... 2h),
        ``deliver_at_ms`` (epoch ms) or ``delay_ms`` (a timer message, recallable with
        :meth:`AdminClient.recall_timer` while pending).  The result's queue and offset are then
        those of the parked copy (``SCHEDULE_TOPIC_XXXX`` / ``rmq_sys_wheel_timer``).
        """
        self._check_running()
        prepared = self._prepare(msg)
        prepared.extra = _schedule_fields(delay_level, deliver_at_ms, delay_ms)
        return self._send_prepared(prepared, timeout, sharding_key, queue_selector)

    def _send_prepared(self, prepared: _Prepared, timeout: float | None, sharding_key: str | None,
                       queue_selector: QueueSelectorFn | None, *, retries: bool = True) -> SendResult:
        ordered = None
        if sharding_key is not None or queue_selector is not None:
            def ordered(route: TopicRouteInfo) -> MessageQueue:
                return self._ordered_queue(route, prepared.message, sharding_key, queue_selector)
        elif not retries:
            def ordered(route: TopicRouteInfo) -> MessageQueue:
                return self._selector.select(route.write_queues)

        born_ms = int(time.time() * 1000)
        begin = time.monotonic()

        def attempt(addr: str, mq: MessageQueue, left: float) -> SendResult:
            client = self._brokers.get(addr)
            if isinstance(client, RemotingBrokerClient):
                result = client.send_message(self._send_ext(prepared, mq, born_ms), prepared.body,
                                             msg_id=prepared.msg_id, broker_name=mq.broker_name, timeout=left)
            else:
                result = SendResult.from_dict(client.send(prepared.topic, self._payload(prepared, mq, sharding_key),
                                                          timeout=left))
            self._trace_send(addr, prepared.message, result, born_ms, begin)
            return result

        return self._with_retries(prepared.topic, timeout, ordered, attempt)

    def _trace_send(self, addr: str, message: Message, result: SendResult, born_ms: int, begin: float) -> None:
        """A ``send`` trace event: when the send began, what it cost (retries included), where it went."""
        if self._tracer is None or not result.msg_id:
            return
        self._tracer.record(addr, TraceEvent(
            result.msg_id, result.topic, "send", str(result.status), born_ms, group=self.group,
            client_id=self.client_id, cost_ms=int((time.monotonic() - begin) * 1000), born_ts=born_ms,
            store_ts=result.store_timestamp or None, broker=result.broker_name, queue_id=result.queue_id,
            queue_offset=result.queue_offset, tags=message.tags, keys=" ".join(message.keys) or None))

    def send_async(self, msg: Message, callback: SendCallback | None = None, timeout: float | None = None, *,
                   sharding_key: str | None = None, queue_selector: QueueSelectorFn | None = None,
                   delay_level: int | None = None, deliver_at_ms: int | None = None,
                   delay_ms: int | None = None) -> concurrent.futures.Future[SendResult]:
        """Send on the producer's pool; returns a future of the :class:`SendResult`.

        Unordered, undelayed messages without their own timeout are gathered per topic into
        batches (``async_batching``; see :mod:`.accumulator`), so per-message calls are as fast as
        batches; their ``callback`` may run on the client's I/O thread and must not block (as Kafka's).
        The message is validated now (bad input raises here, not in the future).  ``callback`` is
        called with ``(result, None)`` or ``(None, error)`` when the send finishes.  Scheduled
        delivery as for :meth:`send`.
        """
        self._check_running()
        batcher = self._batcher
        if (batcher is not None and sharding_key is None and queue_selector is None and timeout is None
                and delay_level is None and deliver_at_ms is None and delay_ms is None):
            self._check_batchable(msg)
            future = batcher.add(msg)
        else:
            prepared = self._prepare(msg)
            prepared.extra = _schedule_fields(delay_level, deliver_at_ms, delay_ms)
            assert self._executor is not None
            future = self._executor.submit(self._send_prepared, prepared, timeout, sharding_key, queue_selector)
        if callback is not None:
            def done(f: concurrent.futures.Future[SendResult]) -> None:
                result, error = _outcome(f)
                try:
                    callback(result, error)
                except Exception:  # a failing callback must not disappear silently
                    log.exception("send callback failed")
            future.add_done_callback(done)
        return future

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every ``send_async`` message so far was sent or failed (Kafka's ``flush``); False at the
        timeout.  Their futures are done then."""
        self._check_running()
        return self._batcher.flush(timeout) if self._batcher is not None else True

    def send_oneway(self, msg: Message, *, sharding_key: str | None = None,
                    queue_selector: QueueSelectorFn | None = None) -> None:
        """Send without waiting for (or reporting) the outcome: one attempt, no retry, errors only logged.

        The request still goes out on the producer's pool; :meth:`shutdown` waits for queued ones.
        """
        self._check_running()
        prepared = self._prepare(msg)
        assert self._executor is not None

        def run() -> None:
            try:
                self._send_prepared(prepared, None, sharding_key, queue_selector, retries=False)
            except Exception as exc:  # one-way: nobody to tell
                log.warning("one-way send to %s failed: %s", prepared.topic, exc)

        self._executor.submit(run)

    def send_batch(self, msgs: Sequence[Message], timeout: float | None = None, *, sharding_key: str | None = None,
                   queue_selector: QueueSelectorFn | None = None, arrow: bool = False) -> Sequence[SendResult]:
        """Send messages of one topic to one queue in one request (consecutive offsets); one result per message
        (over remoting a sequence that makes each :class:`SendResult` when it is read: the answer comes packed).

        ``arrow=True`` sends an Arrow IPC stream of ``SEND_SCHEMA`` over HTTP (the broker then makes the
        message ids).  A batch whose largest body exceeds ``compress_threshold`` has every body
        compressed.  Retries and ordering are as for :meth:`send`.
        """
        return self._send_batch(msgs, timeout, sharding_key, queue_selector, arrow)

    def _send_batch_lazily(self, msgs: Sequence[Message]) -> Sequence[SendResult]:
        """A batch of ``send_async`` messages: the results stay packed until a future is asked for one."""
        return self._send_batch(msgs, None, None, None, False)

    def _send_batch(self, msgs: Sequence[Message], timeout: float | None, sharding_key: str | None,
                    queue_selector: QueueSelectorFn | None, arrow: bool,
                    packed_as: tuple[bytes, list[str]] | None = None) -> Sequence[SendResult]:
        self._check_running()
        topic, compress = check_batch(msgs, self.config.max_message_size, self.config.compress_threshold)
        born_ms = int(time.time() * 1000)
        begin = time.monotonic()
        # (data, msg ids): made once, sent again unchanged by a retry (given when a first try was made elsewhere)
        packed: list[Any] = [packed_as] if packed_as is not None else []
        prepared_once: list[list[_Prepared]] = []

        def prepared_messages() -> list[_Prepared]:
            if not prepared_once:
                prepared_once.append([self._prepare(m, compress) for m in msgs])
            return prepared_once[0]

        def packed_batch() -> tuple[bytes, list[str]]:
            if not packed:
                packed.append(self._pack(msgs, compress, born_ms))
            return packed[0]

        ordered = None
        if sharding_key is not None or queue_selector is not None:
            def ordered(route: TopicRouteInfo) -> MessageQueue:
                return self._ordered_queue(route, msgs[0], sharding_key, queue_selector)

        def attempt(addr: str, mq: MessageQueue, left: float) -> Sequence[SendResult]:
            client = self._brokers.get(addr)
            if isinstance(client, RemotingBrokerClient) and not arrow:
                data, ids = packed_batch()
                answer, offsets = client.send_packed(packed_ext(topic, len(ids), self.group, mq.queue_id, compress,
                                                                sharding_key=sharding_key), data, left)
                results: Sequence[SendResult] = BatchSendResults(answer, ids, offsets)
                if self._tracer is not None:
                    for m, result in zip(msgs, results, strict=False):
                        self._trace_send(addr, m, result, born_ms, begin)
                return results
            prepared = prepared_messages()
            params = {"queue_id": mq.queue_id, "sharding_key": sharding_key, "producer_group": self.group,
                      "compressed": "true" if compress else "false"}
            if arrow:  # an Arrow IPC batch is HTTP's: remoting has no request for it
                rows = [SendRow(p.body, p.message.tags, tuple(p.message.keys), dict(p.message.properties))
                        for p in prepared]
                reply = self._brokers.http(addr).send_batch(topic, params, arrow=to_ipc(send_rows_to_arrow(rows)),
                                                            timeout=left)
            else:
                reply = client.send_batch(topic, params, messages=[
                    {"body": encode_body(p.body), "body_encoding": "base64", "tags": p.message.tags,
                     "keys": list(p.message.keys), "properties": dict(p.message.properties), "msg_id": p.msg_id}
                    for p in prepared], timeout=left)
            status = send_status(reply.get("status"))
            results = [SendResult(status, str(r.get("msg_id", "")), str(r.get("offset_msg_id", "")), reply["topic"],
                                  reply["broker_name"], int(reply["queue_id"]), int(r["queue_offset"]),
                                  int(reply.get("store_timestamp") or 0)) for r in reply["results"]]
            for p, result in zip(prepared, results, strict=False):
                self._trace_send(addr, p.message, result, born_ms, begin)
            return results

        results = self._with_retries(topic, timeout, ordered, attempt)
        return results

    def _pack(self, msgs: Sequence[Message], compress: bool, born_ms: int) -> tuple[bytes, list[str]]:
        """The packed batch and its message ids (ids, properties and validation made by the native encoder)."""
        wire = [self._compressed_copy(m) for m in msgs] if compress else msgs
        try:
            data, ids, _ = self._ids.with_state(
                born_ms, lambda prefix, month, counter: encode_batch(wire, prefix, month, counter, born_ms))
        except StoreError as exc:  # the native encoder's validation: one stable code
            raise SparkMQError(ErrorCode[exc.code], exc.message) from None
        return data, ids

    def _start_batch(self, msgs: list[Message]) -> concurrent.futures.Future[Sequence[SendResult]] | None:
        """The first try of a ``send_async`` batch without blocking (the accumulator's fast path), or None.

        Over remoting to a known route the request goes out from the calling thread at once (no hop to a send
        thread); a failed try is retried by the blocking path with the same packed batch (same ids).  None
        (no cached route, an HTTP broker) sends the whole batch the blocking way.
        """
        topic = msgs[0].topic
        route = self._routes.cached(topic)
        if route is None or not route.write_queues:
            return None
        mq = self._selector.select(route.write_queues)
        addr = route.master_addr(mq.broker_name)
        client = self._brokers.get(addr) if addr is not None else None
        if not isinstance(client, RemotingBrokerClient) or addr not in self._met_addrs:
            return None  # a broker first met goes the blocking way, which heartbeats it
        compress = check_batch(msgs, self.config.max_message_size, self.config.compress_threshold)[1]
        born_ms = int(time.time() * 1000)
        data, ids = self._pack(msgs, compress, born_ms)
        begin = time.monotonic()
        sent = client.send_packed_future(packed_ext(topic, len(ids), self.group, mq.queue_id, compress), data,
                                         self.config.send_timeout_s)
        out: concurrent.futures.Future[Sequence[SendResult]] = concurrent.futures.Future()

        def done(f: concurrent.futures.Future[Any]) -> None:  # on the connection's loop: hand work off
            error = f.exception()
            if error is None:
                self.fault.update(mq.broker_name, (time.monotonic() - begin) * 1000)
                answer, offsets = decode_packed(f.result())
                out.set_result(BatchSendResults(answer, ids, offsets))
                return
            if isinstance(error, SparkMQError) and error.code in BROKER_FAULT_CODES:
                unreachable = isinstance(error, RemotingError) and not error.timed_out
                self.fault.update(mq.broker_name, (time.monotonic() - begin) * 1000, isolation=True,
                                  reachable=not unreachable)
            retryable = isinstance(error, SparkMQError) and error.code in RETRYABLE_CODES
            if not retryable:
                out.set_exception(error)
                return
            busy = isinstance(error, SparkMQError) and error.code is ErrorCode.SYSTEM_BUSY

            def retry() -> None:
                try:
                    if busy:  # back off before retrying
                        time.sleep(BUSY_BACKOFF.delay_s(0))
                    out.set_result(self._send_batch(msgs, None, None, None, False, packed_as=(data, ids)))
                except BaseException as exc:  # noqa: BLE001  # the batch's futures get it
                    out.set_exception(exc)
            try:
                assert self._executor is not None
                self._executor.submit(retry)
            except RuntimeError as exc:  # shutting down
                out.set_exception(exc)
        sent.add_done_callback(done)
        return out

    def _compressed_copy(self, m: Message) -> Message:
        if len(m.body) > self.config.max_message_size:
            raise SparkMQError(ErrorCode.MESSAGE_TOO_LARGE,
                               f"the body is {len(m.body)} bytes, the limit is {self.config.max_message_size}")
        return Message(m.topic, zlib.compress(bytes(m.body), self.config.compress_level), m.tags, m.keys,
                       m.properties, m.flag)

    # -- periodic work -----------------------------------------------------------------------
    def _known_addrs(self) -> list[str]:
        addrs: set[str] = set()
        for topic in self._routes.topics():
            route = self._routes.cached(topic)
            if route is not None:
                addrs.update(route.master_addrs())
        return sorted(addrs)

    def send_heartbeats(self) -> None:
        """Tell every master this producer sends to that it is alive (done every ``heartbeat_interval_s``)."""
        body = {"client_id": self.client_id, "producer_groups": [self.group], "consumers": []}
        for addr in self._known_addrs():
            try:
                self._brokers.get(addr).heartbeat(body)
            except SparkMQError as exc:
                log.debug("producer heartbeat to %s failed: %s", addr, exc)

    def _probe_isolated(self) -> None:
        # RocketMQ 5's detector: an isolated broker that answers again is usable again at once.
        for broker_name in self.fault.unreachable_brokers():
            addr = next((a for t in self._routes.topics() if (r := self._routes.cached(t))
                         and (a := r.master_addr(broker_name))), None)
            if addr is None:
                continue
            try:
                self._brokers.get(addr).ping(timeout=1.0)
            except SparkMQError:
                continue
            log.info("broker %s (%s) answers again; lifting its isolation", broker_name, addr)
            self.fault.remove(broker_name)

    def route(self, topic: str) -> TopicRouteInfo:
        """The route this producer uses for ``topic`` (fetched if needed)."""
        return self._route(topic)
