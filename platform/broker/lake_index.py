"""Message query over the lake's index tables, with delta-rs (no Spark on the broker's request path).

The dispatch job keeps ``message_keys`` (every unique id and every key → topic, broker,
queue, offsets, store time) and ``messages`` (the full message).  This module answers
RocketMQ's three queries from them:

* by key: ``topic`` + one of the message's KEYS (at most ``max_hits``, newest first);
* by unique message id (the producer's msgId);
* by ``topic`` and a store-time range.

Each answer is a list of :class:`Location`; the broker then reads the message from its
commit log, or, when retention already removed it, from the ``messages`` table.  Column
names are those of ``pipelines/tables.py`` (the one place the schemas are defined).
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from ..common.errors import ErrorCode, SparkMQError
from ..common.message import StoredMessage
from ..common.validation import MAX_QUERY_HITS, EpochMs, check, check_int, validate_topic

__all__ = ["Location", "LakeIndex", "DEFAULT_MAX_HITS", "MAX_HITS", "lake_row_to_stored"]

#: RocketMQ answers at most 64 hits per query, 32 by default.
DEFAULT_MAX_HITS = 32
MAX_HITS = MAX_QUERY_HITS

_LOCATION_COLUMNS = ["topic", "broker", "queue_id", "queue_offset", "commitlog_offset", "store_ts"]


@dataclass(frozen=True, slots=True)
class Location:
    """Where a message is: its queue position, commit-log offset and store time (epoch ms)."""

    topic: str
    broker: str
    queue_id: int
    queue_offset: int
    commitlog_offset: int
    store_timestamp: int

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {"topic": self.topic, "broker": self.broker, "queue_id": self.queue_id,
                "queue_offset": self.queue_offset, "commitlog_offset": self.commitlog_offset,
                "store_timestamp": self.store_timestamp}


def _ms(value: dt.datetime | None) -> int:
    return 0 if value is None else int(value.timestamp() * 1000)


def lake_row_to_stored(row: dict[str, Any]) -> StoredMessage:
    """A row of ``messages`` as the store's message (so pulls and queries answer one shape)."""
    return StoredMessage(
        topic=row["topic"], queue_id=row["queue_id"], queue_offset=row["queue_offset"],
        commitlog_offset=row["commitlog_offset"], store_size=row["size"], body=row["body"],
        properties=dict(row.get("properties") or ()), flag=0, sys_flag=row["sys_flag"],
        born_timestamp=_ms(row["born_ts"]), born_host=row["born_host"], store_timestamp=_ms(row["store_ts"]),
        store_host=row["store_host"], reconsume_times=row["reconsume_times"], prepared_offset=0, tag_hash=0,
        body_crc=0)


def _check_hits(max_hits: object) -> int:
    return check_int("max_hits", max_hits, 1, MAX_HITS)


def _ts(ms: int) -> pa.Scalar:
    return pa.scalar(dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC), type=pa.timestamp("us", tz="UTC"))


class LakeIndex:
    """Queries over ``<lake_root>/message_keys`` and ``<lake_root>/messages``."""

    def __init__(self, lake_root: str | Path) -> None:
        self.lake_root = Path(lake_root)

    def _dataset(self, table: str) -> ds.Dataset | None:
        try:
            return DeltaTable(str(self.lake_root / table)).to_pyarrow_dataset()
        except TableNotFoundError:
            return None  # the dispatch job has not run yet: nothing indexed

    def _index(self) -> ds.Dataset:
        """The key index (``message_keys``); LAKE_NOT_AVAILABLE when this broker's lake has not written it."""
        dataset = self._dataset("message_keys")
        if dataset is None:
            # Never an empty answer for a key that may well exist: say where the index lives.
            raise SparkMQError(ErrorCode.LAKE_NOT_AVAILABLE,
                               f"the key index is the lake's message_keys table ({self.lake_root}), which this "
                               "broker's lake has not written: run the broker with its lake (--lake) or "
                               "`sparkmq lake` for the cluster, and query once its dispatch job ran")
        return dataset

    def _locations(self, table: pa.Table, max_hits: int) -> list[Location]:
        if table.num_rows == 0:
            return []
        table = table.sort_by([("store_ts", "descending"), ("queue_offset", "descending")]).slice(0, max_hits)
        store_ms = pc.cast(pc.divide(pc.cast(table["store_ts"], pa.int64()), 1000), pa.int64()).to_pylist()
        rows = table.select(_LOCATION_COLUMNS[:-1]).to_pylist()
        return [Location(r["topic"], r["broker"], r["queue_id"], r["queue_offset"], r["commitlog_offset"], ms)
                for r, ms in zip(rows, store_ms, strict=True)]

    def by_key(self, topic: str, key: str, max_hits: int = DEFAULT_MAX_HITS) -> list[Location]:
        """Messages of ``topic`` carrying ``key`` among their KEYS, newest first."""
        validate_topic(topic)
        if not isinstance(key, str) or not key:
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, "the key must be a non-empty string")
        dataset = self._index()
        found = dataset.to_table(columns=_LOCATION_COLUMNS, filter=(ds.field("key") == key)
                                 & (ds.field("key_type") == "key") & (ds.field("topic") == topic))
        return self._locations(found, _check_hits(max_hits))

    def by_msg_id(self, msg_id: str, max_hits: int = DEFAULT_MAX_HITS) -> list[Location]:
        """Where the message with this unique id was stored (a redriven or retried copy adds a row)."""
        if not isinstance(msg_id, str) or not msg_id:
            raise SparkMQError(ErrorCode.MESSAGE_ID_ILLEGAL, "the message id must be a non-empty string")
        dataset = self._index()
        found = dataset.to_table(columns=_LOCATION_COLUMNS,
                                 filter=(ds.field("key") == msg_id) & (ds.field("key_type") == "msg_id"))
        return self._locations(found, _check_hits(max_hits))

    def by_time(self, topic: str, begin_ms: int, end_ms: int, max_hits: int = DEFAULT_MAX_HITS) -> list[Location]:
        """Messages of ``topic`` stored in [begin_ms, end_ms), newest first."""
        validate_topic(topic)
        for name, value in (("begin", begin_ms), ("end", end_ms)):
            check(name, value, EpochMs)
        if end_ms <= begin_ms:
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, f"end ({end_ms}) must be after begin ({begin_ms})")
        dataset = self._index()
        found = dataset.to_table(columns=_LOCATION_COLUMNS, filter=(ds.field("key_type") == "msg_id")
                                 & (ds.field("topic") == topic) & (ds.field("store_ts") >= _ts(begin_ms))
                                 & (ds.field("store_ts") < _ts(end_ms)))
        return self._locations(found, _check_hits(max_hits))

    def messages_range(self, topic: str, broker: str, queue_id: int, offset: int,
                       max_count: int) -> list[StoredMessage]:
        """Messages of one queue from ``offset`` (at most ``max_count``, in offset order) out of ``messages``.

        The lake tier: what a pull below the log's retention is served from.
        """
        dataset = self._dataset("messages")
        if dataset is None:
            return []
        found = dataset.to_table(filter=(ds.field("topic") == topic) & (ds.field("broker") == broker)
                                 & (ds.field("queue_id") == queue_id) & (ds.field("queue_offset") >= offset)
                                 & (ds.field("queue_offset") < offset + max_count))
        rows = sorted(found.to_pylist(), key=lambda r: r["queue_offset"])
        # A replayed dispatch never duplicates, but keep each offset once even if a table was rebuilt.
        unique = {r["queue_offset"]: r for r in rows}
        return [lake_row_to_stored(r) for r in unique.values()]

    def stored_message(self, location: Location) -> dict[str, Any] | None:
        """The full row of ``messages`` for a location (the lake tier), or None when not dispatched."""
        dataset = self._dataset("messages")
        if dataset is None:
            return None
        found = dataset.to_table(filter=(ds.field("topic") == location.topic)
                                 & (ds.field("broker") == location.broker)
                                 & (ds.field("queue_id") == location.queue_id)
                                 & (ds.field("queue_offset") == location.queue_offset))
        rows = found.to_pylist()
        return rows[0] if rows else None
