"""Run one name server: ``python -m sparkmq.api.namesrv_main --host 127.0.0.1 --port 9876``.

Prints ``namesrv listening on http://HOST:PORT`` (the real port, also with ``--port 0``)
once it accepts connections; SIGTERM or Ctrl-C stops it cleanly.  The port serves RocketMQ's remoting
protocol (``api/namesrv_remoting.py``: what RocketMQ clients and ``mqadmin`` ask) and HTTP (people, curl, and
the brokers' registrations), told apart by the first byte a client sends.

``--config FILE`` reads the ``[namesrv]`` table of a TOML file (``conf/single-node.toml``): every
:class:`~sparkmq.platform.namesrv.NameServerConfig` field, the ACL settings among them (secrets belong in a
file, not on a command line); flags given on the command line win.
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import socket
import sys
import tomllib
from collections.abc import Callable, Sequence
from pathlib import Path

from ..platform.namesrv import KVConfigStore, NameServerConfig, RouteTable, kv_config_path
from ..platform.namesrv.config import DEFAULT_BROKER_EXPIRY_S, DEFAULT_PORT, DEFAULT_SCAN_INTERVAL_S
from .namesrv_app import create_app
from .namesrv_remoting import NameServerRemoting
from .serving import Server, announcer, bind_socket, run_service, serve_app

__all__ = ["main", "serve", "serve_on", "load_config"]


_ANNOUNCE = announcer("namesrv")
_ANNOUNCE_TLS = announcer("namesrv", "https")


async def serve(config: NameServerConfig, log_level: str = "warning",
                on_ready: Callable[[str, int], None] = _ANNOUNCE, handle_signals: bool = True,
                server_ready: Callable[[Server], None] | None = None) -> bool:
    """Serve a name server until stopped; calls ``on_ready(host, port)`` once it accepts connections.

    Returns whether it ever started.  ``sparkmq dev`` passes ``handle_signals=False`` and
    stops it through the server ``server_ready`` hands over.
    """
    if on_ready is _ANNOUNCE and config.tls.enabled:
        on_ready = _ANNOUNCE_TLS  # the ready line names the real scheme
    return await serve_on(config, bind_socket(config.host, config.port), RouteTable(config), on_ready,
                          log_level=log_level, handle_signals=handle_signals, server_ready=server_ready)


async def serve_on(config: NameServerConfig, sock: socket.socket, table: RouteTable,
                   on_ready: Callable[[str, int], None], *, log_level: str = "warning", handle_signals: bool = True,
                   server_ready: Callable[[Server], None] | None = None) -> bool:
    """Serve a name server over ``table`` on the bound ``sock``: HTTP and RocketMQ remoting on the one port
    (the KV configs under ``config.data_dir`` when it has one).  Returns whether it ever started."""
    app = create_app(table, config)
    kv = KVConfigStore(kv_config_path(config.data_dir) if config.data_dir else None)
    remoting = NameServerRemoting(table, kv, app.state.guard).server()
    remoting.start_shared()
    try:
        return await serve_app(app, sock, on_ready, handle_signals=handle_signals, log_level=log_level,
                               server_ready=server_ready, tls=config.tls, remoting=remoting)
    finally:
        await remoting.stop(1.0)


def load_config(path: Path | None, **overrides: object) -> NameServerConfig:
    """A NameServerConfig from a TOML file's ``[namesrv]`` table, then ``overrides`` (None = keep).

    Unknown keys in that table are errors; other tables belong to other services.
    """
    known = {f.name for f in dataclasses.fields(NameServerConfig)}
    values: dict[str, object] = {}
    if path is not None:
        values = dict(tomllib.loads(path.read_text("utf-8")).get("namesrv", {}))
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown [namesrv] setting(s) {unknown}; known: {sorted(known)}")
    values.update({k: v for k, v in overrides.items() if v is not None})
    return NameServerConfig(**values)  # type: ignore[arg-type]


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments and serve; returns the exit status (2 for bad arguments, 1 if the server failed)."""
    parser = argparse.ArgumentParser(prog="python -m sparkmq.api.namesrv_main", description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=None,
                        help="TOML file with a [namesrv] table (ACL settings included: docs/security.md)")
    parser.add_argument("--host", default=None, help="interface to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=None, help=f"port, 0 = any free one (default {DEFAULT_PORT})")
    parser.add_argument("--broker-expiry-s", type=float, default=None,
                        help=f"drop a broker silent this long (default {DEFAULT_BROKER_EXPIRY_S})")
    parser.add_argument("--scan-interval-s", type=float, default=None,
                        help=f"look for silent brokers this often (default {DEFAULT_SCAN_INTERVAL_S})")
    parser.add_argument("--data-dir", default=None, help="where the ACL is kept (config/acl.json)")
    parser.add_argument("--tls-cert-file", help="PEM certificate chain: serve HTTPS only (docs/security-tls.md)")
    parser.add_argument("--tls-key-file", help="PEM private key of --tls-cert-file")
    parser.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    args = parser.parse_args(argv)
    # As the broker: the audit trail (sparkmq.audit, INFO for ACL changes) and warnings reach stderr.
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = load_config(args.config, host=args.host, port=args.port, broker_expiry_s=args.broker_expiry_s,
                             scan_interval_s=args.scan_interval_s, tls_cert_file=args.tls_cert_file,
                             tls_key_file=args.tls_key_file, data_dir=args.data_dir)
    except (ValueError, TypeError, OSError, tomllib.TOMLDecodeError) as exc:
        parser.error(str(exc))
    try:
        started = run_service(serve(config, log_level=args.log_level))
    except KeyboardInterrupt:
        return 0
    except OSError as exc:
        print(f"namesrv: cannot listen on {config.host}:{config.port}: {exc}", file=sys.stderr)
        return 1
    return 0 if started else 1


if __name__ == "__main__":
    sys.exit(main())
