"""Every loop that retries pauses as it always did, now through platform/common/backoff.py.

In-process, without sockets, brokers or Spark: each loop's I/O is a fake that fails as scripted, and its
pauses are recorded instead of slept.
"""
from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from deltalake.exceptions import CommitFailedError
from deltalake.table import TableMerger

from sparkmq.pipelines import tables
from sparkmq.pipelines.errors import LakeError
from sparkmq.pipelines.supervisor import JobSpec, Supervisor
from sparkmq.platform.broker.offsets import ConsumerOffsetManager
from sparkmq.platform.client import consumer_base
from sparkmq.platform.client.allocation import MessageQueue
from sparkmq.platform.client.config import ClientConfig
from sparkmq.platform.client.fault import LatencyFaultTolerance, QueueSelector
from sparkmq.platform.client.pull_consumer import PullConsumer
from sparkmq.platform.client.routes import TopicRouteInfo
from sparkmq.platform.client.send_retry import Attempt, Failover, RetryPolicy
from sparkmq.platform.client.transaction_producer import TransactionProducer
from sparkmq.platform.common.errors import ErrorCode, SparkMQError
from sparkmq.platform.ha.protocol import HandshakeStatus
from sparkmq.platform.ha.slave import HandshakeRefused, ReplicationSlave

NS = "127.0.0.1:9"  # never asked: nothing here starts a client


class Done(BaseException):
    """Ends a loop that otherwise runs for good (not an Exception: no retry loop catches it)."""


class StopAfter:
    """A ``threading.Event`` stand-in whose ``wait`` records the pause and sets itself after ``n`` of them."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.waits: list[float] = []
        self._set = False

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        self._set = True

    def wait(self, timeout: float | None = None) -> bool:
        assert timeout is not None
        self.waits.append(timeout)
        if len(self.waits) >= self.n:
            self._set = True
        return self._set


# -- platform/ha/slave.py: ReplicationSlave._run ---------------------------------------------------------------

def test_ha_slave_reconnects_after_pauses_doubling_from_0_2_to_5_s() -> None:
    outcomes: list[BaseException | None] = [OSError("refused"), SparkMQError(ErrorCode.INTERNAL_ERROR, "bad frame"),
                                            OSError(), HandshakeRefused(HandshakeStatus.SLAVE_AHEAD, 0), OSError(),
                                            None, OSError(), OSError(), OSError(), OSError(), OSError(), OSError()]
    slave = ReplicationSlave(None, "broker-a", 1, lambda: "127.0.0.1:1")  # type: ignore[arg-type]  # no store used
    stop = slave._stop = StopAfter(len(outcomes))  # type: ignore[assignment]

    def session(addr: str) -> None:
        outcome = outcomes.pop(0)
        if outcome is not None:
            raise outcome
    slave._session = session  # type: ignore[method-assign]
    slave._run()
    # A refused handshake holds the pause at 5 s until a session ends cleanly; then it starts over at 0.2 s.
    assert stop.waits == pytest.approx([0.2, 0.4, 0.8, 5.0, 5.0, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0])
    assert slave.last_error == "OSError: "


def test_ha_slave_waits_1_s_for_an_unregistered_master_without_growing() -> None:
    addrs: list[str | None] = [None, None, "127.0.0.1:1"]
    slave = ReplicationSlave(None, "broker-a", 1, lambda: addrs.pop(0))  # type: ignore[arg-type]
    stop = slave._stop = StopAfter(3)  # type: ignore[assignment]

    def session(addr: str) -> None:
        raise OSError("down")
    slave._session = session  # type: ignore[method-assign]
    slave._run()
    assert stop.waits == pytest.approx([1.0, 1.0, 0.2])


# -- platform/client/transaction_producer.py: TransactionProducer._poll_checks ----------------------------------

class ScriptedBroker:
    """``transaction_checks`` raises or answers as scripted."""

    def __init__(self, script: list[Any]) -> None:
        self.script = script

    def transaction_checks(self, group: str, client_id: str, wait_ms: int) -> list[dict[str, Any]]:
        outcome = self.script.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome


def test_check_back_poller_pauses_0_2_doubling_to_5_s_after_failed_polls() -> None:
    busy = SparkMQError(ErrorCode.SERVICE_NOT_AVAILABLE, "down")
    script: list[Any] = [busy] * 7 + [[]] + [busy] * 2 + [Done()]
    producer = TransactionProducer("pg-backoff", ClientConfig(namesrv_addrs=NS))
    try:
        broker = ScriptedBroker(script)
        producer._brokers.get = lambda addr: broker  # type: ignore[method-assign,assignment,return-value]
        stop = producer._stop = StopAfter(100)  # type: ignore[assignment]
        with pytest.raises(Done):
            producer._poll_checks("127.0.0.1:1")
    finally:
        producer._brokers.close()
    assert stop.waits == pytest.approx([0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0, 0.2, 0.4])


def test_check_back_poller_stops_without_pausing_once_stopped() -> None:
    producer = TransactionProducer("pg-backoff", ClientConfig(namesrv_addrs=NS))
    try:
        stop = producer._stop = StopAfter(100)  # type: ignore[assignment]

        class Stopping:
            def transaction_checks(self, *args: object) -> list[dict[str, Any]]:
                stop.set()
                raise SparkMQError(ErrorCode.SERVICE_NOT_AVAILABLE, "shutting down")
        producer._brokers.get = lambda addr: Stopping()  # type: ignore[method-assign,assignment,return-value]
        producer._poll_checks("127.0.0.1:1")
    finally:
        producer._brokers.close()
    assert stop.waits == []


# -- platform/client/consumer_base.py: ConsumerBase._watch_changes ----------------------------------------------

class ScriptedChanges:
    def __init__(self, script: list[Any]) -> None:
        self.script = script

    async def group_changes(self, addr: str, group: str, version: int, wait_ms: int, timeout: float) -> dict[str, Any]:
        outcome = self.script.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome


@pytest.mark.parametrize(("pause_s", "expected"), [
    (1.0, [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 1.0, 2.0]),
    (0.5, [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 0.5, 1.0]),
    (45.0, [45.0] * 9),  # a configured pause longer than the cap is kept (the hand-written loop fell to 30 s)
])
def test_membership_watch_pauses_from_pull_error_backoff_doubling_to_30_s(
        monkeypatch: pytest.MonkeyPatch, pause_s: float, expected: list[float]) -> None:
    down = SparkMQError(ErrorCode.SERVICE_NOT_AVAILABLE, "down")
    consumer = PullConsumer("cg-backoff", ClientConfig(namesrv_addrs=NS, pull_error_backoff_s=pause_s))
    consumer._async = ScriptedChanges([down] * 7 + [{"version": 3}] + [down] * 2 + [Done()])  # type: ignore[assignment]
    slept: list[float] = []

    async def sleep(delay: float) -> None:
        slept.append(delay)
    monkeypatch.setattr(consumer_base.asyncio, "sleep", sleep)
    try:
        with pytest.raises(Done):
            asyncio.run(consumer._watch_changes("127.0.0.1:1"))
    finally:
        consumer._brokers.close()
    assert slept == pytest.approx(expected)


# -- platform/client/send_retry.py: SendAttempts.failed on SYSTEM_BUSY ------------------------------------------

def _attempts(budget_s: float) -> tuple[Any, Attempt]:
    route = TopicRouteInfo.from_dict("t", {
        "queue_datas": [{"broker_name": "b", "read_queue_nums": 1, "write_queue_nums": 1, "perm": 6}],
        "broker_datas": [{"broker_name": "b", "broker_addrs": {"0": "h:1"}}]})
    fault = LatencyFaultTolerance()
    attempts = RetryPolicy(ClientConfig(namesrv_addrs=NS), QueueSelector(fault), fault).begin("t", budget_s, None)
    return attempts, Attempt(MessageQueue("t", "b", 0), "h:1", budget_s, route)


def test_busy_answers_back_off_from_50_ms_doubling_to_1_s_with_jitter() -> None:
    attempts, step = _attempts(1000.0)
    busy = SparkMQError(ErrorCode.SYSTEM_BUSY, "busy")
    for n in range(8):
        before = time.monotonic()
        failover = attempts.failed(step, busy)
        after = time.monotonic()
        assert isinstance(failover, Failover) and not failover.refresh
        base = min(0.05 * 2 ** n, 1.0)
        assert before + base / 2 <= failover.pause_until <= after + base, n
    assert attempts.busy_answers == 8


def test_a_busy_back_off_never_passes_the_send_budget() -> None:
    attempts, step = _attempts(0.01)
    failover = attempts.failed(step, SparkMQError(ErrorCode.SYSTEM_BUSY, "busy"))
    assert isinstance(failover, Failover) and failover.pause_until == attempts.deadline


# -- platform/broker/offsets.py: ConsumerOffsetManager._merge ---------------------------------------------------

def _record_sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """``time.sleep`` of this thread records its pause instead of sleeping; other threads still sleep.

    ``time.sleep`` is one function for the whole process: a thread another test left running (a daemon that
    sleeps a second per loop) would otherwise spin here and fill the record (491,052 pauses in one CI run).
    """
    slept: list[float] = []
    caller, real_sleep = threading.get_ident(), time.sleep

    def sleep(seconds: float) -> None:
        if threading.get_ident() == caller:
            slept.append(seconds)
        else:
            real_sleep(seconds)
    monkeypatch.setattr(time, "sleep", sleep)
    return slept


def _failing_merges(monkeypatch: pytest.MonkeyPatch, failures: int) -> list[float]:
    """The first ``failures`` MERGE commits lose the race; the pauses between them are recorded, not slept."""
    real = TableMerger.execute
    left = [failures]

    def execute(self: TableMerger) -> dict[str, Any]:
        if left[0] > 0:
            left[0] -= 1
            raise CommitFailedError("a concurrent writer won")
        return real(self)
    monkeypatch.setattr(TableMerger, "execute", execute)
    return _record_sleeps(monkeypatch)


def test_offsets_retry_a_lost_commit_race_after_20_40_60_ms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    slept = _failing_merges(monkeypatch, 3)
    m = ConsumerOffsetManager(tmp_path / "consumer_offsets", "broker-a")
    m.commit("g", "T", 0, 7)
    assert m.persist() == 1
    assert slept == pytest.approx([0.02, 0.04, 0.06])
    reread = ConsumerOffsetManager(tmp_path / "consumer_offsets", "broker-a")
    reread.load()
    assert reread.query("g", "T", 0) == 7


def test_offsets_give_up_after_four_lost_commit_races(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    slept = _failing_merges(monkeypatch, 4)
    m = ConsumerOffsetManager(tmp_path / "consumer_offsets", "broker-a")
    m.commit("g", "T", 0, 7)
    with pytest.raises(CommitFailedError, match="a concurrent writer won"):
        m.persist()
    assert slept == pytest.approx([0.02, 0.04, 0.06])
    assert m.dirty_count() == 1  # kept for the next persist
    assert m.persist() == 1


# -- pipelines/tables.py: ensure_table --------------------------------------------------------------------------

class FakeLake:
    """``is_table`` / ``_create`` as scripted; ``_check_matches`` and ``_register`` only counted."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, create_errors: list[Exception]) -> None:
        self.create_errors = create_errors
        self.created = False
        self.creates = 0
        self.registered = 0
        monkeypatch.setattr(tables, "is_table", lambda spark, path: self.created)
        monkeypatch.setattr(tables, "_create", self._create)
        monkeypatch.setattr(tables, "_check_matches", lambda spark, spec, path: None)
        monkeypatch.setattr(tables, "_register", self._register)
        self.slept = _record_sleeps(monkeypatch)

    def _create(self, spark: object, spec: object, path: str) -> None:
        self.creates += 1
        if self.create_errors:
            raise self.create_errors.pop(0)
        self.created = True

    def _register(self, spark: object, spec: object, path: str) -> None:
        self.registered += 1


def test_table_creation_is_retried_after_50_100_ms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lake = FakeLake(monkeypatch, [RuntimeError("version 0 taken"), RuntimeError("version 0 taken")])
    assert tables.ensure_table(None, tmp_path, "message_trace") == "sparkmq.message_trace"  # type: ignore[arg-type]
    assert lake.creates == 3 and lake.registered == 1
    assert lake.slept == pytest.approx([0.05, 0.10])


def test_a_concurrent_creator_that_won_ends_the_retries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lake = FakeLake(monkeypatch, [RuntimeError("version 0 taken")])
    real_create = lake._create

    def create(spark: object, spec: object, path: str) -> None:
        lake.created = True  # the other creator committed version 0 meanwhile
        real_create(spark, spec, path)
    monkeypatch.setattr(tables, "_create", create)
    tables.ensure_table(None, tmp_path, "message_trace")  # type: ignore[arg-type]
    assert lake.creates == 1 and lake.registered == 1 and lake.slept == pytest.approx([0.05])


def test_table_creation_gives_up_after_five_attempts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lake = FakeLake(monkeypatch, [RuntimeError(f"failure {i}") for i in range(9)])
    with pytest.raises(LakeError, match=r"could not create the table 'message_trace' at .*: failure 4$"):
        tables.ensure_table(None, tmp_path, "message_trace")  # type: ignore[arg-type]
    assert lake.creates == 5 and lake.registered == 0
    # No pause after the last attempt (the hand-written loop slept 0.25 s more before raising).
    assert lake.slept == pytest.approx([0.05, 0.10, 0.15, 0.20])


def test_a_directory_that_is_not_a_table_is_refused_without_retrying(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lake = FakeLake(monkeypatch, [])
    spec_path = Path(tables.get_spec("message_trace").path(tmp_path))
    spec_path.mkdir(parents=True)
    (spec_path / "data.csv").write_text("a,b\n")
    with pytest.raises(LakeError, match="the path exists and is not a Delta table"):
        tables.ensure_table(None, tmp_path, "message_trace")  # type: ignore[arg-type]
    assert lake.creates == 0 and lake.slept == []


# -- pipelines/supervisor.py: Supervisor._failed ----------------------------------------------------------------

def test_a_failing_lake_job_is_restarted_after_pauses_doubling_to_the_cap() -> None:
    now = [1000.0]

    def start() -> Any:
        raise RuntimeError("the broker is restarting")
    supervisor = Supervisor([JobSpec("flaky", start)], backoff_initial_s=0.5, backoff_max_s=3.0,
                            clock=lambda: now[0])
    pauses = []
    for _ in range(6):
        supervisor._start_job("flaky")  # what the watch thread does once the pause is over
        status = supervisor._status["flaky"]
        assert status.state == "failed-waiting"
        pauses.append(status.next_restart_in_s)
        assert supervisor._retry_at["flaky"] == now[0] + status.next_restart_in_s
    assert pauses == [0.5, 1.0, 2.0, 3.0, 3.0, 3.0]
    assert supervisor._status["flaky"].restarts == 6
