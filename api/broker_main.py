"""Run one broker: ``python -m sparkmq.api.broker_main --data-dir var/broker --namesrv 127.0.0.1:9876``.

Binds the listening socket first (so ``--port 0`` knows its real port before the store
writes that address into records and offsetMsgIds), starts the broker, serves the
HTTP API on that socket and prints ``broker listening on http://HOST:PORT`` once it
accepts connections.  SIGTERM or Ctrl-C stops it cleanly: no new requests, held pulls
released, unregistered from every name server, consumer offsets persisted, store closed.

``sparkmq dev`` runs a name server and a broker in one asyncio loop; it builds a
:class:`BrokerService` (or calls :func:`serve` with ``handle_signals=False``) and stops
it with :meth:`BrokerService.request_stop`.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import functools
import gc
import logging
import sys
import tomllib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import uvicorn

from ..pipelines.lake_service import LakeService, LakeSettings
from ..platform.broker.broker import Broker
from ..platform.broker.config import DEFAULT_PORT, BrokerConfig
from .broker_app import create_app
from .remoting import BrokerRemoting
from .serving import Server, bind_socket, http_options, run_service

if TYPE_CHECKING:
    from .grpc import GrpcServer

__all__ = ["main", "serve", "BrokerService", "bind_socket", "load_config", "load_lake_settings"]

log = logging.getLogger("sparkmq.broker")

#: How long uvicorn waits for requests in flight after SIGTERM (held pulls are released at once).
_GRACEFUL_S = 10


def _announce(host: str, port: int, scheme: str = "http") -> None:
    print(f"broker listening on {scheme}://{host}:{port}", flush=True)


def _announce_remoting(addr: str) -> None:
    print(f"broker remoting on {addr}", flush=True)


def _announce_grpc(addr: str) -> None:
    print(f"broker grpc on {addr}", flush=True)


class BrokerService:
    """A bound socket, a :class:`Broker` for the real port, and its app: what :func:`serve` runs.

    Example (inside a running event loop)::

        service = BrokerService(BrokerConfig(port=0, data_dir="var/b", namesrv_addrs=("127.0.0.1:9876",)))
        task = asyncio.create_task(service.serve(on_ready=lambda h, p: print(p)))
        ...
        service.request_stop()
        await task
    """

    def __init__(self, config: BrokerConfig, lake: LakeSettings | None = None) -> None:
        """Bind ``config.host:config.port`` now (OSError if taken) and build the broker and app (not started).

        With ``lake.enabled`` the broker also runs its lake (SparkSession + streaming jobs) once it
        serves; the lake starts in the background and never delays delivery.
        """
        self.sock = bind_socket(config.host, config.port)
        port = self.sock.getsockname()[1]
        self.config = config.bound_to(port) if config.port == 0 else config
        self.broker = Broker(self.config)
        self.app = create_app(self.broker)
        self.server: Server | None = None
        self._stop_requested = False
        self.lake_settings = lake or LakeSettings()
        self.lake: LakeService | None = None
        if self.lake_settings.enabled:
            self._publish_alert_rules()
        self.remoting: BrokerRemoting | None = None
        self.grpc: GrpcServer | None = None

    def _publish_alert_rules(self) -> None:
        """Tell the broker the rules its lake evaluates (``GET /alerts/rules``): parsed as the report job will."""
        from ..pipelines.alerts import AlertConfig

        try:
            rules = AlertConfig.from_mapping(self.lake_settings.alerts).rules
        except (TypeError, ValueError) as exc:  # the report job fails on it too: say why instead of "no rules"
            self.broker.admin_processor.set_alert_rules([], error=str(exc))
            return
        self.broker.admin_processor.set_alert_rules(dataclasses.asdict(r) for r in rules)

    def _start_lake(self) -> None:
        if not self.lake_settings.enabled:
            return
        lake = self.lake = self.lake_settings.service_for_broker(self.config.data_dir, self.config.broker_name,
                                                                 self.config.addr)
        self.broker.add_component("lake", lake.status, lake.healthy)
        self.broker.metrics.add_component_gauges("lake_job", lake.gauge_rows)
        lake.start(background=True)

    def _stop_lake(self) -> None:
        if self.lake is not None:
            self.lake.stop()

    @property
    def url(self) -> str:
        """``http://host:port`` of the bound socket."""
        return f"http://{self.config.host}:{self.config.port}"

    def request_stop(self) -> None:
        """Ask a serving broker to stop (from the event loop's thread); :meth:`serve` then shuts it down."""
        self._stop_requested = True
        if self.server is not None:
            self.server.should_exit = True

    async def _open_endpoints(self) -> None:
        """Remoting, the DLedger member and the HA port, all on this loop (long polls, pushes and the futures of
        sends waiting for a sync, a slave or a Raft commit resolve on it without a thread)."""
        if self.config.remoting_enabled:
            # RocketMQ's remoting on the main port (sniffed beside HTTP), and on a dedicated one when configured.
            self.remoting = BrokerRemoting(self.broker, tls=self.config.tls, limits=self.config.limits)
            self.remoting.start_shared()
            self.broker.add_component("remoting", self.remoting.stats)  # /health: connections, requests, errors
            self.broker.remoting_addr = self.config.addr
            remoting_port = self.config.remoting_bind_port
            if remoting_port is not None:
                await self.remoting.start(self.config.host, remoting_port)
                assert self.remoting.port is not None
                self.broker.remoting_addr = self.config.remoting_addr_for(self.remoting.port)
        grpc_port = self.config.grpc_bind_port
        if grpc_port is not None:
            from .grpc import GrpcServer  # grpc and the protocol modules load only for brokers that serve it
            self.grpc = await GrpcServer(self.broker).start(self.config.host, grpc_port)
            self.broker.grpc_addr = self.config.remoting_addr_for(self.grpc.port)
        if self.broker.dledger is not None:
            await self.broker.dledger.start()
        ha_port = self.config.ha_bind_port
        master = self.broker.replication_master
        if master is not None and ha_port is not None:
            await master.start(self.config.host, ha_port, tls=self.config.tls)
            self.broker.ha_addr = self.config.remoting_addr_for(master.port)

    async def serve(self, log_level: str = "warning", on_ready: Callable[[str, int], None] = _announce,
                    handle_signals: bool = True,
                    on_remoting: Callable[[str], None] | None = _announce_remoting,
                    on_grpc: Callable[[str], None] | None = _announce_grpc) -> bool:
        """Start the broker, serve until stopped, shut the broker down; returns whether it served.

        ``on_ready(host, port)`` is called once connections are accepted.  With
        ``handle_signals`` SIGTERM/SIGINT stop it; otherwise only :meth:`request_stop` does.
        """
        if on_ready is _announce and self.config.tls.enabled:
            on_ready = functools.partial(_announce, scheme="https")  # the ready line names the real scheme
        try:
            await asyncio.to_thread(self.broker.start, False)
        except BaseException:
            self.sock.close()
            raise
        try:
            await self._open_endpoints()
        except BaseException:
            if self.remoting is not None:
                await self.remoting.stop(0)
            if self.grpc is not None:
                await self.grpc.stop(0)
            if self.broker.dledger is not None:
                await self.broker.dledger.stop()
            await asyncio.to_thread(self.broker.shutdown)
            self.sock.close()
            raise
        # What start-up built lives as long as the process: keep the collector from re-scanning it, which
        # otherwise stalls the serving loop for milliseconds at every full collection.
        gc.freeze()
        config = uvicorn.Config(self.app, log_level=log_level, lifespan="off", access_log=False,
                                timeout_graceful_shutdown=_GRACEFUL_S,
                                **http_options(self.config.tls, self.config.limits,
                                               self.remoting.server if self.remoting is not None else None))
        server = self.server = Server(config, handle_signals)
        if self._stop_requested:
            server.should_exit = True

        async def watch() -> None:
            while not server.started:
                if server.should_exit:
                    break
                await asyncio.sleep(0.01)
            else:
                # Only now tell the name servers where we are: the socket accepts connections.  Ready once they
                # heard it (or the first attempt failed): a client asking them right away finds this broker.
                self.broker.start_registration()
                await asyncio.to_thread(self.broker.registration.wait_first_round)
                on_ready(self.config.host, self.config.port)
                if on_remoting is not None and self.broker.remoting_addr is not None:
                    on_remoting(self.broker.remoting_addr)  # after the ready line scripts wait for
                if on_grpc is not None and self.broker.grpc_addr is not None:
                    on_grpc(self.broker.grpc_addr)
                self._start_lake()
            while not server.should_exit:
                await asyncio.sleep(0.05)
            # uvicorn now waits for requests in flight: release held pulls and change polls so it need not.
            self.broker.begin_shutdown()

        watcher = asyncio.create_task(watch(), name=f"broker-{self.config.broker_name}-watch")
        try:
            await server.serve(sockets=[self.sock])
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            self.broker.begin_shutdown()
            if self.remoting is not None:
                await self.remoting.stop(_GRACEFUL_S)
            if self.grpc is not None:
                await self.grpc.stop(_GRACEFUL_S)
            if self.broker.replication_master is not None:
                await self.broker.replication_master.stop()
            if self.broker.dledger is not None:
                await self.broker.dledger.stop()
            # The lake's jobs read this broker: stop them before the store closes.
            await asyncio.to_thread(self._stop_lake)
            await asyncio.to_thread(self.broker.shutdown)
            self.sock.close()
        return server.started


async def serve(config: BrokerConfig, log_level: str = "warning", on_ready: Callable[[str, int], None] = _announce,
                handle_signals: bool = True, lake: LakeSettings | None = None) -> bool:
    """Bind, start and serve one broker until stopped (SIGTERM/SIGINT with ``handle_signals``).

    See :class:`BrokerService`; returns whether it served.
    """
    return await BrokerService(config, lake).serve(log_level=log_level, on_ready=on_ready,
                                                   handle_signals=handle_signals)


def load_config(path: Path | None, **overrides: object) -> BrokerConfig:
    """A BrokerConfig from a TOML file's ``[broker]`` and ``[store]`` tables, then ``overrides`` (None = keep).

    Unknown keys in those two tables are errors; other tables are ignored.
    """
    broker: dict[str, object] = {}
    store: dict[str, object] = {}
    if path is not None:
        # One file configures every service (conf/single-node.toml): other tables belong to them.
        data = tomllib.loads(path.read_text("utf-8"))
        broker = dict(data.get("broker", {}))
        store = dict(data.get("store", {}))
    return BrokerConfig.from_mapping(broker, store, **overrides)


def load_lake_settings(path: Path | None, enabled: bool | None = None) -> LakeSettings:
    """The ``[lake]`` table of a TOML file (disabled when absent), with ``enabled`` overriding it."""
    data = tomllib.loads(path.read_text("utf-8")) if path is not None else {}
    return LakeSettings.from_mapping(data.get("lake", {}), enabled=enabled, alerts=data.get("alerts"))


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments and serve; returns the exit status (2 for bad arguments, 1 if the broker failed)."""
    parser = argparse.ArgumentParser(prog="python -m sparkmq.api.broker_main", description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--config", type=Path, default=None, help="TOML file with [broker] and [store] tables")
    add("--host", help="interface to listen on (default 127.0.0.1)")
    add("--port", type=int, help=f"port, 0 = any free one (default {DEFAULT_PORT})")
    add("--data-dir", type=Path, help="root of the broker's files (default var/broker)")
    add("--namesrv", dest="namesrv_addrs", help='name servers, "host:port;host:port"')
    add("--cluster", help="cluster name (default DefaultCluster)")
    add("--broker-name", help="broker name (default broker-a)")
    add("--broker-id", type=int, help="0 = master (default), > 0 = slave")
    add("--role", choices=["ASYNC_MASTER", "SYNC_MASTER", "SLAVE"], help="replication role")
    add("--advertised-addr", help="host:port told to clients and name servers (default: the bound address)")
    add("--remoting-port", type=int, help="an extra, dedicated RocketMQ remoting port, 0 = any free one, -1 = no "
                                          "remoting at all (default: remoting on --port only, beside HTTP)")
    add("--grpc-port", type=int, help="RocketMQ 5 gRPC port (the official clients), 0 = any free one, "
                                      "-1 = none (default: none; RocketMQ's proxy uses 8081)")
    add("--ha-port", type=int, help="a master's replication port, 0 = any free one, -1 = none (default: port + 1)")
    add("--ha-master-addr", help="a slave's master HA endpoint host:port (default: learned from the name servers)")
    add("--register-interval-s", type=float, help="register with the name servers this often (default 30)")
    add("--client-expiry-s", type=float, help="drop a client silent this long (default 120)")
    add("--client-scan-interval-s", type=float, help="look for silent clients this often (default 10)")
    add("--long-polling-max-ms", type=int, help="hold a pull at most this long (default 15000)")
    add("--offset-persist-interval-s", type=float, help="persist consumer offsets this often (default 5)")
    add("--queue-lock-expiry-s", type=float, help="queue locks expire after this long (default 60)")
    add("--message-delay-level", help='delay levels, e.g. "1s 5s 10s 30s 1m ..." (default: RocketMQ\'s 18)')
    add("--timer-max-delay-s", type=float, help="timer messages may be due at most this far ahead (default 3 days)")
    add("--transaction-check-first-s", type=float, help="first transaction check-back after (default 6)")
    add("--transaction-check-interval-s", type=float, help="later check-backs this often (default 30)")
    add("--transaction-check-max", type=int, help="discard a half message after this many checks (default 15)")
    add("--flush-mode", choices=["SYNC_FLUSH", "ASYNC_FLUSH"], help="store flush mode (default ASYNC_FLUSH)")
    add("--segment-size", type=int, help="commit-log segment size in bytes")
    add("--no-auto-create-topic", dest="auto_create_topic", action="store_const", const=False,
        help="sends to unknown topics fail with TOPIC_NOT_EXIST")
    add("--no-trace", dest="trace_enabled", action="store_const", const=False,
        help="record no trace events (RMQ_SYS_TRACE_TOPIC stays empty); default: on")
    add("--lake", dest="lake_enabled", action=argparse.BooleanOptionalAction, default=None,
        help="run the lake (SparkSession + dispatch job into data_dir/lake); default: the [lake] table, else off")
    add("--tls-cert-file", help="PEM certificate chain: every port serves TLS (docs/security-tls.md)")
    add("--tls-key-file", help="PEM private key of --tls-cert-file")
    add("--tls-ca-file", help="PEM CAs trusted for name servers, the master and DLedger peers (default: the system's)")
    add("--tls-required", action="store_const", const=True,
        help="refuse plaintext on every port (default: the binary ports also take plaintext)")
    add("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    add("--log-summary-interval-s", type=float,
        help="a subsystem that keeps failing logs its first failure, then a summary this often (default 60)")
    args = vars(parser.parse_args(argv))
    log_level = args.pop("log_level")
    config_file = args.pop("config")
    lake_enabled = args.pop("lake_enabled")
    try:
        config = load_config(config_file, **args)
        lake = load_lake_settings(config_file, lake_enabled)
    except (ValueError, OSError, tomllib.TOMLDecodeError) as exc:
        parser.error(str(exc))
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        started = run_service(serve(config, log_level=log_level, lake=lake))
    except KeyboardInterrupt:
        return 0
    except OSError as exc:
        print(f"broker: cannot listen on {config.host}:{config.port}: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # the broker could not start (store locked, corrupt topic table, ...)
        log.exception("broker failed: %s", exc)
        return 1
    return 0 if started else 1


if __name__ == "__main__":
    sys.exit(main())
