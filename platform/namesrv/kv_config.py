"""The name server's key-value configs (RocketMQ's ``KVConfigManager``): values by namespace and key.

RocketMQ clients and tools read and write them over remoting (PUT/GET/DELETE_KV_CONFIG, GET_KVLIST_BY_NAMESPACE):
``ORDER_TOPIC_CONFIG`` holds ordered topics' broker queue counts (``mqadmin updateOrderConf``), and a Java client
asks for a key at start expecting "not found" when nobody set it.  Name servers never share them, as in RocketMQ.

With a ``data_dir`` the table is kept in ``<data_dir>/config/kv_config.json`` (RocketMQ's ``kvConfig.json``
layout, ``{"configTable": {namespace: {key: value}}}``), written whole on every change (temporary file,
fsync, rename, directory fsync: a crash leaves the old or the new table) and read at start; without one it
lives in memory.
"""
from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

from ..common.durable_file import replace_durably
from ..common.errors import ErrorCode, SparkMQError

__all__ = ["KVConfigStore", "kv_config_path", "MAX_KV_NAME_LENGTH", "MAX_KV_VALUE_LENGTH", "MAX_KV_ENTRIES"]

log = logging.getLogger("sparkmq.namesrv")

#: The longest namespace or key (characters).
MAX_KV_NAME_LENGTH = 255
#: The longest value (characters): an order config names every broker of a cluster.
MAX_KV_VALUE_LENGTH = 65_536
#: The most entries over all namespaces: the table is rewritten whole on every change.
MAX_KV_ENTRIES = 100_000


def kv_config_path(data_dir: Path | str) -> Path:
    """Where a name server with ``data_dir`` keeps its KV configs."""
    return Path(data_dir) / "config" / "kv_config.json"


def _check_name(kind: str, value: object) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_KV_NAME_LENGTH:
        raise SparkMQError(ErrorCode.INVALID_ARGUMENT,
                           f"the {kind} must be 1 to {MAX_KV_NAME_LENGTH} characters, got {value!r:.80}")
    return value


class KVConfigStore:
    """Thread-safe KV configs of one name server, persisted when it has a path.

    Example::

        >>> kv = KVConfigStore()
        >>> kv.put("ORDER_TOPIC_CONFIG", "orders", "broker-a:4")
        >>> kv.get("ORDER_TOPIC_CONFIG", "orders"), kv.get("ORDER_TOPIC_CONFIG", "other")
        ('broker-a:4', None)
    """

    def __init__(self, path: Path | str | None = None) -> None:
        """Load ``path`` when it exists (STORE_CORRUPT when it does not parse); None keeps the table in memory."""
        self.path = Path(path) if path is not None else None
        self._lock = threading.Lock()
        self._table: dict[str, dict[str, str]] = {}
        if self.path is not None and self.path.exists():
            self._table = self._load(self.path)

    @staticmethod
    def _load(path: Path) -> dict[str, dict[str, str]]:
        try:
            data = json.loads(path.read_text("utf-8"))
            table = data["configTable"]
            if not isinstance(table, dict) or not all(
                    isinstance(ns, str) and isinstance(kv, dict)
                    and all(isinstance(k, str) and isinstance(v, str) for k, v in kv.items())
                    for ns, kv in table.items()):
                raise ValueError("configTable must map namespaces to string maps")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise SparkMQError(ErrorCode.STORE_CORRUPT, f"cannot read the KV configs {path}: {exc}") from None
        return {ns: dict(kv) for ns, kv in table.items()}

    def put(self, namespace: str, key: str, value: str) -> None:
        """Set ``namespace``/``key`` to ``value`` (INVALID_ARGUMENT for names or values out of bounds)."""
        _check_name("namespace", namespace)
        _check_name("key", key)
        if not isinstance(value, str) or len(value) > MAX_KV_VALUE_LENGTH:
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT,
                               f"the value must be a string of at most {MAX_KV_VALUE_LENGTH} characters")
        with self._lock:
            if self._table.get(namespace, {}).get(key) == value:
                return
            if key not in self._table.get(namespace, {}) and self._count() >= MAX_KV_ENTRIES:
                raise SparkMQError(ErrorCode.INVALID_ARGUMENT, f"the name server holds {MAX_KV_ENTRIES} KV configs, "
                                                               "the most it keeps")
            table = {ns: dict(kv) for ns, kv in self._table.items()}
            table.setdefault(namespace, {})[key] = value
            self._commit(table)
        log.info("KV config %s/%s set", namespace, key)

    def get(self, namespace: str, key: str) -> str | None:
        """The value of ``namespace``/``key``, None when unset."""
        with self._lock:
            return self._table.get(namespace, {}).get(key)

    def delete(self, namespace: str, key: str) -> bool:
        """Remove ``namespace``/``key``; whether it was set (an emptied namespace goes too)."""
        with self._lock:
            if key not in self._table.get(namespace, {}):
                return False
            table = {ns: dict(kv) for ns, kv in self._table.items()}
            del table[namespace][key]
            if not table[namespace]:
                del table[namespace]
            self._commit(table)
        log.info("KV config %s/%s deleted", namespace, key)
        return True

    def namespace(self, namespace: str) -> dict[str, str] | None:
        """Every key and value of ``namespace``; None when it has none."""
        with self._lock:
            kv = self._table.get(namespace)
            return dict(kv) if kv else None

    def _count(self) -> int:
        return sum(len(kv) for kv in self._table.values())

    def _commit(self, table: dict[str, dict[str, str]]) -> None:
        # Caller holds the lock.  Written before it is served: a change that could not be kept is refused.
        if self.path is not None:
            try:
                replace_durably(self.path, json.dumps({"configTable": table}, indent=1, sort_keys=True).encode())
            except OSError as exc:
                raise SparkMQError(ErrorCode.INTERNAL_ERROR,
                                   f"cannot write the KV configs {self.path}: {exc}") from None
        self._table = table
