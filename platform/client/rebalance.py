"""Rebalance: which queues this consumer pulls (RocketMQ's ``RebalanceImpl``).

For every subscribed topic, a clustering consumer takes the topic's read queues (sorted),
the group's member ids from a broker serving the topic (``GET /consumers/{group}``,
sorted), runs the allocation strategy, and diffs the result with what it pulls now:

* a queue no longer allocated is *dropped*: its pulling stops, its offset (the smallest
  unfinished one) is committed at once and forgotten locally -- the new owner starts there;
* a new queue starts at the group's committed offset, or, for a group that never
  committed one, where ``consume_from_where`` says: LAST_OFFSET -> the queue's max offset,
  FIRST_OFFSET -> its min offset, TIMESTAMP -> the first offset stored at or after the
  consume timestamp (``/offsets?timestamp=``).

A broadcasting consumer takes every read queue.  A pull consumer with :meth:`RebalanceImpl.assign`
takes exactly the queues given.  The owner calls :meth:`RebalanceImpl.rebalance` every 20 s and
whenever a broker says the group's membership changed.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum

from ..common.errors import ErrorCode, SparkMQError
from ..common.filtering import FILTER_SQL92, FILTER_TAG, compile_filter
from ..common.protocol import ConsumeFromWhere, MessageModel
from .allocation import AllocateStrategy, MessageQueue, strategy_by_name
from .config import DEFAULT_CONSUME_TIMESTAMP_BACK_S
from .offset_store import OffsetStore, ReadOffsetType
from .process_queue import ProcessQueue
from .remoting import BrokerClientPool
from .routes import TopicRouteCache

__all__ = [
    "MessageModel",
    "ConsumeFromWhere",
    "Subscription",
    "RebalanceImpl",
    "resolve_strategy",
    "RETRY_TOPIC_PREFIX",
    "MessageSelector",
]

log = logging.getLogger("sparkmq.client")

#: Retry topics (a later issue) always start at their first offset.
RETRY_TOPIC_PREFIX = "%RETRY%"


def _enum(cls: type[StrEnum], value: object, what: str) -> StrEnum:
    try:
        return cls(str(value).upper())
    except ValueError:
        known = ", ".join(m.value for m in cls)
        raise SparkMQError(ErrorCode.INVALID_ARGUMENT, f"unknown {what} {value!r}; known: {known}") from None


def resolve_strategy(strategy: str | AllocateStrategy) -> AllocateStrategy:
    """An allocation strategy from an instance or a name in either spelling.

    Example::

        >>> resolve_strategy("AVERAGELY_BY_CIRCLE").name
        'averagely-by-circle'
    """
    if isinstance(strategy, AllocateStrategy):
        return strategy
    if not isinstance(strategy, str):
        raise SparkMQError(ErrorCode.INVALID_ARGUMENT, f"unknown allocation strategy {strategy!r}")
    return strategy_by_name(strategy.strip().lower().replace("_", "-"))


@dataclass(frozen=True)
class MessageSelector:
    """A subscription expression and its type (RocketMQ's ``MessageSelector``).

    Example::

        >>> MessageSelector.by_sql("a > 5").filter_type
        'SQL92'
        >>> MessageSelector.by_tag("A || B").expression
        'A || B'
    """

    expression: str
    filter_type: str = FILTER_TAG

    @classmethod
    def by_tag(cls, expression: str = "*") -> MessageSelector:
        """A tag expression: ``"*"`` or ``"A || B"``."""
        return cls(expression or "*", FILTER_TAG)

    @classmethod
    def by_sql(cls, expression: str) -> MessageSelector:
        """An SQL92 expression over message properties (evaluated on the broker)."""
        return cls(expression, FILTER_SQL92)


@dataclass(frozen=True)
class Subscription:
    """A topic and its filter: a tag expression (``"*"`` or ``"A || B"``) or an SQL92 expression.

    Example::

        >>> s = Subscription.parse("t", "TagA || TagB")
        >>> s.matches("TagB"), s.matches("TagC"), s.matches(None)
        (True, False, False)
        >>> Subscription.parse("t", "*").matches(None)
        True
        >>> Subscription.parse("t", "a > 1", "SQL92").to_dict()["type"]
        'SQL92'
    """

    topic: str
    expression: str
    #: None = every message (the client re-check lets everything through; SQL92 is decided by the broker).
    tags: frozenset[str] | None
    filter_type: str = FILTER_TAG

    @classmethod
    def parse(cls, topic: str, expression: str | None, filter_type: str = FILTER_TAG) -> Subscription:
        """Parse ``expression``; INVALID_ARGUMENT when a tag expression names no tag,
        FILTER_EXPRESSION_ILLEGAL (with the error's position) for a malformed SQL92 one."""
        kind = (filter_type or FILTER_TAG).upper()
        if kind != FILTER_TAG:
            # Compile locally first: a malformed expression fails here, at subscribe, with its position.
            compile_filter(expression, kind)
            return cls(topic, str(expression).strip(), None, kind)
        expr = (expression or "*").strip()
        if expr in ("", "*"):
            return cls(topic, "*", None)
        tags = frozenset(t.strip() for t in expr.split("||") if t.strip())
        if not tags or "*" in tags:
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, f"bad tag expression {expression!r}; use '*' or 'A || B'")
        return cls(topic, " || ".join(sorted(tags)), tags)

    def matches(self, tag: str | None) -> bool:
        """Whether a message with ``tag`` belongs to this subscription (the client's tag re-check)."""
        return self.tags is None or (tag is not None and tag in self.tags)

    def to_dict(self) -> dict[str, str]:
        """The heartbeat's form."""
        return {"topic": self.topic, "expression": self.expression, "type": self.filter_type}


class RebalanceImpl:
    """The queues one consumer holds, and the rebalance that changes them.

    Thread-safe (one lock around the process queue table).  ``on_added(pq)`` is called for
    every queue taken on (start pulling it), ``on_removed(pq)`` for every queue dropped
    (stop pulling it) -- after its offset was committed.
    """

    def __init__(self, group: str, client_id: str, *, message_model: MessageModel,
                 strategy: AllocateStrategy, consume_from_where: ConsumeFromWhere,
                 consume_timestamp_ms: int | None, subscriptions: dict[str, Subscription],
                 routes: TopicRouteCache, brokers: BrokerClientPool, offset_store: OffsetStore,
                 new_process_queue: Callable[[MessageQueue, int], ProcessQueue],
                 on_added: Callable[[ProcessQueue], None], on_removed: Callable[[ProcessQueue], None]) -> None:
        self.group = group
        self.client_id = client_id
        self.message_model = message_model
        self.strategy = strategy
        self.consume_from_where = consume_from_where
        self.consume_timestamp_ms = consume_timestamp_ms
        self.subscriptions = subscriptions
        self._routes = routes
        self._brokers = brokers
        self.offset_store = offset_store
        self._new_pq = new_process_queue
        self._on_added = on_added
        self._on_removed = on_removed
        self._lock = threading.RLock()
        self._pqs: dict[MessageQueue, ProcessQueue] = {}
        self._fixed: set[MessageQueue] | None = None
        #: Called when the group's member list lacks this client (so the owner heartbeats again).
        self.on_not_member: Callable[[str], None] | None = None
        #: Orderly consumers: may a newly allocated queue be taken (its broker lock obtained)?  False = not now.
        self.before_add: Callable[[MessageQueue], bool] | None = None
        #: Orderly consumers: called after a dropped queue's offset was committed (to release its broker lock).
        self.after_remove: Callable[[ProcessQueue], None] | None = None

    # -- views --------------------------------------------------------------------------------
    def process_queues(self) -> dict[MessageQueue, ProcessQueue]:
        """The queues held now and their process queues (a copy)."""
        with self._lock:
            return dict(self._pqs)

    def assignment(self) -> list[MessageQueue]:
        """The queues held now, sorted."""
        with self._lock:
            return sorted(self._pqs)

    @property
    def fixed_assignment(self) -> frozenset[MessageQueue] | None:
        """The queues given to :meth:`assign`, or None when the rebalance decides."""
        with self._lock:
            return frozenset(self._fixed) if self._fixed is not None else None

    def assign(self, queues: Iterable[MessageQueue]) -> None:
        """Hold exactly ``queues`` from now on (a pull consumer's manual assignment); applied by :meth:`rebalance`."""
        with self._lock:
            self._fixed = set(queues)

    # -- the rebalance ------------------------------------------------------------------------
    def rebalance(self) -> bool:
        """Recompute the assignment of every topic; whether it changed."""
        changed = False
        with self._lock:
            if self._fixed is not None:
                wanted_by_topic: dict[str, set[MessageQueue]] = {}
                for mq in self._fixed:
                    wanted_by_topic.setdefault(mq.topic, set()).add(mq)
                topics = set(wanted_by_topic) | {mq.topic for mq in self._pqs}
                for topic in sorted(topics):
                    changed |= self._update(topic, wanted_by_topic.get(topic, set()))
                return changed
            for topic in sorted(self.subscriptions):
                wanted = self._allocate(topic)
                if wanted is not None:
                    changed |= self._update(topic, wanted)
            for topic in sorted({mq.topic for mq in self._pqs} - set(self.subscriptions)):
                changed |= self._update(topic, set())  # unsubscribed
        return changed

    def members(self, topic: str) -> list[str] | None:
        """The group's member ids as a broker serving ``topic`` sees them (None when no broker answers)."""
        route = self._routes.cached(topic)
        if route is None:
            return None
        # Masters first: heartbeats reach them first and they hold the authoritative view.
        addrs = route.master_addrs() + [a for a in route.all_addrs() if a not in route.master_addrs()]
        for addr in addrs:
            try:
                return self._brokers.get(addr).consumer_ids(self.group)
            except SparkMQError as exc:
                log.debug("group %s members from %s failed: %s", self.group, addr, exc)
        return None

    def _allocate(self, topic: str) -> set[MessageQueue] | None:
        try:
            route = self._routes.get(topic)
        except SparkMQError as exc:
            log.debug("no route for %s yet: %s", topic, exc)
            return None
        queues = list(route.read_queues)
        if self.message_model is MessageModel.BROADCASTING:
            return set(queues)
        members = self.members(topic)
        if members is None:
            log.warning("rebalance of %s/%s skipped: no broker answered with the group's members", self.group, topic)
            return None
        if self.client_id not in members:
            # Our heartbeat has not reached that broker yet (or it expired us): keep what we hold
            # instead of dropping everything, and heartbeat again; the next round settles it.
            log.info("rebalance of %s/%s: %s is not among the members %s yet", self.group, topic,
                     self.client_id, members)
            if self.on_not_member is not None:
                self.on_not_member(topic)
            return None
        return set(self.strategy.allocate(self.group, self.client_id, queues, members))

    def _update(self, topic: str, wanted: set[MessageQueue]) -> bool:
        changed = False
        for mq in sorted(mq for mq in self._pqs if mq.topic == topic and mq not in wanted):
            self._remove(mq)
            changed = True
        for mq in sorted(wanted - set(self._pqs)):
            # The lock first: the previous owner commits before it unlocks, so the offset read after
            # the lock is the one it left.
            if self.before_add is not None and not self.before_add(mq):
                log.info("%s cannot lock %s@%s yet; trying at the next rebalance", self.client_id, topic, mq.key)
                continue
            try:
                offset = self.compute_pull_from_where(mq)
            except SparkMQError as exc:
                # Leave it for the next round rather than guess a start (which could skip or repeat).
                log.warning("cannot find where to start %s@%s for %s: %s", topic, mq.key, self.group, exc)
                continue
            pq = self._new_pq(mq, offset)
            self._pqs[mq] = pq
            self.offset_store.update(mq, offset)
            log.info("%s takes %s@%s from offset %d", self.client_id, topic, mq.key, offset)
            self._on_added(pq)
            changed = True
        return changed

    def _remove(self, mq: MessageQueue) -> None:
        pq = self._pqs.pop(mq)
        pq.drop()
        self._on_removed(pq)
        self.offset_store.update(mq, pq.commit_offset())
        try:
            self.offset_store.persist(mq)
        except SparkMQError as exc:
            log.warning("committing the offset of dropped %s@%s failed: %s", mq.topic, mq.key, exc)
        self.offset_store.remove(mq)
        log.info("%s drops %s@%s at offset %d", self.client_id, mq.topic, mq.key, pq.commit_offset())
        if self.after_remove is not None:
            self.after_remove(pq)

    def replace(self, mq: MessageQueue, offset: int) -> ProcessQueue:
        """Restart ``mq`` at ``offset`` with a fresh process queue (a pull consumer's seek)."""
        with self._lock:
            old = self._pqs.get(mq)
            if old is None:
                raise SparkMQError(ErrorCode.INVALID_ARGUMENT, f"{mq.topic}@{mq.key} is not assigned to this consumer")
            old.drop()
            self._on_removed(old)
            pq = self._pqs[mq] = self._new_pq(mq, offset)
            self.offset_store.update(mq, offset)
            self._on_added(pq)
            return pq

    def drop_all(self) -> list[ProcessQueue]:
        """Drop every queue without committing (the owner commits first); the dropped process queues."""
        with self._lock:
            pqs, self._pqs = list(self._pqs.values()), {}
        for pq in pqs:
            pq.drop()
            self._on_removed(pq)
        return pqs

    # -- where a new queue starts ---------------------------------------------------------------
    def compute_pull_from_where(self, mq: MessageQueue) -> int:
        """The committed offset of ``mq``, or where ``consume_from_where`` says for a queue never committed."""
        offset = self.offset_store.read(mq, ReadOffsetType.STORE)
        if offset >= 0:
            return offset
        route = self._routes.get(mq.topic)
        addr = route.read_addr(mq.broker_name)
        if addr is None:
            raise SparkMQError(ErrorCode.SERVICE_NOT_AVAILABLE, f"broker {mq.broker_name} has no address")
        broker = self._brokers.get(addr)
        cfw = self.consume_from_where
        if mq.topic.startswith(RETRY_TOPIC_PREFIX) or cfw is ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET:
            return int(broker.queue_offsets(mq.topic, mq.queue_id)["min_offset"])
        if cfw is ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET:
            return int(broker.queue_offsets(mq.topic, mq.queue_id)["max_offset"])
        ts = self.consume_timestamp_ms
        if ts is None:
            ts = int((time.time() - DEFAULT_CONSUME_TIMESTAMP_BACK_S) * 1000)
        answer = broker.queue_offsets(mq.topic, mq.queue_id, timestamp=ts)
        return int(answer.get("offset", answer["max_offset"]))


def parse_message_model(value: str | MessageModel) -> MessageModel:
    """``MessageModel`` from an enum or its name (any case)."""
    return _enum(MessageModel, value, "message model")  # type: ignore[return-value]


def parse_consume_from_where(value: str | ConsumeFromWhere) -> ConsumeFromWhere:
    """``ConsumeFromWhere`` from an enum or its name; ``LAST_OFFSET`` etc. without the prefix also work."""
    text = str(value).upper()
    if not text.startswith("CONSUME_FROM_"):
        text = "CONSUME_FROM_" + text
    return _enum(ConsumeFromWhere, text, "consume_from_where")  # type: ignore[return-value]
