"""Message query over the index tables with delta-rs (the broker, no Spark) over tables delta-spark wrote: by key,
by unique id, by time range."""
from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from lake_rows import append_rows
from sparkmq.pipelines import tables
from sparkmq.platform.broker.lake_index import LakeIndex
from sparkmq.platform.common.errors import ErrorCode, SparkMQError

pytestmark = pytest.mark.spark

BASE_MS = 1_800_000_000_000


def _rows(topic: str, offset: int, msg_id: str, keys: list[str], store_ms: int) -> list[dict]:
    where = {"topic": topic, "broker": "broker-a", "queue_id": offset % 2, "queue_offset": offset,
             "commitlog_offset": 1000 * offset, "store_ts": dt.datetime.fromtimestamp(store_ms / 1000, dt.UTC)}
    return [{"key": msg_id, "key_type": "msg_id", **where}] + [{"key": k, "key_type": "key", **where} for k in keys]


@pytest.fixture
def index(spark, tmp_path: Path) -> LakeIndex:
    rows = []
    for i in range(10):
        rows += _rows("Orders", i, f"ID{i}", [f"order-{i % 3}", "all"], BASE_MS + 1000 * i)
    rows += _rows("Pay", 0, "PAY0", ["order-0"], BASE_MS)
    append_rows(spark, tmp_path, tables.MESSAGE_KEYS, rows[:15], 0)  # two commits, as the dispatch job makes them
    append_rows(spark, tmp_path, tables.MESSAGE_KEYS, rows[15:], 1)
    return LakeIndex(tmp_path)


def test_by_key_newest_first_within_the_topic(index: LakeIndex) -> None:
    hits = index.by_key("Orders", "order-0")
    assert [h.queue_offset for h in hits] == [9, 6, 3, 0]
    assert hits[0].store_timestamp == BASE_MS + 9000 and hits[0].commitlog_offset == 9000
    assert [h.topic for h in index.by_key("Pay", "order-0")] == ["Pay"]
    assert len(index.by_key("Orders", "all", max_hits=4)) == 4
    assert index.by_key("Orders", "ID3") == []  # a unique id is not a key


def test_by_msg_id_and_by_time(index: LakeIndex) -> None:
    [hit] = index.by_msg_id("ID7")
    assert (hit.topic, hit.queue_id, hit.queue_offset) == ("Orders", 1, 7)
    assert index.by_msg_id("nope") == []
    window = index.by_time("Orders", BASE_MS + 2000, BASE_MS + 5000)
    assert [h.queue_offset for h in window] == [4, 3, 2]


def test_nothing_indexed_yet_and_bad_input(tmp_path: Path, index: LakeIndex) -> None:
    with pytest.raises(SparkMQError) as missing:  # no index yet: a stable error, not an empty success
        LakeIndex(tmp_path / "empty").by_key("Orders", "x")
    assert missing.value.code is ErrorCode.LAKE_NOT_AVAILABLE
    for call, code in [(lambda: index.by_key("bad topic", "k"), ErrorCode.TOPIC_ILLEGAL),
                       (lambda: index.by_key("Orders", ""), ErrorCode.INVALID_ARGUMENT),
                       (lambda: index.by_key("Orders", "k", max_hits=65), ErrorCode.INVALID_ARGUMENT),
                       (lambda: index.by_time("Orders", 10, 5), ErrorCode.INVALID_ARGUMENT),
                       (lambda: index.by_msg_id(""), ErrorCode.MESSAGE_ID_ILLEGAL)]:
        with pytest.raises(SparkMQError) as err:
            call()
        assert err.value.code is code
