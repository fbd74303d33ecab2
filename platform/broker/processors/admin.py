"""Topics and admin: topic table changes and stats, dead letters and re-drive, broker info."""
from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from typing import Any

from ...common.errors import ErrorCode, SparkMQError
from ...common.message import (
    StoredMessage,
)
from ...common.protocol import MAX_PULL_BATCH, PullResult, PullStatus
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
)
from ...common.validation import validate_group
from ...store.message_store import iter_all
from ..topics import TopicConfig
from .base import Processor, check_int
from .send import OutgoingMessage

__all__ = ["AdminProcessor"]

log = logging.getLogger("sparkmq.broker")

#: Properties a DLQ message carries that a redriven copy must not.
_DLQ_PROPERTIES = (PROPERTY_DLQ_ORIGIN_TOPIC, PROPERTY_DLQ_REASON, PROPERTY_RETRY_TOPIC, PROPERTY_ORIGIN_MSG_ID,
                   PROPERTY_REAL_TOPIC, PROPERTY_REAL_QUEUE_ID, PROPERTY_DELAY_LEVEL)


class AdminProcessor(Processor):
    """Topics and admin: topic table changes and stats, dead letters and re-drive, broker info."""

    def dlq_messages(self, group: str, offset: int = 0, max_count: int = 32) -> PullResult:
        """Messages of ``%DLQ%<group>`` from ``offset`` (NO_MATCHED_QUEUE with none when nothing was dead-lettered)."""
        validate_group(group)
        topic = dlq_topic(group)
        if self.topics.get(topic) is None:
            check_int("offset", offset, 0, 2**63 - 1, ErrorCode.OFFSET_ILLEGAL)
            check_int("max", max_count, 1, MAX_PULL_BATCH)
            return PullResult(PullStatus.NO_MATCHED_QUEUE, 0, 0, 0)
        return self.broker.pull_processor.pull_once(topic, 0, offset, max_count)

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
        results = []
        for m in chosen.values():
            props = {k: v for k, v in m.properties.items() if k not in _DLQ_PROPERTIES}
            origin = m.properties.get(PROPERTY_DLQ_ORIGIN_TOPIC, m.topic)
            props.pop("TAGS", None)
            props.pop("KEYS", None)
            msg_id = props.pop("UNIQ_KEY", None) or None
            outgoing = OutgoingMessage(m.body, m.tags, m.keys, props, msg_id)
            results.append(self.broker.send_processor.send(origin, outgoing, compressed=bool(m.sys_flag & COMPRESSED),
                                     born_timestamp=m.born_timestamp).to_dict())
        found = {m.msg_id for m in chosen.values()} | {m.offset_msg_id for m in chosen.values()}
        return {"redriven": len(results), "results": results,
                "not_found": sorted(i for i in wanted if i not in found)}


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
        self.broker.send_processor.forget_topic(topic)
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


    def info(self) -> dict[str, Any]:
        """What ``GET /broker`` answers."""
        commitlog: dict[str, int | None] = {"min_offset": None, "max_offset": None, "flushed_offset": None}
        with contextlib.suppress(SparkMQError):
            bounds = self.store.log_offsets()
            commitlog = {"min_offset": bounds.min_offset, "max_offset": bounds.max_offset,
                         "flushed_offset": bounds.flushed_offset}
        return {"cluster": self.config.cluster, "broker_name": self.name, "broker_id": self.config.broker_id,
                "addr": self.broker.addr, "remoting_addr": self.broker.remoting_addr, "role": str(self.config.role),
                "namesrv_addrs": list(self.config.namesrv_addrs),
                "ha_addr": self.broker.ha_addr, "replication": self.broker.replication_status(),
                "commitlog": commitlog, "topics": len(self.topics), "clients": self.clients.client_count()}


