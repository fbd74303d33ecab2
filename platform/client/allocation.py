"""Consumer queue allocation: which member of a consumer group reads which queues.

In clustering mode every member of a group rebalances on its own (every 20 s and on a
broker notice) with no coordinator: each one fetches the topic's read queues and the
group's member ids, runs the same strategy, and keeps its own share.  That only works
if every member computes the *same* assignment from the same views, so strategies here
are pure functions of the sorted inputs: no I/O, no clocks, no randomness, and no
Python ``hash()`` (it is salted per process).

The strategies mirror RocketMQ's ``AllocateMessageQueueStrategy`` implementations:

* ``averagely`` (the default) -- contiguous blocks, the first ``queues % members``
  members get one extra queue;
* ``averagely-by-circle`` -- round-robin, queue ``i`` goes to member ``i % n``;
* ``consistent-hash`` -- a hash ring with virtual nodes, so a membership change moves
  only the queues of the member that came or went.

Example:
    >>> queues = [MessageQueue("orders", "broker-a", i) for i in range(4)]
    >>> strategy_by_name("averagely").allocate("g", "c1", queues, ["c2", "c1"])
    [MessageQueue(topic='orders', broker_name='broker-a', queue_id=0), \
MessageQueue(topic='orders', broker_name='broker-a', queue_id=1)]
"""
from __future__ import annotations

import bisect
import hashlib
import logging
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import ClassVar

from sparkmq.platform.common.errors import ErrorCode, SparkMQError
from sparkmq.platform.common.message import MessageQueue

from ..common.validation import check_int

__all__ = [
    "MessageQueue",
    "AllocateStrategy",
    "AllocateAveragely",
    "AllocateAveragelyByCircle",
    "AllocateConsistentHash",
    "DEFAULT_STRATEGY",
    "DEFAULT_VIRTUAL_NODES",
    "STRATEGIES",
    "strategy_by_name",
]

log = logging.getLogger(__name__)

#: RocketMQ's default strategy for push consumers.
DEFAULT_STRATEGY = "averagely"
#: Virtual nodes per member on the consistent-hash ring (RocketMQ's default is 10).
DEFAULT_VIRTUAL_NODES = 10


def _invalid(message: str) -> SparkMQError:
    return SparkMQError(ErrorCode.INVALID_ARGUMENT, message)


class AllocateStrategy(ABC):
    """Base of all strategies: validates and sorts the views, then allocates.

    Subclasses implement :meth:`_allocate`, which receives the sorted, duplicate-free
    queues and member ids and the index of the current member among them.

    Example:
        >>> class FirstOnly(AllocateStrategy):
        ...     name = "first-only"
        ...     def _allocate(self, queues, consumers, index):
        ...         return list(queues) if index == 0 else []
        >>> FirstOnly().allocate("g", "b", [MessageQueue("t", "a", 0)], ["b", "c"])
        [MessageQueue(topic='t', broker_name='a', queue_id=0)]
    """

    #: The registry name, e.g. ``"averagely"``.
    name: ClassVar[str]

    def allocate(
        self,
        consumer_group: str,
        current_id: str,
        all_queues: Sequence[MessageQueue],
        all_consumer_ids: Sequence[str],
    ) -> list[MessageQueue]:
        """The queues ``current_id`` should consume, in sorted order.

        ``consumer_group`` is only used in log messages.  Both views are sorted here,
        so the result does not depend on the order the caller received them in.
        Raises ``SparkMQError(INVALID_ARGUMENT)`` for an empty ``current_id`` or
        duplicate queues / member ids.  If ``current_id`` is not among the members
        the result is ``[]`` (see below).
        """
        if not isinstance(current_id, str) or not current_id:
            raise _invalid(f"current consumer id must be a non-empty string, got {current_id!r}")
        # A bare string is a Sequence[str] too; iterating it would split one id into letters.
        if isinstance(all_consumer_ids, str):
            raise _invalid("all_consumer_ids must be a sequence of ids, not a single string")
        queues = sorted(all_queues)
        consumers = sorted(all_consumer_ids)
        for q in queues:
            if not isinstance(q, MessageQueue):
                raise _invalid(f"all_queues must hold MessageQueue values, got {q!r}")
        for cid in consumers:
            if not isinstance(cid, str) or not cid:
                raise _invalid(f"consumer ids must be non-empty strings, got {cid!r}")
        # Duplicates would make members disagree on indexes (or give a queue twice).
        for prev, cur in zip(queues, queues[1:], strict=False):
            if prev == cur:
                raise _invalid(f"duplicate queue in all_queues: {cur.topic}@{cur.key}")
        for prev_id, cur_id in zip(consumers, consumers[1:], strict=False):
            if prev_id == cur_id:
                raise _invalid(f"duplicate consumer id in all_consumer_ids: {cur_id!r}")
        if current_id not in consumers:
            # Like RocketMQ (log and return empty) rather than raising: this is a normal,
            # transient state -- the broker has not seen our first heartbeat yet, or has
            # just expired us -- and the next rebalance fixes it.  Taking nothing is safe;
            # guessing a share could double-consume queues another member owns.
            log.warning("consumer %r is not among the %d members of group %r; allocating nothing",
                        current_id, len(consumers), consumer_group)
            return []
        if not queues:
            # A topic with no readable queues (e.g. perm 2) is legal; nothing to share.
            return []
        return self._allocate(queues, consumers, consumers.index(current_id))

    @abstractmethod
    def _allocate(self, queues: Sequence[MessageQueue], consumers: Sequence[str], index: int) -> list[MessageQueue]:
        """Allocate from sorted, non-empty, duplicate-free views; ``consumers[index]`` is us."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class AllocateAveragely(AllocateStrategy):
    """Contiguous blocks of the sorted queues (RocketMQ's AllocateMessageQueueAveragely).

    With ``q`` queues and ``n`` members each gets ``q // n`` queues and the first
    ``q % n`` members one more; members beyond the queue count get nothing.

    Example (8 queues, 3 members -> 3, 3, 2):
        >>> qs = [MessageQueue("t", "broker-a", i) for i in range(8)]
        >>> [[q.queue_id for q in AllocateAveragely().allocate("g", c, qs, ["c0", "c1", "c2"])]
        ...  for c in ["c0", "c1", "c2"]]
        [[0, 1, 2], [3, 4, 5], [6, 7]]
    """

    name = "averagely"

    def _allocate(self, queues: Sequence[MessageQueue], consumers: Sequence[str], index: int) -> list[MessageQueue]:
        size, n = len(queues), len(consumers)
        mod = size % n
        if size <= n:
            block = 1
        else:
            block = size // n + (1 if index < mod else 0)
        # The first `mod` members have the larger blocks, so everyone after them starts
        # `mod` queues further on than index * block.
        start = index * block if index < mod else index * block + mod
        count = min(block, size - start)  # <= 0 for members beyond the queue count
        return list(queues[start:start + count]) if count > 0 else []


class AllocateAveragelyByCircle(AllocateStrategy):
    """Round-robin over the sorted queues: queue ``i`` goes to member ``i % n``.

    Spreads each broker's queues over the members (unlike the contiguous blocks of
    ``averagely``), so losing one broker takes a little from everyone.

    Example:
        >>> qs = [MessageQueue("t", "broker-a", i) for i in range(5)]
        >>> [q.queue_id for q in AllocateAveragelyByCircle().allocate("g", "c0", qs, ["c1", "c0"])]
        [0, 2, 4]
    """

    name = "averagely-by-circle"

    def _allocate(self, queues: Sequence[MessageQueue], consumers: Sequence[str], index: int) -> list[MessageQueue]:
        return list(queues[index::len(consumers)])


def _stable_hash(key: str) -> int:
    """A 64-bit hash identical in every process, machine and Python version."""
    # md5 is used for spreading, not security; usedforsecurity keeps FIPS builds happy.
    digest = hashlib.md5(key.encode("utf-8"), usedforsecurity=False).digest()
    return int.from_bytes(digest[:8], "big")


class AllocateConsistentHash(AllocateStrategy):
    """A consistent-hash ring with ``virtual_nodes`` points per member.

    Each queue goes to the first virtual node clockwise of (at or after) the hash of
    ``queue.key + "@" + topic``.  Removing a member moves only its queues; adding one
    only takes queues from the others.  Balance is rougher than ``averagely``.

    Example:
        >>> qs = [MessageQueue("t", "broker-a", i) for i in range(6)]
        >>> ch = AllocateConsistentHash()
        >>> sorted(q for c in ["c0", "c1"] for q in ch.allocate("g", c, qs, ["c0", "c1"])) == qs
        True
    """

    name = "consistent-hash"

    def __init__(self, virtual_nodes: int = DEFAULT_VIRTUAL_NODES) -> None:
        self.virtual_nodes = check_int("virtual_nodes", virtual_nodes, 1)

    def _allocate(self, queues: Sequence[MessageQueue], consumers: Sequence[str], index: int) -> list[MessageQueue]:
        # Ring points sorted by (hash, member): the member breaks (astronomically rare)
        # hash ties identically on every member.  "<id>-<i>" follows RocketMQ's VirtualNode.
        ring = sorted(
            (_stable_hash(f"{cid}-{i}"), cid) for cid in consumers for i in range(self.virtual_nodes)
        )
        points = [h for h, _ in ring]
        me = consumers[index]
        result = []
        for q in queues:
            # The "@" keeps "b/1"+"2t" and "b/12"+"t" apart.
            pos = bisect.bisect_left(points, _stable_hash(f"{q.key}@{q.topic}"))
            if ring[pos % len(ring)][1] == me:  # wrap past the top of the ring
                result.append(q)
        return result

    def __repr__(self) -> str:
        return f"{type(self).__name__}(virtual_nodes={self.virtual_nodes})"


#: Strategy classes by registry name; read-only so a typo elsewhere cannot replace one.
STRATEGIES: Mapping[str, type[AllocateStrategy]] = MappingProxyType({
    cls.name: cls for cls in (AllocateAveragely, AllocateAveragelyByCircle, AllocateConsistentHash)
})


def strategy_by_name(name: str) -> AllocateStrategy:
    """A new strategy for a registry name (defaults for any parameters).

    Raises ``SparkMQError(INVALID_ARGUMENT)`` naming the known strategies otherwise.

    Example:
        >>> strategy_by_name("consistent-hash")
        AllocateConsistentHash(virtual_nodes=10)
    """
    cls = STRATEGIES.get(name) if isinstance(name, str) else None
    if cls is None:
        raise _invalid(f"unknown allocation strategy {name!r}; known: {', '.join(sorted(STRATEGIES))}")
    return cls()
