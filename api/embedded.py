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
command (``sparkmq dev --ha sync``).
"""
from __future__ import annotations

import asyncio
import threading
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..pipelines.lake_service import LakeSettings
from ..platform.broker.config import BrokerConfig
from ..platform.namesrv import NameServerConfig, RouteTable
from .broker_main import BrokerService
from .namesrv_app import create_app as create_namesrv_app
from .serving import Server, bind_socket, run_service, serve_app

__all__ = ["EmbeddedPlatform"]

_NAMESRV_KEYS = {"host", "port", "broker_expiry_s", "scan_interval_s"}
#: Commit-log segment size of the embedded default (conf/single-node.toml says the same).
EMBEDDED_SEGMENT_SIZE = 64 << 20


class EmbeddedPlatform:
    """A name server + broker pair in this process; :meth:`start` returns once both accept connections."""

    def __init__(self, namesrv: Mapping[str, Any] | None = None, broker: Mapping[str, Any] | None = None,
                 store: Mapping[str, Any] | None = None, lake: Mapping[str, Any] | None = None, *,
                 log_level: str = "warning", ha: str | None = None) -> None:
        """Settings as in the TOML tables; ValueError for unknown or bad ones.  The lake is off
        unless ``lake`` says ``enabled = true`` (``sparkmq dev`` turns it on).  ``ha``: None, "async"
        or "sync" (a master of that kind and its slave)."""
        if ha not in (None, "async", "sync"):
            raise ValueError(f"ha must be async or sync, got {ha!r}")
        self.ha = ha
        self.lake_settings = LakeSettings.from_mapping(lake)
        namesrv = dict(namesrv or {})
        unknown = set(namesrv) - _NAMESRV_KEYS
        if unknown:
            raise ValueError(f"unknown [namesrv] settings {sorted(unknown)}; known: {sorted(_NAMESRV_KEYS)}")
        self.namesrv_config = NameServerConfig(**namesrv)
        self._broker_settings = dict(broker or {})
        self._store_settings = dict(store or {})
        BrokerConfig.from_mapping(self._broker_settings, self._store_settings)  # fail here, not in the thread
        self.log_level = log_level
        self.namesrv_addr = ""
        self.broker_addr = ""
        self.broker_service: BrokerService | None = None
        #: The slave with ``ha`` set.
        self.slave_service: BrokerService | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._namesrv_server: Server | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

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
        if self.ha is not None:
            settings["role"] = "SYNC_MASTER" if self.ha == "sync" else "ASYNC_MASTER"
        config = BrokerConfig.from_mapping(settings, self._store_settings)
        try:
            self.broker_service = BrokerService(config, self.lake_settings)
            if self.ha is not None:
                slave = BrokerConfig.from_mapping(
                    {**settings, "role": "SLAVE", "broker_id": 1, "port": 0, "remoting_port": 0,
                     "data_dir": str(config.data_dir / "slave")}, self._store_settings)
                self.slave_service = BrokerService(slave)
        except BaseException:
            namesrv_sock.close()
            if self.broker_service is not None:
                self.broker_service.sock.close()
            raise
        self.broker_addr = self.broker_service.config.addr
        self._thread = threading.Thread(target=self._run, args=(namesrv_sock,), name="sparkmq-embedded",
                                        daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            self.stop()
            raise TimeoutError(f"the embedded platform did not start within {timeout} s")
        if self._error is not None:
            raise self._error
        return self

    def _run(self, namesrv_sock: Any) -> None:
        try:
            run_service(self._serve(namesrv_sock))
        except BaseException as exc:  # surfaced to start() / stop()
            self._error = exc
        finally:
            self._ready.set()

    async def _serve(self, namesrv_sock: Any) -> None:
        self._loop = asyncio.get_running_loop()
        service = self.broker_service
        assert service is not None
        started = {"namesrv": False, "broker": False}
        if self.slave_service is not None:
            started["slave"] = False

        def ready(kind: str) -> Any:
            def on_ready(_host: str, _port: int) -> None:
                started[kind] = True
                if all(started.values()):
                    self._ready.set()
            return on_ready

        def keep_server(server: Server) -> None:
            self._namesrv_server = server

        app = create_namesrv_app(RouteTable(self.namesrv_config), self.namesrv_config)
        namesrv = asyncio.create_task(serve_app(app, namesrv_sock, ready("namesrv"), handle_signals=False,
                                                log_level=self.log_level, server_ready=keep_server))
        broker = asyncio.create_task(service.serve(log_level=self.log_level, on_ready=ready("broker"),
                                                   handle_signals=False, on_remoting=None))
        brokers = {broker}
        if self.slave_service is not None:
            brokers.add(asyncio.create_task(self.slave_service.serve(
                log_level=self.log_level, on_ready=ready("slave"), handle_signals=False, on_remoting=None)))
        done, _pending = await asyncio.wait({namesrv, *brokers}, return_when=asyncio.FIRST_COMPLETED)
        # Any one stopping (asked to, or failed) stops the others: they are one platform.
        # The brokers go first, so they can still unregister from the name server.
        self._request_stop()
        await asyncio.gather(*brokers, return_exceptions=True)
        if self._namesrv_server is not None:
            self._namesrv_server.should_exit = True
        await asyncio.gather(namesrv, return_exceptions=True)
        for task in done:
            if task.exception() is not None:
                raise task.exception()  # type: ignore[misc]

    def _request_stop(self) -> None:
        for service in (self.slave_service, self.broker_service):
            if service is not None:
                service.request_stop()

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
    def slave_addr(self) -> str | None:
        """The slave's address with ``ha`` set, else None."""
        return self.slave_service.config.addr if self.slave_service is not None else None

    @property
    def running(self) -> bool:
        """Whether the services' thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self) -> EmbeddedPlatform:
        return self.start() if not self.running else self

    def __exit__(self, *exc: object) -> None:
        self.stop()
