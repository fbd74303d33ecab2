"""The broker's admin requests over RocketMQ remoting: what ``mqadmin`` (rocketmq-tools) sends a broker.

Each handler decodes the request, calls the broker's processors and components, and encodes the answer as
RocketMQ's ``AdminBrokerProcessor`` does (bodies in RocketMQ's JSON; MessageQueue-keyed maps as fastjson writes
them, ``protocol.mq_keyed_json``):

=========================================  ===============================================================
UPDATE_AND_CREATE_TOPIC (17)               ``mqadmin updateTopic``
DELETE_TOPIC_IN_BROKER (215)               ``mqadmin deleteTopic`` (with DELETE_TOPIC_IN_NAMESRV)
GET_ALL_TOPIC_CONFIG (21)                  ``TopicConfigSerializeWrapper``
GET_TOPIC_CONFIG (351)                     one ``TopicConfig`` (``consumerProgress`` asks it)
GET_TOPIC_STATS_INFO (202)                 ``mqadmin topicStatus``: ``TopicStatsTable``
GET_BROKER_RUNTIME_INFO (28)               ``mqadmin clusterList`` / ``brokerStatus``: ``KVTable``
GET_CONSUME_STATS (208)                    ``mqadmin consumerProgress``: ``ConsumeStats``
GET_CONSUMER_CONNECTION_LIST (203)         ``mqadmin consumerConnection``: ``ConsumerConnection``
QUERY_TOPIC_CONSUME_BY_WHO (300)           ``GroupList`` (``queryMsgById``'s message track)
INVOKE_BROKER_TO_RESET_OFFSET (222)        ``mqadmin resetOffsetByTime``: ``ResetOffsetBody``
UPDATE_AND_CREATE_SUBSCRIPTIONGROUP (200)  ``mqadmin updateSubGroup``
GET_ALL_SUBSCRIPTIONGROUP_CONFIG (201)     ``SubscriptionGroupWrapper``
GET_SUBSCRIPTIONGROUP_CONFIG (352)         one ``SubscriptionGroupConfig``
DELETE_SUBSCRIPTIONGROUP (207)             ``mqadmin deleteSubGroup``
=========================================  ===============================================================

The dispatcher (``BrokerRemoting``) pushes every offset reset, this request's too, to the group's live remoting
consumers as RESET_CONSUMER_CLIENT_OFFSET; :func:`admin_needs` says what each code needs with ACL on (as RocketMQ 5's
ACL 2.0 asks it: the request headers' ``@RocketMQAction``).
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import msgspec

from ...platform.auth import CLUSTER, Action, Need, Resource
from ...platform.broker.client_manager import ConsumeType, ExpressionType
from ...platform.broker.runtime_info import runtime_info
from ...platform.broker.subscription_groups import SubscriptionGroupConfig
from ...platform.common import protocol as p
from ...platform.common.errors import ErrorCode, SparkMQError
from ...platform.common.protocol import RequestCode, ResponseCode
from ...platform.remoting import Frame, Reply, ServerConnection

if TYPE_CHECKING:
    from ...platform.broker.broker import Broker
    from ...platform.broker.topics import TopicConfig

__all__ = ["admin_handlers", "admin_needs", "AdminRemoting", "AdminHandler", "AdminNeedsOf"]


#: ``handler(conn, frame)``: the admin handlers answer at once (no task).
AdminHandler = Callable[[ServerConnection, Frame], Reply]
#: ``needs(frame)``: the (action, resource) pairs a request needs with ACL on, every one of them.
AdminNeedsOf = Callable[[Frame], list[Need]]

_encode = msgspec.json.Encoder().encode
#: RocketMQ's ConsumeType names of sparkmq's consume types (a HEART_BEAT's ``consumeType``).
_CONSUME_TYPES = {ConsumeType.PUSH: "CONSUME_PASSIVELY", ConsumeType.PULL: "CONSUME_ACTIVELY",
                  ConsumeType.POP: "CONSUME_POP"}


class AdminRemoting(Protocol):
    """What the admin handlers need of the broker's remoting dispatcher (``api/remoting``'s ``BrokerRemoting``)."""

    #: The broker served.
    broker: Broker

    def connection_of(self, client_id: str) -> ServerConnection | None:
        """The live connection a client's latest HEART_BEAT came over (None when it has none); its
        ``attributes`` hold ``language`` (LanguageCode name or number) and ``version`` of that heartbeat."""


def _queue(broker: Broker, topic: str, queue_id: int) -> p.MessageQueueData:
    return p.MessageQueueData(topic, broker.name, queue_id)


def _topic_config(cfg: TopicConfig) -> p.TopicConfigData:
    return p.TopicConfigData(topicName=cfg.topic, readQueueNums=cfg.read_queue_nums,
                             writeQueueNums=cfg.write_queue_nums, perm=cfg.perm, topicSysFlag=cfg.topic_sys_flag,
                             order=cfg.order)


def _java_hash(text: str) -> int:
    """``java.lang.String.hashCode`` (a SubscriptionData's ``codeSet``)."""
    h = 0
    raw = text.encode("utf-16-be", "surrogatepass")
    for i in range(0, len(raw), 2):
        h = (31 * h + (raw[i] << 8 | raw[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def _subscription(topic: str, expression: str, kind: ExpressionType) -> p.SubscriptionDataBody:
    """RocketMQ's SubscriptionData of a member's subscription: a TAG expression's tags and their hash codes."""
    tags: list[str] = []
    if kind is ExpressionType.TAG and expression.strip() != "*":
        tags = [t.strip() for t in expression.split("||") if t.strip()]
    return p.SubscriptionDataBody(topic=topic, subString=expression, tagsSet=tags,
                                  codeSet=[_java_hash(t) for t in tags], expressionType=str(kind))


def _language(value: object) -> str:
    if isinstance(value, int) and value in p.LanguageCode._value2member_map_:
        return p.LanguageCode(value).name
    if isinstance(value, str) and value in p.LanguageCode.__members__:
        return value
    return "OTHER"


def _not_online(remark: str) -> Reply:
    return Reply(ResponseCode.CONSUMER_NOT_ONLINE, None, b"", remark)


class _Admin:
    """The handlers over one broker (see the module docstring)."""

    def __init__(self, remoting: AdminRemoting) -> None:
        self.remoting = remoting
        self.broker = remoting.broker
        self.started_at_ms = int(time.time() * 1000)

    # -- topics --------------------------------------------------------------------------------------
    def update_topic(self, conn: ServerConnection, frame: Frame) -> Reply:
        h = frame.header_as(p.CreateTopicRequestHeader)
        self.broker.admin_processor.create_or_update_topic(h.topic, h.readQueueNums, h.writeQueueNums, h.perm,
                                                           h.order, h.topicSysFlag)
        return Reply()

    def delete_topic(self, conn: ServerConnection, frame: Frame) -> Reply:
        self.broker.admin_processor.delete_topic(frame.header_as(p.TopicRequestHeader).topic)
        return Reply()

    def all_topic_config(self, conn: ServerConnection, frame: Frame) -> Reply:
        topics = self.broker.admin_processor.list_topics()
        body = p.TopicConfigSerializeWrapper(
            topicConfigTable={cfg.topic: _topic_config(cfg) for cfg in topics},
            dataVersion=p.DataVersion(self.started_at_ms, self.broker.topics.data_version))
        return Reply(body=_encode(body))

    def topic_config(self, conn: ServerConnection, frame: Frame) -> Reply:
        cfg = self.broker.admin_processor.get_topic(frame.header_as(p.TopicRequestHeader).topic)
        return Reply(body=_encode(_topic_config(cfg)))

    def topic_stats(self, conn: ServerConnection, frame: Frame) -> Reply:
        topic = frame.header_as(p.TopicRequestHeader).topic
        stats = self.broker.admin_processor.topic_stats(topic)
        entries = [(_queue(self.broker, topic, q["queue_id"]),
                    p.TopicOffsetData(q["min_offset"], q["max_offset"], q["last_store_timestamp"]))
                   for q in stats["queues"]]
        return Reply(body=p.mq_keyed_json(entries, {"topicPutTps": 0.0}))

    def consumers_of_topic(self, conn: ServerConnection, frame: Frame) -> Reply:
        topic = frame.header_as(p.TopicRequestHeader).topic
        clients, offsets = self.broker.clients, self.broker.offsets
        groups = {g for g in clients.consumer_groups() if topic in clients.subscribed_topics(g)}
        groups.update(g for g in offsets.groups() if topic in offsets.topics_of(g))
        return Reply(body=_encode(p.GroupList(sorted(groups))))

    # -- the broker ----------------------------------------------------------------------------------
    def runtime_info(self, conn: ServerConnection, frame: Frame) -> Reply:
        return Reply(body=_encode(p.KVTable(runtime_info(self.broker, self.started_at_ms))))

    # -- consumer groups -----------------------------------------------------------------------------
    def consume_stats(self, conn: ServerConnection, frame: Frame) -> Reply:
        h = frame.header_as(p.GetConsumeStatsRequestHeader)
        try:
            lag = self.broker.consumer_processor.lag(h.consumerGroup, h.topic or None)
        except SparkMQError as exc:
            if exc.code is not ErrorCode.TOPIC_NOT_EXIST:
                raise
            lag = {"queues": []}  # RocketMQ leaves a topic it does not have out
        consumers = self.broker.consumer_processor
        entries = []
        for q in lag["queues"]:
            consumed = max(q["consumer_offset"], 0)
            last = consumers.last_consumed_timestamp(q["topic"], q["queue_id"], consumed)
            entries.append((_queue(self.broker, q["topic"], q["queue_id"]),
                            p.OffsetWrapperData(q["broker_offset"], consumed, consumed, last)))
        return Reply(body=p.mq_keyed_json(entries, {"consumeTps": 0.0}))

    def consumer_connections(self, conn: ServerConnection, frame: Frame) -> Reply:
        group = frame.header_as(p.ConsumerGroupRequestHeader).consumerGroup
        info = self.broker.consumer_processor.group_info(group)
        if not info.members:
            return _not_online(f"the consumer group[{group}] not online")
        connections = []
        for client_id in info.members:
            member_conn = self.remoting.connection_of(client_id)
            attributes = member_conn.attributes if member_conn is not None else {}
            connections.append(p.ConnectionData(
                clientId=client_id, clientAddr=member_conn.peer if member_conn is not None else "",
                language=_language(attributes.get("language")), version=int(attributes.get("version") or 0)))
        body = p.ConsumerConnection(
            connectionSet=connections,
            subscriptionTable={s.topic: _subscription(s.topic, s.expression, s.type) for s in info.subscriptions},
            consumeType=_CONSUME_TYPES.get(info.consume_type) if info.consume_type else None,
            messageModel=str(info.message_model) if info.message_model else None,
            consumeFromWhere=str(info.consume_from_where) if info.consume_from_where else None)
        return Reply(body=_encode(body))

    def reset_offset(self, conn: ServerConnection, frame: Frame) -> Reply:
        h = frame.header_as(p.ResetOffsetRequestHeader)
        broker = self.broker
        broker.admin_processor.get_topic(h.topic)  # TOPIC_NOT_EXIST first, as RocketMQ
        if not broker.clients.members(h.group):
            # RocketMQ answers this, and mqadmin then resets through UPDATE_CONSUMER_OFFSET itself
            return _not_online(f"Consumer not online, so can not reset offset, Group: {h.group} Topic: {h.topic} "
                               f"Timestamp: {h.timestamp}")
        consumers = broker.consumer_processor
        if h.queueId >= 0 and h.offset is not None:  # one queue to an offset
            result = consumers.reset_offsets(h.group, h.topic, offsets={h.queueId: h.offset})
        elif h.isForce and h.timestamp >= 0:
            result = consumers.reset_offsets(h.group, h.topic, timestamp=h.timestamp)
        else:  # -1 is the queues' ends; without isForce a queue only moves back
            result = consumers.reset_offsets_back(h.group, h.topic, h.timestamp, force=h.isForce)
        entries = [(_queue(broker, h.topic, int(q)), offset) for q, offset in result["offsets"].items()]
        return Reply(body=p.mq_keyed_json(entries))

    # -- subscription groups -----------------------------------------------------------------------
    def update_subscription_group(self, conn: ServerConnection, frame: Frame) -> Reply:
        try:
            body = msgspec.json.decode(bytes(frame.body), type=p.SubscriptionGroupConfigBody)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, f"bad SubscriptionGroupConfig body: {exc}") from None
        self.broker.subscription_groups.create_or_update(SubscriptionGroupConfig(
            body.groupName, body.consumeEnable, body.consumeFromMinEnable, body.consumeBroadcastEnable,
            body.consumeMessageOrderly, body.retryQueueNums, body.retryMaxTimes, body.brokerId,
            body.whichBrokerWhenConsumeSlowly, body.notifyConsumerIdsChangedEnable, body.groupSysFlag,
            body.consumeTimeoutMinute, body.attributes))
        return Reply()

    def all_subscription_groups(self, conn: ServerConnection, frame: Frame) -> Reply:
        broker = self.broker
        manager = broker.subscription_groups
        # groups seen here without a config have the defaults, as RocketMQ's auto-created ones
        names = {c.group_name for c in manager.list()} | set(broker.clients.consumer_groups()) \
            | set(broker.offsets.groups())
        counter, stamp = manager.data_version
        body = p.SubscriptionGroupWrapper({n: _group_body(manager.get(n)) for n in sorted(names)},
                                          p.DataVersion(stamp, counter))
        return Reply(body=_encode(body))

    def subscription_group(self, conn: ServerConnection, frame: Frame) -> Reply:
        group = frame.header_as(p.SubscriptionGroupRequestHeader).group
        return Reply(body=_encode(_group_body(self.broker.subscription_groups.get(group))))

    def delete_subscription_group(self, conn: ServerConnection, frame: Frame) -> Reply:
        h = frame.header_as(p.DeleteSubscriptionGroupRequestHeader)
        self.broker.subscription_groups.delete(h.groupName)
        if h.cleanOffset:
            self.broker.offsets.remove_group(h.groupName)
        return Reply()


def _group_body(cfg: SubscriptionGroupConfig) -> p.SubscriptionGroupConfigBody:
    return p.SubscriptionGroupConfigBody(
        groupName=cfg.group_name, consumeEnable=cfg.consume_enable, consumeFromMinEnable=cfg.consume_from_min_enable,
        consumeBroadcastEnable=cfg.consume_broadcast_enable, consumeMessageOrderly=cfg.consume_message_orderly,
        retryQueueNums=cfg.retry_queue_nums, retryMaxTimes=cfg.retry_max_times, brokerId=cfg.broker_id,
        whichBrokerWhenConsumeSlowly=cfg.which_broker_when_consume_slowly,
        notifyConsumerIdsChangedEnable=cfg.notify_consumer_ids_changed_enable, groupSysFlag=cfg.group_sys_flag,
        consumeTimeoutMinute=cfg.consume_timeout_minute, attributes=dict(cfg.attributes))


def admin_handlers(remoting: AdminRemoting) -> dict[int, AdminHandler]:
    """The admin request codes of ``remoting``'s broker and their handlers, for the dispatcher to merge.

    Example::

        handlers = admin_handlers(broker_remoting)        # {17: ..., 215: ..., ...}
        reply = handlers[RequestCode.GET_BROKER_RUNTIME_INFO](conn, frame)
    """
    admin = _Admin(remoting)
    return {
        RequestCode.UPDATE_AND_CREATE_TOPIC: admin.update_topic,
        RequestCode.DELETE_TOPIC_IN_BROKER: admin.delete_topic,
        RequestCode.GET_ALL_TOPIC_CONFIG: admin.all_topic_config,
        RequestCode.GET_TOPIC_CONFIG: admin.topic_config,
        RequestCode.GET_TOPIC_STATS_INFO: admin.topic_stats,
        RequestCode.QUERY_TOPIC_CONSUME_BY_WHO: admin.consumers_of_topic,
        RequestCode.GET_BROKER_RUNTIME_INFO: admin.runtime_info,
        RequestCode.GET_CONSUME_STATS: admin.consume_stats,
        RequestCode.GET_CONSUMER_CONNECTION_LIST: admin.consumer_connections,
        RequestCode.INVOKE_BROKER_TO_RESET_OFFSET: admin.reset_offset,
        RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: admin.update_subscription_group,
        RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: admin.all_subscription_groups,
        RequestCode.GET_SUBSCRIPTIONGROUP_CONFIG: admin.subscription_group,
        RequestCode.DELETE_SUBSCRIPTIONGROUP: admin.delete_subscription_group,
    }


def _header_field(frame: Frame, name: str) -> str | None:
    value = (frame.ext or {}).get(name)
    return value if isinstance(value, str) and value else None


def _on_topic(action: Action) -> AdminNeedsOf:
    return lambda frame: [(action, Resource.topic(t))] if (t := _header_field(frame, "topic")) else []


def _on_group(action: Action, field: str) -> AdminNeedsOf:
    return lambda frame: [(action, Resource.group(g))] if (g := _header_field(frame, field)) else []


def _on_cluster(action: Action) -> AdminNeedsOf:
    return lambda frame: [(action, CLUSTER)]


def _subscription_group_needs(frame: Frame) -> list[Need]:
    """Update on the group the body names (RocketMQ's body-carried request; a body that does not parse needs
    nothing here: the handler refuses it)."""
    try:
        name = msgspec.json.decode(bytes(frame.body), type=p.SubscriptionGroupConfigBody).groupName
    except (msgspec.DecodeError, msgspec.ValidationError):
        return []
    return [(Action.UPDATE, Resource.group(name))]


def admin_needs(remoting: AdminRemoting) -> dict[int, AdminNeedsOf]:
    """What each admin code needs with ACL on, for the dispatcher to merge with the other families' (every pair
    is needed; docs/security.md): RocketMQ's actions (``Create``/``Delete``/``Get`` on the topic, ``Get`` /
    ``Update`` on the group, ``List`` / ``Get`` on ``Cluster`` for broker-wide views)."""
    return {
        RequestCode.UPDATE_AND_CREATE_TOPIC: _on_topic(Action.CREATE),
        RequestCode.DELETE_TOPIC_IN_BROKER: _on_topic(Action.DELETE),
        RequestCode.GET_ALL_TOPIC_CONFIG: _on_cluster(Action.LIST),
        RequestCode.GET_TOPIC_CONFIG: _on_topic(Action.GET),
        RequestCode.GET_TOPIC_STATS_INFO: _on_topic(Action.GET),
        RequestCode.QUERY_TOPIC_CONSUME_BY_WHO: _on_topic(Action.GET),
        RequestCode.GET_BROKER_RUNTIME_INFO: _on_cluster(Action.GET),
        RequestCode.GET_CONSUME_STATS: lambda frame: (_on_group(Action.GET, "consumerGroup")(frame)
                                                      + _on_topic(Action.GET)(frame)),
        RequestCode.GET_CONSUMER_CONNECTION_LIST: _on_group(Action.GET, "consumerGroup"),
        RequestCode.INVOKE_BROKER_TO_RESET_OFFSET: lambda frame: (_on_group(Action.UPDATE, "group")(frame)
                                                                  + _on_topic(Action.UPDATE)(frame)),
        RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: _subscription_group_needs,
        RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: _on_cluster(Action.LIST),
        RequestCode.GET_SUBSCRIPTIONGROUP_CONFIG: _on_group(Action.GET, "group"),
        RequestCode.DELETE_SUBSCRIPTIONGROUP: _on_group(Action.DELETE, "groupName"),
    }
