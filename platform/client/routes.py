"""Topic routes as clients use them: queue lists to send to and to pull from, and broker addresses.

A name server answers GET_ROUTEINFO_BY_TOPIC (RocketMQ remoting, :class:`NameServerRoutes`) with RocketMQ's
``TopicRouteData``: queue data per broker name (read and write queue counts, perm) and the broker names'
addresses by broker id (0 = master), each the broker's one port (remoting and HTTP).  The HTTP
``GET /routes/{topic}`` answers the same in sparkmq's JSON.  :class:`TopicRouteInfo` turns either into

* ``write_queues`` -- ``write_queue_nums`` queues of every broker whose perm has WRITE and
  that has a live master (sends go to masters only), sorted;
* ``read_queues`` -- ``read_queue_nums`` queues of every broker whose perm has READ and that
  has any live address (a consumer may read from a slave while the master is down), sorted.

:class:`TopicRouteCache` keeps one per topic and refreshes them every 30 s.  For a topic no
name server knows yet, :meth:`TopicRouteCache.get` can build a *default route*, as RocketMQ's producer does:
the route of the ``TBW102`` template topic (the brokers that auto-create topics), with at most 4 queues on each,
as a broker auto-creates them on the first send.  (Over HTTP: 4 queues on every master of the cluster view.)
"""
from __future__ import annotations

import logging
import ssl
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec

from ..auth.signing import Credentials, Signer
from ..common import protocol as p
from ..common.errors import ErrorCode, SparkMQError
from ..common.perm import PERM_READ_WRITE, is_readable, is_writeable
from ..common.protocol import RequestCode
from ..remoting import RemotingError, SyncRemotingClient
from .allocation import MessageQueue
from .endpoints import learn_remoting_endpoints

__all__ = ["QueueData", "TopicRouteInfo", "TopicRouteCache", "NameServerRoutes", "RouteSource",
           "DEFAULT_TOPIC_QUEUE_NUMS", "MASTER_ID", "AUTO_CREATE_TOPIC", "UNREACHABLE_PASS_OVER_S", "mark_reachable",
           "mark_unreachable"]

log = logging.getLogger("sparkmq.client")

#: Queues a broker auto-creates for a new topic on its first send (RocketMQ defaultTopicQueueNums).
DEFAULT_TOPIC_QUEUE_NUMS = 4
#: Broker id of a master.
MASTER_ID = 0
#: The template topic whose route names the brokers that auto-create topics (RocketMQ's ``TBW102``).
AUTO_CREATE_TOPIC = "TBW102"


@dataclass(frozen=True, slots=True)
class QueueData:
    """The queues one broker name serves for a topic."""

    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    topic_sys_flag: int = 0


@dataclass(frozen=True)
class TopicRouteInfo:
    """One topic's route, with the queue lists derived from it.

    Example::

        >>> route = TopicRouteInfo.from_dict("t", {
        ...     "queue_datas": [{"broker_name": "b", "read_queue_nums": 2, "write_queue_nums": 1, "perm": 6},
        ...                     {"broker_name": "a", "read_queue_nums": 1, "write_queue_nums": 1, "perm": 4}],
        ...     "broker_datas": [{"broker_name": "a", "broker_addrs": {"0": "h:1"}},
        ...                      {"broker_name": "b", "broker_addrs": {"0": "h:2"}}]})
        >>> [q.key for q in route.write_queues], [q.key for q in route.read_queues]
        (['b/0'], ['a/0', 'b/0', 'b/1'])
    """

    topic: str
    queue_datas: tuple[QueueData, ...]
    #: broker name -> {broker id: address}
    broker_addrs: Mapping[str, Mapping[int, str]]
    #: True for a route made up from the cluster view while no name server knows the topic.
    is_default: bool = False
    fetched_at: float = field(default_factory=time.monotonic)
    write_queues: tuple[MessageQueue, ...] = field(init=False)
    read_queues: tuple[MessageQueue, ...] = field(init=False)

    def __post_init__(self) -> None:
        writes: list[MessageQueue] = []
        reads: list[MessageQueue] = []
        for qd in self.queue_datas:
            addrs = self.broker_addrs.get(qd.broker_name, {})
            if is_writeable(qd.perm) and MASTER_ID in addrs:
                writes.extend(MessageQueue(self.topic, qd.broker_name, i) for i in range(qd.write_queue_nums))
            if is_readable(qd.perm) and addrs:
                reads.extend(MessageQueue(self.topic, qd.broker_name, i) for i in range(qd.read_queue_nums))
        object.__setattr__(self, "write_queues", tuple(sorted(writes)))
        object.__setattr__(self, "read_queues", tuple(sorted(reads)))

    @classmethod
    def from_dict(cls, topic: str, data: Mapping[str, Any], *, is_default: bool = False) -> TopicRouteInfo:
        """Build from the name server's JSON (``TopicRoute.to_dict()``); INTERNAL_ERROR if it is malformed."""
        try:
            queue_datas = tuple(sorted(
                (QueueData(str(q["broker_name"]), int(q["read_queue_nums"]), int(q["write_queue_nums"]),
                           int(q["perm"]), int(q.get("topic_sys_flag", 0))) for q in data["queue_datas"]),
                key=lambda q: q.broker_name))
            addrs = {str(b["broker_name"]): {int(i): str(a) for i, a in (b.get("broker_addrs") or {}).items()}
                     for b in data["broker_datas"]}
            for b in data["broker_datas"]:
                by_id = addrs[str(b["broker_name"])]
                learn_remoting_endpoints(by_id, b.get("remoting_addrs") or {})
        except (KeyError, TypeError, ValueError) as exc:
            raise SparkMQError(ErrorCode.INTERNAL_ERROR, f"malformed route for {topic!r}: {exc!r}") from None
        return cls(topic, queue_datas, addrs, is_default=is_default)

    @classmethod
    def from_route_data(cls, topic: str, data: p.TopicRouteData, *, is_default: bool = False,
                        max_queues: int | None = None) -> TopicRouteInfo:
        """Build from RocketMQ's ``TopicRouteData`` (GET_ROUTEINFO_BY_TOPIC); ``max_queues`` caps each broker's
        read and write queue counts (a default route made of ``TBW102``'s, as RocketMQ's producer does)."""
        def cap(n: int) -> int:
            return n if max_queues is None else min(n, max_queues)

        queue_datas = tuple(sorted((QueueData(q.brokerName, cap(q.readQueueNums), cap(q.writeQueueNums), q.perm,
                                              q.topicSysFlag) for q in data.queueDatas),
                                   key=lambda q: q.broker_name))
        addrs = {b.brokerName: {int(i): a for i, a in b.brokerAddrs.items()} for b in data.brokerDatas}
        return cls(topic, queue_datas, addrs, is_default=is_default)

    @classmethod
    def default_from_cluster(cls, topic: str, cluster: Mapping[str, Any]) -> TopicRouteInfo:
        """A route of :data:`DEFAULT_TOPIC_QUEUE_NUMS` read/write queues on every master in ``GET /cluster``."""
        addrs: dict[str, dict[int, str]] = {}
        for name, data in (cluster.get("brokers") or {}).items():
            by_id = {int(i): str(a) for i, a in (data.get("broker_addrs") or {}).items()}
            learn_remoting_endpoints(by_id, data.get("remoting_addrs") or {})
            if MASTER_ID in by_id:
                addrs[str(name)] = by_id
        queue_datas = tuple(QueueData(name, DEFAULT_TOPIC_QUEUE_NUMS, DEFAULT_TOPIC_QUEUE_NUMS, PERM_READ_WRITE)
                            for name in sorted(addrs))
        return cls(topic, queue_datas, addrs, is_default=True)

    @property
    def broker_names(self) -> list[str]:
        """Broker names in the route, sorted."""
        return sorted(self.broker_addrs)

    def master_addr(self, broker_name: str) -> str | None:
        """The master's address of ``broker_name``, or None while it has none."""
        return self.broker_addrs.get(broker_name, {}).get(MASTER_ID)

    def read_addr(self, broker_name: str) -> str | None:
        """Where to pull ``broker_name``'s queues: the master, else the slave with the lowest id; a broker this
        process found unreachable lately (:func:`mark_unreachable`) only when no other is left."""
        addrs = self.broker_addrs.get(broker_name, {})
        if not addrs:
            return None
        ordered = [addrs[i] for i in sorted(addrs)]  # the master (id 0) first
        if _unreachable:
            now = time.monotonic()
            for addr in ordered:
                until = _unreachable.get(addr)
                if until is None or until <= now:
                    return addr
        return ordered[0]

    def read_wait_ms(self, broker_name: str, addr: str, wait_ms: int) -> int:
        """How long a pull at ``addr`` (from :meth:`read_addr`) may be held: ``wait_ms`` on the master; on a slave
        at most :data:`UNREACHABLE_PASS_OVER_S`, since a pull held there while the master was down would keep
        the consumer on the slave after the master is back, and the messages sent to it waiting."""
        if addr == self.master_addr(broker_name):
            return wait_ms
        return min(wait_ms, int(UNREACHABLE_PASS_OVER_S * 1000))

    def all_addrs(self) -> list[str]:
        """Every broker address in the route (masters and slaves), sorted."""
        return sorted({a for by_id in self.broker_addrs.values() for a in by_id.values()})

    def master_addrs(self) -> list[str]:
        """Every master address in the route, sorted."""
        return sorted(a for by_id in self.broker_addrs.values() if (a := by_id.get(MASTER_ID)))

    def same_queues(self, other: TopicRouteInfo | None) -> bool:
        """Whether ``other`` has the same queues and addresses (a refresh that changed nothing)."""
        return (other is not None and self.queue_datas == other.queue_datas
                and {k: dict(v) for k, v in self.broker_addrs.items()}
                == {k: dict(v) for k, v in other.broker_addrs.items()})


#: How long a broker whose connection failed is passed over for reads before it is tried again (a refused
#: connection costs nothing to retry), and the longest a pull on a slave is held (:meth:`TopicRouteInfo.read_wait_ms`):
#: together they bound how long a consumer keeps reading a slave after its master answers again.
UNREACHABLE_PASS_OVER_S = 1.0
#: Brokers a connection to failed lately -> until when they are passed over for reads (process-wide:
#: every consumer of the process moves to a slave together while a master is down, as the name servers
#: only drop a killed master after their expiry).
_unreachable: dict[str, float] = {}


def mark_unreachable(addr: str, seconds: float) -> None:
    """Pass over ``addr`` for reads for ``seconds`` (a connection to it was refused or reset)."""
    _unreachable[addr] = time.monotonic() + seconds


def mark_reachable(addr: str) -> None:
    """``addr`` answered again."""
    _unreachable.pop(addr, None)


class RouteSource(Protocol):
    """Where :class:`TopicRouteCache` gets routes: :class:`NameServerRoutes` (remoting: RocketMQ's structs) or
    the HTTP ``NameServerClient`` (sparkmq's JSON dicts) while clients still use it."""

    def topic_route(self, topic: str) -> p.TopicRouteData | dict[str, Any]: ...

    def cluster_info(self) -> p.ClusterInfo | dict[str, Any]: ...


class TopicRouteCache:
    """Routes by topic, fetched on first use and refreshed by :meth:`refresh_all` (every 30 s).

    Thread-safe.  A failed refresh keeps the last good route, as RocketMQ does: clients keep
    working from what they know while name servers are unreachable.

    Example::

        >>> cache = TopicRouteCache(NameServerRoutes(["127.0.0.1:9876"], timeout_s=3.0))  # doctest: +SKIP
        >>> cache.get("orders").write_queues  # doctest: +SKIP
    """

    def __init__(self, namesrv: RouteSource, *, miss_retry_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._namesrv = namesrv
        self._miss_retry_s = miss_retry_s
        self._clock = clock
        self._routes: dict[str, TopicRouteInfo] = {}
        self._lock = threading.Lock()

    def topics(self) -> list[str]:
        """Topics with a cached route."""
        with self._lock:
            return sorted(self._routes)

    def cached(self, topic: str) -> TopicRouteInfo | None:
        """The cached route of ``topic`` (no I/O)."""
        with self._lock:
            return self._routes.get(topic)

    def usable(self, topic: str) -> TopicRouteInfo | None:
        """The cached route of ``topic`` when :meth:`get` would answer with it without asking a name server (no
        I/O): a real route, or a default one asked for less than ``miss_retry_s`` ago; else None."""
        route = self.cached(topic)
        if route is None or (route.is_default and self._clock() - route.fetched_at >= self._miss_retry_s):
            return None
        return route

    def get(self, topic: str, *, allow_default: bool = False) -> TopicRouteInfo:
        """The route of ``topic``, fetched when not cached.

        With ``allow_default`` (producers), a topic no name server knows gets a default route over
        the brokers that auto-create topics (:meth:`default_route`), re-asked for at most every
        ``miss_retry_s`` until the real one appears.  Raises TOPIC_NOT_EXIST (or the name servers'
        error) when there is no route.
        """
        fresh = self.usable(topic)
        if fresh is not None:
            return fresh
        route = self.cached(topic)
        try:
            return self.refresh(topic)
        except SparkMQError as exc:
            if route is not None:
                return route
            if not allow_default or exc.code is not ErrorCode.TOPIC_NOT_EXIST:
                raise
        default = self.default_route(topic)
        if not default.write_queues:
            raise SparkMQError(ErrorCode.TOPIC_NOT_EXIST, f"no route for {topic!r} and no live master to create it on")
        default = TopicRouteInfo(topic, default.queue_datas, default.broker_addrs, is_default=True,
                                 fetched_at=self._clock())
        with self._lock:
            self._routes.setdefault(topic, default)
            return self._routes[topic]

    def default_route(self, topic: str) -> TopicRouteInfo:
        """The route a new ``topic`` gets before any broker has it: ``TBW102``'s, each broker's queues capped at
        :data:`DEFAULT_TOPIC_QUEUE_NUMS` (RocketMQ's producer); from the HTTP name server client, every master
        of the cluster view."""
        if isinstance(self._namesrv, NameServerRoutes):
            try:
                data = self._namesrv.topic_route(AUTO_CREATE_TOPIC)
            except SparkMQError as exc:
                if exc.code is ErrorCode.TOPIC_NOT_EXIST:
                    raise SparkMQError(ErrorCode.TOPIC_NOT_EXIST, f"no route for {topic!r} and no broker that "
                                                                  "auto-creates topics") from None
                raise
            return TopicRouteInfo.from_route_data(topic, data, is_default=True, max_queues=DEFAULT_TOPIC_QUEUE_NUMS)
        cluster = self._namesrv.cluster_info()
        assert isinstance(cluster, Mapping)
        return TopicRouteInfo.default_from_cluster(topic, cluster)

    def refresh(self, topic: str) -> TopicRouteInfo:
        """Fetch ``topic``'s route now and cache it; raises when no name server has it."""
        data = self._namesrv.topic_route(topic)
        if isinstance(data, p.TopicRouteData):
            route = TopicRouteInfo.from_route_data(topic, data)
        else:
            route = TopicRouteInfo.from_dict(topic, data)
        route = TopicRouteInfo(topic, route.queue_datas, route.broker_addrs, fetched_at=self._clock())
        with self._lock:
            old = self._routes.get(topic)
            self._routes[topic] = route
        if not route.same_queues(old):
            log.info("route of %s: write %s, read %s", topic, [q.key for q in route.write_queues],
                     [q.key for q in route.read_queues])
        return route

    def refresh_all(self) -> None:
        """Refresh every cached topic; failures keep the last good route (and are logged)."""
        for topic in self.topics():
            try:
                self.refresh(topic)
            except SparkMQError as exc:
                log.debug("route refresh of %s failed: %s", topic, exc)

    def forget(self, topic: str) -> None:
        """Drop ``topic`` from the cache."""
        with self._lock:
            self._routes.pop(topic, None)


class NameServerRoutes:
    """Asks name servers for routes and the cluster view over RocketMQ remoting, failing over between them.

    Requests go to the last name server that answered; one that cannot be reached (or does not answer in
    time) moves them on to the next, in the configured order, wrapping around.  An error answer (for example
    TOPIC_NOT_EXIST) is a real answer and is raised as is.  ``addrs`` are the name servers' ports (each serves
    remoting and HTTP); with ``credentials`` every request is signed (:meth:`Signer.sign_ext`).

    Example::

        >>> ns = NameServerRoutes(["127.0.0.1:9876", "127.0.0.1:9877"], timeout_s=3.0)
        >>> ns.current
        '127.0.0.1:9876'
        >>> ns.close()
    """

    def __init__(self, addrs: Sequence[str], timeout_s: float, *, credentials: Credentials | None = None,
                 ssl_context: ssl.SSLContext | None = None, client: SyncRemotingClient | None = None) -> None:
        if not addrs:
            raise ValueError("at least one name server address is needed")
        self.addrs = tuple(addrs)
        self._timeout = timeout_s
        self._signer = Signer(credentials) if credentials is not None else None
        self._own_client = client is None
        self._client = client or SyncRemotingClient(request_timeout_s=timeout_s, connect_timeout_s=timeout_s,
                                                    ssl_context=ssl_context)
        self._index = 0
        self._lock = threading.Lock()

    @property
    def current(self) -> str:
        """The name server requests go to first."""
        return self.addrs[self._index]

    def request(self, code: int, ext: dict[str, str] | None = None) -> bytes:
        """``code`` on the current name server, failing over; the answer's body (an error answer is raised)."""
        if self._signer is not None:
            ext = self._signer.sign_ext(code, ext, b"")
        with self._lock:
            start = self._index
        last: SparkMQError | None = None
        for step in range(len(self.addrs)):
            index = (start + step) % len(self.addrs)
            addr = self.addrs[index]
            try:
                answer = self._client.request(addr, code, dict(ext) if ext else None, b"", self._timeout)
            except RemotingError as exc:
                last = exc
                log.debug("name server %s failed: %s", addr, exc)
                continue
            with self._lock:
                if self._index != index:
                    log.info("name server %s answers; switching to it from %s", addr, self.addrs[self._index])
                self._index = index
            return bytes(answer.body)
        assert last is not None
        raise last

    def topic_route(self, topic: str) -> p.TopicRouteData:
        """GET_ROUTEINFO_BY_TOPIC: RocketMQ's ``TopicRouteData``; TOPIC_NOT_EXIST when no broker serves ``topic``."""
        return _decode(self.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}), p.TopicRouteData)

    def cluster_info(self) -> p.ClusterInfo:
        """GET_BROKER_CLUSTER_INFO: clusters, their broker names and each broker's addresses."""
        return _decode(self.request(RequestCode.GET_BROKER_CLUSTER_INFO), p.ClusterInfo)

    def topic_list(self) -> list[str]:
        """GET_ALL_TOPIC_LIST_FROM_NAMESERVER: every topic some live broker serves, sorted."""
        return list(_decode(self.request(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER), p.TopicList).topicList)

    def close(self) -> None:
        """Close the connections (when the client is this object's own)."""
        if self._own_client:
            self._client.close()


def _decode(body: bytes, kind: type[Any]) -> Any:
    try:
        return msgspec.json.decode(body, type=kind)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise SparkMQError(ErrorCode.INTERNAL_ERROR, f"a name server answered a malformed {kind.__name__}: {exc}") \
            from None
