"""Where consumers keep their offsets (RocketMQ's ``OffsetStore``).

* :class:`RemoteOffsetStore` (clustering): offsets belong to the group and live on the
  broker that owns each queue; commits go to ``POST /consumers/{group}/offsets`` on that
  broker's master, reads to ``GET /consumers/{group}/offsets/{topic}/{queue_id}``.
* :class:`LocalOffsetStore` (broadcasting): every member consumes everything, so offsets
  belong to the member and live in ``<dir>/<group>/offsets.json``, replaced atomically
  (write a temporary file, fsync, rename, fsync the directory) so a crash leaves the old
  file or the new one, never half of one.

Both keep an in-memory table the consumer updates as messages finish and commit it
every 5 s; only entries that changed since their last successful commit are sent.
"""
from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from enum import Enum
from pathlib import Path

from ..common.errors import ErrorCode, SparkMQError
from ..common.failure_log import FailureLog
from .allocation import MessageQueue
from .remoting import BrokerClientPool

__all__ = ["ReadOffsetType", "OffsetStore", "RemoteOffsetStore", "LocalOffsetStore"]

log = logging.getLogger("sparkmq.client")


class ReadOffsetType(Enum):
    """Where :meth:`OffsetStore.read` looks."""

    #: Only the in-memory table.
    MEMORY = "memory"
    #: Only the store (broker or file); the answer replaces the in-memory value.
    STORE = "store"
    #: The in-memory table, else the store.
    MEMORY_THEN_STORE = "memory_then_store"


class OffsetStore(ABC):
    """The consumer-side offset table of one group: update in memory, commit to the store."""

    def __init__(self, group: str) -> None:
        self.group = group
        self._lock = threading.Lock()
        self._table: dict[MessageQueue, int] = {}
        self._committed: dict[MessageQueue, int] = {}

    def load(self) -> None:  # noqa: B027 - optional hook: remote stores read per queue on demand
        """Read what the store already holds (a no-op for stores read per queue)."""

    def update(self, mq: MessageQueue, offset: int, *, increase_only: bool = False) -> None:
        """Set ``mq``'s offset in memory (with ``increase_only``, never move it back)."""
        with self._lock:
            old = self._table.get(mq)
            if increase_only and old is not None and old >= offset:
                return
            self._table[mq] = offset

    def read(self, mq: MessageQueue, read_type: ReadOffsetType = ReadOffsetType.MEMORY_THEN_STORE) -> int:
        """``mq``'s offset, -1 when there is none."""
        if read_type is not ReadOffsetType.STORE:
            with self._lock:
                if mq in self._table:
                    return self._table[mq]
            if read_type is ReadOffsetType.MEMORY:
                return -1
        offset = self._read_store(mq)
        if offset >= 0:
            with self._lock:
                self._table[mq] = offset
                self._committed[mq] = offset
        return offset

    def remove(self, mq: MessageQueue) -> None:
        """Forget ``mq`` (its queue was taken away; it was committed first)."""
        with self._lock:
            self._table.pop(mq, None)
            self._committed.pop(mq, None)

    def committed(self, mq: MessageQueue) -> int | None:
        """The offset of ``mq`` this store last wrote or read from the store, or None."""
        with self._lock:
            return self._committed.get(mq)

    def mark_committed(self, mq: MessageQueue, offset: int) -> None:
        """Record that the store holds ``offset`` for ``mq`` (set elsewhere, by an offset reset)."""
        with self._lock:
            self._committed[mq] = offset
            self._table[mq] = offset

    def table(self) -> dict[MessageQueue, int]:
        """A copy of the in-memory table."""
        with self._lock:
            return dict(self._table)

    def persist(self, mq: MessageQueue) -> None:
        """Commit ``mq``'s offset now (errors are raised)."""
        self.persist_all([mq], raise_errors=True)

    def persist_all(self, mqs: Iterable[MessageQueue] | None = None, *, raise_errors: bool = False) -> int:
        """Commit the changed offsets of ``mqs`` (all when None); how many were committed.

        Failures are logged and the entries stay changed, so the next commit retries them;
        with ``raise_errors`` the first failure is raised after the rest were tried.
        """
        with self._lock:
            wanted = self._table.keys() if mqs is None else [mq for mq in mqs if mq in self._table]
            changed = {mq: self._table[mq] for mq in wanted if self._committed.get(mq) != self._table[mq]}
        if not changed:
            return 0
        done, error = self._commit(changed)
        with self._lock:
            for mq in done:
                self._committed[mq] = changed[mq]
        if error is not None and raise_errors:
            raise error
        return len(done)

    @abstractmethod
    def _read_store(self, mq: MessageQueue) -> int:
        """The stored offset of ``mq`` or -1."""

    @abstractmethod
    def _commit(self, offsets: dict[MessageQueue, int]) -> tuple[list[MessageQueue], SparkMQError | None]:
        """Write ``offsets``; the queues written and the first error."""


class RemoteOffsetStore(OffsetStore):
    """Offsets of a clustering group, committed to the broker that owns each queue.

    ``master_addr(queue)`` resolves where to commit (the route cache's master address).
    """

    def __init__(self, group: str, brokers: BrokerClientPool,
                 master_addr: Callable[[MessageQueue], str | None]) -> None:
        super().__init__(group)
        self._brokers = brokers
        self._master_addr = master_addr
        #: Per broker: a master that is down fails every commit until it is back; logged quietly.
        self._commit_failures: dict[str, FailureLog] = {}

    def _addr(self, mq: MessageQueue) -> str:
        addr = self._master_addr(mq)
        if addr is None:
            raise SparkMQError(ErrorCode.SERVICE_NOT_AVAILABLE, f"broker {mq.broker_name} has no master for offsets")
        return addr

    def _commit_failures_of(self, broker_name: str) -> FailureLog:
        failures = self._commit_failures.get(broker_name)
        if failures is None:
            failures = self._commit_failures[broker_name] = FailureLog(
                log, f"committing offsets of {self.group} to {broker_name}")
        return failures

    def _read_store(self, mq: MessageQueue) -> int:
        return self._brokers.get(self._addr(mq)).query_offset(self.group, mq.topic, mq.queue_id)

    def _commit(self, offsets: dict[MessageQueue, int]) -> tuple[list[MessageQueue], SparkMQError | None]:
        by_broker: dict[str, list[MessageQueue]] = {}
        for mq in offsets:
            by_broker.setdefault(mq.broker_name, []).append(mq)
        done: list[MessageQueue] = []
        error: SparkMQError | None = None
        for broker_name, mqs in sorted(by_broker.items()):
            try:
                client = self._brokers.get(self._addr(mqs[0]))
                client.commit_offsets(self.group, [{"topic": mq.topic, "queue_id": mq.queue_id,
                                                    "offset": offsets[mq]} for mq in mqs])
                done.extend(mqs)
                self._commit_failures_of(broker_name).success()
            except SparkMQError as exc:
                self._commit_failures_of(broker_name).failure("%d offsets: %s", len(mqs), exc)
                error = error or exc
        return done, error


class LocalOffsetStore(OffsetStore):
    """Offsets of a broadcasting member in ``<directory>/<group>/offsets.json``.

    File format: ``{"group": g, "offsets": {topic: {"broker/queue_id": offset}}}``.

    Example::

        >>> import tempfile
        >>> d = tempfile.mkdtemp()
        >>> s = LocalOffsetStore("g", d)
        >>> s.update(MessageQueue("t", "broker-a", 0), 5)
        >>> s.persist_all()
        1
        >>> LocalOffsetStore("g", d).read(MessageQueue("t", "broker-a", 0))
        5
    """

    def __init__(self, group: str, directory: str | os.PathLike[str]) -> None:
        super().__init__(group)
        self.path = Path(directory) / group / "offsets.json"
        self._file_lock = threading.Lock()

    def _read_file(self) -> dict[MessageQueue, int]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise SparkMQError(ErrorCode.INTERNAL_ERROR, f"cannot read offsets file {self.path}: {exc}") from None
        out: dict[MessageQueue, int] = {}
        for topic, queues in (data.get("offsets") or {}).items():
            for key, offset in queues.items():
                broker_name, _, queue_id = key.rpartition("/")
                out[MessageQueue(topic, broker_name, int(queue_id))] = int(offset)
        return out

    def load(self) -> None:
        """Read the file into memory (missing file = no offsets)."""
        stored = self._read_file()
        with self._lock:
            for mq, offset in stored.items():
                self._table.setdefault(mq, offset)
                self._committed.setdefault(mq, offset)

    def _read_store(self, mq: MessageQueue) -> int:
        return self._read_file().get(mq, -1)

    def _commit(self, offsets: dict[MessageQueue, int]) -> tuple[list[MessageQueue], SparkMQError | None]:
        with self._file_lock:
            try:
                # The file holds every queue ever committed, not only the ones changed now.
                merged = self._read_file()
                merged.update(offsets)
                self._write_atomically(merged)
            except (OSError, SparkMQError) as exc:
                err = exc if isinstance(exc, SparkMQError) else SparkMQError(
                    ErrorCode.INTERNAL_ERROR, f"cannot write offsets file {self.path}: {exc}")
                log.warning("%s", err)
                return [], err
        return list(offsets), None

    def _write_atomically(self, table: dict[MessageQueue, int]) -> None:
        nested: dict[str, dict[str, int]] = {}
        for mq, offset in sorted(table.items()):
            nested.setdefault(mq.topic, {})[mq.key] = offset
        payload = json.dumps({"group": self.group, "offsets": nested}, indent=1, sort_keys=True).encode("utf-8")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".offsets.", suffix=".tmp", dir=self.path.parent)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(payload)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        # The rename is durable only once the directory entry is.
        dir_fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
