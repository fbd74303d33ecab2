"""How the Spark side reaches a sparkmq cluster: endpoints, queue discovery, queue bounds, Arrow pulls.

Shared by the ``sparkmq`` source (:mod:`.source`), the sink (:mod:`.sink`) and the dispatch
job (:mod:`.dispatch`).  Everything goes through the brokers' and name servers' HTTP API
(``docs/http-api.md``), so Spark may run anywhere that reaches them.

* :class:`Endpoints` -- a cluster is reached through name servers (``"host:port;host:port"``)
  or, without name servers, through brokers named directly (``"broker-a=host:port,..."``).
* :class:`ClusterView` (driver side) -- topic lists, read queues and broker addresses, each
  queue's min/max offsets (one ``GET /topics/{topic}/stats`` per broker and topic, in
  parallel), offsets by time, group offset commits.  It reuses the client's
  :class:`~sparkmq.platform.client.NameServerClient`, :class:`~sparkmq.platform.client.BrokerClient`
  and :class:`~sparkmq.platform.client.TopicRouteInfo`, so routes mean the same as for consumers.
* :func:`pull_arrow` (executor side) -- one pull answered as an Arrow table (``PULL_SCHEMA``)
  plus the ``X-Pull-*`` headers, over a per-process connection pool.

Topic names are percent-encoded in request paths here: ``%RETRY%`` / ``%DLQ%`` topics hold
``%`` signs that would otherwise be decoded as escapes by the server.
"""
from __future__ import annotations

import concurrent.futures
import logging
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import quote

import pyarrow as pa

from sparkmq.platform.client import BrokerClient, MessageQueue, NameServerClient, TopicRouteInfo
from sparkmq.platform.client.remoting import BrokerClientPool, error_from_response
from sparkmq.platform.common.errors import ErrorCode, SparkMQError

__all__ = [
    "ClusterView",
    "Endpoints",
    "OptionError",
    "PullPage",
    "QueueBounds",
    "pull_arrow",
    "queue_sort_key",
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


def _split_addrs(text: str) -> tuple[str, ...]:
    return tuple(a.strip() for a in re.split(r"[;,]", text) if a.strip())


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
            addrs = _split_addrs(namesrv)
            if not addrs or not all(":" in a for a in addrs):
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

    def __init__(self, endpoints: Endpoints, timeout_s: float = 10.0) -> None:
        self.endpoints = endpoints
        self._timeout = timeout_s
        self._namesrv = NameServerClient(endpoints.namesrv, timeout_s) if endpoints.namesrv else None
        self._brokers = BrokerClientPool(timeout_s)
        self._executor = concurrent.futures.ThreadPoolExecutor(_PARALLEL_REQUESTS,
                                                               thread_name_prefix="sparkmq-cluster-view")
        self._lock = threading.Lock()
        #: broker name -> address to read from, as last seen in a route
        self._addrs: dict[str, str] = dict(endpoints.brokers)

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
                return exc
        if len(items) <= 1:
            return [safe(i) for i in items]
        return list(self._executor.map(safe, items))

    def addr_of(self, broker_name: str) -> str | None:
        """The last known read address of ``broker_name``."""
        with self._lock:
            return self._addrs.get(broker_name)

    def _remember(self, routes: Iterable[TopicRouteInfo]) -> None:
        with self._lock:
            for route in routes:
                for name in route.broker_names:
                    addr = route.read_addr(name)
                    if addr:
                        self._addrs[name] = addr

    # -- topics and routes ---------------------------------------------------------------------------
    def _broker_topic_configs(self) -> dict[str, list[dict[str, Any]]]:
        """Direct mode: each reachable broker's topic configs (``GET /topics``), by broker name."""
        names = [n for n, _ in self.endpoints.brokers]
        answers = self._parallel(lambda n: self.broker(dict(self.endpoints.brokers)[n]).topics(), names)
        out: dict[str, list[dict[str, Any]]] = {}
        for name, answer in zip(names, answers, strict=True):
            if isinstance(answer, SparkMQError):
                log.warning("broker %s did not list its topics: %s", name, answer)
                continue
            out[name] = answer
        return out

    def topic_names(self) -> list[str]:
        """Every topic the cluster serves, sorted (the name server's list, or the union of the brokers')."""
        if self._namesrv is not None:
            return sorted(self._namesrv.topic_list())
        return sorted({c["topic"] for configs in self._broker_topic_configs().values() for c in configs})

    def routes(self, topics: Iterable[str]) -> dict[str, TopicRouteInfo]:
        """The routes of ``topics`` that exist now (a topic no broker serves is left out)."""
        wanted = sorted(set(topics))
        out: dict[str, TopicRouteInfo] = {}
        if self._namesrv is not None:
            ns = self._namesrv

            def fetch(topic: str) -> TopicRouteInfo:
                return TopicRouteInfo.from_dict(topic, ns.request("GET", f"/routes/{topic_path(topic)}"))

            for topic, answer in zip(wanted, self._parallel(fetch, wanted), strict=True):
                if isinstance(answer, SparkMQError):
                    if answer.code is not ErrorCode.TOPIC_NOT_EXIST:
                        raise answer
                    continue
                out[topic] = answer
        else:
            configs = self._broker_topic_configs()
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
        self._remember(out.values())
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
_pools: dict[float, BrokerClientPool] = {}


def _executor_pool(timeout_s: float) -> BrokerClientPool:
    # One pool per Python worker process: Spark reuses workers across tasks, so connections
    # to the brokers are kept between partitions and micro-batches.
    with _pool_lock:
        pool = _pools.get(timeout_s)
        if pool is None:
            pool = _pools[timeout_s] = BrokerClientPool(timeout_s)
        return pool


def pull_arrow(addr: str, topic: str, queue_id: int, offset: int, max_messages: int, *, tags: str = "*",
               timeout_s: float = 30.0, broker_name: str | None = None) -> PullPage:
    """Pull up to ``max_messages`` from ``offset`` with ``Accept: application/vnd.apache.arrow.stream``.

    ``BrokerClient.pull(arrow=True)`` turns the Arrow answer into Python objects row by row;
    this keeps it columnar (``BrokerClient.pull_arrow_table``, served by the broker's bulk
    path).  Given ``broker_name``, an unfiltered pull carries the stored records and is decoded
    here, on the executor, instead of on the broker.  Never long-polls (``wait_ms=0``): Spark
    plans what exists.  Raises ``SparkMQError`` (``RemotingError`` when the broker is unreachable).
    """
    answer = _executor_pool(timeout_s).get(addr).pull_arrow_table(topic, queue_id, offset, max_messages,
                                                                   tags=tags or "*", broker_name=broker_name)
    return PullPage(answer.status, answer.next_offset, answer.min_offset, answer.max_offset, answer.table)
