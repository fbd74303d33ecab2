"""What a slave copies from its master besides the log: the topic table and consumer offsets.

RocketMQ's ``SlaveSynchronize``: every ``ha_slave_sync_interval_s`` (10 s) a slave reads its
master's ``GET /broker/ha/sync`` (:meth:`Broker.replication_snapshot`) and makes its own topic table
and consumer offsets match, so consumers that move to the slave while the master is down start from
where the group was (up to one interval behind: they may see duplicates, never gaps).  While the
master cannot be reached, the slave keeps what it has and what consumers commit to it.

With ACL on, the poll is signed with the slave's bootstrap super user (``acl_super_user_access_key`` /
``..._secret_key``): give the master and its slaves the same one (docs/security.md).
"""
from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

import httpx

from ..auth.signing import Credentials, Signer
from ..common.errors import SparkMQError
from ..common.limits import client_pool_limits
from .topics import is_reserved_topic

if TYPE_CHECKING:
    from .broker import Broker

__all__ = ["SlaveSynchronizer"]

log = logging.getLogger("sparkmq.ha")


class SlaveSynchronizer:
    """A daemon thread copying the master's topic table and consumer offsets into a slave broker."""

    def __init__(self, broker: Broker, interval_s: float, timeout_s: float = 3.0) -> None:
        self.broker = broker
        self.interval_s = interval_s
        tls = broker.config.tls  # the master's HTTP port: HTTPS when the cluster speaks TLS
        self._scheme = tls.scheme
        self._client = httpx.Client(timeout=timeout_s, verify=tls.http_verify(),
                                    limits=client_pool_limits())
        cfg = broker.config
        #: Signs the poll when the config names a super user (a master with ACL on refuses it unsigned).
        self._signer = (Signer(Credentials(cfg.acl_super_user_access_key, cfg.acl_super_user_secret_key))
                        if cfg.acl_super_user_access_key and cfg.acl_super_user_secret_key else None)
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self.syncs = 0
        self.last_error: str | None = None

    def start(self) -> None:
        """Start the thread (syncs at once, then every interval)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"sparkmq-slave-sync-{self.broker.name}",
                                            daemon=True)
            self._thread.start()

    def trigger(self) -> None:
        """Sync now (a replicated record named a topic this slave does not know yet)."""
        self._wake.set()

    def stop(self) -> None:
        """Stop the thread."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None
        self._client.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            master = self.broker.master_addr()
            if master is not None:
                try:
                    self.sync_once(master)
                except (httpx.HTTPError, SparkMQError, ValueError) as exc:
                    message = f"{type(exc).__name__}: {exc}"
                    if message != self.last_error:
                        log.info("%s: copying the master's topics and offsets from %s failed: %s",
                                 self.broker.name, master, message)
                    self.last_error = message
            self._wake.wait(self.interval_s if master is not None else 1.0)
            self._wake.clear()

    def sync_once(self, master: str) -> None:
        """Copy the master's topic table and offsets now (raises on a failed read; applies nothing then)."""
        path = "/broker/ha/sync"
        headers = self._signer.http_headers("GET", path, b"") if self._signer is not None else None
        response = self._client.get(f"{self._scheme}://{master}{path}", headers=headers)
        response.raise_for_status()
        snapshot: dict[str, Any] = response.json()
        self._apply_topics(snapshot.get("topics", {}))
        self._apply_offsets(snapshot.get("offsets", {}))
        self.syncs += 1
        self.last_error = None

    def _apply_topics(self, topics: dict[str, dict[str, Any]]) -> None:
        table = self.broker.topics
        for name, cfg in topics.items():
            mine = table.get(name)
            if mine is not None and mine.to_dict() == cfg:
                continue
            if is_reserved_topic(name):
                if mine is None and (name.startswith("%RETRY%") or name.startswith("%DLQ%")):
                    table.ensure_system_topic(name, cfg["read_queue_nums"], cfg["perm"])
                continue  # the broker's own system topics exist on every broker already
            table.create_or_update(name, cfg["read_queue_nums"], cfg["write_queue_nums"], cfg["perm"],
                                   cfg.get("order", False), cfg.get("topic_sys_flag", 0))
        for existing in table.list():
            if existing.topic not in topics and not is_reserved_topic(existing.topic):
                table.delete(existing.topic)

    def _apply_offsets(self, offsets: dict[str, dict[str, dict[str, int]]]) -> None:
        store = self.broker.offsets
        for group, by_topic in offsets.items():
            for topic, by_queue in by_topic.items():
                for queue_id, offset in by_queue.items():
                    store.commit(group, topic, int(queue_id), int(offset))
