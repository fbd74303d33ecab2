"""Queries and trace over remoting: QUERY_MESSAGE (12, by key or, with ``_UNIQUE_KEY_QUERY=true``, by unique id),
VIEW_MESSAGE_BY_ID (33, by commit-log offset: what an offsetMsgId decodes to), and sparkmq's SPARKMQ_POST_TRACE
(30003).  Found messages travel as RocketMQ stored-message records (re-encoded by the native core).
"""
from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING

from ...platform.auth import CLUSTER, Action, Need, Resource
from ...platform.common import protocol as p
from ...platform.common.protocol import RequestCode, ResponseCode
from ...platform.remoting import Frame, Reply, ServerConnection
from ...platform.store.message_store import records_of
from ...storage_native import encode_rocketmq_records
from ._common import SIGNED, Handler, NeedsOf, json_body, reply, threaded

if TYPE_CHECKING:
    from . import BrokerRemoting

__all__ = ["family"]


class _Queries:
    def __init__(self, remoting: BrokerRemoting) -> None:
        self.broker = remoting.broker

    def query_message(self, conn: ServerConnection, frame: Frame) -> Awaitable[Reply]:
        """QUERY_MESSAGE through the lake's key index (a lake read: off the loop); QUERY_NOT_FOUND for no hit."""
        h = frame.header_as(p.QueryMessageRequestHeader)
        queries = self.broker.query_processor

        def query() -> Reply:
            found = queries.query_by_key(h.topic, h.key, unique=(h._UNIQUE_KEY_QUERY or "").lower() == "true",
                                         max_hits=h.maxNum, begin_ms=h.beginTimestamp, end_ms=h.endTimestamp)
            if not found:
                return reply(code=ResponseCode.QUERY_NOT_FOUND,
                             remark="can not find message, maybe time range not correct")
            header = p.QueryMessageResponseHeader(max(m.store_timestamp for m in found),
                                                  max(m.commitlog_offset for m in found))
            return reply(header, encode_rocketmq_records(records_of(found)))
        return threaded(query)

    def view_message(self, conn: ServerConnection, frame: Frame) -> Reply:
        """VIEW_MESSAGE_BY_ID: the message stored at commit-log ``offset`` here."""
        h = frame.header_as(p.ViewMessageRequestHeader)
        found = self.broker.query_processor.message_at(h.offset)
        return reply(body=encode_rocketmq_records(records_of([found])))

    def post_trace(self, conn: ServerConnection, frame: Frame) -> Reply:
        """SPARKMQ_POST_TRACE: a client's trace events for the broker's trace topic."""
        body = json_body(frame, p.PostTraceBody)
        answer = self.broker.query_processor.record_trace(body.events)
        return reply(p.PostTraceResponseHeader(answer["accepted"], answer["dropped"], answer["enabled"]))


def _view_needs(frame: Frame) -> list[Need]:
    topic = frame.header_as(p.ViewMessageRequestHeader).topic
    return [(Action.GET, Resource.topic(topic) if topic else CLUSTER)]


def family(remoting: BrokerRemoting) -> tuple[dict[int, Handler], dict[int, NeedsOf | str]]:
    """The query and trace handlers and what each needs with ACL on (Get on the topic; any user for trace)."""
    queries = _Queries(remoting)
    handlers: dict[int, Handler] = {
        RequestCode.QUERY_MESSAGE: queries.query_message,
        RequestCode.VIEW_MESSAGE_BY_ID: queries.view_message,
        RequestCode.SPARKMQ_POST_TRACE: queries.post_trace,
    }
    needs: dict[int, NeedsOf | str] = {
        RequestCode.QUERY_MESSAGE: lambda f: [
            (Action.GET, Resource.topic(f.header_as(p.QueryMessageRequestHeader).topic))],
        RequestCode.VIEW_MESSAGE_BY_ID: _view_needs,
        RequestCode.SPARKMQ_POST_TRACE: SIGNED,
    }
    return handlers, needs
