"""Delay levels and timer messages on a real store: due times, progress, recall, restart."""
from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from procs import wait_until
from sparkmq.platform.broker.schedule import ScheduleService, parse_delay_levels
from sparkmq.platform.broker.timer import TimerService
from sparkmq.platform.common.errors import ErrorCode, SparkMQError
from sparkmq.platform.common.message import Message, StoredMessage
from sparkmq.platform.store import MessageStore
from sparkmq.platform.store.message_store import iter_all


def _now_ms() -> int:
    return int(time.time() * 1000)


def _redeliver(store: MessageStore, log: list[tuple[int, str]]) -> Callable[[Message, int, StoredMessage], None]:
    def deliver(message: Message, queue_id: int, parked: StoredMessage) -> None:
        result = store.put(message, queue_id, born_timestamp=parked.born_timestamp,
                           reconsume_times=parked.reconsume_times)
        log.append((_now_ms(), result.msg_id))
    return deliver


def _delivered(store: MessageStore, topic: str, queue_id: int = 0) -> list[StoredMessage]:
    return list(iter_all(store, topic, queue_id))


def test_parse_delay_levels() -> None:
    assert parse_delay_levels("1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h")[-1] == 7_200_000
    for bad in ("", "5", "0s", "1x", "-1s"):
        with pytest.raises(ValueError):
            parse_delay_levels(bad)


def test_delay_levels_deliver_no_earlier_than_due_and_keep_progress(store_factory, tmp_path: Path) -> None:
    store = store_factory()
    log: list[tuple[int, str]] = []
    progress = tmp_path / "delay.json"
    service = ScheduleService(store, parse_delay_levels("200ms 500ms"), progress, _redeliver(store, log))
    sent: dict[str, tuple[int, int]] = {}
    for i in range(10):
        level = 1 + i % 2
        msg = Message("Orders", b"m%d" % i, tags="T", keys=(f"k{i}",), properties={"n": str(i)})
        result = service.park(msg, 2, level)
        sent[result.msg_id] = (_now_ms(), service.level_delay_ms(level))
    assert _delivered(store, "Orders", 2) == []
    service.start()
    wait_until(lambda: len(log) == 10, 10, "10 redeliveries", interval=0.02)
    service.stop()
    for at, msg_id in log:
        parked_at, delay = sent[msg_id]
        assert at >= parked_at + delay - 5, "delivered before due"
    got = _delivered(store, "Orders", 2)
    assert sorted(m.msg_id for m in got) == sorted(sent)
    assert all(m.tags == "T" and m.properties["DELAY"] in ("1", "2") and "REAL_TOPIC" not in m.properties
               for m in got)
    assert {m.properties["n"] for m in got} == {str(i) for i in range(10)}
    assert service.offsets() == {1: 5, 2: 5}
    # A new service over the same progress file delivers nothing again.
    again = ScheduleService(store, parse_delay_levels("200ms 500ms"), progress, _redeliver(store, log))
    assert again.run_once(_now_ms() + 10_000) == -1 and len(log) == 10


def test_bad_delay_level_is_refused(store_factory, tmp_path: Path) -> None:
    store = store_factory()
    service = ScheduleService(store, parse_delay_levels("1s 2s"), tmp_path / "p.json", lambda *a: None)
    for bad in (0, 3, -1, True, "1"):
        with pytest.raises(SparkMQError) as err:
            service.park(Message("T", b"x"), 0, bad)  # type: ignore[arg-type]
        assert err.value.code is ErrorCode.INVALID_ARGUMENT
    assert store.commit_log.max_offset == 0


def test_timers_fire_in_due_order_no_earlier_and_recall_works(store_factory, tmp_path: Path) -> None:
    store = store_factory()
    log: list[tuple[int, str]] = []
    service = TimerService(store, tmp_path / "timer.json", _redeliver(store, log))
    base = _now_ms()
    due_of: dict[str, int] = {}
    for i, delay in enumerate([900, 300, 600, 300, 1200, 50]):
        result = service.park(Message("Reminders", b"r%d" % i), 0, base + delay)
        due_of[result.msg_id] = base + delay
    recalled = next(mid for mid, due in due_of.items() if due == base + 600)
    assert service.recall(recalled) is True
    assert service.recall(recalled) is False and service.recall("F" * 32) is False
    service.start()
    wait_until(lambda: len(log) == 5, 10, "5 redeliveries", interval=0.02)
    time.sleep(0.2)
    service.stop()
    assert recalled not in {mid for _, mid in log} and len(log) == 5
    for at, msg_id in log:
        assert at >= due_of[msg_id], "fired before due"
        assert at - due_of[msg_id] < 1500, "fired too late"
    assert [due_of[mid] for _, mid in log] == sorted(due_of[mid] for _, mid in log)
    assert service.watermark == 6 and service.pending_count() == 0


def test_pending_timers_survive_a_restart_and_recalls_stay_recalled(store_factory, tmp_path: Path) -> None:
    store = store_factory()
    progress = tmp_path / "timer.json"
    log: list[tuple[int, str]] = []
    first = TimerService(store, progress, _redeliver(store, log))
    base = _now_ms()
    ids = [first.park(Message("Later", b"x%d" % i), 0, base + 100 + 50 * i).msg_id for i in range(6)]
    first.run_once(base + 175)  # fires the first two (due +100 and +150)
    assert first.recall(ids[3])
    first.persist()  # then the process dies: no stop()
    assert len(log) == 2

    second = TimerService(store, progress, _redeliver(store, log))
    assert second.watermark == 2
    assert second.run_once(base + 10_000) == -1
    assert sorted(mid for _, mid in log) == sorted(ids[:3] + ids[4:])  # each once, the recalled never
    assert not second.recall(ids[3])


def test_timer_limits(store_factory, tmp_path: Path) -> None:
    store = store_factory()
    service = TimerService(store, tmp_path / "t.json", lambda *a: None, max_delay_s=60)
    now = _now_ms()
    assert service.due_time({}, now) is None
    assert service.due_time({"TIMER_DELAY_SEC": "5"}, now) == now + 5000
    assert service.due_time({"TIMER_DELIVER_MS": str(now + 1)}, now) == now + 1
    for props in ({"TIMER_DELAY_SEC": "61"}, {"TIMER_DELIVER_MS": "soon"}):
        with pytest.raises(SparkMQError) as err:
            service.due_time(props, now)
        assert err.value.code is ErrorCode.INVALID_ARGUMENT
