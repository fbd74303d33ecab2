"""Topics and admin: topic table changes and stats, dead letters and re-drive, broker info."""
from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from ...common.errors import ErrorCode, SparkMQError
from ...common.message import (
    SendResult,
    StoredMessage,
)
from ...common.protocol import MAX_MSG_ID_LENGTH, MAX_PULL_BATCH, PullResult, PullStatus, ReportSeries
from ...common.sysflag import COMPRESSED
from ...common.system_topics import (
    PROPERTY_DELAY_LEVEL,
    PROPERTY_DLQ_ORIGIN_TOPIC,
    PROPERTY_DLQ_REASON,
    PROPERTY_ORIGIN_MSG_ID,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_RETRY_TOPIC,
    dlq_topic,
    is_system_topic,
    retry_topic,
)
from ...common.validation import check_int, validate_group
from ...store import MessageStore
from ...store.message_store import iter_all
from ..client_manager import ClientManager, MessageModel
from ..config import BrokerConfig
from ..offsets import ConsumerOffsetManager
from ..topics import TopicConfig, TopicConfigManager
from .base import BrokerState, Processor
from .pull import PullProcessor
from .query import QueryProcessor
from .send import OutgoingMessage, SendProcessor

__all__ = ["AdminProcessor", "BrokerInfo"]

log = logging.getLogger("sparkmq.broker")

#: Properties a DLQ message carries that a redriven copy must not.
_DLQ_PROPERTIES = (PROPERTY_DLQ_ORIGIN_TOPIC, PROPERTY_DLQ_REASON, PROPERTY_RETRY_TOPIC, PROPERTY_ORIGIN_MSG_ID,
                   PROPERTY_REAL_TOPIC, PROPERTY_REAL_QUEUE_ID, PROPERTY_DELAY_LEVEL)


def _origin_topic(m: StoredMessage) -> str:
    """The topic ``m`` was first sent to: a dead letter's, a retry's or a parked message's own topic."""
    props = m.properties
    return props.get(PROPERTY_DLQ_ORIGIN_TOPIC) or props.get(PROPERTY_RETRY_TOPIC) \
        or props.get(PROPERTY_REAL_TOPIC) or m.topic


class BrokerInfo(Protocol):
    """The broker's addresses and replication state, as ``GET /broker`` shows them (``Broker`` is one)."""

    @property
    def addr(self) -> str:
        """The address clients and name servers are told."""
        ...

    @property
    def remoting_addr(self) -> str | None:
        """The remoting endpoint, once it listens."""
        ...

    @property
    def ha_addr(self) -> str | None:
        """A master's HA endpoint, once it listens."""
        ...

    def replication_status(self) -> dict[str, Any] | None:
        """The replication state (master: its slaves; slave: its master), None when neither runs."""
        ...


class AdminProcessor(Processor):
    """Topics and admin: topic table changes and stats, dead letters and re-drive, broker info."""

    def __init__(self, state: BrokerState, info: BrokerInfo, config: BrokerConfig, store: MessageStore,
                 topics: TopicConfigManager, offsets: ConsumerOffsetManager, clients: ClientManager,
                 sender: SendProcessor, puller: PullProcessor, query: QueryProcessor) -> None:
        super().__init__(state)
        self.broker_info = info
        self.config = config
        self.store = store
        self.topics = topics
        self.offsets = offsets
        self.clients = clients
        #: Re-drive and re-send store copies as sends; dead letters are read as pulls, messages found as queries.
        self.sender = sender
        self.puller = puller
        self.queries = query
        self._alert_rules: list[dict[str, Any]] = []
        self._alert_rules_error: str | None = None

    def dlq_messages(self, group: str, offset: int = 0, max_count: int = 32) -> PullResult:
        """Messages of ``%DLQ%<group>`` from ``offset`` (NO_MATCHED_QUEUE with none when nothing was dead-lettered)."""
        validate_group(group)
        topic = dlq_topic(group)
        if self.topics.get(topic) is None:
            check_int("offset", offset, 0, 2**63 - 1, ErrorCode.OFFSET_ILLEGAL)
            check_int("max", max_count, 1, MAX_PULL_BATCH)
            return PullResult(PullStatus.NO_MATCHED_QUEUE, 0, 0, 0)
        return self.puller.pull_once(topic, 0, offset, max_count)

    def redrive(self, group: str, msg_ids: Sequence[str] = (), *, all_messages: bool = False,
                topic: str | None = None, tags: str | None = None) -> dict[str, Any]:
        """Send DLQ messages back to their original topics (the DLQ keeps its copies: it is a log).

        Either ``msg_ids`` (msgIds or offsetMsgIds of DLQ messages) or ``all_messages``
        (optionally only those first sent to ``topic`` / with tag ``tags``).  Each copy
        gets reconsume count 0 and loses the DLQ properties.
        """
        validate_group(group)
        if isinstance(msg_ids, str) or not all(isinstance(i, str) for i in msg_ids):
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, "msg_ids must be a list of strings")
        if bool(msg_ids) == bool(all_messages):
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, "give either msg_ids or all=true")
        dlq = dlq_topic(group)
        chosen: dict[str, StoredMessage] = {}
        wanted = set(msg_ids)
        if self.topics.get(dlq) is not None:
            with self._operation():
                for m in iter_all(self.store, dlq, 0):
                    origin = m.properties.get(PROPERTY_DLQ_ORIGIN_TOPIC, m.topic)
                    if all_messages:
                        pick = (topic is None or origin == topic) and (tags is None or m.tags == tags)
                    else:
                        pick = m.msg_id in wanted or m.offset_msg_id in wanted
                    if pick:
                        chosen[m.msg_id or m.offset_msg_id] = m  # one copy per message: the latest dead letter
        results = [self._store_copy(_origin_topic(m), m).to_dict() for m in chosen.values()]
        found = {m.msg_id for m in chosen.values()} | {m.offset_msg_id for m in chosen.values()}
        return {"redriven": len(results), "results": results,
                "not_found": sorted(i for i in wanted if i not in found)}

    def _store_copy(self, topic: str, m: StoredMessage, extra: dict[str, str] | None = None,
                    queue_id: int | None = None) -> SendResult:
        """Send a fresh copy of ``m`` to ``topic``: same body, tags, keys and unique id, reconsume count 0, none of
        the retry / DLQ / parking properties (plus ``extra``).  What re-drive and re-send store."""
        props = {k: v for k, v in m.properties.items() if k not in _DLQ_PROPERTIES}
        props.pop("TAGS", None)
        props.pop("KEYS", None)
        msg_id = props.pop("UNIQ_KEY", None) or None
        outgoing = OutgoingMessage(m.body, m.tags, m.keys, {**props, **(extra or {})}, msg_id)
        return self.sender.send(topic, outgoing, queue_id=queue_id,
                                compressed=bool(m.sys_flag & COMPRESSED),
                                born_timestamp=m.born_timestamp)

    def resend(self, msg_id: str, group: str) -> dict[str, Any]:
        """Store a copy of one message in ``%RETRY%<group>``, so that group, and only it, consumes it again
        (RocketMQ dashboard's re-send; the copy has reconsume count 0 and the message's own topic in
        ``RETRY_TOPIC``, so consumers see it as it was sent).

        ``msg_id`` is an offsetMsgId of this broker, or a msgId (UNIQ_KEY) found through the lake's index
        (the original, not a retry or DLQ copy, when there are several).  Errors, nothing stored:
        MESSAGE_ID_ILLEGAL (malformed id), MESSAGE_NOT_FOUND (not here), GROUP_ILLEGAL, GROUP_NOT_EXIST (the
        group has no members and no committed offsets here), INVALID_ARGUMENT (a broadcasting group: it has no
        retry topic).  Answers ``{"group", "msg_id", "origin_topic", "result": send result}``.
        """
        if not isinstance(msg_id, str) or not 0 < len(msg_id) <= MAX_MSG_ID_LENGTH or not msg_id.isprintable() \
                or " " in msg_id:
            raise SparkMQError(ErrorCode.MESSAGE_ID_ILLEGAL,
                               f"a message id is 1..{MAX_MSG_ID_LENGTH} printable characters, got {msg_id!r}")
        validate_group(group)
        with self._operation():
            message = self._find_message(msg_id)
        clients = self.clients
        if not clients.members(group) and not self.offsets.topics_of(group):
            raise SparkMQError(ErrorCode.GROUP_NOT_EXIST, f"consumer group {group!r} is not known on {self.name}")
        if clients.group_info(group).message_model is MessageModel.BROADCASTING and clients.members(group):
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT,
                               f"group {group!r} consumes by broadcasting: it has no retry topic to re-send to")
        origin = _origin_topic(message)
        target = retry_topic(group)
        self.topics.ensure_system_topic(target, 1)
        result = self._store_copy(target, message, {PROPERTY_RETRY_TOPIC: origin}, queue_id=0)
        log.info("re-sent %s (%s) to group %s", msg_id, origin, group)
        return {"group": group, "msg_id": message.msg_id, "origin_topic": origin, "result": result.to_dict()}

    def _find_message(self, msg_id: str) -> StoredMessage:
        """The message an offsetMsgId of this store names, else the original with that msgId in the lake's index."""
        try:
            return self.store.read_by_offset_msg_id(msg_id)
        except SparkMQError as exc:
            if exc.code not in (ErrorCode.MESSAGE_ID_ILLEGAL, ErrorCode.MESSAGE_NOT_FOUND):
                raise
        try:
            found = self.queries.query_messages(msg_id=msg_id, max_hits=16)
        except SparkMQError as err:
            if err.code is not ErrorCode.LAKE_NOT_AVAILABLE:
                raise
            raise SparkMQError(ErrorCode.MESSAGE_NOT_FOUND, f"{msg_id} is no offsetMsgId of {self.name}, and "
                                                            "without the lake's index a msgId cannot be looked up"
                               ) from None
        if not found:
            raise SparkMQError(ErrorCode.MESSAGE_NOT_FOUND, f"no message with id {msg_id} on {self.name}")
        # Retries, dead letters and re-drives keep the unique id: the copy is made of the first one sent.
        return min(found, key=lambda m: (is_system_topic(m.topic), m.store_timestamp))


    def create_or_update_topic(self, topic: str, read_queue_nums: int = 16, write_queue_nums: int = 16,
                               perm: int = 6, order: bool = False, topic_sys_flag: int = 0) -> TopicConfig:
        """Create or update an ordinary topic (NO_PERMISSION for system topics); registration follows at once."""
        return self.topics.create_or_update(topic, read_queue_nums, write_queue_nums, perm, order, topic_sys_flag)

    def delete_topic(self, topic: str) -> bool:
        """Delete a topic's config and every group's offsets of it; False when it did not exist.

        Its stored messages stay in the commit log until retention removes them.
        """
        deleted = self.topics.delete(topic)
        self.offsets.remove_topic(topic)
        self.sender.forget_topic(topic)
        return deleted

    def get_topic(self, topic: str) -> TopicConfig:
        """One topic's config (TOPIC_NOT_EXIST)."""
        return self.topics.require(topic)

    def list_topics(self) -> list[TopicConfig]:
        """Every topic, sorted."""
        return self.topics.list()

    def topic_stats(self, topic: str) -> dict[str, Any]:
        """Min/max offset and last store time of each of the topic's queues."""
        cfg = self.topics.require(topic)
        store = self.store
        queues = [{"queue_id": queue_id, "min_offset": store.min_offset(topic, queue_id),
                   "max_offset": store.max_offset(topic, queue_id),
                   "last_store_timestamp": store.last_store_timestamp(topic, queue_id)}
                  for queue_id in range(cfg.queue_count)]
        return {"topic": topic, "queues": queues}


    # ================================================================== the lake's reports and alert rules
    def report_series(self, kind: str, name: str, range_name: str) -> ReportSeries:
        """This broker's ``topic_stats`` (``kind`` "topic") or ``group_stats`` ("group") rows of ``name`` over the
        last ``range_name`` ("1h", "6h", "24h", "7d"), bucketed (see ``pipelines.reports.read_report_series``).

        No points before the lake wrote a report; INVALID_ARGUMENT for an unknown kind or range.
        """
        from ....pipelines.reports import read_report_series  # delta-rs only: brokers without a lake never load it

        return read_report_series(self.config.data_dir / "lake", kind, name, range_name, broker=self.name)

    def set_alert_rules(self, rules: Iterable[Mapping[str, Any]], error: str | None = None) -> None:
        """The alert rules this broker's lake evaluates (name, kind, threshold, for_minutes, severity, filters), as
        configured; ``error`` when the ``[alerts]`` table did not parse (the lake then evaluates none)."""
        self._alert_rules = [dict(r) for r in rules]
        self._alert_rules_error = error

    def alert_rules(self) -> dict[str, Any]:
        """``{"rules": [...], "error"}``: what :meth:`set_alert_rules` was given (no rules without a lake)."""
        return {"rules": [dict(r) for r in self._alert_rules], "error": self._alert_rules_error}

    def info(self) -> dict[str, Any]:
        """What ``GET /broker`` answers."""
        commitlog: dict[str, int | None] = {"min_offset": None, "max_offset": None, "flushed_offset": None}
        with contextlib.suppress(SparkMQError):
            bounds = self.store.log_offsets()
            commitlog = {"min_offset": bounds.min_offset, "max_offset": bounds.max_offset,
                         "flushed_offset": bounds.flushed_offset}
        broker = self.broker_info
        return {"cluster": self.config.cluster, "broker_name": self.name, "broker_id": self.config.broker_id,
                "addr": broker.addr, "remoting_addr": broker.remoting_addr, "role": str(self.config.role),
                "namesrv_addrs": list(self.config.namesrv_addrs),
                "ha_addr": broker.ha_addr, "replication": broker.replication_status(),
                "commitlog": commitlog, "topics": len(self.topics), "clients": self.clients.client_count()}


