"""Run one name server: ``python -m sparkmq.api.namesrv_main --host 127.0.0.1 --port 9876``.

Prints ``namesrv listening on http://HOST:PORT`` (the real port, also with ``--port 0``)
once it accepts connections; SIGTERM or Ctrl-C stops it cleanly.
"""
from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable, Sequence

import uvicorn

from ..platform.namesrv import NameServerConfig, RouteTable
from ..platform.namesrv.config import DEFAULT_BROKER_EXPIRY_S, DEFAULT_PORT, DEFAULT_SCAN_INTERVAL_S
from .namesrv_app import create_app

__all__ = ["main", "serve"]


def _announce(host: str, port: int) -> None:
    print(f"namesrv listening on http://{host}:{port}", flush=True)


async def serve(config: NameServerConfig, log_level: str = "warning",
                on_ready: Callable[[str, int], None] = _announce) -> bool:
    """Serve a name server until stopped; calls ``on_ready(host, port)`` once it accepts connections.

    Returns whether it ever started (uvicorn raises SystemExit(1) if it cannot bind).
    """
    app = create_app(RouteTable(config), config)
    server = uvicorn.Server(uvicorn.Config(app, host=config.host, port=config.port, log_level=log_level,
                                           lifespan="on", access_log=False))

    async def wait_started() -> None:
        # uvicorn sets `started` after the listening sockets exist and the lifespan ran.
        while not server.started:
            if server.should_exit:
                return
            await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1] if server.servers else config.port
        on_ready(config.host, port)

    watcher = asyncio.create_task(wait_started())
    try:
        await server.serve()
    finally:
        watcher.cancel()
    return server.started


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments and serve; returns the exit status (2 for bad arguments, 1 if the server failed)."""
    parser = argparse.ArgumentParser(prog="python -m sparkmq.api.namesrv_main", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on (default %(default)s)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="port, 0 = any free one (default %(default)s)")
    parser.add_argument("--broker-expiry-s", type=float, default=DEFAULT_BROKER_EXPIRY_S,
                        help="drop a broker silent this long (default %(default)s)")
    parser.add_argument("--scan-interval-s", type=float, default=DEFAULT_SCAN_INTERVAL_S,
                        help="look for silent brokers this often (default %(default)s)")
    parser.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    args = parser.parse_args(argv)
    try:
        config = NameServerConfig(host=args.host, port=args.port, broker_expiry_s=args.broker_expiry_s,
                                  scan_interval_s=args.scan_interval_s)
    except ValueError as exc:
        parser.error(str(exc))
    try:
        started = asyncio.run(serve(config, log_level=args.log_level))
    except KeyboardInterrupt:
        return 0
    return 0 if started else 1


if __name__ == "__main__":
    sys.exit(main())
