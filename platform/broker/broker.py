"""The broker controller: topic table, store, clients, offsets, locks, long polling, registration.

:class:`Broker` is what the HTTP app (``sparkmq.api.broker_app``) calls; it has no
HTTP in it, so tests and tools drive it in-process.  Every public method validates
its input first and raises :class:`~sparkmq.platform.common.errors.SparkMQError`
with a stable code, leaving nothing changed; a send's topic is auto-created only
after its message was stored.

Lifecycle: :meth:`Broker.start` loads the topic table, opens the store, restores
consumer offsets and starts the background threads (offset persist, client expiry,
name server registration, and on a master the delay-level, timer and transaction-check
services, whose due messages come back through :meth:`Broker._redeliver`).
:meth:`Broker.shutdown` stops accepting sends and pulls, releases held pulls, waits for
sends in flight, unregisters from the name servers, stops those services (persisting
their progress), persists offsets and closes the store -- in that order.
"""
from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio.to_thread
import pyarrow as pa

from ...storage_native import StoreError
from ..common.errors import ErrorCode, SparkMQError
from ..common.filtering import FILTER_SQL92, FILTER_TAG, MessageFilter, SqlFilter, compile_filter, parse_tags
from ..common.message import (
    KEY_SEPARATOR,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQUE_ID,
    Message,
    SendResult,
    SendStatus,
    StoredMessage,
)
from ..common.sysflag import COMPRESSED
from ..common.system_topics import (
    PROPERTY_DELAY_LEVEL,
    PROPERTY_DLQ_ORIGIN_TOPIC,
    PROPERTY_DLQ_REASON,
    PROPERTY_ORIGIN_MSG_ID,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_RETRY_TOPIC,
    PROPERTY_TIMER_DELAY_SEC,
    PROPERTY_TIMER_DELIVER_MS,
    TRACE_TOPIC,
    dlq_topic,
    retry_topic,
)
from ..common.validation import validate_group, validate_topic
from ..namesrv.perm import is_readable, is_writeable
from ..store import FlushMode, GetResult, GetStatus, MessageStore, PutResult, PutStatus
from ..store.message_store import iter_all
from .check_channel import CheckChannel
from .client_manager import ClientManager, ConsumerData, GroupInfo, MessageModel
from .config import BrokerConfig, BrokerRole
from .lake_index import DEFAULT_MAX_HITS, LakeIndex, lake_row_to_stored
from .locks import QueueLockManager, QueueRef
from .long_polling import PullHoldService
from .metrics import BrokerMetrics
from .offsets import CONSUMER_OFFSETS_TABLE, ConsumerOffsetManager
from .registration import RegistrationService
from .retry import DEFAULT_MAX_RECONSUME_TIMES, plan_send_back
from .schedule import ScheduleService
from .timer import TimerService
from .topics import TopicConfig, TopicConfigManager
from .trace import MAX_POSTED_EVENTS, TracedTransactionService, TraceLookup, TraceRecorder, validate_event
from .transaction import COMMIT, ROLLBACK, CheckRequest, TransactionService

__all__ = [
    "Broker",
    "OutgoingMessage",
    "SendStatus",
    "SendResult",
    "BatchSendResult",
    "MAX_ARROW_PULL_BATCH",
    "MAX_PULL_BATCH",
]

log = logging.getLogger("sparkmq.broker")

#: The most messages one pull answers.
MAX_PULL_BATCH = 1024
#: The most messages one unfiltered Arrow pull without a group answers (the Spark source's bulk
#: reads): columns are cut from the records in bulk, so bigger pulls only spread the request's cost.
MAX_ARROW_PULL_BATCH = 16384
#: A tag-filtered pull keeps scanning past non-matching messages for at most this many store reads.
_MAX_FILTER_ROUNDS = 16
_MAX_MSG_ID_LENGTH = 128
#: How long shutdown waits for sends and reads in flight before closing the store anyway.
_DRAIN_TIMEOUT_S = 10.0
#: An SQL92-filtered pull examines at most this many consume-queue units (then answers NO_MATCHED_MSG
#: with next_offset past them, so the consumer moves on).
_MAX_SQL_EXAMINED = 65_536
#: Properties a delayed or timer send uses to ask for parking; stripped before parking.
_DELAY_PROPERTIES = (PROPERTY_DELAY_LEVEL, PROPERTY_TIMER_DELIVER_MS, PROPERTY_TIMER_DELAY_SEC)
#: Properties a DLQ message carries that a redriven copy must not.
_DLQ_PROPERTIES = (PROPERTY_DLQ_ORIGIN_TOPIC, PROPERTY_DLQ_REASON, PROPERTY_RETRY_TOPIC, PROPERTY_ORIGIN_MSG_ID,
                   PROPERTY_REAL_TOPIC, PROPERTY_REAL_QUEUE_ID, PROPERTY_DELAY_LEVEL)


@functools.lru_cache(maxsize=1024)
def cached_filter(expression: str | None, filter_type: str = FILTER_TAG) -> MessageFilter:
    """A compiled filter, compiled once per (expression, type) -- an LRU cache shared by pulls and heartbeats.

    FILTER_EXPRESSION_ILLEGAL (with the position) for a malformed expression; errors are not cached.
    """
    return compile_filter(expression, filter_type)


@dataclass(slots=True)
class OutgoingMessage:
    """One message as a producer sends it (before validation).

    ``properties`` may carry ``TAGS``, ``KEYS`` or ``UNIQ_KEY`` (a re-sent pulled
    message does); they must then agree with ``tags``, ``keys`` and ``msg_id``.
    """

    body: bytes
    tags: str | None = None
    keys: Sequence[str] = ()
    properties: dict[str, str] = field(default_factory=dict)
    #: The producer's unique id (UNIQ_KEY); None = the broker makes one.
    msg_id: str | None = None


@dataclass(frozen=True, slots=True)
class BatchSendResult:
    """Where a batch was stored (one queue, consecutive offsets)."""

    status: SendStatus
    topic: str
    broker_name: str
    queue_id: int
    results: list[PutResult]

    def to_dict(self) -> dict[str, Any]:
        """The JSON answer of ``POST /topics/{topic}/batch``."""
        return {"status": str(self.status), "topic": self.topic, "broker_name": self.broker_name,
                "queue_id": self.queue_id,
                "results": [{"msg_id": r.msg_id, "offset_msg_id": r.offset_msg_id, "queue_offset": r.queue_offset}
                            for r in self.results]}


def _check_int(name: str, value: object, low: int, high: int, code: ErrorCode = ErrorCode.INVALID_ARGUMENT) -> int:
    # bool is an int subclass; True must not mean queue 1.
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise SparkMQError(code, f"{name} must be an integer in {low}..{high}, got {value!r}")
    return value


def _looks_like_zlib(body: bytes) -> bool:
    # RFC 1950 header: deflate method, and CMF*256+FLG divisible by 31.  A cheap check that a
    # "compressed" body is not plain text by mistake (inflating every body would cost too much).
    return len(body) >= 2 and body[0] & 0x0F == 8 and (body[0] << 8 | body[1]) % 31 == 0


class Broker:
    """One broker: the controller the HTTP app calls (see the module docstring for the lifecycle)."""

    def __init__(self, config: BrokerConfig) -> None:
        """Build every component; nothing touches the disk or network until :meth:`start`."""
        self.config = config
        self.topics = TopicConfigManager(config.topics_path, default_queue_nums=config.default_topic_queue_nums,
                                         auto_create=config.auto_create_topic)
        self.store = MessageStore(config.store_config(), queue_count_of=self.topics.queue_count)
        self.clients = ClientManager(config.client_expiry_s, config.client_scan_interval_s)
        self.locks = QueueLockManager(config.queue_lock_expiry_s)
        self.offsets = ConsumerOffsetManager(config.lake_table_path(CONSUMER_OFFSETS_TABLE), config.broker_name,
                                             config.offset_persist_interval_s, config.offset_reset_fence_s)
        self.holds = PullHoldService()
        self.metrics = BrokerMetrics(self._scrape_commitlog_max, self._scrape_queue_max, self._scrape_group_lag)
        self.registration = RegistrationService(config.namesrv_addrs, self.registration_payload,
                                                self._unregister_payload, config.register_interval_s,
                                                config.register_timeout_s)
        self._state = "new"
        self._components: dict[str, tuple[Callable[[], dict[str, Any]], Callable[[], bool]]] = {}
        #: The lake's index and messages tables (written by the dispatch job), read with delta-rs.
        self.lake_index = LakeIndex(config.data_dir / "lake")
        #: Trace events into RMQ_SYS_TRACE_TOPIC (buffered, written by its own thread), and their lookup.
        self.tracer = TraceRecorder(self._put_trace, config.broker_name, enabled=config.trace_enabled)
        self.trace_lookup = TraceLookup(config.data_dir / "lake")
        self.add_component("trace", self.tracer.status)
        self._state_lock = threading.Lock()
        self._inflight = 0
        self._drained = threading.Condition(self._state_lock)
        self._round_robin: dict[str, Iterator[int]] = {}
        self.levels_ms = config.delay_levels_ms
        #: Background services over the store; built in :meth:`start` (they read the store when built).
        self.schedule: ScheduleService | None = None
        self.timers: TimerService | None = None
        self.transactions: TransactionService | None = None
        self.checks = CheckChannel()
        self.topics.add_listener(lambda _version: self.registration.trigger())
        self.clients.add_leave_listener(self._on_clients_left)

    # ================================================================== lifecycle
    @property
    def name(self) -> str:
        """The broker name."""
        return self.config.broker_name

    @property
    def addr(self) -> str:
        """The address clients and name servers are told."""
        return self.config.addr

    @property
    def running(self) -> bool:
        """Whether sends and pulls are accepted."""
        return self._state == "running"

    def start(self, register: bool = True) -> Broker:
        """Load topics, open the store, restore offsets, start the background threads; returns self.

        ``register=False`` defers name server registration to :meth:`start_registration`
        (a runner calls it once its socket accepts connections, so no client is routed to
        an address that refuses them).
        """
        if self._state != "new":
            raise SparkMQError(ErrorCode.SERVICE_NOT_AVAILABLE, f"the broker is {self._state}, it cannot start")
        if self.config.port == 0 and not self.config.advertised_addr:
            raise ValueError("port 0: bind the listening socket first and pass config.bound_to(real_port)")
        self.topics.load()
        self.store.start()
        try:
            loaded = self.offsets.load()
            self.offsets.start()
            self.clients.start()
            self._build_services()
        except BaseException:
            self._stop_services()
            self.offsets.stop()
            self.store.shutdown()
            raise
        self._state = "running"
        for service in self._services():
            service.start()
        self.tracer.start()
        if register:
            self.registration.start()
        log.info("broker %s (%s) started at %s: %d topics, %d consumer offsets, store clean start %s",
                 self.name, self.config.role, self.addr, len(self.topics), loaded, self.store.clean_start)
        return self

    def _build_services(self) -> None:
        cfg = self.config
        if cfg.role is BrokerRole.SLAVE:
            return  # a slave stores nothing of its own; its master delivers
        self.schedule = ScheduleService(self.store, self.levels_ms, cfg.progress_path("delay_offset"),
                                        self._redeliver)
        self.timers = TimerService(self.store, cfg.progress_path("timer_progress"), self._redeliver,
                                   max_delay_s=cfg.timer_max_delay_s)
        # Scan often enough that short test timings are honoured, at most once a second in production.
        scan = max(0.05, min(1.0, cfg.transaction_check_first_s / 4, cfg.transaction_check_interval_s / 4))
        # Traced: every settled half (commit, rollback, discard after the checks) becomes a trace event.
        traced: dict[str, Any] = {"recorder": self.tracer} if self.tracer.enabled else {}
        self.transactions = (TracedTransactionService if traced else TransactionService)(
            self.store, cfg.progress_path("transaction_progress"), self._redeliver, self._offer_check,
            first_check_s=cfg.transaction_check_first_s, check_interval_s=cfg.transaction_check_interval_s,
            max_checks=cfg.transaction_check_max, scan_interval_s=scan, **traced)

    def _services(self) -> list[Any]:
        return [s for s in (self.schedule, self.timers, self.transactions) if s is not None]

    def _stop_services(self) -> None:
        for service in self._services():
            try:
                service.stop()
            except Exception:  # one service failing to persist must not keep the store open
                log.exception("stopping %s failed", type(service).__name__)

    def start_registration(self) -> None:
        """Start registering with the name servers (idempotent)."""
        if self.running:
            self.registration.start()

    def begin_shutdown(self) -> None:
        """Stop accepting sends and pulls and release held pulls and change polls (non-blocking, idempotent)."""
        with self._state_lock:
            if self._state in ("stopping", "stopped"):
                return
            was_new = self._state == "new"
            self._state = "stopped" if was_new else "stopping"
        self.holds.close()
        self.clients.release_waiters()
        self.checks.close()

    def shutdown(self) -> None:
        """Stop in order: accepting, in-flight work, registration (unregister), client scan, offsets, store."""
        with self._state_lock:
            if self._state == "stopped":
                return
            started = self._state != "new"
        self.begin_shutdown()
        if not started:
            return
        with self._drained:
            if not self._drained.wait_for(lambda: self._inflight == 0, _DRAIN_TIMEOUT_S):
                log.warning("shutdown: %d operation(s) still in flight after %.0f s", self._inflight, _DRAIN_TIMEOUT_S)
        self.registration.stop(unregister=True)
        self._stop_services()
        self.tracer.stop()  # writes the events still buffered while the store is open
        self.clients.stop()
        if not self.offsets.stop():
            log.error("shutdown: the final consumer offset persist failed (see above)")
        self.store.shutdown()
        with self._state_lock:
            self._state = "stopped"
        log.info("broker %s stopped", self.name)

    def __enter__(self) -> Broker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    @contextlib.contextmanager
    def _operation(self) -> Iterator[None]:
        """Count a store operation in flight; SERVICE_NOT_AVAILABLE unless running."""
        with self._state_lock:
            if self._state != "running":
                raise SparkMQError(ErrorCode.SERVICE_NOT_AVAILABLE, f"the broker is {self._state}")
            self._inflight += 1
        try:
            yield
        finally:
            with self._state_lock:
                self._inflight -= 1
                if self._inflight == 0:
                    self._drained.notify_all()

    # ================================================================== sending
    @property
    def send_may_block(self) -> bool:
        """Whether a send waits for a disk sync (SYNC_FLUSH), so callers should run it off the event loop."""
        return self.store.config.flush_mode is FlushMode.SYNC_FLUSH

    def send(self, topic: str, message: OutgoingMessage, *, queue_id: int | None = None,
             sharding_key: str | None = None, compressed: bool = False, producer_group: str | None = None,
             born_timestamp: int | None = None, born_host: str | None = None, delay_level: int | None = None,
             deliver_at_ms: int | None = None, delay_ms: int | None = None) -> SendResult:
        """Store one message; the topic is auto-created (after storing) when allowed.

        Queue choice: ``queue_id`` (a write queue), else a stable hash of ``sharding_key``
        over the write queues, else round-robin.

        Delay: ``delay_level`` (1..levels), ``deliver_at_ms`` or ``delay_ms`` (or the message
        properties ``DELAY``, ``TIMER_DELIVER_MS``, ``TIMER_DELAY_SEC``) park the message in
        the schedule or timer topic until due; the answer's queue id and offset are then
        those of the parked copy, its msg_id the message's own.
        """
        started = time.perf_counter()
        try:
            with self._operation():
                cfg, qid = self._prepare_send(topic, queue_id, sharding_key, producer_group, born_timestamp)
                msg, sys_flag = self._to_message(topic, message, compressed)
                result = self._put_or_park(msg, qid, self._delay_of(msg, delay_level, deliver_at_ms, delay_ms),
                                           born_host=born_host, born_timestamp=born_timestamp, sys_flag=sys_flag)
        except SparkMQError as exc:
            self.metrics.send_failed(exc.code.name)
            raise
        self._after_store(topic, qid, cfg)
        self.tracer.stored(topic, [result], [msg], born_timestamp)
        # A parked message counts under its system topic now and under its own topic when delivered.
        self.metrics.sent(result.topic, 1, len(msg.body), time.perf_counter() - started)
        return SendResult(self._send_status(result.status), result.msg_id, result.offset_msg_id, topic, self.name,
                          result.queue_id, result.queue_offset, result.store_timestamp, result.commitlog_offset)

    def send_batch(self, topic: str, messages: Sequence[OutgoingMessage], *, queue_id: int | None = None,
                   sharding_key: str | None = None, compressed: bool = False, producer_group: str | None = None,
                   born_timestamp: int | None = None, born_host: str | None = None, delay_level: int | None = None,
                   deliver_at_ms: int | None = None, delay_ms: int | None = None) -> BatchSendResult:
        """Store many messages in one queue with consecutive offsets; one bad message rejects the batch.

        A delayed batch (a delay argument, or any message with a delay property) parks each
        message on its own: the results then give the parked copies' offsets.
        """
        started = time.perf_counter()
        try:
            with self._operation():
                if not isinstance(messages, Sequence) or not messages:
                    raise SparkMQError(ErrorCode.MESSAGE_ILLEGAL, "the batch is empty")
                cfg, qid = self._prepare_send(topic, queue_id, sharding_key, producer_group, born_timestamp)
                batch = []
                for i, message in enumerate(messages):
                    try:
                        batch.append(self._to_message(topic, message, compressed)[0])
                    except SparkMQError as exc:
                        raise SparkMQError(exc.code, f"message {i}: {exc.message}") from None
                delays = []
                for i, msg in enumerate(batch):
                    try:
                        delays.append(self._delay_of(msg, delay_level, deliver_at_ms, delay_ms))
                    except SparkMQError as exc:
                        raise SparkMQError(exc.code, f"message {i}: {exc.message}") from None
                # A producer compresses all bodies of a batch or none (one flag per request).
                sys_flag = COMPRESSED if compressed else 0
                if any(d is not None for d in delays):
                    results = [self._put_or_park(m, qid, d, born_host=born_host, born_timestamp=born_timestamp,
                                                 sys_flag=sys_flag)
                               for m, d in zip(batch, delays, strict=True)]
                else:
                    results = self.store.put_batch(topic, qid, batch, born_host=born_host,
                                                   born_timestamp=born_timestamp, sys_flag=sys_flag)
        except SparkMQError as exc:
            self.metrics.send_failed(exc.code.name)
            raise
        self._after_store(topic, qid, cfg)
        self.tracer.stored(topic, results, batch, born_timestamp)
        self.metrics.sent(topic, len(batch), sum(len(m.body) for m in batch), time.perf_counter() - started)
        return BatchSendResult(self._send_status(results[-1].status), topic, self.name, qid, results)

    # ================================================================== delay, timers, redelivery
    def _delay_of(self, msg: Message, delay_level: int | None, deliver_at_ms: int | None,
                  delay_ms: int | None) -> tuple[str, int] | None:
        """``("level", L)``, ``("timer", due_ms)`` or None (deliver now); strips the delay properties from ``msg``.

        INVALID_ARGUMENT for a level outside 1..levels, a negative delay, a time beyond
        ``timer_max_delay_s``, or two ways of delaying at once.  Validates before anything is stored.
        """
        props = msg.properties
        asked = {name: props.pop(name) for name in _DELAY_PROPERTIES if name in props}
        given = [n for n, v in (("delay_level", delay_level), ("deliver_at_ms", deliver_at_ms),
                                ("delay_ms", delay_ms)) if v is not None] + list(asked)
        if len(given) > 1:
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, f"delay the message one way only, got {given}")
        if not given:
            return None
        now = int(time.time() * 1000)
        if PROPERTY_DELAY_LEVEL in asked:
            try:
                delay_level = int(asked[PROPERTY_DELAY_LEVEL])
            except ValueError:
                raise SparkMQError(ErrorCode.INVALID_ARGUMENT,
                                   f"property DELAY must be an integer level, got {asked[PROPERTY_DELAY_LEVEL]!r}"
                                   ) from None
        if delay_level is not None:
            _check_int("delay_level", delay_level, 0, len(self.levels_ms))
            return ("level", delay_level) if delay_level > 0 else None  # RocketMQ: level 0 = no delay
        if asked:
            due = self._timers().due_time(asked, now)
            assert due is not None
        elif deliver_at_ms is not None:
            due = _check_int("deliver_at_ms", deliver_at_ms, 0, 2**63 - 1)
        else:
            due = now + _check_int("delay_ms", delay_ms, 0, 2**62)
        if due - now > self.config.timer_max_delay_s * 1000:
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT,
                               f"the delivery time is {(due - now) / 1000:.0f} s ahead; the maximum is "
                               f"{self.config.timer_max_delay_s:.0f} s (timer_max_delay_s)")
        return ("timer", due) if due > now else None

    def _timers(self) -> TimerService:
        if self.timers is None:
            raise SparkMQError(ErrorCode.SERVICE_NOT_AVAILABLE, f"broker {self.name} runs no timer service")
        return self.timers

    def _schedule(self) -> ScheduleService:
        if self.schedule is None:
            raise SparkMQError(ErrorCode.SERVICE_NOT_AVAILABLE, f"broker {self.name} runs no schedule service")
        return self.schedule

    def _put_or_park(self, msg: Message, qid: int, delay: tuple[str, int] | None, **put_args: Any) -> PutResult:
        if delay is None:
            return self.store.put(msg, qid, **put_args)
        kind, value = delay
        if kind == "level":
            result = self._schedule().park(msg, qid, value, **put_args)
        else:
            result = self._timers().park(msg, qid, value, **put_args)
        return result  # type: ignore[return-value]

    def _redeliver(self, message: Message, queue_id: int, parked: StoredMessage) -> PutResult:
        """Put a due (or committed) message to its real topic through the normal put path.

        Long polling wakes, metrics count, and the real topic is created when allowed.
        """
        started = time.perf_counter()
        cfg = self.topics.get(message.topic) or self.topics.for_send(message.topic)
        if queue_id >= cfg.write_queue_nums:  # the topic shrank meanwhile: keep the message anyway
            queue_id %= cfg.write_queue_nums
        result = self.store.put(message, queue_id, born_host=parked.born_host or None,
                                born_timestamp=parked.born_timestamp, reconsume_times=parked.reconsume_times,
                                sys_flag=parked.sys_flag & COMPRESSED)
        self._after_store(message.topic, queue_id, cfg)
        self.tracer.stored(message.topic, [result], [message], parked.born_timestamp, detail=f"from {parked.topic}")
        self.metrics.sent(message.topic, 1, len(message.body), time.perf_counter() - started)
        return result

    def _put_trace(self, message: Message) -> PutResult:
        """Store one trace message (the recorder's thread): a direct put, so it is never traced itself."""
        result = self.store.put(message, 0)
        self.holds.notify_put(TRACE_TOPIC, 0)
        return result

    def recall_timer(self, msg_id: str) -> bool:
        """Cancel a pending timer message by its msg_id; False when fired, recalled or unknown."""
        if not isinstance(msg_id, str) or not 0 < len(msg_id) <= _MAX_MSG_ID_LENGTH:
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, f"msg_id must be 1-{_MAX_MSG_ID_LENGTH} characters")
        with self._operation():
            timers = self._timers()
            recalled = timers.recall(msg_id)
            if recalled:
                # Persist now, not at the next interval: a crash right after must not resurrect it.
                timers.persist()
            return recalled

    def _prepare_send(self, topic: str, queue_id: int | None, sharding_key: str | None,
                      producer_group: str | None, born_timestamp: int | None) -> tuple[TopicConfig, int]:
        validate_topic(topic)
        if self.config.role is BrokerRole.SLAVE:
            raise SparkMQError(ErrorCode.SERVICE_NOT_AVAILABLE, f"broker {self.name} is a slave; send to its master")
        if producer_group is not None:
            validate_group(producer_group)
        if born_timestamp is not None:
            _check_int("born_timestamp", born_timestamp, 0, 2**63 - 1)
        cfg = self.topics.for_send(topic)
        if not is_writeable(cfg.perm):
            raise SparkMQError(ErrorCode.NO_PERMISSION, f"topic {topic!r} is not writeable on {self.name} "
                                                        f"(perm {cfg.perm})")
        return cfg, self._select_queue(cfg, queue_id, sharding_key)

    def _select_queue(self, cfg: TopicConfig, queue_id: int | None, sharding_key: str | None) -> int:
        writes = cfg.write_queue_nums
        if queue_id is not None:
            return _check_int("queue_id", queue_id, 0, writes - 1, ErrorCode.QUEUE_ID_ILLEGAL)
        if sharding_key is not None:
            if not isinstance(sharding_key, str) or not sharding_key:
                raise SparkMQError(ErrorCode.INVALID_ARGUMENT, "sharding_key must be a non-empty string")
            # crc32 is stable across processes and versions (Python's hash() is salted per process).
            return zlib.crc32(sharding_key.encode("utf-8")) % writes
        counter = self._round_robin.get(cfg.topic)
        if counter is None:
            counter = self._round_robin.setdefault(cfg.topic, itertools.count())
        return next(counter) % writes

    def _to_message(self, topic: str, message: OutgoingMessage, compressed: bool) -> tuple[Message, int]:
        """The store's Message for ``message`` with TAGS/KEYS/UNIQ_KEY reconciled; (message, sys_flag)."""
        if not isinstance(message, OutgoingMessage):
            raise SparkMQError(ErrorCode.MESSAGE_ILLEGAL, f"expected OutgoingMessage, got {type(message).__name__}")
        if not isinstance(message.properties, dict):
            raise SparkMQError(ErrorCode.MESSAGE_ILLEGAL, "properties must be a mapping of strings to strings")
        props = dict(message.properties)
        tags = message.tags
        prop_tags = props.pop(PROPERTY_TAGS, None)
        if prop_tags is not None:
            if tags is not None and tags != prop_tags:
                raise SparkMQError(ErrorCode.MESSAGE_ILLEGAL,
                                   f"tags {tags!r} disagree with property TAGS {prop_tags!r}")
            tags = prop_tags
        if isinstance(message.keys, str):
            raise SparkMQError(ErrorCode.MESSAGE_ILLEGAL, "keys must be a list of strings, not one string")
        keys = tuple(message.keys)
        prop_keys = props.pop(PROPERTY_KEYS, None)
        if prop_keys is not None:
            from_props = tuple(k for k in str(prop_keys).split(KEY_SEPARATOR) if k)
            if keys and keys != from_props:
                raise SparkMQError(ErrorCode.MESSAGE_ILLEGAL, f"keys {list(keys)} disagree with property KEYS")
            keys = from_props
        msg_id = message.msg_id
        prop_id = props.pop(PROPERTY_UNIQUE_ID, None)
        if prop_id is not None:
            if msg_id is not None and msg_id != prop_id:
                raise SparkMQError(ErrorCode.MESSAGE_ILLEGAL, f"msg_id {msg_id!r} disagrees with property UNIQ_KEY")
            msg_id = prop_id
        if msg_id is not None:
            if not isinstance(msg_id, str) or not 0 < len(msg_id) <= _MAX_MSG_ID_LENGTH or not msg_id.isprintable() \
                    or any(c.isspace() for c in msg_id):
                raise SparkMQError(ErrorCode.MESSAGE_ILLEGAL,
                                   f"msg_id must be 1-{_MAX_MSG_ID_LENGTH} printable characters without spaces")
            props[PROPERTY_UNIQUE_ID] = msg_id
        sys_flag = 0
        if compressed:
            if not isinstance(message.body, bytes | bytearray) or not _looks_like_zlib(bytes(message.body)):
                raise SparkMQError(ErrorCode.MESSAGE_ILLEGAL, "compressed is set but the body is not zlib data")
            sys_flag |= COMPRESSED
        return Message(topic, message.body, tags, keys, props), sys_flag

    def _after_store(self, topic: str, queue_id: int, cfg: TopicConfig) -> None:
        if self.topics.get(topic) is None:
            try:
                self.topics.auto_create_topic(topic)
            except SparkMQError:  # the message is stored; the next send creates the topic again
                log.exception("auto-creating topic %s failed", topic)
        self.holds.notify_put(topic, queue_id)

    def _send_status(self, status: PutStatus) -> SendStatus:
        if status is PutStatus.FLUSH_DISK_TIMEOUT:
            return SendStatus.FLUSH_DISK_TIMEOUT
        if self.config.role is BrokerRole.SYNC_MASTER:
            # No replication service yet, so no slave can have acknowledged the message.
            return SendStatus.SLAVE_NOT_AVAILABLE
        return SendStatus.SEND_OK

    # ================================================================== pulling
    def _check_pull(self, topic: str, queue_id: int, offset: int, max_count: int,
                    max_batch: int = MAX_PULL_BATCH) -> TopicConfig:
        cfg = self.topics.require(topic)
        if not is_readable(cfg.perm):
            raise SparkMQError(ErrorCode.NO_PERMISSION, f"topic {topic!r} is not readable on {self.name} "
                                                        f"(perm {cfg.perm})")
        _check_int("queue_id", queue_id, 0, cfg.read_queue_nums - 1, ErrorCode.QUEUE_ID_ILLEGAL)
        _check_int("offset", offset, 0, 2**63 - 1, ErrorCode.OFFSET_ILLEGAL)
        _check_int("max", max_count, 1, max_batch)
        return cfg

    def pull_once(self, topic: str, queue_id: int, offset: int, max_count: int = 32,
                  tags: frozenset[str] | None = None, *, group: str | None = None,
                  commit_offset: int | None = None, sql: SqlFilter | None = None,
                  client_id: str | None = None) -> GetResult:
        """Read up to ``max_count`` messages without waiting; also commits ``commit_offset`` for ``group``.

        With a tag filter, a read that matched nothing keeps scanning towards the
        queue's end (bounded), so consumers do not round-trip over long runs of other tags.
        With ``sql`` (a compiled SQL92 filter; ``tags`` is then ignored) only each
        candidate's properties are decoded and evaluated, scanning up to
        ``_MAX_SQL_EXAMINED`` units past non-matching ones.  Messages returned to a ``group``
        are traced as ``deliver`` events (with ``client_id``, the puller).
        """
        started = time.perf_counter()
        with self._operation():
            self._check_pull(topic, queue_id, offset, max_count)
            if group is not None:
                validate_group(group)
            if commit_offset is not None:
                if group is None:
                    raise SparkMQError(ErrorCode.INVALID_ARGUMENT, "commit_offset needs a group")
                self.offsets.commit(group, topic, queue_id, commit_offset)
            reset_to = None if group is None else self.offsets.settle_reset(group, topic, queue_id, offset)
            if reset_to is not None:
                # An admin reset the group's offset here: the consumer restarts there, nothing is read.
                return GetResult(GetStatus.OFFSET_RESET, reset_to, self.store.min_offset(topic, queue_id),
                                 self.store.max_offset(topic, queue_id))
            if sql is not None:
                result = self.store.get_messages_matching(topic, queue_id, offset, max_count, sql.matches,
                                                          _MAX_SQL_EXAMINED, self.config.pull_max_bytes)
                if result.status is GetStatus.OFFSET_TOO_SMALL:
                    result = self._from_lake_tier(topic, queue_id, offset, max_count, None, sql, result)
                self.metrics.pulled(topic, group, len(result.messages), sum(len(m.body) for m in result.messages),
                                    time.perf_counter() - started)
                if group is not None:
                    self.tracer.delivered(topic, group, client_id, result.messages)
                return result
            result = self.store.get_messages(topic, queue_id, offset, max_count, tags, self.config.pull_max_bytes)
            rounds = 1
            while (result.status is GetStatus.NO_MATCHED_MSG and result.next_offset < result.max_offset
                   and rounds < _MAX_FILTER_ROUNDS):
                result = self.store.get_messages(topic, queue_id, result.next_offset, max_count, tags,
                                                 self.config.pull_max_bytes)
                rounds += 1
            if result.status is GetStatus.NO_NEW_MSG and result.next_offset > offset:
                result = GetResult(GetStatus.NO_MATCHED_MSG, result.next_offset, result.min_offset,
                                   result.max_offset)  # filtered to the end: the caller must still advance
            if result.status is GetStatus.OFFSET_TOO_SMALL:
                result = self._from_lake_tier(topic, queue_id, offset, max_count, tags, None, result)
        self.metrics.pulled(topic, group, len(result.messages), sum(len(m.body) for m in result.messages),
                            time.perf_counter() - started)
        if group is not None:
            self.tracer.delivered(topic, group, client_id, result.messages)
        return result

    def pull_arrow_once(self, topic: str, queue_id: int, offset: int, max_count: int = 32, *,
                        records: bool = False) -> tuple[GetResult, pa.RecordBatch]:
        """An unfiltered pull answered as one Arrow record batch, without waiting (up to 16384 messages).

        The fast path of bulk pulls (the Spark source, the dispatch job): no ``StoredMessage``
        objects.  ``records``: the records as stored (``RECORDS_SCHEMA``), decoded by the reader,
        so the broker only copies bytes; else ``PULL_SCHEMA`` columns cut from the records here.
        A pull below the log's retention goes through :meth:`pull_once` (the lake tier) and is
        answered in ``PULL_SCHEMA`` either way.
        """
        started = time.perf_counter()
        with self._operation():
            self._check_pull(topic, queue_id, offset, max_count, MAX_ARROW_PULL_BATCH)
            result, batch = self.store.get_arrow(topic, queue_id, offset, max_count, self.config.pull_max_bytes,
                                                 self.name, decode=not records)
        if result.status is GetStatus.OFFSET_TOO_SMALL:
            from ..common.wire import stored_to_arrow  # only this rare path builds rows

            result = self.pull_once(topic, queue_id, offset, min(max_count, MAX_PULL_BATCH))
            return result, stored_to_arrow(result.messages, self.name)
        size = batch.column(0 if records else "body").nbytes if batch.num_rows else 0
        self.metrics.pulled(topic, None, batch.num_rows, size, time.perf_counter() - started)
        return result, batch

    def _from_lake_tier(self, topic: str, queue_id: int, offset: int, max_count: int,
                        tags: frozenset[str] | None, sql: SqlFilter | None, log_result: GetResult) -> GetResult:
        """A pull below the log's retention, served from the lake's ``messages`` table when it has the range.

        History outlives local disk: the dispatch job copied every message there.  Without
        the rows (no lake, or not dispatched) the log's OFFSET_TOO_SMALL answer stands.
        """
        limit = min(max_count, log_result.min_offset - offset)  # never past where the log takes over
        rows = self.lake_index.messages_range(topic, self.name, queue_id, offset, limit)
        if not rows or rows[0].queue_offset != offset:
            return log_result
        next_offset = rows[-1].queue_offset + 1
        if tags is not None:
            rows = [m for m in rows if m.tags in tags]
        if sql is not None:
            rows = [m for m in rows if sql.matches(m.properties)]
        status = GetStatus.FOUND if rows else GetStatus.NO_MATCHED_MSG
        return GetResult(status, next_offset, log_result.min_offset, log_result.max_offset, rows)

    def query_messages(self, *, topic: str | None = None, key: str | None = None, msg_id: str | None = None,
                       begin_ms: int | None = None, end_ms: int | None = None,
                       max_hits: int = DEFAULT_MAX_HITS) -> list[StoredMessage]:
        """Messages found through the lake's index: by ``msg_id``, by ``topic`` + ``key``, or by ``topic``
        and a store-time range; each read from the log, or from the lake tier when retention removed it."""
        index = self.lake_index
        if msg_id is not None:
            locations = index.by_msg_id(msg_id, max_hits)
        elif key is not None:
            locations = index.by_key(topic or "", key, max_hits)
        elif begin_ms is not None and end_ms is not None:
            locations = index.by_time(topic or "", begin_ms, end_ms, max_hits)
        else:
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT,
                               "query by msg_id, by topic and key, or by topic, begin and end")
        found = []
        for location in locations:
            if location.broker == self.name:
                try:
                    stored = self.store.read_message(location.commitlog_offset)
                    if stored.topic == location.topic and stored.queue_offset == location.queue_offset:
                        found.append(stored)
                        continue
                except SparkMQError:
                    pass  # retention removed it: the lake tier has it
            row = index.stored_message(location)
            if row is not None:
                found.append(lake_row_to_stored(row))
        return found

    def pull_filter(self, filter_type: str | None, tags: str | None,
                    expression: str | None) -> tuple[frozenset[str] | None, SqlFilter | None]:
        """(tag set, SQL filter) of a pull: ``TAG`` reads ``tags`` (or ``expression``), ``SQL92`` ``expression``.

        FILTER_EXPRESSION_ILLEGAL (with the error's position) for a malformed expression or an unknown type.
        """
        kind = (filter_type or FILTER_TAG).upper()
        if kind == FILTER_SQL92:
            compiled = cached_filter(expression, FILTER_SQL92)
            assert isinstance(compiled, SqlFilter)
            return None, compiled
        if kind == FILTER_TAG:
            return parse_tags(tags if tags is not None else expression), None
        compile_filter(expression, kind)  # raises FILTER_EXPRESSION_ILLEGAL naming the known types
        raise AssertionError("unreachable")

    async def pull(self, topic: str, queue_id: int, offset: int, max_count: int = 32, tags: str | None = None, *,
                   wait_ms: int = 0, group: str | None = None, commit_offset: int | None = None,
                   filter_type: str | None = None, expression: str | None = None,
                   client_id: str | None = None) -> GetResult:
        """Pull with long polling: when nothing (matching) is new, hold up to ``min(wait_ms, long_polling_max_ms)``.

        A held pull answers as soon as a message lands on the queue (and matches), or
        at the deadline with the status it would have had.  Store reads run in a worker
        thread; the hold itself costs no thread.  ``filter_type`` ``SQL92`` filters on the
        broker with ``expression`` over message properties (see :meth:`pull_filter`).
        """
        wanted, sql = self.pull_filter(filter_type, tags, expression)
        _check_int("wait_ms", wait_ms, 0, 2**31 - 1)
        deadline = time.monotonic() + min(wait_ms, self.config.long_polling_max_ms) / 1000.0
        result = await anyio.to_thread.run_sync(
            lambda: self.pull_once(topic, queue_id, offset, max_count, wanted, group=group,
                                   commit_offset=commit_offset, sql=sql, client_id=client_id))
        while True:
            status = result.status
            at_end = (status is GetStatus.NO_NEW_MSG
                      or (status is GetStatus.NO_MATCHED_MSG and result.next_offset >= result.max_offset)
                      or (status is GetStatus.NO_MATCHED_QUEUE and offset == 0))
            remaining = deadline - time.monotonic()
            if not at_end or remaining <= 0 or not self.running:
                return result
            start = result.next_offset
            await self.holds.hold(topic, queue_id, remaining,
                                  lambda s=start: self.running and (self.store.max_offset(topic, queue_id) > s
                                                                    or self._reset_moves(group, topic, queue_id, s)))
            if not self.running:
                return result
            again = await anyio.to_thread.run_sync(
                lambda s=start: self.pull_once(topic, queue_id, s, max_count, wanted, group=group, sql=sql,
                                               client_id=client_id))
            if again.status is GetStatus.NO_NEW_MSG and start > offset:
                # Earlier rounds skipped non-matching messages: tell the caller to advance.
                again = GetResult(GetStatus.NO_MATCHED_MSG, again.next_offset, again.min_offset, again.max_offset)
            result = again

    def _reset_moves(self, group: str | None, topic: str, queue_id: int, offset: int) -> bool:
        """Whether a pending offset reset sends ``group``'s puller at ``offset`` elsewhere (wakes a held pull)."""
        return group is not None and self.offsets.pending_reset(group, topic, queue_id) not in (None, offset)

    def queue_offsets(self, topic: str, queue_id: int, timestamp: int | None = None) -> dict[str, int]:
        """``{"min_offset", "max_offset"}`` of a queue, plus ``"offset"`` (first stored at or after ``timestamp``)."""
        cfg = self.topics.require(topic)
        _check_int("queue_id", queue_id, 0, cfg.queue_count - 1, ErrorCode.QUEUE_ID_ILLEGAL)
        out = {"min_offset": self.store.min_offset(topic, queue_id),
               "max_offset": self.store.max_offset(topic, queue_id)}
        if timestamp is not None:
            _check_int("timestamp", timestamp, 0, 2**63 - 1)
            out["offset"] = self.store.offset_by_time(topic, queue_id, timestamp)
        return out

    def message_by_offset_msg_id(self, offset_msg_id: str) -> StoredMessage:
        """The message an offsetMsgId points to (MESSAGE_ID_ILLEGAL, MESSAGE_NOT_FOUND)."""
        return self.store.read_by_offset_msg_id(offset_msg_id)

    # ================================================================== retry and dead letters
    def send_back(self, group: str, offset_msg_id: str, *, delay_level: int = 0, reason: str = "",
                  max_reconsume_times: int = DEFAULT_MAX_RECONSUME_TIMES) -> dict[str, Any]:
        """A consumer of ``group`` failed on a message: retry it through ``%RETRY%<group>`` or dead-letter it.

        ``delay_level`` 0 = level 3 + reconsume count, > 0 = that level, -1 = straight to the
        DLQ.  After ``max_reconsume_times`` retries the message goes to ``%DLQ%<group>`` (one
        queue, perm 6, created on the first dead letter).  Broadcasting groups do not retry
        (INVALID_ARGUMENT).
        """
        validate_group(group)
        _check_int("delay_level", delay_level, -1, 2**31 - 1)
        _check_int("max_reconsume_times", max_reconsume_times, 0, 10_000)
        if not isinstance(reason, str):
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, "reason must be a string")
        if self.clients.group_info(group).message_model is MessageModel.BROADCASTING \
                and self.clients.members(group):
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT,
                               f"group {group!r} consumes by broadcasting; broadcasting consumers do not retry")
        with self._operation():
            stored = self.store.read_by_offset_msg_id(offset_msg_id)
            plan = plan_send_back(stored, group, reason=reason, delay_level=delay_level,
                                  max_reconsume_times=max_reconsume_times, level_count=len(self.levels_ms))
            put_args: dict[str, Any] = {"born_timestamp": stored.born_timestamp,
                                        "born_host": stored.born_host or None,
                                        "reconsume_times": plan.reconsume_times,
                                        "sys_flag": stored.sys_flag & COMPRESSED}
            topic = plan.message.topic
            if plan.dead_letter:
                cfg = self.topics.ensure_system_topic(topic, 1)
                result = self.store.put(plan.message, 0, **put_args)
                self._after_store(topic, 0, cfg)
            else:
                self.topics.ensure_system_topic(topic, 1)
                assert plan.delay_level is not None
                result = self._schedule().park(plan.message, plan.queue_id, plan.delay_level, **put_args)
        delay_ms = None if plan.dead_letter else self.levels_ms[plan.delay_level - 1]  # type: ignore[operator]
        self.tracer.sent_back(stored, group, dead_letter=plan.dead_letter, destination=topic,
                              result=result, reconsume_times=plan.reconsume_times,  # type: ignore[arg-type]
                              delay_ms=delay_ms, reason=reason)
        return {"status": "DLQ" if plan.dead_letter else "RETRY", "topic": topic,
                "delay_level": plan.delay_level or 0, "reconsume_times": plan.reconsume_times,
                "msg_id": result.msg_id, "offset_msg_id": result.offset_msg_id}  # type: ignore[attr-defined]

    def dlq_messages(self, group: str, offset: int = 0, max_count: int = 32) -> GetResult:
        """Messages of ``%DLQ%<group>`` from ``offset`` (NO_MATCHED_QUEUE with none when nothing was dead-lettered)."""
        validate_group(group)
        topic = dlq_topic(group)
        if self.topics.get(topic) is None:
            _check_int("offset", offset, 0, 2**63 - 1, ErrorCode.OFFSET_ILLEGAL)
            _check_int("max", max_count, 1, MAX_PULL_BATCH)
            return GetResult(GetStatus.NO_MATCHED_QUEUE, 0, 0, 0)
        return self.pull_once(topic, 0, offset, max_count)

    def redrive(self, group: str, msg_ids: Sequence[str] = (), *, all_messages: bool = False,
                topic: str | None = None, tags: str | None = None) -> dict[str, Any]:
        """Send DLQ messages back to their original topics (the DLQ keeps its copies: it is a log).

        Either ``msg_ids`` (msgIds or offsetMsgIds of DLQ messages) or ``all_messages``
        (optionally only those first sent to ``topic`` / with tag ``tags``).  Each copy
        gets reconsume count 0 and loses the DLQ properties.
        """
        validate_group(group)
        if isinstance(msg_ids, str) or not all(isinstance(i, str) for i in msg_ids):
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, "msg_ids must be a list of strings")
        if bool(msg_ids) == bool(all_messages):
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, "give either msg_ids or all=true")
        dlq = dlq_topic(group)
        chosen: dict[str, StoredMessage] = {}
        wanted = set(msg_ids)
        if self.topics.get(dlq) is not None:
            with self._operation():
                for m in iter_all(self.store, dlq, 0):
                    origin = m.properties.get(PROPERTY_DLQ_ORIGIN_TOPIC, m.topic)
                    if all_messages:
                        pick = (topic is None or origin == topic) and (tags is None or m.tags == tags)
                    else:
                        pick = m.msg_id in wanted or m.offset_msg_id in wanted
                    if pick:
                        chosen[m.msg_id or m.offset_msg_id] = m  # one copy per message: the latest dead letter
        results = []
        for m in chosen.values():
            props = {k: v for k, v in m.properties.items() if k not in _DLQ_PROPERTIES}
            origin = m.properties.get(PROPERTY_DLQ_ORIGIN_TOPIC, m.topic)
            props.pop("TAGS", None)
            props.pop("KEYS", None)
            msg_id = props.pop("UNIQ_KEY", None) or None
            outgoing = OutgoingMessage(m.body, m.tags, m.keys, props, msg_id)
            results.append(self.send(origin, outgoing, compressed=bool(m.sys_flag & COMPRESSED),
                                     born_timestamp=m.born_timestamp).to_dict())
        found = {m.msg_id for m in chosen.values()} | {m.offset_msg_id for m in chosen.values()}
        return {"redriven": len(results), "results": results,
                "not_found": sorted(i for i in wanted if i not in found)}

    # ================================================================== transactions
    def _tx(self) -> TransactionService:
        if self.transactions is None:
            raise SparkMQError(ErrorCode.SERVICE_NOT_AVAILABLE, f"broker {self.name} runs no transaction service")
        return self.transactions

    def send_half(self, topic: str, message: OutgoingMessage, producer_group: str, *, queue_id: int | None = None,
                  sharding_key: str | None = None, born_timestamp: int | None = None,
                  born_host: str | None = None) -> dict[str, Any]:
        """Store a transaction's half message (invisible until committed); the answer carries its transaction id."""
        if producer_group is None:
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, "a half message needs its producer_group")
        with self._operation():
            cfg, qid = self._prepare_send(topic, queue_id, sharding_key, producer_group, born_timestamp)
            msg, _sys_flag = self._to_message(topic, message, False)
            if any(name in msg.properties for name in _DELAY_PROPERTIES):
                raise SparkMQError(ErrorCode.INVALID_ARGUMENT, "a transactional message cannot be delayed")
            result = self._tx().prepare(msg, qid, producer_group, born_host=born_host, born_timestamp=born_timestamp)
        self._after_store(topic, qid, cfg)
        self.tracer.stored(topic, [result], [msg], born_timestamp, status="HALF",
                           detail="transaction half message (invisible until committed)")
        return {"status": str(self._send_status(result.status)), "transaction_id": result.msg_id,
                "msg_id": result.msg_id, "offset_msg_id": result.offset_msg_id, "topic": topic,
                "broker_name": self.name, "queue_id": qid, "queue_offset": result.queue_offset,
                "store_timestamp": result.store_timestamp}

    def end_transaction(self, transaction_id: str, producer_group: str, action: str,
                        from_check: bool = False) -> dict[str, Any]:
        """COMMIT (the message becomes visible), ROLLBACK (never) or UNKNOWN (checks go on) an open transaction.

        TRANSACTION_NOT_FOUND for an unknown or settled id (nothing changes).
        """
        validate_group(producer_group)
        if not isinstance(action, str):
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, "action must be COMMIT, ROLLBACK or UNKNOWN")
        action = action.upper()
        with self._operation():
            put = self._tx().end(transaction_id, producer_group, action)
        if action in (COMMIT, ROLLBACK):
            self.checks.discard(transaction_id, producer_group)
        send_result = None
        if put is not None:
            send_result = SendResult(self._send_status(put.status), put.msg_id, put.offset_msg_id, put.topic,
                                     self.name, put.queue_id, put.queue_offset, put.store_timestamp,
                                     put.commitlog_offset).to_dict()
        log.debug("transaction %s of %s: %s (from check: %s)", transaction_id, producer_group, action, from_check)
        return {"transaction_id": transaction_id, "action": action, "send_result": send_result}

    def _offer_check(self, request: CheckRequest) -> bool:
        # Queued even when no producer is known: one that connects later takes it at once.
        self.checks.offer(request)
        return self.clients.has_producer(request.producer_group)

    async def poll_checks(self, producer_group: str, client_id: str | None = None,
                          wait_ms: int = 0) -> list[dict[str, Any]]:
        """Long poll for check-backs due for ``producer_group`` (each goes to one poller); [] at the timeout.

        A polling ``client_id`` counts as a live producer of the group (a heartbeat).
        """
        validate_group(producer_group)
        _check_int("wait_ms", wait_ms, 0, 2**31 - 1)
        if client_id:
            self.clients.heartbeat(client_id, [producer_group])
        timeout = min(wait_ms, self.config.long_polling_max_ms * 2) / 1000.0 if self.running else 0.0
        taken = await self.checks.poll(producer_group, timeout)
        return [{"transaction_id": c.transaction_id, "topic": c.topic, "msg_id": c.transaction_id,
                 "offset_msg_id": c.half_offset_msg_id, "check_times": c.check_times, "body": c.body,
                 "properties": c.properties} for c in taken]

    # ================================================================== message trace
    def record_trace(self, events: Sequence[Any]) -> dict[str, Any]:
        """Buffer client events (``send``, ``consume``) for the trace topic; all validated first.

        INVALID_ARGUMENT (nothing recorded) for a bad event or more than ``MAX_POSTED_EVENTS``.
        ``accepted`` is 0 when tracing is off here, or ``dropped`` counts them when the buffer is full.
        """
        if not isinstance(events, Sequence) or isinstance(events, str | bytes):
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, "events must be a list of trace events")
        if len(events) > MAX_POSTED_EVENTS:
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT,
                               f"{len(events)} events in one request; at most {MAX_POSTED_EVENTS}")
        checked = []
        for i, data in enumerate(events):
            try:
                checked.append(validate_event(data))
            except SparkMQError as exc:
                raise SparkMQError(exc.code, f"event {i}: {exc.message}") from None
        if not self.tracer.enabled:
            return {"accepted": 0, "dropped": 0, "enabled": False}
        ok = self.tracer.add_events(checked)
        return {"accepted": len(checked) if ok else 0, "dropped": 0 if ok else len(checked), "enabled": True}

    def trace(self, msg_id: str) -> dict[str, Any]:
        """A message's path from this broker's ``message_trace`` table: events in order with elapsed times."""
        return {"msg_id": msg_id, "broker": self.name, "events": self.trace_lookup.path(msg_id)}

    # ================================================================== offset reset
    def reset_offsets(self, group: str, topic: str, *, timestamp: int | None = None,
                      offsets: dict[int, int] | None = None) -> dict[str, Any]:
        """Move ``group``'s offsets on ``topic`` to the first message at/after ``timestamp`` or to ``offsets``.

        The group's version moves (``/consumers/{group}/changes`` answers), so running
        consumers re-read their offsets, and a pull of the group elsewhere on a reset queue
        answers ``OFFSET_RESET`` with the new offset; until the consumer pulls there, its
        commits of other offsets are ignored (a stale commit cannot undo the reset).
        GROUP_NOT_EXIST when the group has no members and no committed offsets here;
        QUEUE_ID_ILLEGAL / OFFSET_ILLEGAL for bad entries (an offset beyond the queue's
        max); nothing changes on error.
        """
        validate_group(group)
        cfg = self.topics.require(topic)
        if (timestamp is None) == (offsets is None):
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, "give either timestamp or offsets")
        if not self.clients.members(group) and not self.offsets.topics_of(group):
            raise SparkMQError(ErrorCode.GROUP_NOT_EXIST, f"consumer group {group!r} is not known on {self.name}")
        new: dict[int, int] = {}
        if timestamp is not None:
            _check_int("timestamp", timestamp, 0, 2**63 - 1)
            for queue_id in range(cfg.read_queue_nums):
                new[queue_id] = self.store.offset_by_time(topic, queue_id, timestamp)
        else:
            assert offsets is not None
            if not offsets:
                raise SparkMQError(ErrorCode.INVALID_ARGUMENT, "offsets is empty")
            for queue_id, offset in offsets.items():
                _check_int("queue_id", queue_id, 0, cfg.read_queue_nums - 1, ErrorCode.QUEUE_ID_ILLEGAL)
                high = self.store.max_offset(topic, queue_id)
                _check_int(f"offset of queue {queue_id}", offset, 0, high, ErrorCode.OFFSET_ILLEGAL)
                new[queue_id] = offset
        # Clustering: the new offsets are fenced until each queue's consumer pulls there (ConsumerOffsetManager).
        # Broadcasting consumers keep their offsets themselves, one per member: no fence to settle.
        broadcasting = self.clients.group_info(group).message_model is MessageModel.BROADCASTING \
            and bool(self.clients.members(group))
        self.offsets.reset(group, topic, new, fence=not broadcasting)
        for queue_id in new:
            self.holds.notify_put(topic, queue_id)  # held pulls of the group come back with OFFSET_RESET
        version = self.clients.bump_version(group)
        log.info("group %s reset on %s to %s", group, topic, new)
        return {"group": group, "topic": topic, "offsets": {str(q): o for q, o in sorted(new.items())},
                "version": version}

    # ================================================================== consumer offsets
    def commit_offsets(self, group: str, entries: Iterable[tuple[str, int, int]]) -> int:
        """Commit ``(topic, queue_id, offset)`` entries for ``group``, all or nothing; returns how many were applied.

        An entry is not applied while an offset reset of its queue waits for the consumer (see
        :meth:`reset_offsets`); every entry is validated before any is applied.
        """
        validate_group(group)
        checked = []
        for entry in entries:
            topic, queue_id, offset = entry
            cfg = self.topics.require(topic)
            _check_int("queue_id", queue_id, 0, cfg.queue_count - 1, ErrorCode.QUEUE_ID_ILLEGAL)
            _check_int("offset", offset, 0, 2**63 - 1, ErrorCode.OFFSET_ILLEGAL)
            checked.append((topic, queue_id, offset))
        return sum(self.offsets.commit(group, topic, queue_id, offset) for topic, queue_id, offset in checked)

    def query_offsets(self, group: str, topic: str | None = None) -> dict[str, dict[int, int]]:
        """``{topic: {queue_id: offset}}`` of ``group`` (one topic when given)."""
        if topic is not None:
            return {topic: self.offsets.offsets_of(group, topic)}
        return self.offsets.offsets_of(group)

    def query_offset(self, group: str, topic: str, queue_id: int) -> int:
        """The committed offset, or -1 when ``group`` never committed one there."""
        committed = self.offsets.query(group, topic, queue_id)
        return -1 if committed is None else committed

    def lag(self, group: str, topic: str | None = None) -> dict[str, Any]:
        """Per read queue: broker offset, consumer offset (-1 = none) and lag; topics of the group when none given."""
        validate_group(group)
        if topic is not None:
            configs = [self.topics.require(topic)]
        else:
            names = set(self.offsets.topics_of(group)) | set(self.clients.subscribed_topics(group))
            configs = [cfg for n in sorted(names) if (cfg := self.topics.get(n)) is not None]
        queues = []
        for cfg in configs:
            for queue_id in range(cfg.read_queue_nums):
                max_offset = self.store.max_offset(cfg.topic, queue_id)
                min_offset = self.store.min_offset(cfg.topic, queue_id)
                lag = self.offsets.lag(group, cfg.topic, queue_id, max_offset, min_offset)
                queues.append({"topic": cfg.topic, "queue_id": queue_id, "broker_offset": max_offset,
                               "consumer_offset": self.query_offset(group, cfg.topic, queue_id), "lag": lag})
        return {"group": group, "total_lag": sum(q["lag"] for q in queues), "queues": queues}

    # ================================================================== topics
    def create_or_update_topic(self, topic: str, read_queue_nums: int = 16, write_queue_nums: int = 16,
                               perm: int = 6, order: bool = False, topic_sys_flag: int = 0) -> TopicConfig:
        """Create or update an ordinary topic (NO_PERMISSION for system topics); registration follows at once."""
        return self.topics.create_or_update(topic, read_queue_nums, write_queue_nums, perm, order, topic_sys_flag)

    def delete_topic(self, topic: str) -> bool:
        """Delete a topic's config and every group's offsets of it; False when it did not exist.

        Its stored messages stay in the commit log until retention removes them.
        """
        deleted = self.topics.delete(topic)
        self.offsets.remove_topic(topic)
        self._round_robin.pop(topic, None)
        return deleted

    def get_topic(self, topic: str) -> TopicConfig:
        """One topic's config (TOPIC_NOT_EXIST)."""
        return self.topics.require(topic)

    def list_topics(self) -> list[TopicConfig]:
        """Every topic, sorted."""
        return self.topics.list()

    def topic_stats(self, topic: str) -> dict[str, Any]:
        """Min/max offset and last store time of each of the topic's queues."""
        cfg = self.topics.require(topic)
        log_ = self.store.commit_log
        queues = []
        for queue_id in range(cfg.queue_count):
            cq = log_.consume_queue(topic, queue_id)
            lo, hi, last = (cq.min_offset, cq.max_offset, 0) if cq is not None else (0, 0, 0)
            if hi > lo:
                try:
                    last = log_.store_timestamp_at(cq.unit(hi - 1)[0])  # type: ignore[union-attr]
                except StoreError:  # retention removed it meanwhile
                    last = 0
            queues.append({"queue_id": queue_id, "min_offset": lo, "max_offset": hi, "last_store_timestamp": last})
        return {"topic": topic, "queues": queues}

    # ================================================================== clients and groups
    def heartbeat(self, client_id: str, producer_groups: Iterable[str] = (),
                  consumers: Sequence[ConsumerData] = ()) -> dict[str, int]:
        """Record a client heartbeat; returns each consumer group's membership version.

        Clustering groups get their retry topic ``%RETRY%<group>`` (1 queue), as in RocketMQ.
        Every subscription's expression is compiled first: a malformed one refuses the whole
        heartbeat with FILTER_EXPRESSION_ILLEGAL and changes nothing.
        """
        for data in consumers:
            for sub in getattr(data, "subscriptions", ()):
                try:
                    cached_filter(sub.expression, str(sub.type))
                except SparkMQError as exc:
                    raise SparkMQError(exc.code, f"group {data.group}, topic {sub.topic}: {exc.message}") from None
        versions = self.clients.heartbeat(client_id, producer_groups, consumers)
        for data in consumers:
            if data.message_model is MessageModel.CLUSTERING:
                self.topics.ensure_system_topic(retry_topic(data.group))
        return versions

    def unregister_client(self, client_id: str, producer_groups: Iterable[str] = (),
                          consumer_groups: Iterable[str] = ()) -> dict[str, int]:
        """Remove a client from groups (it is shutting down); returns the consumer groups' versions."""
        return self.clients.unregister(client_id, producer_groups, consumer_groups)

    def group_info(self, group: str) -> GroupInfo:
        """A consumer group's members, version and subscriptions."""
        return self.clients.group_info(group)

    async def wait_group_change(self, group: str, version: int, wait_ms: int) -> tuple[int, list[str]]:
        """Long-poll a group's membership: answers when its version differs from ``version`` or at ``wait_ms``."""
        _check_int("version", version, 0, 2**63 - 1)
        _check_int("wait_ms", wait_ms, 0, 2**31 - 1)
        timeout = wait_ms / 1000.0 if self.running else 0.0
        return await self.clients.wait_change(group, version, timeout)

    def _on_clients_left(self, group: str, client_ids: list[str]) -> None:
        # A client that left cannot consume: free its orderly locks for the next owner at once.
        for client_id in client_ids:
            self.locks.unlock_client(group, client_id)

    # ================================================================== queue locks
    def lock_queues(self, group: str, client_id: str, queues: Iterable[QueueRef]) -> list[QueueRef]:
        """Lock (or renew) queues for orderly consumption; returns those now held by ``client_id``."""
        return self.locks.lock(group, client_id, queues)

    def unlock_queues(self, group: str, client_id: str, queues: Iterable[QueueRef]) -> list[QueueRef]:
        """Release queues ``client_id`` holds; returns those released."""
        return self.locks.unlock(group, client_id, queues)

    # ================================================================== registration
    def registration_payload(self) -> dict[str, Any]:
        """The ``POST /brokers/register`` body: identity, data version and the whole topic table."""
        version, topics = self.topics.snapshot()
        return {"cluster": self.config.cluster, "broker_name": self.name, "broker_id": self.config.broker_id,
                "broker_addr": self.addr, "ha_addr": None, "data_version": version,
                "topic_configs": {t: cfg.to_route_dict() for t, cfg in topics.items()}}

    def _unregister_payload(self) -> dict[str, Any]:
        return {"cluster": self.config.cluster, "broker_name": self.name, "broker_id": self.config.broker_id,
                "broker_addr": self.addr}

    # ================================================================== info, health, metrics
    def info(self) -> dict[str, Any]:
        """What ``GET /broker`` answers."""
        commitlog: dict[str, int | None] = {"min_offset": None, "max_offset": None, "flushed_offset": None}
        with contextlib.suppress(SparkMQError):
            log_ = self.store.commit_log
            commitlog = {"min_offset": log_.min_offset, "max_offset": log_.max_offset,
                         "flushed_offset": log_.flushed_offset}
        return {"cluster": self.config.cluster, "broker_name": self.name, "broker_id": self.config.broker_id,
                "addr": self.addr, "role": str(self.config.role), "namesrv_addrs": list(self.config.namesrv_addrs),
                "commitlog": commitlog, "topics": len(self.topics), "clients": self.clients.client_count()}

    def add_component(self, name: str, status: Callable[[], dict[str, Any]],
                      healthy: Callable[[], bool] | None = None) -> None:
        """Report an attached component (e.g. the lake's Spark jobs) in ``/health`` under ``name``.

        ``status()`` is shown as is; ``healthy()`` (default: always) makes the broker "degraded"
        when False.  Delivery never depends on such a component (DESIGN principle 1).
        """
        self._components[name] = (status, healthy or (lambda: True))

    def health(self) -> dict[str, Any]:
        """``{"status": "ok"|"degraded", ...}`` with the state of each component."""
        store_ok = self.running
        if store_ok:
            try:
                self.store.commit_log  # noqa: B018  # raises SERVICE_NOT_AVAILABLE when the store is closed
            except SparkMQError:
                store_ok = False
        persist_error = self.offsets.last_persist_error
        namesrvs = {addr: s.to_dict() for addr, s in self.registration.status().items()}
        # Before the first registration round finishes a name server counts as healthy.
        registration_ok = all(s["ok"] or (s["registrations"] == 0 and s["failures"] == 0) for s in namesrvs.values())
        components = {}
        for name, (status, healthy) in self._components.items():
            try:
                components[name] = {**status(), "ok": bool(healthy())}
            except Exception as exc:  # a component's report must not break /health
                components[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        ok = store_ok and persist_error is None and registration_ok and all(c["ok"] for c in components.values())
        return {"status": "ok" if ok else "degraded", "state": self._state, **components,
                "store": {"ok": store_ok, "clean_start": self.store.clean_start},
                "offsets": {"ok": persist_error is None, "pending": self.offsets.dirty_count(),
                            "last_error": None if persist_error is None else str(persist_error)},
                "namesrv": namesrvs, "held_pulls": self.holds.held()}

    def metrics_text(self) -> bytes:
        """The Prometheus text exposition."""
        return self.metrics.render()

    def _scrape_commitlog_max(self) -> int:
        try:
            return self.store.commit_log.max_offset
        except SparkMQError:
            return 0

    def _scrape_queue_max(self) -> Iterator[tuple[str, int, int]]:
        try:
            log_ = self.store.commit_log
            refs = log_.queues()
        except SparkMQError:
            return
        for topic, queue_id in refs:
            cq = log_.consume_queue(topic, queue_id)
            if cq is not None and self.topics.get(topic) is not None:
                yield topic, queue_id, cq.max_offset

    def _scrape_group_lag(self) -> Iterator[tuple[str, str, int]]:
        if not self.running:
            return
        for group in self.offsets.groups():
            for topic in self.offsets.topics_of(group):
                with contextlib.suppress(SparkMQError):
                    yield group, topic, self.lag(group, topic)["total_lag"]
