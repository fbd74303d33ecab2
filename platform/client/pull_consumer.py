"""The lite pull consumer: background long polls fill a buffer, the caller ``poll()``s it (RocketMQ's
``DefaultLitePullConsumer``, Kafka's ``KafkaConsumer``).

* ``subscribe(topic, expr)`` joins the group's rebalance like a push consumer; ``assign(queues)``
  takes exactly the given queues and does not join the group (no heartbeats, no rebalance).
* ``poll(timeout)`` returns the next pulled batch.  Returned messages count as consumed: the
  queue's committable offset moves past them -- to the smallest offset not yet returned.
* ``commit()`` commits those offsets now; with ``auto_commit`` (default) they are also committed
  every ``offset_commit_interval_s`` (5 s) and on shutdown -- Kafka's semantics: a crash may
  redeliver what was polled after the last commit, never skip what was not polled.
* ``seek(queue, offset)`` restarts a held queue at ``offset``; buffered messages of it are discarded.

Example::

    consumer = PullConsumer("cg", ClientConfig(namesrv_addrs="127.0.0.1:9876"), auto_commit=False)
    consumer.subscribe("orders")
    consumer.start()
    for msg in consumer.poll(timeout=5.0):
        ...
    consumer.commit()
    consumer.shutdown()
"""
from __future__ import annotations

import logging
import queue
import time
from collections.abc import Iterable

from ..common.errors import ErrorCode, SparkMQError
from ..common.validation import check_int, validate_topic
from ..common.wire import ReceivedMessage
from .allocation import DEFAULT_STRATEGY, AllocateStrategy, MessageQueue
from .config import ClientConfig
from .consumer_base import ConsumerBase
from .offset_store import ReadOffsetType
from .process_queue import ProcessQueue
from .rebalance import ConsumeFromWhere, MessageModel

__all__ = ["PullConsumer"]

log = logging.getLogger("sparkmq.client")


class PullConsumer(ConsumerBase):
    """A consumer the caller drives with :meth:`poll`.

    Args:
        group: the consumer group (offsets are committed under it).
        config: client settings; ``pull_batch_size`` is the most messages one poll returns.
        message_model, allocate_strategy, consume_from_where: as for :class:`PushConsumer`.
        auto_commit: commit polled offsets every ``offset_commit_interval_s`` and on shutdown.
    """

    consume_type = "PULL"

    def __init__(self, group: str, config: ClientConfig, message_model: str | MessageModel = MessageModel.CLUSTERING,
                 allocate_strategy: str | AllocateStrategy = DEFAULT_STRATEGY,
                 consume_from_where: str | ConsumeFromWhere = ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
                 *, auto_commit: bool = True) -> None:
        super().__init__(group, config, message_model=message_model, allocate_strategy=allocate_strategy,
                         consume_from_where=consume_from_where)
        self.auto_commit = auto_commit
        # (process queue, messages) in pull order; entries of a dropped process queue are skipped.
        self._buffer: queue.Queue[tuple[ProcessQueue, list[ReceivedMessage]]] = queue.Queue()
        self._carry: tuple[ProcessQueue, list[ReceivedMessage]] | None = None

    def assign(self, queues: Iterable[MessageQueue]) -> None:
        """Consume exactly ``queues`` (no group rebalance); replaces any earlier assignment.

        Each starts at the group's committed offset or where ``consume_from_where`` says.
        """
        qs = list(queues)
        for mq in qs:
            if not isinstance(mq, MessageQueue):
                raise SparkMQError(ErrorCode.INVALID_ARGUMENT, f"assign() takes MessageQueues, got {mq!r}")
            validate_topic(mq.topic)
        if self._subscriptions:
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, "this consumer uses subscribe(); it cannot also assign")
        self._manual = True
        self._rebalance.assign(qs)
        if self._state == "running":
            self.rebalance()

    def start(self) -> PullConsumer:
        """Start pulling (after :meth:`subscribe` or :meth:`assign`); returns self."""
        if not self._subscriptions and not self._manual:
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, "subscribe() or assign() before start()")
        self._start_base()
        return self

    def shutdown(self) -> None:
        """Stop pulling, commit (with ``auto_commit``), leave the group and close connections."""
        self._shutdown_base(commit=self.auto_commit)

    def __enter__(self) -> PullConsumer:
        return self.start() if self._state == "created" else self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def _commit_quietly(self) -> None:
        if self.auto_commit:
            super()._commit_quietly()

    # -- buffer ----------------------------------------------------------------------------------
    def _on_pulled(self, pq: ProcessQueue, messages: list[ReceivedMessage]) -> None:
        self._buffer.put((pq, messages))

    def poll(self, timeout: float = 5.0) -> list[ReceivedMessage]:
        """Up to ``pull_batch_size`` messages of one queue, waiting up to ``timeout`` seconds ([] if none came).

        The returned messages count as consumed for the next :meth:`commit`.  Call it from one
        thread at a time (like Kafka's consumer, a pull consumer is not meant to be shared).
        """
        if self._state != "running":
            raise SparkMQError(ErrorCode.SERVICE_NOT_AVAILABLE, f"consumer {self.group} is {self._state}")
        deadline = time.monotonic() + max(0.0, timeout)
        limit = self.config.pull_batch_size
        while True:
            if self._carry is not None:
                entry, self._carry = self._carry, None
            else:
                try:
                    entry = self._buffer.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    return []
            pq, messages = entry
            if pq.dropped:
                continue  # taken away or seeked: those messages are someone else's, or will be pulled again
            taken, rest = messages[:limit], messages[limit:]
            if rest:
                self._carry = (pq, rest)
            pq.remove(taken)
            return taken

    # -- offsets -----------------------------------------------------------------------------------
    def commit(self) -> dict[MessageQueue, int]:
        """Commit the offsets of everything polled so far, synchronously; raises if a broker refused."""
        return self.commit_offsets(raise_errors=True)

    def committed(self, mq: MessageQueue) -> int:
        """The group's committed offset of ``mq`` in the store (-1 when none)."""
        return self.offset_store.read(mq, ReadOffsetType.STORE)

    def seek(self, mq: MessageQueue, offset: int) -> None:
        """Pull ``mq`` (a held queue) from ``offset`` on; it is committed at the next commit."""
        check_int("offset", offset, 0, error=ErrorCode.OFFSET_ILLEGAL)
        self._held([mq])
        if self._carry is not None and self._carry[0].mq == mq:
            self._carry = None
        self._rebalance.replace(mq, offset)

    def seek_to_beginning(self, mq: MessageQueue) -> None:
        """Seek ``mq`` to its smallest stored offset."""
        self.seek(mq, self._queue_bounds(mq)["min_offset"])

    def seek_to_end(self, mq: MessageQueue) -> None:
        """Seek ``mq`` past its last message."""
        self.seek(mq, self._queue_bounds(mq)["max_offset"])

    def _queue_bounds(self, mq: MessageQueue) -> dict[str, int]:
        route = self._routes.get(mq.topic)
        addr = route.read_addr(mq.broker_name)
        if addr is None:
            raise SparkMQError(ErrorCode.SERVICE_NOT_AVAILABLE, f"broker {mq.broker_name} has no address")
        return self._brokers.get(addr).queue_offsets(mq.topic, mq.queue_id)
