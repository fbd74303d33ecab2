"""Producer and consumer heartbeats (RocketMQ's ``ProducerManager`` + ``ConsumerManager``).

Clients heartbeat every 30 s with their client id, producer groups and consumer
groups (message model, consume type, where to start, subscriptions).  A client
silent for ``expiry_s`` (120 s) is dropped by a scan thread.

Every consumer group has a membership **version** that moves whenever its member set
changes (a client joins, unregisters or expires) -- and only then: a heartbeat that
changes nothing, or only a subscription, keeps it.  Consumers long-poll
``/consumers/{group}/changes`` with the version they know and rebalance when it moves
(:meth:`ClientManager.wait_change`, asyncio-friendly, woken from any thread).
"""
from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from ..common.errors import ErrorCode, SparkMQError
from ..common.protocol import (
    MAX_HELD_QUEUES,
    ConsumeFromWhere,
    ConsumeType,
    ExpressionType,
    GroupMemberData,
    MessageModel,
    parse_held_queue,
)
from ..common.validation import MAX_CLIENT_ID_LENGTH, validate_group, validate_topic
from ..common.waiters import WaiterRegistry

__all__ = [
    "MessageModel",
    "ConsumeType",
    "ConsumeFromWhere",
    "ExpressionType",
    "Subscription",
    "ConsumerData",
    "GroupInfo",
    "ClientManager",
    "MAX_CLIENT_ID_LENGTH",
]

log = logging.getLogger("sparkmq.broker")



def _check_client_id(client_id: object) -> str:
    if not isinstance(client_id, str) or not client_id or len(client_id) > MAX_CLIENT_ID_LENGTH \
            or not client_id.isprintable() or " " in client_id:
        raise SparkMQError(ErrorCode.INVALID_ARGUMENT,
                           f"the client id must be 1-{MAX_CLIENT_ID_LENGTH} printable characters without spaces, "
                           f"got {client_id!r}")
    return client_id


def _enum(kind: type[enum.StrEnum], value: object, what: str) -> Any:
    try:
        return kind(str(value))
    except ValueError:
        raise SparkMQError(ErrorCode.INVALID_ARGUMENT,
                           f"{what} must be one of {[m.value for m in kind]}, got {value!r}") from None


@dataclass(frozen=True)
class Subscription:
    """One topic a consumer subscribes to, with its filter expression (``*`` = everything)."""

    topic: str
    expression: str = "*"
    type: ExpressionType = ExpressionType.TAG

    def __post_init__(self) -> None:
        validate_topic(self.topic)
        object.__setattr__(self, "type", _enum(ExpressionType, self.type, "the subscription type"))
        if not isinstance(self.expression, str) or len(self.expression) > 4096:
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, "the subscription expression must be a string <= 4096")
        if not self.expression.strip():
            object.__setattr__(self, "expression", "*")

    def to_dict(self) -> dict[str, str]:
        """JSON form."""
        return {"topic": self.topic, "expression": self.expression, "type": str(self.type)}


@dataclass(frozen=True)
class ConsumerData:
    """What one client says about one consumer group in a heartbeat."""

    group: str
    consume_type: ConsumeType = ConsumeType.PUSH
    message_model: MessageModel = MessageModel.CLUSTERING
    consume_from_where: ConsumeFromWhere = ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET
    subscriptions: tuple[Subscription, ...] = ()
    #: The queues the member holds (``topic@broker/queue_id``, :func:`~..common.protocol.held_queue_key`).
    held_queues: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        validate_group(self.group)
        object.__setattr__(self, "consume_type", _enum(ConsumeType, self.consume_type, "consume_type"))
        object.__setattr__(self, "message_model", _enum(MessageModel, self.message_model, "message_model"))
        object.__setattr__(self, "consume_from_where",
                           _enum(ConsumeFromWhere, self.consume_from_where, "consume_from_where"))
        object.__setattr__(self, "subscriptions", tuple(self.subscriptions))
        if isinstance(self.held_queues, str) or len(self.held_queues) > MAX_HELD_QUEUES:
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT,
                               f"held_queues must be a list of at most {MAX_HELD_QUEUES} queues")
        for key in self.held_queues:
            parse_held_queue(key)
        object.__setattr__(self, "held_queues", tuple(sorted(set(self.held_queues))))


@dataclass(frozen=True)
class GroupInfo:
    """A consumer group as the broker sees it (RocketMQ's ``ConsumerGroupInfo``)."""

    group: str
    version: int
    members: list[str]
    message_model: MessageModel | None = None
    consume_type: ConsumeType | None = None
    consume_from_where: ConsumeFromWhere | None = None
    subscriptions: list[Subscription] = field(default_factory=list)
    #: Each member's protocol and held queues, sorted by client id.
    clients: list[GroupMemberData] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON form (``GET /consumers/{group}``)."""
        return {"group": self.group, "version": self.version, "members": list(self.members),
                "message_model": self.message_model and str(self.message_model),
                "consume_type": self.consume_type and str(self.consume_type),
                "consume_from_where": self.consume_from_where and str(self.consume_from_where),
                "subscriptions": [s.to_dict() for s in self.subscriptions],
                "clients": [msgspec.structs.asdict(c) for c in self.clients]}


@dataclass
class _Member:
    data: ConsumerData
    last_seen: float
    seq: int  # order of the latest heartbeat, so group-level fields follow the newest one


@dataclass
class _Group:
    version: int = 0
    members: dict[str, _Member] = field(default_factory=dict)


#: ``listener(group, client_ids_left)`` after members left a group (unregister or expiry).
LeaveListener = Callable[[str, list[str]], None]
#: ``listener(group, version)`` after a group's version moved (a member joined or left, an offset reset).
ChangeListener = Callable[[str, int], None]


class ClientManager:
    """Heartbeats of producers and consumers, group membership versions, expiry."""

    def __init__(self, expiry_s: float = 120.0, scan_interval_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``clock`` is injectable so tests control expiry without sleeping."""
        self.expiry_s = float(expiry_s)
        self.scan_interval_s = float(scan_interval_s)
        self._clock = clock
        self._lock = threading.Lock()
        self._groups: dict[str, _Group] = {}
        # Versions outlive empty groups, so a consumer that knew version 3 sees 4 after everyone left and rejoined.
        self._versions: dict[str, int] = {}
        self._producers: dict[str, dict[str, float]] = {}  # producer group -> client id -> last seen
        self._seq = 0
        self._waiters: WaiterRegistry[str] = WaiterRegistry()
        self._leave_listeners: list[LeaveListener] = []
        self._change_listeners: list[ChangeListener] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- heartbeats -------------------------------------------------------------------
    def heartbeat(self, client_id: str, producer_groups: Iterable[str] = (),
                  consumers: Sequence[ConsumerData] = (), *, now: float | None = None) -> dict[str, int]:
        """Record a heartbeat; returns ``{consumer group: membership version}``.

        All input is validated before anything changes.
        """
        _check_client_id(client_id)
        pgroups = [validate_group(g) for g in producer_groups]
        consumers = list(consumers)
        for c in consumers:
            if not isinstance(c, ConsumerData):
                raise SparkMQError(ErrorCode.INVALID_ARGUMENT, f"expected ConsumerData, got {type(c).__name__}")
        if len({c.group for c in consumers}) != len(consumers):
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, "a consumer group appears twice in one heartbeat")
        now = self._clock() if now is None else now
        changed: list[str] = []
        out: dict[str, int] = {}
        with self._lock:
            for group in pgroups:
                self._producers.setdefault(group, {})[client_id] = now
            for data in consumers:
                g = self._groups.setdefault(data.group, _Group(version=self._versions.get(data.group, 0)))
                self._seq += 1
                if client_id not in g.members:
                    g.version += 1
                    self._versions[data.group] = g.version
                    changed.append(data.group)
                g.members[client_id] = _Member(data, now, self._seq)
                out[data.group] = g.version
        for group in changed:
            log.info("consumer group %s: %s joined", group, client_id)
            self._changed(group)
        return out

    def unregister(self, client_id: str, producer_groups: Iterable[str] = (),
                   consumer_groups: Iterable[str] = ()) -> dict[str, int]:
        """Remove a client from the named groups (a client shutting down); returns the consumer groups' versions."""
        _check_client_id(client_id)
        pgroups = [validate_group(g) for g in producer_groups]
        cgroups = [validate_group(g) for g in consumer_groups]
        with self._lock:
            for group in pgroups:
                clients = self._producers.get(group)
                if clients is not None:
                    clients.pop(client_id, None)
                    if not clients:
                        del self._producers[group]
            left = [g for g in cgroups if self._remove_member_locked(g, client_id)]
            out = {g: self._versions.get(g, 0) for g in cgroups}
        self._after_leave({g: [client_id] for g in left})
        return out

    def _remove_member_locked(self, group: str, client_id: str) -> bool:
        g = self._groups.get(group)
        if g is None or client_id not in g.members:
            return False
        del g.members[client_id]
        g.version += 1
        self._versions[group] = g.version
        if not g.members:
            del self._groups[group]  # like RocketMQ, a group exists while it has members
        return True

    def _after_leave(self, left: dict[str, list[str]]) -> None:
        for group, clients in left.items():
            log.info("consumer group %s: %s left", group, ", ".join(clients))
            self._changed(group)
            for listener in list(self._leave_listeners):
                try:
                    listener(group, clients)
                except Exception:  # a listener's bug must not stop expiry
                    log.exception("client leave listener failed")

    def _changed(self, group: str) -> None:
        """Wake the group's change polls and tell the change listeners (pushed rebalance notices)."""
        self._waiters.notify(group)
        version = self.version(group)
        for listener in list(self._change_listeners):
            try:
                listener(group, version)
            except Exception:  # a listener's bug must not stop a heartbeat
                log.exception("group change listener failed")

    def add_change_listener(self, listener: ChangeListener) -> None:
        """Call ``listener(group, version)`` after a consumer group's version moved (any thread)."""
        self._change_listeners.append(listener)

    def add_leave_listener(self, listener: LeaveListener) -> None:
        """Call ``listener(group, client_ids)`` after clients left a consumer group."""
        self._leave_listeners.append(listener)

    # -- expiry -----------------------------------------------------------------------
    def scan_expired(self, now: float | None = None) -> list[str]:
        """Drop every client silent for longer than ``expiry_s``; returns the dropped client ids."""
        now = self._clock() if now is None else now
        deadline = now - self.expiry_s
        left: dict[str, list[str]] = {}
        dropped: set[str] = set()
        with self._lock:
            for group in list(self._groups):
                for client_id, member in list(self._groups[group].members.items()):
                    if member.last_seen < deadline:
                        self._remove_member_locked(group, client_id)
                        left.setdefault(group, []).append(client_id)
                        dropped.add(client_id)
            for group in list(self._producers):
                clients = self._producers[group]
                for client_id, seen in list(clients.items()):
                    if seen < deadline:
                        del clients[client_id]
                        dropped.add(client_id)
                if not clients:
                    del self._producers[group]
        if dropped:
            log.info("dropped %d silent client(s): %s", len(dropped), ", ".join(sorted(dropped)))
        self._after_leave(left)
        return sorted(dropped)

    def start(self) -> ClientManager:
        """Start the expiry scan thread; returns self."""
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="sparkmq-client-expiry", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the scan thread and release every waiting change poll."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()
        self._waiters.close()

    def release_waiters(self) -> None:
        """Answer every waiting change poll now and every later one at once (shutdown)."""
        self._waiters.close()

    def _run(self) -> None:
        while not self._stop.wait(self.scan_interval_s):
            try:
                self.scan_expired()
            except Exception:  # keep scanning: one bad pass must not keep dead clients forever
                log.exception("client expiry scan failed")

    # -- queries ----------------------------------------------------------------------
    def version(self, group: str) -> int:
        """The group's membership version (0 for a group nobody ever joined)."""
        return self._versions.get(group, 0)

    def members(self, group: str) -> list[str]:
        """The group's client ids, sorted."""
        with self._lock:
            g = self._groups.get(group)
            return sorted(g.members) if g else []

    def consumer_groups(self) -> list[str]:
        """Groups with at least one member, sorted."""
        with self._lock:
            return sorted(self._groups)

    def producer_groups(self) -> dict[str, list[str]]:
        """Producer group -> client ids, sorted."""
        with self._lock:
            return {g: sorted(c) for g, c in sorted(self._producers.items())}

    def client_count(self) -> int:
        """How many distinct clients are known (producers and consumers)."""
        with self._lock:
            ids = {c for g in self._groups.values() for c in g.members}
            ids.update(c for clients in self._producers.values() for c in clients)
            return len(ids)

    def group_info(self, group: str) -> GroupInfo:
        """The group's members and settings; version 0 and no members for a group nobody joined."""
        validate_group(group)
        with self._lock:
            g = self._groups.get(group)
            if g is None:
                return GroupInfo(group, self._versions.get(group, 0), [])
            members = sorted(g.members.values(), key=lambda m: m.seq)
            latest = members[-1].data
            subs: dict[str, Subscription] = {}
            for m in members:  # oldest first, so the newest heartbeat's expression wins per topic
                for s in m.data.subscriptions:
                    subs[s.topic] = s
            clients = [GroupMemberData(client_id, str(m.data.consume_type), str(m.data.message_model),
                                       list(m.data.held_queues)) for client_id, m in sorted(g.members.items())]
            return GroupInfo(group, g.version, sorted(g.members), latest.message_model, latest.consume_type,
                             latest.consume_from_where, [subs[t] for t in sorted(subs)], clients)

    def subscribed_topics(self, group: str) -> list[str]:
        """Topics some member of ``group`` subscribes to, sorted."""
        return [s.topic for s in self.group_info(group).subscriptions]

    def bump_version(self, group: str) -> int:
        """Move the group's version without a membership change (an offset reset), waking ``/changes`` polls.

        Consumers watching the version re-read their offsets (and rebalance, which is harmless).
        """
        validate_group(group)
        with self._lock:
            version = self._versions.get(group, 0) + 1
            self._versions[group] = version
            g = self._groups.get(group)
            if g is not None:
                g.version = version
        self._changed(group)
        return version

    def has_producer(self, group: str) -> bool:
        """Whether a live (not expired) producer of ``group`` is known."""
        with self._lock:
            return bool(self._producers.get(group))

    async def wait_change(self, group: str, version: int, timeout_s: float) -> tuple[int, list[str]]:
        """Wait until the group's version differs from ``version`` (or ``timeout_s``); returns (version, members)."""
        validate_group(group)
        await self._waiters.wait(group, timeout_s, lambda: self.version(group) != version)
        with self._lock:
            g = self._groups.get(group)
            return self._versions.get(group, 0), sorted(g.members) if g else []
