"""The broker's subscription-group configs (RocketMQ's ``SubscriptionGroupManager``).

A consumer group's settings on this broker, as ``mqadmin updateSubGroup`` sets them: whether it may consume at
all, from a slave when slow, by broadcasting, in order; how many retry queues it gets and how often a message is
retried before its dead-letter queue.  A group nobody configured has the defaults (RocketMQ creates such a
config on a group's first heartbeat, ``autoCreateSubscriptionGroup``): :meth:`SubscriptionGroupManager.get`
answers them for any valid group name.

Persisted as JSON in ``data_dir/config/subscription_groups.json`` on every change (temporary file, fsync,
rename, directory fsync: a crash leaves the old or the new table) and reloaded on start.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..common.durable_file import replace_durably
from ..common.errors import ErrorCode, SparkMQError
from ..common.validation import check_int, validate_group

__all__ = ["SubscriptionGroupConfig", "SubscriptionGroupManager", "MAX_RETRY_QUEUE_NUMS", "MAX_RETRY_TIMES"]

log = logging.getLogger("sparkmq.broker")

#: The most retry queues a group may ask for.
MAX_RETRY_QUEUE_NUMS = 1024
#: The most retries a group may ask for before the dead-letter queue.
MAX_RETRY_TIMES = 10_000
_FILE_FORMAT = 1


@dataclass(frozen=True)
class SubscriptionGroupConfig:
    """One consumer group's settings on this broker (RocketMQ's ``SubscriptionGroupConfig``, its defaults).

    Example::

        >>> SubscriptionGroupConfig("orders-consumers").retry_max_times
        16
    """

    group_name: str
    #: False refuses the group's pulls (NO_PERMISSION).
    consume_enable: bool = True
    #: A new group starts from the queue's minimum offset (else its maximum).
    consume_from_min_enable: bool = True
    #: False refuses the group's broadcasting consumption.
    consume_broadcast_enable: bool = True
    consume_message_orderly: bool = False
    #: Queues of the group's ``%RETRY%`` topic.
    retry_queue_nums: int = 1
    #: Retries before a message goes to the group's ``%DLQ%`` topic (when the consumer does not say).
    retry_max_times: int = 16
    #: The broker id to read from (0 = the master) and the one to suggest when consumption is slow.
    broker_id: int = 0
    which_broker_when_consume_slowly: int = 1
    #: Whether members are told of membership changes (NOTIFY_CONSUMER_IDS_CHANGED).
    notify_consumer_ids_changed_enable: bool = True
    group_sys_flag: int = 0
    consume_timeout_minute: int = 15
    attributes: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        validate_group(self.group_name)
        for name in ("consume_enable", "consume_from_min_enable", "consume_broadcast_enable",
                     "consume_message_orderly", "notify_consumer_ids_changed_enable"):
            if not isinstance(getattr(self, name), bool):
                raise SparkMQError(ErrorCode.INVALID_ARGUMENT, f"{name} must be true or false, "
                                                               f"got {getattr(self, name)!r}")
        check_int("retry_queue_nums", self.retry_queue_nums, 0, MAX_RETRY_QUEUE_NUMS)
        check_int("retry_max_times", self.retry_max_times, -1, MAX_RETRY_TIMES)
        check_int("broker_id", self.broker_id, 0, 2**63 - 1)
        check_int("which_broker_when_consume_slowly", self.which_broker_when_consume_slowly, 0, 2**63 - 1)
        check_int("group_sys_flag", self.group_sys_flag, 0, 2**31 - 1)
        check_int("consume_timeout_minute", self.consume_timeout_minute, 0, 2**31 - 1)
        if not isinstance(self.attributes, Mapping) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in self.attributes.items()):
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, "attributes must map strings to strings")
        object.__setattr__(self, "attributes", dict(self.attributes))

    def to_dict(self) -> dict[str, Any]:
        """JSON form (the file's)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SubscriptionGroupConfig:
        """The config of a JSON object (INVALID_ARGUMENT for unknown keys or bad values)."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, f"unknown subscription group keys {sorted(unknown)}")
        return cls(**data)


class SubscriptionGroupManager:
    """Thread-safe subscription-group configs with persistence and a data version (moved by every change)."""

    def __init__(self, path: str | Path | None) -> None:
        """``path`` is the JSON file (None keeps the table in memory only)."""
        self.path = Path(path) if path is not None else None
        self._lock = threading.Lock()
        self._groups: dict[str, SubscriptionGroupConfig] = {}
        self._data_version = 0
        self._version_time_ms = int(time.time() * 1000)

    def load(self) -> int:
        """Read the file (if any); returns how many configs were loaded.  STORE_CORRUPT when it does not parse."""
        if self.path is None or not self.path.exists():
            return 0
        try:
            data = json.loads(self.path.read_text("utf-8"))
            groups = {g["group_name"]: SubscriptionGroupConfig.from_dict(g) for g in data["groups"]}
            version = int(data["data_version"])
        except (OSError, ValueError, KeyError, TypeError, SparkMQError) as exc:
            raise SparkMQError(ErrorCode.STORE_CORRUPT,
                               f"cannot read the subscription groups {self.path}: {exc}") from None
        with self._lock:
            self._groups = groups
            self._data_version = version + 1  # once per restart, as the topic table
        return len(groups)

    @property
    def data_version(self) -> tuple[int, int]:
        """(counter, time in epoch ms of its last move): RocketMQ's ``DataVersion``."""
        with self._lock:
            return self._data_version, self._version_time_ms

    def create_or_update(self, config: SubscriptionGroupConfig) -> SubscriptionGroupConfig:
        """Set a group's config (replacing the one it had); persisted before it is answered."""
        with self._lock:
            old = dict(self._groups)
            self._groups[config.group_name] = config
            try:
                self._bump_and_persist()
            except SparkMQError:
                self._groups = old
                raise
        log.info("subscription group %s set: %s", config.group_name, config.to_dict())
        return config

    def get(self, group: str) -> SubscriptionGroupConfig:
        """The group's config: the one set, else the defaults (GROUP_ILLEGAL for a bad name)."""
        with self._lock:
            found = self._groups.get(group)
        return found if found is not None else SubscriptionGroupConfig(group)

    def configured(self, group: str) -> SubscriptionGroupConfig | None:
        """The config set for ``group``, None when it has the defaults."""
        with self._lock:
            return self._groups.get(group)

    def list(self) -> list[SubscriptionGroupConfig]:
        """Every config set, sorted by group."""
        with self._lock:
            return [self._groups[g] for g in sorted(self._groups)]

    def delete(self, group: str) -> bool:
        """Forget a group's config (back to the defaults); whether it had one."""
        with self._lock:
            if group not in self._groups:
                return False
            old = dict(self._groups)
            del self._groups[group]
            try:
                self._bump_and_persist()
            except SparkMQError:
                self._groups = old
                raise
        log.info("subscription group %s deleted", group)
        return True

    def _bump_and_persist(self) -> None:
        # Caller holds the lock.  tmp + fsync + rename + dir fsync: the file is the old or the new table.
        self._data_version += 1
        self._version_time_ms = int(time.time() * 1000)
        if self.path is None:
            return
        data = {"format": _FILE_FORMAT, "data_version": self._data_version,
                "groups": [self._groups[g].to_dict() for g in sorted(self._groups)]}
        try:
            replace_durably(self.path, json.dumps(data, indent=1).encode())
        except OSError as exc:
            self._data_version -= 1
            raise SparkMQError(ErrorCode.INTERNAL_ERROR, f"cannot write the subscription groups {self.path}: {exc}") \
                from None
