"""How the Spark side reaches a sparkmq cluster: endpoints, queue discovery, queue bounds, Arrow pulls.

Shared by the ``sparkmq`` source (:mod:`.source`), the sink (:mod:`.sink`) and the dispatch
job (:mod:`.dispatch`).  Discovery, bounds and commits go through the brokers' and name servers'
HTTP API (``docs/http-api.md``), so Spark may run anywhere that reaches them; the source's pulls
go over the brokers' binary remoting protocol (``docs/remoting.md``) where a broker serves it.

* :class:`Endpoints` -- a cluster is reached through name servers (``"host:port;host:port"``)
  or, without name servers, through brokers named directly (``"broker-a=host:port,..."``).
* :class:`ClusterView` (driver side) -- topic lists, read queues and broker addresses, each
  queue's min/max offsets (one ``GET /topics/{topic}/stats`` per broker and topic, in
  parallel), offsets by time, group offset commits.  It reuses the client's
  :class:`~sparkmq.platform.client.NameServerClient`, :class:`~sparkmq.platform.client.BrokerClient`
  and :class:`~sparkmq.platform.client.TopicRouteInfo`, so routes mean the same as for consumers.
* :func:`pull_arrow` (executor side) -- one pull answered as an Arrow table (``PULL_SCHEMA``)
  and the pull's status and offsets: a remoting SPARKMQ_PULL_PACKED whose body (the stored records)
  is decoded in bulk by :mod:`~sparkmq.platform.common.record_columns`, over one remoting
  client per process; or, for a broker without a remoting endpoint, an HTTP Arrow pull over a
  per-process connection pool.

The remoting endpoint of a broker comes from the name servers' routes (``remoting_addrs`` of
the broker data) or, without name servers, from the broker's ``GET /broker`` (its
``remoting_addr``, when it reports one).  The driver puts it into each partition, so executors
in other processes need no discovery of their own.

Topic names are percent-encoded in request paths here: ``%RETRY%`` / ``%DLQ%`` topics hold
``%`` signs that would otherwise be decoded as escapes by the server.
"""
from __future__ import annotations

import concurrent.futures
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import quote

import pyarrow as pa
import pyarrow.compute as pc

from sparkmq.platform.auth.model import validate_access_key, validate_secret_key
from sparkmq.platform.auth.signing import Credentials, Signer
from sparkmq.platform.client import BrokerClient, MessageQueue, NameServerClient, TopicRouteInfo
from sparkmq.platform.client.broker_remoting import pull_ext
from sparkmq.platform.client.remoting import BrokerClientPool, error_from_response
from sparkmq.platform.client.routes import MASTER_ID
from sparkmq.platform.common import protocol
from sparkmq.platform.common.errors import ErrorCode, SparkMQError
from sparkmq.platform.common.filtering import parse_tags
from sparkmq.platform.common.protocol import RequestCode
from sparkmq.platform.common.record_columns import decode_records, packed_records_array
from sparkmq.platform.common.validation import split_addrs
from sparkmq.platform.common.wire import PULL_SCHEMA
from sparkmq.platform.remoting import RemotingError, Response, SyncRemotingClient

__all__ = [
    "CREDENTIAL_OPTIONS",
    "ClusterView",
    "Endpoints",
    "OptionError",
    "PullPage",
    "QueueBounds",
    "pull_arrow",
    "pull_remoting",
    "queue_sort_key",
    "access_error",
    "credentials_option",
    "topic_path",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Parallel HTTP requests one ClusterView makes (stats of many broker x topic pairs per trigger).
_PARALLEL_REQUESTS = 8

_BROKER_ENTRY = re.compile(r"^\s*([A-Za-z0-9_.%|-]+)\s*=\s*(\S+?)\s*$")


class OptionError(SparkMQError):
    """A bad data source option (code INVALID_ARGUMENT); the message starts with the option's name."""

    def __init__(self, option: str, message: str) -> None:
        super().__init__(ErrorCode.INVALID_ARGUMENT, f"option {option!r}: {message}")
        self.option = option


def topic_path(topic: str) -> str:
    """``topic`` percent-encoded for a URL path segment (``%DLQ%g`` -> ``%25DLQ%25g``)."""
    return quote(topic, safe="")


def queue_sort_key(queue: MessageQueue) -> tuple[str, str, int]:
    """The stable order of queues in offsets and partitions: topic, broker name, queue id."""
    return queue.topic, queue.broker_name, queue.queue_id


#: The options of the source and the sink that sign every request (brokers with ACL on, docs/security.md).
CREDENTIAL_OPTIONS = ("accessKey", "secretKey")


def credentials_option(opts: Mapping[str, str]) -> Credentials | None:
    """The ``accessKey`` / ``secretKey`` options as :class:`Credentials` (None when neither is given);
    :class:`OptionError` naming the option when only one is given or one is malformed (never the secret).

    Example::

        >>> credentials_option({"accessKey": "lake", "secretKey": "s3cret-key"})
        Credentials(access_key='lake')
        >>> credentials_option({}) is None
        True
    """
    access_key, secret_key = opts.get("accessKey"), opts.get("secretKey")
    if access_key is None and secret_key is None:
        return None
    if access_key is None or secret_key is None:
        missing = "accessKey" if access_key is None else "secretKey"
        raise OptionError(missing, "give 'accessKey' and 'secretKey' together (requests are signed with both)")
    try:
        validate_access_key(access_key.strip())
    except ValueError as exc:
        raise OptionError("accessKey", str(exc)) from None
    try:
        validate_secret_key(secret_key)
    except ValueError as exc:
        raise OptionError("secretKey", str(exc)) from None
    return Credentials(access_key.strip(), secret_key)


_ACCESS_CODES = (ErrorCode.AUTHENTICATION_FAILED, ErrorCode.NO_PERMISSION)


def access_error(exc: SparkMQError) -> SparkMQError:
    """``exc`` (a refusal by a broker or name server with ACL on) with what to do about it."""
    return SparkMQError(exc.code, f"{exc.message} (the sparkmq source and sink sign their requests with the "
                                  f"options 'accessKey' and 'secretKey'; the user needs Sub and Get on the "
                                  f"topics it reads, Pub on those it writes)")


@dataclass(frozen=True)
class Endpoints:
    """Where the cluster is: name servers, or brokers by name when there is no name server.

    Exactly one of the two is set.  Picklable (plain strings), so it travels to executors.

    Example::

        >>> Endpoints.parse(namesrv="127.0.0.1:9876;127.0.0.1:9877").namesrv
        ('127.0.0.1:9876', '127.0.0.1:9877')
        >>> Endpoints.parse(brokers="broker-a=127.0.0.1:10911").brokers
        (('broker-a', '127.0.0.1:10911'),)
    """

    namesrv: tuple[str, ...] = ()
    brokers: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, namesrv: str | None = None, brokers: str | None = None) -> Endpoints:
        """From the ``namesrv`` / ``brokers`` options; :class:`OptionError` unless exactly one is usable."""
        if namesrv and brokers:
            raise OptionError("namesrv", "give either 'namesrv' or 'brokers', not both")
        if namesrv:
            try:
                addrs = split_addrs(namesrv, "namesrv")
            except ValueError as exc:
                raise OptionError("namesrv", str(exc)) from None
            if not addrs:
                raise OptionError("namesrv", f"expected 'host:port;host:port', got {namesrv!r}")
            return cls(namesrv=addrs)
        if brokers:
            entries: dict[str, str] = {}
            for part in brokers.split(","):
                if not part.strip():
                    continue
                m = _BROKER_ENTRY.match(part)
                if m is None or ":" not in m.group(2):
                    raise OptionError("brokers", f"expected 'brokerName=host:port,...', got {part.strip()!r}")
                if m.group(1) in entries:
                    raise OptionError("brokers", f"broker {m.group(1)!r} is named twice")
                entries[m.group(1)] = m.group(2)
            if not entries:
                raise OptionError("brokers", f"expected 'brokerName=host:port,...', got {brokers!r}")
            return cls(brokers=tuple(sorted(entries.items())))
        raise OptionError("namesrv", "one of 'namesrv' (name servers) or 'brokers' (brokerName=host:port,...) "
                                     "is required")

    @property
    def description(self) -> str:
        """A short human-readable form (for logs and job names)."""
        if self.namesrv:
            return "namesrv " + ";".join(self.namesrv)
        return "brokers " + ",".join(f"{n}={a}" for n, a in self.brokers)


@dataclass(frozen=True)
class QueueBounds:
    """A queue's offsets on its broker: ``[min_offset, max_offset)`` are readable."""

    min_offset: int
    max_offset: int


class ClusterView:
    """The driver's view of the cluster: topics, read queues, broker addresses and queue bounds.

    Thread-safe; one per query (the stream reader keeps it between triggers).  Failures to
    reach a broker are logged and leave its queues out of an answer: callers keep what they
    knew (a broker that restarts must not stop a query that reads others).

    Example::

        view = ClusterView(Endpoints.parse(namesrv="127.0.0.1:9876"))
        routes = view.routes(["orders"])
        bounds = view.bounds(routes["orders"].read_queues)
        view.close()
    """

    def __init__(self, endpoints: Endpoints, timeout_s: float = 10.0, *,
                 credentials: Credentials | None = None) -> None:
        """``credentials`` sign every request (name servers and brokers with ACL on)."""
        self.endpoints = endpoints
        self._timeout = timeout_s
        self._namesrv = (NameServerClient(endpoints.namesrv, timeout_s, credentials=credentials)
                         if endpoints.namesrv else None)
        self._brokers = BrokerClientPool(timeout_s, credentials=credentials)
        self._executor = concurrent.futures.ThreadPoolExecutor(_PARALLEL_REQUESTS,
                                                               thread_name_prefix="sparkmq-cluster-view")
        self._lock = threading.Lock()
        #: broker name -> address to read from, as last seen in a route
        self._addrs: dict[str, str] = dict(endpoints.brokers)
        #: broker name -> remoting endpoint of that address, as last seen (absent: HTTP only)
        self._remoting: dict[str, str] = {}

    def close(self) -> None:
        """Close every connection and the request threads."""
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._brokers.close()
        if self._namesrv is not None:
            self._namesrv.close()

    # -- helpers -------------------------------------------------------------------------------------
    def broker(self, addr: str) -> BrokerClient:
        """The pooled client of the broker at ``addr``."""
        return self._brokers.get(addr)

    def _parallel(self, fn: Callable[[T], Any], items: Sequence[T]) -> list[Any | SparkMQError]:
        """``fn`` over ``items`` on the request threads; a ``SparkMQError`` in place of a failed answer."""
        def safe(item: T) -> Any:
            try:
                return fn(item)
            except SparkMQError as exc:
                if exc.code in _ACCESS_CODES:
                    raise access_error(exc) from None  # not a broker to skip for now: the query cannot work
                return exc
        if len(items) <= 1:
            return [safe(i) for i in items]
        return list(self._executor.map(safe, items))

    def addr_of(self, broker_name: str) -> str | None:
        """The last known read address of ``broker_name``."""
        with self._lock:
            return self._addrs.get(broker_name)

    def remoting_addr_of(self, broker_name: str) -> str | None:
        """The remoting endpoint of ``broker_name``'s read address, when it serves one."""
        with self._lock:
            return self._remoting.get(broker_name)

    def _remember(self, routes: Iterable[TopicRouteInfo], remoting: Mapping[str, str | None]) -> None:
        """Keep each route's read addresses and, per broker name seen in ``remoting``, its endpoint (or none)."""
        with self._lock:
            for route in routes:
                for name in route.broker_names:
                    addr = route.read_addr(name)
                    if addr:
                        self._addrs[name] = addr
            for name, endpoint in remoting.items():
                if endpoint:
                    self._remoting[name] = endpoint
                else:  # the broker stopped serving remoting (or an old one took its place)
                    self._remoting.pop(name, None)

    # -- topics and routes ---------------------------------------------------------------------------
    def _broker_topic_configs(self, with_remoting: bool = False
                              ) -> tuple[dict[str, list[dict[str, Any]]], dict[str, str | None]]:
        """Direct mode: each reachable broker's topic configs (``GET /topics``), by broker name.

        With ``with_remoting``, also each answering broker's remoting endpoint (the
        ``remoting_addr`` of ``GET /broker``; None when it reports none or does not say).
        """
        names = [n for n, _ in self.endpoints.brokers]
        addrs = dict(self.endpoints.brokers)

        def ask(name: str) -> tuple[list[dict[str, Any]], str | None]:
            client = self.broker(addrs[name])
            configs = client.topics()
            if not with_remoting:
                return configs, None
            try:
                endpoint = _get_json(client, "/broker").get("remoting_addr")
            except SparkMQError as exc:  # the topics answered: read this broker over HTTP for now
                log.debug("broker %s did not describe itself: %s", name, exc)
                endpoint = None
            return configs, endpoint if isinstance(endpoint, str) and endpoint else None

        out: dict[str, list[dict[str, Any]]] = {}
        remoting: dict[str, str | None] = {}
        for name, answer in zip(names, self._parallel(ask, names), strict=True):
            if isinstance(answer, SparkMQError):
                log.warning("broker %s did not list its topics: %s", name, answer)
                continue
            out[name], remoting[name] = answer
        return out, remoting

    def topic_names(self) -> list[str]:
        """Every topic the cluster serves, sorted (the name server's list, or the union of the brokers')."""
        if self._namesrv is not None:
            return sorted(self._namesrv.topic_list())
        return sorted({c["topic"] for configs in self._broker_topic_configs()[0].values() for c in configs})

    def routes(self, topics: Iterable[str]) -> dict[str, TopicRouteInfo]:
        """The routes of ``topics`` that exist now (a topic no broker serves is left out)."""
        wanted = sorted(set(topics))
        out: dict[str, TopicRouteInfo] = {}
        remoting: dict[str, str | None] = {}
        if self._namesrv is not None:
            ns = self._namesrv

            def fetch(topic: str) -> tuple[TopicRouteInfo, dict[str, str | None]]:
                data = ns.request("GET", f"/routes/{topic_path(topic)}")
                route = TopicRouteInfo.from_dict(topic, data)
                return route, _route_remoting(route, data)

            for topic, answer in zip(wanted, self._parallel(fetch, wanted), strict=True):
                if isinstance(answer, SparkMQError):
                    if answer.code is not ErrorCode.TOPIC_NOT_EXIST:
                        raise answer
                    continue
                out[topic], endpoints = answer
                remoting.update(endpoints)
        else:
            configs, remoting = self._broker_topic_configs(with_remoting=True)
            addrs = dict(self.endpoints.brokers)
            for topic in wanted:
                queue_datas = [{"broker_name": name, **{k: c[k] for k in ("read_queue_nums", "write_queue_nums",
                                                                          "perm")}}
                               for name, cs in configs.items() for c in cs if c["topic"] == topic]
                if queue_datas:
                    brokers = [{"broker_name": q["broker_name"], "broker_addrs": {"0": addrs[q["broker_name"]]}}
                               for q in queue_datas]
                    out[topic] = TopicRouteInfo.from_dict(topic, {"queue_datas": queue_datas,
                                                                  "broker_datas": brokers})
        self._remember(out.values(), remoting)
        return out

    # -- offsets -------------------------------------------------------------------------------------
    def bounds(self, queues: Iterable[MessageQueue]) -> dict[MessageQueue, QueueBounds]:
        """Min/max offsets of ``queues``; queues whose broker did not answer are left out (and logged)."""
        pairs = sorted({(q.broker_name, q.topic) for q in queues})
        wanted = set(queues)

        def stats(pair: tuple[str, str]) -> dict[str, Any]:
            name, topic = pair
            addr = self.addr_of(name)
            if addr is None:
                raise SparkMQError(ErrorCode.SERVICE_NOT_AVAILABLE, f"no known address for broker {name!r}")
            return _get_json(self.broker(addr), f"/topics/{topic_path(topic)}/stats")

        out: dict[MessageQueue, QueueBounds] = {}
        for (name, topic), answer in zip(pairs, self._parallel(stats, pairs), strict=True):
            if isinstance(answer, SparkMQError):
                log.warning("stats of %s on %s unavailable: %s", topic, name, answer)
                continue
            for q in answer.get("queues") or ():
                mq = MessageQueue(topic, name, int(q["queue_id"]))
                if mq in wanted:
                    out[mq] = QueueBounds(int(q["min_offset"]), int(q["max_offset"]))
        return out

    def offsets_for_time(self, queues: Iterable[MessageQueue], timestamp_ms: int) -> dict[MessageQueue, int]:
        """Per queue, the first offset stored at or after ``timestamp_ms`` (its max offset when none is)."""
        items = sorted(queues, key=queue_sort_key)

        def lookup(q: MessageQueue) -> int:
            addr = self.addr_of(q.broker_name)
            if addr is None:
                raise SparkMQError(ErrorCode.SERVICE_NOT_AVAILABLE, f"no known address for broker {q.broker_name!r}")
            answer = _get_json(self.broker(addr), f"/topics/{topic_path(q.topic)}/queues/{q.queue_id}/offsets",
                               params={"timestamp": timestamp_ms})
            return int(answer["offset"])

        out: dict[MessageQueue, int] = {}
        for q, answer in zip(items, self._parallel(lookup, items), strict=True):
            if isinstance(answer, SparkMQError):
                raise answer
            out[q] = answer
        return out

    def commit_group(self, group: str, offsets: Mapping[MessageQueue, int]) -> int:
        """Commit ``offsets`` for ``group`` on each queue's broker (``POST /consumers/{group}/offsets``).

        Returns how many were committed; a broker that fails is logged and skipped (the
        group's offsets only make lag visible, the query's progress is in its checkpoint).
        """
        by_broker: dict[str, list[dict[str, Any]]] = {}
        for q, offset in sorted(offsets.items(), key=lambda kv: queue_sort_key(kv[0])):
            by_broker.setdefault(q.broker_name, []).append({"topic": q.topic, "queue_id": q.queue_id,
                                                            "offset": offset})
        names = sorted(by_broker)

        def commit(name: str) -> int:
            addr = self.addr_of(name)
            if addr is None:
                raise SparkMQError(ErrorCode.SERVICE_NOT_AVAILABLE, f"no known address for broker {name!r}")
            return self.broker(addr).commit_offsets(group, by_broker[name])

        done = 0
        for name, answer in zip(names, self._parallel(commit, names), strict=True):
            if isinstance(answer, SparkMQError):
                log.warning("committing offsets of group %s on %s failed: %s", group, name, answer)
            else:
                done += answer
        return done


def _route_remoting(route: TopicRouteInfo, data: Mapping[str, Any]) -> dict[str, str | None]:
    """Per broker name of ``route``: the remoting endpoint of its read address (master, else lowest slave), or None.

    ``remoting_addrs`` of a route's broker data maps broker ids (as strings) to endpoints; a
    broker without remoting (an older one, or ``--remoting-port -1``) has no entry.
    """
    out: dict[str, str | None] = {}
    for broker in data.get("broker_datas") or ():
        name = str(broker.get("broker_name"))
        by_id = route.broker_addrs.get(name)
        if not by_id:
            continue
        read_id = MASTER_ID if MASTER_ID in by_id else min(by_id)
        endpoints = {str(k): v for k, v in (broker.get("remoting_addrs") or {}).items()}
        endpoint = endpoints.get(str(read_id))
        out[name] = endpoint if isinstance(endpoint, str) and endpoint else None
    return out


def _get_json(client: BrokerClient, path: str, params: Mapping[str, Any] | None = None) -> Any:
    """GET ``path`` (already percent-encoded) on ``client``'s broker; the JSON answer or a ``SparkMQError``.

    ``BrokerClient``'s own per-topic methods put the topic into the path unencoded, which
    breaks ``%RETRY%`` / ``%DLQ%`` names, so the path is built here and sent on its pool.
    """
    resp = client._call("GET", path, params=dict(params) if params else None)
    if resp.status_code >= 400:
        raise error_from_response(resp)
    return resp.json()


# -- executor side: Arrow pulls ------------------------------------------------------------------------

@dataclass(frozen=True)
class PullPage:
    """One pull's answer: status, where to go on, the queue's bounds, and the messages (``PULL_SCHEMA``)."""

    status: str
    next_offset: int
    min_offset: int
    max_offset: int
    table: pa.Table


_pool_lock = threading.Lock()
_pools: dict[tuple[float, Credentials | None], BrokerClientPool] = {}
_signers: dict[Credentials, Signer] = {}


def _executor_pool(timeout_s: float, credentials: Credentials | None = None) -> BrokerClientPool:
    # One pool per Python worker process (and credentials): Spark reuses workers across tasks, so
    # connections to the brokers are kept between partitions and micro-batches.
    with _pool_lock:
        pool = _pools.get((timeout_s, credentials))
        if pool is None:
            pool = _pools[(timeout_s, credentials)] = BrokerClientPool(timeout_s, credentials=credentials)
        return pool


def _signer(credentials: Credentials) -> Signer:
    with _pool_lock:
        signer = _signers.get(credentials)
        if signer is None:
            signer = _signers[credentials] = Signer(credentials)
        return signer


_remoting_lock = threading.Lock()
_remoting_client: SyncRemotingClient | None = None
#: remoting endpoint -> monotonic time until which pulls to it go over HTTP (it refused a connection)
_remoting_down: dict[str, float] = {}
#: How long an endpoint that could not be reached is left alone before remoting is tried again.
_REMOTING_RETRY_S = 10.0
_FOUND = str(protocol.PullStatus.FOUND)

#: This thread's pull sent ahead (see ``prefetch_until``): its (endpoint, topic, queue, offset, max, tags) and answer.
_ahead = threading.local()


def _executor_remoting() -> SyncRemotingClient:
    # One client per Python worker process, like the HTTP pool: its connections (one per broker,
    # many pulls in flight on each) outlive partitions and micro-batches.  Each pull gives its
    # own timeout.
    global _remoting_client
    with _remoting_lock:
        if _remoting_client is None:
            _remoting_client = SyncRemotingClient()
        return _remoting_client


def pull_arrow(addr: str, topic: str, queue_id: int, offset: int, max_messages: int, *, tags: str = "*",
               timeout_s: float = 30.0, broker_name: str | None = None,
               remoting_addr: str | None = None, prefetch_until: int | None = None,
               credentials: Credentials | None = None) -> PullPage:
    """Pull up to ``max_messages`` from ``offset`` as an Arrow table (``PULL_SCHEMA``) and the pull's offsets.

    Given ``remoting_addr`` and ``broker_name``: a remoting SPARKMQ_PULL_PACKED without a group (up to
    ``MAX_BULK_PULL_BATCH`` messages), whose body -- the stored records -- is decoded here in
    bulk, no object per message (:func:`pull_remoting`).  When that endpoint cannot be
    reached (refused, reset: the pull was not served), this pull and those of the next
    :data:`_REMOTING_RETRY_S` seconds go over HTTP instead; a timeout is raised as it is.
    ``prefetch_until`` (the end of the range being read) lets a remoting pull send the next
    one before decoding its answer (see :func:`pull_remoting`).

    Otherwise an HTTP pull with ``Accept: application/vnd.apache.arrow.stream``
    (``BrokerClient.pull_arrow_table``, the broker's bulk path; given ``broker_name``, an
    unfiltered pull carries the stored records, decoded here too).  Never long-polls
    (``wait_ms=0``): Spark plans what exists.  Raises ``SparkMQError`` (``RemotingError`` when
    the broker is unreachable).  ``credentials`` sign every request (brokers with ACL on).
    """
    try:
        return _pull_arrow(addr, topic, queue_id, offset, max_messages, tags, timeout_s, broker_name, remoting_addr,
                           prefetch_until, credentials)
    except SparkMQError as exc:
        if exc.code in _ACCESS_CODES:
            raise access_error(exc) from None
        raise


def _pull_arrow(addr: str, topic: str, queue_id: int, offset: int, max_messages: int, tags: str, timeout_s: float,
                broker_name: str | None, remoting_addr: str | None, prefetch_until: int | None,
                credentials: Credentials | None) -> PullPage:
    if remoting_addr is not None and broker_name is not None and _remoting_down.get(remoting_addr, 0) <= \
            time.monotonic():
        try:
            return pull_remoting(remoting_addr, broker_name, topic, queue_id, offset, max_messages, tags=tags,
                                 timeout_s=timeout_s, prefetch_until=prefetch_until, credentials=credentials)
        except RemotingError as exc:
            if exc.timed_out:
                raise
            _remoting_down[remoting_addr] = time.monotonic() + _REMOTING_RETRY_S
            log.warning("remoting endpoint %s of %s unreachable (%s); pulling over HTTP from %s for %gs",
                        remoting_addr, broker_name, exc.message, addr, _REMOTING_RETRY_S)
    answer = _executor_pool(timeout_s, credentials).get(addr).pull_arrow_table(topic, queue_id, offset, max_messages,
                                                                   tags=tags or "*", broker_name=broker_name)
    return PullPage(answer.status, answer.next_offset, answer.min_offset, answer.max_offset, answer.table)


def _send_pull(key: tuple[str, str, int, int, int, str | None], timeout_s: float,
               credentials: Credentials | None = None) -> Future[Response]:
    """Send the SPARKMQ_PULL_PACKED ``key`` names (endpoint, topic, queue, offset, max, tags); its answer to come."""
    endpoint, topic, queue_id, offset, max_messages, tags = key
    code = RequestCode.SPARKMQ_PULL_PACKED
    ext = pull_ext(None, topic, queue_id, offset, max_messages, expression=tags)
    if credentials is not None:  # the signature fields beside the header's (docs/security.md)
        ext = _signer(credentials).sign_ext(int(code), ext, b"")
    return _executor_remoting().request_future(endpoint, code, ext, b"", timeout_s, protocol.PULL_OUTCOME_CODES)


def pull_remoting(remoting_addr: str, broker_name: str, topic: str, queue_id: int, offset: int, max_messages: int,
                  *, tags: str = "*", timeout_s: float = 30.0, prefetch_until: int | None = None,
                  credentials: Credentials | None = None) -> PullPage:
    """One remoting SPARKMQ_PULL_PACKED (no group, no hold) decoded into a ``PULL_SCHEMA`` table.

    The frame body (records back to back) becomes a binary array over the received buffer
    (:func:`~sparkmq.platform.common.record_columns.packed_records_array`) and then columns
    (:func:`~sparkmq.platform.common.record_columns.decode_records`).  A tag-filtered pull is
    matched by tag hash on the broker; the tag strings are checked again here, so a hash
    collision never lets a message through that HTTP would have filtered out.

    With ``prefetch_until``: when the answer is FOUND and its next offset is below it, the pull
    a range reader makes next -- from there, ``min(max_messages, prefetch_until - next)`` -- is
    sent before this answer is decoded, so the broker's copy and the transfer overlap the
    decoding.  A later call asking exactly that takes its answer; anything else drops it (pulls
    without a group change nothing on the broker).
    """
    wanted = parse_tags(tags or "*")
    key = (remoting_addr, topic, queue_id, offset, max_messages, None if wanted is None else tags)
    ahead: tuple[tuple[str, str, int, int, int, str | None], Future[Response]] | None = getattr(_ahead, "pull", None)
    _ahead.pull = None
    answer = ahead[1] if ahead is not None and ahead[0] == key else _send_pull(key, timeout_s, credentials)
    response = answer.result()  # the request's own timer fails it after timeout_s
    try:
        header = response.header_as(protocol.PullMessageResponseHeader)
        status = str(protocol.pull_status_of(response.code, response.remark))
    except SparkMQError as exc:
        raise SparkMQError(ErrorCode.INTERNAL_ERROR, f"{remoting_addr}: malformed pull answer: {exc.message}") from None
    if prefetch_until is not None and status == _FOUND and offset < header.nextBeginOffset < prefetch_until:
        following = (*key[:3], header.nextBeginOffset, min(max_messages, prefetch_until - header.nextBeginOffset),
                     key[5])
        _ahead.pull = (following, _send_pull(following, timeout_s, credentials))
    if header.msgCount:
        batch = decode_records(packed_records_array(response.body, header.msgCount), broker_name)
        if wanted is not None:
            batch = batch.filter(pc.fill_null(pc.is_in(batch.column("tags"), value_set=pa.array(sorted(wanted))),
                                              False))
        table = pa.Table.from_batches([batch])
    else:
        table = PULL_SCHEMA.empty_table()
    return PullPage(status, header.nextBeginOffset, header.minOffset, header.maxOffset, table)


def pull_queue_range(addr: str, topic: str, queue_id: int, start: int, end: int, *, broker_name: str,
                     timeout_s: float = 30.0, max_per_pull: int = 8192,
                     remoting_addr: str | None = None, credentials: Credentials | None = None
                     ) -> tuple[pa.Table, list[tuple[int, int]]]:
    """The messages at queue offsets ``[start, end)`` of one queue as one table (``PULL_SCHEMA``, offset order),
    and the sub-ranges the broker no longer has (``[(from, to), ...]``: retention, a lost tail).

    Pages through :func:`pull_arrow` (unfiltered bulk pulls: the broker copies the stored
    records, they are decoded here; over ``remoting_addr`` when given), so reading a range costs
    the broker no Python per message.
    Used by the trace job to expand batch trace records.  Raises ``SparkMQError`` when the
    broker cannot be reached or answers something unknown.
    """
    # (imported here: this function was added without touching the module's imports, which are being reworked)
    import pyarrow.compute as pc

    from sparkmq.platform.common.protocol import PullStatus
    from sparkmq.platform.common.wire import PULL_SCHEMA

    tables: list[pa.Table] = []
    missing: list[tuple[int, int]] = []
    offset = start
    while offset < end:
        page = pull_arrow(addr, topic, queue_id, offset, min(max_per_pull, end - offset), timeout_s=timeout_s,
                          broker_name=broker_name, remoting_addr=remoting_addr, credentials=credentials)
        if page.status == PullStatus.FOUND:
            if page.table.num_rows:
                tables.append(page.table)
            nxt = page.next_offset
        elif page.status == PullStatus.NO_MATCHED_MSG:
            nxt = page.next_offset
        elif page.status == PullStatus.OFFSET_TOO_SMALL:
            nxt = max(page.min_offset, page.next_offset)
            missing.append((offset, min(nxt, end)))
        elif page.status in (PullStatus.NO_NEW_MSG, PullStatus.OFFSET_OVERFLOW, PullStatus.NO_MATCHED_QUEUE):
            missing.append((offset, end))
            break
        else:
            raise SparkMQError(ErrorCode.INTERNAL_ERROR, f"unknown pull status {page.status!r} from {addr}")
        if nxt <= offset:
            raise SparkMQError(ErrorCode.INTERNAL_ERROR, f"{topic} {broker_name}/{queue_id}: a pull at {offset} "
                                                         f"did not advance ({page.status}, next {nxt})")
        offset = nxt
    if not tables:
        return PULL_SCHEMA.empty_table(), missing
    # Pages decoded here and pages the broker built (its lake tier) may differ in nullability only.
    table = pa.concat_tables([t.select(PULL_SCHEMA.names).cast(PULL_SCHEMA) for t in tables])
    return table.filter(pc.less(table.column("queue_offset"), end)), missing
