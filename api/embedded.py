"""The embedded default: a name server and a broker (with its gateway endpoints) in one process.

``sparkmq dev`` and the notebooks use :class:`EmbeddedPlatform`: it runs both services in
one asyncio loop on a background thread, so the caller's thread stays free for a demo,
a notebook cell or a test::

    with EmbeddedPlatform.from_toml("conf/single-node.toml", data_dir="var/dev") as platform:
        producer = Producer("demo", ClientConfig(namesrv_addrs=platform.namesrv_addr))
        ...

Every setting comes from one TOML file (``[namesrv]``, ``[broker]``, ``[store]``) plus
overrides; the broker always registers with the embedded name server.  With ``ha="async"`` or
``ha="sync"`` the broker is an ASYNC_MASTER or SYNC_MASTER and a slave of it (broker id 1, files
under ``<data_dir>/slave``, free ports) runs in the same loop: master/slave replication to try in one
command (``sparkmq dev --ha sync``).  With ``ha="dledger"`` three brokers of one DLedger group (members n0,
n1, n2, files under ``<data_dir>/<member>``, n0 on the broker port, the others and every Raft port free
ones) run in the loop: whichever is elected registers as master (``sparkmq dev --ha dledger``), and
:meth:`EmbeddedPlatform.stop_member` stops one while the others go on.

Access control is off unless the ``[broker]`` table turns it on (``acl_enabled = true`` with the bootstrap super
user ``acl_super_user_access_key`` / ``acl_super_user_secret_key``, as for a broker of its own): then it is on for
every embedded service -- the name server follows the broker's ``acl_*`` settings unless ``[namesrv]`` gives its
own (its ACL under ``<data_dir>/namesrv``), the lake signs with the super user unless ``[lake]`` names a user, and
an embedded HA pair or DLedger group gets a random ``cluster_secret`` unless the file sets one (docs/security.md).
"""
from __future__ import annotations

import asyncio
import secrets
import socket
import threading
import time
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..pipelines.lake_service import LakeSettings
from ..platform.auth import Credentials
from ..platform.broker.config import DEFAULT_GRPC_PORT, DEFAULT_PORT, BrokerConfig
from ..platform.namesrv import NameServerConfig, RouteTable
from .broker_main import BrokerService
from .namesrv_main import serve_on as serve_namesrv
from .serving import Server, bind_socket, run_service

__all__ = ["EmbeddedPlatform", "DLEDGER_MEMBERS"]

#: The ``[broker]`` settings the embedded name server takes over unless ``[namesrv]`` sets them: one key turns
#: access control on for the whole platform, and the broker signs its registrations with that super user.
_SHARED_ACL_KEYS = ("acl_enabled", "acl_super_user_access_key", "acl_super_user_secret_key", "acl_clock_skew_s")
_NAMESRV_KEYS = {"host", "port", "broker_expiry_s", "scan_interval_s", "data_dir", *_SHARED_ACL_KEYS}
#: Commit-log segment size of the embedded default (conf/single-node.toml says the same).
EMBEDDED_SEGMENT_SIZE = 64 << 20
#: The member ids of the embedded DLedger group (``ha="dledger"``).
DLEDGER_MEMBERS = ("n0", "n1", "n2")
#: The embedded group's heartbeat unless the settings give one: its members share a process and a loop,
#: so a leader is elected in about 2 s instead of the 6 s the production default (2 s) takes.
EMBEDDED_DLEDGER_HEARTBEAT_MS = 500
_HA_MODES = (None, "async", "sync", "dledger")


class EmbeddedPlatform:
    """A name server + broker pair in this process; :meth:`start` returns once both accept connections."""

    def __init__(self, namesrv: Mapping[str, Any] | None = None, broker: Mapping[str, Any] | None = None,
                 store: Mapping[str, Any] | None = None, lake: Mapping[str, Any] | None = None, *,
                 log_level: str = "warning", ha: str | None = None) -> None:
        """Settings as in the TOML tables; ValueError for unknown or bad ones.  The lake is off
        unless ``lake`` says ``enabled = true`` (``sparkmq dev`` turns it on).  ``ha``: None, "async"
        or "sync" (a master of that kind and its slave), or "dledger" (a group of three; the lake, when on,
        runs beside member n0)."""
        if ha not in _HA_MODES:
            raise ValueError(f"ha must be async, sync or dledger, got {ha!r}")
        self.ha = ha
        namesrv = dict(namesrv or {})
        unknown = set(namesrv) - _NAMESRV_KEYS
        if unknown:
            raise ValueError(f"unknown [namesrv] settings {sorted(unknown)}; known: {sorted(_NAMESRV_KEYS)}")
        self._broker_settings = dict(broker or {})
        self._store_settings = dict(store or {})
        # Validated here, not in the services' thread.
        broker_config = BrokerConfig.from_mapping(self._broker_settings, self._store_settings)
        #: Whether the embedded broker refuses unsigned and unpermitted requests (and so, unless ``[namesrv]``
        #: says otherwise, the name server).
        self.acl_enabled = broker_config.acl_enabled
        #: The ``[broker]`` table's bootstrap super user (None without one): what the demo signs with, and the
        #: only user of the embedded services until it creates others (``sparkmq admin user create``).
        self.credentials: Credentials | None = broker_config.namesrv_credentials
        lake = dict(lake or {})
        if self.acl_enabled:
            self._share_acl(broker_config, namesrv, lake)
        self.lake_settings = LakeSettings.from_mapping(lake)
        self.namesrv_config = NameServerConfig(**namesrv)
        self.log_level = log_level
        self.namesrv_addr = ""
        self.broker_addr = ""
        self.broker_service: BrokerService | None = None
        #: The slave with ``ha`` async or sync.
        self.slave_service: BrokerService | None = None
        #: Every member of the group by id with ``ha="dledger"`` (n0 is :attr:`broker_service`).
        self.member_services: dict[str, BrokerService] = {}
        #: The Raft ports' placeholders (bound, not listening) until the members listen on them: a port merely
        #: found free could be taken by any other process (an outgoing connection's local port) in between.
        self._raft_port_holds: list[socket.socket] = []
        #: The embedded name server's table (read by :meth:`leader`).
        self.route_table = RouteTable(self.namesrv_config)
        self._tasks: dict[BrokerService, asyncio.Task[bool]] = {}
        #: Members stopped on purpose (:meth:`stop_member`): their ending does not stop the platform.
        self._released: set[BrokerService] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._namesrv_server: Server | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    def _share_acl(self, broker: BrokerConfig, namesrv: dict[str, Any], lake: dict[str, Any]) -> None:
        """ACL is on at the broker: turn it on for the other embedded services too (``namesrv`` and ``lake``, the
        tables, are filled in), each with the broker's bootstrap super user unless its own table says otherwise."""
        credentials = broker.namesrv_credentials
        if credentials is None:
            raise ValueError("acl_enabled in sparkmq dev needs acl_super_user_access_key and acl_super_user_secret_key:"
                             " the embedded services, the demo and the lake sign with that bootstrap super user")
        for key in _SHARED_ACL_KEYS:
            if key in self._broker_settings:
                namesrv.setdefault(key, self._broker_settings[key])
        namesrv.setdefault("data_dir", str(broker.data_dir / "namesrv"))
        if "access_key" not in lake and "secret_key" not in lake:
            lake.update(access_key=credentials.access_key, secret_key=credentials.secret_key)
        if self.ha is not None and not broker.cluster_secret:
            # The brokers of one process prove membership to each other (HA, Raft): nobody else needs this secret.
            self._broker_settings["cluster_secret"] = secrets.token_urlsafe(24)

    @classmethod
    def from_toml(cls, path: str | Path | None, *, data_dir: str | Path | None = None,
                  namesrv_port: int | None = None, broker_port: int | None = None, lake: bool | None = None,
                  ha: str | None = None, **broker_overrides: Any) -> EmbeddedPlatform:
        """Settings from a TOML file (None = defaults), with the usual overrides on top (``lake``: on/off)."""
        data: dict[str, Any] = tomllib.loads(Path(path).read_text("utf-8")) if path is not None else {}
        lake_table = dict(data.get("lake", {}))
        if lake is not None:
            lake_table["enabled"] = lake
        namesrv = dict(data.get("namesrv", {}))
        broker = dict(data.get("broker", {}))
        if namesrv_port is not None:
            namesrv["port"] = namesrv_port
        if broker_port is not None:
            broker["port"] = broker_port
        if data_dir is not None:
            broker["data_dir"] = str(data_dir)
        broker.update({k: v for k, v in broker_overrides.items() if v is not None})
        if "alerts" in data:
            lake_table["alerts"] = data["alerts"]
        store = dict(data.get("store", {}))
        # One machine: 64 MiB segments unless the file says otherwise (1 GiB is allocated up front).
        store.setdefault("segment_size", EMBEDDED_SEGMENT_SIZE)
        return cls(namesrv, broker, store, lake_table, ha=ha)

    # -- lifecycle ----------------------------------------------------------------------
    def start(self, timeout: float = 60.0) -> EmbeddedPlatform:
        """Start both services; returns once they accept connections (raises what stopped them)."""
        namesrv_sock = bind_socket(self.namesrv_config.host, self.namesrv_config.port)
        host, port = namesrv_sock.getsockname()[:2]
        self.namesrv_addr = f"{host}:{port}"
        settings = {**self._broker_settings, "namesrv_addrs": [self.namesrv_addr]}
        # The official RocketMQ 5 clients' endpoint, served by default: 8081 beside the default ports, else a free one.
        settings.setdefault("grpc_port", DEFAULT_GRPC_PORT if settings.get("port", DEFAULT_PORT) else 0)
        if self.ha in ("async", "sync"):
            settings["role"] = "SYNC_MASTER" if self.ha == "sync" else "ASYNC_MASTER"
        try:
            if self.ha == "dledger":
                for member, cfg in self._member_configs(settings).items():
                    self.member_services[member] = BrokerService(cfg, self.lake_settings if member == "n0" else None)
                self.broker_service = self.member_services["n0"]
            else:
                config = BrokerConfig.from_mapping(settings, self._store_settings)
                self.broker_service = BrokerService(config, self.lake_settings)
            if self.ha in ("async", "sync"):
                slave = BrokerConfig.from_mapping(
                    {**settings, "role": "SLAVE", "broker_id": 1, "port": 0, "grpc_port": -1,
                     "data_dir": str(config.data_dir / "slave")}, self._store_settings)
                self.slave_service = BrokerService(slave)
        except BaseException:
            namesrv_sock.close()
            self._release_raft_ports()
            for service in self._brokers():
                service.sock.close()
            raise
        self.broker_addr = self.broker_service.config.addr
        self._thread = threading.Thread(target=self._run, args=(namesrv_sock,), name="sparkmq-embedded",
                                        daemon=True)
        self._thread.start()
        ready = self._ready.wait(timeout)
        self._release_raft_ports()
        if not ready:
            self.stop()
            raise TimeoutError(f"the embedded platform did not start within {timeout} s")
        if self._error is not None:
            raise self._error
        return self

    def _member_configs(self, settings: Mapping[str, Any]) -> dict[str, BrokerConfig]:
        """The three members' configs: one group (the broker name), Raft ports picked free now."""
        base = BrokerConfig.from_mapping(settings, self._store_settings)
        self._raft_port_holds = [bind_socket(base.host, 0) for _ in DLEDGER_MEMBERS]
        for hold in self._raft_port_holds:
            hold.set_inheritable(False)  # a process started meanwhile must not keep the port
        raft_ports = {member: int(hold.getsockname()[1])
                      for member, hold in zip(DLEDGER_MEMBERS, self._raft_port_holds, strict=True)}
        peers = ";".join(f"{member}-{base.host}:{port}" for member, port in raft_ports.items())
        configs = {}
        for member in DLEDGER_MEMBERS:
            own = {"dledger_enabled": True, "dledger_self_id": member, "dledger_peers": peers,
                   "data_dir": str(base.data_dir / member)}
            if member != "n0":  # n0 answers on the broker port the caller chose; the others anywhere
                own.update(port=0, grpc_port=0)
            configs[member] = BrokerConfig.from_mapping(
                {"dledger_heartbeat_ms": EMBEDDED_DLEDGER_HEARTBEAT_MS, **settings, **own}, self._store_settings)
        return configs

    def _release_raft_ports(self) -> None:
        """Close the Raft ports' placeholders (the members listen on the ports with SO_REUSEADDR beside them)."""
        for hold in self._raft_port_holds:
            hold.close()
        self._raft_port_holds = []

    def _brokers(self) -> list[BrokerService]:
        """Every broker service built (the master or n0 first)."""
        if self.member_services:
            return list(self.member_services.values())
        return [s for s in (self.broker_service, self.slave_service) if s is not None]

    def _run(self, namesrv_sock: Any) -> None:
        try:
            run_service(self._serve(namesrv_sock))
        except BaseException as exc:  # surfaced to start() / stop()
            self._error = exc
        finally:
            self._ready.set()

    async def _serve(self, namesrv_sock: Any) -> None:
        self._loop = asyncio.get_running_loop()
        services = self._brokers()
        started = {"namesrv": False, **{f"broker-{i}": False for i in range(len(services))}}

        def ready(kind: str) -> Any:
            def on_ready(_host: str, _port: int) -> None:
                started[kind] = True
                if all(started.values()):
                    self._ready.set()
            return on_ready

        def keep_server(server: Server) -> None:
            self._namesrv_server = server

        namesrv = asyncio.create_task(serve_namesrv(self.namesrv_config, namesrv_sock, self.route_table,
                                                    ready("namesrv"), handle_signals=False, log_level=self.log_level,
                                                    server_ready=keep_server))
        self._tasks = {service: asyncio.create_task(service.serve(
            log_level=self.log_level, on_ready=ready(f"broker-{i}"), handle_signals=False, on_remoting=None,
            on_grpc=None))
            for i, service in enumerate(services)}
        brokers = set(self._tasks.values())
        pending: set[asyncio.Task[Any]] = {namesrv, *brokers}
        while True:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            # A member stopped on purpose leaves the others running; any other one stopping (asked to, or
            # failed) stops the rest: they are one platform.
            if not pending or not all(self._was_released(task) for task in done):
                break
        # The brokers go first, so they can still unregister from the name server.
        self._request_stop()
        await asyncio.gather(*brokers, return_exceptions=True)
        if self._namesrv_server is not None:
            self._namesrv_server.should_exit = True
        await asyncio.gather(namesrv, return_exceptions=True)
        for task in done:
            if task.exception() is not None:
                raise task.exception()  # type: ignore[misc]

    def _was_released(self, task: asyncio.Task[Any]) -> bool:
        """Whether ``task`` is the clean end of a member :meth:`stop_member` stopped."""
        return any(t is task and s in self._released for s, t in self._tasks.items()) and task.exception() is None

    def _request_stop(self) -> None:
        for service in reversed(self._brokers()):
            service.request_stop()

    def stop_member(self, member_id: str, timeout: float = 60.0) -> None:
        """Stop one member of the DLedger group (``ha="dledger"``) as stopping its process would: it unregisters
        and leaves; the others go on and elect a new leader if it led.  Returns once it stopped."""
        service = self.member_services.get(member_id)
        if service is None:
            raise ValueError(f"no DLedger member {member_id!r}; members: {sorted(self.member_services)}")
        if self._loop is None or not self.running:
            raise RuntimeError("the embedded platform is not running")

        async def stop() -> None:
            self._released.add(service)
            service.request_stop()
            await asyncio.wait({self._tasks[service]})

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(timeout)

    def leader(self) -> str | None:
        """The member that leads its group and is the name server's master of the broker name (None: no such
        member now, e.g. during an election or before the new leader registered)."""
        for member_id, service in self.member_services.items():
            member = service.broker.dledger
            if service in self._released or member is None or not member.leads:
                continue
            routed = self.route_table.broker_data(service.config.broker_name)
            if routed is not None and routed.master_addr == service.config.addr:
                return member_id
        return None

    def wait_leader(self, timeout: float = 60.0) -> str:
        """Wait until :meth:`leader` names a member and return it (TimeoutError after ``timeout`` s)."""
        deadline = time.monotonic() + timeout
        while (leader := self.leader()) is None:
            if time.monotonic() > deadline or not self.running:
                raise TimeoutError(f"no DLedger member led and was routed as master within {timeout} s")
            time.sleep(0.05)
        return leader

    def stop(self, timeout: float = 60.0) -> None:
        """Stop both services cleanly (the broker unregisters and persists offsets first)."""
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._request_stop)
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def remoting_addr(self) -> str | None:
        """The broker's remoting endpoint (``host:port``), once it serves one."""
        return self.broker_service.broker.remoting_addr if self.broker_service is not None else None

    @property
    def grpc_addr(self) -> str | None:
        """The broker's RocketMQ 5 gRPC endpoint (``host:port``), once it serves one."""
        return self.broker_service.broker.grpc_addr if self.broker_service is not None else None

    @property
    def slave_addr(self) -> str | None:
        """The slave's address with ``ha`` set, else None."""
        return self.slave_service.config.addr if self.slave_service is not None else None

    @property
    def member_addrs(self) -> dict[str, str]:
        """Each DLedger member's broker address with ``ha="dledger"`` (empty otherwise)."""
        return {member: service.config.addr for member, service in self.member_services.items()}

    @property
    def running(self) -> bool:
        """Whether the services' thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self) -> EmbeddedPlatform:
        return self.start() if not self.running else self

    def __exit__(self, *exc: object) -> None:
        self.stop()
