"""Configuration of one broker, validated once at construction.

A config file has a ``[broker]`` table (the fields of :class:`BrokerConfig`) and a
``[store]`` table (the fields of :class:`~sparkmq.platform.store.StoreConfig`);
:meth:`BrokerConfig.from_mapping` reads both.  Files live under ``data_dir``::

    data_dir/store/               commit log and consume queues (unless [store] root says otherwise)
    data_dir/config/topics.json   the topic table
    data_dir/lake/<table>         Delta tables the broker writes itself (consumer_offsets)

The store writes the broker's *advertised* address (``advertised_addr``, else the
``host:port`` actually bound) into every record and offsetMsgId, so a broker started
with ``port=0`` must know its real port before the store starts: the runner binds
first and then calls :meth:`BrokerConfig.bound_to`.
"""
from __future__ import annotations

import enum
import ipaddress
import logging
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any

from msgspec import Meta

from ..auth.model import check_acl_settings, validate_secret_key
from ..auth.signing import Credentials
from ..common.limits import ConnectionLimits
from ..common.tls import TlsSettings
from ..common.validation import (
    Addr,
    Int32,
    NodeName,
    Port,
    PortOrOff,
    PositiveInt32,
    Seconds,
    TimeoutMs,
    check_addr,
    check_fields,
    split_addr,
    split_addrs,
)
from ..store.config import StoreConfig
from .schedule import parse_delay_levels

__all__ = ["BrokerRole", "BrokerConfig", "DEFAULT_PORT", "DEFAULT_GRPC_PORT"]

log = logging.getLogger("sparkmq.broker")

#: The schedule topic has one queue per level and RocketMQ's 18 queues.
MAX_DELAY_LEVELS = 18
#: RocketMQ's broker port.
DEFAULT_PORT = 10911
#: The gRPC port ``sparkmq dev`` serves by default (RocketMQ 5's proxy port).
DEFAULT_GRPC_PORT = 8081

#: The interface to listen on.
Host = Annotated[str, Meta(pattern=r"^\S+$", description="a host name or IP address (no spaces)")]
_STORE_FIELDS = frozenset(f.name for f in fields(StoreConfig))


class BrokerRole(enum.StrEnum):
    """A broker's replication role (RocketMQ's ``BrokerRole``)."""

    #: Master; a send returns once the master stored it (slaves catch up later).
    ASYNC_MASTER = "ASYNC_MASTER"
    #: Master; a send returns once a slave has it too (else SLAVE_NOT_AVAILABLE / FLUSH_SLAVE_TIMEOUT).
    SYNC_MASTER = "SYNC_MASTER"
    #: Replica of a master; refuses sends.
    SLAVE = "SLAVE"


def _ip_of(host: str) -> str:
    """An IP literal for ``host`` (the store packs IPs, not names)."""
    bare = host.strip("[]")
    try:
        return str(ipaddress.ip_address(bare))
    except ValueError:
        return socket.gethostbyname(bare)


def _local_ip() -> str:
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


@dataclass(frozen=True)
class BrokerConfig:
    """Every setting of one broker; defaults follow RocketMQ's broker defaults.

    A field's limits are part of its type (msgspec ``Meta``, :mod:`sparkmq.platform.common.validation`) and are
    checked at construction; a bad value is a ValueError naming the field and the value.

    Example::

        >>> cfg = BrokerConfig(data_dir="/tmp/b", port=10911)
        >>> cfg.addr, cfg.store_config().root.as_posix()
        ('127.0.0.1:10911', '/tmp/b/store')
    """

    cluster: NodeName = "DefaultCluster"
    broker_name: NodeName = "broker-a"
    #: 0 = master, > 0 = slave.
    broker_id: Int32 = 0
    role: BrokerRole = BrokerRole.ASYNC_MASTER
    #: Interface to listen on; loopback by default so a dev run is never exposed.
    host: Host = "127.0.0.1"
    #: TCP port; 0 lets the OS pick one (the runner binds first, then calls :meth:`bound_to`).
    port: Port = DEFAULT_PORT
    #: ``host:port`` clients and name servers are told; None = the host and port actually bound.
    advertised_addr: Addr | None = None
    #: RocketMQ's remoting protocol (docs/remoting.md) is served on the main port beside HTTP, told apart by the
    #: first byte.  This is an optional extra, dedicated remoting listener: None = none (the default), 0 = a free
    #: port, N = that port; routes then name it.  -1 = serve no remoting at all (HTTP only on the main port).
    remoting_port: PortOrOff | None = None
    #: Port of the RocketMQ 5 gRPC endpoint (``apache.rocketmq.v2.MessagingService``, what the official clients
    #: speak; RocketMQ's proxy uses 8081); None or -1 = serve none; 0 = a free port.
    grpc_port: PortOrOff | None = None
    #: Port of the replication (HA) endpoint a master serves its slaves on; None = HTTP port + 1 (a free
    #: port when ``port`` is 0); 0 = a free port; -1 = none.  Slaves do not listen.
    ha_port: PortOrOff | None = None
    #: A slave's master HA endpoint ``host:port``; None = learned from the name servers (the master registers it).
    ha_master_addr: Addr | None = None
    #: A slave further behind than this is not in sync (RocketMQ's haMaxGapNotInSync, 256 MiB).
    ha_in_sync_max_gap_bytes: Annotated[int, Meta(ge=0, le=2**62)] = 256 << 20
    #: A SYNC_MASTER send answers FLUSH_SLAVE_TIMEOUT when no slave acknowledged it within this long.
    ha_flush_slave_timeout_ms: TimeoutMs = 3000
    #: A slave copies its master's topic table and consumer offsets this often (RocketMQ: 10 s).
    ha_slave_sync_interval_s: Seconds = 10.0
    #: Be a member of a DLedger group (RocketMQ's enableDLegerCommitLog): the commit log is a Raft log, the
    #: elected leader registers as master (id 0), the others as slaves; ``role``/``broker_id`` are ignored.
    dledger_enabled: bool = False
    #: The group's name (RocketMQ's dLegerGroup); None = the broker name.
    dledger_group: NodeName | None = None
    #: This member's id among ``dledger_peers`` (dLegerSelfId).
    dledger_self_id: str = "n0"
    #: Every member, ``id-host:port`` joined by ``;`` (dLegerPeers): where each one's Raft port is reached.
    #: This member listens on the port of its own entry.
    dledger_peers: str = ""
    #: The leader's heartbeat interval; a follower gives up on it after ``dledger_max_missed_heartbeats``.
    dledger_heartbeat_ms: Annotated[int, Meta(ge=10, le=600_000)] = 2000
    dledger_max_missed_heartbeats: Annotated[int, Meta(ge=2, le=100)] = 3
    #: A send the group has not committed within this long answers FLUSH_SLAVE_TIMEOUT (maxWaitAckTimeMs).
    dledger_wait_for_ack_ms: TimeoutMs = 2500
    #: The member that should lead whenever it is healthy and caught up (preferredLeaderId); None = any.
    dledger_preferred_leader: str | None = None
    #: Name servers to register with (every one of them).
    namesrv_addrs: tuple[str, ...] = ()
    #: Root of the broker's files (store, topic table, lake tables).
    data_dir: Path = Path("var/broker")
    #: Register with every name server this often (and at once when the topic table changes).
    register_interval_s: Seconds = 30.0
    #: One registration (or unregistration) HTTP call gives up after this long.
    register_timeout_s: Seconds = 3.0
    #: A client silent this long is dropped from its groups.
    client_expiry_s: Seconds = 120.0
    #: Silent clients are looked for this often.
    client_scan_interval_s: Seconds = 10.0
    #: A pull is held at most this long waiting for messages.
    long_polling_max_ms: Annotated[int, Meta(ge=0, le=3_600_000)] = 15_000
    #: Consumer offsets are written to the consumer_offsets table this often.
    offset_persist_interval_s: Seconds = 5.0
    #: After an offset reset, commits of other offsets are ignored until the group's consumer pulls at the
    #: reset offset, or for at most this long (a consumer's stale commit must not undo the reset).
    offset_reset_fence_s: Seconds = 60.0
    #: A queue lock not renewed for this long is free again.
    queue_lock_expiry_s: Seconds = 60.0
    #: Sends to an unknown (non-system) topic create it.
    auto_create_topic: bool = True
    #: Read and write queues of an auto-created topic.
    default_topic_queue_nums: Annotated[int, Meta(ge=1, le=1024)] = 4
    #: A pull answers at most this many body bytes (always at least one message).
    pull_max_bytes: PositiveInt32 = 16 << 20
    #: A request body (one batch send) may be at most this large.
    max_request_bytes: Annotated[int, Meta(ge=1024, le=2**31 - 1)] = 64 << 20
    #: TLS (docs/security-tls.md): PEM certificate chain and key every port serves with (HTTP, remoting, gRPC,
    #: HA, DLedger); unset = plaintext.
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    #: PEM CAs trusted for the servers this broker connects to (name servers, its master, DLedger peers);
    #: unset = the system's trust store.
    tls_ca_file: str | None = None
    #: Refuse plaintext on every port (RocketMQ's "enforcing"); off, the binary ports take TLS and plaintext.
    tls_required: bool = False
    #: Connect to name servers, the master and peers over TLS; unset = when this broker serves TLS.
    tls_connect: bool | None = None
    #: Check that those servers' certificates name the address connected to.
    tls_check_hostname: bool = True
    #: Limits (docs/security-tls.md, platform/common/limits.py): open connections per source IP on the remoting
    #: and HTTP ports, requests in flight per remoting connection (beyond it the connection is not read), and
    #: HTTP: a request head's deadline, the keep-alive idle timeout, connections + requests served at once.
    max_connections_per_ip: int = ConnectionLimits.max_connections_per_ip
    max_inflight_per_connection: int = ConnectionLimits.max_inflight_per_connection
    http_header_timeout_s: float = ConnectionLimits.http_header_timeout_s
    http_keep_alive_s: float = ConnectionLimits.http_keep_alive_s
    http_max_concurrency: int = ConnectionLimits.http_max_concurrency
    #: Overload (platform/broker/overload.py, RocketMQ's fast failure): a send that waited longer than this in
    #: the broker before being handled is answered SYSTEM_BUSY at once (RocketMQ's waitTimeMillsInSendQueue).
    wait_time_ms_in_send_queue: TimeoutMs = 200
    #: The same for a pull (RocketMQ's waitTimeMillsInPullQueue).
    wait_time_ms_in_pull_queue: TimeoutMs = 5000
    #: While the oldest send waiting for its disk sync has waited this long with no sync answering any, the
    #: disk counts as busy and new sends are answered SYSTEM_BUSY before they are stored (RocketMQ's
    #: osPageCacheBusyTimeOutMills).
    os_page_cache_busy_timeout_ms: TimeoutMs = 1000
    #: Sends stored and waiting for their acknowledgement (disk sync) at most; beyond it SYSTEM_BUSY.
    max_pending_acks: PositiveInt32 = 100_000
    #: Pulls held by long polling at most; a pull that would be held beyond it is answered SYSTEM_BUSY.
    max_held_pulls: PositiveInt32 = 20_000
    #: Bytes of remoting requests read but not answered yet, per connection and per port: a request beyond
    #: either is answered SYSTEM_BUSY at once (one request alone is always taken: max_request_bytes bounds it).
    max_unanswered_bytes_per_connection: int = ConnectionLimits.max_unanswered_bytes_per_connection
    max_unanswered_bytes: int = ConnectionLimits.max_unanswered_bytes
    #: Delay levels (space-separated, ``ms``/``s``/``m``/``h``/``d``); level L parks in schedule queue L-1.
    message_delay_level: str = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
    #: A timer message may be due at most this far ahead (RocketMQ: 3 days).
    timer_max_delay_s: Seconds = 3 * 24 * 3600.0
    #: First check-back of an open transaction after this long (a message's CHECK_IMMUNITY_TIME_IN_SECONDS wins).
    transaction_check_first_s: Seconds = 6.0
    #: Later check-backs this often.
    transaction_check_interval_s: Seconds = 30.0
    #: After this many unanswered check-backs the half message is discarded.
    transaction_check_max: Annotated[int, Meta(ge=1, le=1_000_000)] = 15
    #: Record trace events (store, deliver, retry, DLQ, transaction; clients' send/consume via POST /trace)
    #: into RMQ_SYS_TRACE_TOPIC.  Off: nothing is written there.
    trace_enabled: bool = True
    #: The shortest invisible time a POP receive or ChangeInvisibleDuration may ask for (ms).  RocketMQ's is
    #: 10 s (``POP_MIN_INVISIBLE_MS``); lower it for tests that watch redeliveries.  The maximum is 12 h.
    pop_min_invisible_ms: Annotated[int, Meta(ge=1, le=12 * 3600 * 1000)] = 10_000
    #: Authentication and access control on every entry point (docs/security.md): requests must be signed by a
    #: user whose policies allow them.  Off (the default, and ``sparkmq dev``): anyone may do anything.
    acl_enabled: bool = False
    #: The bootstrap super user (both keys or neither): lets an operator create the first users and policies.
    acl_super_user_access_key: str | None = None
    acl_super_user_secret_key: str | None = field(default=None, repr=False)
    #: A signed request is refused when its timestamp is further than this from the broker's clock (seconds).
    acl_clock_skew_s: Seconds = 300.0
    #: The cluster credential: a shared secret every broker of the cluster is given (6..128 printable characters,
    #: no spaces; use a long random one).  Slaves prove it to their master's HA port and DLedger members to each
    #: other (an HMAC over a fresh nonce and the time, docs/ha.md); with ``acl_enabled`` it is required, and a
    #: connection without it is refused.  Never logged or shown.
    cluster_secret: str | None = field(default=None, repr=False)
    #: A subsystem that keeps failing (trace writing, replication, offset persists, the flush) logs its first
    #: failure, then one summary per this many seconds (platform/common/failure_log.py).  Process-wide, like
    #: the log level: a broker sets it when built.
    log_summary_interval_s: Seconds = 60.0
    #: ``[store]`` settings (fields of StoreConfig except root/store_host, which the broker derives).
    store: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "role", BrokerRole(self.role))
        object.__setattr__(self, "data_dir", Path(self.data_dir))
        object.__setattr__(self, "namesrv_addrs", split_addrs(self.namesrv_addrs))
        for name in ("tls_cert_file", "tls_key_file", "tls_ca_file"):
            if isinstance(getattr(self, name), Path):
                object.__setattr__(self, name, str(getattr(self, name)))
        check_fields(self)  # every limit the fields' types declare (names, ports, addresses, durations, switches)
        # What no single field says:
        if (self.role is BrokerRole.SLAVE) != (self.broker_id > 0):
            raise ValueError(f"role {self.role} does not fit broker_id {self.broker_id} (0 = master, > 0 = slave)")
        if self.dledger_enabled:
            members = self.dledger_members()  # validates the peers and this member's place among them
            if self.dledger_preferred_leader is not None and self.dledger_preferred_leader not in members:
                raise ValueError(f"dledger_preferred_leader {self.dledger_preferred_leader!r} is not in dledger_peers")
        levels = self.delay_levels_ms  # validates
        if len(levels) > MAX_DELAY_LEVELS:
            raise ValueError(f"message_delay_level has {len(levels)} levels; at most {MAX_DELAY_LEVELS} "
                             f"(the schedule topic's queue count)")
        object.__setattr__(self, "_tls", TlsSettings.from_prefixed(self))  # validates the files now
        object.__setattr__(self, "_limits", ConnectionLimits(  # validates the limits now
            self.max_connections_per_ip, self.max_inflight_per_connection, self.http_header_timeout_s,
            self.http_keep_alive_s, self.http_max_concurrency, self.max_unanswered_bytes_per_connection,
            self.max_unanswered_bytes))
        check_acl_settings(self.acl_super_user_access_key, self.acl_super_user_secret_key)
        if self.cluster_secret is not None:
            try:
                validate_secret_key(self.cluster_secret)
            except ValueError as exc:
                raise ValueError(f"cluster_secret: {exc}") from None
        store = dict(self.store)
        unknown = sorted(set(store) - _STORE_FIELDS)
        if unknown:
            raise ValueError(f"unknown store setting(s) {unknown}; known: {sorted(_STORE_FIELDS)}")
        object.__setattr__(self, "store", MappingProxyType(store))
        self.store_config()  # validates the store settings now, not when the store starts

    # -- derived --------------------------------------------------------------------
    @property
    def namesrv_credentials(self) -> Credentials | None:
        """What the broker signs its name-server calls with (registration, heartbeats, gRPC route lookups): the
        bootstrap super user, also when this broker's own ACL is off; None (unsigned) without one."""
        if self.acl_super_user_access_key and self.acl_super_user_secret_key:
            return Credentials(self.acl_super_user_access_key, self.acl_super_user_secret_key)
        return None

    @property
    def addr(self) -> str:
        """The ``host:port`` this broker announces (advertised, else bound; a wildcard host becomes the local IP)."""
        if self.advertised_addr:
            return self.advertised_addr
        host = self.host
        if host in ("0.0.0.0", "::", ""):
            host = _local_ip()
        return f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"

    @property
    def tls(self) -> TlsSettings:
        """The ``tls_*`` settings as one object (what listeners and outgoing connections take)."""
        return self._tls  # type: ignore[attr-defined]  # set in __post_init__

    @property
    def limits(self) -> ConnectionLimits:
        """The connection limits of this broker's ports."""
        return self._limits  # type: ignore[attr-defined]  # set in __post_init__

    @property
    def remoting_enabled(self) -> bool:
        """Whether the broker serves remoting (on its main port, and on :attr:`remoting_bind_port` when set)."""
        return self.remoting_port is None or self.remoting_port >= 0

    @property
    def remoting_bind_port(self) -> int | None:
        """The dedicated remoting listener's port (0 = a free one), None when there is none."""
        return None if self.remoting_port is None or self.remoting_port < 0 else self.remoting_port

    @property
    def grpc_bind_port(self) -> int | None:
        """The port to serve gRPC on (0 = a free one), None when gRPC is off."""
        return None if self.grpc_port is None or self.grpc_port < 0 else self.grpc_port

    @property
    def ha_bind_port(self) -> int | None:
        """The port a master serves replication on (0 = a free one); None on a slave or with HA off."""
        if self.role is BrokerRole.SLAVE or self.dledger_enabled:  # a DLedger member replicates over Raft
            return None
        if self.ha_port is None:
            return 0 if self.port == 0 else self.port + 1
        return None if self.ha_port < 0 else self.ha_port

    def remoting_addr_for(self, bound_port: int) -> str:
        """The remoting ``host:port`` clients are told, on the advertised host."""
        host = self.addr.rpartition(":")[0]
        return f"{host}:{bound_port}"

    def dledger_members(self) -> dict[str, tuple[str, int]]:
        """``dledger_peers`` parsed: member id -> (host, port); ValueError when malformed, with fewer than 3
        members, or without ``dledger_self_id``."""
        members: dict[str, tuple[str, int]] = {}
        for item in (p.strip() for p in self.dledger_peers.split(";") if p.strip()):
            member, sep, addr = item.partition("-")
            if not sep or not member:
                raise ValueError(f"dledger_peers entry {item!r} is not 'id-host:port'")
            check_addr(f"dledger_peers entry {member!r}", addr, ValueError)
            if member in members:
                raise ValueError(f"dledger_peers names {member!r} twice")
            members[member] = split_addr(addr, f"dledger_peers entry {member!r}", ValueError)
        if len(members) < 3:
            raise ValueError(f"a DLedger group has at least 3 members (dledger_peers: {self.dledger_peers!r})")
        if self.dledger_self_id not in members:
            raise ValueError(f"dledger_self_id {self.dledger_self_id!r} is not in dledger_peers {sorted(members)}")
        return members

    @property
    def delay_levels_ms(self) -> tuple[int, ...]:
        """Milliseconds of each delay level (ValueError for a malformed ``message_delay_level``)."""
        if not isinstance(self.message_delay_level, str):
            raise ValueError(f"message_delay_level must be a string, got {self.message_delay_level!r}")
        return parse_delay_levels(self.message_delay_level)

    def progress_path(self, name: str) -> Path:
        """Where a background service persists its progress (``data_dir/config/<name>.json``)."""
        return self.data_dir / "config" / f"{name}.json"

    @property
    def topics_path(self) -> Path:
        """Where the topic table is persisted."""
        return self.data_dir / "config" / "topics.json"

    def lake_table_path(self, table: str) -> Path:
        """The directory of a Delta table the broker writes (``data_dir/lake/<table>``)."""
        return self.data_dir / "lake" / table

    def store_config(self) -> StoreConfig:
        """The store's config: ``[store]`` settings, root ``data_dir/store`` unless set, host = :attr:`addr`.

        A ``store_host`` in the ``[store]`` table is replaced by the advertised address
        (offsetMsgIds must point at the address clients reach this broker on).
        """
        settings = dict(self.store)
        given_host = settings.pop("store_host", None)
        host, _, port = self.addr.rpartition(":")
        store_host = f"{_ip_of(host)}:{port}" if ":" not in host.strip("[]") else self.addr
        if given_host is not None and given_host != store_host and self.port:
            log.info("[store] store_host %s replaced by the broker's address %s", given_host, store_host)
        settings.setdefault("root", self.data_dir / "store")
        return StoreConfig.from_mapping(settings, store_host=store_host)

    def bound_to(self, port: int) -> BrokerConfig:
        """A copy for the port actually bound (what ``port=0`` turned into).

        The port derived from the HTTP port (HA + 1) becomes a free port too when it was 0: the neighbours of a
        port the OS picked may belong to anyone.
        """
        derived: dict[str, Any] = {} if self.port else {n: 0 for n in ("ha_port",) if getattr(self, n) is None}
        return replace(self, port=port, **derived)

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly view (for ``GET /broker`` and logs)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["data_dir"] = str(self.data_dir)
        out["namesrv_addrs"] = list(self.namesrv_addrs)
        out["role"] = str(self.role)
        if out.get("acl_super_user_secret_key"):
            out["acl_super_user_secret_key"] = "***"  # never shown
        if out.get("cluster_secret"):
            out["cluster_secret"] = "***"
        out["store"] = {k: (str(v) if isinstance(v, Path) else v) for k, v in self.store.items()}
        return out

    # -- construction from files ------------------------------------------------------
    @classmethod
    def from_mapping(cls, broker: Mapping[str, Any] | None = None, store: Mapping[str, Any] | None = None,
                     **overrides: Any) -> BrokerConfig:
        """Build from a config file's ``[broker]`` and ``[store]`` tables, then ``overrides``.

        Unknown keys are an error, not ignored.  An override whose value is None is
        skipped (so a CLI can pass every option); an override named like a store
        setting (``flush_mode``, ``segment_size``) goes to the store settings.

        Example::

            >>> BrokerConfig.from_mapping({"broker_name": "b1"}, {"segment_size": 1 << 23},
            ...                           port=0, flush_mode=None).store["segment_size"]
            8388608
        """
        broker_fields = {f.name for f in fields(cls)} - {"store"}
        values = dict(broker or {})
        unknown = sorted(set(values) - broker_fields)
        if unknown:
            raise ValueError(f"unknown broker setting(s) {unknown}; known: {sorted(broker_fields)}")
        store_values = dict(store or {})
        for key, value in overrides.items():
            if value is None:
                continue
            if key in broker_fields:
                values[key] = value
            elif key in _STORE_FIELDS:
                store_values[key] = value
            else:
                raise ValueError(f"unknown setting {key!r}")
        return cls(**values, store=store_values)
