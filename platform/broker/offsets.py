"""The broker's consumer offset manager, persisted as the Delta table ``consumer_offsets``.

Offsets live in memory per (group, topic, queue_id) -- commits and queries are
dictionary operations under one lock, so the consume path never waits on disk.
Every ``persist_interval_s`` (5 s by default, as RocketMQ's) a daemon thread
writes the entries that changed since the last persist to a Delta table with
delta-rs (``deltalake``); ``load()`` restores them when the broker restarts.

Table layout (one table may be shared by every broker of a cluster)::

    broker string, group string, topic string, queue_id int32, offset int64,
    updated_at timestamp[us, tz=UTC]          -- not partitioned (a small table)

Design: **MERGE upsert**, not append-of-changes.  Each persist is one delta-rs
``DeltaTable.merge`` keyed on (broker, group, topic, queue_id), so the table always
holds exactly one row per key:

* readers (``load()``, the admin CLI, ``spark.table("sparkmq.consumer_offsets")``, lag
  reports) can take the table as it is -- no "latest row per key" window, and no
  compaction job whose absence would make the table and every restart grow without
  bound;
* a removed group is deleted in the same commit
  (``when_not_matched_by_source_delete``), so it cannot come back after a restart;
  an append design would need tombstone rows that every reader has to understand;
* the cost -- a merge rewrites the (few, small) files holding matched rows -- is
  negligible for a table of one row per consumed queue, and the merge predicate
  names this broker literally so other brokers' files are pruned where possible.
  The merge is self-compacting: the files it touches are rewritten into one, so
  the live file count stays small without an OPTIMIZE.  Only commits with changes
  are written (an idle broker adds no versions); removed files and old log
  entries are left to the lake's maintenance task (vacuum) and delta-rs's
  checkpoint-time log cleanup.

Every persist carries ``CommitProperties(app_transactions=[Transaction(app_id,
version)])`` with ``app_id = "sparkmq.consumer_offsets/<broker_name>"`` and a
version that increases by one per persist of this broker, so each persist is
identifiable in the table history and ``DeltaTable.transaction_version(app_id)``
says how far the broker has persisted.  The next version is always
``max(local, table) + 1``, so a restarted broker (or a manager that never called
``load()``) continues the sequence instead of repeating a number.

Offset resets are *fenced* (RocketMQ 5 keeps a reset-offset table for the same reason):
a consumer that has not yet heard of a reset would otherwise overwrite it with its next
periodic commit of its old progress, and the reset would be lost.  After ``reset`` each
queue's new offset is *pending* until the group's consumer pulls exactly there
(:meth:`settle_reset`, called by the pull path, which answers a pull elsewhere with the
reset offset); until then commits of any other offset are ignored.  A pending reset
expires after ``reset_fence_s`` (no consumer came), and the fence then drops.

Nothing here imports FastAPI or pyspark.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import overload

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction
from deltalake.exceptions import CommitFailedError, TableNotFoundError

from sparkmq.platform.common.backoff import Backoff, call_with_retries
from sparkmq.platform.common.errors import ErrorCode, SparkMQError
from sparkmq.platform.common.failure_log import FailureLog
from sparkmq.platform.common.lake_tables import (  # defined there so pipelines/ can name it too
    CONSUMER_OFFSETS_DESCRIPTION,
    CONSUMER_OFFSETS_SCHEMA,
    CONSUMER_OFFSETS_TABLE,
    PINNED_PROPERTIES,
)
from sparkmq.platform.common.validation import Seconds, check, check_int, validate_group, validate_topic

__all__ = [
    "CONSUMER_OFFSETS_SCHEMA",
    "CONSUMER_OFFSETS_TABLE",
    "ConsumerOffsetManager",
    "app_id_for",
]

log = logging.getLogger(__name__)

_INT32_MAX = 2**31 - 1
_INT64_MAX = 2**63 - 1
#: A concurrent writer (another broker sharing the table) can make a merge lose the
#: commit race; reloading and merging again is safe because the merge is an upsert.
#: Four attempts, 20, 40 and 60 ms apart (to let the competing writer finish).
_COMMIT_ATTEMPTS = 4
_COMMIT_RETRY = Backoff(initial_s=0.02, max_s=0.06, factor=1.0, increment_s=0.02)

#: "group" and "offset" are SQL keywords, hence the quoting in the merge predicate.
_KEY_MATCH = 't."group" = s."group" AND t.topic = s.topic AND t.queue_id = s.queue_id AND t.broker = s.broker'

Key = tuple[str, str, int]


def app_id_for(broker_name: str) -> str:
    """The Delta app-transaction id under which ``broker_name`` persists its offsets."""
    return f"sparkmq.{CONSUMER_OFFSETS_TABLE}/{broker_name}"


def _sql_str(value: str) -> str:
    """A SQL string literal (names are validated, but broker names are free text)."""
    return "'" + value.replace("'", "''") + "'"


def _check_queue_id(queue_id: object) -> int:
    return check_int("the queue id", queue_id, 0, _INT32_MAX, ErrorCode.QUEUE_ID_ILLEGAL)


def _check_offset(offset: object) -> int:
    return check_int("the offset", offset, 0, _INT64_MAX, ErrorCode.OFFSET_ILLEGAL)


class ConsumerOffsetManager:
    """Consumer offsets per (group, topic, queue_id) in memory, persisted to Delta.

    Thread-safe: every public method may be called from any thread.  Offsets are
    "next offset to consume" values as committed by consumers; the manager does not
    check them against the queue's min/max offsets (the processor layer does).
    """

    def __init__(self, table_path: str | Path, broker_name: str, persist_interval_s: float = 5.0,
                 reset_fence_s: float = 60.0) -> None:
        """Create an empty manager; call ``load()`` to restore, ``start()`` to persist periodically.

        ``table_path`` is the directory of the Delta table (created on first persist);
        ``broker_name`` tags this broker's rows so several brokers can share one table;
        ``reset_fence_s`` bounds how long a reset waits for its consumer (see the module doc).
        """
        if not isinstance(broker_name, str) or not broker_name:
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, "the broker name must be a non-empty string")
        check("persist_interval_s", persist_interval_s, Seconds)
        check("reset_fence_s", reset_fence_s, Seconds)
        self.table_path = str(table_path)
        self.broker_name = broker_name
        self.persist_interval_s = float(persist_interval_s)
        self.reset_fence_s = float(reset_fence_s)
        self.app_id = app_id_for(broker_name)

        self._lock = threading.Lock()             # guards the in-memory state below
        self._offsets: dict[Key, int] = {}
        self._updated_at: dict[Key, datetime] = {}
        self._dirty: set[Key] = set()            # keys changed since the last successful persist
        self._pending_resets: dict[Key, tuple[int, float]] = {}  # reset offset, monotonic deadline
        self._removed_groups: set[str] = set()   # groups whose table rows must be deleted
        self._removed_topics: set[str] = set()   # topics whose table rows must be deleted (topic deleted)

        self._persist_lock = threading.Lock()    # one persist at a time (thread vs. stop()/callers)
        self._version = 0                         # last app-transaction version this manager wrote
        self._last_error: BaseException | None = None
        # Every round retries a failed persist (a full disk, a broken table): logged quietly.
        self._persist_failures = FailureLog(log, f"consumer_offsets: persisting {self.app_id} to {self.table_path}")

        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ offsets

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> bool:
        """Record ``offset`` as the group's next offset to consume on (topic, queue_id); whether it was applied.

        Backward commits are accepted on purpose: after an admin ``reset`` to an
        earlier offset, consumers legitimately re-commit lower values, and RocketMQ
        behaves the same way.  Not applied (False): a commit of another offset while a
        reset of the queue is pending -- it comes from a consumer that has not taken the
        reset up yet.  Raises ``SparkMQError`` (GROUP_ILLEGAL, TOPIC_ILLEGAL,
        QUEUE_ID_ILLEGAL, OFFSET_ILLEGAL) and changes nothing on bad input.
        """
        key = self._key(group, topic, queue_id)
        _check_offset(offset)
        with self._lock:
            pending = self._pending(key)
            if pending is not None and offset != pending:
                log.debug("commit of %s %s/%d at %d ignored: reset to %d pending", group, topic, queue_id, offset,
                          pending)
                return False
            self._set(key, offset, datetime.now(UTC))
            return True

    def pending_reset(self, group: str, topic: str, queue_id: int) -> int | None:
        """The offset of a reset of (group, topic, queue_id) its consumer has not taken up yet, if any."""
        if not self._pending_resets:
            return None
        key = self._key(group, topic, queue_id)
        with self._lock:
            return self._pending(key)

    def settle_reset(self, group: str, topic: str, queue_id: int, pull_offset: int) -> int | None:
        """A pull of ``group`` at ``pull_offset``: the reset offset it must move to, or None to serve it.

        A pull exactly at the pending reset offset means the consumer took the reset up:
        the fence drops and the pull is served.
        """
        if not self._pending_resets:  # every pull asks: the usual answer without a lock (a reset racing
            return None               # this pull is seen by the consumer's next one)
        key = self._key(group, topic, queue_id)
        with self._lock:
            pending = self._pending(key)
            if pending is None:
                return None
            if pull_offset == pending:
                del self._pending_resets[key]
                return None
            return pending

    def _pending(self, key: Key) -> int | None:
        # Caller holds self._lock.
        entry = self._pending_resets.get(key)
        if entry is None:
            return None
        if time.monotonic() >= entry[1]:
            del self._pending_resets[key]
            log.info("offset reset of %s %s/%d to %d was not taken up within %.0f s; commits are accepted again",
                     *key, entry[0], self.reset_fence_s)
            return None
        return entry[0]

    def query(self, group: str, topic: str, queue_id: int) -> int | None:
        """The committed offset of (group, topic, queue_id), or None if the group never committed one."""
        key = self._key(group, topic, queue_id)
        with self._lock:
            return self._offsets.get(key)

    @overload
    def offsets_of(self, group: str, topic: str) -> dict[int, int]: ...
    @overload
    def offsets_of(self, group: str, topic: None = None) -> dict[str, dict[int, int]]: ...

    def offsets_of(self, group: str, topic: str | None = None) -> dict[int, int] | dict[str, dict[int, int]]:
        """A copy of a group's offsets.

        With ``topic``: ``{queue_id: offset}`` for that topic (as RocketMQ's
        ``queryOffset(group, topic)``); without: ``{topic: {queue_id: offset}}``.
        """
        validate_group(group)
        if topic is not None:
            validate_topic(topic)
        with self._lock:
            items = [(k, v) for k, v in self._offsets.items() if k[0] == group]
        if topic is not None:
            return {q: v for (_, t, q), v in sorted(items) if t == topic}
        nested: dict[str, dict[int, int]] = {}
        for (_, t, q), v in sorted(items):
            nested.setdefault(t, {})[q] = v
        return nested

    def groups(self) -> list[str]:
        """The groups with at least one committed offset, sorted."""
        with self._lock:
            return sorted({k[0] for k in self._offsets})

    def topics_of(self, group: str) -> list[str]:
        """The topics on which ``group`` has committed offsets, sorted."""
        validate_group(group)
        with self._lock:
            return sorted({k[1] for k in self._offsets if k[0] == group})

    def reset(self, group: str, topic: str, offsets: Mapping[int, int], *, fence: bool = True) -> None:
        """Overwrite the group's offsets of ``topic`` with ``{queue_id: offset}`` (may go backwards).

        All-or-nothing: every entry is validated before any is applied.  Queues of
        the topic not named in ``offsets`` keep their offsets.  With ``fence`` each new
        offset stays pending until the group's consumer pulls there (see the module doc).
        """
        validate_group(group)
        validate_topic(topic)
        if not isinstance(offsets, Mapping):
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, "offsets must be a mapping of queue id to offset")
        checked = [(_check_queue_id(q), _check_offset(o)) for q, o in offsets.items()]
        now = datetime.now(UTC)
        deadline = time.monotonic() + self.reset_fence_s
        with self._lock:
            for queue_id, offset in checked:
                self._set((group, topic, queue_id), offset, now)
                if fence:
                    self._pending_resets[(group, topic, queue_id)] = (offset, deadline)
                else:
                    self._pending_resets.pop((group, topic, queue_id), None)

    def remove_group(self, group: str) -> int:
        """Forget every offset of ``group``; the next persist deletes its rows. Returns how many were removed."""
        validate_group(group)
        with self._lock:
            keys = [k for k in self._offsets if k[0] == group]
            for key in keys:
                del self._offsets[key]
                self._updated_at.pop(key, None)
                self._dirty.discard(key)
            for key in [k for k in self._pending_resets if k[0] == group]:
                del self._pending_resets[key]
            # Delete even if nothing is in memory: rows may exist that were never loaded.
            self._removed_groups.add(group)
            return len(keys)

    def remove_topic(self, topic: str) -> int:
        """Forget every group's offsets of ``topic`` (the topic was deleted); the next persist deletes its rows.

        Returns how many entries were removed.
        """
        validate_topic(topic)
        with self._lock:
            keys = [k for k in self._offsets if k[1] == topic]
            for key in keys:
                del self._offsets[key]
                self._updated_at.pop(key, None)
                self._dirty.discard(key)
            for key in [k for k in self._pending_resets if k[1] == topic]:
                del self._pending_resets[key]
            self._removed_topics.add(topic)
            return len(keys)

    def lag(self, group: str, topic: str, queue_id: int, max_offset: int, min_offset: int = 0) -> int:
        """Messages the group has yet to consume on a queue: ``max_offset - committed``, never negative.

        A queue without a committed offset counts from ``min_offset`` (the oldest
        message still stored), as RocketMQ's consumer-progress view does.
        """
        _check_offset(max_offset)
        _check_offset(min_offset)
        committed = self.query(group, topic, queue_id)
        start = min_offset if committed is None else max(committed, min_offset)
        return max(0, max_offset - start)

    def dirty_count(self) -> int:
        """How many entries changed since the last successful persist (for metrics and tests)."""
        with self._lock:
            return len(self._dirty) + len(self._removed_groups) + len(self._removed_topics)

    @property
    def persist_version(self) -> int:
        """The app-transaction version of this manager's last successful persist (0 if none)."""
        return self._version

    @property
    def last_persist_error(self) -> BaseException | None:
        """The error of the most recent failed persist, cleared by the next success."""
        return self._last_error

    def _key(self, group: str, topic: str, queue_id: int) -> Key:
        validate_group(group)
        validate_topic(topic)
        _check_queue_id(queue_id)
        return (group, topic, queue_id)

    def _set(self, key: Key, offset: int, now: datetime) -> None:
        # Caller holds self._lock.
        self._offsets[key] = offset
        self._updated_at[key] = now
        self._dirty.add(key)

    # -------------------------------------------------------------- persistence

    def load(self) -> int:
        """Restore this broker's offsets from the table; returns how many entries were loaded.

        A missing table means a new broker: nothing is loaded.  Entries changed in
        memory and not yet persisted win over the table (they are newer).  Also
        continues the app-transaction version sequence from the table.
        """
        table = self._open_table()
        if table is None:
            return 0
        rows = table.to_pyarrow_table(filters=[("broker", "=", self.broker_name)]).to_pylist()
        # One row per key with MERGE; sorting by updated_at still picks the newest if
        # an older writer ever appended duplicates.
        rows.sort(key=lambda r: r["updated_at"])
        loaded = 0
        with self._lock:
            for row in rows:
                key = (row["group"], row["topic"], int(row["queue_id"]))
                if key in self._dirty or key[0] in self._removed_groups or key[1] in self._removed_topics:
                    continue
                self._offsets[key] = int(row["offset"])
                self._updated_at[key] = row["updated_at"]
                loaded += 1
        with self._persist_lock:
            self._version = max(self._version, table.transaction_version(self.app_id) or 0)
        return loaded

    def persist(self) -> int:
        """Write the entries changed since the last persist to the table (one MERGE commit).

        Returns how many rows were upserted (0, and no commit, when nothing changed
        and no group was removed).  On failure the changes stay pending for the
        next persist and the error is raised; in-memory offsets are never lost.
        """
        with self._persist_lock:
            with self._lock:
                # Swap the pending sets out under the lock; commits arriving while the
                # merge runs mark keys dirty again and go in the next persist.
                dirty, removed, removed_topics = self._dirty, self._removed_groups, self._removed_topics
                self._dirty, self._removed_groups, self._removed_topics = set(), set(), set()
                rows = [(k, self._offsets[k], self._updated_at[k]) for k in sorted(dirty) if k in self._offsets]
            if not rows and not removed and not removed_topics:
                return 0
            try:
                self._merge(rows, removed, removed_topics)
            except BaseException as exc:
                with self._lock:
                    self._dirty |= dirty
                    self._removed_groups |= removed
                    self._removed_topics |= removed_topics
                self._last_error = exc
                raise
            self._last_error = None
            return len(rows)

    def _open_table(self) -> DeltaTable | None:
        try:
            return DeltaTable(self.table_path)
        except TableNotFoundError:
            return None

    def _create_table(self) -> DeltaTable:
        try:
            # The pinned protocol (reader 1 / writer 2, no deletion vectors): delta-spark reads, vacuums and
            # checkpoints the table the broker merges into, and neither side adds a feature the other lacks.
            return DeltaTable.create(self.table_path, CONSUMER_OFFSETS_SCHEMA, mode="ignore",
                                     name=CONSUMER_OFFSETS_TABLE, description=CONSUMER_OFFSETS_DESCRIPTION,
                                     configuration=dict(PINNED_PROPERTIES))
        except Exception:
            # Another broker sharing the path created it first: use theirs.
            table = self._open_table()
            if table is None:
                raise
            return table

    def _merge(self, rows: list[tuple[Key, int, datetime]], removed: set[str],
               removed_topics: frozenset[str] | set[str] = frozenset()) -> None:
        source = pa.Table.from_pydict({
            "broker": [self.broker_name] * len(rows),
            "group": [k[0] for k, _, _ in rows],
            "topic": [k[1] for k, _, _ in rows],
            "queue_id": [k[2] for k, _, _ in rows],
            "offset": [o for _, o, _ in rows],
            "updated_at": [u for _, _, u in rows],
        }, schema=CONSUMER_OFFSETS_SCHEMA)
        broker = _sql_str(self.broker_name)

        def commit_once() -> int:
            table = self._open_table() or self._create_table()
            # Continue after whatever this broker name last wrote (a previous run, or a
            # manager that skipped load()) so versions never repeat.
            table_version = table.transaction_version(self.app_id) or 0
            if table_version > self._version and self._version:
                log.warning("consumer_offsets: %s was persisted by someone else up to version %d (we are at %d); "
                            "are two brokers using the name %r?", self.app_id, table_version, self._version,
                            self.broker_name)
            version = max(self._version, table_version) + 1
            merger = table.merge(
                source,
                # The broker literal lets delta-rs skip files holding only other brokers' rows.
                predicate=f"t.broker = {broker} AND {_KEY_MATCH}",
                source_alias="s", target_alias="t",
                commit_properties=CommitProperties(app_transactions=[Transaction(self.app_id, version)]),
            ).when_matched_update_all().when_not_matched_insert_all()
            doomed = []
            if removed:
                doomed.append('t."group" IN (' + ", ".join(_sql_str(g) for g in sorted(removed)) + ")")
            if removed_topics:
                doomed.append("t.topic IN (" + ", ".join(_sql_str(t) for t in sorted(removed_topics)) + ")")
            if doomed:
                # Rows of removed groups (or deleted topics) that the source does not re-insert
                # (a group may commit again after its removal) are deleted in the same commit.
                merger = merger.when_not_matched_by_source_delete(
                    predicate=f"t.broker = {broker} AND ({' OR '.join(doomed)})")
            merger.execute()
            return version

        def conflict(exc: Exception, attempt: int, pause_s: float) -> None:
            log.info("consumer_offsets: commit conflict persisting %s (attempt %d), retrying", self.app_id, attempt)

        self._version = call_with_retries(commit_once, _COMMIT_RETRY, attempts=_COMMIT_ATTEMPTS,
                                          retry_on=CommitFailedError, on_retry=conflict)

    # ------------------------------------------------------------ background thread

    def start(self) -> ConsumerOffsetManager:
        """Start the daemon thread that persists every ``persist_interval_s``; returns self."""
        if self._thread is not None and self._thread.is_alive():
            return self
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=f"offsets-persist-{self.broker_name}", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float | None = 30.0) -> bool:
        """Stop the thread and persist a last time; returns False if that final persist failed (logged)."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout)
        return self._persist_logged()

    def _run(self) -> None:
        # Event.wait doubles as an interruptible sleep, so stop() never waits an interval.
        while not self._stop.wait(self.persist_interval_s):
            self._persist_logged()

    def _persist_logged(self) -> bool:
        try:
            self.persist()
        except Exception as exc:
            # Pending changes were put back by persist(); the next interval retries.
            self._persist_failures.failure("%s: %s (will retry)", type(exc).__name__, exc, exc_info=True)
            return False
        self._persist_failures.success()
        return True

    def __enter__(self) -> ConsumerOffsetManager:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return (f"ConsumerOffsetManager(table_path={self.table_path!r}, broker_name={self.broker_name!r}, "
                f"entries={len(self._offsets)}, version={self._version})")
