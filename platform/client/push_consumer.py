"""The push consumer: pulls in the background and hands messages to a listener on a thread pool.

Concurrent consumption (RocketMQ's ``MessageListenerConcurrently``): messages of one queue
may be consumed by several threads at once, so they finish out of order; the offset
committed every 5 s is the smallest one still unfinished (:mod:`.process_queue`).

**A message the listener refuses** (it returns ``RECONSUME_LATER``, returns nothing, or
raises) is, in clustering mode, first offered to :meth:`PushConsumer.send_message_back` --
the hook where the ``%RETRY%<group>`` topic will plug in (a later issue).  Until then the
hook declines, and the message is **redelivered locally**: it stays unfinished in its
process queue (so the committed offset cannot pass it, and if this consumer dies the
next owner of the queue gets it again), its ``reconsume_times`` goes up by one, and it is
handed to the listener again after ``reconsume_delay_s`` (5 s, as RocketMQ's
``submitConsumeRequestLater`` does when a send-back fails).  While it keeps failing the
queue's offset span grows and flow control eventually pauses that queue -- the price of
not losing it.  In broadcasting mode a refused message is dropped with a warning, as in
RocketMQ (broadcast messages are not retried).

Example::

    consumer = PushConsumer("cg", ClientConfig(namesrv_addrs="127.0.0.1:9876"))
    consumer.subscribe("orders", "TagA || TagB")
    consumer.register_listener(lambda msgs: ConsumeStatus.CONSUME_SUCCESS)
    consumer.start()
    ...
    consumer.shutdown()
"""
from __future__ import annotations

import concurrent.futures
import logging
import threading
from collections.abc import Callable
from enum import StrEnum

from ..common.errors import ErrorCode, SparkMQError
from ..common.wire import ReceivedMessage
from .allocation import DEFAULT_STRATEGY, AllocateStrategy
from .config import ClientConfig
from .consumer_base import ConsumerBase
from .process_queue import ProcessQueue
from .rebalance import ConsumeFromWhere, MessageModel

__all__ = ["PushConsumer", "ConsumeStatus", "MessageListener"]

log = logging.getLogger("sparkmq.client")


class ConsumeStatus(StrEnum):
    """What a listener says about the messages it was given."""

    #: Consumed: the messages are finished.
    CONSUME_SUCCESS = "CONSUME_SUCCESS"
    #: Not consumed: deliver them again later.
    RECONSUME_LATER = "RECONSUME_LATER"


#: ``listener(messages) -> ConsumeStatus``; at most ``consume_batch_size`` messages of one queue per call.
MessageListener = Callable[[list[ReceivedMessage]], ConsumeStatus]


class PushConsumer(ConsumerBase):
    """A consumer of one group that calls a listener for every message of its subscriptions.

    Args:
        group: the consumer group.
        config: client settings (name servers, intervals, pool size, flow control).
        message_model: ``"CLUSTERING"`` (default; each message to one member) or ``"BROADCASTING"``.
        allocate_strategy: ``"averagely"`` (default), ``"averagely-by-circle"``, ``"consistent-hash"``
            (any case, ``_`` or ``-``) or an :class:`AllocateStrategy`.
        consume_from_where: start of a group with no committed offset: ``CONSUME_FROM_LAST_OFFSET``
            (default), ``CONSUME_FROM_FIRST_OFFSET`` or ``CONSUME_FROM_TIMESTAMP``
            (``config.consume_timestamp_ms``, default now - 30 min).
    """

    consume_type = "PUSH"

    def __init__(self, group: str, config: ClientConfig, message_model: str | MessageModel = MessageModel.CLUSTERING,
                 allocate_strategy: str | AllocateStrategy = DEFAULT_STRATEGY,
                 consume_from_where: str | ConsumeFromWhere = ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET) -> None:
        super().__init__(group, config, message_model=message_model, allocate_strategy=allocate_strategy,
                         consume_from_where=consume_from_where)
        self._listener: MessageListener | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._stats_lock = threading.Lock()
        self._stats = {"consumed": 0, "failed": 0, "redelivered": 0, "dropped": 0}

    def register_listener(self, listener: MessageListener) -> None:
        """Set the function called with each batch of messages; it returns a :class:`ConsumeStatus`."""
        if not callable(listener):
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, "the listener must be callable")
        self._listener = listener

    def start(self) -> PushConsumer:
        """Join the group, take a share of the queues and start consuming; returns self.

        The first rebalance is done before this returns, so :meth:`assignment` is already filled in
        (as far as the brokers already know the other members).
        """
        if self._listener is None:
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, "register_listener() before start()")
        if not self._subscriptions:
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, "subscribe() to at least one topic before start()")
        self._executor = concurrent.futures.ThreadPoolExecutor(self.config.consume_threads,
                                                               thread_name_prefix=f"sparkmq-consume-{self.group}")
        try:
            self._start_base()
        except BaseException:
            self._executor.shutdown(wait=False, cancel_futures=True)
            raise
        return self

    def shutdown(self) -> None:
        """Stop pulling, let running listener calls finish (queued ones are abandoned, not committed),
        commit offsets, leave the group and close connections.

        Call it from outside the listener: it waits for running listener calls to return.
        """
        def drain() -> None:
            if self._executor is not None:
                self._executor.shutdown(wait=True, cancel_futures=True)
        self._shutdown_base(before_commit=drain)

    def __enter__(self) -> PushConsumer:
        return self.start() if self._state == "created" else self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    @property
    def stats(self) -> dict[str, int]:
        """Counters: messages ``consumed``, listener ``failed`` messages, ``redelivered`` (local), ``dropped``."""
        with self._stats_lock:
            return dict(self._stats)

    def _count(self, key: str, n: int) -> None:
        with self._stats_lock:
            self._stats[key] += n

    # -- consumption -----------------------------------------------------------------------------
    def _on_pulled(self, pq: ProcessQueue, messages: list[ReceivedMessage]) -> None:
        size = self.config.consume_batch_size
        for i in range(0, len(messages), size):
            self._submit(pq, messages[i:i + size])

    def _submit(self, pq: ProcessQueue, batch: list[ReceivedMessage]) -> None:
        if self._executor is None or pq.dropped:
            return
        try:
            self._executor.submit(self._consume, pq, batch)
        except RuntimeError:  # shutting down: the messages stay unfinished and are not committed
            pass

    def _consume(self, pq: ProcessQueue, batch: list[ReceivedMessage]) -> None:
        if pq.dropped:  # the queue moved to another member, which will deliver these
            return
        assert self._listener is not None
        try:
            status = self._listener(list(batch))
        except Exception:
            log.exception("listener of %s failed on %d messages of %s@%s; reconsuming later", self.group,
                          len(batch), pq.mq.topic, pq.mq.key)
            status = ConsumeStatus.RECONSUME_LATER
        if status is not ConsumeStatus.CONSUME_SUCCESS and status != ConsumeStatus.CONSUME_SUCCESS.value:
            if status is None:
                log.warning("listener of %s returned None; treating it as RECONSUME_LATER", self.group)
            self._on_failure(pq, batch)
            return
        pq.remove(batch)
        self._count("consumed", len(batch))

    def _on_failure(self, pq: ProcessQueue, batch: list[ReceivedMessage]) -> None:
        self._count("failed", len(batch))
        if self.message_model is MessageModel.BROADCASTING:
            log.warning("broadcast consumer %s dropped %d refused messages (not retried)", self.group, len(batch))
            pq.remove(batch)
            self._count("dropped", len(batch))
            return
        sent_back = [m for m in batch if self.send_message_back(m)]
        if sent_back:
            pq.remove(sent_back)
        later = [m for m in batch if m not in sent_back]
        if not later:
            return
        for msg in later:
            msg.reconsume_times += 1
        self._count("redelivered", len(later))
        delay = self.config.reconsume_delay_s
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            loop.call_soon_threadsafe(loop.call_later, delay, self._submit, pq, later)
        except RuntimeError:  # stopping: they stay unfinished, so the next owner gets them
            pass

    def send_message_back(self, msg: ReceivedMessage) -> bool:
        """Hand a refused message to the broker's retry path; whether it took it.

        Hook for the ``%RETRY%<group>`` topic (delay level 3 + reconsume times, then ``%DLQ%``),
        which a later issue adds.  For now it returns False and the message is redelivered
        locally (see the module docstring).  Subclasses may override it.
        """
        return False
