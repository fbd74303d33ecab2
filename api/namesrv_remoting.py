"""The name server's RocketMQ remoting adapter: what RocketMQ clients and ``mqadmin`` ask a name server.

It serves on the name server's one port beside HTTP (``api/serving.py`` tells them apart by the first byte), so
``namesrvAddr=127.0.0.1:9876`` works for a RocketMQ client and ``curl 127.0.0.1:9876/...`` for a person.  Each
request code is decoded, answered from the :class:`~sparkmq.platform.namesrv.RouteTable` or the
:class:`~sparkmq.platform.namesrv.KVConfigStore`, and encoded as RocketMQ's name server answers it
(``ClientRequestProcessor``, ``DefaultRequestProcessor``):

=====================================  ====================================================================
GET_ROUTEINFO_BY_TOPIC (105)           ``TopicRouteData`` JSON, compact, broker ids as quoted keys, every
                                       broker's remoting address; TOPIC_NOT_EXIST (17) when no broker serves it
GET_BROKER_CLUSTER_INFO (106)          ``ClusterInfo`` JSON
GET_ALL_TOPIC_LIST_FROM_NAMESERVER     ``TopicList`` JSON
DELETE_TOPIC_IN_NAMESRV (216)          forget the topic's routes (of one cluster with ``clusterName``)
PUT / GET / DELETE_KV_CONFIG           KV configs; GET answers QUERY_NOT_FOUND (22) for an unset key
GET_KVLIST_BY_NAMESPACE (219)          ``KVTable`` JSON; QUERY_NOT_FOUND for an empty namespace
GET_TOPICS_BY_CLUSTER (224)            ``TopicList`` JSON
GET_SYSTEM_TOPIC_LIST_FROM_NS (304)    ``TopicList`` JSON: cluster and broker names, and one broker's address
=====================================  ====================================================================

Brokers register over HTTP (``POST /brokers/register``); REGISTER_BROKER and every other code answer
REQUEST_CODE_NOT_SUPPORTED (3).  With ACL on, every request is checked by the name server's guard, shared with
its HTTP API (:data:`NAMESRV_REMOTING_NEEDS`, docs/security.md).
"""
from __future__ import annotations

import logging
from collections.abc import Callable

import msgspec

from ..platform.auth import CLUSTER, AccessGuard, Action
from ..platform.common import protocol as p
from ..platform.common.errors import ErrorCode, SparkMQError
from ..platform.common.protocol import RequestCode, ResponseCode
from ..platform.namesrv import KVConfigStore, RouteTable
from ..platform.namesrv import route_table as rt
from ..platform.remoting import Frame, RemotingServer, Reply, ServerConnection, unsupported_reply
from .acl import SIGNED, RemotingNeedsOf, remoting_access, remoting_group, remoting_topic

__all__ = ["NameServerRemoting", "NAMESRV_REMOTING_NEEDS", "route_data", "cluster_info_data"]

log = logging.getLogger("sparkmq.namesrv")

_encode = msgspec.json.Encoder().encode
_RETRY_PREFIX = "%RETRY%"


# -- encodings of the route table's views ------------------------------------------------------------------
def _broker_data(data: rt.BrokerData) -> p.BrokerData:
    """RocketMQ's BrokerData: the address clients connect to for each broker id is its remoting endpoint (the
    one port that serves both protocols, where a broker registered one)."""
    addrs = {i: data.remoting_addrs.get(i) or a for i, a in sorted(data.broker_addrs.items())}
    return p.BrokerData(cluster=data.cluster, brokerName=data.broker_name, brokerAddrs=addrs)


def route_data(route: rt.TopicRoute) -> p.TopicRouteData:
    """A route as RocketMQ's ``TopicRouteData``."""
    return p.TopicRouteData(
        brokerDatas=[_broker_data(b) for b in route.broker_datas],
        queueDatas=[p.QueueData(q.broker_name, q.read_queue_nums, q.write_queue_nums, q.perm, q.topic_sys_flag)
                    for q in route.queue_datas])


def cluster_info_data(info: rt.ClusterInfo) -> p.ClusterInfo:
    """The cluster view as RocketMQ's ``ClusterInfo``."""
    return p.ClusterInfo(brokerAddrTable={n: _broker_data(b) for n, b in info.brokers.items()},
                         clusterAddrTable={c: list(names) for c, names in info.clusters.items()})


# -- what each code needs with ACL on ------------------------------------------------------------------------
def _route_lookup(frame: Frame) -> list:
    """As the HTTP route lookup: Pub, Sub or Get on the topic (a retry topic: Sub or Get on its group)."""
    topic = (frame.ext or {}).get("topic")
    if isinstance(topic, str) and topic.startswith(_RETRY_PREFIX):
        return remoting_group(topic[len(_RETRY_PREFIX):], Action.SUB, Action.GET)
    return remoting_topic(topic if isinstance(topic, str) else None, Action.PUB, Action.SUB, Action.GET)


def _cluster(action: Action) -> RemotingNeedsOf:
    return lambda frame: [(action, CLUSTER)]


#: Name-server request codes -> what each needs (the HTTP API's rules for the same questions).  KV reads are
#: open to any signed user: RocketMQ clients read them at start with no more than Pub or Sub rights.
NAMESRV_REMOTING_NEEDS: dict[int, RemotingNeedsOf] = {
    RequestCode.GET_ROUTEINFO_BY_TOPIC: _route_lookup,
    RequestCode.GET_BROKER_CLUSTER_INFO: _cluster(Action.LIST),
    RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER: _cluster(Action.LIST),
    RequestCode.GET_TOPICS_BY_CLUSTER: _cluster(Action.LIST),
    RequestCode.GET_SYSTEM_TOPIC_LIST_FROM_NS: _cluster(Action.LIST),
    RequestCode.DELETE_TOPIC_IN_NAMESRV: lambda frame: remoting_topic((frame.ext or {}).get("topic"), Action.DELETE),
    RequestCode.GET_KV_CONFIG: lambda frame: SIGNED,
    RequestCode.GET_KVLIST_BY_NAMESPACE: lambda frame: SIGNED,
    RequestCode.PUT_KV_CONFIG: _cluster(Action.UPDATE),
    RequestCode.DELETE_KV_CONFIG: _cluster(Action.UPDATE),
}


class NameServerRemoting:
    """The name server's remoting handler over its route table, KV configs and guard.

    Example::

        remoting = NameServerRemoting(RouteTable(), KVConfigStore()).server()
        remoting.start_shared()            # on the serving loop; then serve_app(..., remoting=remoting)
    """

    def __init__(self, table: RouteTable, kv: KVConfigStore, guard: AccessGuard | None = None) -> None:
        self.table = table
        self.kv = kv
        self.guard = guard
        self._handlers: dict[int, Callable[[Frame], Reply]] = {
            RequestCode.GET_ROUTEINFO_BY_TOPIC: self._route,
            RequestCode.GET_BROKER_CLUSTER_INFO: self._cluster_info,
            RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER: self._topic_list,
            RequestCode.DELETE_TOPIC_IN_NAMESRV: self._delete_topic,
            RequestCode.PUT_KV_CONFIG: self._put_kv,
            RequestCode.GET_KV_CONFIG: self._get_kv,
            RequestCode.DELETE_KV_CONFIG: self._delete_kv,
            RequestCode.GET_KVLIST_BY_NAMESPACE: self._kv_list,
            RequestCode.GET_TOPICS_BY_CLUSTER: self._topics_by_cluster,
            RequestCode.GET_SYSTEM_TOPIC_LIST_FROM_NS: self._system_topics,
        }

    def server(self, **kwargs: object) -> RemotingServer:
        """A :class:`RemotingServer` answering with :meth:`handle` (``kwargs``: its settings)."""
        return RemotingServer(self.handle, **kwargs)  # type: ignore[arg-type]

    def handle(self, conn: ServerConnection, frame: Frame) -> Reply:
        """Answer one request (every answer is computed at once: no task, no thread)."""
        remoting_access(self.guard, frame, conn.peer, NAMESRV_REMOTING_NEEDS)
        handler = self._handlers.get(frame.code)
        if handler is None:
            return unsupported_reply(frame)
        return handler(frame)

    # -- routes and lists ----------------------------------------------------------------------------------
    def _route(self, frame: Frame) -> Reply:
        header = frame.header_as(p.TopicRequestHeader)
        route = self.table.topic_route(header.topic)
        if route is None:
            # RocketMQ's wording: the Java producer then asks for TBW102's route (a topic to be auto-created)
            return Reply(ResponseCode.TOPIC_NOT_EXIST, {"errorCode": ErrorCode.TOPIC_NOT_EXIST.name}, b"",
                         f"No topic route info in name server for the topic: {header.topic}")
        return Reply(body=_encode(route_data(route)))

    def _cluster_info(self, frame: Frame) -> Reply:
        return Reply(body=_encode(cluster_info_data(self.table.cluster_info())))

    def _topic_list(self, frame: Frame) -> Reply:
        return Reply(body=_encode(p.TopicList(self.table.topic_list())))

    def _topics_by_cluster(self, frame: Frame) -> Reply:
        header = frame.header_as(p.ClusterRequestHeader)
        return Reply(body=_encode(p.TopicList(self.table.topics_of_cluster(header.cluster))))

    def _system_topics(self, frame: Frame) -> Reply:
        names, addr = self.table.system_topic_list()
        return Reply(body=_encode(p.TopicList(names, addr)))

    def _delete_topic(self, frame: Frame) -> Reply:
        header = frame.header_as(p.TopicRequestHeader)
        self.table.delete_topic(header.topic, header.clusterName or None)
        return Reply()

    # -- KV configs --------------------------------------------------------------------------------------
    def _kv_header(self, frame: Frame, need_key: bool) -> p.KVConfigRequestHeader:
        header = frame.header_as(p.KVConfigRequestHeader)
        if need_key and header.key is None:
            # RocketMQ answers SYSTEM_ERROR "namespace or key is null"; here it is the caller's mistake
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, "namespace or key is null")
        return header

    def _put_kv(self, frame: Frame) -> Reply:
        header = self._kv_header(frame, True)
        self.kv.put(header.namespace, header.key or "", header.value or "")
        return Reply()

    def _get_kv(self, frame: Frame) -> Reply:
        header = self._kv_header(frame, True)
        value = self.kv.get(header.namespace, header.key or "")
        if value is None:
            return Reply(ResponseCode.QUERY_NOT_FOUND, None, b"",
                         f"No config item, Namespace: {header.namespace} Key: {header.key}")
        return Reply(ext=p.KVConfigResponseHeader(value))

    def _delete_kv(self, frame: Frame) -> Reply:
        header = self._kv_header(frame, True)
        self.kv.delete(header.namespace, header.key or "")
        return Reply()

    def _kv_list(self, frame: Frame) -> Reply:
        header = self._kv_header(frame, False)
        table = self.kv.namespace(header.namespace)
        if table is None:
            return Reply(ResponseCode.QUERY_NOT_FOUND, None, b"", f"No config item, Namespace: {header.namespace}")
        return Reply(body=_encode(p.KVTable(table)))
