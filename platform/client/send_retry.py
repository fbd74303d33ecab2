"""The producers' retry decisions, made in one place for the threaded and the asyncio producer.

:class:`~.producer.Producer` blocks and :class:`~.aio.AsyncProducer` awaits, but what they decide is the same:
which queue to try next, what a failure means (give up, avoid the broker for a while, ask for the route again),
and when there is nothing to send to now -- no live master has a writable queue, or a broker name has no master,
as while a DLedger leadership moves -- that the route is asked for again and, with no other broker to try,
awaited a little within the send budget rather than failed at once.  Nothing here sends, sleeps or asks a
name server: each producer drives a :class:`SendAttempts` with its own I/O::

    attempts = policy.begin(topic, timeout, ordered)
    for _ in attempts:                                    # one pass per attempt while the budget lasts
        step = attempts.next_step(route_of(topic))
        if isinstance(step, Failover):                    # nothing to send to now
            refresh the route if step.refresh; pause step.pause_s(); continue
        try:
            result = send to step.addr, step.queue within step.time_left
        except SparkMQError as exc:
            failover = attempts.failed(step, exc)         # raises what is not worth another attempt
            refresh / pause as failover says; continue
        attempts.succeeded(step)
        return result
    raise attempts.give_up()

Example::

    >>> from sparkmq.platform.client.config import ClientConfig
    >>> from sparkmq.platform.client.fault import LatencyFaultTolerance, QueueSelector
    >>> policy = RetryPolicy(ClientConfig(namesrv_addrs="127.0.0.1:9876"), QueueSelector(LatencyFaultTolerance()),
    ...                      LatencyFaultTolerance())
    >>> read_only = TopicRouteInfo.from_dict("t", {
    ...     "queue_datas": [{"broker_name": "b", "read_queue_nums": 1, "write_queue_nums": 1, "perm": 4}],
    ...     "broker_datas": [{"broker_name": "b", "broker_addrs": {"0": "h:1"}}]})
    >>> attempts = policy.begin("t", 3.0, None)
    >>> next(iter(attempts)), attempts.next_step(read_only).refresh
    (0, True)
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from ..common.backoff import Backoff
from ..common.errors import ErrorCode, SparkMQError
from ..remoting import RemotingError
from .allocation import MessageQueue
from .config import ClientConfig
from .fault import LatencyFaultTolerance, QueueSelector
from .routes import TopicRouteInfo

__all__ = ["RETRYABLE_CODES", "BROKER_FAULT_CODES", "RetryPolicy", "SendAttempts", "Attempt", "Failover",
           "OrderedQueue", "BUSY_BACKOFF"]

log = logging.getLogger("sparkmq.client")

#: Failures worth one more attempt on another broker.
RETRYABLE_CODES = frozenset({
    ErrorCode.SERVICE_NOT_AVAILABLE, ErrorCode.INTERNAL_ERROR, ErrorCode.TOPIC_NOT_EXIST, ErrorCode.NO_PERMISSION,
    ErrorCode.QUEUE_ID_ILLEGAL, ErrorCode.SLAVE_NOT_AVAILABLE, ErrorCode.DISK_FULL, ErrorCode.STORE_LOCKED,
    ErrorCode.STORE_CORRUPT, ErrorCode.SYSTEM_BUSY,
})
# Of those, the ones that say the broker itself is in trouble (isolate it); the others are about
# this topic on that broker and should not keep other topics away from it.
BROKER_FAULT_CODES = frozenset({
    ErrorCode.SERVICE_NOT_AVAILABLE, ErrorCode.INTERNAL_ERROR, ErrorCode.SLAVE_NOT_AVAILABLE, ErrorCode.DISK_FULL,
    ErrorCode.STORE_LOCKED, ErrorCode.STORE_CORRUPT,
})

#: After a master failed, its route is asked for again at most this often, and a producer with no other
#: broker to try waits this long before the next attempt.
REFRESH_GAP_S = 0.2
FAILOVER_PAUSE_S = 0.2

#: After a SYSTEM_BUSY answer (the broker is overloaded, platform/broker/overload.py) a send backs off before its
#: next attempt: 50 ms, doubled after each further busy answer up to 1 s, each cut by a random fraction of up to
#: half (so many producers do not come back at once).  Busy answers do not use up the send's ``retry_times``: its
#: time budget (``send_timeout_s``) bounds them.
BUSY_BACKOFF = Backoff(initial_s=0.05, max_s=1.0, jitter=0.5)


#: ``ordered(route) -> queue``: the one queue of an ordered send (never retried elsewhere).
OrderedQueue = Callable[[TopicRouteInfo], MessageQueue]


@dataclass(frozen=True, slots=True)
class Attempt:
    """Send to ``queue`` at its master ``addr`` within ``time_left`` seconds."""

    queue: MessageQueue
    addr: str
    time_left: float
    route: TopicRouteInfo
    started: float = field(default_factory=time.monotonic)


@dataclass(frozen=True, slots=True)
class Failover:
    """What to do before the next attempt: ask the name servers for the route again (``refresh``), then pause
    until ``pause_until`` (``time.monotonic()``; 0 = no pause) so that a failover can finish."""

    refresh: bool
    pause_until: float = 0.0

    def pause_s(self) -> float:
        """Seconds left to pause now."""
        return max(0.0, self.pause_until - time.monotonic()) if self.pause_until else 0.0


class RetryPolicy:
    """One producer's retry rules and what they remember across its sends (when each topic's route was last
    asked for after a failure).  ``selector`` picks round-robin queues avoiding ``fault``'s brokers."""

    def __init__(self, config: ClientConfig, selector: QueueSelector, fault: LatencyFaultTolerance) -> None:
        self.config = config
        self.selector = selector
        self.fault = fault
        self._last_refresh: dict[str, float] = {}  # topic -> when its route was last re-asked after a failure

    def begin(self, topic: str, timeout: float | None, ordered: OrderedQueue | None) -> SendAttempts:
        """The attempts of one send: ``timeout`` (None = ``send_timeout_s``) bounds them all; an ordered send
        (``ordered`` given) has one.  INVALID_ARGUMENT for a timeout <= 0."""
        budget = self.config.send_timeout_s if timeout is None else timeout
        if budget <= 0:
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, f"timeout must be > 0, got {timeout!r}")
        return SendAttempts(self, topic, budget, ordered)

    def failover(self, topic: str, route: TopicRouteInfo, pause_by: float) -> Failover:
        """Before trying again where a master failed or is missing: refresh the route (at most every
        ``REFRESH_GAP_S``) and, when there is no other broker to try, pause a little (never past ``pause_by``)."""
        now = time.monotonic()
        refresh = now - self._last_refresh.get(topic, 0.0) >= REFRESH_GAP_S
        if refresh:
            self._last_refresh[topic] = now
        pause = len(route.broker_names) <= 1 and pause_by > now
        return Failover(refresh, min(now + FAILOVER_PAUSE_S, pause_by) if pause else 0.0)


class SendAttempts:
    """The attempts of one send (:meth:`RetryPolicy.begin`): iterate, and tell it how each one went."""

    def __init__(self, policy: RetryPolicy, topic: str, budget: float, ordered: OrderedQueue | None) -> None:
        self.policy = policy
        self.topic = topic
        self.budget = budget
        self.deadline = time.monotonic() + budget
        self.ordered = ordered
        self.attempts = 1 if ordered is not None else 1 + policy.config.retry_times
        self.attempt = 0
        self.last_broker: str | None = None
        self.last_error: SparkMQError | None = None
        #: SYSTEM_BUSY answers so far: they do not count against ``attempts`` (the budget bounds them).
        self.busy_answers = 0

    def __iter__(self) -> Iterator[int]:
        """The attempt numbers (from 0) while the budget lasts (SYSTEM_BUSY answers use up no attempt)."""
        tried = 0
        while tried - self.busy_answers < self.attempts:
            if time.monotonic() >= self.deadline:
                return
            self.attempt = tried - self.busy_answers
            yield tried
            tried += 1

    def _pause_by(self) -> float:
        # A pause after the last attempt would only delay the error.
        return self.deadline if self.attempt + 1 < self.attempts else 0.0

    def next_step(self, route: TopicRouteInfo) -> Attempt | Failover:
        """Where to send now over ``route``, or the :class:`Failover` to go through when there is nowhere; raises
        :meth:`give_up` when looking the route up took the rest of the budget."""
        left = self.deadline - time.monotonic()
        if left <= 0:  # the route took the whole budget: no broker is to blame
            raise self.give_up()
        if not route.write_queues:
            # No live master has it writable now (a DLedger leadership moving, a master re-registering):
            # refresh and pause as for a missing master, within the budget, rather than fail at once.
            self.last_error = SparkMQError(ErrorCode.NO_PERMISSION,
                                           f"topic {self.topic!r} has no writable queue on any live master")
            return self.policy.failover(self.topic, route, self._pause_by())
        if self.ordered is not None:
            queue = self.ordered(route)
        else:
            queue = self.policy.selector.select(route.write_queues, self.last_broker)
        addr = route.master_addr(queue.broker_name)
        if addr is None:  # no master now (a DLedger group electing one): ask again shortly
            self.last_broker = queue.broker_name
            self.last_error = SparkMQError(ErrorCode.SERVICE_NOT_AVAILABLE, f"{queue.broker_name} has no master")
            return self.policy.failover(self.topic, route, self._pause_by())
        return Attempt(queue, addr, left, route)

    def failed(self, step: Attempt, exc: SparkMQError) -> Failover | None:
        """``step`` failed with ``exc``: raises it when another attempt would not help; otherwise notes the broker's
        fault and returns what to go through before the next attempt (None: nothing)."""
        if exc.code not in RETRYABLE_CODES:
            raise exc
        elapsed_ms = (time.monotonic() - step.started) * 1000
        broker = step.queue.broker_name
        failover = None
        if exc.code is ErrorCode.SYSTEM_BUSY:
            # Overloaded, not broken: back off (growing) within the budget and try again, possibly elsewhere.
            self.busy_answers += 1
            self.policy.fault.update(broker, elapsed_ms)
            failover = Failover(False, min(time.monotonic() + BUSY_BACKOFF.delay_s(self.busy_answers - 1),
                                           self.deadline))
            log.debug("send to %s (%s) answered busy (%d in a row), backing off: %s", step.queue.key, step.addr,
                      self.busy_answers, exc)
            self.last_broker, self.last_error = broker, exc
            return failover
        if exc.code in BROKER_FAULT_CODES:
            unreachable = isinstance(exc, RemotingError) and not exc.timed_out
            self.policy.fault.update(broker, elapsed_ms, isolation=True, reachable=not unreachable)
            if exc.code is ErrorCode.SERVICE_NOT_AVAILABLE:
                # Down or no longer the master (a DLedger leader deposed): the name servers may already name
                # its successor, for this send's next attempt or the next send.
                failover = self.policy.failover(self.topic, step.route, self._pause_by())
        else:  # about this topic on that broker (missing, read-only, a queue gone): its route may have changed
            failover = Failover(refresh=True)
        log.info("send to %s (%s) failed, attempt %d of %d: %s", step.queue.key, step.addr, self.attempt + 1,
                 self.attempts, exc)
        self.last_broker, self.last_error = broker, exc
        return failover

    def succeeded(self, step: Attempt) -> None:
        """``step`` succeeded: its latency counts for the broker."""
        self.policy.fault.update(step.queue.broker_name, (time.monotonic() - step.started) * 1000)

    def give_up(self) -> SparkMQError:
        """The error of a send whose attempts all failed or ran out of time."""
        if self.last_error is not None:
            return self.last_error
        return SparkMQError(ErrorCode.SERVICE_NOT_AVAILABLE,
                            f"send to {self.topic!r} timed out after {self.budget:.3f} s")
