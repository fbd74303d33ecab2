"""gRPC clients as the broker sees them: their Telemetry sessions, settings, and what is pushed to them.

A client opens Telemetry and writes its settings; the answer is ``{status OK, settings}`` merged with
the server's (what RocketMQ's proxy answers: an exponential ``backoff_policy``, ``max_body_size``,
``validate_message_type``; for consumers ``receive_batch_size``, ``long_polling_timeout``, ``fifo`` and
``max_attempts``).  The same registry makes the clients members of sparkmq's client table, so
``sparkmq admin`` shows them and transaction check-backs find a live producer: a gRPC producer belongs to
one producer group per topic it publishes (the group of a gRPC transactional message is its topic).
"""
from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field

from ...platform.broker.broker import Broker
from ...platform.broker.client_manager import ConsumerData, Subscription
from ...platform.broker.transaction import CheckRequest
from ...platform.common.errors import SparkMQError
from ...platform.common.protocol import (
    MAX_POP_BATCH,
    POP_DEFAULT_MAX_ATTEMPTS,
    POP_MAX_LONG_POLL_MS,
    ConsumeType,
    ExpressionType,
)
from ._pb import definition, service
from .convert import check_to_v2_message, duration_ms, duration_of, status_ok, wrap

__all__ = ["ClientRegistry", "GrpcClient", "ProducerSettings", "ConsumerSettings"]

log = logging.getLogger("sparkmq.broker.grpc")

_ClientType = definition.ClientType
#: The client types that consume (their settings carry a subscription).
CONSUMER_TYPES = frozenset({_ClientType.PUSH_CONSUMER, _ClientType.SIMPLE_CONSUMER, _ClientType.PULL_CONSUMER})


@dataclass(frozen=True)
class ProducerSettings:
    """What a producer is told (RocketMQ proxy defaults)."""

    max_attempts: int = 3
    backoff_initial_ms: int = 10
    backoff_max_ms: int = 1000
    backoff_multiplier: float = 2.0


@dataclass(frozen=True)
class ConsumerSettings:
    """What a consumer is told (RocketMQ proxy defaults; max attempts = max reconsume times + 1)."""

    max_attempts: int = POP_DEFAULT_MAX_ATTEMPTS
    backoff_initial_ms: int = 1000
    backoff_max_ms: int = 60_000
    backoff_multiplier: float = 2.0
    receive_batch_size: int = MAX_POP_BATCH
    #: Used when the client names none; a client's own is capped at POP_MAX_LONG_POLL_MS.
    long_polling_timeout_ms: int = 20_000


@dataclass
class GrpcClient:
    """One client id: its type, namespace, last settings, and its Telemetry stream (where pushes go)."""

    client_id: str
    namespace: str = ""
    client_type: int = _ClientType.CLIENT_TYPE_UNSPECIFIED
    #: Producer: the (wrapped) topics it publishes; each is a producer group of it.
    topics: tuple[str, ...] = ()
    #: Consumer: its (wrapped) group and subscriptions.
    group: str | None = None
    subscriptions: tuple[Subscription, ...] = ()
    #: The settings the server last answered (max attempts and long polling of receives come from here).
    settings: definition.Settings | None = None
    #: Commands waiting for the client's Telemetry stream (None: no stream open).
    outbox: asyncio.Queue[service.TelemetryCommand | None] | None = field(default=None, repr=False)

    @property
    def max_attempts(self) -> int:
        """The delivery attempts the client was told (the DLQ comes after them)."""
        if self.settings is not None and self.settings.backoff_policy.max_attempts > 0:
            return self.settings.backoff_policy.max_attempts
        return POP_DEFAULT_MAX_ATTEMPTS


class ClientRegistry:
    """Every gRPC client of this broker by client id; pushes check-backs onto their Telemetry streams."""

    def __init__(self, broker: Broker, max_body_size: int, producer: ProducerSettings | None = None,
                 consumer: ConsumerSettings | None = None) -> None:
        self.broker = broker
        self.max_body_size = max_body_size
        self.producer = producer or ProducerSettings()
        self.consumer = consumer or ConsumerSettings()
        self._lock = threading.Lock()
        self._clients: dict[str, GrpcClient] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    def bind_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """The loop the streams live on (pushes from other threads are handed to it)."""
        self._loop = loop

    def get(self, client_id: str, namespace: str = "") -> GrpcClient:
        """The client's record, made on first sight."""
        with self._lock:
            client = self._clients.get(client_id)
            if client is None:
                client = self._clients[client_id] = GrpcClient(client_id, namespace)
            return client

    def find(self, client_id: str) -> GrpcClient | None:
        """The client's record, if known."""
        with self._lock:
            return self._clients.get(client_id)

    # -- settings -------------------------------------------------------------------------
    def apply_settings(self, client: GrpcClient, settings: definition.Settings) -> service.TelemetryCommand:
        """Record a client's settings and answer them as RocketMQ's proxy does (``{status OK, settings}``)."""
        answer = definition.Settings()
        answer.CopyFrom(settings)
        client.client_type = settings.client_type
        if settings.HasField("publishing"):
            client.topics = tuple(wrap(client.namespace, t.name) for t in settings.publishing.topics)
            self._fill_producer(answer)
        if settings.HasField("subscription"):
            sub = settings.subscription
            client.group = wrap(client.namespace, sub.group.name) if sub.group.name else None
            client.subscriptions = tuple(_subscription(client.namespace, e) for e in sub.subscriptions)
            self._fill_consumer(answer, sub)
        client.settings = answer
        self.heartbeat(client)
        if client.topics:
            self.push_pending_checks(client.topics)
        return service.TelemetryCommand(status=status_ok(), settings=answer)

    def _fill_producer(self, answer: definition.Settings) -> None:
        p = self.producer
        _backoff(answer.backoff_policy, p.max_attempts, p.backoff_initial_ms, p.backoff_max_ms, p.backoff_multiplier)
        # A client takes max_body_size literally (0 would refuse every send).
        answer.publishing.max_body_size = self.max_body_size
        answer.publishing.validate_message_type = True

    def _fill_consumer(self, answer: definition.Settings, sub: definition.Subscription) -> None:
        c = self.consumer
        _backoff(answer.backoff_policy, c.max_attempts, c.backoff_initial_ms, c.backoff_max_ms, c.backoff_multiplier)
        out = answer.subscription
        out.receive_batch_size = c.receive_batch_size
        asked = duration_ms(sub.long_polling_timeout) if sub.HasField("long_polling_timeout") else 0
        out.long_polling_timeout.CopyFrom(
            duration_of(min(asked, POP_MAX_LONG_POLL_MS) if asked > 0 else c.long_polling_timeout_ms))
        # sparkmq groups carry no FIFO flag: a topic configured as ordered is consumed FIFO by the POP core.
        out.fifo = sub.fifo if sub.HasField("fifo") else False

    # -- membership -----------------------------------------------------------------------
    def heartbeat(self, client: GrpcClient, client_type: int | None = None, group: str | None = None) -> None:
        """Make ``client`` a live member of its producer groups (its topics) or its consumer group."""
        if client_type:
            client.client_type = client_type
        if group and not client.group:
            client.group = group
        consumers = []
        if client.group and client.client_type in CONSUMER_TYPES:
            consumers.append(ConsumerData(client.group, ConsumeType.POP, subscriptions=client.subscriptions))
        try:
            self.broker.consumer_processor.heartbeat(client.client_id, client.topics, consumers)
        except SparkMQError as exc:  # a bad subscription must not break the stream; receives report it
            log.info("gRPC client %s: heartbeat refused: %s", client.client_id, exc)

    def terminate(self, client_id: str) -> None:
        """The client is shutting down: leave every group, close its stream."""
        with self._lock:
            client = self._clients.pop(client_id, None)
        if client is None:
            return
        groups = [client.group] if client.group and client.client_type in CONSUMER_TYPES else []
        try:
            self.broker.consumer_processor.unregister_client(client_id, client.topics, groups)
        except SparkMQError as exc:
            log.info("gRPC client %s: unregister refused: %s", client_id, exc)
        self.detach(client)

    # -- Telemetry streams -------------------------------------------------------------------
    def attach(self, client: GrpcClient) -> asyncio.Queue[service.TelemetryCommand | None]:
        """Open ``client``'s outbox for a new Telemetry stream (an older stream of it is ended)."""
        self.detach(client)
        outbox: asyncio.Queue[service.TelemetryCommand | None] = asyncio.Queue()
        client.outbox = outbox
        return outbox

    def detach(self, client: GrpcClient, outbox: asyncio.Queue[service.TelemetryCommand | None] | None = None) -> None:
        """Close ``client``'s outbox (only if it is still ``outbox``, when given)."""
        current = client.outbox
        if current is None or (outbox is not None and current is not outbox):
            return
        client.outbox = None
        current.put_nowait(None)

    def _push(self, client: GrpcClient, command: service.TelemetryCommand) -> bool:
        outbox = client.outbox
        loop = self._loop
        if outbox is None or loop is None or loop.is_closed():
            return False
        loop.call_soon_threadsafe(outbox.put_nowait, command)
        return True

    def _producers_of(self, topic: str) -> list[GrpcClient]:
        with self._lock:
            return [c for c in self._clients.values() if topic in c.topics and c.outbox is not None]

    def push_pending_checks(self, groups: Iterable[str]) -> None:
        """Hand each group's pending check-backs to one live gRPC producer of it (any thread)."""
        for group in groups:
            producers = self._producers_of(group)
            if not producers:
                continue
            for check in self.broker.checks.take(group):
                target = producers[hash(check.transaction_id) % len(producers)]
                if not self._push(target, _recover_command(check, target.namespace)):
                    self.broker.checks.offer(check)  # its stream just closed: the next producer takes it


def _recover_command(check: CheckRequest, namespace: str) -> service.TelemetryCommand:
    command = service.TelemetryCommand()
    recover = command.recover_orphaned_transaction_command
    recover.message.CopyFrom(check_to_v2_message(check, namespace))
    recover.transaction_id = check.transaction_id
    return command


def _backoff(policy: definition.RetryPolicy, max_attempts: int, initial_ms: int, max_ms: int,
             multiplier: float) -> None:
    # Exponential, always: some official clients dereference it and crash on anything else.
    policy.Clear()
    policy.max_attempts = max_attempts
    policy.exponential_backoff.initial.CopyFrom(duration_of(initial_ms))
    policy.exponential_backoff.max.CopyFrom(duration_of(max_ms))
    policy.exponential_backoff.multiplier = multiplier


def _subscription(namespace: str, entry: definition.SubscriptionEntry) -> Subscription:
    kind = ExpressionType.SQL92 if entry.expression.type == definition.FilterType.SQL else ExpressionType.TAG
    return Subscription(wrap(namespace, entry.topic.name), entry.expression.expression or "*", kind)
