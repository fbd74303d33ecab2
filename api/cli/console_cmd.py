"""``sparkmq console``: the web console over a cluster's name servers (``api/console``)."""
from __future__ import annotations

import sys

import click

from ..console import main as console_main

__all__ = ["console"]


@click.command("console")
@click.option("--namesrv", envvar="SPARKMQ_NAMESRV", default="127.0.0.1:9876", show_default=True,
              help='name servers, "host:port;host:port" (env SPARKMQ_NAMESRV)')
@click.option("--host", default="127.0.0.1", show_default=True, help="interface to listen on")
@click.option("--port", type=int, default=console_main.DEFAULT_PORT, show_default=True,
              help="port (0 = any free one)")
def console(namesrv: str, host: str, port: int) -> None:
    """Serve the web console (cluster, topics, groups, messages, trace, dead letters, lake); Ctrl-C stops it."""
    sys.exit(console_main.main(["--namesrv", namesrv, "--host", host, "--port", str(port)]))
