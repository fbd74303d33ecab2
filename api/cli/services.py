"""``sparkmq namesrv | broker | gateway | dev``: run the services.

``namesrv``, ``broker`` and ``gateway`` hand their arguments to the runners in ``api/``
(``sparkmq broker --help`` lists them); ``dev`` runs the embedded default — a name server
and a broker with its gateway endpoints in one process — and a demo that sends and
receives through them.  Access control stays off in ``dev`` unless its ``--config`` file turns
it on in ``[broker]`` (``acl_enabled`` and the bootstrap super user, as for a broker): then every
embedded service checks it, and the demo signs with that super user (docs/security.md).
"""
from __future__ import annotations

import signal
import sys
import threading
import time
import tomllib
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from ...platform.auth import Credentials
from ...platform.client.config import ClientConfig
from ...platform.client.producer import Producer
from ...platform.client.push_consumer import ConsumeStatus, PushConsumer
from ...platform.common.message import Message
from ...platform.common.wire import ReceivedMessage
from .. import broker_main, gateway_main, namesrv_main
from ..console.main import DEFAULT_PORT as CONSOLE_PORT
from ..console.main import ConsoleThread
from ..embedded import EmbeddedPlatform
from .output import console

__all__ = ["namesrv", "broker", "gateway", "dev"]

_PASSTHROUGH = {"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []}


@click.command(context_settings=_PASSTHROUGH, add_help_option=False)
@click.pass_context
def namesrv(ctx: click.Context) -> None:
    """Run a name server (arguments as ``python -m sparkmq.api.namesrv_main``; --help lists them)."""
    sys.exit(namesrv_main.main(ctx.args))


@click.command(context_settings=_PASSTHROUGH, add_help_option=False)
@click.pass_context
def broker(ctx: click.Context) -> None:
    """Run a broker (arguments as ``python -m sparkmq.api.broker_main``; --help lists them)."""
    sys.exit(broker_main.main(ctx.args))


@click.command(context_settings=_PASSTHROUGH, add_help_option=False)
@click.pass_context
def gateway(ctx: click.Context) -> None:
    """Run a stateless gateway routing sends over the name servers (--help lists its arguments)."""
    sys.exit(gateway_main.main(ctx.args))


DEMO_TOPIC = "DemoTopic"


def run_demo(namesrv_addr: str, messages: int, credentials: Credentials | None = None) -> tuple[int, int, float]:
    """Send ``messages`` through the platform and consume them back, signed with ``credentials`` when given (ACL
    on); returns (sent, received, seconds)."""
    keys: dict[str, Any] = {} if credentials is None else {
        "access_key": credentials.access_key, "secret_key": credentials.secret_key}
    config = ClientConfig(namesrv_addrs=namesrv_addr, rebalance_interval_s=1.0, **keys)
    wanted: set[str] = set()
    received: set[str] = set()
    all_in = threading.Event()
    lock = threading.Lock()

    def listener(batch: list[ReceivedMessage]) -> ConsumeStatus:
        with lock:
            # Ids are recorded before the send that made them returns, so keep every one seen.
            received.update(m.msg_id for m in batch if m.tags == "demo")
            if len(wanted) == messages and wanted <= received:
                all_in.set()
        return ConsumeStatus.CONSUME_SUCCESS

    producer = Producer("demo-producer", config).start()
    try:
        # Create the topic first.  The consumer starts from the first offset: on a busy machine its first
        # route and assignment can come after the sends, and from the last offset it would then see none.
        producer.send(Message(DEMO_TOPIC, b"warm-up", tags="warmup"))
        consumer = PushConsumer("demo-consumer", config, consume_from_where="CONSUME_FROM_FIRST_OFFSET")
        consumer.subscribe(DEMO_TOPIC, "demo")
        consumer.register_listener(listener)
        consumer.start()
        try:
            started = time.perf_counter()
            batch_size = 64
            for first in range(0, messages, batch_size):
                batch = [Message(DEMO_TOPIC, b"hello sparkmq %d" % i, tags="demo", keys=(f"k{i}",))
                         for i in range(first, min(first + batch_size, messages))]
                results = producer.send_batch(batch)
                with lock:
                    wanted.update(r.msg_id for r in results)
                    if len(wanted) == messages and wanted <= received:
                        all_in.set()
            all_in.wait(60)
            elapsed = time.perf_counter() - started
        finally:
            consumer.shutdown()
    finally:
        producer.shutdown()
    with lock:
        return messages, len(wanted & received), elapsed


def _print_dledger_group(platform: EmbeddedPlatform) -> None:
    """The members of the embedded DLedger group, once one of them leads and is routed as master."""
    leader = platform.wait_leader()
    table = Table("member", "broker", "role", title="DLedger group")
    for member, addr in platform.member_addrs.items():
        table.add_row(member, f"http://{addr}", "LEADER (master)" if member == leader else "FOLLOWER (slave)")
    console.print(table)
    console.print(f"[bold]{leader}[/] leads; member state: GET /broker/dledger, hand over: "
                  f"sparkmq admin --namesrv {platform.namesrv_addr} dledger transfer "
                  f"--broker {platform.member_addrs[leader]} --to <member>")


def _lake_running(platform: EmbeddedPlatform) -> bool:
    lake = platform.broker_service.lake if platform.broker_service is not None else None
    return lake is not None and lake.status()["state"] == "running"


def _start_console(namesrv_addr: str, port: int) -> ConsoleThread | None:
    """The web console on ``port`` (a free one when that is taken), None with port -1."""
    if port < 0:
        return None
    web = ConsoleThread(namesrv_addr, port=port)
    try:
        web.start()
    except OSError:  # the default port is taken (a second dev platform): any free one will do
        web = ConsoleThread(namesrv_addr, port=0)
        web.start()
    return web


@click.command()
@click.option("--config", "config_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=None, help="TOML with [namesrv], [broker], [store], [lake] tables (see conf/single-node.toml; "
                                 "[broker] acl_enabled = true turns access control on everywhere)")
@click.option("--data-dir", type=click.Path(path_type=Path), default=None,
              help="where the broker keeps its files (overrides [broker] data_dir; default var/dev)")
@click.option("--namesrv-port", type=int, default=None, help="name server port (0 = any free one)")
@click.option("--broker-port", type=int, default=None, help="broker port (0 = any free one)")
@click.option("--messages", default=1000, show_default=True, help="how many demo messages to send and receive")
@click.option("--demo/--no-demo", default=True, show_default=True, help="run the send/receive demo")
@click.option("--exit-after-demo", is_flag=True, help="stop once the demo is done (scripts and tests)")
@click.option("--lake/--no-lake", default=None,
              help="run the broker's lake (Spark + Delta tables); default: on, or the config's [lake] table")
@click.option("--ha", type=click.Choice(["async", "sync", "dledger"]), default=None,
              help="run the broker as an ASYNC_MASTER or SYNC_MASTER with a slave beside it, or as a DLedger "
                   "group of three members n0, n1, n2 (docs/ha.md)")
@click.option("--console-port", type=int, default=CONSOLE_PORT, show_default=True,
              help="the web console's port (0 = any free one, -1 = no console)")
def dev(config_file: Path | None, data_dir: Path | None, namesrv_port: int | None, broker_port: int | None,
        messages: int, demo: bool, exit_after_demo: bool, lake: bool | None, ha: str | None,
        console_port: int) -> None:
    """Start the embedded platform (name server + broker + gateway + lake) and run the demo; Ctrl-C stops it."""
    if data_dir is None and config_file is None:
        data_dir = Path("var/dev")
    if lake is None and config_file is None:
        lake = True  # the embedded default is the whole platform
    try:
        platform = EmbeddedPlatform.from_toml(config_file, data_dir=data_dir, namesrv_port=namesrv_port,
                                              broker_port=broker_port, lake=lake, ha=ha)
    except (ValueError, TypeError, tomllib.TOMLDecodeError) as exc:  # the messages never show a secret
        raise click.UsageError(f"--config: {exc}") from None
    platform.start()
    try:
        web = _start_console(platform.namesrv_addr, console_port)
    except BaseException:
        platform.stop()
        raise
    remoting = ""
    if platform.remoting_addr == platform.broker_addr:
        remoting = ", RocketMQ remoting on the same port (namesrvAddr for RocketMQ clients: the name server's)"
    elif platform.remoting_addr:
        remoting = f", RocketMQ remoting on [bold]{platform.remoting_addr}[/]"
    if platform.grpc_addr:
        remoting += f", RocketMQ 5 gRPC on [bold]{platform.grpc_addr}[/]"
    if platform.member_addrs:  # which member takes sends is known once one is elected: see the group table
        console.print(f"name server on [bold]http://{platform.namesrv_addr}[/], a DLedger group of "
                      f"{len(platform.member_addrs)} brokers (each with the gateway endpoints and API docs at /docs)")
    else:
        console.print(f"name server on [bold]http://{platform.namesrv_addr}[/], broker and gateway on "
                      f"[bold]http://{platform.broker_addr}[/] (API docs at /docs){remoting}")
    if web is not None:
        console.print(f"web console on [bold]{web.url}[/]")
    if platform.acl_enabled and platform.credentials is not None:  # the access key only: the secret stays in the file
        console.print(f"access control on: sign requests as [bold]{platform.credentials.access_key}[/] (the "
                      "bootstrap super user of the config file) and create users with sparkmq admin user create")
    if platform.slave_addr is not None:
        console.print(f"{'SYNC' if ha == 'sync' else 'ASYNC'}_MASTER with a slave on "
                      f"[bold]http://{platform.slave_addr}[/] (replication: GET /broker/ha)")
    failed = False
    try:
        if platform.member_addrs:
            _print_dledger_group(platform)
        if demo:
            sent, received, elapsed = run_demo(platform.namesrv_addr, messages, platform.credentials)
            table = Table("topic", "sent", "received", "seconds", "msg/s", title="demo")
            table.add_row(DEMO_TOPIC, str(sent), str(received), f"{elapsed:.2f}", f"{received / elapsed:,.0f}")
            console.print(table)
            console.print(f"received {received} of {sent}")
            failed = received != sent
        if not exit_after_demo:
            console.print("serving; Ctrl-C stops")
            stop = threading.Event()
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, lambda *_: stop.set())
            lake_announced = not platform.lake_settings.enabled
            while not stop.wait(0.5) and platform.running:
                if not lake_announced and _lake_running(platform):
                    lake_announced = True
                    lake_root = platform.broker_service.config.data_dir / "lake"  # type: ignore[union-attr]
                    console.print(f"lake running: Delta tables under [bold]{lake_root}[/]; try\n"
                                  f"  sparkmq sql --lake-root {lake_root} "
                                  "\"SELECT topic, count(*) AS n FROM messages GROUP BY topic\"")
    finally:
        if web is not None:
            web.stop()
        platform.stop()
    if failed:
        sys.exit(1)
