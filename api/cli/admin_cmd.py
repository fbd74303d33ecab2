"""``sparkmq admin …``, ``sparkmq produce`` and ``sparkmq consume``: the platform from a shell.

Every command talks to the name servers given by ``--namesrv`` (or ``SPARKMQ_NAMESRV``,
default ``127.0.0.1:9876``) through the Python client.  Tables for people; ``--json``
prints JSON for scripts.  A stable error prints ``CODE: message`` and exits 1.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

import click

from ...platform.client.admin import AdminClient
from ...platform.client.config import ClientConfig
from ...platform.client.producer import Producer
from ...platform.client.pull_consumer import PullConsumer
from ...platform.common.errors import SparkMQError
from ...platform.common.message import Message
from ...platform.common.wire import ReceivedMessage
from .output import console, emit, emit_rows, fail

__all__ = ["admin", "produce", "consume"]

F = TypeVar("F", bound=Callable[..., Any])

namesrv_option = click.option("--namesrv", envvar="SPARKMQ_NAMESRV", default="127.0.0.1:9876", show_default=True,
                              help='name servers, "host:port;host:port" (env SPARKMQ_NAMESRV)')
json_option = click.option("--json", "as_json", is_flag=True, help="print JSON")


def _client_config(namesrv: str) -> ClientConfig:
    return ClientConfig(namesrv_addrs=namesrv)


def stable_errors(fn: F) -> F:
    """Turn a SparkMQError into ``CODE: message`` and exit status 1 (JSON with --json)."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except SparkMQError as exc:
            obj = click.get_current_context().obj or {}
            fail(exc, bool(kwargs.get("as_json") or obj.get("json")))
    return wrapper  # type: ignore[return-value]


def _admin(ctx: click.Context) -> AdminClient:
    admin = AdminClient(_client_config(ctx.obj["namesrv"]))
    ctx.call_on_close(admin.close)
    return admin


@click.group()
@namesrv_option
@json_option
@click.pass_context
def admin(ctx: click.Context, namesrv: str, as_json: bool) -> None:
    """Topics, groups, offsets, messages and the cluster."""
    ctx.obj = {"namesrv": namesrv, "json": as_json}


# -- topics -------------------------------------------------------------------------------

@admin.group()
def topic() -> None:
    """Create, update, list, route, stats, delete."""


def _topic_options(fn: F) -> F:
    for option in reversed([
        click.option("--read-queues", type=int, default=16, show_default=True),
        click.option("--write-queues", type=int, default=16, show_default=True),
        click.option("--perm", type=int, default=6, show_default=True,
                     help="6 rw, 4 write-forbidden, 2 read-forbidden"),
        click.option("--order", is_flag=True, help="an ordered topic"),
        click.option("--cluster", default=None, help="only this cluster's masters"),
        click.option("--broker", "brokers", multiple=True, help="only these broker addresses (repeatable)"),
    ]):
        fn = option(fn)
    return fn


def _write_topic(ctx: click.Context, name: str, read_queues: int, write_queues: int, perm: int, order: bool,
                 cluster: str | None, brokers: tuple[str, ...], update: bool) -> None:
    client = _admin(ctx)
    call = client.update_topic if update else client.create_topic
    result = call(name, read_queue_nums=read_queues, write_queue_nums=write_queues, perm=perm, order=order,
                  cluster=cluster, broker_addrs=list(brokers) or None)
    rows = [{"broker": addr, **cfg} for addr, cfg in sorted(result.items())]
    emit_rows(rows, ["broker", "topic", "read_queue_nums", "write_queue_nums", "perm", "order"], ctx.obj["json"],
              title=f"topic {name}")


@topic.command("create")
@click.argument("name")
@_topic_options
@click.pass_context
@stable_errors
def topic_create(ctx: click.Context, name: str, **kwargs: Any) -> None:
    """Create a topic on every master (or the given brokers)."""
    _write_topic(ctx, name, update=False, **kwargs)


@topic.command("update")
@click.argument("name")
@_topic_options
@click.pass_context
@stable_errors
def topic_update(ctx: click.Context, name: str, **kwargs: Any) -> None:
    """Change a topic's queue counts, perm or order flag."""
    _write_topic(ctx, name, update=True, **kwargs)


@topic.command("list")
@click.pass_context
@stable_errors
def topic_list(ctx: click.Context) -> None:
    """Every topic some live broker serves."""
    topics = _admin(ctx).topic_list()
    emit_rows([{"topic": t} for t in topics], ["topic"], ctx.obj["json"])


@topic.command("route")
@click.argument("name")
@click.pass_context
@stable_errors
def topic_route(ctx: click.Context, name: str) -> None:
    """Which brokers serve a topic, with their queue counts and perm."""
    route = _admin(ctx).topic_route(name)
    rows = [{"broker": q.broker_name, "addr": route.master_addr(q.broker_name), "read_queue_nums": q.read_queue_nums,
             "write_queue_nums": q.write_queue_nums, "perm": q.perm} for q in route.queue_datas]
    emit_rows(rows, ["broker", "addr", "read_queue_nums", "write_queue_nums", "perm"], ctx.obj["json"],
              title=f"route of {name}")


@topic.command("stats")
@click.argument("name")
@click.pass_context
@stable_errors
def topic_stats(ctx: click.Context, name: str) -> None:
    """Min and max offset of every queue of a topic."""
    rows = [dataclasses.asdict(s) for s in _admin(ctx).topic_stats(name)]
    emit_rows(rows, ["broker_name", "queue_id", "min_offset", "max_offset", "last_store_timestamp"],
              ctx.obj["json"], title=f"stats of {name}")


@topic.command("delete")
@click.argument("name")
@click.option("--cluster", default=None)
@click.pass_context
@stable_errors
def topic_delete(ctx: click.Context, name: str, cluster: str | None) -> None:
    """Delete a topic from the brokers and the name servers."""
    emit(_admin(ctx).delete_topic(name, cluster=cluster), ctx.obj["json"])


# -- groups -------------------------------------------------------------------------------

@admin.group()
def group() -> None:
    """List groups; members, offsets and lag of one."""


@group.command("list")
@click.pass_context
@stable_errors
def group_list(ctx: click.Context) -> None:
    """Every consumer group some broker knows."""
    emit_rows([{"group": g} for g in _admin(ctx).group_list()], ["group"], ctx.obj["json"])


@group.command("members")
@click.argument("name")
@click.pass_context
@stable_errors
def group_members(ctx: click.Context, name: str) -> None:
    """The client ids in a group."""
    emit_rows([{"client_id": m} for m in _admin(ctx).group_members(name)], ["client_id"], ctx.obj["json"],
              title=f"members of {name}")


@group.command("offsets")
@click.argument("name")
@click.option("--topic", "topic_name", default=None)
@click.pass_context
@stable_errors
def group_offsets(ctx: click.Context, name: str, topic_name: str | None) -> None:
    """A group's committed offsets per queue."""
    rows = [{"topic": mq.topic, "broker": mq.broker_name, "queue_id": mq.queue_id, "offset": off}
            for mq, off in _admin(ctx).group_offsets(name, topic_name).items()]
    emit_rows(rows, ["topic", "broker", "queue_id", "offset"], ctx.obj["json"], title=f"offsets of {name}")


@group.command("lag")
@click.argument("name")
@click.option("--topic", "topic_name", default=None)
@click.pass_context
@stable_errors
def group_lag(ctx: click.Context, name: str, topic_name: str | None) -> None:
    """How far a group is behind, per queue and in total."""
    lag = _admin(ctx).group_lag(name, topic_name)
    if ctx.obj["json"]:
        emit(dataclasses.asdict(lag), True)
        return
    emit_rows([dataclasses.asdict(q) for q in lag.queues],
              ["topic", "broker_name", "queue_id", "broker_offset", "consumer_offset", "lag"], False,
              title=f"lag of {name}: {lag.total_lag}")


# -- cluster and messages -----------------------------------------------------------------

@admin.group()
def cluster() -> None:
    """The clusters and their brokers."""


@cluster.command("list")
@click.pass_context
@stable_errors
def cluster_list(ctx: click.Context) -> None:
    """Every cluster, broker name and address the name servers know."""
    info = _admin(ctx).cluster_list()
    if ctx.obj["json"]:
        emit(info, True)
        return
    rows = []
    for cluster_name, names in sorted(info.get("clusters", {}).items()):
        for broker_name in sorted(names):
            addrs = info.get("brokers", {}).get(broker_name, {}).get("broker_addrs", {})
            for broker_id, addr in sorted(addrs.items()):
                rows.append({"cluster": cluster_name, "broker": broker_name, "id": broker_id, "addr": addr})
    emit_rows(rows, ["cluster", "broker", "id", "addr"], False, title="cluster")


@admin.group()
def msg() -> None:
    """Look at messages."""


@msg.command("view")
@click.argument("offset_msg_id")
@click.pass_context
@stable_errors
def msg_view(ctx: click.Context, offset_msg_id: str) -> None:
    """A message by its offsetMsgId (it decodes to the broker and the commit-log offset)."""
    emit(_message_row(_admin(ctx).view_message(offset_msg_id)), ctx.obj["json"])


def _message_row(m: ReceivedMessage) -> dict[str, Any]:
    return {"topic": m.topic, "broker": m.broker_name, "queue_id": m.queue_id, "queue_offset": m.queue_offset,
            "msg_id": m.msg_id, "offset_msg_id": m.offset_msg_id, "tags": m.tags, "keys": list(m.keys),
            "properties": m.user_properties, "born_timestamp": m.born_timestamp,
            "store_timestamp": m.store_timestamp, "reconsume_times": m.reconsume_times,
            "body": m.body.decode("utf-8", "replace")}


# -- produce and consume ------------------------------------------------------------------

@click.command()
@click.argument("topic_name", metavar="TOPIC")
@namesrv_option
@click.option("--body", default=None, help="the body; without it every line of stdin is one message")
@click.option("--tags", default=None)
@click.option("--keys", default=None, help="space-separated keys")
@click.option("--property", "properties", multiple=True, help="key=value (repeatable)")
@click.option("--sharding-key", default=None, help="send in order to the queue this key maps to")
@click.option("--group", default="SPARKMQ_CLI_PRODUCER", show_default=True)
@json_option
@stable_errors
def produce(topic_name: str, namesrv: str, body: str | None, tags: str | None, keys: str | None,
            properties: tuple[str, ...], sharding_key: str | None, group: str, as_json: bool) -> None:
    """Send messages to TOPIC (one per stdin line, or --body) and print where each was stored."""
    props = {}
    for item in properties:
        key, sep, value = item.partition("=")
        if not sep:
            raise click.BadParameter(f"{item!r} is not key=value", param_hint="--property")
        props[key] = value
    bodies = [body] if body is not None else [line.rstrip("\n") for line in sys.stdin if line.strip()]
    rows = []
    with Producer(group, _client_config(namesrv)) as producer:
        for text in bodies:
            message = Message(topic_name, text.encode("utf-8"), tags=tags, keys=tuple((keys or "").split()),
                              properties=dict(props))
            result = producer.send(message, sharding_key=sharding_key)
            rows.append({"status": str(result.status), "msg_id": result.msg_id,
                         "offset_msg_id": result.offset_msg_id, "broker": result.broker_name,
                         "queue_id": result.queue_id, "queue_offset": result.queue_offset})
    emit_rows(rows, ["status", "msg_id", "broker", "queue_id", "queue_offset"], as_json, title=f"sent to {topic_name}")


@click.command()
@click.argument("topic_name", metavar="TOPIC")
@namesrv_option
@click.option("--group", default="SPARKMQ_CLI_CONSUMER", show_default=True)
@click.option("--expression", default="*", show_default=True, help="tag expression: * or 'A || B'")
@click.option("--from", "from_where", type=click.Choice(["first", "last"]), default="first", show_default=True,
              help="where a group with no committed offset starts")
@click.option("--count", type=int, default=None, help="stop after this many messages")
@click.option("--timeout", "timeout_s", type=float, default=10.0, show_default=True,
              help="stop after this many seconds without a message")
@json_option
@stable_errors
def consume(topic_name: str, namesrv: str, group: str, expression: str, from_where: str, count: int | None,
            timeout_s: float, as_json: bool) -> None:
    """Receive messages of TOPIC as GROUP and print them (JSON lines with --json); commits as it goes."""
    start = "CONSUME_FROM_FIRST_OFFSET" if from_where == "first" else "CONSUME_FROM_LAST_OFFSET"
    consumer = PullConsumer(group, _client_config(namesrv), consume_from_where=start)
    consumer.subscribe(topic_name, expression)
    consumer.start()
    received = 0
    idle_since = time.monotonic()
    try:
        while (count is None or received < count) and time.monotonic() - idle_since < timeout_s:
            batch = consumer.poll(min(1.0, timeout_s))
            if batch:
                idle_since = time.monotonic()
            for message in batch[: None if count is None else count - received]:
                row = _message_row(message)
                if as_json:
                    click.echo(json.dumps(row))
                else:
                    console.print(f"[bold]{row['broker']}/{row['queue_id']}@{row['queue_offset']}[/] "
                                  f"{row['msg_id']} tags={row['tags']} keys={row['keys']}: {row['body']}")
                received += 1
        consumer.commit()
    finally:
        consumer.shutdown()
    if not as_json:
        console.print(f"received {received} message(s)")
