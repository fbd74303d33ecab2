"""The broker's consumer offset manager and its Delta table ``consumer_offsets``."""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError

from procs import wait_until
from sparkmq.platform.broker.offsets import CONSUMER_OFFSETS_SCHEMA, ConsumerOffsetManager, app_id_for
from sparkmq.platform.common.errors import ErrorCode, SparkMQError

CHILD = Path(__file__).with_name("offsets_child.py")


def rows_of(path: Path, broker: str | None = None) -> list[dict]:
    """The table's rows (optionally of one broker), sorted by key."""
    rows = DeltaTable(str(path)).to_pyarrow_table().to_pylist()
    if broker is not None:
        rows = [r for r in rows if r["broker"] == broker]
    return sorted(rows, key=lambda r: (r["broker"], r["group"], r["topic"], r["queue_id"]))


def as_offsets(rows: list[dict]) -> dict[tuple[str, str, int], int]:
    return {(r["group"], r["topic"], r["queue_id"]): r["offset"] for r in rows}


def snapshot(m: ConsumerOffsetManager) -> dict:
    return {g: m.offsets_of(g) for g in m.groups()} | {"_dirty": m.dirty_count()}


@pytest.fixture
def table(tmp_path: Path) -> Path:
    return tmp_path / "lake" / "consumer_offsets"


# ------------------------------------------------------------------ in memory

def test_commit_query_reset_remove(table: Path) -> None:
    m = ConsumerOffsetManager(table, "broker-a")
    assert m.query("g1", "T", 0) is None
    m.commit("g1", "T", 0, 10)
    m.commit("g1", "T", 1, 20)
    m.commit("g1", "U", 0, 5)
    m.commit("g2", "T", 0, 7)
    assert m.query("g1", "T", 0) == 10
    assert m.offsets_of("g1", "T") == {0: 10, 1: 20}
    assert m.offsets_of("g1") == {"T": {0: 10, 1: 20}, "U": {0: 5}}
    assert m.groups() == ["g1", "g2"]
    assert m.topics_of("g1") == ["T", "U"]

    # Backward commits are accepted (consumers re-commit after a reset).
    m.commit("g1", "T", 0, 3)
    assert m.query("g1", "T", 0) == 3

    m.reset("g1", "T", {0: 0, 1: 100, 2: 4})
    assert m.offsets_of("g1", "T") == {0: 0, 1: 100, 2: 4}
    assert m.offsets_of("g1", "U") == {0: 5}  # other topics untouched

    assert m.remove_group("g1") == 4
    assert m.query("g1", "T", 0) is None
    assert m.offsets_of("g1") == {}
    assert m.groups() == ["g2"]
    assert not table.exists()  # nothing touches disk before a persist


def test_a_reset_is_fenced_until_its_consumer_pulls_there(table: Path) -> None:
    """A consumer's commit of its old progress, sent before it heard of the reset, cannot undo the reset."""
    m = ConsumerOffsetManager(table, "broker-a")
    m.commit("g", "T", 0, 50)
    m.commit("g", "T", 1, 70)
    m.reset("g", "T", {0: 10})
    assert m.pending_reset("g", "T", 0) == 10 and m.pending_reset("g", "T", 1) is None
    assert m.commit("g", "T", 0, 50) is False and m.query("g", "T", 0) == 10     # stale: ignored
    assert m.commit("g", "T", 1, 71) is True and m.query("g", "T", 1) == 71      # other queues: as ever
    assert m.commit("g", "T", 0, 10) is True and m.pending_reset("g", "T", 0) == 10  # the reset offset itself
    assert m.settle_reset("g", "T", 0, 55) == 10        # a pull elsewhere is sent to the reset offset
    assert m.pending_reset("g", "T", 0) == 10
    assert m.settle_reset("g", "T", 0, 10) is None      # the consumer pulls there: the fence drops
    assert m.pending_reset("g", "T", 0) is None and m.settle_reset("g", "T", 0, 12) is None
    assert m.commit("g", "T", 0, 12) is True and m.query("g", "T", 0) == 12
    m.reset("g", "T", {0: 3}, fence=False)              # e.g. a broadcasting group: no fence
    assert m.pending_reset("g", "T", 0) is None and m.commit("g", "T", 0, 40) is True
    m.reset("g", "T", {0: 5})
    assert m.remove_group("g") == 2 and m.pending_reset("g", "T", 0) is None
    m.reset("g", "T", {0: 5})
    assert m.remove_topic("T") == 1 and m.pending_reset("g", "T", 0) is None


def test_a_reset_nobody_takes_up_expires(table: Path) -> None:
    m = ConsumerOffsetManager(table, "broker-a", reset_fence_s=0.2)
    m.reset("g", "T", {0: 10})
    assert m.commit("g", "T", 0, 50) is False
    time.sleep(0.25)
    assert m.pending_reset("g", "T", 0) is None and m.commit("g", "T", 0, 50) is True
    with pytest.raises(SparkMQError, match=r"^INVALID_ARGUMENT: reset_fence_s must be a finite number of seconds > 0, "
                                           r"got 0$"):
        ConsumerOffsetManager(table, "broker-a", reset_fence_s=0)


def test_lag(table: Path) -> None:
    m = ConsumerOffsetManager(table, "broker-a")
    assert m.lag("g", "T", 0, 50) == 50                  # never committed: from min_offset
    assert m.lag("g", "T", 0, 50, min_offset=20) == 30
    m.commit("g", "T", 0, 40)
    assert m.lag("g", "T", 0, 50) == 10
    assert m.lag("g", "T", 0, 30) == 0                   # never negative
    assert m.lag("g", "T", 0, 50, min_offset=45) == 5    # committed below retention
    with pytest.raises(SparkMQError) as e:
        m.lag("g", "T", 0, -1)
    assert e.value.code is ErrorCode.OFFSET_ILLEGAL


@pytest.mark.parametrize(("args", "code"), [
    (("", "T", 0, 1), ErrorCode.GROUP_ILLEGAL),
    (("bad group", "T", 0, 1), ErrorCode.GROUP_ILLEGAL),
    (("g" * 121, "T", 0, 1), ErrorCode.GROUP_ILLEGAL),
    ((None, "T", 0, 1), ErrorCode.GROUP_ILLEGAL),
    (("g", "", 0, 1), ErrorCode.TOPIC_ILLEGAL),
    (("g", "a/b", 0, 1), ErrorCode.TOPIC_ILLEGAL),
    (("g", "T" * 128, 0, 1), ErrorCode.TOPIC_ILLEGAL),
    (("g", "T", -1, 1), ErrorCode.QUEUE_ID_ILLEGAL),
    (("g", "T", "0", 1), ErrorCode.QUEUE_ID_ILLEGAL),
    (("g", "T", True, 1), ErrorCode.QUEUE_ID_ILLEGAL),
    (("g", "T", 2**31, 1), ErrorCode.QUEUE_ID_ILLEGAL),
    (("g", "T", 0, -1), ErrorCode.OFFSET_ILLEGAL),
    (("g", "T", 0, 1.5), ErrorCode.OFFSET_ILLEGAL),
    (("g", "T", 0, "5"), ErrorCode.OFFSET_ILLEGAL),
    (("g", "T", 0, None), ErrorCode.OFFSET_ILLEGAL),
    (("g", "T", 0, 2**63), ErrorCode.OFFSET_ILLEGAL),
])
def test_bad_commit_has_stable_code_and_changes_nothing(table: Path, args: tuple, code: ErrorCode) -> None:
    m = ConsumerOffsetManager(table, "broker-a")
    m.commit("g", "T", 0, 5)
    m.persist()
    before = snapshot(m)
    with pytest.raises(SparkMQError) as e:
        m.commit(*args)
    assert e.value.code is code
    assert e.value.http_status == 400
    assert snapshot(m) == before
    assert m.persist() == 0


def test_bad_reset_and_queries_change_nothing(table: Path) -> None:
    m = ConsumerOffsetManager(table, "broker-a")
    m.commit("g", "T", 0, 5)
    before = snapshot(m)
    cases = [
        (lambda: m.reset("g", "T", {0: 1, 1: -5}), ErrorCode.OFFSET_ILLEGAL),   # all-or-nothing: 0 not applied
        (lambda: m.reset("g", "T", {0: 1, -1: 5}), ErrorCode.QUEUE_ID_ILLEGAL),
        (lambda: m.reset("g", "T", [(0, 1)]), ErrorCode.INVALID_ARGUMENT),
        (lambda: m.reset("g!", "T", {0: 1}), ErrorCode.GROUP_ILLEGAL),
        (lambda: m.reset("g", "T T", {0: 1}), ErrorCode.TOPIC_ILLEGAL),
        (lambda: m.remove_group(""), ErrorCode.GROUP_ILLEGAL),
        (lambda: m.query("g", "T", -1), ErrorCode.QUEUE_ID_ILLEGAL),
        (lambda: m.offsets_of("g", "bad topic"), ErrorCode.TOPIC_ILLEGAL),
    ]
    for call, code in cases:
        with pytest.raises(SparkMQError) as e:
            call()
        assert e.value.code is code
        assert snapshot(m) == before


def test_constructor_rejects_bad_arguments(table: Path) -> None:
    for kwargs in ({"broker_name": ""}, {"broker_name": "b", "persist_interval_s": 0}):
        with pytest.raises(SparkMQError) as e:
            ConsumerOffsetManager(table, **kwargs)
        assert e.value.code is ErrorCode.INVALID_ARGUMENT


# ------------------------------------------------------------------ persistence

def test_persist_then_restart_restores_exactly(table: Path) -> None:
    m = ConsumerOffsetManager(table, "broker-a")
    assert m.load() == 0                      # no table yet: a new broker
    expected: dict[tuple[str, str, int], int] = {}
    for g in ("g1", "g2", "%RETRY%g1"):
        for t in ("T1", "T2"):
            for q in range(4):
                m.commit(g, t, q, 1000 * q + len(g))
                expected[(g, t, q)] = 1000 * q + len(g)
    m.reset("g1", "T1", {0: 0})               # a backwards move is persisted as is
    expected[("g1", "T1", 0)] = 0
    m.commit("g2", "T2", 3, 2**40)            # int64 range round-trips
    expected[("g2", "T2", 3)] = 2**40
    assert m.persist() == len(expected)
    assert m.dirty_count() == 0

    # Schema as specified, unpartitioned.
    dt = DeltaTable(str(table))
    assert dt.to_pyarrow_table().schema == CONSUMER_OFFSETS_SCHEMA
    assert dt.metadata().partition_columns == []
    assert dt.metadata().name == "consumer_offsets"

    restarted = ConsumerOffsetManager(table, "broker-a")
    assert restarted.load() == len(expected)
    got = {(g, t, q): o for g in restarted.groups() for t, qs in restarted.offsets_of(g).items() for q, o in qs.items()}
    assert got == expected
    assert restarted.dirty_count() == 0
    assert restarted.persist() == 0           # loading is not a change


def test_two_brokers_share_one_table_without_mixing(table: Path) -> None:
    a = ConsumerOffsetManager(table, "broker-a")
    b = ConsumerOffsetManager(table, "broker-b")
    a.commit("g", "T", 0, 10)
    a.commit("g", "T", 1, 11)
    b.commit("g", "T", 0, 20)                 # same group/topic/queue on another broker
    b.commit("other", "T", 0, 21)
    a.persist()
    b.persist()
    a.commit("g", "T", 0, 12)
    a.persist()

    assert as_offsets(rows_of(table, "broker-a")) == {("g", "T", 0): 12, ("g", "T", 1): 11}
    assert as_offsets(rows_of(table, "broker-b")) == {("g", "T", 0): 20, ("other", "T", 0): 21}
    assert len(rows_of(table)) == 4

    a2 = ConsumerOffsetManager(table, "broker-a")
    b2 = ConsumerOffsetManager(table, "broker-b")
    a2.load()
    b2.load()
    assert a2.offsets_of("g") == {"T": {0: 12, 1: 11}}
    assert a2.groups() == ["g"]
    assert b2.offsets_of("g") == {"T": {0: 20}}
    assert b2.groups() == ["g", "other"]

    # Removing a group on one broker leaves the other broker's rows alone.
    a2.remove_group("g")
    a2.persist()
    assert rows_of(table, "broker-a") == []
    assert as_offsets(rows_of(table, "broker-b")) == {("g", "T", 0): 20, ("other", "T", 0): 21}

    dt = DeltaTable(str(table))
    assert dt.transaction_version(app_id_for("broker-a")) == 3
    assert dt.transaction_version(app_id_for("broker-b")) == 1


def test_many_persists_keep_one_row_per_key(table: Path) -> None:
    m = ConsumerOffsetManager(table, "broker-a")
    for i in range(25):
        for q in range(3):
            m.commit("g", "T", q, i * 10 + q)
        if i % 5 == 0:
            m.commit("g", "New", i, i)        # occasional new keys (inserts) mixed with updates
        assert m.persist() > 0
    rows = rows_of(table)
    keys = [(r["broker"], r["group"], r["topic"], r["queue_id"]) for r in rows]
    assert len(keys) == len(set(keys)) == 3 + 5
    assert as_offsets(rows) == {("g", "T", 0): 240, ("g", "T", 1): 241, ("g", "T", 2): 242,
                                **{("g", "New", i): i for i in range(0, 25, 5)}}
    dt = DeltaTable(str(table))
    # One commit per persist, each tagged with the next app-transaction version.
    assert dt.transaction_version(app_id_for("broker-a")) == 25
    assert dt.version() == 25                 # CREATE TABLE + 25 merges
    assert len(dt.file_uris()) <= 5           # the merge rewrites touched files: no small-file pile-up


def test_only_changed_keys_are_written(table: Path) -> None:
    m = ConsumerOffsetManager(table, "broker-a")
    for q in range(8):
        m.commit("g", "T", q, q)
    assert m.persist() == 8
    first = {(r["group"], r["topic"], r["queue_id"]): r["updated_at"] for r in rows_of(table)}
    version_before = DeltaTable(str(table)).version()

    assert m.persist() == 0                   # nothing changed: no commit at all
    assert DeltaTable(str(table)).version() == version_before

    time.sleep(0.01)
    m.commit("g", "T", 5, 55)
    m.commit("g", "T", 6, 66)
    assert m.persist() == 2

    dt = DeltaTable(str(table))
    assert dt.version() == version_before + 1
    last = dt.history(1)[0]
    assert last["operation"] == "MERGE"
    assert last["operationMetrics"]["num_source_rows"] == 2
    assert last["operationMetrics"]["num_target_rows_updated"] == 2
    assert last["operationMetrics"]["num_target_rows_inserted"] == 0

    second = {(r["group"], r["topic"], r["queue_id"]): r for r in rows_of(table)}
    changed = {k for k, r in second.items() if r["updated_at"] != first[k]}
    assert changed == {("g", "T", 5), ("g", "T", 6)}
    assert second[("g", "T", 5)]["offset"] == 55


def test_removed_group_does_not_come_back(table: Path) -> None:
    m = ConsumerOffsetManager(table, "broker-a")
    m.commit("gone", "T", 0, 1)
    m.commit("gone", "T", 1, 2)
    m.commit("kept", "T", 0, 3)
    m.persist()
    m.remove_group("gone")
    m.commit("gone", "T", 1, 9)               # recommitted after the removal: only this key survives
    m.persist()
    assert as_offsets(rows_of(table)) == {("gone", "T", 1): 9, ("kept", "T", 0): 3}

    m.remove_group("gone")
    m.persist()                               # a removal alone still commits
    r = ConsumerOffsetManager(table, "broker-a")
    r.load()
    assert r.groups() == ["kept"]


def test_restart_continues_the_persist_version(table: Path) -> None:
    m = ConsumerOffsetManager(table, "broker-a")
    for i in range(3):
        m.commit("g", "T", 0, i)
        m.persist()
    assert m.persist_version == 3

    r = ConsumerOffsetManager(table, "broker-a")
    r.load()
    assert r.persist_version == 3
    r.commit("g", "T", 0, 100)
    r.persist()
    assert DeltaTable(str(table)).transaction_version(app_id_for("broker-a")) == 4

    # A manager that skipped load() still never repeats a version.
    fresh = ConsumerOffsetManager(table, "broker-a")
    fresh.commit("g", "T", 1, 1)
    fresh.persist()
    assert DeltaTable(str(table)).transaction_version(app_id_for("broker-a")) == 5


def test_load_keeps_unpersisted_memory_changes(table: Path) -> None:
    m = ConsumerOffsetManager(table, "broker-a")
    m.commit("g", "T", 0, 5)
    m.commit("g", "T", 1, 6)
    m.persist()
    r = ConsumerOffsetManager(table, "broker-a")
    r.commit("g", "T", 0, 50)                 # newer than the table
    r.load()
    assert r.offsets_of("g", "T") == {0: 50, 1: 6}


# ------------------------------------------------------------------ background thread

def table_offsets(table: Path) -> dict:
    return as_offsets(rows_of(table)) if DeltaTable.is_deltatable(str(table)) else {}


def test_background_thread_persists_within_interval_and_stop_flushes(table: Path) -> None:
    m = ConsumerOffsetManager(table, "broker-a", persist_interval_s=0.2).start()
    try:
        m.commit("g", "T", 0, 1)
        # One interval plus the merge itself (tens of ms); generous for a loaded CI box.
        wait_until(lambda: table_offsets(table) == {("g", "T", 0): 1}, 2.0, "the first persist", interval=0.02)
        m.commit("g", "T", 0, 2)
        m.commit("g", "T", 1, 3)
        wait_until(lambda: table_offsets(table) == {("g", "T", 0): 2, ("g", "T", 1): 3}, 2.0, "the second persist",
                   interval=0.02)
        versions = DeltaTable(str(table)).version()
        time.sleep(0.6)                       # idle intervals write nothing
        assert DeltaTable(str(table)).version() == versions
        m.commit("g", "T", 2, 4)              # committed right before stop: stop() must flush it
    finally:
        assert m.stop() is True
    assert table_offsets(table) == {("g", "T", 0): 2, ("g", "T", 1): 3, ("g", "T", 2): 4}
    assert m.dirty_count() == 0


def test_persist_failure_is_logged_retried_and_loses_nothing(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "lake"
    blocker.write_text("not a directory")     # the table cannot be created under a file
    table = blocker / "consumer_offsets"
    m = ConsumerOffsetManager(table, "broker-a", persist_interval_s=0.2)

    m.commit("g", "T", 0, 7)
    with pytest.raises(DeltaError, match="Not a directory"):  # delta-rs cannot create the table under a file
        m.persist()
    assert m.last_persist_error is not None
    assert m.query("g", "T", 0) == 7 and m.dirty_count() == 1

    # The first failure of the thread's run is written in full (later ones go into FailureLog's summaries).
    with caplog.at_level(logging.WARNING, logger="sparkmq.platform.broker.offsets"):
        m.start()
        m.commit("g", "T", 1, 8)
        wait_until(lambda: any("(will retry)" in r.getMessage() for r in caplog.records), 2.0,
                   "the failure logged", interval=0.02)
        blocker.unlink()                      # the disk problem goes away
        wait_until(lambda: table_offsets(table) == {("g", "T", 0): 7, ("g", "T", 1): 8}, 3.0, "the retried persist",
                   interval=0.02)
    assert m.stop() is True
    assert m.last_persist_error is None


def test_concurrent_commits_while_persisting(table: Path) -> None:
    m = ConsumerOffsetManager(table, "broker-a", persist_interval_s=0.05).start()

    def committer(queue_id: int) -> None:
        for i in range(1, 401):
            m.commit("g", "T", queue_id, i)

    threads = [threading.Thread(target=committer, args=(q,)) for q in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert m.stop() is True
    assert table_offsets(table) == {("g", "T", q): 400 for q in range(4)}


def test_brokers_persisting_concurrently_to_one_table(table: Path) -> None:
    # Concurrent merges conflict (each rewrites files the other read); the manager
    # reloads and merges again, so every broker's last offsets land.
    managers = [ConsumerOffsetManager(table, f"broker-{i}") for i in range(3)]
    errors: list[BaseException] = []

    def run(m: ConsumerOffsetManager) -> None:
        for i in range(1, 11):
            for q in range(4):
                m.commit("g", "T", q, i)
            try:
                m.persist()
            except Exception as exc:  # a conflict that outlived the retries stays pending
                errors.append(exc)

    threads = [threading.Thread(target=run, args=(m,)) for m in managers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for m in managers:
        m.persist()                           # flush anything a failed persist left pending
    rows = rows_of(table)
    assert len(rows) == 12
    assert {(r["broker"], r["queue_id"], r["offset"]) for r in rows} == {
        (f"broker-{i}", q, 10) for i in range(3) for q in range(4)}


# ------------------------------------------------------------------ a real process killed with SIGKILL

@pytest.mark.cluster
def test_sigkill_after_persist_loses_no_persisted_offset(table: Path) -> None:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, str(CHILD), str(table), "broker-crash", "4"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    last_persisted: dict | None = None
    try:
        deadline = time.monotonic() + 20
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("PERSISTED "):
                last_persisted = json.loads(line[len("PERSISTED "):])
            elif line.strip() == "READY":
                break
            assert time.monotonic() < deadline, "child too slow"
        else:
            pytest.fail(f"child exited early: {proc.wait()} {proc.stderr.read() if proc.stderr else ''}")
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=10) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    assert last_persisted is not None
    m = ConsumerOffsetManager(table, "broker-crash")
    m.load()
    got = {g: {str(q): o for q, o in m.offsets_of(g, "CrashTopic").items()} for g in m.groups()}
    assert got == last_persisted              # JSON keys are strings
    assert got["crash_g1"] == {str(q): 400 + q for q in range(4)}
    assert got["crash_g2"]["0"] == 4          # the backwards reset of round 4
    assert "crash_g3" not in got              # committed after the last persist: not durable
    assert m.persist_version == 4


def test_table_schema_constant_matches_spec() -> None:
    assert CONSUMER_OFFSETS_SCHEMA.names == ["broker", "group", "topic", "queue_id", "offset", "updated_at"]
    assert CONSUMER_OFFSETS_SCHEMA.field("queue_id").type == pa.int32()
    assert CONSUMER_OFFSETS_SCHEMA.field("offset").type == pa.int64()
    assert CONSUMER_OFFSETS_SCHEMA.field("updated_at").type == pa.timestamp("us", tz="UTC")
