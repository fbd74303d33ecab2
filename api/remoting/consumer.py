"""Clients, consumer groups and their offsets over remoting -- RocketMQ's ClientManageProcessor and
ConsumerManageProcessor requests: HEART_BEAT (34), UNREGISTER_CLIENT (35), GET_CONSUMER_LIST_BY_GROUP (38),
QUERY_CONSUMER_OFFSET (14), UPDATE_CONSUMER_OFFSET (15), LOCK_BATCH_MQ (41), UNLOCK_BATCH_MQ (42),
GET_CONSUMER_RUNNING_INFO (307, relayed to the client), and sparkmq's SPARKMQ_GROUP_INFO (30004) and
SPARKMQ_UPDATE_CONSUMER_OFFSETS (30005).

A HEART_BEAT binds its client id to the connection it came on: the group's rebalance notices, offset resets and
transaction check-backs are pushed there (:class:`~sparkmq.api.remoting.BrokerRemoting`).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ...platform.auth import Action, Need, Resource
from ...platform.broker.client_manager import ConsumerData, Subscription
from ...platform.common import protocol as p
from ...platform.common.errors import ErrorCode
from ...platform.common.filtering import compile_filter
from ...platform.common.protocol import RequestCode, ResponseCode
from ...platform.remoting import Frame, Reply, ServerConnection, error_reply
from ._common import Handler, NeedsOf, encode_json, json_body, reply, sub_group, sub_topic

if TYPE_CHECKING:
    from . import BrokerRemoting

__all__ = ["family", "consumer_data"]

#: RocketMQ's deprecated ConsumeFromWhere names, which its clients treat as CONSUME_FROM_LAST_OFFSET.
_LAST_OFFSET_ALIASES = ("CONSUME_FROM_LAST_OFFSET_AND_FROM_MIN_WHEN_BOOT_FIRST", "CONSUME_FROM_MIN_OFFSET",
                        "CONSUME_FROM_MAX_OFFSET")
#: How long a relayed GET_CONSUMER_RUNNING_INFO waits for the client (RocketMQ's broker: 5 s).
_RELAY_TIMEOUT_S = 5.0


def consumer_data(data: p.ConsumerDataBody) -> ConsumerData:
    """One consumer group of a HeartbeatData body as the broker's :class:`ConsumerData` (INVALID_ARGUMENT for a
    consume type, model or start it does not know)."""
    consume_type = p.CONSUME_TYPES_BY_NAME.get(data.consumeType, data.consumeType)
    where = "CONSUME_FROM_LAST_OFFSET" if data.consumeFromWhere in _LAST_OFFSET_ALIASES else data.consumeFromWhere
    # The names are made enums (or INVALID_ARGUMENT) by ConsumerData and Subscription themselves.
    subs = tuple(Subscription(s.topic, s.subString, s.expressionType or "TAG")  # type: ignore[arg-type]
                 for s in data.subscriptionDataSet)
    return ConsumerData(data.groupName, consume_type, data.messageModel, where, subs,  # type: ignore[arg-type]
                        tuple(data.heldQueues))


class _Consumers:
    def __init__(self, remoting: BrokerRemoting) -> None:
        self.remoting = remoting
        self.broker = remoting.broker

    # -- clients --------------------------------------------------------------------------------
    def heartbeat(self, conn: ServerConnection, frame: Frame) -> Reply:
        """HEART_BEAT: record the client's groups and bind it to this connection for pushes."""
        data = json_body(frame, p.HeartbeatData)
        consumers = [consumer_data(c) for c in data.consumerDataSet]
        producer_groups = [g.groupName for g in data.producerDataSet]
        # Bound first: a member joining is told of its own join (NOTIFY_CONSUMER_IDS_CHANGED), as RocketMQ's broker
        # does; RocketMQ's clients rebalance on that notice, else only after their 20 s rebalance interval.
        self.remoting.bind(data.clientID, conn, frame)
        versions = self.broker.consumer_processor.heartbeat(data.clientID, producer_groups, consumers)
        for group in producer_groups:
            self.remoting.push_pending_checks(group)
        return reply(p.HeartbeatResponseHeader(), encode_json(p.HeartbeatResponseBody(versions)))

    def check_client_config(self, conn: ServerConnection, frame: Frame) -> Reply:
        """CHECK_CLIENT_CONFIG: whether the subscription's expression compiles here (a SQL92 push consumer asks
        before it starts); FILTER_EXPRESSION_ILLEGAL (RocketMQ's 23 SUBSCRIPTION_PARSE_FAILED) when it does not."""
        sub = json_body(frame, p.CheckClientRequestBody).subscriptionData
        if sub is not None:
            compile_filter(sub.subString, sub.expressionType)
        return reply()

    def unregister(self, conn: ServerConnection, frame: Frame) -> Reply:
        """UNREGISTER_CLIENT: the client leaves the named producer and/or consumer group."""
        h = frame.header_as(p.UnregisterClientRequestHeader)
        self.broker.consumer_processor.unregister_client(
            h.clientID, [h.producerGroup] if h.producerGroup else [], [h.consumerGroup] if h.consumerGroup else [])
        return reply()

    def consumer_list(self, conn: ServerConnection, frame: Frame) -> Reply:
        """GET_CONSUMER_LIST_BY_GROUP: the member ids; code 1 when the group has none here (RocketMQ's answer)."""
        group = frame.header_as(p.ConsumerGroupRequestHeader).consumerGroup
        members = self.broker.consumer_processor.group_info(group).members
        if not members:
            return reply({"errorCode": ErrorCode.GROUP_NOT_EXIST.name}, code=ResponseCode.SYSTEM_ERROR,
                         remark=f"no consumer for this group, {group}")
        return reply(body=encode_json(p.ConsumerIdList(list(members))))

    def group_info(self, conn: ServerConnection, frame: Frame) -> Reply:
        """SPARKMQ_GROUP_INFO: the group's whole view (``GET /consumers/{group}``'s answer)."""
        group = frame.header_as(p.ConsumerGroupRequestHeader).consumerGroup
        return reply(body=encode_json(self.broker.consumer_processor.group_info(group).to_dict()))

    # -- offsets --------------------------------------------------------------------------------
    def query_offset(self, conn: ServerConnection, frame: Frame) -> Reply:
        """QUERY_CONSUMER_OFFSET: the committed offset, 0 for a young queue (setZeroIfNotFound), else 22."""
        h = frame.header_as(p.QueryConsumerOffsetRequestHeader)
        offset = self.broker.consumer_processor.query_offset_or_start(h.consumerGroup, h.topic, h.queueId,
                                                                      h.setZeroIfNotFound)
        if offset < 0:
            return reply(code=ResponseCode.QUERY_NOT_FOUND, remark="Not found, this group never committed an "
                                                                   "offset of the queue")
        return reply(p.OffsetResponseHeader(offset))

    def update_offset(self, conn: ServerConnection, frame: Frame) -> Reply:
        """UPDATE_CONSUMER_OFFSET: commit one queue's offset for a group."""
        h = frame.header_as(p.UpdateConsumerOffsetRequestHeader)
        self.broker.consumer_processor.commit_offsets(h.consumerGroup, [(h.topic, h.queueId, h.commitOffset)])
        return reply()

    def update_offsets(self, conn: ServerConnection, frame: Frame) -> Reply:
        """SPARKMQ_UPDATE_CONSUMER_OFFSETS: many queues' offsets at once, all or nothing."""
        body = json_body(frame, p.UpdateConsumerOffsetsBody)
        committed = self.broker.consumer_processor.commit_offsets(
            body.consumerGroup, [(e.topic, e.queueId, e.offset) for e in body.offsets])
        return reply(p.UpdateConsumerOffsetsResponseHeader(committed))

    # -- orderly consumption's queue locks --------------------------------------------------------
    def lock(self, conn: ServerConnection, frame: Frame) -> Reply:
        """LOCK_BATCH_MQ: lock (or renew) queues for orderly consumption; the queues held now."""
        body = json_body(frame, p.LockBatchRequestBody)
        held = self.broker.consumer_processor.lock_queues(body.consumerGroup, body.clientId,
                                                          [(q.topic, q.queueId) for q in body.mqSet])
        name = self.broker.name
        return reply(body=encode_json(p.LockBatchResponseBody([p.MessageQueueData(t, name, q) for t, q in held])))

    def unlock(self, conn: ServerConnection, frame: Frame) -> Reply:
        """UNLOCK_BATCH_MQ: release queues the client holds."""
        body = json_body(frame, p.LockBatchRequestBody)
        self.broker.consumer_processor.unlock_queues(body.consumerGroup, body.clientId,
                                                     [(q.topic, q.queueId) for q in body.mqSet])
        return reply()

    # -- relayed to a client --------------------------------------------------------------------
    async def running_info(self, conn: ServerConnection, frame: Frame) -> Reply:
        """GET_CONSUMER_RUNNING_INFO: asked of the client itself on its bound connection; its answer relayed."""
        h = frame.header_as(p.ConsumerRunningInfoRequestHeader)
        target = self.remoting.connection_of(h.clientId)
        if target is None:
            return error_reply(ErrorCode.CONSUMER_NOT_ONLINE, f"The Consumer <{h.clientId}> not online")
        answer = await target.request(RequestCode.GET_CONSUMER_RUNNING_INFO, frame.ext_text(), b"", _RELAY_TIMEOUT_S)
        return Reply(answer.code, answer.ext_text(), answer.body, answer.remark)


def _heartbeat_needs(frame: Frame) -> list[Need]:
    data = json_body(frame, p.HeartbeatData)
    return [n for c in data.consumerDataSet
            for n in sub_group(c.groupName) + [x for s in c.subscriptionDataSet for x in sub_topic(s.topic)]]


def _offset_needs(frame: Frame) -> list[Need]:
    h = frame.header_as(p.QueryConsumerOffsetRequestHeader)
    return sub_group(h.consumerGroup) + sub_topic(h.topic)


def _offsets_needs(frame: Frame) -> list[Need]:
    body = json_body(frame, p.UpdateConsumerOffsetsBody)
    return sub_group(body.consumerGroup) + [n for e in body.offsets for n in sub_topic(e.topic)]


def _lock_needs(frame: Frame) -> list[Need]:
    body = json_body(frame, p.LockBatchRequestBody)
    return sub_group(body.consumerGroup) + [n for q in body.mqSet for n in sub_topic(q.topic)]


def _check_config_needs(frame: Frame) -> list[Need]:
    group = json_body(frame, p.CheckClientRequestBody).group
    return sub_group(group) if group else []


def _group_needs(frame: Frame) -> list[Need]:
    return sub_group(frame.header_as(p.ConsumerGroupRequestHeader).consumerGroup)


def family(remoting: BrokerRemoting) -> tuple[dict[int, Handler], dict[int, NeedsOf | str]]:
    """The client, group and offset handlers and what each needs with ACL on (Sub on the group and its topics)."""
    consumers = _Consumers(remoting)
    handlers: dict[int, Handler] = {
        RequestCode.HEART_BEAT: consumers.heartbeat,
        RequestCode.UNREGISTER_CLIENT: consumers.unregister,
        RequestCode.CHECK_CLIENT_CONFIG: consumers.check_client_config,
        RequestCode.GET_CONSUMER_LIST_BY_GROUP: consumers.consumer_list,
        RequestCode.SPARKMQ_GROUP_INFO: consumers.group_info,
        RequestCode.QUERY_CONSUMER_OFFSET: consumers.query_offset,
        RequestCode.UPDATE_CONSUMER_OFFSET: consumers.update_offset,
        RequestCode.SPARKMQ_UPDATE_CONSUMER_OFFSETS: consumers.update_offsets,
        RequestCode.LOCK_BATCH_MQ: consumers.lock,
        RequestCode.UNLOCK_BATCH_MQ: consumers.unlock,
        RequestCode.GET_CONSUMER_RUNNING_INFO: consumers.running_info,
    }
    needs: dict[int, NeedsOf | str] = {
        RequestCode.HEART_BEAT: _heartbeat_needs,
        RequestCode.UNREGISTER_CLIENT: lambda f: sub_group(f.header_as(p.UnregisterClientRequestHeader).consumerGroup),
        RequestCode.CHECK_CLIENT_CONFIG: _check_config_needs,
        RequestCode.GET_CONSUMER_LIST_BY_GROUP: _group_needs,
        RequestCode.SPARKMQ_GROUP_INFO: _group_needs,
        RequestCode.QUERY_CONSUMER_OFFSET: _offset_needs,
        RequestCode.UPDATE_CONSUMER_OFFSET: lambda f: (
            sub_group((h := f.header_as(p.UpdateConsumerOffsetRequestHeader)).consumerGroup) + sub_topic(h.topic)),
        RequestCode.SPARKMQ_UPDATE_CONSUMER_OFFSETS: _offsets_needs,
        RequestCode.LOCK_BATCH_MQ: _lock_needs,
        RequestCode.UNLOCK_BATCH_MQ: _lock_needs,
        RequestCode.GET_CONSUMER_RUNNING_INFO: lambda f: [
            (Action.GET, Resource.group(f.header_as(p.ConsumerRunningInfoRequestHeader).consumerGroup))],
    }
    return handlers, needs

