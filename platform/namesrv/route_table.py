"""The name server's in-memory routing state (RocketMQ's ``RouteInfoManager``).

Four tables, all guarded by one lock:

* clusters: cluster name -> broker names;
* brokers: broker name -> cluster and addresses by broker id (0 = master, > 0 = slaves);
* live brokers: broker address -> identity, HA address, data version, last heartbeat
  (``time.monotonic()``) and the topic configs it last sent;
* topics: topic -> broker name -> :class:`QueueData` (read/write queue counts, perm, sys flag).

Semantics follow RocketMQ 5.3:

* Only a master (broker id 0) defines a broker name's queue data; slaves register too,
  so clients learn their addresses (for reads while the master is down) and HA addresses.
* A registration whose data version equals the one last seen from that address (and whose
  identity is unchanged) only refreshes the heartbeat: topic configs are not re-read.
* A master whose data version changed replaces its broker name's queue data with the topic
  configs it sent; topics it no longer reports lose that broker (RocketMQ's
  ``deleteTopicWithBrokerRegistration``, on here because a broker sends its whole table).
* A broker address silent for longer than the expiry, or unregistered, is removed. When a
  broker name has no address left it leaves its cluster and its queue data leaves every
  topic (a topic served by nobody disappears). When only the master is gone and slaves
  remain, the queue data stays (consumers can still read from the slaves) with the WRITE
  bit cleared, so producers skip that broker name (RocketMQ's acting-master rule).

Perm bits are documented in :mod:`sparkmq.platform.common.perm`.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..common.errors import ErrorCode, SparkMQError
from ..common.perm import PERM_MAX, PERM_WRITE
from ..common.validation import MAX_ROUTE_QUEUE_NUMS, NodeName, check, check_addr, check_int, validate_topic
from .config import NameServerConfig

__all__ = [
    "MASTER_ID",
    "MAX_QUEUE_NUMS",
    "TopicConfig",
    "QueueData",
    "BrokerData",
    "BrokerLiveInfo",
    "BrokerIdentity",
    "TopicRoute",
    "ClusterInfo",
    "RouteTable",
]

log = logging.getLogger("sparkmq.namesrv")

#: Broker id of a master; slaves have ids > 0.
MASTER_ID = 0
#: Upper bound on read/write queue counts a broker may announce (defined with the wire contract's limits).
MAX_QUEUE_NUMS = MAX_ROUTE_QUEUE_NUMS


def _invalid(message: str) -> SparkMQError:
    return SparkMQError(ErrorCode.INVALID_ARGUMENT, message)


@dataclass(frozen=True)
class TopicConfig:
    """The part of a broker's topic config the name server keeps (validated on construction).

    Example::

        >>> TopicConfig(read_queue_nums=8, write_queue_nums=8, perm=6).perm
        6
    """

    read_queue_nums: int = 16
    write_queue_nums: int = 16
    perm: int = 6
    topic_sys_flag: int = 0

    def __post_init__(self) -> None:
        check_int("read_queue_nums", self.read_queue_nums, 0, MAX_QUEUE_NUMS)
        check_int("write_queue_nums", self.write_queue_nums, 0, MAX_QUEUE_NUMS)
        check_int("perm", self.perm, 0, PERM_MAX)
        check_int("topic_sys_flag", self.topic_sys_flag, 0, 2**31 - 1)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TopicConfig:
        """Build from a JSON object; a missing or unknown key is INVALID_ARGUMENT.

        Example::

            >>> TopicConfig.from_dict({"read_queue_nums": 4, "write_queue_nums": 4, "perm": 6}).topic_sys_flag
            0
        """
        if not isinstance(data, Mapping):
            raise _invalid(f"a topic config must be an object, got {data!r}")
        unknown = set(data) - {"read_queue_nums", "write_queue_nums", "perm", "topic_sys_flag"}
        if unknown:
            raise _invalid(f"unknown topic config keys {sorted(unknown)}")
        missing = {"read_queue_nums", "write_queue_nums", "perm"} - set(data)
        if missing:
            raise _invalid(f"the topic config lacks {sorted(missing)}")
        return cls(**data)

    def to_dict(self) -> dict[str, int]:
        """JSON form."""
        return {"read_queue_nums": self.read_queue_nums, "write_queue_nums": self.write_queue_nums,
                "perm": self.perm, "topic_sys_flag": self.topic_sys_flag}


@dataclass(frozen=True)
class QueueData:
    """The queues one broker name serves for one topic (RocketMQ's ``QueueData``)."""

    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    topic_sys_flag: int

    def to_dict(self) -> dict[str, Any]:
        """JSON form.

        Example::

            >>> QueueData("broker-a", 4, 4, 6, 0).to_dict()["perm"]
            6
        """
        return {"broker_name": self.broker_name, "read_queue_nums": self.read_queue_nums,
                "write_queue_nums": self.write_queue_nums, "perm": self.perm, "topic_sys_flag": self.topic_sys_flag}


@dataclass(frozen=True)
class BrokerData:
    """One broker name: its cluster, addresses by broker id (0 = master) and HA addresses by id."""

    cluster: str
    broker_name: str
    broker_addrs: dict[int, str]
    ha_addrs: dict[int, str] = field(default_factory=dict)
    #: The binary remoting endpoint of each broker id (docs/remoting.md), where the broker serves one.
    remoting_addrs: dict[int, str] = field(default_factory=dict)
    #: The RocketMQ 5 gRPC endpoint (``apache.rocketmq.v2.MessagingService``) of each broker id that serves one.
    grpc_addrs: dict[int, str] = field(default_factory=dict)

    @property
    def master_addr(self) -> str | None:
        """The master's address, or None while the broker name has no live master."""
        return self.broker_addrs.get(MASTER_ID)

    def to_dict(self) -> dict[str, Any]:
        """JSON form; broker ids become string keys (JSON objects have string keys).

        Example::

            >>> BrokerData("c", "broker-a", {0: "127.0.0.1:10911"}).to_dict()["broker_addrs"]
            {'0': '127.0.0.1:10911'}
        """
        return {"cluster": self.cluster, "broker_name": self.broker_name,
                "broker_addrs": {str(i): a for i, a in sorted(self.broker_addrs.items())},
                "ha_addrs": {str(i): a for i, a in sorted(self.ha_addrs.items())},
                "remoting_addrs": {str(i): a for i, a in sorted(self.remoting_addrs.items())},
                "grpc_addrs": {str(i): a for i, a in sorted(self.grpc_addrs.items())}}


@dataclass(frozen=True)
class BrokerIdentity:
    """Which broker an address belonged to; what :meth:`RouteTable.scan_expired` reports."""

    cluster: str
    broker_name: str
    broker_id: int
    broker_addr: str

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {"cluster": self.cluster, "broker_name": self.broker_name, "broker_id": self.broker_id,
                "broker_addr": self.broker_addr}


@dataclass(frozen=True)
class BrokerLiveInfo:
    """A snapshot of one live broker address (RocketMQ's ``BrokerLiveInfo``)."""

    broker_addr: str
    cluster: str
    broker_name: str
    broker_id: int
    ha_addr: str | None
    data_version: int
    #: Seconds since the last registration, at the time of the snapshot.
    last_heartbeat_age_s: float
    topic_count: int
    remoting_addr: str | None = None
    grpc_addr: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {"broker_addr": self.broker_addr, "cluster": self.cluster, "broker_name": self.broker_name,
                "broker_id": self.broker_id, "ha_addr": self.ha_addr, "remoting_addr": self.remoting_addr,
                "grpc_addr": self.grpc_addr,
                "data_version": self.data_version,
                "last_heartbeat_age_s": round(self.last_heartbeat_age_s, 3), "topic_count": self.topic_count}


@dataclass(frozen=True)
class TopicRoute:
    """What a client needs to reach a topic: queue data per broker name and those brokers' addresses."""

    queue_datas: list[QueueData]
    broker_datas: list[BrokerData]

    def to_dict(self) -> dict[str, Any]:
        """JSON form.

        Example::

            >>> TopicRoute([], []).to_dict()
            {'queue_datas': [], 'broker_datas': []}
        """
        return {"queue_datas": [q.to_dict() for q in self.queue_datas],
                "broker_datas": [b.to_dict() for b in self.broker_datas]}


@dataclass(frozen=True)
class ClusterInfo:
    """The cluster view: cluster -> broker names, broker name -> broker data, live addresses."""

    clusters: dict[str, list[str]]
    brokers: dict[str, BrokerData]
    live_brokers: dict[str, BrokerLiveInfo]

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {"clusters": self.clusters,
                "brokers": {n: b.to_dict() for n, b in self.brokers.items()},
                "live_brokers": {a: b.to_dict() for a, b in self.live_brokers.items()}}


@dataclass
class _Live:
    # Mutable per-address record; only ever touched under the table's lock.
    cluster: str
    broker_name: str
    broker_id: int
    ha_addr: str | None
    data_version: int
    last_update: float
    topic_configs: dict[str, TopicConfig]
    remoting_addr: str | None = None
    #: A DLedger member's term (0 otherwise): a master is never displaced by one of a lower epoch.
    epoch: int = 0
    grpc_addr: str | None = None


@dataclass
class _Broker:
    cluster: str
    addrs: dict[int, str]


class RouteTable:
    """Thread-safe routing state of one name server.

    Example::

        >>> table = RouteTable()
        >>> table.register_broker("DefaultCluster", "broker-a", 0, "127.0.0.1:10911", "127.0.0.1:10912", 1,
        ...                       {"TopicA": TopicConfig(4, 4, 6)})
        True
        >>> [q.write_queue_nums for q in table.topic_route("TopicA").queue_datas]
        [4]
    """

    def __init__(self, config: NameServerConfig | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        """``config`` gives the broker expiry; ``clock`` (monotonic seconds) is replaceable for tests."""
        self.config = config or NameServerConfig()
        self._clock = clock
        self._lock = threading.RLock()
        self._clusters: dict[str, set[str]] = {}
        self._brokers: dict[str, _Broker] = {}
        self._live: dict[str, _Live] = {}
        self._topics: dict[str, dict[str, QueueData]] = {}

    # -- registration -------------------------------------------------------------------

    def register_broker(self, cluster: str, broker_name: str, broker_id: int, broker_addr: str,
                        ha_addr: str | None, data_version: int,
                        topic_configs: Mapping[str, TopicConfig] | None = None, *,
                        remoting_addr: str | None = None, epoch: int = 0, now: float | None = None,
                        grpc_addr: str | None = None) -> bool:
        """Record a broker's heartbeat and, if its data version changed, its topics.

        Returns False when the registration was a plain heartbeat (same address, identity
        and data version: only the heartbeat time is refreshed), True otherwise. Every argument is
        validated before anything changes: a bad name or value raises INVALID_ARGUMENT,
        a bad topic name TOPIC_ILLEGAL, and the table is left as it was.  ``epoch`` is a DLedger
        member's term: registering as master (id 0) while another live address is master with a higher
        epoch raises STALE_EPOCH (a deposed leader that woke up late) and changes nothing.

        Example::

            >>> t = RouteTable()
            >>> t.register_broker("C", "b", 0, "127.0.0.1:10911", None, 7, {"T": TopicConfig()})
            True
            >>> t.register_broker("C", "b", 0, "127.0.0.1:10911", None, 7, {"T": TopicConfig()})
            False
        """
        check("the cluster", cluster, NodeName)
        check("the broker name", broker_name, NodeName)
        check_int("broker_id", broker_id, 0)
        check_addr("the broker address", broker_addr)
        if ha_addr is not None and ha_addr != "":
            check_addr("the HA address", ha_addr)
        ha = ha_addr or None
        if remoting_addr is not None and remoting_addr != "":
            check_addr("the remoting address", remoting_addr)
        remoting = remoting_addr or None
        if grpc_addr is not None and grpc_addr != "":
            check_addr("the gRPC address", grpc_addr)
        grpc = grpc_addr or None
        check_int("data_version", data_version, 0)
        check_int("epoch", epoch, 0)
        configs = dict(topic_configs or {})
        for topic, topic_config in configs.items():
            validate_topic(topic)
            if not isinstance(topic_config, TopicConfig):
                raise _invalid(f"the config of topic {topic!r} must be a TopicConfig, got {topic_config!r}")
        when = self._clock() if now is None else now

        with self._lock:
            live = self._live.get(broker_addr)
            same_identity = live is not None and (
                live.cluster, live.broker_name, live.broker_id, live.ha_addr, live.remoting_addr, live.epoch,
                live.grpc_addr) == (cluster, broker_name, broker_id, ha, remoting, epoch, grpc)
            if same_identity and live is not None and live.data_version == data_version:
                live.last_update = when  # a plain heartbeat
                return False

            # New address, new identity or new data version: the registration is news.
            if broker_id == MASTER_ID:
                self._check_epoch(broker_name, broker_addr, epoch)
            self._place_address(cluster, broker_name, broker_id, broker_addr)
            self._live[broker_addr] = _Live(cluster, broker_name, broker_id, ha, data_version, when, configs,
                                            remoting, epoch, grpc)
            if broker_id == MASTER_ID:
                self._replace_queue_datas(broker_name, configs)
            log.info("registered broker %s/%s id=%d at %s (data version %d, %d topics)",
                     cluster, broker_name, broker_id, broker_addr, data_version, len(configs))
            return True

    def _check_epoch(self, broker_name: str, broker_addr: str, epoch: int) -> None:
        # Caller holds the lock.
        entry = self._brokers.get(broker_name)
        current = entry.addrs.get(MASTER_ID) if entry is not None else None
        holder = self._live.get(current) if current is not None and current != broker_addr else None
        if holder is not None and holder.epoch > epoch:
            raise SparkMQError(ErrorCode.STALE_EPOCH,
                               f"{broker_addr} registers as master of {broker_name} in epoch {epoch}, but {current} "
                               f"is its master in epoch {holder.epoch}")

    def _place_address(self, cluster: str, broker_name: str, broker_id: int, broker_addr: str) -> None:
        """Put ``broker_addr`` at (broker_name, broker_id) in the cluster and broker tables."""
        # An address belongs to exactly one (broker name, id): a slave promoted to master
        # re-registers as id 0 with the same address, so drop its old slot first.
        old = self._live.get(broker_addr)
        if old is not None and (old.broker_name, old.broker_id, old.cluster) != (broker_name, broker_id, cluster):
            self._remove_address(broker_addr)
        entry = self._brokers.get(broker_name)
        if entry is None:
            entry = self._brokers[broker_name] = _Broker(cluster, {})
        elif entry.cluster != cluster:
            # The latest registration decides a broker name's cluster.
            self._discard_from_cluster(entry.cluster, broker_name)
            entry.cluster = cluster
        self._clusters.setdefault(cluster, set()).add(broker_name)
        displaced = entry.addrs.get(broker_id)
        entry.addrs[broker_id] = broker_addr
        if displaced is not None and displaced != broker_addr:
            # Another address held this id; it no longer serves this broker name.
            self._live.pop(displaced, None)

    def _replace_queue_datas(self, broker_name: str, configs: dict[str, TopicConfig]) -> None:
        # The master's topic table is the truth for its broker name: drop what it no longer reports.
        for topic, queue_map in list(self._topics.items()):
            if topic not in configs and queue_map.pop(broker_name, None) is not None and not queue_map:
                del self._topics[topic]
        for topic, cfg in configs.items():
            self._topics.setdefault(topic, {})[broker_name] = QueueData(
                broker_name, cfg.read_queue_nums, cfg.write_queue_nums, cfg.perm, cfg.topic_sys_flag)

    # -- removal ---------------------------------------------------------------------------

    def unregister_broker(self, cluster: str, broker_name: str, broker_id: int, broker_addr: str) -> bool:
        """Remove a broker address that is shutting down; returns whether it was registered as given.

        A request whose cluster, name or id do not match what that address registered
        changes nothing (a stale unregister must not remove a re-registered broker).
        """
        check("the cluster", cluster, NodeName)
        check("the broker name", broker_name, NodeName)
        check_int("broker_id", broker_id, 0)
        check_addr("the broker address", broker_addr)
        with self._lock:
            live = self._live.get(broker_addr)
            if live is None or (live.cluster, live.broker_name, live.broker_id) != (cluster, broker_name, broker_id):
                return False
            self._remove_address(broker_addr)
            log.info("unregistered broker %s/%s id=%d at %s", cluster, broker_name, broker_id, broker_addr)
            return True

    def scan_expired(self, now: float | None = None) -> list[BrokerIdentity]:
        """Remove every broker address silent for longer than the expiry; returns what was removed.

        Example::

            >>> t = RouteTable(NameServerConfig(broker_expiry_s=120))
            >>> _ = t.register_broker("C", "b", 0, "127.0.0.1:10911", None, 1, now=0.0)
            >>> [b.broker_name for b in t.scan_expired(now=121.0)]
            ['b']
        """
        when = self._clock() if now is None else now
        expiry = self.config.broker_expiry_s
        removed: list[BrokerIdentity] = []
        with self._lock:
            for addr, live in sorted(self._live.items()):
                if when - live.last_update > expiry:
                    removed.append(BrokerIdentity(live.cluster, live.broker_name, live.broker_id, addr))
                    self._remove_address(addr)
                    log.warning("broker %s/%s id=%d at %s silent for %.1f s > %.1f s: removed", live.cluster,
                                live.broker_name, live.broker_id, addr, when - live.last_update, expiry)
        return removed

    def _remove_address(self, broker_addr: str) -> None:
        # Caller holds the lock.
        live = self._live.pop(broker_addr, None)
        if live is None:
            return
        entry = self._brokers.get(live.broker_name)
        if entry is None:
            return
        lost_master = entry.addrs.get(MASTER_ID) == broker_addr
        for broker_id in [i for i, a in entry.addrs.items() if a == broker_addr]:
            del entry.addrs[broker_id]
        if not entry.addrs:
            del self._brokers[live.broker_name]
            self._discard_from_cluster(entry.cluster, live.broker_name)
            for topic, queue_map in list(self._topics.items()):
                if queue_map.pop(live.broker_name, None) is not None and not queue_map:
                    del self._topics[topic]
        elif lost_master:
            # Slaves still serve reads; clear WRITE so producers skip a broker name without a master.
            for queue_map in self._topics.values():
                qd = queue_map.get(live.broker_name)
                if qd is not None and qd.perm & PERM_WRITE:
                    queue_map[live.broker_name] = QueueData(qd.broker_name, qd.read_queue_nums, qd.write_queue_nums,
                                                            qd.perm & ~PERM_WRITE, qd.topic_sys_flag)

    def _discard_from_cluster(self, cluster: str, broker_name: str) -> None:
        names = self._clusters.get(cluster)
        if names is not None:
            names.discard(broker_name)
            if not names:
                del self._clusters[cluster]

    def delete_topic(self, topic: str, cluster: str | None = None) -> bool:
        """Forget a topic (only its brokers in ``cluster`` if given); returns whether anything was removed.

        Like RocketMQ, a broker re-adds the topic when it next registers with a new data version.
        """
        validate_topic(topic)
        if cluster is not None:
            check("the cluster", cluster, NodeName)
        with self._lock:
            queue_map = self._topics.get(topic)
            if queue_map is None:
                return False
            if cluster is None:
                del self._topics[topic]
                return True
            names = self._clusters.get(cluster, set())
            doomed = [n for n in queue_map if n in names]
            for name in doomed:
                del queue_map[name]
            if not queue_map:
                del self._topics[topic]
            return bool(doomed)

    # -- queries ---------------------------------------------------------------------------

    def topic_route(self, topic: str) -> TopicRoute | None:
        """The route of ``topic``, or None if no live broker serves it (TOPIC_ILLEGAL for a bad name).

        Queue datas and broker datas are sorted by broker name so every name server
        answers the same bytes for the same state.
        """
        validate_topic(topic)
        with self._lock:
            queue_map = self._topics.get(topic)
            if not queue_map:
                return None
            queue_datas = [queue_map[n] for n in sorted(queue_map)]
            broker_datas = [self._broker_data(n) for n in sorted(queue_map) if n in self._brokers]
        if not broker_datas:
            return None
        return TopicRoute(queue_datas, broker_datas)

    def _broker_data(self, broker_name: str) -> BrokerData:
        entry = self._brokers[broker_name]
        addrs = dict(sorted(entry.addrs.items()))
        ha = {i: live.ha_addr for i, a in addrs.items() if (live := self._live.get(a)) and live.ha_addr}
        remoting = {i: live.remoting_addr for i, a in addrs.items()
                    if (live := self._live.get(a)) and live.remoting_addr}
        grpc = {i: live.grpc_addr for i, a in addrs.items() if (live := self._live.get(a)) and live.grpc_addr}
        return BrokerData(entry.cluster, broker_name, addrs, ha, remoting, grpc)

    def broker_data(self, broker_name: str) -> BrokerData | None:
        """The addresses of one broker name (None if unknown); slaves use it to find their master."""
        with self._lock:
            return self._broker_data(broker_name) if broker_name in self._brokers else None

    def cluster_info(self, now: float | None = None) -> ClusterInfo:
        """A snapshot of clusters, broker names and live broker addresses."""
        when = self._clock() if now is None else now
        with self._lock:
            clusters = {c: sorted(names) for c, names in sorted(self._clusters.items())}
            brokers = {n: self._broker_data(n) for n in sorted(self._brokers)}
            live = {a: BrokerLiveInfo(a, v.cluster, v.broker_name, v.broker_id, v.ha_addr, v.data_version,
                                      max(0.0, when - v.last_update), len(v.topic_configs), v.remoting_addr,
                                      v.grpc_addr)
                    for a, v in sorted(self._live.items())}
        return ClusterInfo(clusters, brokers, live)

    def topic_list(self) -> list[str]:
        """Every topic some live broker serves, sorted."""
        with self._lock:
            return sorted(self._topics)

    def topics_of_cluster(self, cluster: str) -> list[str]:
        """Every topic served by a broker name of ``cluster``, sorted (none for an unknown cluster)."""
        with self._lock:
            names = self._clusters.get(cluster, set())
            return sorted(t for t, queue_map in self._topics.items() if names.intersection(queue_map))

    def system_topic_list(self) -> tuple[list[str], str | None]:
        """RocketMQ's "system topics" of a name server: every cluster name and broker name (each broker name is a
        topic a broker serves on itself), and the address of one broker to ask about them."""
        with self._lock:
            names = [n for cluster, brokers in sorted(self._clusters.items()) for n in (cluster, *sorted(brokers))]
            addr = next((a for _n, b in sorted(self._brokers.items()) for _i, a in sorted(b.addrs.items())), None)
        return names, addr
