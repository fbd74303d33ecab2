"""The broker's topic table (RocketMQ's ``TopicConfigManager``).

Each topic has read and write queue counts, a ``perm`` (READ 4 | WRITE 2 | INHERIT 1,
see :mod:`sparkmq.platform.common.perm`: 6 = read+write, 4 = sends refused,
2 = pulls refused), a ``topic_sys_flag`` and an ``order`` flag.

* **System topics** (those of :mod:`sparkmq.platform.common.system_topics` -- ``RMQ_SYS_*``,
  ``SCHEDULE_TOPIC_XXXX``, ``%RETRY%<group>``, ``%DLQ%<group>`` -- plus ``TBW102`` and any
  ``rmq_sys_*``) are created by the broker itself; the admin API can neither
  create, update nor delete them (NO_PERMISSION), and sends never auto-create them.
* **Auto-create**: when enabled, a send to an unknown ordinary topic creates it with
  ``default_topic_queue_nums`` read and write queues and perm 6.
* **Persistence**: the whole table is written as JSON to ``data_dir/config/topics.json``
  on every change (temporary file, fsync, rename, directory fsync: a crash leaves the old
  or the new table, never a torn one) and reloaded on start.
* ``data_version`` moves on every change (and once per restart) so name servers re-read
  the table on the next registration; listeners are told after each change.
"""
from __future__ import annotations

import builtins
import json
import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..common.durable_file import replace_durably
from ..common.errors import ErrorCode, SparkMQError
from ..common.perm import PERM_INHERIT, PERM_MAX, PERM_READ_WRITE
from ..common.system_topics import (
    DLEDGER_NOOP_TOPIC,
    SCHEDULE_TOPIC,
    TIMER_TOPIC,
    TRACE_TOPIC,
    TRANS_HALF_TOPIC,
    TRANS_OP_HALF_TOPIC,
    is_system_topic,
)
from ..common.validation import MAX_QUEUE_NUMS, check, check_int, validate_topic

__all__ = [
    "TopicConfig",
    "TopicConfigManager",
    "MAX_QUEUE_NUMS",
    "AUTO_CREATE_TEMPLATE_TOPIC",
    "is_reserved_topic",
]

log = logging.getLogger("sparkmq.broker")

#: RocketMQ's auto-create template: its route tells producers which brokers create topics on first send.
AUTO_CREATE_TEMPLATE_TOPIC = "TBW102"
#: Reserved by RocketMQ beyond the platform's own system topics.
_RESERVED_TOPICS = frozenset({AUTO_CREATE_TEMPLATE_TOPIC, "SELF_TEST_TOPIC", "OFFSET_MOVED_EVENT"})
#: RocketMQ's TopicValidator treats every topic starting with this (any case) as a system topic.
_SYSTEM_LOWER_PREFIX = "rmq_sys_"
_DELAY_LEVELS = 18
_FILE_FORMAT = 1


def is_reserved_topic(topic: str) -> bool:
    """Whether ``topic`` is reserved for the broker: created by it, never through the admin API or auto-create."""
    return is_system_topic(topic) or topic in _RESERVED_TOPICS or topic.lower().startswith(_SYSTEM_LOWER_PREFIX)


@dataclass(frozen=True)
class TopicConfig:
    """One topic's config on this broker (validated on construction).

    Example::

        >>> TopicConfig("orders", 8, 8).queue_count
        8
    """

    topic: str
    read_queue_nums: int = 16
    write_queue_nums: int = 16
    perm: int = PERM_READ_WRITE
    topic_sys_flag: int = 0
    order: bool = False

    def __post_init__(self) -> None:
        validate_topic(self.topic)
        check_int("read_queue_nums", self.read_queue_nums, 1, MAX_QUEUE_NUMS)
        check_int("write_queue_nums", self.write_queue_nums, 1, MAX_QUEUE_NUMS)
        check_int("perm", self.perm, 0, PERM_MAX)
        check_int("topic_sys_flag", self.topic_sys_flag, 0, 2**31 - 1)
        check("order", self.order, bool)

    @property
    def queue_count(self) -> int:
        """How many queues exist in the store: the larger of the read and write counts."""
        return max(self.read_queue_nums, self.write_queue_nums)

    def to_dict(self) -> dict[str, Any]:
        """JSON form (the admin API's shape)."""
        return asdict(self)

    def to_route_dict(self) -> dict[str, int]:
        """What a registration tells the name servers about this topic."""
        return {"read_queue_nums": self.read_queue_nums, "write_queue_nums": self.write_queue_nums,
                "perm": self.perm, "topic_sys_flag": self.topic_sys_flag}


def _system_configs(default_queue_nums: int, auto_create: bool) -> list[TopicConfig]:
    configs = [
        TopicConfig(TRACE_TOPIC, 1, 1),
        TopicConfig(SCHEDULE_TOPIC, _DELAY_LEVELS, _DELAY_LEVELS),
        TopicConfig(TIMER_TOPIC, 1, 1),
        TopicConfig(TRANS_HALF_TOPIC, 1, 1),
        TopicConfig(TRANS_OP_HALF_TOPIC, 1, 1),
        TopicConfig(DLEDGER_NOOP_TOPIC, 1, 1),
    ]
    if auto_create:
        # INHERIT marks it as the template; producers use its route for topics that do not exist yet.
        configs.append(TopicConfig(AUTO_CREATE_TEMPLATE_TOPIC, default_queue_nums, default_queue_nums,
                                   PERM_READ_WRITE | PERM_INHERIT))
    return configs


class TopicConfigManager:
    """Thread-safe topic table with persistence, auto-create and change notification."""

    def __init__(self, path: str | Path | None, *, default_queue_nums: int = 4, auto_create: bool = True) -> None:
        """``path`` is the JSON file (None keeps the table in memory only, for tests and tools)."""
        self.path = Path(path) if path is not None else None
        self.default_queue_nums = check_int("default_queue_nums", default_queue_nums, 1, MAX_QUEUE_NUMS)
        self.auto_create = auto_create
        self._lock = threading.RLock()
        self._topics: dict[str, TopicConfig] = {}
        self._data_version = 0
        self._listeners: list[Callable[[int], None]] = []

    # -- lifecycle --------------------------------------------------------------------
    def load(self) -> int:
        """Read the persisted table, add missing system topics, bump the data version; returns the topic count.

        The version moves on every load so name servers re-read the table after a restart.
        """
        with self._lock:
            if self.path is not None and self.path.exists():
                try:
                    data = json.loads(self.path.read_text("utf-8"))
                    topics = [TopicConfig(**t) for t in data["topics"]]
                    version = int(data["data_version"])
                except (ValueError, KeyError, TypeError, SparkMQError) as exc:
                    raise SparkMQError(ErrorCode.STORE_CORRUPT,
                                       f"the topic table {self.path} is unreadable: {exc}") from None
                self._topics = {t.topic: t for t in topics}
                self._data_version = version
            for cfg in _system_configs(self.default_queue_nums, self.auto_create):
                self._topics.setdefault(cfg.topic, cfg)
            if not self.auto_create:
                self._topics.pop(AUTO_CREATE_TEMPLATE_TOPIC, None)
            self._data_version += 1
            self._persist()
            return len(self._topics)

    def add_listener(self, listener: Callable[[int], None]) -> None:
        """Call ``listener(data_version)`` after every change (from the changing thread, outside the lock)."""
        self._listeners.append(listener)

    # -- reads ------------------------------------------------------------------------
    @property
    def data_version(self) -> int:
        """Moves on every change of the table."""
        return self._data_version

    def get(self, topic: str) -> TopicConfig | None:
        """The topic's config, or None."""
        return self._topics.get(topic)

    def require(self, topic: str) -> TopicConfig:
        """The topic's config; TOPIC_ILLEGAL for a bad name, TOPIC_NOT_EXIST when unknown."""
        validate_topic(topic)
        cfg = self._topics.get(topic)
        if cfg is None:
            raise SparkMQError(ErrorCode.TOPIC_NOT_EXIST, f"topic {topic!r} does not exist on this broker")
        return cfg

    def list(self) -> list[TopicConfig]:
        """Every topic, sorted by name."""
        with self._lock:
            return [self._topics[t] for t in sorted(self._topics)]

    def __len__(self) -> int:
        return len(self._topics)

    def snapshot(self) -> tuple[int, dict[str, TopicConfig]]:
        """(data_version, {topic: config}) taken together, for a consistent registration."""
        with self._lock:
            return self._data_version, dict(self._topics)

    def can_auto_create(self, topic: str) -> bool:
        """Whether a send to ``topic`` would create it (auto-create on, legal ordinary name)."""
        validate_topic(topic)
        return self.auto_create and not is_reserved_topic(topic)

    def queue_count(self, topic: str) -> int | None:
        """The store's queue count of ``topic`` (what a send may create counts too); None when unknown."""
        cfg = self._topics.get(topic)
        if cfg is not None:
            return cfg.queue_count
        if self.auto_create and not is_reserved_topic(topic):
            return self.default_queue_nums
        return None

    def for_send(self, topic: str) -> TopicConfig:
        """The config a send to ``topic`` works with: the existing one, or the one auto-create would make.

        Nothing is created here: the caller calls :meth:`auto_create_topic` after the
        message was stored, so a rejected send creates no topic.
        """
        cfg = self.get(topic)
        if cfg is not None:
            return cfg
        if not self.can_auto_create(topic):
            raise SparkMQError(ErrorCode.TOPIC_NOT_EXIST,
                               f"topic {topic!r} does not exist and this broker does not create it"
                               + ("" if self.auto_create else " (auto-create is off)"))
        return TopicConfig(topic, self.default_queue_nums, self.default_queue_nums)

    # -- writes -----------------------------------------------------------------------
    def create_or_update(self, topic: str, read_queue_nums: int = 16, write_queue_nums: int = 16,
                         perm: int = PERM_READ_WRITE, order: bool = False, topic_sys_flag: int = 0) -> TopicConfig:
        """Create or replace an ordinary topic's config (the admin API); NO_PERMISSION for system topics."""
        validate_topic(topic)
        if is_reserved_topic(topic):
            raise SparkMQError(ErrorCode.NO_PERMISSION, f"{topic!r} is a system topic; the broker manages it")
        cfg = TopicConfig(topic, read_queue_nums, write_queue_nums, perm, topic_sys_flag, order)
        self._put(cfg)
        return cfg

    def auto_create_topic(self, topic: str) -> TopicConfig:
        """Create ``topic`` with the default queue counts unless it exists; returns its config."""
        cfg = self.for_send(topic)
        with self._lock:
            existing = self._topics.get(topic)
            if existing is not None:  # a concurrent send or admin call won the race
                return existing
            self._put(cfg)
        log.info("auto-created topic %s with %d queues", topic, cfg.write_queue_nums)
        return cfg

    def ensure_system_topic(self, topic: str, queue_nums: int = 1, perm: int = PERM_READ_WRITE) -> TopicConfig:
        """Create a broker-managed topic (``%RETRY%g``, ``%DLQ%g``) unless it exists; returns its config."""
        return self.ensure_system_topics([topic], queue_nums, perm)[0]

    def ensure_system_topics(self, topics: Iterable[str], queue_nums: int = 1,
                             perm: int = PERM_READ_WRITE) -> builtins.list[TopicConfig]:
        """:meth:`ensure_system_topic` for many at once: the missing ones are written with one table write and
        one notice (a heartbeat naming 1,000 new groups must not rewrite the table 1,000 times)."""
        topics = list(topics)
        for topic in topics:
            validate_topic(topic)
            if not is_reserved_topic(topic):
                raise SparkMQError(ErrorCode.INVALID_ARGUMENT, f"{topic!r} is not a system topic")
        with self._lock:
            configs = [self._topics.get(topic) or TopicConfig(topic, queue_nums, queue_nums, perm) for topic in topics]
            added = {cfg.topic: cfg for cfg in configs if cfg.topic not in self._topics}
            if not added:
                return configs
            self._topics.update(added)
            try:
                self._bump_and_persist()
            except BaseException:
                for topic in added:  # a failed write leaves the table as it was
                    del self._topics[topic]
                self._data_version -= 1
                raise
        self._notify()
        return configs

    def delete(self, topic: str) -> bool:
        """Delete an ordinary topic's config; False when it did not exist; NO_PERMISSION for system topics."""
        validate_topic(topic)
        if is_reserved_topic(topic):
            raise SparkMQError(ErrorCode.NO_PERMISSION, f"{topic!r} is a system topic; the broker manages it")
        with self._lock:
            if topic not in self._topics:
                return False
            old = self._topics.pop(topic)
            try:
                self._bump_and_persist()
            except BaseException:
                self._topics[topic] = old  # a failed write leaves the table as it was
                self._data_version -= 1
                raise
        self._notify()
        return True

    def _put(self, cfg: TopicConfig) -> None:
        with self._lock:
            old = self._topics.get(cfg.topic)
            if old == cfg:
                return  # nothing changed: no new version, no registration
            self._topics[cfg.topic] = cfg
            try:
                self._bump_and_persist()
            except BaseException:
                if old is None:
                    del self._topics[cfg.topic]
                else:
                    self._topics[cfg.topic] = old
                self._data_version -= 1
                raise
        self._notify()

    def _bump_and_persist(self) -> None:
        self._data_version += 1
        self._persist()

    def _persist(self) -> None:
        # Caller holds the lock.  tmp + fsync + rename + dir fsync: the file is the old or the new table.
        if self.path is None:
            return
        data = {"format": _FILE_FORMAT, "data_version": self._data_version,
                "topics": [self._topics[t].to_dict() for t in sorted(self._topics)]}
        try:
            replace_durably(self.path, json.dumps(data, indent=1).encode())
        except OSError as exc:
            raise SparkMQError(ErrorCode.INTERNAL_ERROR, f"cannot write the topic table {self.path}: {exc}") from None

    def _notify(self) -> None:
        version = self._data_version
        for listener in list(self._listeners):
            try:
                listener(version)
            except Exception:  # a listener's bug must not fail the admin call that changed the table
                log.exception("topic table listener failed")
